//! xcuda-probe: test and benchmark helper. Reaches the driver one of five
//! ways and prints `key=value` lines:
//!
//! ```text
//! xcuda-probe HOW [--pt] SCENARIO [N]
//!   HOW       direct (linked symbols) | dlsym (dlopen + dlsym(handle)) |
//!             dlsym-deepbind (dlopen with RTLD_DEEPBIND + dlsym(handle)) |
//!             dlsym-default (dlsym(RTLD_DEFAULT)) | dlvsym (dlopen +
//!             dlvsym(handle, name, "SIMGPU_1"), the fake's symbol version) |
//!             getproc (cuGetProcAddress) | getproc2 (cuGetProcAddress_v2)
//!   --pt      per-thread default stream: the _ptsz variants
//!             (cuGetProcAddress flag 2; the explicit names otherwise)
//!   SCENARIO  api        every gated and capped entry point once; quota checks
//!             graph      graph memory against the quota: in-graph allocations
//!                        (explicit nodes, stream capture), destroy and trim
//!             graph-path P   one path of graph memory (free_same, alloc_node,
//!                        free_other, mem_free, mem_free_async, destroy,
//!                        update, captured) and the fake driver's own books
//!             storm N    8 threads x N x (two 20 MiB cuMemAlloc, then their cuMemFree)
//!             launches N N back-to-back launches; ns per launch
//!             allocs N   N cuMemAlloc/cuMemFree pairs; ns per pair
//!             fork S     one launch, then fork: the parent prints `child=PID` and
//!                        waits for it; the child launches 1 ms kernels (each
//!                        synchronized) for S seconds or until a signal
//!             exit-on-error   prints `ready`, then cuMemAlloc/cuMemFree until a
//!                        call fails, then exit(1) at once (an application
//!                        that exits on a driver error, e.g. mid graceful exit)
//!             shim-bench N   (run without LD_PRELOAD; XCUDA_PROBE_SHIM = the .so)
//!                        N launches and N alloc/free pairs each way, direct
//!                        and through the dlopen'ed shim, interleaved in blocks
//!                        in one process so machine noise hits both alike
//! ```
//! The quota checks in `api` assume MUXFLOW_XCUDA_MEM_LIMIT_BYTES = 64 MiB.

//!
//! One module per group of checks: `resolve` (the five ways to the driver
//! and the report of what each name reached), `launchers` (the gated entry
//! points), `api` (every gated and capped entry point once), `graphs`
//! (graph memory against the quota), `signals` (the application's own
//! signal handling and contexts ended by SIGTERM), `fork` (fork and exit
//! paths), `bench` (timed loops).

#![deny(clippy::undocumented_unsafe_blocks)]

mod api;
mod bench;
mod fork;
mod graphs;
mod launchers;
mod resolve;
mod signals;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

// The driver ABI and the frameworks' loader, as the shim declares them (the
// probe must not link the shim's library: its exports would interpose
// inside the probe).
use cuda_abi::load as cudaload;
use resolve::{die, How, Resolver};

type Res = u32;
type H = *mut c_void;
use cudaload::LaunchKernel as Launch;

const MIB: usize = 1 << 20;

/// The entry points every scenario uses, resolved by [`setup`].
struct Cuda {
    init: unsafe extern "C" fn(c_uint) -> Res,
    retain: unsafe extern "C" fn(*mut H, c_int) -> Res,
    release: unsafe extern "C" fn(c_int) -> Res,
    set_current: unsafe extern "C" fn(H) -> Res,
    load: unsafe extern "C" fn(*mut H, *const c_void) -> Res,
    function: unsafe extern "C" fn(*mut H, H, *const c_char) -> Res,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> Res,
    free: unsafe extern "C" fn(u64) -> Res,
    info: unsafe extern "C" fn(*mut usize, *mut usize) -> Res,
}

fn check(rc: Res, what: &str) {
    if rc != 0 {
        println!("error={rc} call={what}");
        std::process::exit(1);
    }
}

fn setup(r: &Resolver, kernel: &CStr) -> (Cuda, H, H) {
    let cu = Cuda {
        init: r.get("cuInit", "cuInit"),
        retain: r.get("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"),
        release: r.get("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"),
        set_current: r.get("cuCtxSetCurrent", "cuCtxSetCurrent"),
        load: r.get("cuModuleLoadData", "cuModuleLoadData"),
        function: r.get("cuModuleGetFunction", "cuModuleGetFunction"),
        alloc: r.get("cuMemAlloc", "cuMemAlloc_v2"),
        free: r.get("cuMemFree", "cuMemFree_v2"),
        info: r.get("cuMemGetInfo", "cuMemGetInfo_v2"),
    };
    let mut ctx: H = std::ptr::null_mut();
    let mut module: H = std::ptr::null_mut();
    let mut f: H = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers.
    unsafe {
        check((cu.init)(0), "cuInit");
        check((cu.retain)(&mut ctx, 0), "cuDevicePrimaryCtxRetain");
        check((cu.set_current)(ctx), "cuCtxSetCurrent");
        check(
            (cu.load)(&mut module, c"probe".as_ptr() as *const c_void),
            "cuModuleLoadData",
        );
        check(
            (cu.function)(&mut f, module, kernel.as_ptr()),
            "cuModuleGetFunction",
        );
    }
    (cu, ctx, f)
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let how = match args.first().map(String::as_str) {
        Some("direct") => How::Direct,
        Some("dlsym") => How::Dlsym,
        Some("dlsym-deepbind") => How::DlsymDeepbind,
        Some("dlsym-default") => How::DlsymDefault,
        Some("dlvsym") => How::Dlvsym,
        Some("getproc") => How::GetProc,
        Some("getproc2") => How::GetProc2,
        _ => die("usage: xcuda-probe direct|dlsym|dlsym-default|dlvsym|getproc|getproc2 [--pt] api|storm N|launches N|allocs N|fork S|exit-on-error"),
    };
    let pt = args.iter().any(|a| a == "--pt");
    let rest: Vec<&str> = args[1..]
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--pt")
        .collect();
    let n = rest.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let r = Resolver::new(how, pt);
    match rest.first() {
        Some(&"api") => api::api(&r),
        Some(&"gate") => launchers::gate_one(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"signals") => signals::signals(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"fork-quota") => fork::fork_quota(&r),
        Some(&"graph") => graphs::graph_quota(&r),
        Some(&"graph-path") => graphs::graph_path(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"ctx") => signals::ctx_then_sigterm(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"storm") => bench::storm(&r, n),
        Some(&"launches") => bench::launches(&r, n),
        Some(&"allocs") => bench::allocs(&r, n),
        Some(&"exit-on-error") => fork::exit_on_error(&r),
        Some(&"fork") => fork::fork_child_launches(&r, n),
        Some(&"shim-bench") => bench::shim_bench(&r, n),
        _ => die("unknown scenario"),
    }
}
