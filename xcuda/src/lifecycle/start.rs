//! Start-up, fork and exit of a process: at its first `cuInit` (or, in a
//! child forked after that, its first gated launch) the watcher, the exit
//! thread and the signal handling start; fork handlers keep the child's
//! locks and books clean; `atexit` writes the last stats.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use crate::abi::cu;
use crate::state::gate::Mode;
use crate::state::{contexts, gate, graphmem, memcap, settings, write_stats};
use crate::CUresult;

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
    gate().set_restart(ensure_started);
    // Before any launch of this process takes the fast path without a fence.
    crate::state::gate::register_barrier();
    let s = settings();
    if s.env.role == muxflow::records::xcuda_env::Role::Online {
        // Counting mode: no gate to move, no cap, the application's signals
        // left alone (its own graceful shutdown must not meet released
        // contexts); only the publisher.
        crate::state::online::set_online();
        super::publisher::spawn(s);
        return;
    }
    memcap();
    // First: the file that names this process is the node's proof that
    // xCUDA started in it (a library only mapped writes none).
    write_stats();
    super::shutdown::install();
    // A forked child's inherited delay means nothing: open until its watcher says.
    gate().set(Mode::Delay(Duration::ZERO));
    crate::state::queue::enable(s.env.queue_inflight, s.env.queue_inflight_us);
    if crate::state::queue::enabled() {
        super::queue_poll::spawn(s);
    }
    // Health first, before the first launch can pass.
    super::watcher::apply_health(s, &mut false);
    super::watcher::spawn(s);
    if first {
        extern "C" fn at_exit() {
            let _ = std::panic::catch_unwind(|| {
                // After a stop signal the process leaves only once its
                // contexts are released (its handler's checkpoint done, or
                // an error from a context being released).
                super::shutdown::at_process_exit();
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
                super::watcher::BUSY
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            ),
            // Graph books before the cap's table: a launch takes them in that order.
            Box::new(graphmem().hold()),
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
        super::shutdown::after_fork_in_child();
        gate().after_fork();
        crate::state::queue::after_fork();
        memcap().after_fork();
        graphmem().after_fork();
    });
}
