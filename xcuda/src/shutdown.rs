//! Graceful exit on SIGINT/SIGTERM (MuxFlow's "mixed error handling", the
//! common case): killing an MPS client while its streams run is undefined
//! for the whole MPS server, so before the process goes:
//!
//! 1. the signal handler closes the gate (one atomic store) and wakes the
//!    exit thread through a pipe (both async-signal-safe);
//! 2. the exit thread waits until no launch is inside the driver, then
//!    synchronizes and releases every context the process holds, refuses
//!    launches from then on (`CUDA_ERROR_DEINITIALIZED`) and writes the stats;
//! 3. it puts back the application's previous disposition and re-raises the
//!    signal: the application's own handler runs, or the default action.
//!
//! Between 1 and 3 the application keeps running: its calls that do not pass
//! the gate (allocations, synchronizations, copies) reach a context that is
//! being released, fail, and the application may call `exit` on such an
//! error before the release is done. xCUDA's `atexit` handler therefore
//! waits (bounded) for a graceful exit in progress: the process does not go
//! with its contexts half released.
//!
//! Handlers are installed at `cuInit` (Python installs its own before that)
//! and chain to whatever was there; a signal the application ignores is
//! left alone. The watcher re-installs ours if the application replaced it
//! later, keeping the application's handler as the one to chain to. A child
//! forked after that gets the application's dispositions back at once and
//! its own exit thread and handlers at its restart ([`after_fork_in_child`]).

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::runtime;

const SIGNALS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];
/// Longest wait for launches inside the driver and for each synchronize.
const DRAIN_DEADLINE: Duration = Duration::from_secs(2);
/// Longest wait at process exit for a graceful exit in progress.
const EXIT_WAIT: Duration = Duration::from_secs(10);

static PIPE_W: AtomicI32 = AtomicI32::new(-1);
/// The signal being handled (0: none yet).
static CAUGHT: AtomicI32 = AtomicI32::new(0);
/// Set once the exit thread released the contexts (before it chains).
static RELEASED: AtomicBool = AtomicBool::new(false);
/// The application's dispositions, to chain to.
static PREVIOUS: Mutex<Vec<(c_int, libc::sigaction)>> = Mutex::new(Vec::new());

extern "C" fn on_signal(sig: c_int, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    if CAUGHT.compare_exchange(0, sig, SeqCst, SeqCst).is_err() {
        return; // Already exiting; the exit thread chains once it is done.
    }
    runtime::gate().begin_shutdown();
    // SAFETY: errno is saved and restored around write(2), which is async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        let b = 1u8;
        libc::write(PIPE_W.load(SeqCst), &b as *const u8 as *const c_void, 1);
        *libc::__errno_location() = errno;
    }
}

fn ours() -> libc::sighandler_t {
    on_signal as *const () as libc::sighandler_t
}

fn query(sig: c_int) -> libc::sigaction {
    // SAFETY: sigaction with a null new action only reads the current one.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old
    }
}

fn install_one(sig: c_int) {
    let old = query(sig);
    if old.sa_sigaction == libc::SIG_IGN || old.sa_sigaction == ours() {
        return;
    }
    // SAFETY: a zeroed sigaction is valid; the mask and handler are set below.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = ours();
    new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: sigemptyset/sigaddset on our own mask; sigaction with valid pointers.
    unsafe {
        libc::sigemptyset(&mut new.sa_mask);
        for s in SIGNALS {
            libc::sigaddset(&mut new.sa_mask, s);
        }
        let mut prev = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
        prev.retain(|(s, _)| *s != sig);
        prev.push((sig, old));
        drop(prev);
        libc::sigaction(sig, &new, std::ptr::null_mut());
    }
}

/// Installs the handlers and starts the exit thread (once, at cuInit).
pub fn install() {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 fills the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        crate::log(format_args!(
            "no pipe for the exit thread; no graceful exit"
        ));
        return;
    }
    let r = fds[0];
    let spawned = std::thread::Builder::new()
        .name("xcuda-exit".into())
        .spawn(move || {
            let mut b = 0u8;
            // SAFETY: blocking read of one byte from our own pipe.
            while unsafe { libc::read(r, &mut b as *mut u8 as *mut c_void, 1) } != 1 {}
            exit(CAUGHT.load(SeqCst));
        });
    if spawned.is_err() {
        crate::log(format_args!(
            "cannot start the exit thread; no graceful exit"
        ));
        return;
    }
    PIPE_W.store(fds[1], SeqCst);
    for s in SIGNALS {
        install_one(s);
    }
}

/// In a child forked after start-up (its only thread, right after fork):
/// there is no exit thread here, and the pipe is the parent's (a byte
/// written to it would make the *parent* exit). Put the application's
/// dispositions back and forget the pipe and any exit in progress; the
/// child's restart installs everything anew.
pub fn after_fork_in_child() {
    PIPE_W.store(-1, SeqCst);
    CAUGHT.store(0, SeqCst);
    RELEASED.store(false, SeqCst);
    // try_lock: a lock another parent thread held at fork stays held here.
    let prev = PREVIOUS.try_lock().ok();
    for sig in SIGNALS {
        if query(sig).sa_sigaction != ours() {
            continue;
        }
        match prev
            .as_ref()
            .and_then(|p| p.iter().find(|(s, _)| *s == sig))
        {
            // SAFETY: restoring a disposition sigaction gave us.
            Some((_, a)) => unsafe {
                libc::sigaction(sig, a, std::ptr::null_mut());
            },
            // SAFETY: the default disposition.
            None => unsafe {
                libc::signal(sig, libc::SIG_DFL);
            },
        }
    }
}

/// Re-installs our handler where the application replaced it after cuInit.
pub fn reassert() {
    if PIPE_W.load(SeqCst) < 0 || CAUGHT.load(SeqCst) != 0 {
        return;
    }
    for s in SIGNALS {
        let cur = query(s).sa_sigaction;
        if cur != ours() && cur != libc::SIG_IGN && cur != libc::SIG_DFL {
            install_one(s);
        }
    }
}

type Fn0 = unsafe extern "C" fn() -> u32;
type Fn1 = unsafe extern "C" fn(usize) -> u32;
type RetainFn = unsafe extern "C" fn(*mut usize, c_int) -> u32;
type ReleaseFn = unsafe extern "C" fn(c_int) -> u32;

fn driver_fn<T: Copy>(name: &CStr) -> Option<T> {
    let p = crate::driver::driver_symbol(name);
    // SAFETY: T is the C signature of `name`; p is the driver's export.
    (p != 0).then(|| unsafe { std::mem::transmute_copy::<usize, T>(&p) })
}

/// Synchronizes and releases every context in the book, with the driver's
/// own functions (not our wrappers).
fn release_contexts() {
    let book = runtime::contexts().take();
    let set: Option<Fn1> = driver_fn(c"cuCtxSetCurrent");
    let sync: Option<Fn0> = driver_fn(c"cuCtxSynchronize");
    let retain: Option<RetainFn> = driver_fn(c"cuDevicePrimaryCtxRetain");
    let release: Option<ReleaseFn> = driver_fn(c"cuDevicePrimaryCtxRelease_v2")
        .or_else(|| driver_fn(c"cuDevicePrimaryCtxRelease"));
    let destroy: Option<Fn1> = driver_fn(c"cuCtxDestroy_v2");
    let (Some(set), Some(sync)) = (set, sync) else {
        return;
    };
    // SAFETY: driver calls with contexts and ordinals this process obtained.
    unsafe {
        for ctx in book.created {
            set(ctx);
            sync();
            if let Some(d) = destroy {
                d(ctx);
            }
        }
        if let (Some(retain), Some(release)) = (retain, release) {
            for (dev, n) in book.primary {
                let mut ctx = 0usize;
                if retain(&mut ctx, dev) == 0 {
                    set(ctx);
                    sync();
                    for _ in 0..=n {
                        release(dev);
                    }
                }
            }
        }
    }
}

fn exit(sig: c_int) {
    let gate = runtime::gate();
    gate.begin_shutdown();
    if !gate.drain(Instant::now() + DRAIN_DEADLINE) {
        crate::log(format_args!(
            "launches still in the driver after {DRAIN_DEADLINE:?}; releasing anyway"
        ));
    }
    release_contexts();
    gate.finish_shutdown();
    runtime::write_stats();
    RELEASED.store(true, SeqCst);
    chain(sig);
}

/// At process exit (`atexit`): if a signal started the graceful exit and the
/// contexts are not released yet, waits until they are (at most `EXIT_WAIT`).
pub fn wait_for_release() {
    let end = Instant::now() + EXIT_WAIT;
    while CAUGHT.load(SeqCst) != 0 && !RELEASED.load(SeqCst) {
        if Instant::now() >= end {
            crate::log(format_args!(
                "exiting after {EXIT_WAIT:?} with the contexts not yet released"
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Puts the application's disposition back and re-raises `sig`.
fn chain(sig: c_int) {
    let prev = PREVIOUS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(s, _)| *s == sig)
        .map(|(_, a)| *a);
    // SAFETY: restoring a disposition sigaction gave us; kill to our own pid.
    unsafe {
        match prev {
            Some(a) => {
                libc::sigaction(sig, &a, std::ptr::null_mut());
            }
            None => {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        libc::kill(libc::getpid(), sig);
    }
}
