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

use crate::abi::{Array3dDesc, ArrayDesc};
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

fn desc3(p: *const Array3dDesc) -> Option<(usize, usize, usize, c_uint, c_uint)> {
    // SAFETY: as in desc2.
    unsafe { p.as_ref() }.map(|x| (x.width, x.height, x.depth, x.format, x.channels))
}

fn alloc(kind: Kind, size: usize, handle: *const u64, call: impl FnOnce() -> CUresult) -> CUresult {
    runtime::memcap().alloc(kind, size as u64, call, || out(handle), || size as u64)
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
    "cuDevicePrimaryCtxReset" fn cuDevicePrimaryCtxReset_v2(dev: c_int)
        => |real| runtime::contexts().reset(dev, real(dev));
    "cuCtxCreate" fn cuCtxCreate_v2(ctx: *mut H, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, flags, dev), || ptr_out(ctx));
    "cuCtxCreate" fn cuCtxCreate_v3(ctx: *mut H, params: H, n: c_int, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, params, n, flags, dev), || ptr_out(ctx));
    "cuCtxCreate" fn cuCtxCreate_v4(ctx: *mut H, params: H, flags: c_uint, dev: c_int)
        => |real| runtime::contexts().created(real(ctx, params, flags, dev), || ptr_out(ctx));
    "cuCtxDestroy" fn cuCtxDestroy_v2(ctx: H) => |real| runtime::contexts().destroyed(ctx, real(ctx));
    // Memory: capped allocations, frees that give quota back, the cap as the total.
    "cuMemGetInfo" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => |real| mem_info(free, total, real(free, total));
    "cuMemAlloc" fn cuMemAlloc_v2(p: *mut u64, size: usize) => |real| alloc(Kind::Device, size, p, || real(p, size));
    "cuMemAllocPitch" fn cuMemAllocPitch_v2(p: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: c_uint)
        => |real| alloc_pitch(p, pitch, width, height, || real(p, pitch, width, height, elem));
    "cuMemAllocManaged" fn cuMemAllocManaged(p: *mut u64, size: usize, flags: c_uint)
        => |real| alloc(Kind::Device, size, p, || real(p, size, flags));
    "cuMemAllocAsync" fn cuMemAllocAsync(p: *mut u64, size: usize, s: H) => |real| alloc(Kind::Device, size, p, || real(p, size, s));
    "cuMemAllocAsync" fn cuMemAllocAsync_ptsz(p: *mut u64, size: usize, s: H) => |real| alloc(Kind::Device, size, p, || real(p, size, s));
    "cuMemAllocFromPoolAsync" fn cuMemAllocFromPoolAsync(p: *mut u64, size: usize, pool: H, s: H)
        => |real| alloc(Kind::Device, size, p, || real(p, size, pool, s));
    "cuMemAllocFromPoolAsync" fn cuMemAllocFromPoolAsync_ptsz(p: *mut u64, size: usize, pool: H, s: H)
        => |real| alloc(Kind::Device, size, p, || real(p, size, pool, s));
    "cuMemFree" fn cuMemFree_v2(p: u64) => |real| free(Kind::Device, p, || real(p));
    "cuMemFreeAsync" fn cuMemFreeAsync(p: u64, s: H) => |real| free(Kind::Device, p, || real(p, s));
    "cuMemFreeAsync" fn cuMemFreeAsync_ptsz(p: u64, s: H) => |real| free(Kind::Device, p, || real(p, s));
    "cuMemCreate" fn cuMemCreate(h: *mut u64, size: usize, prop: *const c_void, flags: u64)
        => |real| alloc(Kind::Vmm, size, h, || real(h, size, prop, flags));
    "cuMemRelease" fn cuMemRelease(h: u64) => |real| free(Kind::Vmm, h, || real(h));
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
}

fn alloc_pitch(
    p: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // Reserve with the widest pitch alignment drivers use; settle on the real pitch.
    let bound = width
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height.max(1));
    runtime::memcap().alloc(
        Kind::Device,
        bound as u64,
        call,
        || out(p),
        || out(pitch as *const usize as *const u64).saturating_mul(height.max(1) as u64),
    )
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
        // SAFETY: as above.
        unsafe { *pfn = table()[i].wrapper as *mut c_void };
    }
    rc
}

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
