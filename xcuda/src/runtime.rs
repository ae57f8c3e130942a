//! Process-wide state: settings (read once from the plugin's environment),
//! the gate, the memory cap, the context book, and start-up at `cuInit`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use muxflow::limits::JobLimits;
use muxflow::xcuda_env::{self, XcudaEnv};

use crate::gate::{Gate, Mode};
use crate::memcap::MemCap;
use crate::stats::{self, Counters};
use crate::{cu, CUresult};

#[derive(Debug)]
pub struct Settings {
    pub env: XcudaEnv,
}

/// Where a process's settings come from, decided once at its first driver
/// call. Inside a Slurm job only the job's root-owned limits file counts
/// (the environment is the user's); outside a job, root's environment is
/// trusted (tests, benches, an admin's tools) and anyone else gets the safe
/// settings. A bad value anywhere takes its safe fallback (crate
/// `muxflow::xcuda_env`): the gate is never switched off and the cap never
/// lifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A process of job `job`, whose limits file is in `dir` (if named).
    Job { job: u32, dir: Option<String> },
    /// Not in a job, real uid 0.
    RootEnvironment,
    /// Not in a job, another user.
    Nothing,
}

impl Source {
    pub fn of_this_process() -> Source {
        let me = std::process::id();
        match muxflow::jobproc::Procfs::default().job_of(me) {
            Some(job) => Source::Job {
                job,
                dir: std::env::var(xcuda_env::LIMITS_DIR).ok(),
            },
            // SAFETY: getuid cannot fail and touches no memory.
            None if unsafe { libc::getuid() } == 0 => Source::RootEnvironment,
            None => Source::Nothing,
        }
    }
}

impl Settings {
    /// The settings from `source`; `get` reads the environment (used only
    /// for [`Source::RootEnvironment`]); `owner` owns trusted files (root).
    /// Every fallback taken is logged, naming the setting.
    pub fn load(source: &Source, get: impl Fn(&str) -> Option<String>, owner: u32) -> Settings {
        let (env, problems) = match source {
            Source::RootEnvironment => {
                let (env, p) = XcudaEnv::from_env_lenient(get);
                (env, p)
            }
            Source::Nothing => {
                crate::log(format_args!(
                    "not in a Slurm job and not root: no settings to trust, so no GPU memory may be allocated"
                ));
                (XcudaEnv::safe(), Vec::new())
            }
            Source::Job { job, dir } => {
                let Some(dir) = dir.as_deref().filter(|d| d.starts_with('/')) else {
                    crate::log(format_args!(
                        "job {job} has no limits directory ({} unset): no GPU memory may be allocated; \
                         was xCUDA preloaded by hand into a job muxflow does not protect?",
                        xcuda_env::LIMITS_DIR
                    ));
                    return Settings {
                        env: XcudaEnv::safe(),
                    };
                };
                match JobLimits::read_trusted(std::path::Path::new(dir), *job, owner) {
                    Ok((limits, p)) => (limits.xcuda, p),
                    Err(e) => {
                        crate::log(format_args!("{e}; no GPU memory may be allocated"));
                        return Settings {
                            env: XcudaEnv::safe(),
                        };
                    }
                }
            }
        };
        for p in problems {
            crate::log(format_args!("{p}; its safe value is used"));
        }
        Settings { env }
    }
}

pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::load(&Source::of_this_process(), |k| std::env::var(k).ok(), 0))
}

static GATE: Gate = Gate::with_restart(ensure_started);

pub fn gate() -> &'static Gate {
    &GATE
}

pub fn memcap() -> &'static MemCap {
    static M: OnceLock<MemCap> = OnceLock::new();
    M.get_or_init(|| MemCap::new(settings().env.mem_limit_bytes))
}

/// The contexts this process holds, for the graceful exit.
#[derive(Debug, Default)]
pub struct Contexts {
    book: Mutex<Book>,
}

#[derive(Debug, Default, Clone)]
pub struct Book {
    /// Device ordinal -> primary-context retain count.
    pub primary: HashMap<c_int, u32>,
    /// Contexts made with cuCtxCreate.
    pub created: Vec<usize>,
}

impl Contexts {
    fn with(&self, f: impl FnOnce(&mut Book)) {
        f(&mut self.book.lock().unwrap_or_else(|e| e.into_inner()));
    }
    pub fn retained(&self, dev: c_int, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| *b.primary.entry(dev).or_default() += 1);
        }
        rc
    }
    pub fn released(&self, dev: c_int, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| {
                if let Some(n) = b.primary.get_mut(&dev) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        b.primary.remove(&dev);
                    }
                }
            });
        }
        rc
    }
    pub fn reset(&self, dev: c_int, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| {
                b.primary.remove(&dev);
            });
        }
        rc
    }
    /// `ctx`: the context the driver returned (read after the call).
    pub fn created(&self, rc: CUresult, ctx: impl FnOnce() -> u64) -> CUresult {
        if rc == cu::SUCCESS {
            let h = ctx() as usize;
            self.with(|b| b.created.push(h));
        }
        rc
    }
    pub fn destroyed(&self, ctx: *mut c_void, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| b.created.retain(|&c| c != ctx as usize));
        }
        rc
    }
    /// Holds the book (while a fork copies the process).
    pub fn hold(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties the book, returning what was in it.
    pub fn take(&self) -> Book {
        std::mem::take(&mut *self.book.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

pub fn contexts() -> &'static Contexts {
    static C: OnceLock<Contexts> = OnceLock::new();
    C.get_or_init(Contexts::default)
}

/// The process whose watcher, exit thread and signal handlers run (0: none
/// yet), and the one whose start-up finished. A child forked after start-up
/// inherits its parent's pid here but none of those threads.
static STARTING: AtomicU32 = AtomicU32::new(0);
static STARTED: AtomicU32 = AtomicU32::new(0);

/// After the real cuInit: start the watcher and the signal handling.
pub fn on_init(rc: CUresult) -> CUresult {
    if rc == cu::SUCCESS {
        ensure_started();
    }
    rc
}

/// Starts the watcher, the exit thread and the signal handlers once per
/// process: at the first cuInit, and in a child forked after that at its
/// first cuInit or gated launch. Returns once they run (other threads
/// arriving meanwhile wait: health applies before any launch passes).
pub fn ensure_started() {
    let me = std::process::id();
    let seen = STARTING.load(SeqCst);
    if seen != me && STARTING.compare_exchange(seen, me, SeqCst, SeqCst).is_ok() {
        let _ = std::panic::catch_unwind(|| start(seen == 0));
        STARTED.store(me, SeqCst);
    }
    while STARTED.load(SeqCst) != me {
        std::thread::yield_now();
    }
}

fn start(first: bool) {
    let s = settings();
    memcap();
    crate::shutdown::install();
    // A forked child's inherited delay means nothing: open until its watcher says.
    gate().set(Mode::Delay(Duration::ZERO));
    // Health first, before the first launch can pass.
    crate::watcher::apply_health(s, &mut false);
    crate::watcher::spawn(s);
    if first {
        extern "C" fn at_exit() {
            let _ = std::panic::catch_unwind(|| {
                // The application may exit on an error from a context the
                // graceful exit is releasing: let the release finish first.
                crate::shutdown::wait_for_release();
                write_stats();
            });
        }
        // SAFETY: registering plain extern "C" fns that never unwind; both
        // registrations are inherited by forked children, so once is enough.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(in_forked_child));
        }
    }
}

thread_local! {
    /// The locks a fork in progress holds (taken and given back by the forking thread).
    static FORK_HELD: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// Before fork: wait for the watcher to be between samples and for no
/// allocation or context bookkeeping to be under way, and hold them, so the
/// child copies none of those locks taken.
extern "C" fn before_fork() {
    let _ = std::panic::catch_unwind(|| {
        let held: Vec<Box<dyn std::any::Any>> = vec![
            Box::new(
                crate::watcher::BUSY
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            ),
            Box::new(memcap().hold()),
            Box::new(contexts().hold()),
        ];
        FORK_HELD.with(|h| *h.borrow_mut() = held);
    });
}

/// After fork, in the parent: let go.
extern "C" fn after_fork() {
    let _ = std::panic::catch_unwind(|| FORK_HELD.with(|h| h.borrow_mut().clear()));
}

/// After fork, in the child (only the forking thread exists: no watcher, no
/// exit thread): let go, hand the signals back to the application, start
/// the child's counters and memory books from zero (its stats file is its
/// own; the job sums them) and make the next gated launch restart everything.
extern "C" fn in_forked_child() {
    let _ = std::panic::catch_unwind(|| {
        FORK_HELD.with(|h| h.borrow_mut().clear());
        crate::shutdown::after_fork_in_child();
        gate().after_fork();
        memcap().after_fork();
    });
}

pub fn counters() -> Counters {
    let g = gate().counts();
    let m = memcap();
    Counters {
        launches: g.launches,
        delayed: g.delayed,
        delay_us: g.delay_us,
        oom: m.refused(),
        peak_bytes: m.peak(),
    }
}

/// Writes the stats file if the plugin asked for one; logs the first failure.
pub fn write_stats() {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    // One writer at a time (watcher, exit thread, atexit share the temp name);
    // counters read inside, so the last file written is the newest.
    static WRITING: Mutex<()> = Mutex::new(());
    if let Some(dir) = &settings().env.stats_dir {
        let _w = WRITING.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = stats::write(dir, std::process::id(), &counters()) {
            if !LOGGED.swap(true, Relaxed) {
                crate::log(format_args!("{e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Settings {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load(&Source::RootEnvironment, |k| m.get(k).cloned(), 0)
    }

    #[test]
    fn a_bad_value_takes_its_safe_fallback_and_the_rest_holds() {
        let s = from(&[
            (xcuda_env::MEM_LIMIT_BYTES, "1048576"),
            (xcuda_env::UTILIZATION_BRAKE, "lots"),
            (xcuda_env::SAMPLE_INTERVAL_MS, "bogus"),
            (xcuda_env::STATS_DIR, "/var/lib/x"),
        ]);
        assert_eq!(s.env.mem_limit_bytes, Some(1 << 20));
        assert_eq!(s.env.stats_dir, Some("/var/lib/x".into()));
        assert_eq!(
            (s.env.utilization_brake, s.env.sample_interval_ms),
            (95, 20)
        );
        let s = from(&[(xcuda_env::MEM_LIMIT_BYTES, "8G")]);
        assert_eq!(
            s.env.mem_limit_bytes,
            Some(0),
            "an unreadable cap allows nothing"
        );
        let s = from(&[(xcuda_env::MEM_LIMIT_BYTES, &u64::MAX.to_string())]);
        assert_eq!(s.env.mem_limit_bytes, Some(0), "a huge cap allows nothing");
    }

    #[test]
    fn in_a_job_only_its_trusted_file_counts_never_the_environment() {
        let env = |k: &str| (k == xcuda_env::MEM_LIMIT_BYTES).then(|| u64::MAX.to_string());
        // SAFETY: geteuid cannot fail and touches no memory.
        let me = unsafe { libc::geteuid() };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_str().unwrap().to_string();
        let job = |dir: Option<String>| Source::Job { job: 7, dir };
        // No file: the safe settings, whatever the environment says.
        let s = Settings::load(&job(Some(dir.clone())), env, me);
        assert_eq!(s.env, XcudaEnv::safe());
        let s = Settings::load(&job(None), env, me);
        assert_eq!(s.env, XcudaEnv::safe());
        // The job's file: its cap.
        let mut x = XcudaEnv::from_config(&muxflow::config::Xcuda::default(), 1);
        x.mem_limit_bytes = Some(64 << 20);
        let limits = JobLimits {
            job_id: 7,
            gpu: 1,
            sm_pct: 30,
            mem_cap_mib: Some(64),
            xcuda: x.clone(),
        };
        let path = muxflow::limits::path(tmp.path(), 7);
        std::fs::write(&path, limits.encode()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(Settings::load(&job(Some(dir.clone())), env, me).env, x);
        // Another owner's file (as a user's own would be): not trusted.
        assert_eq!(
            Settings::load(&job(Some(dir)), env, me + 1).env,
            XcudaEnv::safe()
        );
        assert_eq!(
            Settings::load(&Source::Nothing, env, me).env,
            XcudaEnv::safe()
        );
    }

    #[test]
    fn context_book() {
        let c = Contexts::default();
        c.retained(0, 0);
        c.retained(0, 0);
        c.retained(1, 2);
        c.released(0, 0);
        c.created(0, || 0x10);
        c.created(1, || 0x30);
        c.destroyed(0x20 as *mut c_void, 0);
        let b = c.take();
        assert_eq!(b.primary, HashMap::from([(0, 1)]));
        assert_eq!(b.created, vec![0x10]);
        assert!(c.take().primary.is_empty());
    }
}
