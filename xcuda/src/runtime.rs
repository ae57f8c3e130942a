//! Process-wide state: settings (read once from the plugin's environment),
//! the gate, the memory cap, the context book, and start-up at `cuInit`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use muxflow::config::Xcuda;
use muxflow::xcuda_env::{self, XcudaEnv};

use crate::gate::{Gate, Mode};
use crate::memcap::MemCap;
use crate::stats::{self, Counters};
use crate::{cu, CUresult};

#[derive(Debug)]
pub struct Settings {
    pub env: XcudaEnv,
    /// False when a gate setting was unreadable: the gate then stays open.
    pub gate_enabled: bool,
}

impl Settings {
    /// Reads the settings with `get`. A bad value is logged (naming the
    /// variable) and the safe fallback is taken: the cap if it parses on its
    /// own, the stats directory if it is absolute, the gate left open.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Settings {
        match XcudaEnv::from_env(&get) {
            Ok(env) => Settings {
                env,
                gate_enabled: true,
            },
            Err(e) => {
                crate::log(format_args!("{e}; launch gate disabled"));
                let mut env = XcudaEnv::from_config(&Xcuda::default(), 0);
                env.mem_limit_bytes =
                    get(xcuda_env::MEM_LIMIT_BYTES).and_then(|v| v.trim().parse().ok());
                env.stats_dir = get(xcuda_env::STATS_DIR)
                    .filter(|v| v.starts_with('/'))
                    .map(Into::into);
                Settings {
                    env,
                    gate_enabled: false,
                }
            }
        }
    }
}

pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::from_env(|k| std::env::var(k).ok()))
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
/// exit thread): let go, hand the signals back to the application and make
/// the next gated launch restart everything.
extern "C" fn in_forked_child() {
    let _ = std::panic::catch_unwind(|| {
        FORK_HELD.with(|h| h.borrow_mut().clear());
        crate::shutdown::after_fork_in_child();
        gate().after_fork();
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
        Settings::from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn bad_gate_value_keeps_the_cap_and_opens_the_gate() {
        let s = from(&[
            (xcuda_env::MEM_LIMIT_BYTES, "1048576"),
            (xcuda_env::UTILIZATION_BRAKE, "lots"),
            (xcuda_env::STATS_DIR, "/var/lib/x"),
        ]);
        assert!(!s.gate_enabled);
        assert_eq!(s.env.mem_limit_bytes, Some(1 << 20));
        assert_eq!(s.env.stats_dir, Some("/var/lib/x".into()));
        let s = from(&[(xcuda_env::MEM_LIMIT_BYTES, "8G")]);
        assert!(!s.gate_enabled);
        assert_eq!(s.env.mem_limit_bytes, None);
        let s = from(&[(xcuda_env::MEM_LIMIT_BYTES, "100")]);
        assert!(s.gate_enabled);
        assert_eq!(s.env.mem_limit_bytes, Some(100));
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
