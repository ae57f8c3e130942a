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

#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::time::Instant;

include!(concat!(env!("OUT_DIR"), "/linked.rs"));

// The driver ABI and the frameworks' loader, as the shim declares them (the
// probe must not link the shim's library: its exports would interpose
// inside the probe).
use cuda_abi::fnty;
use cuda_abi::load::{self as cudaload, Driver, ProcAddress};
use cuda_abi::{
    Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, LaunchConfig, MemAllocNodeParams,
};

type Res = u32;
type H = *mut c_void;
use cudaload::LaunchKernel as Launch;
type Coop = unsafe extern "C" fn(
    H,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    H,
    *mut H,
) -> Res;

const MIB: usize = 1 << 20;
/// The symbol version the fake driver also defines every export under.
const SIM_VERSION: &CStr = c"SIMGPU_1";

/// Does `dlvsym` still answer names xCUDA does not hook, relative to the
/// caller? (libc's `malloc` at its base version on x86_64 or aarch64.)
fn dlvsym_passes_through() -> bool {
    // SAFETY: dlsym/dlvsym with NUL-terminated strings.
    unsafe {
        let want = libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
        [c"GLIBC_2.2.5", c"GLIBC_2.17"].iter().any(|v| {
            !want.is_null()
                && libc::dlvsym(libc::RTLD_DEFAULT, c"malloc".as_ptr(), v.as_ptr()) == want
                && libc::dlvsym(libc::RTLD_NEXT, c"malloc".as_ptr(), v.as_ptr()) == want
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum How {
    Direct,
    Dlsym,
    DlsymDeepbind,
    DlsymDefault,
    Dlvsym,
    GetProc,
    GetProc2,
}

struct Resolver {
    how: How,
    pt: bool,
    driver: Driver,
    getproc: Option<ProcAddress>,
    /// (wanted symbol, got pointer) of every resolution, for the report.
    seen: std::cell::RefCell<Vec<(String, usize)>>,
}

fn die(msg: &str) -> ! {
    eprintln!("xcuda-probe: {msg}");
    std::process::exit(2)
}

impl Resolver {
    fn new(how: How, pt: bool) -> Resolver {
        let driver = match how {
            How::DlsymDeepbind => {
                Driver::open_with(libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND)
            }
            _ => Driver::open(),
        }
        .unwrap_or_else(|e| die(&e));
        // The entry point itself as a framework finds it: dlsym on its handle.
        let getproc = match how {
            How::GetProc | How::GetProc2 => Some(
                driver
                    .proc_address(how == How::GetProc2)
                    .unwrap_or_else(|e| die(&e)),
            ),
            _ => None,
        };
        Resolver {
            how,
            pt,
            driver,
            getproc,
            seen: Default::default(),
        }
    }

    /// `base` as cuGetProcAddress is asked; `symbol` the variant wanted
    /// (what the other paths name explicitly).
    fn get<T: Copy>(&self, base: &str, symbol: &str) -> T {
        self.get_at(base, symbol, cudaload::CUDA_VERSION)
    }

    /// As [`Resolver::get`]; cuGetProcAddress is asked for CUDA `version`
    /// (how a program built against old headers gets the v1 variants).
    fn get_at<T: Copy>(&self, base: &str, symbol: &str, version: c_int) -> T {
        let c = CString::new(match self.getproc {
            Some(_) => base,
            None => symbol,
        })
        .unwrap();
        let flags = if self.pt {
            cudaload::PER_THREAD_DEFAULT_STREAM
        } else {
            0
        };
        let addr = match (self.how, self.getproc) {
            (_, Some(g)) => g.resolve(&c, version, flags),
            (How::Direct, _) => {
                linked(symbol).unwrap_or_else(|| die(&format!("{symbol} not linked")))
            }
            (How::DlsymDefault, _) => {
                // SAFETY: dlsym(RTLD_DEFAULT) with a NUL-terminated name.
                unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) as usize }
            }
            (How::Dlvsym, _) => self.driver.dlvsym(&c, SIM_VERSION),
            _ => self.driver.dlsym(&c),
        };
        if addr == 0 {
            die(&format!("cannot resolve {symbol}"));
        }
        self.seen.borrow_mut().push((symbol.to_string(), addr));
        // SAFETY: `addr` is the driver's (or xCUDA's) `symbol`, whose C
        // signature T is.
        unsafe { cudaload::as_fn(addr) }
    }

    /// How many calls the fake driver's export `symbol` received so far
    /// (its test hook; u64::MAX without the fake).
    fn driver_calls(&self, symbol: &str) -> u64 {
        type Calls = unsafe extern "C" fn(*const c_char) -> u64;
        let p = self.driver.dlsym(c"simgpu_calls");
        if p == 0 {
            return u64::MAX;
        }
        let c = CString::new(symbol).unwrap();
        // SAFETY: the fake's `simgpu_calls(const char*)` with a NUL-terminated name.
        unsafe { cudaload::as_fn::<Calls>(p)(c.as_ptr()) }
    }

    /// Which library and symbol each resolved pointer is.
    fn report(&self) {
        let mut inside = 0;
        let mut wrong_variant = Vec::new();
        let (mut hooked, mut passed) = (Vec::new(), Vec::new());
        let seen = self.seen.borrow();
        for (want, p) in seen.iter() {
            // SAFETY: dladdr only reads; zeroed Dl_info is valid.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { libc::dladdr(*p as *const c_void, &mut info) };
            let file = if info.dli_fname.is_null() {
                String::new()
            } else {
                // SAFETY: dladdr's NUL-terminated strings.
                unsafe { CStr::from_ptr(info.dli_fname) }
                    .to_string_lossy()
                    .into_owned()
            };
            let sym = if info.dli_sname.is_null() {
                String::new()
            } else {
                // SAFETY: as above.
                unsafe { CStr::from_ptr(info.dli_sname) }
                    .to_string_lossy()
                    .into_owned()
            };
            if file.contains("libmuxflow_xcuda") {
                inside += 1;
                hooked.push(want.clone());
            } else {
                passed.push(want.clone());
            }
            if &sym != want {
                wrong_variant.push(format!("{want}->{sym}"));
            }
        }
        for l in [&mut hooked, &mut passed] {
            l.sort();
            l.dedup();
        }
        println!("resolved={} in_xcuda={inside}", seen.len());
        println!("hooked={}", hooked.join(","));
        println!("passed={}", passed.join(","));
        if self.how == How::Dlvsym {
            println!("dlvsym_passthrough={}", u8::from(dlvsym_passes_through()));
        }
        println!("wrong_variants={}", wrong_variant.join(","));
    }
}

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

fn pt(r: &Resolver, name: &str) -> String {
    if r.pt {
        format!("{name}_ptsz")
    } else {
        name.to_string()
    }
}

/// An allocation row: 48 MiB (fits the 64 MiB cap), 48 MiB more (must be
/// refused), the first freed, 48 MiB again (fits only if the free gave its
/// quota back), that freed. Prints the five results and how many calls
/// reached the driver's `alloc_sym` (the refused one must not).
fn count_row(
    r: &Resolver,
    key: &str,
    alloc_sym: &str,
    mut alloc: impl FnMut(&mut u64) -> Res,
    free: impl Fn(u64) -> Res,
) {
    let before = r.driver_calls(alloc_sym);
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    let first = alloc(&mut a);
    let second = alloc(&mut b);
    let freed = free(a);
    if second == 0 {
        free(b);
    }
    let again = alloc(&mut c);
    let freed_again = if again == 0 { free(c) } else { 99 };
    let calls = r.driver_calls(alloc_sym).wrapping_sub(before);
    println!(
        "quota_{key}={first},{second},{freed},{again},{freed_again} driver_calls_{key}={calls}"
    );
}

/// A pass-through row (pinned host memory): three 48 MiB allocations, all
/// beyond the GPU cap together, then their frees.
fn host_row(
    r: &Resolver,
    key: &str,
    alloc: impl Fn(&mut *mut c_void) -> Res,
    free: impl Fn(*mut c_void) -> Res,
) {
    let mut rcs = Vec::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut p = std::ptr::null_mut();
        rcs.push(alloc(&mut p));
        held.push(p);
    }
    for p in held {
        rcs.push(free(p));
    }
    let _ = r;
    println!("host_{key}={}", join(&rcs));
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// The gated entry points, each as one call that launches `f` (a
/// `CUfunction`, or a `CUkernel` for the lazy-loading rows). Names: the
/// variant called (`_ptsz` with --pt where one exists).
fn launchers(r: &Resolver, f: H, kernel: H) -> Vec<(String, Box<dyn Fn() -> Res>)> {
    let null: H = std::ptr::null_mut();
    let (f, kernel) = (f as usize, kernel as usize);
    let mut out: Vec<(String, Box<dyn Fn() -> Res>)> = Vec::new();
    let cfg = || LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem_bytes: 0,
        stream: std::ptr::null_mut(),
        attrs: std::ptr::null_mut(),
        num_attrs: 0,
    };
    let launch_sym = pt(r, "cuLaunchKernel");
    let launch: Launch = r.get("cuLaunchKernel", &launch_sym);
    out.push((
        launch_sym.clone(),
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe {
            launch(
                f as H,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }),
    ));
    out.push((
        format!("{launch_sym}+CUkernel"),
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe {
            launch(
                kernel as H,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }),
    ));
    type Ex = unsafe extern "C" fn(*const c_void, H, *mut H, *mut H) -> Res;
    let ex_sym = pt(r, "cuLaunchKernelEx");
    let ex: Ex = r.get("cuLaunchKernelEx", &ex_sym);
    out.push((
        ex_sym.clone(),
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe {
            let c = cfg();
            ex(
                &c as *const LaunchConfig as *const c_void,
                f as H,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }),
    ));
    out.push((
        format!("{ex_sym}+CUkernel"),
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe {
            let c = cfg();
            ex(
                &c as *const LaunchConfig as *const c_void,
                kernel as H,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }),
    ));
    let coop_sym = pt(r, "cuLaunchCooperativeKernel");
    let coop: Coop = r.get("cuLaunchCooperativeKernel", &coop_sym);
    out.push((
        coop_sym,
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe {
            coop(
                f as H,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }),
    ));
    // A graph captured from one (ungated while capturing: nothing runs) launch.
    let begin: fnty::cuStreamBeginCapture_v2 =
        r.get("cuStreamBeginCapture", &pt(r, "cuStreamBeginCapture_v2"));
    let end: fnty::cuStreamEndCapture = r.get("cuStreamEndCapture", &pt(r, "cuStreamEndCapture"));
    let inst: fnty::cuGraphInstantiateWithFlags =
        r.get("cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags");
    let graph_sym = pt(r, "cuGraphLaunch");
    let glaunch: unsafe extern "C" fn(H, H) -> Res = r.get("cuGraphLaunch", &graph_sym);
    let (mut g, mut e) = (null, null);
    // SAFETY: as above.
    unsafe {
        check(begin(null, 0), "cuStreamBeginCapture");
        check(
            launch(
                f as H,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                null,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
            "captured launch",
        );
        check(end(null, &mut g), "cuStreamEndCapture");
        check(inst(&mut e, g, 0), "cuGraphInstantiateWithFlags");
    }
    let e = e as usize;
    out.push((
        graph_sym,
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe { glaunch(e as H, std::ptr::null_mut()) }),
    ));
    // Legacy launches (no per-thread variants).
    let l0: fnty::cuLaunch = r.get("cuLaunch", "cuLaunch");
    // SAFETY: an entry point resolved for this signature; valid arguments.
    out.push(("cuLaunch".into(), Box::new(move || unsafe { l0(f as H) })));
    let lg: fnty::cuLaunchGrid = r.get("cuLaunchGrid", "cuLaunchGrid");
    out.push((
        "cuLaunchGrid".into(),
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe { lg(f as H, 2, 1) }),
    ));
    let la: fnty::cuLaunchGridAsync = r.get("cuLaunchGridAsync", "cuLaunchGridAsync");
    out.push((
        "cuLaunchGridAsync".into(),
        // SAFETY: an entry point resolved for this signature; valid arguments.
        Box::new(move || unsafe { la(f as H, 2, 1, std::ptr::null_mut()) }),
    ));
    out
}

/// A `CUkernel` the CUDA 12 way: cuLibraryLoadData + cuLibraryGetKernel.
fn library_kernel(r: &Resolver, name: &CStr) -> H {
    type Load = unsafe extern "C" fn(
        *mut H,
        *const c_void,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
    ) -> Res;
    type LoadFile = unsafe extern "C" fn(
        *mut H,
        *const c_char,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
    ) -> Res;
    let load: Load = r.get("cuLibraryLoadData", "cuLibraryLoadData");
    let load_file: LoadFile = r.get("cuLibraryLoadFromFile", "cuLibraryLoadFromFile");
    let get: fnty::cuLibraryGetKernel = r.get("cuLibraryGetKernel", "cuLibraryGetKernel");
    let unload: fnty::cuLibraryUnload = r.get("cuLibraryUnload", "cuLibraryUnload");
    let to_fn: fnty::cuKernelGetFunction = r.get("cuKernelGetFunction", "cuKernelGetFunction");
    let (mut lib, mut other, mut k, mut f): (H, H, H, H) = Default::default();
    let n = std::ptr::null_mut();
    // SAFETY: entry points resolved for these signatures, valid arguments.
    unsafe {
        check(
            load(
                &mut lib,
                c"probe".as_ptr() as *const c_void,
                n,
                n as *mut *mut c_void,
                0,
                n,
                n as *mut *mut c_void,
                0,
            ),
            "cuLibraryLoadData",
        );
        check(
            load_file(
                &mut other,
                c"probe.cubin".as_ptr(),
                n,
                n as *mut *mut c_void,
                0,
                n,
                n as *mut *mut c_void,
                0,
            ),
            "cuLibraryLoadFromFile",
        );
        check(unload(other), "cuLibraryUnload");
        check(get(&mut k, lib, name.as_ptr()), "cuLibraryGetKernel");
        check(to_fn(&mut f, k), "cuKernelGetFunction");
    }
    k
}

fn api(r: &Resolver) {
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1us");
    let null: H = std::ptr::null_mut();
    let kernel = library_kernel(r, c"sim_kernel_1us");
    let gated = launchers(r, f, kernel);
    let sync: fnty::cuStreamSynchronize =
        r.get("cuStreamSynchronize", &pt(r, "cuStreamSynchronize"));
    // Memory entry points.
    const V1: c_int = 3000; // CUDA 3.0: the un-suffixed v1 variants
    let alloc_v1: fnty::cuMemAlloc = r.get_at("cuMemAlloc", "cuMemAlloc", V1);
    let free_v1: fnty::cuMemFree = r.get_at("cuMemFree", "cuMemFree", V1);
    let pitch_v1: fnty::cuMemAllocPitch = r.get_at("cuMemAllocPitch", "cuMemAllocPitch", V1);
    let info_v1: fnty::cuMemGetInfo = r.get_at("cuMemGetInfo", "cuMemGetInfo", V1);
    let pitch: fnty::cuMemAllocPitch_v2 = r.get("cuMemAllocPitch", "cuMemAllocPitch_v2");
    let managed: fnty::cuMemAllocManaged = r.get("cuMemAllocManaged", "cuMemAllocManaged");
    let async_sym = pt(r, "cuMemAllocAsync");
    let a_async: unsafe extern "C" fn(*mut u64, usize, H) -> Res =
        r.get("cuMemAllocAsync", &async_sym);
    let f_async: fnty::cuMemFreeAsync = r.get("cuMemFreeAsync", &pt(r, "cuMemFreeAsync"));
    let pool_sym = pt(r, "cuMemAllocFromPoolAsync");
    let from_pool: unsafe extern "C" fn(*mut u64, usize, H, H) -> Res =
        r.get("cuMemAllocFromPoolAsync", &pool_sym);
    let pool_create: fnty::cuMemPoolCreate = r.get("cuMemPoolCreate", "cuMemPoolCreate");
    let pool_destroy: fnty::cuMemPoolDestroy = r.get("cuMemPoolDestroy", "cuMemPoolDestroy");
    let create: fnty::cuMemCreate = r.get("cuMemCreate", "cuMemCreate");
    let mrelease: fnty::cuMemRelease = r.get("cuMemRelease", "cuMemRelease");
    let reserve: fnty::cuMemAddressReserve = r.get("cuMemAddressReserve", "cuMemAddressReserve");
    let addr_free: fnty::cuMemAddressFree = r.get("cuMemAddressFree", "cuMemAddressFree");
    let map: fnty::cuMemMap = r.get("cuMemMap", "cuMemMap");
    let set_access: fnty::cuMemSetAccess = r.get("cuMemSetAccess", "cuMemSetAccess");
    let unmap: fnty::cuMemUnmap = r.get("cuMemUnmap", "cuMemUnmap");
    let array2d_v1: fnty::cuArrayCreate = r.get_at("cuArrayCreate", "cuArrayCreate", V1);
    let array3d_v1: fnty::cuArray3DCreate = r.get_at("cuArray3DCreate", "cuArray3DCreate", V1);
    let array2d: fnty::cuArrayCreate_v2 = r.get("cuArrayCreate", "cuArrayCreate_v2");
    let array3d: fnty::cuArray3DCreate_v2 = r.get("cuArray3DCreate", "cuArray3DCreate_v2");
    let adestroy: fnty::cuArrayDestroy = r.get("cuArrayDestroy", "cuArrayDestroy");
    let mipmapped: fnty::cuMipmappedArrayCreate =
        r.get("cuMipmappedArrayCreate", "cuMipmappedArrayCreate");
    let mdestroy: fnty::cuMipmappedArrayDestroy =
        r.get("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy");
    let host_v1: fnty::cuMemAllocHost = r.get_at("cuMemAllocHost", "cuMemAllocHost", V1);
    let host_v2: fnty::cuMemAllocHost_v2 = r.get("cuMemAllocHost", "cuMemAllocHost_v2");
    let host_alloc: fnty::cuMemHostAlloc = r.get("cuMemHostAlloc", "cuMemHostAlloc");
    let host_free: fnty::cuMemFreeHost = r.get("cuMemFreeHost", "cuMemFreeHost");
    // Contexts.
    let ctx_v1: fnty::cuCtxCreate = r.get_at("cuCtxCreate", "cuCtxCreate", V1);
    let ctx_v2: fnty::cuCtxCreate_v2 = r.get_at("cuCtxCreate", "cuCtxCreate_v2", 11000);
    let ctx_v3: fnty::cuCtxCreate_v3 = r.get_at("cuCtxCreate", "cuCtxCreate_v3", 12000);
    let ctx_v4: fnty::cuCtxCreate_v4 = r.get_at("cuCtxCreate", "cuCtxCreate_v4", 12050);
    let destroy_v1: fnty::cuCtxDestroy = r.get_at("cuCtxDestroy", "cuCtxDestroy", V1);
    let destroy_v2: fnty::cuCtxDestroy_v2 = r.get("cuCtxDestroy", "cuCtxDestroy_v2");
    let gr = Graphs::new(r);
    r.report();
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        let mut rcs = Vec::new();
        let mut variant_calls = Vec::new();
        for (name, call) in &gated {
            let driver_sym = name.split('+').next().unwrap_or(name);
            let before = r.driver_calls(driver_sym);
            rcs.push(call());
            if r.driver_calls(driver_sym).wrapping_sub(before) != 1 {
                variant_calls.push(name.clone());
            }
        }
        rcs.push(sync(null));
        println!("launch_rcs={}", join(&rcs));
        println!(
            "gated={}",
            join(&gated.iter().map(|g| g.0.clone()).collect::<Vec<_>>())
        );
        // The launch captured into the graph passed the gate too.
        println!("gated_calls={}", gated.len() + 1);
        // Gated calls that did not reach exactly their own variant in the driver once.
        println!("launch_variant_misses={}", variant_calls.join(","));
        let n = 48 * MIB;
        count_row(
            r,
            "cuMemAlloc",
            "cuMemAlloc",
            |p| {
                let mut x = 0u32;
                let rc = alloc_v1(&mut x, n as c_uint);
                *p = x as u64;
                rc
            },
            |p| free_v1(p as u32),
        );
        count_row(
            r,
            "cuMemAlloc_v2",
            "cuMemAlloc_v2",
            |p| (cu.alloc)(p, n),
            |p| (cu.free)(p),
        );
        count_row(
            r,
            "cuMemAllocPitch",
            "cuMemAllocPitch",
            |p| {
                let (mut x, mut pt) = (0u32, 0 as c_uint);
                let rc = pitch_v1(&mut x, &mut pt, 4096, (n / 4096) as c_uint, 4);
                *p = x as u64;
                rc
            },
            |p| (cu.free)(p),
        );
        let mut pitch_out = 0usize;
        count_row(
            r,
            "cuMemAllocPitch_v2",
            "cuMemAllocPitch_v2",
            |p| pitch(p, &mut pitch_out, 4096, n / 4096, 4),
            |p| (cu.free)(p),
        );
        count_row(
            r,
            "cuMemAllocManaged",
            "cuMemAllocManaged",
            |p| managed(p, n, 1),
            |p| (cu.free)(p),
        );
        count_row(
            r,
            "cuMemAllocAsync",
            &async_sym,
            |p| a_async(p, n, null),
            |p| f_async(p, null),
        );
        let mut pool = null;
        check(
            pool_create(&mut pool, [0u8; 88].as_ptr() as *const c_void),
            "cuMemPoolCreate",
        );
        count_row(
            r,
            "cuMemAllocFromPoolAsync",
            &pool_sym,
            |p| from_pool(p, n, pool, null),
            |p| f_async(p, null),
        );
        check(pool_destroy(pool), "cuMemPoolDestroy");
        count_row(
            r,
            "cuMemCreate",
            "cuMemCreate",
            |p| create(p, n, std::ptr::null(), 0),
            |p| mrelease(p),
        );
        // Graph memory: charged at instantiation, given back by destroy + trim.
        let explicit = || gr.explicit(n, true).0;
        let params_sym = pt(r, "cuGraphInstantiateWithParams");
        for (key, sym, which) in [
            ("cuGraphInstantiate", "cuGraphInstantiate", Inst::V1),
            ("cuGraphInstantiate_v2", "cuGraphInstantiate_v2", Inst::V2),
            (
                "cuGraphInstantiateWithFlags",
                "cuGraphInstantiateWithFlags",
                Inst::Flags,
            ),
            (
                "cuGraphInstantiateWithParams",
                params_sym.as_str(),
                Inst::Params,
            ),
            (
                "cuGraphInstantiate_12",
                "cuGraphInstantiateWithFlags",
                Inst::Renamed,
            ),
        ] {
            graph_row(r, &gr, key, sym, which, explicit);
        }
        for (key, how) in [
            ("capture_cuStreamBeginCapture", Begin::V1),
            ("capture_cuStreamBeginCapture_v2", Begin::V2),
            ("capture_cuStreamBeginCaptureToGraph", Begin::ToGraph),
        ] {
            let sym = "cuGraphInstantiateWithFlags";
            graph_row(r, &gr, key, sym, Inst::Flags, || {
                gr.captured(how, n, true).0
            });
        }
        // The VMM path end to end: physical memory counted, mapping it passes.
        let mut v = Vec::new();
        let (mut h1, mut h2, mut h3, mut va) = (0u64, 0u64, 0u64, 0u64);
        let access = [0u8; 12];
        v.push(create(&mut h1, n, std::ptr::null(), 0));
        v.push(reserve(&mut va, n, 0, 0, 0));
        v.push(map(va, n, 0, h1, 0));
        v.push(set_access(va, n, access.as_ptr() as *const c_void, 1));
        v.push(create(&mut h2, n, std::ptr::null(), 0));
        v.push(unmap(va, n));
        v.push(mrelease(h1));
        v.push(addr_free(va, n));
        v.push(create(&mut h3, n, std::ptr::null(), 0));
        v.push(mrelease(h3));
        println!("vmm={}", join(&v));
        // Arrays of 4-byte floats: 4096 x 3072 and 4096 x 768 x 4 are 48 MiB;
        // two mipmap levels of 4096 x 2304 and 2048 x 1152, 45 MiB.
        const FLOAT: c_uint = 0x20;
        let d2 = ArrayDesc {
            width: 4096,
            height: 3072,
            format: FLOAT,
            channels: 1,
        };
        let d2_v1 = ArrayDescV1 {
            width: 4096,
            height: 3072,
            format: FLOAT,
            channels: 1,
        };
        let d3 = |width, height, depth| Array3dDesc {
            width,
            height,
            depth,
            format: FLOAT,
            channels: 1,
            flags: 0,
        };
        let cube_v1 = Array3dDescV1 {
            width: 4096,
            height: 768,
            depth: 4,
            format: FLOAT,
            channels: 1,
            flags: 0,
        };
        let (cube, mip) = (d3(4096, 768, 4), d3(4096, 2304, 0));
        let handle = |p: &mut u64| p as *mut u64 as *mut H;
        count_row(
            r,
            "cuArrayCreate",
            "cuArrayCreate",
            |p| array2d_v1(handle(p), &d2_v1),
            |p| adestroy(p as H),
        );
        count_row(
            r,
            "cuArrayCreate_v2",
            "cuArrayCreate_v2",
            |p| array2d(handle(p), &d2),
            |p| adestroy(p as H),
        );
        count_row(
            r,
            "cuArray3DCreate",
            "cuArray3DCreate",
            |p| array3d_v1(handle(p), &cube_v1),
            |p| adestroy(p as H),
        );
        count_row(
            r,
            "cuArray3DCreate_v2",
            "cuArray3DCreate_v2",
            |p| array3d(handle(p), &cube),
            |p| adestroy(p as H),
        );
        count_row(
            r,
            "cuMipmappedArrayCreate",
            "cuMipmappedArrayCreate",
            |p| mipmapped(handle(p), &mip, 2),
            |p| mdestroy(p as H),
        );
        // Pinned host memory: not the GPU's, never capped.
        host_row(
            r,
            "cuMemAllocHost",
            |p| host_v1(p, n as c_uint),
            |p| host_free(p),
        );
        host_row(r, "cuMemAllocHost_v2", |p| host_v2(p, n), |p| host_free(p));
        host_row(
            r,
            "cuMemHostAlloc",
            |p| host_alloc(p, n, 0),
            |p| host_free(p),
        );
        // Contexts made and destroyed with every variant.
        let mut c = Vec::new();
        let (mut a, mut b, mut d, mut e) = (null, null, null, null);
        c.push(ctx_v1(&mut a, 0, 0));
        c.push(ctx_v2(&mut b, 0, 0));
        c.push(ctx_v3(&mut d, null, 0, 0, 0));
        c.push(ctx_v4(&mut e, null, 0, 0));
        c.push(destroy_v1(a));
        for x in [b, d, e] {
            c.push(destroy_v2(x));
        }
        check((cu.set_current)(_ctx), "cuCtxSetCurrent");
        println!("ctx_rcs={}", join(&c));
        let (mut free, mut total) = (0usize, 0usize);
        check((cu.info)(&mut free, &mut total), "cuMemGetInfo_v2");
        println!("meminfo_free={free} meminfo_total={total}");
        let (mut free, mut total) = (0 as c_uint, 0 as c_uint);
        check(info_v1(&mut free, &mut total), "cuMemGetInfo");
        println!("meminfo_v1_free={free} meminfo_v1_total={total}");
        check((cu.release)(0), "cuDevicePrimaryCtxRelease");
    }
}

/// How a capture begins: `cuStreamBeginCapture` (v1, CUDA 10.0), its `_v2`
/// (with a mode), or `cuStreamBeginCaptureToGraph` (into a new graph).
#[derive(Clone, Copy)]
enum Begin {
    V1,
    V2,
    ToGraph,
}

/// Which instantiation entry point.
#[derive(Clone, Copy)]
enum Inst {
    V1,
    V2,
    Flags,
    Params,
    Renamed,
}

/// The graph and capture entry points, resolved as HOW and --pt say, and
/// the stream captures use: the per-thread default stream with --pt, a
/// created stream otherwise.
struct Graphs {
    create: fnty::cuGraphCreate,
    alloc_node: fnty::cuGraphAddMemAllocNode,
    free_node: fnty::cuGraphAddMemFreeNode,
    begin_v1: unsafe extern "C" fn(H) -> Res,
    begin_v2: unsafe extern "C" fn(H, c_int) -> Res,
    begin_to: unsafe extern "C" fn(H, H, *const H, *const c_void, usize, c_int) -> Res,
    end: unsafe extern "C" fn(H, *mut H) -> Res,
    alloc_async: unsafe extern "C" fn(*mut u64, usize, H) -> Res,
    free_async: unsafe extern "C" fn(u64, H) -> Res,
    inst_v1: fnty::cuGraphInstantiate,
    inst_v2: fnty::cuGraphInstantiate_v2,
    inst_flags: fnty::cuGraphInstantiateWithFlags,
    inst_params: unsafe extern "C" fn(*mut H, H, *mut c_void) -> Res,
    /// `cuGraphInstantiate` as CUDA 12 asks for it: the driver answers with
    /// `cuGraphInstantiateWithFlags` (cuda.h renamed it).
    inst_12: fnty::cuGraphInstantiateWithFlags,
    launch: unsafe extern "C" fn(H, H) -> Res,
    exec_destroy: fnty::cuGraphExecDestroy,
    /// `cuGraphExecUpdate` as CUDA 12 asks for it (the `_v2` ABI).
    update: fnty::cuGraphExecUpdate_v2,
    destroy: fnty::cuGraphDestroy,
    trim: fnty::cuDeviceGraphMemTrim,
    stream: H,
}

impl Graphs {
    /// Resolves them (after `setup`: a created stream needs a context).
    fn new(r: &Resolver) -> Graphs {
        let stream_create: fnty::cuStreamCreate = r.get("cuStreamCreate", "cuStreamCreate");
        let mut stream: H = std::ptr::null_mut();
        if !r.pt {
            // SAFETY: a resolved entry point with a valid out-pointer.
            check(unsafe { stream_create(&mut stream, 0) }, "cuStreamCreate");
        }
        Graphs {
            create: r.get("cuGraphCreate", "cuGraphCreate"),
            alloc_node: r.get("cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode"),
            free_node: r.get("cuGraphAddMemFreeNode", "cuGraphAddMemFreeNode"),
            begin_v1: r.get_at(
                "cuStreamBeginCapture",
                &pt(r, "cuStreamBeginCapture"),
                10000,
            ),
            begin_v2: r.get("cuStreamBeginCapture", &pt(r, "cuStreamBeginCapture_v2")),
            begin_to: r.get(
                "cuStreamBeginCaptureToGraph",
                &pt(r, "cuStreamBeginCaptureToGraph"),
            ),
            end: r.get("cuStreamEndCapture", &pt(r, "cuStreamEndCapture")),
            alloc_async: r.get("cuMemAllocAsync", &pt(r, "cuMemAllocAsync")),
            free_async: r.get("cuMemFreeAsync", &pt(r, "cuMemFreeAsync")),
            inst_v1: r.get_at("cuGraphInstantiate", "cuGraphInstantiate", 10000),
            inst_v2: r.get_at("cuGraphInstantiate", "cuGraphInstantiate_v2", 11000),
            inst_flags: r.get("cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"),
            inst_12: r.get("cuGraphInstantiate", "cuGraphInstantiateWithFlags"),
            inst_params: r.get(
                "cuGraphInstantiateWithParams",
                &pt(r, "cuGraphInstantiateWithParams"),
            ),
            launch: r.get("cuGraphLaunch", &pt(r, "cuGraphLaunch")),
            exec_destroy: r.get("cuGraphExecDestroy", "cuGraphExecDestroy"),
            update: r.get("cuGraphExecUpdate", "cuGraphExecUpdate_v2"),
            destroy: r.get("cuGraphDestroy", "cuGraphDestroy"),
            trim: r.get("cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim"),
            stream,
        }
    }

    /// A graph with one allocation node of `n` bytes, and its free node when
    /// `free_inside`; returns the graph and the allocation's address.
    fn explicit(&self, n: usize, free_inside: bool) -> (H, u64) {
        let null: H = std::ptr::null_mut();
        let (mut g, mut node) = (null, null);
        let mut prm = MemAllocNodeParams {
            pool_props: [0; 88],
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: n,
            dptr: 0,
        };
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            check((self.create)(&mut g, 0), "cuGraphCreate");
            check(
                (self.alloc_node)(&mut node, g, std::ptr::null(), 0, &mut prm),
                "cuGraphAddMemAllocNode",
            );
            if free_inside {
                let dep = node;
                check(
                    (self.free_node)(&mut node, g, &dep, 1, prm.dptr),
                    "cuGraphAddMemFreeNode",
                );
            }
        }
        (g, prm.dptr)
    }

    /// A graph recorded by stream capture (begun as `how`): `n` bytes from
    /// cuMemAllocAsync, freed by cuMemFreeAsync when `free_inside`.
    fn captured(&self, how: Begin, n: usize, free_inside: bool) -> (H, u64) {
        let null: H = std::ptr::null_mut();
        let (mut g, mut p) = (null, 0u64);
        let s = self.stream;
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            match how {
                Begin::V1 => check((self.begin_v1)(s), "cuStreamBeginCapture"),
                Begin::V2 => check((self.begin_v2)(s, 0), "cuStreamBeginCapture_v2"),
                Begin::ToGraph => {
                    check((self.create)(&mut g, 0), "cuGraphCreate");
                    check(
                        (self.begin_to)(s, g, std::ptr::null(), std::ptr::null(), 0, 0),
                        "cuStreamBeginCaptureToGraph",
                    );
                }
            }
            check((self.alloc_async)(&mut p, n, s), "captured cuMemAllocAsync");
            if free_inside {
                check((self.free_async)(p, s), "captured cuMemFreeAsync");
            }
            check((self.end)(s, &mut g), "cuStreamEndCapture");
        }
        (g, p)
    }

    /// Instantiates `g` with entry point `which`: (result, executable graph).
    fn instantiate(&self, which: Inst, g: H) -> (Res, H) {
        let mut e: H = std::ptr::null_mut();
        let none = std::ptr::null_mut();
        // SAFETY: resolved entry points with valid arguments.
        let rc = unsafe {
            match which {
                Inst::V1 => (self.inst_v1)(&mut e, g, none, std::ptr::null_mut(), 0),
                Inst::V2 => (self.inst_v2)(&mut e, g, none, std::ptr::null_mut(), 0),
                Inst::Flags => (self.inst_flags)(&mut e, g, 0),
                Inst::Params => (self.inst_params)(&mut e, g, std::ptr::null_mut()),
                Inst::Renamed => (self.inst_12)(&mut e, g, 0),
            }
        };
        (rc, e)
    }

    fn launch(&self, e: H) -> Res {
        // SAFETY: a resolved entry point with valid arguments.
        unsafe { (self.launch)(e, self.stream) }
    }

    /// Destroys the executable graph, then trims the device's graph pool.
    fn drop_exec(&self, e: H) -> Res {
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            let rc = (self.exec_destroy)(e);
            check((self.trim)(0), "cuDeviceGraphMemTrim");
            rc
        }
    }
}

/// An instantiation row ([`count_row`]): each "allocation" builds a graph
/// that allocates 48 MiB and frees it itself (`build`) and instantiates it
/// (`which`), each "free" destroys the executable graph and trims.
fn graph_row(r: &Resolver, gr: &Graphs, key: &str, sym: &str, which: Inst, build: impl Fn() -> H) {
    count_row(
        r,
        key,
        sym,
        |p| {
            let (rc, e) = gr.instantiate(which, build());
            *p = e as u64;
            rc
        },
        |p| gr.drop_exec(p as H),
    );
}

/// `graph`: the quota of graph memory (64 MiB cap, Q below), end to end.
/// Prints one line per case (each a list of results; 2 = refused).
fn graph_quota(r: &Resolver) {
    let (cu, _ctx, _f) = setup(r, c"sim_kernel_1us");
    let gr = Graphs::new(r);
    let q = 64 * MIB;
    let free_now = || {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a resolved entry point with valid out-pointers.
        check(
            unsafe { (cu.info)(&mut free, &mut total) },
            "cuMemGetInfo_v2",
        );
        free
    };
    // SAFETY: resolved entry points with valid arguments.
    unsafe {
        // The issue: a graph that allocates Q/2 and frees it itself commits
        // Q/2 at every launch; 3Q/4 more must not fit beside it.
        let (g, _) = gr.explicit(q / 2, true);
        let (i, e) = gr.instantiate(Inst::Flags, g);
        let l1 = gr.launch(e);
        let mut p = 0u64;
        let a = (cu.alloc)(&mut p, 3 * q / 4);
        let l2 = gr.launch(e);
        println!("issue_explicit={i},{l1},{a},{l2}");
        // Destroying the executable graph leaves the pool's memory held; a trim frees it.
        let d = (gr.exec_destroy)(e);
        let a1 = (cu.alloc)(&mut p, 3 * q / 4);
        let t = (gr.trim)(0);
        let a2 = (cu.alloc)(&mut p, 3 * q / 4);
        println!("destroy_then_trim={d},{a1},{t},{a2}");
        // The other order: 3Q/4 held, the instantiation is refused.
        let (i2, _) = gr.instantiate(Inst::Flags, g);
        let f = (cu.free)(p);
        println!("instantiate_over_quota={i2},{f}");
        check((gr.destroy)(g), "cuGraphDestroy");
        // The issue's shape as stream capture gives it: nothing counted
        // while recording (no double count), all of it from instantiation.
        let (g, _) = gr.captured(Begin::V2, q / 2, true);
        let recorded = free_now();
        let (i, e) = gr.instantiate(Inst::Flags, g);
        let l = gr.launch(e);
        let a = (cu.alloc)(&mut p, 3 * q / 4);
        println!("issue_capture={recorded},{i},{l},{a}");
        check(gr.drop_exec(e), "cuGraphExecDestroy");
        check((gr.destroy)(g), "cuGraphDestroy");
        // While a capture is open, another stream that the driver says is
        // not capturing allocates for real: counted now, refused past Q.
        let stream_create: fnty::cuStreamCreate = r.get("cuStreamCreate", "cuStreamCreate");
        let mut other: H = std::ptr::null_mut();
        check(stream_create(&mut other, 0), "cuStreamCreate");
        check((gr.begin_v2)(gr.stream, 0), "cuStreamBeginCapture_v2");
        let (mut x, mut y) = (0u64, 0u64);
        let a = (gr.alloc_async)(&mut x, 3 * q / 4, other);
        let left = free_now();
        let b = (gr.alloc_async)(&mut y, q / 2, other);
        let f = (gr.free_async)(x, other);
        let mut g = std::ptr::null_mut();
        check((gr.end)(gr.stream, &mut g), "cuStreamEndCapture");
        check((gr.destroy)(g), "cuGraphDestroy");
        println!("beside_capture={a},{left},{b},{f}");
        // Allocated by the graph, freed outside it: counted once, and
        // held by the pool while the executable graph exists.
        let (g, dptr) = gr.explicit(q / 2, false);
        let (i, e) = gr.instantiate(Inst::Flags, g);
        let l = gr.launch(e);
        let before = free_now();
        let f = (cu.free)(dptr);
        let after = free_now();
        let a = (cu.alloc)(&mut p, q / 2);
        let f2 = (cu.free)(p);
        println!("freed_outside={i},{l},{before},{f},{after},{a},{f2}");
        check(gr.drop_exec(e), "cuGraphExecDestroy");
        check((gr.destroy)(g), "cuGraphDestroy");
        // An executable graph of Q/4 updated with a graph of Q: refused
        // (both held would be 5Q/4); with one of Q/2: 3Q/4 held, so Q/2
        // more is refused.
        let (small, _) = gr.explicit(q / 4, true);
        let (i, e) = gr.instantiate(Inst::Flags, small);
        let (whole, _) = gr.explicit(q, true);
        let mut info = [0u8; 24];
        let big = (gr.update)(e, whole, info.as_mut_ptr().cast());
        let (half, _) = gr.explicit(q / 2, true);
        let fits = (gr.update)(e, half, info.as_mut_ptr().cast());
        let a = (cu.alloc)(&mut p, q / 2);
        println!("exec_update={i},{big},{fits},{a}");
        check(gr.drop_exec(e), "cuGraphExecDestroy");
        for g in [small, whole, half] {
            check((gr.destroy)(g), "cuGraphDestroy");
        }
    }
    println!("meminfo_free={}", free_now());
}

/// One gated call (`gated` names it, as `api` prints them), once the
/// process is set up: prints `ready`, waits for a line on stdin, makes the
/// call (held while the gate is closed), prints `launched rc=N`.
fn gate_one(r: &Resolver, which: &str) {
    let (_cu, _ctx, f) = setup(r, c"sim_kernel_1us");
    let kernel = library_kernel(r, c"sim_kernel_1us");
    let gated = launchers(r, f, kernel);
    let Some((_, call)) = gated.iter().find(|g| g.0 == which) else {
        die(&format!("no gated call {which}"));
    };
    println!("ready");
    let mut go = String::new();
    let _ = std::io::stdin().read_line(&mut go);
    let rc = call();
    println!("launched rc={rc}");
}

/// `ctx SYMBOL`: makes a context with SYMBOL (a create or retain variant),
/// or, for a release/reset variant, retains the primary context, calls
/// SYMBOL and retains it again; prints what it resolved, `ready`, then
/// sends itself SIGTERM: the graceful exit must release what xCUDA
/// recorded (the default action then ends the process).
fn ctx_then_sigterm(r: &Resolver, symbol: &str) {
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
fn signals(r: &Resolver, mode: &str) {
    use std::io::Write;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
    static ALLOC: AtomicUsize = AtomicUsize::new(0);
    static HANDLED: AtomicU32 = AtomicU32::new(0);
    extern "C" fn report_and_exit(sig: c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
        // SAFETY: test-only handler: the pointer stored below, with its
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
    let block_sigterm = || {
        // SAFETY: a sigset filled by the C library, our own thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
    };
    if mode == "blocked" {
        // Before cuInit, so the driver's threads inherit the mask: blocked in
        // every application thread, as a program that takes SIGTERM with
        // sigwait does it (otherwise a driver thread may take the signal).
        block_sigterm();
    }
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1us");
    ALLOC.store(cu.alloc as usize, SeqCst);
    let launch: Launch = r.get("cuLaunchKernel", "cuLaunchKernel");
    let null: H = std::ptr::null_mut();
    let handler = |h: usize, flags: c_int| {
        // SAFETY: a zeroed sigaction is valid; filled below.
        let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
        a.sa_sigaction = h;
        a.sa_flags = flags;
        a
    };
    let query = |sig: c_int| {
        // SAFETY: a null new action only reads.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            old.sa_sigaction
        }
    };
    let pause = |ms: u64| std::thread::sleep(std::time::Duration::from_millis(ms));
    // The signal may be taken by xCUDA's exit thread while this one runs on:
    // launch (every 10 ms, at most 20 s) until the graceful exit refuses it.
    let launch_until_refused = || {
        let mut rc = 0;
        for _ in 0..2000 {
            let (n, pp) = (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: a resolved entry point with valid arguments.
            rc = unsafe { launch(f, 1, 1, 1, 32, 1, 1, 0, n, pp, pp) };
            if rc != 0 {
                break;
            }
            pause(10);
        }
        rc
    };
    // SAFETY: sigaction/signal/kill/sigprocmask on our own process with
    // valid arguments; resolved entry points.
    unsafe {
        let me = libc::getpid();
        match mode {
            "handler" | "external" => {
                let a = handler(report_and_exit as *const () as usize, libc::SA_SIGINFO);
                libc::sigaction(libc::SIGTERM, &a, std::ptr::null_mut());
                // The application sees its own handler when it asks.
                if query(libc::SIGTERM) != report_and_exit as *const () as usize {
                    die("sigaction does not report the application's own handler");
                }
                if mode == "handler" {
                    libc::kill(me, libc::SIGTERM);
                } else {
                    println!("ready");
                    let _ = std::io::stdout().flush();
                }
            }
            "signal" => {
                libc::signal(libc::SIGTERM, plain as *const () as usize);
                libc::kill(me, libc::SIGTERM);
            }
            "sysv" => {
                extern "C" {
                    fn sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t;
                }
                sysv_signal(libc::SIGTERM, plain as *const () as usize);
                libc::kill(me, libc::SIGTERM);
            }
            "ignore" => {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                libc::kill(me, libc::SIGTERM);
                let rc = launch_until_refused();
                let ign = u8::from(query(libc::SIGTERM) == libc::SIG_IGN);
                println!("ignored launch_rc={rc} still_ignored={ign}");
                std::process::exit(0);
            }
            "resethand" => {
                let a = handler(
                    count as *const () as usize,
                    libc::SA_SIGINFO | libc::SA_RESETHAND,
                );
                libc::sigaction(libc::SIGTERM, &a, std::ptr::null_mut());
                libc::kill(me, libc::SIGTERM);
                for _ in 0..500 {
                    if HANDLED.load(SeqCst) > 0 {
                        break;
                    }
                    pause(10);
                }
                let reset = u8::from(query(libc::SIGTERM) == libc::SIG_DFL);
                println!("handled={} reset={reset}", HANDLED.load(SeqCst));
                let _ = std::io::stdout().flush();
                libc::kill(me, libc::SIGTERM);
            }
            "checkpoint" | "checkpoint-_exit" | "reraise" => {
                let a = handler(count as *const () as usize, libc::SA_SIGINFO);
                libc::sigaction(libc::SIGTERM, &a, std::ptr::null_mut());
                libc::kill(me, libc::SIGTERM);
                while HANDLED.load(SeqCst) == 0 {
                    pause(1);
                }
                let alloc: unsafe extern "C" fn(*mut u64, usize) -> Res =
                    std::mem::transmute(ALLOC.load(SeqCst));
                let mut p = 0u64;
                let rc = alloc(&mut p, MIB);
                println!("checkpoint alloc_rc={rc}");
                let _ = std::io::stdout().flush();
                match mode {
                    "checkpoint" => libc::exit(7),
                    "checkpoint-_exit" => libc::_exit(7),
                    _ => {
                        libc::signal(libc::SIGTERM, libc::SIG_DFL);
                        libc::kill(me, libc::SIGTERM);
                    }
                }
            }
            "stuck-handler" => {
                extern "C" fn stuck(_: c_int, _: *mut libc::siginfo_t, _: *mut c_void) {
                    HANDLED.fetch_add(1, SeqCst);
                    loop {
                        // SAFETY: sleep is async-signal-safe.
                        unsafe { libc::sleep(60) };
                    }
                }
                let a = handler(stuck as *const () as usize, libc::SA_SIGINFO);
                libc::sigaction(libc::SIGTERM, &a, std::ptr::null_mut());
                libc::kill(me, libc::SIGTERM);
                let rc = launch_until_refused();
                println!("stuck launch_rc={rc} handled={}", HANDLED.load(SeqCst));
                let _ = std::io::stdout().flush();
                libc::exit(0);
            }
            "ignore-deadline" => {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                libc::kill(me, libc::SIGTERM);
                let mut passed = 0u64;
                let mut rc = 0;
                for _ in 0..2000 {
                    let (n, pp) = (std::ptr::null_mut(), std::ptr::null_mut());
                    rc = launch(f, 1, 1, 1, 32, 1, 1, 0, n, pp, pp);
                    if rc != 0 {
                        break;
                    }
                    passed += 1;
                    pause(10);
                }
                let ign = u8::from(query(libc::SIGTERM) == libc::SIG_IGN);
                println!("ignored launch_rc={rc} passed_after_signal={passed} still_ignored={ign}");
                std::process::exit(0);
            }
            "sigint-ignored" => {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                libc::kill(me, libc::SIGINT);
                pause(500);
                let rc = launch(
                    f,
                    1,
                    1,
                    1,
                    32,
                    1,
                    1,
                    0,
                    null,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
                println!("sigint_ignored launch_rc={rc}");
                std::process::exit(0);
            }
            "blocked" => {
                libc::kill(me, libc::SIGTERM);
                let rc = launch_until_refused();
                let mut pending: libc::sigset_t = std::mem::zeroed();
                libc::sigpending(&mut pending);
                let p = libc::sigismember(&pending, libc::SIGTERM);
                println!("blocked launch_rc={rc} pending={p}");
                std::process::exit(0);
            }
            _ => die("unknown signals mode"),
        }
    }
    std::thread::sleep(std::time::Duration::from_secs(10));
    println!("no_handler_ran");
    std::process::exit(1);
}

/// `fork-quota`: the parent allocates 48 MiB (fits 64) and 48 more
/// (refused), launches 3 kernels, forks; the child does the same with 5
/// launches and exits; the parent then frees and launches 2 more. Prints
/// `child=PID` and what each side saw.
fn fork_quota(r: &Resolver) {
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1us");
    let launch: Launch = r.get("cuLaunchKernel", "cuLaunchKernel");
    let sync: fnty::cuStreamSynchronize = r.get("cuStreamSynchronize", "cuStreamSynchronize");
    let null: H = std::ptr::null_mut();
    // One 1-block launch; then the stream synchronized after `n` of them.
    let launch_sync = |n: usize| {
        let pp = std::ptr::null_mut();
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            for _ in 0..n {
                check(
                    launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
                    "cuLaunchKernel",
                );
            }
            check(sync(null), "cuStreamSynchronize");
        }
    };
    let work = |launches: usize| {
        let mut rcs = Vec::new();
        launch_sync(launches);
        // SAFETY: a resolved entry point with a valid out-pointer.
        unsafe {
            for _ in 0..2 {
                let mut p = 0u64;
                rcs.push((cu.alloc)(&mut p, 48 * MIB));
            }
        }
        join(&rcs)
    };
    let parent = work(3);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: fork/waitpid on our own process and child.
    unsafe {
        match libc::fork() {
            -1 => die("fork failed"),
            0 => {
                let child = work(5);
                println!("child_allocs={child}");
                std::process::exit(0);
            }
            child => {
                let mut status = 0;
                libc::waitpid(child, &mut status, 0);
                launch_sync(2);
                println!("child={child} child_status={status} parent_allocs={parent}");
            }
        }
    }
}

fn storm(r: &Resolver, n: usize) {
    let (cu, ctx, _) = setup(r, c"sim_kernel_1us");
    let ctx = ctx as usize;
    let (alloc, free, set) = (cu.alloc as usize, cu.free as usize, cu.set_current as usize);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                // SAFETY: the pointers resolved above, with their signatures.
                unsafe {
                    let alloc: unsafe extern "C" fn(*mut u64, usize) -> Res =
                        std::mem::transmute(alloc);
                    let free: unsafe extern "C" fn(u64) -> Res = std::mem::transmute(free);
                    let set: unsafe extern "C" fn(H) -> Res = std::mem::transmute(set);
                    set(ctx as H);
                    let (mut ok, mut oom) = (0u64, 0u64);
                    for _ in 0..n {
                        // Two held at once: threads running together overshoot the quota.
                        let mut held = Vec::new();
                        for _ in 0..2 {
                            let mut p = 0u64;
                            match alloc(&mut p, 20 * MIB) {
                                0 => {
                                    ok += 1;
                                    held.push(p);
                                }
                                2 => oom += 1,
                                rc => check(rc, "cuMemAlloc"),
                            }
                        }
                        for p in held {
                            check(free(p), "cuMemFree");
                        }
                    }
                    (ok, oom)
                }
            })
        })
        .collect();
    let (ok, oom) = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: resolved entry points, valid out-pointers.
    unsafe {
        check((cu.info)(&mut free, &mut total), "cuMemGetInfo");
        (cu.release)(0);
    }
    println!("storm_ok={ok} storm_oom={oom} meminfo_free={free} meminfo_total={total}");
}

fn launches(r: &Resolver, n: usize) {
    // 1 ns kernels: the queue stays short, so the loop measures the call path.
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1ns");
    let launch: Launch = r.get("cuLaunchKernel", &pt(r, "cuLaunchKernel"));
    let sync: fnty::cuStreamSynchronize =
        r.get("cuStreamSynchronize", &pt(r, "cuStreamSynchronize"));
    let null: H = std::ptr::null_mut();
    let pp = std::ptr::null_mut();
    let mut busy = std::time::Duration::ZERO;
    // SAFETY: resolved entry points with valid arguments.
    unsafe {
        for chunk in 0..n.div_ceil(1000) {
            let m = (n - chunk * 1000).min(1000);
            let t = Instant::now();
            for _ in 0..m {
                check(
                    launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
                    "cuLaunchKernel",
                );
            }
            busy += t.elapsed();
            // Drain outside the timed part so the queue never fills.
            check(sync(null), "cuStreamSynchronize");
        }
        (cu.release)(0);
    }
    println!("ns_per_launch={:.1}", busy.as_nanos() as f64 / n as f64);
}

fn allocs(r: &Resolver, n: usize) {
    let (cu, _ctx, _) = setup(r, c"sim_kernel_1us");
    let t = Instant::now();
    // SAFETY: resolved entry points with valid arguments.
    unsafe {
        for _ in 0..n {
            let mut p = 0u64;
            check((cu.alloc)(&mut p, MIB), "cuMemAlloc");
            check((cu.free)(p), "cuMemFree");
        }
    }
    let el = t.elapsed();
    // SAFETY: as above.
    unsafe { (cu.release)(0) };
    println!("ns_per_alloc_free={:.1}", el.as_nanos() as f64 / n as f64);
}

fn fork_child_launches(r: &Resolver, secs: usize) {
    let (_cu, _ctx, f) = setup(r, c"sim_kernel_1ms");
    let launch: Launch = r.get("cuLaunchKernel", &pt(r, "cuLaunchKernel"));
    let sync: fnty::cuStreamSynchronize =
        r.get("cuStreamSynchronize", &pt(r, "cuStreamSynchronize"));
    let (null, pp): (H, *mut H) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: resolved entry points with valid arguments; fork/waitpid on
    // our own process and child.
    unsafe {
        // The parent's watcher is running once a launch went through.
        check(
            launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
            "cuLaunchKernel",
        );
        check(sync(null), "cuStreamSynchronize");
        match libc::fork() {
            -1 => die("fork failed"),
            0 => {
                let end = Instant::now() + std::time::Duration::from_secs(secs as u64);
                while Instant::now() < end {
                    check(
                        launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
                        "cuLaunchKernel",
                    );
                    check(sync(null), "cuStreamSynchronize");
                }
                std::process::exit(0);
            }
            child => {
                println!("child={child}");
                let mut status = 0;
                libc::waitpid(child, &mut status, 0);
                println!("child_status={status}");
            }
        }
    }
}

fn exit_on_error(r: &Resolver) {
    let (cu, _ctx, _) = setup(r, c"sim_kernel_1us");
    println!("ready");
    loop {
        let mut p = 0u64;
        // SAFETY: resolved entry points with valid arguments.
        let rc = unsafe {
            match (cu.alloc)(&mut p, MIB) {
                0 => (cu.free)(p),
                rc => rc,
            }
        };
        if rc != 0 {
            println!("error={rc}");
            std::process::exit(1);
        }
    }
}

/// Median and mean of per-call times (ns), each sample the mean of a block.
fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_unstable_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    (v.get(v.len() / 2).copied().unwrap_or(0.0), mean)
}

/// Launches and alloc/free pairs, direct and through the dlopen'ed shim,
/// interleaved in blocks (the order alternating) in one process, so machine
/// noise hits both alike. Each sample is one block's mean per call: timing
/// single calls would add the clock's own cost (tens of ns) to a call of a
/// few ns (the fake's null mode).
fn shim_bench(r: &Resolver, n: usize) {
    let path = std::env::var("XCUDA_PROBE_SHIM").unwrap_or_else(|_| die("XCUDA_PROBE_SHIM unset"));
    let c = CString::new(path).unwrap();
    // SAFETY: dlopen/dlsym with NUL-terminated names; handles kept for the process.
    let shim = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if shim.is_null() {
        die("cannot dlopen the shim");
    }
    let from_shim = |name: &CStr| -> usize {
        // SAFETY: as above.
        let p = unsafe { libc::dlsym(shim, name.as_ptr()) } as usize;
        if p == 0 {
            die("symbol missing from the shim");
        }
        p
    };
    // SAFETY: the shim's exports with their C signatures.
    let (x_init, x_launch, x_alloc, x_free) = unsafe {
        (
            std::mem::transmute::<usize, unsafe extern "C" fn(c_uint) -> Res>(from_shim(c"cuInit")),
            std::mem::transmute::<usize, Launch>(from_shim(c"cuLaunchKernel")),
            std::mem::transmute::<usize, unsafe extern "C" fn(*mut u64, usize) -> Res>(from_shim(
                c"cuMemAlloc_v2",
            )),
            std::mem::transmute::<usize, unsafe extern "C" fn(u64) -> Res>(from_shim(
                c"cuMemFree_v2",
            )),
        )
    };
    // The shim's cuInit starts its watcher, as in a real job; the gate stays open.
    // SAFETY: cuInit(0).
    check(unsafe { x_init(0) }, "xcuda cuInit");
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1ns");
    let d_launch: Launch = r.get("cuLaunchKernel", "cuLaunchKernel");
    let d_sync: fnty::cuStreamSynchronize = r.get("cuStreamSynchronize", "cuStreamSynchronize");
    // The shim's synchronize after its blocks: in counting mode it ends the
    // busy period the block's first launch began (one per 500 launches,
    // as a request of a service ends one), outside the timed loop.
    // SAFETY: the shim's export with its C signature.
    let x_sync = unsafe {
        std::mem::transmute::<usize, fnty::cuStreamSynchronize>(from_shim(c"cuStreamSynchronize"))
    };
    let null: H = std::ptr::null_mut();
    let pp = std::ptr::null_mut();
    let block = 500;
    let (mut ld, mut lx, mut ad, mut ax) = (vec![], vec![], vec![], vec![]);
    // SAFETY: resolved entry points with valid arguments.
    unsafe {
        for round in 0..n.div_ceil(block) {
            for which in [round % 2, 1 - round % 2] {
                let (launch, out) = if which == 0 {
                    (d_launch, &mut ld)
                } else {
                    (x_launch, &mut lx)
                };
                let t = Instant::now();
                for _ in 0..block {
                    check(
                        launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
                        "cuLaunchKernel",
                    );
                }
                out.push(t.elapsed().as_nanos() as f64 / block as f64);
                let sync = if which == 0 { d_sync } else { x_sync };
                check(sync(null), "cuStreamSynchronize");
                let (alloc, free, out) = if which == 0 {
                    (cu.alloc, cu.free, &mut ad)
                } else {
                    (x_alloc, x_free, &mut ax)
                };
                let pairs = block / 4;
                let t = Instant::now();
                for _ in 0..pairs {
                    let mut p = 0u64;
                    check(alloc(&mut p, MIB), "cuMemAlloc");
                    check(free(p), "cuMemFree");
                }
                out.push(t.elapsed().as_nanos() as f64 / pairs as f64);
            }
        }
    }
    let ((ld50, ldm), (lx50, lxm)) = (summary(ld), summary(lx));
    let ((ad50, _), (ax50, _)) = (summary(ad), summary(ax));
    println!(
        "direct_launch_ns={ld50:.1} xcuda_launch_ns={lx50:.1} direct_launches_per_s={:.0} xcuda_launches_per_s={:.0}",
        1e9 / ldm,
        1e9 / lxm
    );
    println!(
        "direct_alloc_free_ns={ad50:.1} xcuda_alloc_free_ns={ax50:.1} added_ns_per_alloc_free={:.1}",
        ax50 - ad50
    );
    println!(
        "added_ns_per_launch={:.1} ratio={:.3}",
        lx50 - ld50,
        ldm / lxm
    );
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
        Some(&"api") => api(&r),
        Some(&"gate") => gate_one(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"signals") => signals(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"fork-quota") => fork_quota(&r),
        Some(&"graph") => graph_quota(&r),
        Some(&"ctx") => ctx_then_sigterm(&r, rest.get(1).copied().unwrap_or("")),
        Some(&"storm") => storm(&r, n),
        Some(&"launches") => launches(&r, n),
        Some(&"allocs") => allocs(&r, n),
        Some(&"exit-on-error") => exit_on_error(&r),
        Some(&"fork") => fork_child_launches(&r, n),
        Some(&"shim-bench") => shim_bench(&r, n),
        _ => die("unknown scenario"),
    }
}
