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
//! [`crate::jobproc`] finds it. A user who names another directory gains
//! nothing: only root writes such files, each for one job.
//!
//! ```text
//! job_id=12
//! gpu=0
//! sm_pct=30
//! mem_cap_mib=60000
//! MUXFLOW_XCUDA_MEM_LIMIT_BYTES=62914560000
//! MUXFLOW_XCUDA_GPU_INDEX=0
//! …                                  the other xCUDA settings (crate::xcuda_env)
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::xcuda_env::{XcudaEnv, XcudaEnvError};

/// Largest limits file read.
pub const MAX_BYTES: u64 = 8192;

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
}

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

/// Where a k-GPU job's limits for its GPU `gpu` live (issue 15): the same
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
        let limits = JobLimits {
            job_id,
            gpu: u32::try_from(num("gpu")?).map_err(|_| "gpu is out of range".to_string())?,
            sm_pct: sm_pct as u8,
            mem_cap_mib,
            xcuda,
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
/// reads to learn what root decided ([`crate::offline_procs`] too).
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
    fn codes_are_listed_once_in_order() {
        assert_eq!(
            policed_codes("priority pid=3 x\nno_xcuda pid=4 y\npriority pid=5 z\n"),
            ["priority", "no_xcuda"]
        );
    }
}
