//! Graceful exit on SIGINT/SIGTERM (MuxFlow's "mixed error handling", the
//! common case): killing an MPS client while its streams run is undefined
//! for the whole MPS server, so before the process goes:
//!
//! 1. the signal handler closes the gate (one atomic store), keeps the
//!    signal's `siginfo` and wakes the exit thread through a pipe (all
//!    async-signal-safe);
//! 2. the exit thread waits until no launch is inside the driver, then
//!    synchronizes and releases every context the process holds, refuses
//!    launches from then on (`CUDA_ERROR_DEINITIALIZED`) and writes the stats;
//! 3. it hands both signals back to the application's dispositions and
//!    replays the signal (`chain`): the application's own handler runs
//!    (with the original `siginfo` and the `SA_SIGINFO`, `SA_RESETHAND`,
//!    mask semantics it asked for), or the default action.
//!
//! **xCUDA stays first, with no window.** From `cuInit` on, this library
//! interposes `sigaction`, `signal` and `bsd_signal` for SIGINT and SIGTERM:
//! what the application installs is recorded as *its* disposition (and
//! reported back to it by later queries), while the kernel keeps xCUDA's
//! handler. An application that installs its handler right after `cuInit`
//! (Python, PyTorch, launchers) therefore never displaces the release. Other
//! signals, and every call in a forked child until its own start-up, go to
//! the C library untouched. A program that changes dispositions with the raw
//! `rt_sigaction` system call (not through the C library) is noticed by the
//! watcher's housekeeping within a second, as before.
//!
//! **Blocked signals.** The exit thread keeps SIGINT and SIGTERM unblocked,
//! so a process-directed signal reaches xCUDA even when every application
//! thread blocks it (`sigprocmask`, `pthread_sigmask`): no need to interpose
//! those. When the application consumes the signal synchronously (blocked
//! everywhere, read with `sigwait` or a `signalfd`), the replayed signal
//! stays pending for it after the release, as if xCUDA were not there.
//!
//! **Ignored signals.** SIGINT the application ignores is left ignored in
//! the kernel (nothing is released; a shell's background jobs ignore it, and
//! their exec'd children keep ignoring it). SIGTERM is always caught: Slurm
//! sends SIGKILL `KillWait` seconds after SIGTERM whatever the process does,
//! and a SIGKILL with streams running is what the MPS server cannot survive.
//! So a SIGTERM the application ignores still releases the contexts; the
//! application then goes on (as it asked) without the GPU: launches fail
//! with `CUDA_ERROR_DEINITIALIZED`, and the later SIGKILL finds no context.
//! (Side effect: a program it exec's starts with SIGTERM at its default
//! action, not ignored.)
//!
//! Between 1 and 3 the application keeps running: its calls that do not pass
//! the gate (allocations, synchronizations, copies) reach a context that is
//! being released, fail, and the application may call `exit` on such an
//! error before the release is done. xCUDA's `atexit` handler therefore
//! waits (bounded) for a graceful exit in progress.
//!
//! A child forked after start-up gets the application's dispositions back at
//! once, and its own exit thread and handlers at its restart
//! ([`after_fork_in_child`]).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::state;
use crate::sys::driver;

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
/// The process whose SIGINT/SIGTERM xCUDA holds (0: none yet). A forked
/// child inherits the parent's pid here: nothing is interposed in it until
/// its own start-up.
static HOLDER: AtomicU32 = AtomicU32::new(0);
/// Set when the graceful exit handed the signals back to the application.
static CHAINED: AtomicBool = AtomicBool::new(false);
/// Whether the application ignores SIGINT (read by the handler).
static APP_IGNORES_SIGINT: AtomicBool = AtomicBool::new(false);
/// The application's dispositions for SIGINT and SIGTERM.
static APP: Mutex<Vec<(c_int, libc::sigaction)>> = Mutex::new(Vec::new());
/// libc's `sigaction` (0: not looked up yet).
static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);

/// The `siginfo` of the signal being handled, written once by the handler
/// (guarded by `CAUGHT`) and read by the exit thread after the pipe wakes it.
struct Info(UnsafeCell<MaybeUninit<libc::siginfo_t>>);
// SAFETY: one writer (the handler that won `CAUGHT`), which happens before
// the pipe write the only reader waits for.
unsafe impl Sync for Info {}
static INFO: Info = Info(UnsafeCell::new(MaybeUninit::uninit()));
static INFO_SET: AtomicBool = AtomicBool::new(false);

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

fn real_sigaction() -> Option<SigactionFn> {
    let mut p = REAL_SIGACTION.load(SeqCst);
    if p == 0 {
        p = driver::libc_next(c"sigaction");
        REAL_SIGACTION.store(p, SeqCst);
    }
    // SAFETY: p is libc's sigaction, of this signature.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, SigactionFn>(p) })
}

/// Sets the kernel's disposition for `sig` (libc's sigaction, not ours).
fn kernel_set(sig: c_int, act: &libc::sigaction) {
    if let Some(f) = real_sigaction() {
        // SAFETY: a valid action; no old action wanted.
        unsafe { f(sig, act, std::ptr::null_mut()) };
    }
}

fn kernel_query(sig: c_int) -> libc::sigaction {
    // SAFETY: a zeroed sigaction is a valid out-buffer.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    if let Some(f) = real_sigaction() {
        // SAFETY: a null new action only reads the current one.
        unsafe { f(sig, std::ptr::null(), &mut old) };
    }
    old
}

fn default_action() -> libc::sigaction {
    // SAFETY: all-zero is SIG_DFL with an empty mask and no flags.
    unsafe { std::mem::zeroed() }
}

fn ours() -> libc::sighandler_t {
    on_signal as *const () as libc::sighandler_t
}

fn our_action() -> libc::sigaction {
    let mut new = default_action();
    new.sa_sigaction = ours();
    new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: sigemptyset/sigaddset on our own mask.
    unsafe {
        libc::sigemptyset(&mut new.sa_mask);
        for s in SIGNALS {
            libc::sigaddset(&mut new.sa_mask, s);
        }
    }
    new
}

/// Runs `f` on the application's dispositions with every signal blocked in
/// this thread, so that a handler calling `sigaction` cannot interrupt it
/// while the lock is held.
fn with_app<T>(f: impl FnOnce(&mut Vec<(c_int, libc::sigaction)>) -> T) -> T {
    // SAFETY: sigset_t is plain data; sigfillset/pthread_sigmask fill and
    // apply this thread's mask, restored below.
    let (all, mut old) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        (all, std::mem::zeroed::<libc::sigset_t>())
    };
    // SAFETY: valid sets.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) };
    let r = f(&mut APP.lock().unwrap_or_else(|e| e.into_inner()));
    // SAFETY: the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

fn app_of(app: &[(c_int, libc::sigaction)], sig: c_int) -> libc::sigaction {
    app.iter()
        .find(|(s, _)| *s == sig)
        .map_or_else(default_action, |(_, a)| *a)
}

/// Records `a` as the application's disposition for `sig` and puts into
/// the kernel what xCUDA needs: its handler, except for a SIGINT the
/// application ignores (see the module doc).
fn record(app: &mut Vec<(c_int, libc::sigaction)>, sig: c_int, a: libc::sigaction) {
    app.retain(|(s, _)| *s != sig);
    app.push((sig, a));
    let ignored = a.sa_sigaction == libc::SIG_IGN;
    if sig == libc::SIGINT {
        APP_IGNORES_SIGINT.store(ignored, SeqCst);
        if ignored {
            kernel_set(sig, &a);
            return;
        }
    }
    kernel_set(sig, &our_action());
}

fn held_here() -> bool {
    // SAFETY: getpid cannot fail.
    HOLDER.load(SeqCst) == unsafe { libc::getpid() } as u32 && !CHAINED.load(SeqCst)
}

/// The application's `sigaction` on SIGINT/SIGTERM while xCUDA holds them.
///
/// # Safety
/// `act` and `old` are null or valid, as for `sigaction`.
unsafe fn app_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: per the contract.
    let new = unsafe { act.as_ref() }.copied();
    with_app(|app| {
        if !held_here() {
            // The graceful exit handed the signals back meanwhile.
            return match real_sigaction() {
                // SAFETY: the caller's arguments, per the contract.
                Some(f) => unsafe { f(sig, act, old) },
                None => -1,
            };
        }
        if !old.is_null() {
            // SAFETY: per the contract.
            unsafe { old.write(app_of(app, sig)) };
        }
        if let Some(a) = new {
            record(app, sig, a);
        }
        0
    })
}

/// The C library's `sigaction`, interposed for SIGINT and SIGTERM.
///
/// # Safety
/// The C contract of `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if SIGNALS.contains(&sig) && held_here() {
        // SAFETY: the caller's arguments, per sigaction's contract.
        return unsafe { app_sigaction(sig, act, old) };
    }
    match real_sigaction() {
        // SAFETY: as above.
        Some(f) => unsafe { f(sig, act, old) },
        None => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
}

/// `signal`-style calls: `handler` with `flags`, the signal itself masked
/// while it runs when `mask_self` (BSD semantics) — as glibc builds them.
fn signal_like(
    sig: c_int,
    handler: libc::sighandler_t,
    flags: c_int,
    mask_self: bool,
    libc_name: &CStr,
) -> libc::sighandler_t {
    if SIGNALS.contains(&sig) && held_here() {
        if handler == libc::SIG_ERR {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::EINVAL };
            return libc::SIG_ERR;
        }
        let mut a = default_action();
        a.sa_sigaction = handler;
        a.sa_flags = flags;
        // SAFETY: our own mask.
        unsafe {
            libc::sigemptyset(&mut a.sa_mask);
            if mask_self {
                libc::sigaddset(&mut a.sa_mask, sig);
            }
        }
        let mut old = default_action();
        // SAFETY: valid action and out-buffer.
        if unsafe { app_sigaction(sig, &a, &mut old) } != 0 {
            return libc::SIG_ERR;
        }
        return old.sa_sigaction;
    }
    type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;
    match driver::libc_next(libc_name) {
        0 => libc::SIG_ERR,
        // SAFETY: libc's function of that name and signature, with the caller's arguments.
        p => unsafe { std::mem::transmute::<usize, SignalFn>(p)(sig, handler) },
    }
}

/// The C library's `signal` (BSD semantics, as glibc's: `SA_RESTART`, the
/// signal masked while its handler runs), interposed for SIGINT and SIGTERM.
///
/// # Safety
/// The C contract of `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    signal_like(sig, handler, libc::SA_RESTART, true, c"signal")
}

/// The C library's `bsd_signal` (the same as its `signal`).
///
/// # Safety
/// The C contract of `bsd_signal`.
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    signal_like(sig, handler, libc::SA_RESTART, true, c"bsd_signal")
}

/// The C library's `sysv_signal` (System V semantics: the handler runs
/// once, then the default action; not masked while it runs).
///
/// # Safety
/// The C contract of `sysv_signal`.
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    signal_like(
        sig,
        handler,
        libc::SA_RESETHAND | libc::SA_NODEFER,
        false,
        c"sysv_signal",
    )
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    if sig == libc::SIGINT && APP_IGNORES_SIGINT.load(SeqCst) {
        return; // raced with the application ignoring it
    }
    if CAUGHT.compare_exchange(0, sig, SeqCst, SeqCst).is_err() {
        return; // Already exiting; the exit thread chains once it is done.
    }
    if !info.is_null() {
        // SAFETY: the kernel's siginfo, copied once into our static (guarded by CAUGHT).
        unsafe { (*INFO.0.get()).write(info.read()) };
        INFO_SET.store(true, SeqCst);
    }
    state::gate().begin_shutdown();
    // SAFETY: errno is saved and restored around write(2), which is async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        let b = 1u8;
        libc::write(PIPE_W.load(SeqCst), &b as *const u8 as *const c_void, 1);
        *libc::__errno_location() = errno;
    }
}

/// Sets whether this thread takes SIGINT/SIGTERM.
fn take_signals_here(take: bool) {
    // SAFETY: a set of our two signals applied to this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        let how = if take {
            libc::SIG_UNBLOCK
        } else {
            libc::SIG_BLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// For xCUDA's other threads (the watcher).
pub fn block_signals_in_this_thread() {
    take_signals_here(false);
}

/// Starts the exit thread and takes SIGINT/SIGTERM (once per process, at
/// its start-up): the dispositions in place become the application's.
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
            // Always a thread that can take the signal, whatever the
            // application blocks in its own threads.
            take_signals_here(true);
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
    with_app(|app| {
        app.clear();
        for s in SIGNALS {
            let cur = kernel_query(s);
            record(app, s, cur);
        }
        // SAFETY: getpid cannot fail.
        HOLDER.store(unsafe { libc::getpid() } as u32, SeqCst);
    });
}

/// In a child forked after start-up (its only thread, right after fork):
/// there is no exit thread here, and the pipe is the parent's (a byte
/// written to it would make the *parent* exit). Put the application's
/// dispositions back and forget the pipe and any exit in progress; the
/// child's restart installs everything anew. (`HOLDER` still names the
/// parent: nothing is interposed here meanwhile.)
pub fn after_fork_in_child() {
    PIPE_W.store(-1, SeqCst);
    CAUGHT.store(0, SeqCst);
    RELEASED.store(false, SeqCst);
    INFO_SET.store(false, SeqCst);
    // try_lock: a lock another parent thread held at fork stays held here.
    let app = APP.try_lock().ok().map(|a| a.clone());
    for sig in SIGNALS {
        if kernel_query(sig).sa_sigaction != ours() {
            continue;
        }
        kernel_set(
            sig,
            &app.as_deref()
                .map_or_else(default_action, |a| app_of(a, sig)),
        );
    }
    CHAINED.store(false, SeqCst);
}

/// Housekeeping: a program that set a disposition with the raw system call
/// (bypassing the interposed `sigaction`) replaced xCUDA's handler; take its
/// disposition as the application's and put ours back.
pub fn reassert() {
    if PIPE_W.load(SeqCst) < 0 || CAUGHT.load(SeqCst) != 0 || !held_here() {
        return;
    }
    with_app(|app| {
        for s in SIGNALS {
            let cur = kernel_query(s);
            let ignored_sigint = s == libc::SIGINT && APP_IGNORES_SIGINT.load(SeqCst);
            if cur.sa_sigaction != ours() && !(ignored_sigint && cur.sa_sigaction == libc::SIG_IGN)
            {
                record(app, s, cur);
            }
        }
    });
}

type CtxFn = unsafe extern "C" fn() -> u32;
type HandleFn = unsafe extern "C" fn(usize) -> u32;
type RetainFn = unsafe extern "C" fn(*mut usize, c_int) -> u32;
type ReleaseFn = unsafe extern "C" fn(c_int) -> u32;

fn driver_fn<T: Copy>(name: &CStr) -> Option<T> {
    let p = driver::driver_symbol(name);
    // SAFETY: T is the C signature of `name`; p is the driver's export.
    (p != 0).then(|| unsafe { std::mem::transmute_copy::<usize, T>(&p) })
}

/// Synchronizes and releases every context in the book, with the driver's
/// own functions (not our wrappers).
fn release_contexts() {
    let book = state::contexts().take();
    let set: Option<HandleFn> = driver_fn(c"cuCtxSetCurrent");
    let sync: Option<CtxFn> = driver_fn(c"cuCtxSynchronize");
    let retain: Option<RetainFn> = driver_fn(c"cuDevicePrimaryCtxRetain");
    let release: Option<ReleaseFn> = driver_fn(c"cuDevicePrimaryCtxRelease_v2")
        .or_else(|| driver_fn(c"cuDevicePrimaryCtxRelease"));
    let destroy: Option<HandleFn> = driver_fn(c"cuCtxDestroy_v2");
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
    let gate = state::gate();
    gate.begin_shutdown();
    if !gate.drain(Instant::now() + DRAIN_DEADLINE) {
        crate::log(format_args!(
            "launches still in the driver after {DRAIN_DEADLINE:?}; releasing anyway"
        ));
    }
    release_contexts();
    state::count_release();
    gate.finish_shutdown();
    state::write_stats();
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

/// Hands both signals back to the application's dispositions and replays
/// `sig`, so the application's handler or default action runs as if xCUDA
/// were not there:
/// * a handler: the signal is replayed to this thread with the `siginfo`
///   the kernel gave xCUDA's handler (its sender, its code: only a thread
///   may queue a `siginfo` with a user code to itself), so the handler runs
///   here, at once, as for any process-directed signal;
/// * the default action: `kill` to the process (terminates it, or stays
///   pending where every application thread blocks it, for its `sigwait`
///   or `signalfd`; the sender seen there is then the process itself);
/// * ignored (SIGTERM, see the module doc): nothing.
fn chain(sig: c_int) {
    let app = with_app(|app| {
        CHAINED.store(true, SeqCst);
        for s in SIGNALS {
            kernel_set(s, &app_of(app, s));
        }
        app_of(app, sig)
    });
    if app.sa_sigaction == libc::SIG_IGN {
        return; // SIGTERM ignored: released, the process goes on without the GPU
    }
    // SAFETY: getpid/gettid cannot fail; rt_tgsigqueueinfo to this very
    // thread with the siginfo the kernel gave the handler; kill/tgkill to
    // ourselves as the fallbacks.
    unsafe {
        let me = libc::getpid();
        if app.sa_sigaction == libc::SIG_DFL {
            take_signals_here(false);
            libc::kill(me, sig);
            return;
        }
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        let replayed = INFO_SET.load(SeqCst)
            && libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                me,
                tid,
                sig,
                (*INFO.0.get()).as_ptr(),
            ) == 0;
        if !replayed {
            libc::syscall(libc::SYS_tgkill, me, tid, sig);
        }
    }
}
