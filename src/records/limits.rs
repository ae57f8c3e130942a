//! An offline job's limits, in a root-owned file the job cannot change.
//!
//! The plugin (root, in slurmstepd) writes `<state_dir>/limits/<job>` when
//! an offline step starts; xCUDA inside the job takes its settings from it
//! (never from the user's environment), and the node's health check polices
//! the job's processes against it. The one fact that shapes it: anything in
//! the job's environment is the user's to change, so the file is checked
//! before use (root-owned regular file, not writable by group or others, in
//! a root-owned directory not writable by others, at most 8 KiB, no
//! symlink) and names its job, which must be the reader's own job as
//! [`crate::node::jobproc`] finds it. A user who names another directory gains
//! nothing: only root writes such files, each for one job.
//!
//! ```text
//! job_id=12
//! gpu=0
//! sm_pct=30
//! mem_cap_mib=60000
//! MUXFLOW_XCUDA_MEM_LIMIT_BYTES=62914560000
//! MUXFLOW_XCUDA_GPU_INDEX=0
//! …                                  the other xCUDA settings (crate::records::xcuda_env)
//! stop_grace_ms=2500                 [`StopBounds`]: how long after SIGTERM xCUDA
//! release_by_unix_ms=1790000000000   leaves the job its GPU, and the latest release
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::records::xcuda_env::{XcudaEnv, XcudaEnvError};

/// Largest limits file read.
pub const MAX_BYTES: u64 = 8192;

/// The limits file's key of [`StopBounds::grace_ms`].
pub const STOP_GRACE_KEY: &str = "stop_grace_ms";
/// The limits file's key of [`StopBounds::release_by_unix_ms`].
pub const RELEASE_BY_KEY: &str = "release_by_unix_ms";
/// Outside a job only root's environment is read (tests, an admin's tools):
/// the same two bounds, under these names.
pub const STOP_GRACE_ENV: &str = "MUXFLOW_XCUDA_STOP_GRACE_MS";
pub const RELEASE_BY_ENV: &str = "MUXFLOW_XCUDA_RELEASE_BY_UNIX_MS";

/// When xCUDA must have released an offline job's GPU after a stop signal
/// (SIGTERM/SIGINT): until then the application's own handler runs with its
/// GPU (checkpointing), and the release comes at the earliest of the process
/// exiting, a default-action exit and this deadline. The one fact that shapes
/// it: Slurm sends SIGKILL `KillWait` seconds after SIGTERM whatever the
/// process does, and a SIGKILL with streams running is what the MPS server
/// cannot survive, so the deadline must fall safely before that SIGKILL.
/// Both bounds are root's (the plugin writes the first at step start, an
/// online job's Prolog the second when it requeues the job); neither
/// known means release at once, as before the deadline existed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopBounds {
    /// Time from the stop signal to the release: Slurm's `KillWait` less a
    /// margin ([`stop_grace`]).
    pub grace_ms: Option<u64>,
    /// Latest release, wall clock (ms since the Unix epoch): set when an
    /// online job's Prolog requeues this job, so that it is off the GPU
    /// within the online job's bounded wait.
    pub release_by_unix_ms: Option<u64>,
}

/// The margin kept before Slurm's SIGKILL: the release itself (launches
/// drained, at most 2 s, then every context synchronized), the signal's
/// delivery and the process's exit must fit in it. 2 s plus a tenth of
/// `KillWait`: 2.5 s of the dev cluster's 5 s, 5 s of Slurm's default 30 s.
pub fn stop_grace(kill_wait: std::time::Duration) -> std::time::Duration {
    let margin = std::time::Duration::from_secs(2) + kill_wait / 10;
    kill_wait.saturating_sub(margin)
}

impl StopBounds {
    /// The lines [`JobLimits::encode`]'s text is followed by.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if let Some(g) = self.grace_ms {
            s += &format!("{STOP_GRACE_KEY}={g}\n");
        }
        if let Some(t) = self.release_by_unix_ms {
            s += &format!("{RELEASE_BY_KEY}={t}\n");
        }
        s
    }

    /// The bounds in a limits file's text (or any `key=value` lines); a
    /// malformed value counts as absent: the release then comes sooner,
    /// never later.
    pub fn decode(text: &str) -> StopBounds {
        Self::from_lookup(|k| {
            text.split('\n')
                .filter_map(|l| l.split_once('='))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        })
    }

    /// From root's environment ([`STOP_GRACE_ENV`], [`RELEASE_BY_ENV`]).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> StopBounds {
        let m = |k: &str| match k {
            STOP_GRACE_KEY => get(STOP_GRACE_ENV),
            _ => get(RELEASE_BY_ENV),
        };
        Self::from_lookup(m)
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> StopBounds {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        StopBounds {
            grace_ms: num(STOP_GRACE_KEY),
            release_by_unix_ms: num(RELEASE_BY_KEY),
        }
    }

    /// Job `job_id`'s bounds from its trusted file under `dir` (as
    /// [`JobLimits::read_trusted`] checks it), read when the stop signal
    /// comes: an online job's Prolog may have set the latest release since
    /// the job started.
    pub fn read_trusted(dir: &Path, job_id: u32, owner: u32) -> Result<StopBounds, LimitsError> {
        let file_path = path(dir, job_id);
        let text = read_trusted_text(&file_path, owner, MAX_BYTES)?;
        JobLimits::decode(&text, job_id).map_err(|why| LimitsError::Corrupt {
            path: file_path.clone(),
            why,
        })?;
        Ok(StopBounds::decode(&text))
    }

    /// When the release is due for a stop signal taken at `signal_at`
    /// (wall clock, ms since the epoch): the end of the grace, or the
    /// latest release if that is earlier; the signal's own time when no
    /// grace is known (Slurm's SIGKILL could then come at any time) or the
    /// latest release has passed.
    pub fn release_at_unix_ms(&self, signal_at_unix_ms: u64) -> u64 {
        let by_grace = signal_at_unix_ms.saturating_add(self.grace_ms.unwrap_or(0));
        self.release_by_unix_ms
            .map_or(by_grace, |by| by_grace.min(by))
            .max(signal_at_unix_ms)
    }
}

/// Sets the latest release of job `job_id` in every limits file of it under
/// `dir` (its 1-GPU file and a k-GPU job's `g<i>/` ones), keeping the
/// earlier one where a file holds one already. Root only (the files are
/// `owner`'s, root in production); each file is replaced atomically with
/// the group and mode it had (readable by the job's group only). Returns
/// how many files it changed.
pub fn set_release_by(
    dir: &Path,
    job_id: u32,
    unix_ms: u64,
    owner: u32,
) -> Result<usize, LimitsError> {
    use std::io::Write;
    let mut files = vec![path(dir, job_id)];
    if let Ok(d) = std::fs::read_dir(dir) {
        files.extend(
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with('g'))
                .map(|e| path(&e.path(), job_id)),
        );
    }
    let mut changed = 0;
    for file in files {
        let text = match read_trusted_text(&file, owner, MAX_BYTES) {
            Ok(t) => t,
            Err(LimitsError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        let mut bounds = StopBounds::decode(&text);
        let by = bounds
            .release_by_unix_ms
            .map_or(unix_ms, |b| b.min(unix_ms));
        bounds.release_by_unix_ms = Some(by);
        let kept: String = text
            .split('\n')
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with(&format!("{STOP_GRACE_KEY}="))
                    && !l.starts_with(&format!("{RELEASE_BY_KEY}="))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let io = |source| LimitsError::Io {
            path: file.clone(),
            source,
        };
        let was = std::fs::metadata(&file).map_err(io)?;
        let tmp = file.with_extension("release-by.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(was.mode() & 0o7777)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io)?;
        std::os::unix::fs::fchown(&f, None, Some(was.gid())).map_err(io)?;
        f.write_all((kept + &bounds.encode()).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io)?;
        std::fs::rename(&tmp, &file).map_err(io)?;
        changed += 1;
    }
    Ok(changed)
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobLimits {
    pub job_id: u32,
    /// The GPU the job was placed on (node index).
    pub gpu: u32,
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE it was given.
    pub sm_pct: u8,
    /// Its GPU memory cap; None when the GPU's memory was not known yet.
    pub mem_cap_mib: Option<u64>,
    pub xcuda: XcudaEnv,
    /// Who holds each of these limits for the job.
    pub enforced_by: EnforcedBy,
}

/// Who enforces one limit of an offline job (docs/security.md, "Limits of an offline
/// job"): the GPU driver (an MPS SM partition), the kernel (the cgroup
/// `dmem` controller), xCUDA inside the job with MPS's client variables (a
/// job that drops them is found and evicted by the police), or the police
/// alone (no figure for xCUDA to hold, e.g. the GPU's memory not known yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Enforcer {
    Driver,
    Kernel,
    #[default]
    Xcuda,
    Policed,
}

impl Enforcer {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcer::Driver => "driver",
            Enforcer::Kernel => "kernel",
            Enforcer::Xcuda => "xcuda",
            Enforcer::Policed => "policed",
        }
    }

    pub fn parse(s: &str) -> Option<Enforcer> {
        Some(match s.trim() {
            "driver" => Enforcer::Driver,
            "kernel" => Enforcer::Kernel,
            "xcuda" => Enforcer::Xcuda,
            "policed" => Enforcer::Policed,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Enforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who enforces the memory cap and the SM share: `enforced_by_mem=` and
/// `enforced_by_sm=` in the limits file (absent: xCUDA, as before).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EnforcedBy {
    pub mem: Enforcer,
    pub sm: Enforcer,
}

impl std::fmt::Display for EnforcedBy {
    /// `mem:<who>,sm:<who>`: the job record's `enforced_by` (crate::records::report).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mem:{},sm:{}", self.mem, self.sm)
    }
}

/// The limits file's keys of [`EnforcedBy`].
pub const ENFORCED_BY_MEM_KEY: &str = "enforced_by_mem";
pub const ENFORCED_BY_SM_KEY: &str = "enforced_by_sm";

#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not trusted: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error("{path}: {why}")]
    Corrupt { path: PathBuf, why: String },
}

/// The file of job `job_id` under `dir`.
pub fn path(dir: &Path, job_id: u32) -> PathBuf {
    dir.join(job_id.to_string())
}

/// Where a k-GPU job's limits for its GPU `gpu` live: the same
/// file form in `<dir>/g<gpu>/`, root-owned like `dir`. Each of the job's
/// tasks gets the directory of its own GPU as its limits directory, so
/// xCUDA reads its GPU's cap; `<dir>/<job>` holds the first GPU's, as for
/// a 1-GPU job. A task that names another of these directories gets
/// another of its own job's GPUs' limits, no one else's; the police checks
/// each process against the GPU it is on.
pub fn gpu_dir(dir: &Path, gpu: u32) -> PathBuf {
    dir.join(format!("g{gpu}"))
}

impl JobLimits {
    pub fn encode(&self) -> String {
        let mut s = format!(
            "job_id={}\ngpu={}\nsm_pct={}\n",
            self.job_id, self.gpu, self.sm_pct
        );
        if let Some(m) = self.mem_cap_mib {
            s += &format!("mem_cap_mib={m}\n");
        }
        s += &format!(
            "{ENFORCED_BY_MEM_KEY}={}\n{ENFORCED_BY_SM_KEY}={}\n",
            self.enforced_by.mem, self.enforced_by.sm
        );
        for (k, v) in self.xcuda.to_env() {
            // A value that would break the line form is left out (its safe
            // fallback applies).
            if !v.contains('\n') {
                s += &format!("{k}={v}\n");
            }
        }
        s
    }

    /// Reads the text of job `job_id`'s file. The job's own fields must be
    /// whole; a bad xCUDA setting is replaced by its safe value and returned.
    pub fn decode(text: &str, job_id: u32) -> Result<(JobLimits, Vec<XcudaEnvError>), String> {
        // Split on '\n' alone: `lines()` would also drop a '\r' ending a value,
        // which then would not read back as written (found by fuzzing).
        let map: BTreeMap<&str, &str> =
            text.split('\n').filter_map(|l| l.split_once('=')).collect();
        let num = |k: &str| -> Result<u64, String> {
            map.get(k)
                .ok_or_else(|| format!("no {k}"))?
                .trim()
                .parse()
                .map_err(|_| format!("{k} is not a number"))
        };
        let file_job = num("job_id")?;
        if file_job != u64::from(job_id) {
            return Err(format!("names job {file_job}, not job {job_id}"));
        }
        let sm_pct = num("sm_pct")?;
        if !(1..=100).contains(&sm_pct) {
            return Err(format!("sm_pct {sm_pct} is not a percentage"));
        }
        let mem_cap_mib = match map.contains_key("mem_cap_mib") {
            true => Some(num("mem_cap_mib")?),
            false => None,
        };
        let (xcuda, problems) = XcudaEnv::from_env_lenient(|k| map.get(k).map(|v| v.to_string()));
        let by = |k: &str| -> Result<Enforcer, String> {
            map.get(k).map_or(Ok(Enforcer::default()), |v| {
                Enforcer::parse(v)
                    .ok_or_else(|| format!("{k} is not driver, kernel, xcuda or policed"))
            })
        };
        let enforced_by = EnforcedBy {
            mem: by(ENFORCED_BY_MEM_KEY)?,
            sm: by(ENFORCED_BY_SM_KEY)?,
        };
        let limits = JobLimits {
            job_id,
            gpu: u32::try_from(num("gpu")?).map_err(|_| "gpu is out of range".to_string())?,
            sm_pct: sm_pct as u8,
            mem_cap_mib,
            xcuda,
            enforced_by,
        };
        Ok((limits, problems))
    }

    /// Reads and checks job `job_id`'s file under `dir`, whose files and
    /// directory must belong to `owner` (root in production).
    pub fn read_trusted(
        dir: &Path,
        job_id: u32,
        owner: u32,
    ) -> Result<(JobLimits, Vec<XcudaEnvError>), LimitsError> {
        let file_path = path(dir, job_id);
        let text = read_trusted_text(&file_path, owner, MAX_BYTES)?;
        JobLimits::decode(&text, job_id).map_err(|why| LimitsError::Corrupt {
            path: file_path.clone(),
            why,
        })
    }
}

/// The text of `file_path` if only `owner` (root in production) can have
/// written it: a regular file (no symlink followed, no FIFO waited on) of
/// `owner` not writable by group or others, in a directory of `owner` not
/// writable by group or others, at most `max_bytes`. What a user process
/// reads to learn what root decided ([`crate::node::offline_procs`] too).
pub fn read_trusted_text(
    file_path: &Path,
    owner: u32,
    max_bytes: u64,
) -> Result<String, LimitsError> {
    let untrusted = |why: String| LimitsError::Untrusted {
        path: file_path.to_path_buf(),
        why,
    };
    let dir = file_path.parent().unwrap_or(Path::new("/"));
    let dir_meta = std::fs::symlink_metadata(dir).map_err(|source| LimitsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    check_owner_mode(&dir_meta, owner, true)
        .map_err(|w| untrusted(format!("its directory {w}")))?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file_path)
        .map_err(|source| LimitsError::Io {
            path: file_path.to_path_buf(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| LimitsError::Io {
        path: file_path.to_path_buf(),
        source,
    })?;
    check_owner_mode(&meta, owner, false).map_err(untrusted)?;
    if meta.len() > max_bytes {
        return Err(untrusted(format!("larger than {max_bytes} bytes")));
    }
    let mut text = String::new();
    file.take(max_bytes)
        .read_to_string(&mut text)
        .map_err(|source| LimitsError::Io {
            path: file_path.to_path_buf(),
            source,
        })?;
    Ok(text)
}

fn check_owner_mode(meta: &std::fs::Metadata, owner: u32, dir: bool) -> Result<(), String> {
    let kind_ok = if dir { meta.is_dir() } else { meta.is_file() };
    if !kind_ok {
        return Err(format!(
            "is not a {}",
            if dir { "directory" } else { "regular file" }
        ));
    }
    if meta.uid() != owner {
        return Err(format!("is owned by uid {}, not {owner}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The codes in a job's policed file, in order, without repeats.
pub fn policed_codes(text: &str) -> Vec<String> {
    let mut codes: Vec<String> = Vec::new();
    for code in text.lines().filter_map(|l| l.split_whitespace().next()) {
        if !codes.iter().any(|c| c == code) {
            codes.push(code.to_string());
        }
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Xcuda;
    use std::os::unix::fs::PermissionsExt;

    fn limits() -> JobLimits {
        let mut xcuda = XcudaEnv::from_config(&Xcuda::default(), 1);
        xcuda.mem_limit_bytes = Some(60000 << 20);
        xcuda.stats_dir = Some("/var/lib/muxflow/xcuda/12".into());
        JobLimits {
            job_id: 12,
            gpu: 1,
            sm_pct: 30,
            mem_cap_mib: Some(60000),
            xcuda,
            enforced_by: EnforcedBy {
                mem: Enforcer::Kernel,
                sm: Enforcer::Xcuda,
            },
        }
    }

    fn euid() -> u32 {
        // SAFETY: geteuid cannot fail and touches no memory.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn round_trips_and_refuses_another_jobs_file() {
        let l = limits();
        let (back, problems) = JobLimits::decode(&l.encode(), 12).unwrap();
        assert_eq!((back, problems.len()), (l.clone(), 0));
        let e = JobLimits::decode(&l.encode(), 13).unwrap_err();
        assert!(e.contains("names job 12"), "{e}");
        assert!(JobLimits::decode("gpu=0\nsm_pct=30\n", 12).is_err());
        // A value ending in '\r' reads back as written.
        let mut cr = l.clone();
        cr.xcuda.stats_dir = Some("/run/x\r".into());
        assert_eq!(JobLimits::decode(&cr.encode(), 12).unwrap().0, cr);
        // A bad xCUDA value in the file: its safe value, and it is reported.
        let text = l.encode().replace(
            "MUXFLOW_XCUDA_SAMPLE_INTERVAL_MS=20",
            "MUXFLOW_XCUDA_SAMPLE_INTERVAL_MS=x",
        );
        let (back, problems) = JobLimits::decode(&text, 12).unwrap();
        assert_eq!((back.xcuda.sample_interval_ms, problems.len()), (20, 1));
        // Who enforces: absent reads as xCUDA (files of older plugins);
        // an unknown word is a corrupt file, not a silent default.
        let old = l.encode().replace("enforced_by_mem=kernel\n", "");
        assert_eq!(
            JobLimits::decode(&old, 12).unwrap().0.enforced_by.mem,
            Enforcer::Xcuda
        );
        let bad = l
            .encode()
            .replace("enforced_by_sm=xcuda", "enforced_by_sm=me");
        let e = JobLimits::decode(&bad, 12).unwrap_err();
        assert!(e.contains("enforced_by_sm is not"), "{e}");
    }

    #[test]
    fn only_a_file_and_directory_of_the_owner_not_writable_by_others_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("limits");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = path(&dir, 12);
        std::fs::write(&file, limits().encode()).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let me = euid();
        assert!(JobLimits::read_trusted(&dir, 12, me).is_ok());

        struct Case {
            name: &'static str,
            setup: Box<dyn Fn()>,
            owner: u32,
            error: &'static str,
        }
        let (f, d) = (file.clone(), dir.clone());
        let mode = |p: PathBuf, m: u32| {
            Box::new(move || {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap()
            }) as Box<dyn Fn()>
        };
        let cases = [
            Case {
                name: "another owner",
                setup: Box::new(|| {}),
                owner: me + 1,
                error: "owned by uid",
            },
            Case {
                name: "group-writable file",
                setup: mode(f.clone(), 0o664),
                owner: me,
                error: "writable",
            },
            Case {
                name: "world-writable directory",
                setup: mode(d.clone(), 0o777),
                owner: me,
                error: "its directory",
            },
        ];
        for c in cases {
            (c.setup)();
            let e = JobLimits::read_trusted(&dir, 12, c.owner)
                .unwrap_err()
                .to_string();
            assert!(e.contains(c.error), "{}: {e}", c.name);
            mode(f.clone(), 0o644)();
            mode(d.clone(), 0o755)();
        }
        // A symlink in place of the file is not followed.
        std::fs::rename(&file, dir.join("real")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), &file).unwrap();
        assert!(JobLimits::read_trusted(&dir, 12, me).is_err());
        // An oversized file is refused.
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "x".repeat(10_000)).unwrap();
        mode(f.clone(), 0o644)();
        let e = JobLimits::read_trusted(&dir, 12, me)
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than"), "{e}");
        // A FIFO is not waited on.
        std::fs::remove_file(&file).unwrap();
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = JobLimits::read_trusted(&dir, 12, me)
            .unwrap_err()
            .to_string();
        assert!(e.contains("regular file"), "{e}");
    }
    #[test]
    fn the_stop_deadline_is_the_earliest_bound_and_never_later_than_asked() {
        use std::time::Duration;
        // (name, grace, latest release, signal at, release at)
        let cases = [
            ("nothing known: at once", None, None, 1000, 1000),
            ("the grace alone", Some(2500), None, 1000, 3500),
            (
                "an earlier latest release wins",
                Some(2500),
                Some(2000),
                1000,
                2000,
            ),
            (
                "a later latest release does not extend",
                Some(2500),
                Some(9000),
                1000,
                3500,
            ),
            ("no KillWait known: at once", None, Some(5000), 1000, 1000),
            (
                "a latest release already past: at once",
                Some(2500),
                Some(500),
                1000,
                1000,
            ),
        ];
        for (name, grace_ms, release_by_unix_ms, at, want) in cases {
            let b = StopBounds {
                grace_ms,
                release_by_unix_ms,
            };
            assert_eq!(b.release_at_unix_ms(at), want, "{name}");
            assert_eq!(StopBounds::decode(&b.encode()), b, "{name}: round trip");
        }
        // KillWait less a margin that grows with it; never negative.
        assert_eq!(
            stop_grace(Duration::from_secs(5)),
            Duration::from_millis(2500)
        );
        assert_eq!(stop_grace(Duration::from_secs(30)), Duration::from_secs(25));
        assert_eq!(stop_grace(Duration::from_secs(1)), Duration::ZERO);
        // A malformed bound is absent (sooner, never later).
        assert_eq!(
            StopBounds::decode("stop_grace_ms=lots\n"),
            StopBounds::default()
        );
    }

    #[test]
    fn an_online_jobs_prolog_sets_the_latest_release_in_every_file_of_the_job() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("limits");
        let g1 = gpu_dir(&dir, 1);
        std::fs::create_dir_all(&g1).unwrap();
        for d in [&dir, &g1] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let text = limits().encode()
            + &StopBounds {
                grace_ms: Some(2500),
                release_by_unix_ms: None,
            }
            .encode();
        for d in [&dir, &g1] {
            std::fs::write(path(d, 12), &text).unwrap();
            std::fs::set_permissions(path(d, 12), std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        let me = euid();
        assert_eq!(set_release_by(&dir, 12, 5000, me).unwrap(), 2);
        // A later call keeps the earlier deadline.
        assert_eq!(set_release_by(&dir, 12, 9000, me).unwrap(), 2);
        for d in [&dir, &g1] {
            let b = StopBounds::read_trusted(d, 12, me).unwrap();
            assert_eq!(
                b,
                StopBounds {
                    grace_ms: Some(2500),
                    release_by_unix_ms: Some(5000)
                }
            );
            // The job's limits are untouched, and so are who may read them.
            assert_eq!(JobLimits::read_trusted(d, 12, me).unwrap().0, limits());
            let meta = std::fs::metadata(path(d, 12)).unwrap();
            assert_eq!(meta.mode() & 0o777, 0o640);
        }
        // No file of that job: nothing to do.
        assert_eq!(set_release_by(&dir, 13, 5000, me).unwrap(), 0);
    }

    #[test]
    fn codes_are_listed_once_in_order() {
        assert_eq!(
            policed_codes("priority pid=3 x\nno_xcuda pid=4 y\npriority pid=5 z\n"),
            ["priority", "no_xcuda"]
        );
    }
}
