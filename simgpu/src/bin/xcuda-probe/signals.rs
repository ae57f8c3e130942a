//! Signals: contexts ended by SIGTERM (`ctx`), and the application's own
//! signal handling beside xCUDA's graceful exit (`signals`).

use super::resolve::{die, Resolver};
use super::{check, setup, Launch, Res, H, MIB};
use cuda_abi::fnty;
use std::ffi::{c_int, c_uint, c_void};
use std::io::Write;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};

/// `ctx SYMBOL`: makes a context with SYMBOL (a create or retain variant),
/// or, for a release/reset variant, retains the primary context, calls
/// SYMBOL and retains it again; prints what it resolved, `ready`, then
/// sends itself SIGTERM: the graceful exit must release what xCUDA
/// recorded (the default action then ends the process).
pub fn ctx_then_sigterm(r: &Resolver, symbol: &str) {
    let init: fnty::cuInit = r.get("cuInit", "cuInit");
    let retain: fnty::cuDevicePrimaryCtxRetain =
        r.get("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    type Create = unsafe extern "C" fn(*mut H, c_uint, c_int) -> Res;
    let mut ctx: H = std::ptr::null_mut();
    // SAFETY: entry points resolved for these signatures; valid out-pointers.
    unsafe {
        check(init(0), "cuInit");
        let before = r.driver_calls(symbol);
        let rc = match symbol {
            "cuDevicePrimaryCtxRetain" => retain(&mut ctx, 0),
            "cuCtxCreate" => r.get_at::<Create>("cuCtxCreate", symbol, 3000)(&mut ctx, 0, 0),
            "cuCtxCreate_v2" => r.get_at::<Create>("cuCtxCreate", symbol, 11000)(&mut ctx, 0, 0),
            "cuCtxCreate_v3" => r
                .get_at::<unsafe extern "C" fn(*mut H, H, c_int, c_uint, c_int) -> Res>(
                    "cuCtxCreate",
                    symbol,
                    12000,
                )(&mut ctx, std::ptr::null_mut(), 0, 0, 0),
            "cuCtxCreate_v4" => r.get_at::<unsafe extern "C" fn(*mut H, H, c_uint, c_int) -> Res>(
                "cuCtxCreate",
                symbol,
                12050,
            )(&mut ctx, std::ptr::null_mut(), 0, 0),
            "cuDevicePrimaryCtxRelease"
            | "cuDevicePrimaryCtxReset"
            | "cuDevicePrimaryCtxReset_v2" => {
                let base = symbol.trim_end_matches("_v2");
                let v = if symbol.ends_with("_v2") {
                    11000
                } else {
                    10000
                };
                let f: unsafe extern "C" fn(c_int) -> Res = r.get_at(base, symbol, v);
                check(retain(&mut ctx, 0), "cuDevicePrimaryCtxRetain");
                let rc = f(0);
                check(retain(&mut ctx, 0), "cuDevicePrimaryCtxRetain");
                rc
            }
            _ => die(&format!("ctx: unknown {symbol}")),
        };
        check(rc, symbol);
        println!(
            "driver_calls={}",
            r.driver_calls(symbol).wrapping_sub(before)
        );
        r.report();
        println!("ready");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        libc::kill(libc::getpid(), libc::SIGTERM);
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
    std::process::exit(3);
}

/// `signals MODE`: how the application's own signal handling fares with
/// xCUDA. The application changes its SIGTERM (or SIGINT) disposition right
/// after cuInit and the signal comes at once (sent to itself):
///   handler    sigaction(SA_SIGINFO handler); the handler reports whether
///              the context was already gone (an allocation fails) and the
///              sender's pid, then _exit(7)
///   signal     the same with signal()
///   sysv       the same with sysv_signal()
///   external   the handler installed, then `ready`: the test sends SIGTERM
///   ignore     SIG_IGN; afterwards a launch (refused: released) and a query
///   resethand  SA_RESETHAND handler; it runs once, the disposition is then
///              the default, and a second SIGTERM kills the process
///   sigint-ignored   SIGINT to SIG_IGN, then SIGINT: nothing is released
///   blocked    SIGTERM blocked in every application thread (before cuInit):
///              released all the same, and the signal stays pending for the
///              application
/// With a stop deadline (MUXFLOW_XCUDA_STOP_GRACE_MS), a trainer's shapes:
///   checkpoint       a handler that only sets a flag; the main thread then
///                    uses the GPU (an allocation: its "checkpoint") and
///                    calls exit(7)
///   checkpoint-_exit the same, ending with _exit(7)
///   reraise          the same, then the default action back and SIGTERM
///                    raised again (the process dies of it)
///   ignore-deadline  SIG_IGN; launches every 10 ms until one is refused;
///                    prints how many passed after the signal
///   stuck-handler    a handler that never returns (it runs on xCUDA's exit
///                    thread); the main thread launches until refused
pub fn signals(r: &Resolver, mode: &str) {
    if mode == "blocked" {
        // Before cuInit, so the driver's threads inherit the mask: blocked in
        // every application thread, as a program that takes SIGTERM with
        // sigwait does it (otherwise a driver thread may take the signal).
        block_sigterm();
    }
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1us");
    ALLOC.store(cu.alloc as usize, SeqCst);
    let app = App {
        launch: r.get("cuLaunchKernel", "cuLaunchKernel"),
        f,
        // SAFETY: getpid has no preconditions.
        me: unsafe { libc::getpid() },
    };
    match mode {
        "handler" | "external" => app.own_handler(mode == "handler"),
        "signal" | "sysv" => app.plain_handler(mode == "sysv"),
        "ignore" => app.ignore(),
        "resethand" => app.resethand(),
        "checkpoint" | "checkpoint-_exit" | "reraise" => app.checkpoint(mode),
        "stuck-handler" => app.stuck_handler(),
        "ignore-deadline" => app.ignore_deadline(),
        "sigint-ignored" => app.sigint_ignored(),
        "blocked" => app.blocked(),
        _ => die("unknown signals mode"),
    }
    std::thread::sleep(std::time::Duration::from_secs(10));
    println!("no_handler_ran");
    std::process::exit(1);
}

static ALLOC: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicU32 = AtomicU32::new(0);

/// The application's handler: reports whether the context was already gone
/// (an allocation fails) and the sender's pid, then `_exit(7)`.
extern "C" fn report_and_exit(sig: c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
    // SAFETY: test-only handler: the pointer stored by `signals`, with its
    // signature; the kernel's siginfo; then _exit. (Formatting is not
    // async-signal-safe; the main thread is asleep meanwhile.)
    unsafe {
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> Res =
            std::mem::transmute(ALLOC.load(SeqCst));
        let mut p = 0u64;
        let rc = alloc(&mut p, MIB);
        let pid = if info.is_null() { -1 } else { (*info).si_pid() };
        println!("app_handler sig={sig} alloc_rc={rc} si_pid={pid}");
        let _ = std::io::stdout().flush();
        libc::_exit(7);
    }
}

extern "C" fn plain(sig: c_int) {
    report_and_exit(sig, std::ptr::null_mut(), std::ptr::null_mut());
}

extern "C" fn count(_: c_int, _: *mut libc::siginfo_t, _: *mut c_void) {
    HANDLED.fetch_add(1, SeqCst);
}

/// A handler that never returns.
extern "C" fn stuck(_: c_int, _: *mut libc::siginfo_t, _: *mut c_void) {
    HANDLED.fetch_add(1, SeqCst);
    loop {
        // SAFETY: sleep is async-signal-safe.
        unsafe { libc::sleep(60) };
    }
}

fn block_sigterm() {
    // SAFETY: a sigset filled by the C library, our own thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Installs handler `h` for SIGTERM with sigaction `flags`.
fn install(h: usize, flags: c_int) {
    // SAFETY: a zeroed sigaction is valid; filled here, then installed.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = h;
        a.sa_flags = flags;
        libc::sigaction(libc::SIGTERM, &a, std::ptr::null_mut());
    }
}

/// The disposition of `sig`, as the application sees it when it asks.
fn disposition(sig: c_int) -> usize {
    // SAFETY: a null new action only reads.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

fn pause(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

fn flush() {
    let _ = std::io::stdout().flush();
}

/// The application: its process and its one kernel launch.
struct App {
    launch: Launch,
    f: H,
    me: libc::pid_t,
}

impl App {
    fn kill(&self, sig: c_int) {
        // SAFETY: a signal to our own process.
        unsafe { libc::kill(self.me, sig) };
    }

    /// One launch of one block of 32 threads on the default stream.
    fn launch_once(&self) -> Res {
        let (n, pp) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a resolved entry point with valid arguments.
        unsafe { (self.launch)(self.f, 1, 1, 1, 32, 1, 1, 0, n, pp, pp) }
    }

    /// The signal may be taken by xCUDA's exit thread while this one runs
    /// on: launches (every 10 ms, at most 20 s) until the graceful exit
    /// refuses one; (last result, launches that passed).
    fn launch_until_refused(&self) -> (Res, u64) {
        let (mut rc, mut passed) = (0, 0u64);
        for _ in 0..2000 {
            rc = self.launch_once();
            if rc != 0 {
                break;
            }
            passed += 1;
            pause(10);
        }
        (rc, passed)
    }

    /// `handler` (sent at once) and `external` (`ready`, the test sends it).
    fn own_handler(&self, send: bool) {
        install(report_and_exit as *const () as usize, libc::SA_SIGINFO);
        // The application sees its own handler when it asks.
        if disposition(libc::SIGTERM) != report_and_exit as *const () as usize {
            die("sigaction does not report the application's own handler");
        }
        if send {
            self.kill(libc::SIGTERM);
        } else {
            println!("ready");
            flush();
        }
    }

    /// `signal` and `sysv`: the handler installed with signal() or sysv_signal().
    fn plain_handler(&self, sysv: bool) {
        extern "C" {
            fn sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t;
        }
        // SAFETY: installing a handler for our own process.
        unsafe {
            if sysv {
                sysv_signal(libc::SIGTERM, plain as *const () as usize);
            } else {
                libc::signal(libc::SIGTERM, plain as *const () as usize);
            }
        }
        self.kill(libc::SIGTERM);
    }

    fn ignore(&self) {
        // SAFETY: SIG_IGN for our own process.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        self.kill(libc::SIGTERM);
        let (rc, _) = self.launch_until_refused();
        let ign = u8::from(disposition(libc::SIGTERM) == libc::SIG_IGN);
        println!("ignored launch_rc={rc} still_ignored={ign}");
        std::process::exit(0);
    }

    fn resethand(&self) {
        install(
            count as *const () as usize,
            libc::SA_SIGINFO | libc::SA_RESETHAND,
        );
        self.kill(libc::SIGTERM);
        for _ in 0..500 {
            if HANDLED.load(SeqCst) > 0 {
                break;
            }
            pause(10);
        }
        let reset = u8::from(disposition(libc::SIGTERM) == libc::SIG_DFL);
        println!("handled={} reset={reset}", HANDLED.load(SeqCst));
        flush();
        self.kill(libc::SIGTERM);
    }

    /// `checkpoint`, `checkpoint-_exit` and `reraise`.
    fn checkpoint(&self, mode: &str) {
        install(count as *const () as usize, libc::SA_SIGINFO);
        self.kill(libc::SIGTERM);
        while HANDLED.load(SeqCst) == 0 {
            pause(1);
        }
        // SAFETY: the allocation entry point stored by `signals`, with its
        // signature; exits of our own process.
        unsafe {
            let alloc: unsafe extern "C" fn(*mut u64, usize) -> Res =
                std::mem::transmute(ALLOC.load(SeqCst));
            let mut p = 0u64;
            let rc = alloc(&mut p, MIB);
            println!("checkpoint alloc_rc={rc}");
            flush();
            match mode {
                "checkpoint" => libc::exit(7),
                "checkpoint-_exit" => libc::_exit(7),
                _ => {
                    libc::signal(libc::SIGTERM, libc::SIG_DFL);
                    self.kill(libc::SIGTERM);
                }
            }
        }
    }

    /// The handler runs on xCUDA's exit thread and never returns.
    fn stuck_handler(&self) {
        install(stuck as *const () as usize, libc::SA_SIGINFO);
        self.kill(libc::SIGTERM);
        let (rc, _) = self.launch_until_refused();
        println!("stuck launch_rc={rc} handled={}", HANDLED.load(SeqCst));
        flush();
        // SAFETY: exit of our own process.
        unsafe { libc::exit(0) };
    }

    fn ignore_deadline(&self) {
        // SAFETY: SIG_IGN for our own process.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        self.kill(libc::SIGTERM);
        let (rc, passed) = self.launch_until_refused();
        let ign = u8::from(disposition(libc::SIGTERM) == libc::SIG_IGN);
        println!("ignored launch_rc={rc} passed_after_signal={passed} still_ignored={ign}");
        std::process::exit(0);
    }

    fn sigint_ignored(&self) {
        // SAFETY: SIG_IGN for our own process.
        unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        self.kill(libc::SIGINT);
        pause(500);
        let rc = self.launch_once();
        println!("sigint_ignored launch_rc={rc}");
        std::process::exit(0);
    }

    fn blocked(&self) {
        self.kill(libc::SIGTERM);
        let (rc, _) = self.launch_until_refused();
        // SAFETY: a zeroed sigset filled by sigpending.
        let p = unsafe {
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            libc::sigismember(&pending, libc::SIGTERM)
        };
        println!("blocked launch_rc={rc} pending={p}");
        std::process::exit(0);
    }
}
