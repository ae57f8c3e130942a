//! Timed loops: `storm`, `launches`, `allocs` and `shim-bench`.

use super::resolve::{die, pt, Resolver};
use super::{check, setup, Launch, Res, H, MIB};
use cuda_abi::fnty;
use std::ffi::{c_uint, CStr, CString};
use std::time::Instant;

pub fn storm(r: &Resolver, n: usize) {
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

pub fn launches(r: &Resolver, n: usize) {
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

pub fn allocs(r: &Resolver, n: usize) {
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

/// Median and mean of per-call times (ns), each sample the mean of a block.
pub fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_unstable_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    (v.get(v.len() / 2).copied().unwrap_or(0.0), mean)
}

/// Launches and alloc/free pairs, direct and through the dlopen'ed shim,
/// interleaved in blocks (the order alternating) in one process, so machine
/// noise hits both alike. Each sample is one block's mean per call: timing
/// single calls would add the clock's own cost (tens of ns) to a call of a
/// few ns (the fake's null mode).
pub fn shim_bench(r: &Resolver, n: usize) {
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
