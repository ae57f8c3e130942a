//! muxflow's state on one node, under `paths.state_dir` (root-owned):
//!
//! ```text
//! <state_dir>/gpu<i>/state         health state word (healthy, busy, …)
//! <state_dir>/gpu<i>/jobs/<jobid>  one file per muxflow job on the GPU (key=value)
//! <state_dir>/gpu<i>/facts         what the SM and memory policies need (key=value)
//! <state_dir>/gpu<i>/offline_procs the GPU's offline processes, for xCUDA's brake
//!                                  (crate::node::offline_procs)
//! <state_dir>/gpu<i>/sm_activity   the node sampler's last SM activity reading
//!                                  (crate::records::sm_page; no lock: replaced whole)
//! <state_dir>/locks/               root only (0700): every lock file, 0600
//!       gpu<i>                     flock: one writer per GPU at a time
//!       node                       flock: node-wide state (published, kernel log cursor)
//!       sampler                    flock and pid of the node's muxflow-sampler
//!       police-<jobid>             flock: held by the job's muxflow-police
//! <state_dir>/xcuda/<jobid>/       xCUDA counters of an offline job (owned by its user)
//! <state_dir>/limits/<jobid>        an offline job's limits (root, 0644; crate::records::limits)
//! <state_dir>/limits/<jobid>.policed  why the node terminated one of its processes
//! <state_dir>/limits/<jobid>.measured  its peak GPU memory as NVML showed it
//! <state_dir>/limits/<jobid>.evicted  its processes the node evicted for the GPU's health
//! <state_dir>/refused/<jobid>      why the Prolog refused an offline job (the plugin
//!                                  refuses the job's tasks with this text)
//! ```
//!
//! Every write is atomic (temporary file + rename) under the GPU's lock, so
//! concurrent Prologs, Epilogs and health checks never see a torn file.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::policy::health::HealthState;
use crate::policy::share::GpuFacts;
use crate::records::kv;
use crate::Mode;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("{path}: still held by another process after {waited:?}; giving up this time")]
    LockBusy { path: PathBuf, waited: Duration },
}

/// Job `job_id`'s police claim, a lock file name.
fn police_lock(job_id: u32) -> String {
    format!("police-{job_id}")
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: a reader sees the old or the new file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(dir).map_err(io(dir))?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state"),
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_data().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// An exclusive lock on one GPU's state, released on drop (and by the kernel
/// if the holder dies).
pub struct GpuLock {
    _file: File,
}

/// An offline job's muxflow-police holds this for its life (flock on
/// `<dir>/locks/police-<job>`): a health step that can take it knows no
/// watcher runs for the job. Released on drop and when the holder dies.
pub struct PoliceClaim {
    _file: File,
}

/// Held node-wide lock (flock on `<dir>/locks/node`), released on drop.
pub struct NodeLock {
    _file: File,
}

/// The directory of every lock file, root's alone (0700): `flock` works on
/// any descriptor, read-only too, so a lock file a user can open is a lock
/// the user can hold against root.
pub const LOCK_DIR: &str = "locks";

/// How long a node program waits for a lock another root program holds
/// (the GPU's, the node's) before it gives up with [`StateError::LockBusy`]:
/// longer than any step holds one, shorter than Slurm's Prolog and health
/// check timeouts, so a hung holder costs a step, never a job or the node.
pub const LOCK_WAIT: Duration = Duration::from_secs(20);

/// The effective uid, which owns every lock file.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Takes `op | LOCK_NB` (LOCK_EX or LOCK_SH) on `file`; false when another
/// process holds it.
pub fn try_flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor `file` owns for the whole call.
    if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether `meta` is a lock file only this uid can open: a regular file of
/// its own, no permission for group or others.
fn private_to_me(meta: &fs::Metadata) -> bool {
    meta.file_type().is_file() && meta.uid() == euid() && meta.mode() & 0o077 == 0
}

/// Whether `file` is still the file at `path` (a lock file replaced or
/// removed while this process waited for it locks nothing).
pub fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The state directory of one node.
#[derive(Debug, Clone)]
pub struct NodeState {
    dir: PathBuf,
}

/// One muxflow job recorded on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub job_id: u32,
    pub mode: Mode,
    pub uid: u32,
    /// An offline job's slots on the GPU (each below `[policy]
    /// offline_per_gpu`, ascending): as many as Slurm gave it of the GPU's
    /// typed offline slots (`mfslot:g<i>:<s>`), which fixes its part of the
    /// GPU ([`JobRecord::slot_count`]). Empty for online jobs. Written as
    /// `slots=0,1`; a record written before sized slots (`slot=<i>`, or none
    /// at all) reads as that one slot (slot 0).
    pub slots: Vec<u8>,
}

impl JobRecord {
    /// How many of the GPU's offline slots the job holds: the `slots` of
    /// [`crate::policy::share::offline_slot_share`] (at least 1).
    pub fn slot_count(&self) -> u32 {
        self.slots.len().max(1) as u32
    }
}

/// `0,1` (a record's `slots=`).
fn format_slots(slots: &[u8]) -> String {
    let v: Vec<String> = slots.iter().map(u8::to_string).collect();
    v.join(",")
}

/// Parses `0,1`: distinct slot indices, returned ascending.
fn parse_slots(text: &str) -> Result<Vec<u8>, String> {
    let mut slots = text
        .split(',')
        .map(|s| s.parse::<u8>().map_err(|e| format!("slots '{text}': {e}")))
        .collect::<Result<Vec<u8>, String>>()?;
    slots.sort_unstable();
    let n = slots.len();
    slots.dedup();
    if slots.len() != n {
        return Err(format!("slots '{text}': a slot twice"));
    }
    Ok(slots)
}

/// The slots job `job_id` takes of a GPU's `per_gpu` offline slots when it
/// holds `want` of them: those of its own record when it has as many (a
/// Prolog run again), else the lowest `want` that no other offline job in
/// `jobs` holds, ascending; None when fewer are free.
pub fn free_offline_slots(
    jobs: &[JobRecord],
    job_id: u32,
    per_gpu: u8,
    want: u32,
) -> Option<Vec<u8>> {
    let own = jobs
        .iter()
        .find(|j| j.mode == Mode::Offline && j.job_id == job_id && j.slots.len() == want as usize);
    if let Some(own) = own {
        return Some(own.slots.clone());
    }
    let held = |s: u8| {
        jobs.iter()
            .any(|j| j.mode == Mode::Offline && j.job_id != job_id && j.slots.contains(&s))
    };
    let free: Vec<u8> = (0..per_gpu)
        .filter(|&s| !held(s))
        .take(want as usize)
        .collect();
    (want > 0 && free.len() == want as usize).then_some(free)
}

impl NodeState {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        NodeState { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn gpu_dir(&self, gpu: u32) -> PathBuf {
        self.dir.join(format!("gpu{gpu}"))
    }

    /// The root-only lock directory, made (0700) if missing and made
    /// private again if its mode was loosened; refused when it is not a
    /// directory of this uid (a link, or another user's).
    fn lock_dir(&self) -> Result<PathBuf, StateError> {
        fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let dir = self.dir.join(LOCK_DIR);
        let made = match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io(&dir)(e)),
        };
        let meta = fs::symlink_metadata(&dir).map_err(io(&dir))?;
        if !meta.is_dir() || meta.uid() != euid() {
            return Err(StateError::Corrupt {
                path: dir,
                message: format!(
                    "not a directory of uid {}: its locks could be anyone's; \
                     remove it (the node programs make it again)",
                    euid()
                ),
            });
        }
        if meta.mode() & 0o077 != 0 {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
        }
        if made {
            self.remove_legacy_locks();
        }
        Ok(dir)
    }

    /// Lock files of older versions (in directories users can read, 0644):
    /// nothing takes them any more, and a user could hold them. Removed when
    /// the lock directory is made and at every node-wide lock (an older
    /// binary still running may have made them again).
    fn remove_legacy_locks(&self) {
        let _ = fs::remove_file(self.dir.join("node.lock"));
        let _ = fs::remove_file(self.dir.join("sampler.lock"));
        if let Ok(gpus) = self.gpus() {
            for gpu in gpus {
                let _ = fs::remove_file(self.gpu_dir(gpu).join("lock"));
            }
        }
        let _ = fs::remove_dir_all(self.dir.join("police"));
    }

    /// The path of lock file `name` (in [`LOCK_DIR`]).
    pub fn lock_path(&self, name: &str) -> PathBuf {
        self.dir.join(LOCK_DIR).join(name)
    }

    /// Opens (creating, 0600) lock file `name`: in the root-only lock
    /// directory, never through a link, never waiting on a FIFO. One that
    /// is not this uid's private regular file (a link, another owner, a
    /// mode others could open it by) may be open in another user's process:
    /// it is removed and made anew.
    pub fn open_lock(&self, name: &str) -> Result<File, StateError> {
        let path = self.lock_dir()?.join(name);
        for _ in 0..3 {
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path);
            match opened {
                Ok(file) if file.metadata().is_ok_and(|m| private_to_me(&m)) => return Ok(file),
                Ok(_) => {}
                // A link in the final component.
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
                Err(e) => return Err(io(&path)(e)),
            }
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Err(StateError::Corrupt {
            path,
            message: "not a private lock file, and could not be replaced".into(),
        })
    }

    /// Takes `op` (LOCK_EX or LOCK_SH) on lock file `name`, waiting at most
    /// `wait` (zero: not at all); None when another process still holds it.
    pub fn try_lock(
        &self,
        name: &str,
        op: libc::c_int,
        wait: Duration,
    ) -> Result<Option<File>, StateError> {
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let file = self.open_lock(name)?;
            let path = self.lock_path(name);
            loop {
                if try_flock(&file, op).map_err(io(&path))? {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(pause.min(deadline - now));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            if same_file(&file, &path) {
                return Ok(Some(file));
            }
        }
    }

    /// Lock file `name`, waiting for it at most [`LOCK_WAIT`].
    fn lock_bounded(&self, name: &str) -> Result<File, StateError> {
        self.try_lock(name, libc::LOCK_EX, LOCK_WAIT)?
            .ok_or_else(|| StateError::LockBusy {
                path: self.lock_path(name),
                waited: LOCK_WAIT,
            })
    }

    /// Waits (at most [`LOCK_WAIT`]) until this process holds GPU `gpu`'s
    /// lock.
    pub fn lock_gpu(&self, gpu: u32) -> Result<GpuLock, StateError> {
        let dir = self.gpu_dir(gpu);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(GpuLock {
            _file: self.lock_bounded(&format!("gpu{gpu}"))?,
        })
    }

    /// Takes job `job_id`'s police claim without waiting; None when a
    /// process (its muxflow-police) holds it.
    pub fn try_claim_police(&self, job_id: u32) -> Result<Option<PoliceClaim>, StateError> {
        Ok(self
            .try_lock(&police_lock(job_id), libc::LOCK_EX, Duration::ZERO)?
            .map(|file| PoliceClaim { _file: file }))
    }

    /// Removes job `job_id`'s police claim file (its Epilog).
    pub fn remove_police_claim(&self, job_id: u32) {
        let _ = fs::remove_file(self.lock_path(&police_lock(job_id)));
    }

    /// Waits (at most [`LOCK_WAIT`]) until this process holds the node-wide
    /// lock (for state of the whole node: what was published, the kernel
    /// log cursor). Never taken while a GPU lock is held.
    pub fn lock_node(&self) -> Result<NodeLock, StateError> {
        let file = self.lock_bounded("node")?;
        self.remove_legacy_locks();
        Ok(NodeLock { _file: file })
    }

    pub fn health_file(&self, gpu: u32) -> PathBuf {
        self.gpu_dir(gpu).join("state")
    }

    /// The recorded health of GPU `gpu`; None when never recorded.
    pub fn health(&self, gpu: u32) -> Result<Option<HealthState>, StateError> {
        let path = self.health_file(gpu);
        match fs::read_to_string(&path) {
            Ok(s) => s
                .parse()
                .map(Some)
                .map_err(
                    |e: crate::policy::health::ParseHealthError| StateError::Corrupt {
                        path,
                        message: e.to_string(),
                    },
                ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StateError::Io { path, source: e }),
        }
    }

    /// Records GPU `gpu`'s health (caller holds the GPU lock).
    pub fn set_health(
        &self,
        _lock: &GpuLock,
        gpu: u32,
        state: HealthState,
    ) -> Result<(), StateError> {
        write_atomic(&self.health_file(gpu), format!("{state}\n").as_bytes())
    }

    fn job_path(&self, gpu: u32, job_id: u32) -> PathBuf {
        self.gpu_dir(gpu).join("jobs").join(job_id.to_string())
    }

    /// Records a muxflow job on GPU `gpu` (caller holds the GPU lock).
    pub fn add_job(&self, _lock: &GpuLock, gpu: u32, job: &JobRecord) -> Result<(), StateError> {
        let mut w = kv::Writer::new();
        w.push("mode", job.mode).push("uid", job.uid);
        if !job.slots.is_empty() {
            w.push("slots", format_slots(&job.slots));
        }
        write_atomic(
            &self.job_path(gpu, job.job_id),
            (w.finish() + "\n").as_bytes(),
        )
    }

    /// Forgets job `job_id` on GPU `gpu`; Ok(false) if it was not recorded.
    pub fn remove_job(&self, _lock: &GpuLock, gpu: u32, job_id: u32) -> Result<bool, StateError> {
        let path = self.job_path(gpu, job_id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StateError::Io { path, source: e }),
        }
    }

    /// When job `job_id`'s record on GPU `gpu` was written (its Prolog);
    /// None when it is not recorded.
    pub fn job_recorded_at(
        &self,
        gpu: u32,
        job_id: u32,
    ) -> Result<Option<std::time::SystemTime>, StateError> {
        let path = self.job_path(gpu, job_id);
        match fs::metadata(&path).and_then(|m| m.modified()) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StateError::Io { path, source: e }),
        }
    }

    /// The muxflow jobs recorded on GPU `gpu`, by job id.
    pub fn jobs(&self, gpu: u32) -> Result<Vec<JobRecord>, StateError> {
        let dir = self.gpu_dir(gpu).join("jobs");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(StateError::Io {
                    path: dir,
                    source: e,
                })
            }
        };
        let mut jobs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            let name = entry.file_name();
            let Some(job_id) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue; // temporary files
            };
            let path = entry.path();
            let text = fs::read_to_string(&path).map_err(io(&path))?;
            let corrupt = |message: String| StateError::Corrupt {
                path: path.clone(),
                message,
            };
            let map = kv::parse(&text).map_err(|e| corrupt(e.to_string()))?;
            let f = kv::Fields(&map);
            let mode = f.require("mode").map_err(|e| corrupt(e.to_string()))?;
            let slots = match (map.get("slots"), f.get::<u8>("slot")) {
                (_, Err(e)) => return Err(corrupt(e.to_string())),
                (Some(list), _) => parse_slots(list).map_err(corrupt)?,
                _ if mode == Mode::Online => Vec::new(),
                // Written before sized slots: one slot (0 when none).
                (None, Ok(slot)) => vec![slot.unwrap_or(0)],
            };
            jobs.push(JobRecord {
                job_id,
                mode,
                uid: f.require("uid").map_err(|e| corrupt(e.to_string()))?,
                slots,
            });
        }
        jobs.sort_by_key(|j| j.job_id);
        Ok(jobs)
    }

    fn facts_file(&self, gpu: u32) -> PathBuf {
        self.gpu_dir(gpu).join("facts")
    }

    /// Records what the policies need about GPU `gpu` (caller holds its lock).
    pub fn set_facts(&self, _lock: &GpuLock, gpu: u32, facts: &GpuFacts) -> Result<(), StateError> {
        let mut w = kv::Writer::new();
        w.push_opt("online_solo_sm_pct", facts.online_solo_sm_pct)
            .push_opt("online_mem_mib", facts.online_mem_mib)
            .push_opt("mem_total_mib", facts.mem_total_mib)
            .push_opt("power_limit_w", facts.power_limit_w);
        write_atomic(&self.facts_file(gpu), (w.finish() + "\n").as_bytes())
    }

    /// What the health checks recorded about GPU `gpu` (all unknown if never).
    pub fn facts(&self, gpu: u32) -> Result<GpuFacts, StateError> {
        let path = self.facts_file(gpu);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(GpuFacts::default()),
            Err(e) => return Err(StateError::Io { path, source: e }),
        };
        let corrupt = |message: String| StateError::Corrupt {
            path: path.clone(),
            message,
        };
        let map = kv::parse(&text).map_err(|e| corrupt(e.to_string()))?;
        let f = kv::Fields(&map);
        Ok(GpuFacts {
            online_solo_sm_pct: f
                .get("online_solo_sm_pct")
                .map_err(|e| corrupt(e.to_string()))?,
            online_mem_mib: f
                .get("online_mem_mib")
                .map_err(|e| corrupt(e.to_string()))?,
            mem_total_mib: f.get("mem_total_mib").map_err(|e| corrupt(e.to_string()))?,
            power_limit_w: f.get("power_limit_w").map_err(|e| corrupt(e.to_string()))?,
        })
    }

    fn dmem_region_file(&self, gpu: u32) -> PathBuf {
        self.gpu_dir(gpu).join("dmem_region")
    }

    /// Records GPU `gpu`'s region of the kernel's `dmem` controller as the
    /// Prolog found it (None: no controller or no region; `crate::node::dmem`).
    pub fn set_dmem_region(
        &self,
        _lock: &GpuLock,
        gpu: u32,
        region: Option<&str>,
    ) -> Result<(), StateError> {
        let path = self.dmem_region_file(gpu);
        match region {
            Some(r) => write_atomic(&path, format!("{r}\n").as_bytes()),
            None => match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(StateError::Io { path, source: e })
                }
                _ => Ok(()),
            },
        }
    }

    /// GPU `gpu`'s `dmem` region as last recorded; None if none.
    pub fn dmem_region(&self, gpu: u32) -> Option<String> {
        let text = fs::read_to_string(self.dmem_region_file(gpu)).ok()?;
        let r = text.trim();
        (!r.is_empty() && !r.contains(char::is_whitespace)).then(|| r.to_string())
    }

    /// What offline job `job_id` gets on GPU `gpu` now: its slots' part of
    /// the policy's share, sized for the GPU's online job if one is recorded
    /// there, else for an idle partner ([`GpuFacts::without_online`]). The
    /// one computation of the plugin (the job's limits) and the Prolog (its
    /// SM partition).
    pub fn offline_share(
        &self,
        policy: &crate::config::Policy,
        gpu: u32,
        job_id: u32,
    ) -> Result<crate::policy::share::SlotShare, StateError> {
        let jobs = self.jobs(gpu)?;
        let mut facts = self.facts(gpu)?;
        if !jobs
            .iter()
            .any(|j| j.mode == Mode::Online && j.job_id != job_id)
        {
            facts = facts.without_online();
        }
        let slots = jobs
            .iter()
            .find(|r| r.job_id == job_id)
            .map_or(1, |r| r.slot_count());
        Ok(crate::policy::share::offline_slot_share(
            policy, &facts, slots,
        ))
    }

    /// A per-job record of the driver's on GPU `gpu` (`<gpu dir>/<kind>/<job>`).
    fn driver_record_file(&self, gpu: u32, kind: &str, job_id: u32) -> PathBuf {
        self.gpu_dir(gpu).join(kind).join(job_id.to_string())
    }

    fn set_driver_record(
        &self,
        gpu: u32,
        kind: &str,
        job_id: u32,
        text: &str,
    ) -> Result<(), StateError> {
        let path = self.driver_record_file(gpu, kind, job_id);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io(dir))?;
        }
        write_atomic(&path, text.as_bytes())
    }

    fn driver_record(&self, gpu: u32, kind: &str, job_id: u32) -> Option<String> {
        fs::read_to_string(self.driver_record_file(gpu, kind, job_id)).ok()
    }

    fn forget_driver_record(&self, gpu: u32, kind: &str, job_id: u32) {
        let _ = fs::remove_file(self.driver_record_file(gpu, kind, job_id));
    }

    /// Records job `job_id`'s static SM partition on GPU `gpu` (the Prolog,
    /// which made it; `crate::node::sm_partition`).
    pub fn set_sm_partition(
        &self,
        _lock: &GpuLock,
        gpu: u32,
        job_id: u32,
        record: &crate::node::sm_partition::Record,
    ) -> Result<(), StateError> {
        self.set_driver_record(gpu, "partitions", job_id, &record.encode())
    }

    /// Job `job_id`'s static SM partition on GPU `gpu`, if it has one.
    pub fn sm_partition(&self, gpu: u32, job_id: u32) -> Option<crate::node::sm_partition::Record> {
        crate::node::sm_partition::Record::decode(&self.driver_record(gpu, "partitions", job_id)?)
    }

    /// Forgets job `job_id`'s partition record on GPU `gpu`.
    pub fn forget_sm_partition(&self, _lock: &GpuLock, gpu: u32, job_id: u32) {
        self.forget_driver_record(gpu, "partitions", job_id)
    }

    /// Records job `job_id`'s MPS v3 namespace on GPU `gpu` (the Prolog,
    /// which made it; `crate::node::mps_v3`).
    pub fn set_mps_namespace(
        &self,
        _lock: &GpuLock,
        gpu: u32,
        job_id: u32,
        ns: &crate::node::mps_v3::Namespace,
    ) -> Result<(), StateError> {
        self.set_driver_record(gpu, "namespaces", job_id, &ns.encode())
    }

    /// Job `job_id`'s MPS v3 namespace on GPU `gpu`, if it has one.
    pub fn mps_namespace(&self, gpu: u32, job_id: u32) -> Option<crate::node::mps_v3::Namespace> {
        crate::node::mps_v3::Namespace::decode(&self.driver_record(gpu, "namespaces", job_id)?)
    }

    /// Forgets job `job_id`'s namespace record on GPU `gpu`.
    pub fn forget_mps_namespace(&self, _lock: &GpuLock, gpu: u32, job_id: u32) {
        self.forget_driver_record(gpu, "namespaces", job_id)
    }

    /// The GPU's offline processes as root last saw them ([`crate::node::offline_procs`]).
    pub fn offline_procs_file(&self, gpu: u32) -> PathBuf {
        self.gpu_dir(gpu)
            .join(crate::node::offline_procs::FILE_NAME)
    }

    /// Where the xCUDA counters of offline job `job_id` go.
    pub fn xcuda_stats_dir(&self, job_id: u32) -> PathBuf {
        self.dir.join("xcuda").join(job_id.to_string())
    }

    /// Where the offline jobs' limits files are (root-owned, 0755).
    pub fn limits_dir(&self) -> PathBuf {
        self.dir.join("limits")
    }

    /// Why the node terminated a process of job `job_id` (one line per
    /// termination), for its AdminComment.
    pub fn policed_file(&self, job_id: u32) -> PathBuf {
        self.limits_dir().join(format!("{job_id}.policed"))
    }

    /// The processes of job `job_id` the node evicted for its GPU's health
    /// (one line each), which the police leave to exit.
    pub fn evicted_file(&self, job_id: u32) -> PathBuf {
        self.limits_dir().join(format!("{job_id}.evicted"))
    }

    /// The `terminate_client` commands muxflow did not send that ended an
    /// MPS client of job `job_id` (one line each), for its AdminComment.
    pub fn terminated_by_other_file(&self, job_id: u32) -> PathBuf {
        self.limits_dir().join(format!("{job_id}.terminated"))
    }

    /// The largest GPU memory the node measured for job `job_id`.
    pub fn measured_file(&self, job_id: u32) -> PathBuf {
        self.limits_dir().join(format!("{job_id}.measured"))
    }

    fn refusal_path(&self, job_id: u32) -> PathBuf {
        self.dir.join("refused").join(job_id.to_string())
    }

    /// Records why the Prolog refused offline job `job_id`.
    pub fn refuse_job(&self, job_id: u32, why: &str) -> Result<(), StateError> {
        write_atomic(&self.refusal_path(job_id), why.as_bytes())
    }

    /// Why offline job `job_id` was refused; None when it was not.
    pub fn refusal(&self, job_id: u32) -> Result<Option<String>, StateError> {
        let path = self.refusal_path(job_id);
        match fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StateError::Io { path, source: e }),
        }
    }

    /// Forgets a refusal (Epilog).
    pub fn forget_refusal(&self, job_id: u32) -> Result<(), StateError> {
        let path = self.refusal_path(job_id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::Io { path, source: e }),
        }
    }

    /// "No space left on device: DIR" when the file system of the state
    /// directory has no free block or inode left (what makes every write
    /// there fail); None otherwise or when it cannot be told.
    pub fn space_problem(&self) -> Option<String> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: statvfs writes only into the zeroed struct we own; the path
        // is a valid NUL-terminated string.
        let st = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            if libc::statvfs(path.as_ptr(), &mut st) != 0 {
                return None;
            }
            st
        };
        let full = st.f_bavail == 0 || (st.f_files > 0 && st.f_favail == 0);
        full.then(|| format!("No space left on device: {}", self.dir.display()))
    }

    /// GPUs that have a state directory, ascending.
    pub fn gpus(&self) -> Result<Vec<u32>, StateError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(StateError::Io {
                    path: self.dir.clone(),
                    source: e,
                })
            }
        };
        let mut gpus: Vec<u32> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("gpu"))
                    .and_then(|i| i.parse().ok())
            })
            .collect();
        gpus.sort_unstable();
        Ok(gpus)
    }

    /// Where job `job_id` is recorded: (GPU, record).
    /// Every GPU job `job_id` is recorded on (a k-GPU offline job: k), ascending.
    pub fn job_gpus(&self, job_id: u32) -> Result<Vec<u32>, StateError> {
        let mut out = Vec::new();
        for gpu in self.gpus()? {
            if self.jobs(gpu)?.iter().any(|j| j.job_id == job_id) {
                out.push(gpu);
            }
        }
        Ok(out)
    }

    pub fn find_job(&self, job_id: u32) -> Result<Option<(u32, JobRecord)>, StateError> {
        for gpu in self.gpus()? {
            if let Some(j) = self.jobs(gpu)?.into_iter().find(|j| j.job_id == job_id) {
                return Ok(Some((gpu, j)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn lock_files_are_private_in_a_private_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path().join("state"));
        let _gpu = ns.lock_gpu(0).unwrap();
        let _node = ns.lock_node().unwrap();
        let _police = ns.try_claim_police(7).unwrap().unwrap();
        assert_eq!(mode_of(&ns.dir().join(LOCK_DIR)), 0o700);
        for name in ["gpu0", "node", "police-7"] {
            let meta = fs::symlink_metadata(ns.lock_path(name)).unwrap();
            assert_eq!(
                (meta.mode() & 0o7777, meta.uid()),
                (0o600, euid()),
                "{name}"
            );
        }
        // Nothing else in the lock directory, no lock file outside it.
        let mut names: Vec<String> = fs::read_dir(ns.dir().join(LOCK_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["gpu0", "node", "police-7"]);
        assert!(!ns.gpu_dir(0).join("lock").exists());
    }

    /// What an earlier run left at a path.
    type Leave = fn(&Path);

    #[test]
    fn a_lock_file_others_could_open_is_replaced_not_waited_for() {
        // Each row: how the file at the lock's path was left, by whom.
        let rows: [(&str, Leave); 3] = [
            ("mode 0644 (a user may hold it open)", |p| {
                File::create(p).unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
            }),
            ("a link to a file elsewhere", |p| {
                let target = p.parent().unwrap().join("../../elsewhere");
                fs::write(&target, "kept").unwrap();
                std::os::unix::fs::symlink(&target, p).unwrap();
            }),
            ("a FIFO (opening it would block)", |p| {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
            }),
        ];
        for (name, leave) in rows {
            let tmp = tempfile::tempdir().unwrap();
            let ns = NodeState::new(tmp.path().join("state"));
            drop(ns.lock_node().unwrap());
            let path = ns.lock_path("gpu0");
            leave(&path);
            // Whoever holds the old file (here: this test) holds nothing
            // root waits for.
            let held = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .ok();
            if let Some(f) = &held {
                let _ = try_flock(f, libc::LOCK_EX);
            }
            let start = Instant::now();
            let lock = ns.lock_gpu(0).unwrap();
            assert!(start.elapsed() < Duration::from_secs(1), "{name}");
            let meta = fs::symlink_metadata(&path).unwrap();
            assert!(meta.file_type().is_file(), "{name}");
            assert_eq!(meta.mode() & 0o777, 0o600, "{name}");
            assert!(same_file(&lock._file, &path), "{name}");
            if name.starts_with("a link") {
                let target = tmp.path().join("elsewhere");
                assert_eq!(fs::read_to_string(target).unwrap(), "kept", "{name}");
            }
        }
    }

    #[test]
    fn the_lock_directory_is_made_private_again_or_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path().join("state"));
        drop(ns.lock_node().unwrap());
        let dir = ns.dir().join(LOCK_DIR);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        drop(ns.lock_node().unwrap());
        assert_eq!(mode_of(&dir), 0o700, "loosened: made private again");

        fs::remove_dir_all(&dir).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let e = ns.lock_node().err().expect("a link is refused");
        assert!(e.to_string().contains("not a directory of uid"), "{e}");
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn a_held_lock_is_waited_for_a_bounded_time() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        let held = ns.lock_gpu(0).unwrap();
        // flock belongs to the open file: a second open of this process
        // waits like another process would.
        let start = Instant::now();
        let wait = Duration::from_millis(200);
        assert!(ns.try_lock("gpu0", libc::LOCK_EX, wait).unwrap().is_none());
        assert!(start.elapsed() >= wait);
        assert!(start.elapsed() < wait * 5);
        assert!(ns.try_claim_police(3).unwrap().is_some());
        drop(held);
        assert!(ns.try_lock("gpu0", libc::LOCK_EX, wait).unwrap().is_some());
        let e = StateError::LockBusy {
            path: ns.lock_path("gpu0"),
            waited: LOCK_WAIT,
        };
        assert!(
            e.to_string()
                .contains("still held by another process after 20s"),
            "{e}"
        );
    }

    #[test]
    fn a_lock_file_removed_while_waited_for_is_taken_anew() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = Arc::new(NodeState::new(tmp.path()));
        let claim = ns.try_claim_police(5).unwrap().unwrap();
        let waiter = {
            let ns = Arc::clone(&ns);
            std::thread::spawn(move || {
                ns.try_lock("police-5", libc::LOCK_EX, Duration::from_secs(5))
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        // The Epilog removes the claim, then its old holder ends.
        ns.remove_police_claim(5);
        drop(claim);
        let file = waiter.join().unwrap().unwrap().expect("taken");
        assert!(same_file(&file, &ns.lock_path("police-5")));
    }

    #[test]
    fn older_lock_files_go() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        for old in [
            "node.lock",
            "sampler.lock",
            "gpu0/lock",
            "gpu1/lock",
            "police/12.lock",
        ] {
            let p = tmp.path().join(old);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            File::create(&p).unwrap();
        }
        drop(ns.lock_gpu(0).unwrap());
        for old in [
            "node.lock",
            "sampler.lock",
            "gpu0/lock",
            "gpu1/lock",
            "police",
        ] {
            assert!(!tmp.path().join(old).exists(), "{old}");
        }
        assert!(tmp.path().join("gpu1").is_dir(), "a GPU's directory stays");
    }

    #[test]
    fn jobs_and_health_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        assert_eq!(ns.health(0).unwrap(), None);
        assert!(ns.jobs(0).unwrap().is_empty());
        let lock = ns.lock_gpu(1).unwrap();
        let job = JobRecord {
            job_id: 42,
            mode: Mode::Offline,
            uid: 1000,
            slots: vec![0],
        };
        ns.add_job(&lock, 1, &job).unwrap();
        ns.add_job(
            &lock,
            1,
            &JobRecord {
                job_id: 7,
                mode: Mode::Online,
                uid: 0,
                slots: vec![],
            },
        )
        .unwrap();
        ns.set_health(&lock, 1, HealthState::Busy).unwrap();
        drop(lock);
        assert_eq!(ns.health(1).unwrap(), Some(HealthState::Busy));
        assert_eq!(
            ns.jobs(1)
                .unwrap()
                .iter()
                .map(|j| j.job_id)
                .collect::<Vec<_>>(),
            [7, 42]
        );
        assert_eq!(ns.find_job(42).unwrap(), Some((1, job)));
        assert_eq!(ns.gpus().unwrap(), [1]);
        let lock = ns.lock_gpu(1).unwrap();
        assert!(ns.remove_job(&lock, 1, 42).unwrap());
        assert!(!ns.remove_job(&lock, 1, 42).unwrap());
        assert_eq!(ns.facts(1).unwrap(), GpuFacts::default());
        let facts = GpuFacts {
            online_solo_sm_pct: Some(35),
            online_mem_mib: None,
            mem_total_mib: Some(81559),
            power_limit_w: Some(700),
        };
        ns.set_facts(&lock, 1, &facts).unwrap();
        assert_eq!(ns.facts(1).unwrap(), facts);
    }

    #[test]
    fn offline_slots_are_recorded_and_old_records_read_as_one_slot() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        let lock = ns.lock_gpu(0).unwrap();
        let rec = |job_id, mode, slots: &[u8]| JobRecord {
            job_id,
            mode,
            uid: 1000,
            slots: slots.to_vec(),
        };
        ns.add_job(&lock, 0, &rec(5, Mode::Offline, &[1, 2]))
            .unwrap();
        ns.add_job(&lock, 0, &rec(6, Mode::Online, &[])).unwrap();
        assert_eq!(
            fs::read_to_string(ns.gpu_dir(0).join("jobs/5")).unwrap(),
            "mode=offline uid=1000 slots=1,2\n"
        );
        assert_eq!(
            ns.jobs(0).unwrap(),
            [rec(5, Mode::Offline, &[1, 2]), rec(6, Mode::Online, &[])]
        );
        assert_eq!(ns.jobs(0).unwrap()[0].slot_count(), 2);
        // Records written before sized slots: `slot=<i>` is that one slot,
        // no slot at all (before slots existed) is slot 0; an online job
        // holds none whatever its old record says.
        let old = [
            (
                "mode=offline uid=1000 slot=1\n",
                rec(3, Mode::Offline, &[1]),
            ),
            ("mode=offline uid=1000\n", rec(3, Mode::Offline, &[0])),
            ("mode=online uid=1000 slot=0\n", rec(3, Mode::Online, &[])),
        ];
        for (text, want) in old {
            fs::write(ns.gpu_dir(0).join("jobs/3"), text).unwrap();
            let got = ns.jobs(0).unwrap()[0].clone();
            assert_eq!(got.slot_count(), 1, "{text}");
            assert_eq!(got, want, "{text}");
        }
        for bad in ["slots=0,0", "slots=a", "slots=0,", "slot=x"] {
            fs::write(
                ns.gpu_dir(0).join("jobs/3"),
                format!("mode=offline uid=1000 {bad}\n"),
            )
            .unwrap();
            let e = ns.jobs(0).unwrap_err().to_string();
            assert!(e.contains("jobs/3"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_lowest_free_offline_slots_are_picked() {
        let rec = |job_id, mode, slots: &[u8]| JobRecord {
            job_id,
            mode,
            uid: 1000,
            slots: slots.to_vec(),
        };
        struct Row {
            name: &'static str,
            jobs: Vec<JobRecord>,
            per_gpu: u8,
            want: u32,
            got: Option<&'static [u8]>,
        }
        let rows = [
            Row {
                name: "empty GPU, one slot: slot 0",
                jobs: vec![],
                per_gpu: 2,
                want: 1,
                got: Some(&[0]),
            },
            Row {
                name: "empty GPU, all its slots",
                jobs: vec![],
                per_gpu: 4,
                want: 4,
                got: Some(&[0, 1, 2, 3]),
            },
            Row {
                name: "an online job holds no offline slot",
                jobs: vec![rec(9, Mode::Online, &[])],
                per_gpu: 1,
                want: 1,
                got: Some(&[0]),
            },
            Row {
                name: "slot 0 held: slot 1",
                jobs: vec![rec(9, Mode::Online, &[]), rec(4, Mode::Offline, &[0])],
                per_gpu: 2,
                want: 1,
                got: Some(&[1]),
            },
            Row {
                name: "the first left, slot 1 still held: slot 0 again",
                jobs: vec![rec(6, Mode::Offline, &[1])],
                per_gpu: 2,
                want: 1,
                got: Some(&[0]),
            },
            Row {
                name: "two of four, the free ones apart",
                jobs: vec![rec(4, Mode::Offline, &[1]), rec(6, Mode::Offline, &[3])],
                per_gpu: 4,
                want: 2,
                got: Some(&[0, 2]),
            },
            Row {
                name: "two wanted, one free",
                jobs: vec![rec(4, Mode::Offline, &[0, 2]), rec(6, Mode::Offline, &[3])],
                per_gpu: 4,
                want: 2,
                got: None,
            },
            Row {
                name: "a job holding both slots leaves none",
                jobs: vec![rec(4, Mode::Offline, &[0, 1])],
                per_gpu: 2,
                want: 1,
                got: None,
            },
            Row {
                name: "an old record without slots holds slot 0",
                jobs: vec![rec(4, Mode::Offline, &[0])],
                per_gpu: 2,
                want: 2,
                got: None,
            },
            Row {
                name: "more than the GPU has",
                jobs: vec![],
                per_gpu: 2,
                want: 3,
                got: None,
            },
            Row {
                name: "none wanted",
                jobs: vec![],
                per_gpu: 2,
                want: 0,
                got: None,
            },
            Row {
                name: "the job's own record (a second Prolog) does not count",
                jobs: vec![rec(7, Mode::Offline, &[0, 1])],
                per_gpu: 2,
                want: 2,
                got: Some(&[0, 1]),
            },
            Row {
                name: "the job's own record keeps its slots",
                jobs: vec![rec(7, Mode::Offline, &[1])],
                per_gpu: 2,
                want: 1,
                got: Some(&[1]),
            },
            Row {
                name: "the job's own record of another size is picked again",
                jobs: vec![rec(7, Mode::Offline, &[1]), rec(4, Mode::Offline, &[2])],
                per_gpu: 4,
                want: 2,
                got: Some(&[0, 1]),
            },
        ];
        for r in rows {
            assert_eq!(
                free_offline_slots(&r.jobs, 7, r.per_gpu, r.want).as_deref(),
                r.got,
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn refusals_round_trip_and_space_is_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        assert_eq!(ns.refusal(3).unwrap(), None);
        ns.refuse_job(3, "not placed by muxflow").unwrap();
        assert_eq!(
            ns.refusal(3).unwrap().as_deref(),
            Some("not placed by muxflow")
        );
        ns.forget_refusal(3).unwrap();
        ns.forget_refusal(3).unwrap();
        assert_eq!(ns.refusal(3).unwrap(), None);
        // A temporary directory has room.
        assert_eq!(ns.space_problem(), None);
    }

    #[test]
    fn corrupt_files_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        fs::create_dir_all(ns.gpu_dir(0).join("jobs")).unwrap();
        fs::write(ns.health_file(0), "sick\n").unwrap();
        fs::write(ns.gpu_dir(0).join("jobs/5"), "mode=weird uid=1\n").unwrap();
        let e = ns.health(0).unwrap_err().to_string();
        assert!(e.contains("gpu0/state") && e.contains("sick"), "{e}");
        let e = ns.jobs(0).unwrap_err().to_string();
        assert!(e.contains("jobs/5") && e.contains("weird"), "{e}");
    }

    #[test]
    fn concurrent_writers_never_tear_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let ns = ns.clone();
                s.spawn(move || {
                    for i in 0..50u32 {
                        let lock = ns.lock_gpu(0).unwrap();
                        let job = JobRecord {
                            job_id: t * 1000 + i,
                            mode: Mode::Offline,
                            uid: t,
                            slots: vec![0],
                        };
                        ns.add_job(&lock, 0, &job).unwrap();
                        ns.set_health(&lock, 0, HealthState::ALL[(i % 5) as usize])
                            .unwrap();
                    }
                });
            }
            for _ in 0..100 {
                // Readers never see a partial record.
                ns.jobs(0).unwrap();
                ns.health(0).unwrap();
            }
        });
        assert_eq!(ns.jobs(0).unwrap().len(), 200);
    }
}
