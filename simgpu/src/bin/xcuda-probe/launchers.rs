//! The gated entry points (every way to launch work), each as one call, and
//! `gate`: one of them held at the gate.

use super::resolve::{die, pt, Resolver};
use super::{check, setup, Launch, Res, H};
use cuda_abi::{fnty, LaunchConfig};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

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
type Ex = unsafe extern "C" fn(*const c_void, H, *mut H, *mut H) -> Res;

/// The gated calls, each named by the variant it calls.
pub type Launchers = Vec<(String, Box<dyn Fn() -> Res>)>;

/// One launch of `f` (one block of 32 threads on the default stream)
/// through a `cuLaunchKernel`-shaped entry point.
fn kernel_launch(launch: Launch, f: usize) -> Box<dyn Fn() -> Res> {
    let null: *mut H = std::ptr::null_mut();
    // SAFETY: an entry point resolved for this signature; valid arguments.
    Box::new(move || unsafe { launch(f as H, 1, 1, 1, 32, 1, 1, 0, null.cast(), null, null) })
}

/// The same launch through `cuLaunchKernelEx` (its launch configuration).
fn ex_launch(ex: Ex, f: usize) -> Box<dyn Fn() -> Res> {
    // SAFETY: an entry point resolved for this signature; valid arguments.
    Box::new(move || unsafe {
        let c = LaunchConfig {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            stream: std::ptr::null_mut(),
            attrs: std::ptr::null_mut(),
            num_attrs: 0,
        };
        ex(
            &c as *const LaunchConfig as *const c_void,
            f as H,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })
}

/// The gated entry points, each as one call that launches `f` (a
/// `CUfunction`, or a `CUkernel` for the lazy-loading rows). Names: the
/// variant called (`_ptsz` with --pt where one exists).
pub fn launchers(r: &Resolver, f: H, kernel: H) -> Launchers {
    let (f, kernel) = (f as usize, kernel as usize);
    let mut out: Launchers = Vec::new();
    let launch_sym = pt(r, "cuLaunchKernel");
    let launch: Launch = r.get("cuLaunchKernel", &launch_sym);
    out.push((launch_sym.clone(), kernel_launch(launch, f)));
    out.push((
        format!("{launch_sym}+CUkernel"),
        kernel_launch(launch, kernel),
    ));
    let ex_sym = pt(r, "cuLaunchKernelEx");
    let ex: Ex = r.get("cuLaunchKernelEx", &ex_sym);
    out.push((ex_sym.clone(), ex_launch(ex, f)));
    out.push((format!("{ex_sym}+CUkernel"), ex_launch(ex, kernel)));
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
    out.push(graph_launcher(r, launch, f));
    out.extend(legacy_launchers(r, f));
    out
}

/// `cuGraphLaunch` of a graph captured from one (ungated while capturing:
/// nothing runs) launch of `f`.
fn graph_launcher(r: &Resolver, launch: Launch, f: usize) -> (String, Box<dyn Fn() -> Res>) {
    let null: H = std::ptr::null_mut();
    let begin: fnty::cuStreamBeginCapture_v2 =
        r.get("cuStreamBeginCapture", &pt(r, "cuStreamBeginCapture_v2"));
    let end: fnty::cuStreamEndCapture = r.get("cuStreamEndCapture", &pt(r, "cuStreamEndCapture"));
    let inst: fnty::cuGraphInstantiateWithFlags =
        r.get("cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags");
    let graph_sym = pt(r, "cuGraphLaunch");
    let glaunch: unsafe extern "C" fn(H, H) -> Res = r.get("cuGraphLaunch", &graph_sym);
    let (mut g, mut e) = (null, null);
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        check(begin(null, 0), "cuStreamBeginCapture");
        check(kernel_launch(launch, f)(), "captured launch");
        check(end(null, &mut g), "cuStreamEndCapture");
        check(inst(&mut e, g, 0), "cuGraphInstantiateWithFlags");
    }
    let e = e as usize;
    // SAFETY: an entry point resolved for this signature; valid arguments.
    let call = Box::new(move || unsafe { glaunch(e as H, std::ptr::null_mut()) });
    (graph_sym, call)
}

/// Legacy launches (no per-thread variants).
fn legacy_launchers(r: &Resolver, f: usize) -> Launchers {
    let l0: fnty::cuLaunch = r.get("cuLaunch", "cuLaunch");
    let lg: fnty::cuLaunchGrid = r.get("cuLaunchGrid", "cuLaunchGrid");
    let la: fnty::cuLaunchGridAsync = r.get("cuLaunchGridAsync", "cuLaunchGridAsync");
    vec![
        // SAFETY: an entry point resolved for this signature; valid arguments.
        ("cuLaunch".into(), Box::new(move || unsafe { l0(f as H) })),
        (
            "cuLaunchGrid".into(),
            // SAFETY: as above.
            Box::new(move || unsafe { lg(f as H, 2, 1) }),
        ),
        (
            "cuLaunchGridAsync".into(),
            // SAFETY: as above.
            Box::new(move || unsafe { la(f as H, 2, 1, std::ptr::null_mut()) }),
        ),
    ]
}

/// A `CUkernel` the CUDA 12 way: cuLibraryLoadData + cuLibraryGetKernel.
pub fn library_kernel(r: &Resolver, name: &CStr) -> H {
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

/// One gated call (`gated` names it, as `api` prints them), once the
/// process is set up: prints `ready`, waits for a line on stdin, makes the
/// call (held while the gate is closed), prints `launched rc=N`.
pub fn gate_one(r: &Resolver, which: &str) {
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
