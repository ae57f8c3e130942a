//! `api`: every gated and capped entry point once, with the quota checks
//! (64 MiB cap): one row per allocation entry point.

use super::graphs::{graph_row, Begin, Graphs, Inst};
use super::launchers::{launchers, library_kernel, Launchers};
use super::resolve::{pt, Resolver};
use super::{check, join, setup, Cuda, Res, H, MIB};
use cuda_abi::{fnty, Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1};
use std::ffi::{c_int, c_uint, c_void};

/// An allocation row: 48 MiB (fits the 64 MiB cap), 48 MiB more (must be
/// refused), the first freed, 48 MiB again (fits only if the free gave its
/// quota back), that freed. Prints the five results and how many calls
/// reached the driver's `alloc_sym` (the refused one must not).
pub fn count_row(
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
fn host_row(key: &str, alloc: impl Fn(&mut *mut c_void) -> Res, free: impl Fn(*mut c_void) -> Res) {
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
    println!("host_{key}={}", join(&rcs));
}

/// CUDA 3.0: cuGetProcAddress answers the un-suffixed v1 variants.
const V1: c_int = 3000;

/// The memory entry points `api` checks, resolved in this order (the
/// report lists what each reached).
struct Memory {
    alloc_v1: fnty::cuMemAlloc,
    free_v1: fnty::cuMemFree,
    pitch_v1: fnty::cuMemAllocPitch,
    info_v1: fnty::cuMemGetInfo,
    pitch: fnty::cuMemAllocPitch_v2,
    managed: fnty::cuMemAllocManaged,
    /// The variant of cuMemAllocAsync called (`_ptsz` with --pt).
    async_sym: String,
    a_async: unsafe extern "C" fn(*mut u64, usize, H) -> Res,
    f_async: fnty::cuMemFreeAsync,
    /// The variant of cuMemAllocFromPoolAsync called.
    pool_sym: String,
    from_pool: unsafe extern "C" fn(*mut u64, usize, H, H) -> Res,
    pool_create: fnty::cuMemPoolCreate,
    pool_destroy: fnty::cuMemPoolDestroy,
    create: fnty::cuMemCreate,
    mrelease: fnty::cuMemRelease,
    reserve: fnty::cuMemAddressReserve,
    addr_free: fnty::cuMemAddressFree,
    map: fnty::cuMemMap,
    set_access: fnty::cuMemSetAccess,
    unmap: fnty::cuMemUnmap,
    array2d_v1: fnty::cuArrayCreate,
    array3d_v1: fnty::cuArray3DCreate,
    array2d: fnty::cuArrayCreate_v2,
    array3d: fnty::cuArray3DCreate_v2,
    adestroy: fnty::cuArrayDestroy,
    mipmapped: fnty::cuMipmappedArrayCreate,
    mdestroy: fnty::cuMipmappedArrayDestroy,
    host_v1: fnty::cuMemAllocHost,
    host_v2: fnty::cuMemAllocHost_v2,
    host_alloc: fnty::cuMemHostAlloc,
    host_free: fnty::cuMemFreeHost,
}

impl Memory {
    fn resolve(r: &Resolver) -> Memory {
        let alloc_v1 = r.get_at("cuMemAlloc", "cuMemAlloc", V1);
        let free_v1 = r.get_at("cuMemFree", "cuMemFree", V1);
        let pitch_v1 = r.get_at("cuMemAllocPitch", "cuMemAllocPitch", V1);
        let info_v1 = r.get_at("cuMemGetInfo", "cuMemGetInfo", V1);
        let pitch = r.get("cuMemAllocPitch", "cuMemAllocPitch_v2");
        let managed = r.get("cuMemAllocManaged", "cuMemAllocManaged");
        let async_sym = pt(r, "cuMemAllocAsync");
        let a_async = r.get("cuMemAllocAsync", &async_sym);
        let f_async = r.get("cuMemFreeAsync", &pt(r, "cuMemFreeAsync"));
        let pool_sym = pt(r, "cuMemAllocFromPoolAsync");
        let from_pool = r.get("cuMemAllocFromPoolAsync", &pool_sym);
        Memory {
            alloc_v1,
            free_v1,
            pitch_v1,
            info_v1,
            pitch,
            managed,
            async_sym,
            a_async,
            f_async,
            pool_sym,
            from_pool,
            pool_create: r.get("cuMemPoolCreate", "cuMemPoolCreate"),
            pool_destroy: r.get("cuMemPoolDestroy", "cuMemPoolDestroy"),
            create: r.get("cuMemCreate", "cuMemCreate"),
            mrelease: r.get("cuMemRelease", "cuMemRelease"),
            reserve: r.get("cuMemAddressReserve", "cuMemAddressReserve"),
            addr_free: r.get("cuMemAddressFree", "cuMemAddressFree"),
            map: r.get("cuMemMap", "cuMemMap"),
            set_access: r.get("cuMemSetAccess", "cuMemSetAccess"),
            unmap: r.get("cuMemUnmap", "cuMemUnmap"),
            array2d_v1: r.get_at("cuArrayCreate", "cuArrayCreate", V1),
            array3d_v1: r.get_at("cuArray3DCreate", "cuArray3DCreate", V1),
            array2d: r.get("cuArrayCreate", "cuArrayCreate_v2"),
            array3d: r.get("cuArray3DCreate", "cuArray3DCreate_v2"),
            adestroy: r.get("cuArrayDestroy", "cuArrayDestroy"),
            mipmapped: r.get("cuMipmappedArrayCreate", "cuMipmappedArrayCreate"),
            mdestroy: r.get("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy"),
            host_v1: r.get_at("cuMemAllocHost", "cuMemAllocHost", V1),
            host_v2: r.get("cuMemAllocHost", "cuMemAllocHost_v2"),
            host_alloc: r.get("cuMemHostAlloc", "cuMemHostAlloc"),
            host_free: r.get("cuMemFreeHost", "cuMemFreeHost"),
        }
    }
}

/// Every context create and destroy variant, each at the CUDA version that
/// introduced it.
struct Contexts {
    v1: fnty::cuCtxCreate,
    v2: fnty::cuCtxCreate_v2,
    v3: fnty::cuCtxCreate_v3,
    v4: fnty::cuCtxCreate_v4,
    destroy_v1: fnty::cuCtxDestroy,
    destroy_v2: fnty::cuCtxDestroy_v2,
}

impl Contexts {
    fn resolve(r: &Resolver) -> Contexts {
        Contexts {
            v1: r.get_at("cuCtxCreate", "cuCtxCreate", V1),
            v2: r.get_at("cuCtxCreate", "cuCtxCreate_v2", 11000),
            v3: r.get_at("cuCtxCreate", "cuCtxCreate_v3", 12000),
            v4: r.get_at("cuCtxCreate", "cuCtxCreate_v4", 12050),
            destroy_v1: r.get_at("cuCtxDestroy", "cuCtxDestroy", V1),
            destroy_v2: r.get("cuCtxDestroy", "cuCtxDestroy_v2"),
        }
    }
}

/// `api`: resolves everything first (the report), then one step per group
/// of entry points, each printing its lines.
pub fn api(r: &Resolver) {
    let (cu, ctx, f) = setup(r, c"sim_kernel_1us");
    let kernel = library_kernel(r, c"sim_kernel_1us");
    let gated = launchers(r, f, kernel);
    let sync: fnty::cuStreamSynchronize =
        r.get("cuStreamSynchronize", &pt(r, "cuStreamSynchronize"));
    let mem = Memory::resolve(r);
    let contexts = Contexts::resolve(r);
    let gr = Graphs::new(r);
    r.report();
    launch_rows(r, &gated, sync);
    let n = 48 * MIB;
    linear_rows(r, &cu, &mem, n);
    graph_rows(r, &gr, n);
    vmm_row(&mem, n);
    array_rows(r, &mem);
    host_rows(&mem, n);
    context_row(&cu, ctx, &contexts);
    meminfo(&cu, &mem);
    // SAFETY: a resolved entry point.
    check(unsafe { (cu.release)(0) }, "cuDevicePrimaryCtxRelease");
}

/// Every gated call once, then a synchronize: their results, their names,
/// and those that did not reach exactly their own variant in the driver once.
fn launch_rows(r: &Resolver, gated: &Launchers, sync: fnty::cuStreamSynchronize) {
    let mut rcs = Vec::new();
    let mut variant_calls = Vec::new();
    for (name, call) in gated {
        let driver_sym = name.split('+').next().unwrap_or(name);
        let before = r.driver_calls(driver_sym);
        rcs.push(call());
        if r.driver_calls(driver_sym).wrapping_sub(before) != 1 {
            variant_calls.push(name.clone());
        }
    }
    // SAFETY: a resolved entry point on the default stream.
    rcs.push(unsafe { sync(std::ptr::null_mut()) });
    println!("launch_rcs={}", join(&rcs));
    println!(
        "gated={}",
        join(&gated.iter().map(|g| g.0.clone()).collect::<Vec<_>>())
    );
    // The launch captured into the graph passed the gate too.
    println!("gated_calls={}", gated.len() + 1);
    // Gated calls that did not reach exactly their own variant in the driver once.
    println!("launch_variant_misses={}", variant_calls.join(","));
}

/// The linear-memory rows: v1 and v2 allocations, pitched, managed,
/// stream-ordered (from the default pool and from a created one), VMM handles.
fn linear_rows(r: &Resolver, cu: &Cuda, mem: &Memory, n: usize) {
    let null: H = std::ptr::null_mut();
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        count_row(
            r,
            "cuMemAlloc",
            "cuMemAlloc",
            |p| {
                let mut x = 0u32;
                let rc = (mem.alloc_v1)(&mut x, n as c_uint);
                *p = x as u64;
                rc
            },
            |p| (mem.free_v1)(p as u32),
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
                let rc = (mem.pitch_v1)(&mut x, &mut pt, 4096, (n / 4096) as c_uint, 4);
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
            |p| (mem.pitch)(p, &mut pitch_out, 4096, n / 4096, 4),
            |p| (cu.free)(p),
        );
        count_row(
            r,
            "cuMemAllocManaged",
            "cuMemAllocManaged",
            |p| (mem.managed)(p, n, 1),
            |p| (cu.free)(p),
        );
        count_row(
            r,
            "cuMemAllocAsync",
            &mem.async_sym,
            |p| (mem.a_async)(p, n, null),
            |p| (mem.f_async)(p, null),
        );
        let mut pool = null;
        check(
            (mem.pool_create)(&mut pool, [0u8; 88].as_ptr() as *const c_void),
            "cuMemPoolCreate",
        );
        count_row(
            r,
            "cuMemAllocFromPoolAsync",
            &mem.pool_sym,
            |p| (mem.from_pool)(p, n, pool, null),
            |p| (mem.f_async)(p, null),
        );
        check((mem.pool_destroy)(pool), "cuMemPoolDestroy");
        count_row(
            r,
            "cuMemCreate",
            "cuMemCreate",
            |p| (mem.create)(p, n, std::ptr::null(), 0),
            |p| (mem.mrelease)(p),
        );
    }
}

/// Graph memory: charged at instantiation, given back by destroy + trim;
/// one row per instantiation entry point, then one per way to begin a capture.
fn graph_rows(r: &Resolver, gr: &Graphs, n: usize) {
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
        graph_row(r, gr, key, sym, which, explicit);
    }
    for (key, how) in [
        ("capture_cuStreamBeginCapture", Begin::V1),
        ("capture_cuStreamBeginCapture_v2", Begin::V2),
        ("capture_cuStreamBeginCaptureToGraph", Begin::ToGraph),
    ] {
        let sym = "cuGraphInstantiateWithFlags";
        graph_row(r, gr, key, sym, Inst::Flags, || gr.captured(how, n, true).0);
    }
}

/// The VMM path end to end: physical memory counted, mapping it passes.
fn vmm_row(mem: &Memory, n: usize) {
    let mut v = Vec::new();
    let (mut h1, mut h2, mut h3, mut va) = (0u64, 0u64, 0u64, 0u64);
    let access = [0u8; 12];
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        v.push((mem.create)(&mut h1, n, std::ptr::null(), 0));
        v.push((mem.reserve)(&mut va, n, 0, 0, 0));
        v.push((mem.map)(va, n, 0, h1, 0));
        v.push((mem.set_access)(va, n, access.as_ptr() as *const c_void, 1));
        v.push((mem.create)(&mut h2, n, std::ptr::null(), 0));
        v.push((mem.unmap)(va, n));
        v.push((mem.mrelease)(h1));
        v.push((mem.addr_free)(va, n));
        v.push((mem.create)(&mut h3, n, std::ptr::null(), 0));
        v.push((mem.mrelease)(h3));
    }
    println!("vmm={}", join(&v));
}

/// Arrays of 4-byte floats: 4096 x 3072 and 4096 x 768 x 4 are 48 MiB;
/// two mipmap levels of 4096 x 2304 and 2048 x 1152, 45 MiB.
fn array_rows(r: &Resolver, mem: &Memory) {
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
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        count_row(
            r,
            "cuArrayCreate",
            "cuArrayCreate",
            |p| (mem.array2d_v1)(handle(p), &d2_v1),
            |p| (mem.adestroy)(p as H),
        );
        count_row(
            r,
            "cuArrayCreate_v2",
            "cuArrayCreate_v2",
            |p| (mem.array2d)(handle(p), &d2),
            |p| (mem.adestroy)(p as H),
        );
        count_row(
            r,
            "cuArray3DCreate",
            "cuArray3DCreate",
            |p| (mem.array3d_v1)(handle(p), &cube_v1),
            |p| (mem.adestroy)(p as H),
        );
        count_row(
            r,
            "cuArray3DCreate_v2",
            "cuArray3DCreate_v2",
            |p| (mem.array3d)(handle(p), &cube),
            |p| (mem.adestroy)(p as H),
        );
        count_row(
            r,
            "cuMipmappedArrayCreate",
            "cuMipmappedArrayCreate",
            |p| (mem.mipmapped)(handle(p), &mip, 2),
            |p| (mem.mdestroy)(p as H),
        );
    }
}

/// Pinned host memory: not the GPU's, never capped.
fn host_rows(mem: &Memory, n: usize) {
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        host_row(
            "cuMemAllocHost",
            |p| (mem.host_v1)(p, n as c_uint),
            |p| (mem.host_free)(p),
        );
        host_row(
            "cuMemAllocHost_v2",
            |p| (mem.host_v2)(p, n),
            |p| (mem.host_free)(p),
        );
        host_row(
            "cuMemHostAlloc",
            |p| (mem.host_alloc)(p, n, 0),
            |p| (mem.host_free)(p),
        );
    }
}

/// Contexts made and destroyed with every variant; `ctx` current again after.
fn context_row(cu: &Cuda, ctx: H, v: &Contexts) {
    let null: H = std::ptr::null_mut();
    let mut c = Vec::new();
    let (mut a, mut b, mut d, mut e) = (null, null, null, null);
    // SAFETY: entry points resolved for these signatures; valid arguments.
    unsafe {
        c.push((v.v1)(&mut a, 0, 0));
        c.push((v.v2)(&mut b, 0, 0));
        c.push((v.v3)(&mut d, null, 0, 0, 0));
        c.push((v.v4)(&mut e, null, 0, 0));
        c.push((v.destroy_v1)(a));
        for x in [b, d, e] {
            c.push((v.destroy_v2)(x));
        }
        check((cu.set_current)(ctx), "cuCtxSetCurrent");
    }
    println!("ctx_rcs={}", join(&c));
}

/// What cuMemGetInfo reports after all rows, through `_v2` and v1.
fn meminfo(cu: &Cuda, mem: &Memory) {
    // SAFETY: resolved entry points with valid out-pointers.
    unsafe {
        let (mut free, mut total) = (0usize, 0usize);
        check((cu.info)(&mut free, &mut total), "cuMemGetInfo_v2");
        println!("meminfo_free={free} meminfo_total={total}");
        let (mut free, mut total) = (0 as c_uint, 0 as c_uint);
        check((mem.info_v1)(&mut free, &mut total), "cuMemGetInfo");
        println!("meminfo_v1_free={free} meminfo_v1_total={total}");
    }
}
