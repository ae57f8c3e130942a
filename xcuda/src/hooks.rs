//! The hook list, declared once. `hooks!` generates from it:
//! * the exported `cu*` functions (the direct-symbol path),
//! * [`table`] and [`index_of`]: what the `dlsym`/`dlvsym` hooks and the
//!   `cuGetProcAddress` answer look names and variants up in,
//! * [`Id`]: the index of each hook in the driver's function table.
//!
//! Every export catches panics (`CUDA_ERROR_UNKNOWN`) and returns the
//! driver's CUresult as a raw `u32`, so codes we do not know pass through.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // C ABI: the CUDA driver API documents these.
#![allow(clippy::too_many_arguments)] // C signatures.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::abi::{Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, MemAllocNodeParams};
use crate::memcap::{array_bytes, Kind};
use crate::runtime;
use crate::{cu, driver, CUresult};

type H = *mut c_void;
type Pp = *mut *mut c_void;

/// One hooked entry point: `symbol` is the exported name (NUL-terminated
/// for dlsym), `base` the name cuGetProcAddress is asked for, `wrapper`
/// the address of our export.
#[derive(Debug)]
pub struct Hook {
    pub symbol: &'static CStr,
    pub base: &'static str,
    pub wrapper: usize,
}

fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(cu::UNKNOWN)
}

/// Reads a caller's out-pointer after the driver filled it (0 if null).
fn out<T: Copy + Into<u64>>(p: *const T) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: non-null out-pointer the driver just wrote on success.
    unsafe { p.read() }.into()
}

fn ptr_out(p: *const H) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: as in `out`.
    unsafe { p.read() as usize as u64 }
}

macro_rules! hooks {
    ($( $base:literal fn $name:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr ; )*) => {
        /// Index of each hook in [`table`].
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Debug, Clone, Copy)]
        #[repr(usize)]
        pub enum Id { $($name),* }

        pub const COUNT: usize = [$(stringify!($name)),*].len();

        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
                guard(|| {
                    let Some(p) = driver::real(Id::$name as usize) else {
                        return cu::NOT_FOUND;
                    };
                    // SAFETY: `p` is the driver's export of this very name, whose C
                    // signature is the one declared here.
                    let f: unsafe extern "C" fn($($t),*) -> CUresult = unsafe { std::mem::transmute(p) };
                    // SAFETY: the caller's arguments, passed through unchanged.
                    let $real = |$($a: $t),*| unsafe { f($($a),*) };
                    $body
                })
            }
        )*

        /// Every hook, in [`Id`] order.
        pub fn table() -> &'static [Hook; COUNT] {
            static T: OnceLock<[Hook; COUNT]> = OnceLock::new();
            T.get_or_init(|| [$(Hook {
                symbol: match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => unreachable!(),
                },
                base: $base,
                wrapper: $name as *const () as usize,
            }),*])
        }
    };
}

/// The hook whose exported name is `name`.
pub fn index_of(name: &[u8]) -> Option<usize> {
    if !name.starts_with(b"cu") {
        return None;
    }
    table().iter().position(|h| h.symbol.to_bytes() == name)
}

/// Bytes of an array of `levels` mipmap levels (each halving every extent,
/// down to 1) of `w x h x d` elements (0 = dimension unused).
fn array_size(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    levels: c_uint,
) -> u64 {
    let elems = (0..levels.clamp(1, 64))
        .map(|l| {
            [w, h, d]
                .iter()
                .fold(1u64, |n, &e| n.saturating_mul(((e as u64) >> l).max(1)))
        })
        .fold(0u64, u64::saturating_add);
    array_bytes(elems, format, channels)
}

/// Reserves an array's bytes (from its 3D descriptor, None = null) around
/// the driver's `call`, recorded by the handle it writes to `out`.
fn array(
    kind: Kind,
    out: *mut H,
    d: Option<(usize, usize, usize, c_uint, c_uint)>,
    levels: c_uint,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match d {
        // A null descriptor: the driver says what is wrong with it.
        None => call(),
        Some((w, h, dd, format, channels)) => {
            let n = array_size(w, h, dd, format, channels, levels);
            runtime::memcap().alloc(kind, n, call, || ptr_out(out), || n)
        }
    }
}

/// A 2D array descriptor as 3D extents.
fn desc2(p: *const ArrayDesc) -> Option<(usize, usize, usize, c_uint, c_uint)> {
    // SAFETY: a non-null descriptor pointer valid for this call, per the API.
    unsafe { p.as_ref() }.map(|x| (x.width, x.height, 0, x.format, x.channels))
}

fn desc2_v1(p: *const ArrayDescV1) -> Option<(usize, usize, usize, c_uint, c_uint)> {
    // SAFETY: as in desc2.
    unsafe { p.as_ref() }.map(|x| (x.width as usize, x.height as usize, 0, x.format, x.channels))
}

fn desc3_v1(p: *const Array3dDescV1) -> Option<(usize, usize, usize, c_uint, c_uint)> {
    // SAFETY: as in desc2.
    unsafe { p.as_ref() }.map(|x| {
        let e = |v: c_uint| v as usize;
        (e(x.width), e(x.height), e(x.depth), x.format, x.channels)
    })
}

fn desc3(p: *const Array3dDesc) -> Option<(usize, usize, usize, c_uint, c_uint)> {
    // SAFETY: as in desc2.
    unsafe { p.as_ref() }.map(|x| (x.width, x.height, x.depth, x.format, x.channels))
}

fn alloc<T: Copy + Into<u64>>(
    kind: Kind,
    size: u64,
    handle: *const T,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    runtime::memcap().alloc(kind, size, call, || out(handle), || size)
}

/// A graph memory-allocation node: counted when the node is added (the
/// earliest xCUDA sees it; the driver commits the memory at launch), by the
/// address the driver writes into the parameters; its free node, or any free
/// of that address, gives it back.
fn graph_alloc(params: *mut MemAllocNodeParams, call: impl FnOnce() -> CUresult) -> CUresult {
    // SAFETY: the caller's parameter block, valid for this call (or null).
    let Some(size) = (unsafe { params.as_ref() }).map(|p| p.bytesize as u64) else {
        return call(); // the driver says what is wrong with a null block
    };
    runtime::memcap().alloc(
        Kind::Device,
        size,
        call,
        // SAFETY: as above; the driver just wrote `dptr`.
        || unsafe { (*params).dptr },
        || size,
    )
}

fn free(kind: Kind, h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    runtime::memcap().free(kind, h, call)
}

fn launch(call: impl FnOnce() -> CUresult) -> CUresult {
    runtime::gate().pass(call)
}

hooks! {
    // Start-up: settings, watcher, signal handlers.
    "cuInit" fn cuInit(flags: c_uint) => |real| runtime::on_init(real(flags));
    // Entry-point lookup: answer with our wrapper of the variant the driver picked.
    "cuGetProcAddress" fn cuGetProcAddress(symbol: *const c_char, pfn: Pp, version: c_int, flags: u64)
        => |real| proc_address(symbol, pfn, real(symbol, pfn, version, flags));
    "cuGetProcAddress" fn cuGetProcAddress_v2(symbol: *const c_char, pfn: Pp, version: c_int, flags: u64, status: *mut c_int)
        => |real| proc_address(symbol, pfn, real(symbol, pfn, version, flags, status));
    // Contexts, so the graceful exit knows what to synchronize and release.
    "cuDevicePrimaryCtxRetain" fn cuDevicePrimaryCtxRetain(ctx: *mut H, dev: c_int)
        => |real| runtime::contexts().retained(dev, real(ctx, dev));
    "cuDevicePrimaryCtxRelease" fn cuDevicePrimaryCtxRelease(dev: c_int)
        => |real| runtime::contexts().released(dev, real(dev));
    "cuDevicePrimaryCtxRelease" fn cuDevicePrimaryCtxRelease_v2(dev: c_int)
        => |real| runtime::contexts().released(dev, real(dev));
    "cuDevicePrimaryCtxReset" fn cuDevicePrimaryCtxReset(dev: c_int)
        => |real| runtime::contexts().reset(dev, real(dev));
    "cuDevicePrimaryCtxReset" fn cuDevicePrimaryCtxReset_v2(dev: c_int)
        => |real| runtime::contexts().reset(dev, real(dev));
    "cuCtxCreate" fn cuCtxCreate(ctx: *mut H, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, flags, dev), || ptr_out(ctx));
    "cuCtxCreate" fn cuCtxCreate_v2(ctx: *mut H, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, flags, dev), || ptr_out(ctx));
    "cuCtxCreate" fn cuCtxCreate_v3(ctx: *mut H, params: H, n: c_int, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, params, n, flags, dev), || ptr_out(ctx));
    "cuCtxCreate" fn cuCtxCreate_v4(ctx: *mut H, params: H, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, params, flags, dev), || ptr_out(ctx));
    "cuCtxDestroy" fn cuCtxDestroy(ctx: H) => |real| runtime::contexts().destroyed(ctx, real(ctx));
    "cuCtxDestroy" fn cuCtxDestroy_v2(ctx: H) => |real| runtime::contexts().destroyed(ctx, real(ctx));
    // Memory: capped allocations, frees that give quota back, the cap as the total.
    "cuMemGetInfo" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => |real| mem_info(free, total, real(free, total));
    "cuMemGetInfo" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) => |real| mem_info_v1(free, total, real(free, total));
    "cuMemAlloc" fn cuMemAlloc(p: *mut c_uint, size: c_uint) => |real| alloc(Kind::Device, size as u64, p, || real(p, size));
    "cuMemAlloc" fn cuMemAlloc_v2(p: *mut u64, size: usize) => |real| alloc(Kind::Device, size as u64, p, || real(p, size));
    "cuMemAllocPitch" fn cuMemAllocPitch(p: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint)
        => |real| alloc_pitch(|| out(p), || out(pitch), width as usize, height as usize, || real(p, pitch, width, height, elem));
    "cuMemAllocPitch" fn cuMemAllocPitch_v2(p: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: c_uint)
        => |real| alloc_pitch(|| out(p), || out(pitch as *const usize as *const u64), width, height, || real(p, pitch, width, height, elem));
    "cuMemAllocManaged" fn cuMemAllocManaged(p: *mut u64, size: usize, flags: c_uint)
        => |real| alloc(Kind::Device, size as u64, p, || real(p, size, flags));
    "cuMemAllocAsync" fn cuMemAllocAsync(p: *mut u64, size: usize, s: H) => |real| alloc(Kind::Device, size as u64, p, || real(p, size, s));
    "cuMemAllocAsync" fn cuMemAllocAsync_ptsz(p: *mut u64, size: usize, s: H) => |real| alloc(Kind::Device, size as u64, p, || real(p, size, s));
    "cuMemAllocFromPoolAsync" fn cuMemAllocFromPoolAsync(p: *mut u64, size: usize, pool: H, s: H)
        => |real| alloc(Kind::Device, size as u64, p, || real(p, size, pool, s));
    "cuMemAllocFromPoolAsync" fn cuMemAllocFromPoolAsync_ptsz(p: *mut u64, size: usize, pool: H, s: H)
        => |real| alloc(Kind::Device, size as u64, p, || real(p, size, pool, s));
    "cuGraphAddMemAllocNode" fn cuGraphAddMemAllocNode(node: *mut H, g: H, deps: *const H, n: usize, params: *mut MemAllocNodeParams)
        => |real| graph_alloc(params, || real(node, g, deps, n, params));
    "cuGraphAddMemFreeNode" fn cuGraphAddMemFreeNode(node: *mut H, g: H, deps: *const H, n: usize, dptr: u64)
        => |real| free(Kind::Device, dptr, || real(node, g, deps, n, dptr));
    "cuMemFree" fn cuMemFree(p: c_uint) => |real| free(Kind::Device, p as u64, || real(p));
    "cuMemFree" fn cuMemFree_v2(p: u64) => |real| free(Kind::Device, p, || real(p));
    "cuMemFreeAsync" fn cuMemFreeAsync(p: u64, s: H) => |real| free(Kind::Device, p, || real(p, s));
    "cuMemFreeAsync" fn cuMemFreeAsync_ptsz(p: u64, s: H) => |real| free(Kind::Device, p, || real(p, s));
    "cuMemCreate" fn cuMemCreate(h: *mut u64, size: usize, prop: *const c_void, flags: u64)
        => |real| alloc(Kind::Vmm, size as u64, h, || real(h, size, prop, flags));
    "cuMemRelease" fn cuMemRelease(h: u64) => |real| free(Kind::Vmm, h, || real(h));
    "cuArrayCreate" fn cuArrayCreate(a: *mut H, d: *const ArrayDescV1) => |real| array(Kind::Array, a, desc2_v1(d), 1, || real(a, d));
    "cuArray3DCreate" fn cuArray3DCreate(a: *mut H, d: *const Array3dDescV1)
        => |real| array(Kind::Array, a, desc3_v1(d), 1, || real(a, d));
    "cuArrayCreate" fn cuArrayCreate_v2(a: *mut H, d: *const ArrayDesc) => |real| array(Kind::Array, a, desc2(d), 1, || real(a, d));
    "cuArray3DCreate" fn cuArray3DCreate_v2(a: *mut H, d: *const Array3dDesc)
        => |real| array(Kind::Array, a, desc3(d), 1, || real(a, d));
    "cuArrayDestroy" fn cuArrayDestroy(a: H) => |real| free(Kind::Array, a as usize as u64, || real(a));
    "cuMipmappedArrayCreate" fn cuMipmappedArrayCreate(m: *mut H, d: *const Array3dDesc, levels: c_uint)
        => |real| array(Kind::Mipmapped, m, desc3(d), levels, || real(m, d, levels));
    "cuMipmappedArrayDestroy" fn cuMipmappedArrayDestroy(m: H) => |real| free(Kind::Mipmapped, m as usize as u64, || real(m));
    // Launches: through the gate.
    "cuLaunchKernel" fn cuLaunchKernel(f: H, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: H, p: Pp, e: Pp)
        => |real| launch(|| real(f, gx, gy, gz, bx, by, bz, shm, s, p, e));
    "cuLaunchKernel" fn cuLaunchKernel_ptsz(f: H, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: H, p: Pp, e: Pp)
        => |real| launch(|| real(f, gx, gy, gz, bx, by, bz, shm, s, p, e));
    "cuLaunchKernelEx" fn cuLaunchKernelEx(cfg: *const c_void, f: H, p: Pp, e: Pp) => |real| launch(|| real(cfg, f, p, e));
    "cuLaunchKernelEx" fn cuLaunchKernelEx_ptsz(cfg: *const c_void, f: H, p: Pp, e: Pp) => |real| launch(|| real(cfg, f, p, e));
    "cuLaunchCooperativeKernel" fn cuLaunchCooperativeKernel(f: H, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: H, p: Pp)
        => |real| launch(|| real(f, gx, gy, gz, bx, by, bz, shm, s, p));
    "cuLaunchCooperativeKernel" fn cuLaunchCooperativeKernel_ptsz(f: H, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: H, p: Pp)
        => |real| launch(|| real(f, gx, gy, gz, bx, by, bz, shm, s, p));
    "cuGraphLaunch" fn cuGraphLaunch(g: H, s: H) => |real| launch(|| real(g, s));
    "cuGraphLaunch" fn cuGraphLaunch_ptsz(g: H, s: H) => |real| launch(|| real(g, s));
    // Legacy launches (execution configuration set by earlier calls).
    "cuLaunch" fn cuLaunch(f: H) => |real| launch(|| real(f));
    "cuLaunchGrid" fn cuLaunchGrid(f: H, w: c_int, h: c_int) => |real| launch(|| real(f, w, h));
    "cuLaunchGridAsync" fn cuLaunchGridAsync(f: H, w: c_int, h: c_int, s: H) => |real| launch(|| real(f, w, h, s));
}

/// `handle` and `pitch` read the driver's outputs after the call.
fn alloc_pitch(
    handle: impl FnOnce() -> u64,
    pitch: impl FnOnce() -> u64,
    width: usize,
    height: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // Reserve with the widest pitch alignment drivers use; settle on the real pitch.
    let bound = width
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height.max(1));
    runtime::memcap().alloc(Kind::Device, bound as u64, call, handle, || {
        pitch().saturating_mul(height.max(1) as u64)
    })
}

/// The v1 `cuMemGetInfo` (32-bit figures): the cap as the total, clamped.
fn mem_info_v1(free: *mut c_uint, total: *mut c_uint, rc: CUresult) -> CUresult {
    if rc != cu::SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    // SAFETY: both out-pointers non-null and just written by the driver.
    unsafe {
        let (f, t) = runtime::memcap().info(*free as u64, *total as u64);
        *free = f.min(c_uint::MAX as u64) as c_uint;
        *total = t.min(c_uint::MAX as u64) as c_uint;
    }
    rc
}

fn mem_info(free: *mut usize, total: *mut usize, rc: CUresult) -> CUresult {
    if rc != cu::SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    // SAFETY: both out-pointers non-null and just written by the driver.
    unsafe {
        let (f, t) = runtime::memcap().info(*free as u64, *total as u64);
        *free = f as usize;
        *total = t as usize;
    }
    rc
}

/// After the real cuGetProcAddress: swap the driver's function for our
/// wrapper of the same variant. Unknown names and variants pass untouched.
fn proc_address(symbol: *const c_char, pfn: Pp, rc: CUresult) -> CUresult {
    if rc != cu::SUCCESS || symbol.is_null() || pfn.is_null() {
        return rc;
    }
    // SAFETY: NUL-terminated name per the API; pfn non-null and just written.
    let (name, p) = unsafe { (CStr::from_ptr(symbol), *pfn as usize) };
    if p == 0 {
        return rc;
    }
    if let Some(i) = driver::hook_of_driver_fn(name.to_bytes(), p) {
        if !deliberately_unhooked(i) {
            // SAFETY: as above.
            unsafe { *pfn = table()[i].wrapper as *mut c_void };
        }
    }
    rc
}

/// Test-only mutation, to prove the lookup tests can fail: the hook named by
/// `MUXFLOW_XCUDA_TEST_UNHOOK` is not handed out by `cuGetProcAddress`,
/// `dlsym` or `dlvsym` (the driver's own function is). Honoured only where
/// the environment is trusted anyway (root, outside a Slurm job: see
/// `runtime::Source`); a job's processes never read it.
pub fn deliberately_unhooked(i: usize) -> bool {
    static UNHOOKED: OnceLock<Option<usize>> = OnceLock::new();
    let u = *UNHOOKED.get_or_init(|| {
        let name = std::env::var(TEST_UNHOOK).ok()?;
        if runtime::Source::of_this_process() != runtime::Source::RootEnvironment {
            return None;
        }
        let i = index_of(name.as_bytes());
        crate::log(format_args!(
            "{TEST_UNHOOK}={name}: lookups of it return the driver's function (a test's deliberate breakage)"
        ));
        i
    });
    u == Some(i)
}

/// The variable [`deliberately_unhooked`] reads.
pub const TEST_UNHOOK: &str = "MUXFLOW_XCUDA_TEST_UNHOOK";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_unique_and_variants_share_their_base() {
        let t = table();
        for (i, h) in t.iter().enumerate() {
            assert_eq!(index_of(h.symbol.to_bytes()), Some(i));
            let s = h.symbol.to_str().unwrap();
            assert!(s.starts_with(h.base), "{s} vs {}", h.base);
            let rest = &s[h.base.len()..];
            assert!(
                rest.is_empty() || rest.starts_with("_v") || rest.starts_with("_pt"),
                "{s}"
            );
        }
        assert_eq!(
            index_of(b"cuLaunchKernel_ptsz"),
            Some(Id::cuLaunchKernel_ptsz as usize)
        );
        assert_eq!(index_of(b"cuNotHooked"), None);
        assert_eq!(index_of(b"malloc"), None);
    }

    #[test]
    fn array_sizes_count_every_mipmap_level() {
        const FLOAT: c_uint = 0x20;
        assert_eq!(array_size(1024, 0, 0, FLOAT, 1, 1), 4096);
        assert_eq!(array_size(1024, 768, 0, FLOAT, 4, 1), 1024 * 768 * 16);
        // 8x4x2, 4x2x1, 2x1x1, 1x1x1 (extents stop halving at 1).
        assert_eq!(array_size(8, 4, 2, FLOAT, 1, 4), (64 + 8 + 2 + 1) * 4);
        // Levels are at least 1, and absurd extents saturate rather than wrap.
        assert_eq!(array_size(16, 0, 0, FLOAT, 1, 0), 64);
        assert_eq!(array_size(usize::MAX, usize::MAX, 2, FLOAT, 1, 1), u64::MAX);
    }
}
