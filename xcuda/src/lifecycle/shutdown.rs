//! Stop signals (SIGINT/SIGTERM, MuxFlow's "mixed error handling", the
//! common case): **the application's handler first, the release at the
//! deadline.** Killing an MPS client while its streams run is undefined for
//! the whole MPS server, and Slurm sends SIGKILL `KillWait` seconds after
//! SIGTERM whatever the process does; but a trainer told to stop wants to
//! checkpoint, which takes its GPU. So:
//!
//! 1. the signal handler only records the signal (its `siginfo`, the time)
//!    and wakes the exit thread through a pipe (async-signal-safe: atomics,
//!    `clock_gettime`, `write`); the gate stays as the watcher set it;
//! 2. the exit thread, at once: reads the stop deadline (root's
//!    [`muxflow::records::limits::StopBounds`], read fresh: an online job's Prolog may
//!    have set a latest release since the job started) and hands the signal
//!    to the application: its handler runs (replayed with the original
//!    `siginfo` and the `SA_SIGINFO`, `SA_RESETHAND`, mask semantics it asked
//!    for) and the GPU stays usable; a SIGTERM it ignores stays ignored;
//! 3. the release — gate closed, launches inside the driver drained, every
//!    context synchronized and released, launches refused from then on with
//!    `CUDA_ERROR_DEINITIALIZED`, stats written — comes at the earliest of:
//!    * the process exiting (`exit`, a return from `main`: xCUDA's `atexit`
//!      handler, [`at_process_exit`]);
//!    * a default-action exit: a signal the application leaves at (or has
//!      reset to) its default action is released first, then replayed to
//!      end the process as it would have;
//!    * the deadline: a thread of its own sleeps until it and releases
//!      (not a handler: the release takes locks; not the exit thread: the
//!      application's handlers run there and may take their time); the
//!      application, if it still runs, goes on without the GPU.
//!
//! With no deadline known (no limits file bound, not a Slurm job) the
//! deadline is the signal itself: released first, then the handler, as
//! before deadlines existed. Every path ends in a release before Slurm's
//! SIGKILL can come; only `_exit` without a prior signal-driven release
//! (and the SIGKILL itself, before any stop signal) bypass it.
//!
//! **xCUDA stays first, with no window.** From `cuInit` on, this library
//! interposes `sigaction`, `signal`, `bsd_signal` and `sysv_signal` for
//! SIGINT and SIGTERM: what the application installs is recorded as *its*
//! disposition (and reported back to it by later queries), while the kernel
//! keeps xCUDA's handler — also after a signal, so that a handler that resets
//! the default action and re-raises (a common "save, then die as asked"
//! shape) still meets the release first. An application that installs its
//! handler right after `cuInit` (Python, PyTorch, launchers) therefore never
//! displaces the deadline. Other signals, and every call in a forked child
//! until its own start-up, go to the C library untouched. A program that
//! changes dispositions with the raw `rt_sigaction` system call (not through
//! the C library) is noticed by the watcher's housekeeping within a second.
//!
//! **Blocked signals.** The exit thread keeps SIGINT and SIGTERM unblocked,
//! so a process-directed signal reaches xCUDA even when every application
//! thread blocks it (`sigprocmask`, `pthread_sigmask`). When the application
//! consumes the signal synchronously (blocked everywhere, left at its default
//! action, read with `sigwait` or a `signalfd`), xCUDA cannot tell that from a
//! default-action exit: it releases, and the replayed signal stays pending
//! for the application.
//!
//! **Ignored signals.** A SIGINT the application ignores is left ignored in
//! the kernel (nothing happens; a shell's background jobs ignore it). SIGTERM
//! is always caught, because its SIGKILL follows: one the application ignores
//! is respected until the deadline, then the contexts are released and the
//! application goes on (as it asked) without the GPU.
//!
//! A child forked after start-up gets the application's dispositions back at
//! once, and its own exit thread and handlers at its restart
//! ([`after_fork_in_child`]).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst,
};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use muxflow::records::limits::StopBounds;

use crate::state;
use crate::sys::driver;

const SIGNALS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];
/// Longest wait for launches inside the driver and for each synchronize.
const DRAIN_DEADLINE: Duration = Duration::from_secs(2);
/// Longest wait at process exit for a release under way on another thread.
const EXIT_WAIT: Duration = Duration::from_secs(10);

static PIPE_W: AtomicI32 = AtomicI32::new(-1);
/// The exit thread's id (0: none).
static EXIT_TID: AtomicI32 = AtomicI32::new(0);
/// The process exits: the exit and deadline threads are asked to release now.
static RELEASE_ASKED: AtomicBool = AtomicBool::new(false);
/// When the first stop signal came (wall clock, ms since the epoch; 0: none
/// yet). Wall clock because the latest release it is compared with is
/// written by another process.
static STOP_AT_MS: AtomicU64 = AtomicU64::new(0);
/// The release: [`NOT_RELEASED`], [`RELEASING`] or [`RELEASED`].
static RELEASE: AtomicU8 = AtomicU8::new(NOT_RELEASED);
const NOT_RELEASED: u8 = 0;
const RELEASING: u8 = 1;
const RELEASED: u8 = 2;
/// The process whose SIGINT/SIGTERM xCUDA holds (0: none yet). A forked
/// child inherits the parent's pid here: nothing is interposed in it until
/// its own start-up.
static HOLDER: AtomicU32 = AtomicU32::new(0);
/// Set when a default-action exit handed the signals back to the application.
static CHAINED: AtomicBool = AtomicBool::new(false);
/// The signal being replayed to the application's handler (0: none): its
/// disposition is in the kernel meanwhile, which housekeeping must not undo.
static PASSING: AtomicI32 = AtomicI32::new(0);
/// Whether the application ignores SIGINT (read by the handler).
static APP_IGNORES_SIGINT: AtomicBool = AtomicBool::new(false);
/// The application's dispositions for SIGINT and SIGTERM.
static APP: Mutex<Vec<(c_int, libc::sigaction)>> = Mutex::new(Vec::new());
/// libc's `sigaction` (0: not looked up yet).
static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);

/// One pending signal of each kind (as the kernel keeps standard signals):
/// its `siginfo`, written by the handler that moved `state` from
/// [`FREE`] to [`WRITING`], read by the exit thread once it is [`PENDING`].
struct Pending {
    state: AtomicU8,
    has_info: AtomicBool,
    info: UnsafeCell<MaybeUninit<libc::siginfo_t>>,
}
const FREE: u8 = 0;
const WRITING: u8 = 1;
const PENDING: u8 = 2;
// SAFETY: `info` has one writer at a time (the handler that won `state`
// FREE -> WRITING) and is read only in state PENDING, by the exit thread,
// before it sets FREE again.
unsafe impl Sync for Pending {}
// An array of statics is built from a const; each use is a fresh value, the
// sharing the lint warns of does not happen.
#[allow(clippy::declare_interior_mutable_const)]
const NO_SIGNAL: Pending = Pending {
    state: AtomicU8::new(FREE),
    has_info: AtomicBool::new(false),
    info: UnsafeCell::new(MaybeUninit::uninit()),
};
static SIGNALLED: [Pending; 2] = [NO_SIGNAL, NO_SIGNAL];

fn index(sig: c_int) -> usize {
    usize::from(sig == libc::SIGTERM)
}

/// Wall clock in ms. Async-signal-safe (`clock_gettime`).
fn now_unix_ms() -> u64 {
    // SAFETY: clock_gettime fills our own timespec.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
        ts
    };
    (ts.tv_sec as u64).saturating_mul(1000) + (ts.tv_nsec as u64) / 1_000_000
}

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
    let p = &SIGNALLED[index(sig)];
    if p.state
        .compare_exchange(FREE, WRITING, SeqCst, SeqCst)
        .is_err()
    {
        return; // One of this kind is pending already: the kernel merges them too.
    }
    if !info.is_null() {
        // SAFETY: the kernel's siginfo, copied into our slot (ours alone in state WRITING).
        unsafe { (*p.info.get()).write(info.read()) };
    }
    p.has_info.store(!info.is_null(), SeqCst);
    p.state.store(PENDING, SeqCst);
    let _ = STOP_AT_MS.compare_exchange(0, now_unix_ms(), SeqCst, SeqCst);
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
            // SAFETY: gettid cannot fail.
            EXIT_TID.store(unsafe { libc::syscall(libc::SYS_gettid) } as i32, SeqCst);
            exit_thread(r);
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
    EXIT_TID.store(0, SeqCst);
    RELEASE_ASKED.store(false, SeqCst);
    STOP_AT_MS.store(0, SeqCst);
    RELEASE.store(NOT_RELEASED, SeqCst);
    PASSING.store(0, SeqCst);
    for p in &SIGNALLED {
        p.state.store(FREE, SeqCst);
    }
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
    if PIPE_W.load(SeqCst) < 0 || PASSING.load(SeqCst) != 0 || !held_here() {
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

/// The exit thread: waits for stop signals, hands each to the application
/// and, at the first, starts the deadline's watch ([`watch_deadline`]).
fn exit_thread(pipe: c_int) {
    // When the release is due (wall clock ms), kept here only if the
    // deadline's own thread could not start.
    let mut due: Option<u64> = None;
    let mut armed = false;
    loop {
        let timeout_ms = match due {
            Some(at) if RELEASE.load(SeqCst) == NOT_RELEASED => {
                let left = at.saturating_sub(now_unix_ms());
                if left == 0 {
                    release_at_deadline();
                    continue;
                }
                left.min(i32::MAX as u64) as c_int
            }
            _ => -1,
        };
        let mut fd = libc::pollfd {
            fd: pipe,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on our own descriptor.
        if unsafe { libc::poll(&mut fd, 1, timeout_ms) } > 0 {
            let mut buf = [0u8; 16];
            // SAFETY: reads into our own buffer from our own pipe.
            unsafe { libc::read(pipe, buf.as_mut_ptr() as *mut c_void, buf.len()) };
        }
        if RELEASE_ASKED.load(SeqCst) {
            release();
        }
        for sig in SIGNALS {
            let p = &SIGNALLED[index(sig)];
            if p.state.load(SeqCst) != PENDING {
                continue;
            }
            let info = p
                .has_info
                .load(SeqCst)
                // SAFETY: written by the handler before it set PENDING.
                .then(|| unsafe { (*p.info.get()).assume_init_read() });
            p.state.store(FREE, SeqCst);
            if !armed {
                armed = true;
                let at = stop_bounds().release_at_unix_ms(STOP_AT_MS.load(SeqCst));
                if at <= now_unix_ms() {
                    // No time to give (or none known): released before the
                    // application hears of it, as before deadlines existed.
                    release();
                } else if std::thread::Builder::new()
                    .name("xcuda-deadline".into())
                    .spawn(move || watch_deadline(at))
                    .is_err()
                {
                    due = Some(at);
                }
            }
            deliver(sig, info);
        }
    }
}

/// The deadline's own thread: the application's handler runs on the exit
/// thread and may take its time (or never return); the release must not
/// wait for it. Releases at `at` (wall clock ms), or earlier when the
/// process exits ([`at_process_exit`] asks).
fn watch_deadline(at: u64) {
    block_signals_in_this_thread();
    while RELEASE.load(SeqCst) == NOT_RELEASED {
        if RELEASE_ASKED.load(SeqCst) {
            release();
            return;
        }
        let left = at.saturating_sub(now_unix_ms());
        if left == 0 {
            release_at_deadline();
            return;
        }
        std::thread::sleep(Duration::from_millis(left.min(20)));
    }
}

fn release_at_deadline() {
    crate::log(format_args!(
        "releasing the GPU at the stop deadline ({} ms after the stop signal): \
         launches are refused from now on",
        now_unix_ms().saturating_sub(STOP_AT_MS.load(SeqCst))
    ));
    release();
}

/// The bounds root set for this process's job, read now (see the module doc).
fn stop_bounds() -> StopBounds {
    match state::Source::of_this_process() {
        state::Source::Job {
            job,
            dir: Some(dir),
        } if dir.starts_with('/') => StopBounds::read_trusted(std::path::Path::new(&dir), job, 0)
            .unwrap_or_else(|e| {
                crate::log(format_args!(
                    "{e}; no stop deadline known, so the GPU is released at once"
                ));
                StopBounds::default()
            }),
        state::Source::RootEnvironment => StopBounds::from_env(|k| std::env::var(k).ok()),
        _ => StopBounds::default(),
    }
}

/// Hands `sig` to the application as its disposition says: its handler
/// runs (the GPU still usable until the release), an ignored SIGTERM stays
/// ignored, the default action ends the process after the release.
fn deliver(sig: c_int, info: Option<libc::siginfo_t>) {
    let app = with_app(|app| app_of(app, sig));
    match app.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            release();
            default_action_exit(sig);
        }
        _ => replay_to_handler(sig, info),
    }
}

/// The release (see the module doc), once per process: a second caller
/// waits, at most `EXIT_WAIT`, for the first to finish.
fn release() {
    if RELEASE
        .compare_exchange(NOT_RELEASED, RELEASING, SeqCst, SeqCst)
        .is_err()
    {
        let end = Instant::now() + EXIT_WAIT;
        while RELEASE.load(SeqCst) != RELEASED {
            if Instant::now() >= end {
                crate::log(format_args!(
                    "the contexts are still being released after {EXIT_WAIT:?}; going on"
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        return;
    }
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
    RELEASE.store(RELEASED, SeqCst);
}

/// At process exit (`atexit`, and the C library's `_exit`/`_Exit`, which
/// skip `atexit`): once a stop signal came, the contexts are released before
/// the process goes — the application may exit from its handler after its
/// checkpoint, or on an error from a context being released. The release
/// takes locks, and `_exit` may be called from a signal handler, so another
/// thread does not release itself: it asks the exit thread and the
/// deadline's (either may be busy: the exit thread runs the application's
/// handlers) and waits (at most `EXIT_WAIT`; only atomics, `write` and
/// `nanosleep` here). On the exit
/// thread itself (a handler replayed there exits) the release runs there,
/// between the replay's two locked sections, with no lock of xCUDA held.
pub fn at_process_exit() {
    // SAFETY: getpid and gettid cannot fail.
    let (me, tid) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as i32) };
    if STOP_AT_MS.load(SeqCst) == 0
        || HOLDER.load(SeqCst) != me as u32
        || RELEASE.load(SeqCst) == RELEASED
        || PIPE_W.load(SeqCst) < 0
    {
        return;
    }
    if tid == EXIT_TID.load(SeqCst) {
        release();
        return;
    }
    RELEASE_ASKED.store(true, SeqCst);
    // SAFETY: one byte to our own pipe (async-signal-safe); errno restored.
    unsafe {
        let errno = *libc::__errno_location();
        let b = 2u8;
        libc::write(PIPE_W.load(SeqCst), &b as *const u8 as *const c_void, 1);
        *libc::__errno_location() = errno;
    }
    let step = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    for _ in 0..EXIT_WAIT.as_millis() {
        if RELEASE.load(SeqCst) == RELEASED {
            return;
        }
        // SAFETY: nanosleep with our own timespec (async-signal-safe).
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
    }
}

/// The C library's `_exit`: the release first, once a stop signal came
/// ([`at_process_exit`]), then the process ends as asked.
///
/// # Safety
/// The C contract of `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    at_process_exit();
    end_process(status)
}

/// The C library's `_Exit` (the same as `_exit`).
///
/// # Safety
/// The C contract of `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    at_process_exit();
    end_process(status)
}

/// Ends the process as the C library's `_exit` does (the `exit_group`
/// system call; looking the C library's function up is not
/// async-signal-safe).
fn end_process(status: c_int) -> ! {
    loop {
        // SAFETY: exit_group ends every thread of the process.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// Replays `sig` to the application's handler on this thread, with the
/// `siginfo` the kernel gave xCUDA's handler (its sender, its code: only a
/// thread may queue a `siginfo` with a user code to itself), then takes the
/// signal back: the application's disposition is in the kernel only while
/// the signal is delivered, which happens on the way back from the system
/// call, so the handler has run when it returns. What the handler left
/// (`SA_RESETHAND`'s reset, a disposition it set) becomes the
/// application's.
fn replay_to_handler(sig: c_int, info: Option<libc::siginfo_t>) {
    with_app(|app| {
        PASSING.store(sig, SeqCst);
        kernel_set(sig, &app_of(app, sig));
    });
    // SAFETY: getpid/gettid cannot fail; rt_tgsigqueueinfo to this very
    // thread with the siginfo the kernel gave the handler; tgkill as the
    // fallback.
    unsafe {
        let me = libc::getpid();
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        let replayed = info.is_some_and(|i| {
            libc::syscall(libc::SYS_rt_tgsigqueueinfo, me, tid, sig, &i as *const _) == 0
        });
        if !replayed {
            libc::syscall(libc::SYS_tgkill, me, tid, sig);
        }
    }
    with_app(|app| {
        let cur = kernel_query(sig);
        if cur.sa_sigaction != ours() {
            record(app, sig, cur);
        }
        PASSING.store(0, SeqCst);
    });
}

/// A default-action exit, after the release: hands both signals back to
/// the application's dispositions and sends `sig` to the process, which
/// terminates (or, where every application thread blocks it, finds it
/// pending for its `sigwait` or `signalfd`; the sender seen there is then
/// the process itself).
fn default_action_exit(sig: c_int) {
    with_app(|app| {
        CHAINED.store(true, SeqCst);
        for s in SIGNALS {
            kernel_set(s, &app_of(app, s));
        }
    });
    take_signals_here(false);
    // SAFETY: getpid cannot fail; kill to ourselves.
    unsafe { libc::kill(libc::getpid(), sig) };
}
