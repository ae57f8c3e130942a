//! Fake `libcuda.so.1` over the simulated GPU model (see simgpu/README.md).
//! Every export catches panics and returns a CUresult; nothing here aborts.
//! The entry-point table is declared once (`cuda_exports!`): the macro emits
//! the exported functions and the table `cuGetProcAddress` resolves against.
//!
//! Like the real driver, the library binds its own references inside itself
//! (`-Bsymbolic`, build.rs): what `cuGetProcAddress` returns is this
//! library's function even when a preloaded xCUDA exports the same name.
//! Every export is a distinct function (it counts its own calls,
//! [`simgpu_calls`]), so `_v2`/`_ptsz`/`_ptds` variants are never aliases and
//! a test can tell which variant a call reached.
//!
//! Null mode (`MUXFLOW_SIM_NULL_DRIVER=1`, read at the first call): every
//! entry point but `cuGetProcAddress(_v2)` returns `CUDA_SUCCESS` at once,
//! touching nothing, so a benchmark sees only the cost of what sits between
//! the caller and the driver.
#![allow(clippy::missing_safety_doc)] // C ABI: the CUDA driver API documents these.
#![allow(non_snake_case)]

mod driver;

use driver::*;
use muxflow_simgpu::codes::cu;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

pub type CUresult = u32;

/// One exported entry point: `symbol` is the exported name, `base` the name
/// `cuGetProcAddress` is asked for, `since` the CUDA version (1000*major +
/// 10*minor) that introduced this variant, `per_thread` whether it is the
/// per-thread-default-stream (_ptsz/_ptds) variant.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub symbol: &'static str,
    pub base: &'static str,
    pub since: i32,
    pub per_thread: bool,
    pub addr: usize,
}

fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(cu::UNKNOWN)
}

/// Writes through an out-pointer; INVALID_VALUE when it is null.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(cu::INVALID_VALUE);
    }
    // SAFETY: non-null out-pointer supplied by the caller per the CUDA API.
    unsafe { p.write(v) };
    Ok(())
}

fn done(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(cu::SUCCESS)
}

/// The jump the versioned aliases make to the export.
#[cfg(target_arch = "x86_64")]
macro_rules! jump {
    () => {
        "jmp"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! jump {
    () => {
        "b"
    };
}

/// 0: not read yet, 1: off, 2: on.
static NULL_MODE: AtomicU8 = AtomicU8::new(0);

#[inline]
fn null_mode() -> bool {
    match NULL_MODE.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var_os("MUXFLOW_SIM_NULL_DRIVER").is_some_and(|v| v == "1");
            NULL_MODE.store(if on { 2 } else { 1 }, Relaxed);
            on
        }
    }
}

const fn same(x: &[u8], y: &[u8]) -> bool {
    if x.len() != y.len() {
        return false;
    }
    let mut i = 0;
    while i < x.len() {
        if x[i] != y[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The entry points null mode leaves working (a loader needs them).
const fn is_lookup(name: &str) -> bool {
    same(name.as_bytes(), b"cuGetProcAddress") || same(name.as_bytes(), b"cuGetProcAddress_v2")
}

macro_rules! cuda_exports {
    ($( [$base:literal, $since:literal, $pt:literal] fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block )*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        #[repr(usize)]
        enum ExportId { $($name),* }
        const EXPORTS: usize = [$(stringify!($name)),*].len();
        /// Calls each export received (by [`ExportId`]).
        static CALLS: [AtomicU64; EXPORTS] = [const { AtomicU64::new(0) }; EXPORTS];
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                const LOOKUP: bool = is_lookup(stringify!($name));
                if !LOOKUP && null_mode() {
                    return cu::SUCCESS;
                }
                CALLS[ExportId::$name as usize].fetch_add(1, Relaxed);
                guard(|| $body)
            }
            // `<name>@SIMGPU_1`: the same function under a (non-default)
            // symbol version, for dlvsym (version node from build.rs).
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            core::arch::global_asm!(
                concat!(".globl simgpu_versioned_", stringify!($name)),
                concat!(".type simgpu_versioned_", stringify!($name), ", %function"),
                concat!("simgpu_versioned_", stringify!($name), ":"),
                concat!(jump!(), " ", stringify!($name)),
                concat!(".symver simgpu_versioned_", stringify!($name), ", ", stringify!($name), "@SIMGPU_1"),
            );
        )*
        /// How many calls the export named `name` received (None: no such export).
        pub fn calls_of(name: &str) -> Option<u64> {
            const NAMES: [&str; EXPORTS] = [$(stringify!($name)),*];
            NAMES.iter().position(|n| *n == name).map(|i| CALLS[i].load(Relaxed))
        }

        /// The table of every exported entry point.
        pub fn entry_points() -> &'static [Entry] {
            static T: std::sync::OnceLock<Vec<Entry>> = std::sync::OnceLock::new();
            T.get_or_init(|| vec![$(Entry {
                symbol: stringify!($name),
                base: $base,
                since: $since,
                per_thread: $pt,
                addr: $name as *const () as usize,
            }),*])
        }
    };
}

/// Test hook: how many calls the export `name` received so far in this
/// process; `u64::MAX` for a name the fake does not export.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn simgpu_calls(name: *const c_char) -> u64 {
    if name.is_null() {
        return u64::MAX;
    }
    // SAFETY: NUL-terminated per the contract.
    let n = unsafe { CStr::from_ptr(name) };
    n.to_str().ok().and_then(calls_of).unwrap_or(u64::MAX)
}

pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub const STATUS_SUCCESS: c_int = 0;
pub const STATUS_SYMBOL_NOT_FOUND: c_int = 1;
pub const STATUS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// Picks the variant the real driver would: the newest one not newer than
/// `version`, the per-thread one when that flag is given and one exists.
pub fn resolve(name: &str, version: c_int, flags: u64) -> Result<&'static Entry, c_int> {
    let all: Vec<&Entry> = entry_points().iter().filter(|e| e.base == name).collect();
    if all.is_empty() {
        return Err(STATUS_SYMBOL_NOT_FOUND);
    }
    let pt = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0
        && all.iter().any(|e| e.per_thread);
    all.into_iter()
        .filter(|e| e.per_thread == pt && e.since <= version)
        .max_by_key(|e| e.since)
        .ok_or(STATUS_VERSION_NOT_SUFFICIENT)
}

unsafe fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if pfn.is_null() || symbol.is_null() {
        return cu::INVALID_VALUE;
    }
    // SAFETY: non-null NUL-terminated string per the API.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let (ptr, st, rc) = match resolve(&name, version, flags) {
        Ok(e) => (e.addr as *mut c_void, STATUS_SUCCESS, cu::SUCCESS),
        Err(st) => (std::ptr::null_mut(), st, cu::NOT_FOUND),
    };
    // SAFETY: both pointers checked non-null (status is optional).
    unsafe {
        pfn.write(ptr);
        if !status.is_null() {
            status.write(st);
        }
    }
    rc
}

// The driver ABI's structures, as xCUDA declares them.
#[path = "../../../xcuda/src/abi.rs"]
mod abi;
pub use abi::{
    Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, LaunchConfig, MemAllocNodeParams,
};

pub type Handle = *mut c_void;
type Dptr = u64;

/// Allocates `size` bytes of `kind` and writes the handle through `out`.
unsafe fn alloc_out(out: *mut u64, size: u64, kind: Mem) -> CUresult {
    // SAFETY: the caller's out-pointer (checked for null by put).
    done(mem_alloc(size, kind).and_then(|a| unsafe { put(out, a) }))
}

/// An array (or mipmapped array) of `levels` levels from a 3D descriptor.
unsafe fn array_3d(out: *mut Handle, d: *const Array3dDesc, levels: c_uint, kind: Mem) -> CUresult {
    // SAFETY: a descriptor the caller passed, valid for this call (or null).
    let Some(d) = (unsafe { d.as_ref() }) else {
        return cu::INVALID_VALUE;
    };
    let extent = [d.width as u64, d.height as u64, d.depth as u64];
    match array_bytes(extent, d.format, d.channels, levels) {
        // SAFETY: a handle is pointer-sized; the caller's out-pointer.
        Ok(n) => unsafe { alloc_out(out as *mut u64, n, kind) },
        Err(e) => e,
    }
}

/// A v1 allocation (`CUdeviceptr_v1`, 32 bits) written through `out`.
unsafe fn alloc_out_v1(out: *mut u32, size: u64) -> CUresult {
    // SAFETY: the caller's out-pointer (checked for null by put).
    done(mem_alloc_at(size, Mem::Linear, true).and_then(|a| unsafe { put(out, a as u32) }))
}

/// A name argument as text (INVALID_VALUE when null).
unsafe fn name_of(p: *const c_char) -> Result<String, CUresult> {
    if p.is_null() {
        return Err(cu::INVALID_VALUE);
    }
    // SAFETY: non-null NUL-terminated string per the API.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    x.max(1) as u64 * y.max(1) as u64 * z.max(1) as u64
}

unsafe fn launch_ex(cfg: *const LaunchConfig, f: Handle, pt: bool) -> CUresult {
    if cfg.is_null() {
        return cu::INVALID_VALUE;
    }
    // SAFETY: non-null config per the API.
    let c = unsafe { &*cfg };
    done(launch(
        f,
        blocks(c.grid[0], c.grid[1], c.grid[2]),
        c.stream,
        pt,
    ))
}

cuda_exports! {
    ["cuInit", 2000, false] fn cuInit(_flags: c_uint) { done(init()) }
    ["cuDriverGetVersion", 2020, false] fn cuDriverGetVersion(v: *mut c_int) { done(put(v, DRIVER_VERSION)) }
    ["cuGetErrorString", 6000, false] fn cuGetErrorString(e: CUresult, s: *mut *const c_char) {
        match error_strings(e) { Some((_, d)) => done(put(s, d)), None => { let _ = put(s, std::ptr::null()); cu::INVALID_VALUE } }
    }
    ["cuGetErrorName", 6000, false] fn cuGetErrorName(e: CUresult, s: *mut *const c_char) {
        match error_strings(e) { Some((n, _)) => done(put(s, n)), None => { let _ = put(s, std::ptr::null()); cu::INVALID_VALUE } }
    }
    ["cuGetProcAddress", 11030, false] fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }
    ["cuGetProcAddress", 12000, false] fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) {
        proc_address(symbol, pfn, version, flags, status)
    }
    ["cuDeviceGetCount", 2000, false] fn cuDeviceGetCount(n: *mut c_int) { done(with_proc(|p| put(n, p.devs.len() as c_int))) }
    ["cuDeviceGet", 2000, false] fn cuDeviceGet(d: *mut c_int, ordinal: c_int) {
        done(with_proc(|p| { p.dev(ordinal)?; put(d, ordinal) }))
    }
    ["cuDeviceGetName", 2000, false] fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) {
        done(with_proc(|p| copy_str(name, len, &p.dev(d)?.cfg.name)))
    }
    ["cuDeviceGetUuid", 9020, false] fn cuDeviceGetUuid(uuid: *mut [u8; 16], d: c_int) { done(with_proc(|p| put(uuid, p.dev(d)?.uuid_bytes()))) }
    ["cuDeviceGetUuid", 11040, false] fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], d: c_int) { done(with_proc(|p| put(uuid, p.dev(d)?.uuid_bytes()))) }
    ["cuDeviceTotalMem", 3020, false] fn cuDeviceTotalMem_v2(bytes: *mut usize, d: c_int) {
        done(with_proc(|p| put(bytes, p.dev(d)?.cfg.memory_bytes() as usize)))
    }
    ["cuDeviceGetAttribute", 2000, false] fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) {
        done(with_proc(|p| put(v, p.attribute(d, attr)?)))
    }
    ["cuDeviceComputeCapability", 2000, false] fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, _d: c_int) {
        done(put(major, 9).and_then(|_| put(minor, 0)))
    }
    ["cuDevicePrimaryCtxRetain", 7000, false] fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, d: c_int) {
        done(primary_retain(d).and_then(|h| put(ctx, h)))
    }
    ["cuDevicePrimaryCtxRelease", 7000, false] fn cuDevicePrimaryCtxRelease(d: c_int) { done(primary_release(d)) }
    ["cuDevicePrimaryCtxRelease", 11000, false] fn cuDevicePrimaryCtxRelease_v2(d: c_int) { done(primary_release(d)) }
    ["cuDevicePrimaryCtxReset", 11000, false] fn cuDevicePrimaryCtxReset_v2(d: c_int) { done(primary_reset(d)) }
    ["cuDevicePrimaryCtxGetState", 7000, false] fn cuDevicePrimaryCtxGetState(d: c_int, flags: *mut c_uint, active: *mut c_int) {
        done(primary_state(d).and_then(|a| { put(flags, 0)?; put(active, a as c_int) }))
    }
    ["cuDevicePrimaryCtxSetFlags", 11000, false] fn cuDevicePrimaryCtxSetFlags_v2(d: c_int, _flags: c_uint) { done(with_proc(|p| p.dev(d).map(|_| ()))) }
    ["cuCtxCreate", 3020, false] fn cuCtxCreate_v2(ctx: *mut Handle, _flags: c_uint, d: c_int) { done(ctx_create(d).and_then(|h| put(ctx, h))) }
    ["cuCtxCreate", 11040, false] fn cuCtxCreate_v3(ctx: *mut Handle, _params: *mut c_void, _n: c_int, _flags: c_uint, d: c_int) {
        done(ctx_create(d).and_then(|h| put(ctx, h)))
    }
    ["cuCtxCreate", 12050, false] fn cuCtxCreate_v4(ctx: *mut Handle, _params: *mut c_void, _flags: c_uint, d: c_int) {
        done(ctx_create(d).and_then(|h| put(ctx, h)))
    }
    ["cuCtxDestroy", 4000, false] fn cuCtxDestroy_v2(ctx: Handle) { done(ctx_destroy(ctx)) }
    ["cuCtxSetCurrent", 4000, false] fn cuCtxSetCurrent(ctx: Handle) { done(ctx_set_current(ctx)) }
    ["cuCtxGetCurrent", 4000, false] fn cuCtxGetCurrent(ctx: *mut Handle) { done(put(ctx, current_ctx())) }
    ["cuCtxPushCurrent", 4000, false] fn cuCtxPushCurrent_v2(ctx: Handle) { done(ctx_push(ctx)) }
    ["cuCtxPopCurrent", 4000, false] fn cuCtxPopCurrent_v2(ctx: *mut Handle) { done(ctx_pop().and_then(|h| if ctx.is_null() { Ok(()) } else { put(ctx, h) })) }
    ["cuCtxGetDevice", 2000, false] fn cuCtxGetDevice(d: *mut c_int) { done(current_dev().and_then(|x| put(d, x as c_int))) }
    ["cuCtxSynchronize", 2000, false] fn cuCtxSynchronize() { done(ctx_synchronize()) }
    ["cuMemGetInfo", 3020, false] fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        done(mem_info().and_then(|(f, t)| { put(free, f as usize)?; put(total, t as usize) }))
    }
    ["cuMemAlloc", 3020, false] fn cuMemAlloc_v2(p: *mut Dptr, size: usize) { alloc_out(p, size as u64, Mem::Linear) }
    ["cuMemAllocPitch", 3020, false] fn cuMemAllocPitch_v2(p: *mut Dptr, pitch: *mut usize, width: usize, height: usize, _elem: c_uint) {
        let pt = width.div_ceil(512) * 512;
        match put(pitch, pt) { Ok(()) => alloc_out(p, (pt * height) as u64, Mem::Linear), Err(e) => e }
    }
    ["cuMemAllocManaged", 6000, false] fn cuMemAllocManaged(p: *mut Dptr, size: usize, _flags: c_uint) { alloc_out(p, size as u64, Mem::Linear) }
    ["cuMemAllocAsync", 11020, false] fn cuMemAllocAsync(p: *mut Dptr, size: usize, _s: Handle) { alloc_out(p, size as u64, Mem::Linear) }
    ["cuMemAllocAsync", 11020, true] fn cuMemAllocAsync_ptsz(p: *mut Dptr, size: usize, _s: Handle) { alloc_out(p, size as u64, Mem::Linear) }
    ["cuMemAllocFromPoolAsync", 11020, false] fn cuMemAllocFromPoolAsync(p: *mut Dptr, size: usize, pool: Handle, _s: Handle) {
        match pool_check(pool) { Ok(()) => alloc_out(p, size as u64, Mem::Linear), Err(e) => e }
    }
    ["cuMemAllocFromPoolAsync", 11020, true] fn cuMemAllocFromPoolAsync_ptsz(p: *mut Dptr, size: usize, pool: Handle, _s: Handle) {
        match pool_check(pool) { Ok(()) => alloc_out(p, size as u64, Mem::Linear), Err(e) => e }
    }
    ["cuMemFree", 3020, false] fn cuMemFree_v2(p: Dptr) { done(mem_free(p, Mem::Linear)) }
    ["cuMemFreeAsync", 11020, false] fn cuMemFreeAsync(p: Dptr, _s: Handle) { done(mem_free(p, Mem::Linear)) }
    ["cuMemFreeAsync", 11020, true] fn cuMemFreeAsync_ptsz(p: Dptr, _s: Handle) { done(mem_free(p, Mem::Linear)) }
    ["cuMemCreate", 10020, false] fn cuMemCreate(h: *mut u64, size: usize, _prop: *const c_void, _flags: u64) { alloc_out(h, size as u64, Mem::Vmm) }
    ["cuMemRelease", 10020, false] fn cuMemRelease(h: u64) { done(mem_free(h, Mem::Vmm)) }
    ["cuArrayCreate", 3020, false] fn cuArrayCreate_v2(a: *mut Handle, d: *const ArrayDesc) {
        match d.as_ref() {
            Some(d) => {
                let d3 = Array3dDesc { width: d.width, height: d.height, depth: 0, format: d.format, channels: d.channels, flags: 0 };
                array_3d(a, &d3, 1, Mem::Array)
            }
            None => cu::INVALID_VALUE,
        }
    }
    ["cuArray3DCreate", 3020, false] fn cuArray3DCreate_v2(a: *mut Handle, d: *const Array3dDesc) { array_3d(a, d, 1, Mem::Array) }
    ["cuArrayDestroy", 2000, false] fn cuArrayDestroy(a: Handle) { done(mem_free(a as u64, Mem::Array)) }
    ["cuMipmappedArrayCreate", 5000, false] fn cuMipmappedArrayCreate(m: *mut Handle, d: *const Array3dDesc, levels: c_uint) {
        array_3d(m, d, levels, Mem::Mipmapped)
    }
    ["cuMipmappedArrayDestroy", 5000, false] fn cuMipmappedArrayDestroy(m: Handle) { done(mem_free(m as u64, Mem::Mipmapped)) }
    ["cuMemcpyHtoD", 3020, false] fn cuMemcpyHtoD_v2(_d: Dptr, _h: *const c_void, _n: usize) { done(check_current()) }
    ["cuMemcpyHtoD", 7000, true] fn cuMemcpyHtoD_v2_ptds(_d: Dptr, _h: *const c_void, _n: usize) { done(check_current()) }
    ["cuMemcpyDtoH", 3020, false] fn cuMemcpyDtoH_v2(_h: *mut c_void, _d: Dptr, _n: usize) { done(ctx_synchronize()) }
    ["cuMemcpyDtoH", 7000, true] fn cuMemcpyDtoH_v2_ptds(_h: *mut c_void, _d: Dptr, _n: usize) { done(ctx_synchronize()) }
    ["cuModuleLoad", 2000, false] fn cuModuleLoad(m: *mut Handle, _fname: *const c_char) { done(check_current().and_then(|_| put(m, new_handle()))) }
    ["cuModuleLoadData", 2000, false] fn cuModuleLoadData(m: *mut Handle, _image: *const c_void) { done(check_current().and_then(|_| put(m, new_handle()))) }
    ["cuModuleUnload", 2000, false] fn cuModuleUnload(_m: Handle) { cu::SUCCESS }
    ["cuModuleGetFunction", 2000, false] fn cuModuleGetFunction(f: *mut Handle, _m: Handle, name: *const c_char) {
        if name.is_null() { return cu::INVALID_VALUE; }
        done(function(&CStr::from_ptr(name).to_string_lossy()).and_then(|h| put(f, h)))
    }
    ["cuLaunchKernel", 4000, false] fn cuLaunchKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint, _shm: c_uint, s: Handle, _p: *mut *mut c_void, _e: *mut *mut c_void) {
        done(launch(f, blocks(gx, gy, gz), s, false))
    }
    ["cuLaunchKernel", 7000, true] fn cuLaunchKernel_ptsz(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint, _shm: c_uint, s: Handle, _p: *mut *mut c_void, _e: *mut *mut c_void) {
        done(launch(f, blocks(gx, gy, gz), s, true))
    }
    ["cuLaunchKernelEx", 11060, false] fn cuLaunchKernelEx(cfg: *const LaunchConfig, f: Handle, _p: *mut *mut c_void, _e: *mut *mut c_void) { launch_ex(cfg, f, false) }
    ["cuLaunchKernelEx", 11060, true] fn cuLaunchKernelEx_ptsz(cfg: *const LaunchConfig, f: Handle, _p: *mut *mut c_void, _e: *mut *mut c_void) { launch_ex(cfg, f, true) }
    ["cuLaunchCooperativeKernel", 9000, false] fn cuLaunchCooperativeKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint, _shm: c_uint, s: Handle, _p: *mut *mut c_void) {
        done(launch(f, blocks(gx, gy, gz), s, false))
    }
    ["cuLaunchCooperativeKernel", 9000, true] fn cuLaunchCooperativeKernel_ptsz(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint, _shm: c_uint, s: Handle, _p: *mut *mut c_void) {
        done(launch(f, blocks(gx, gy, gz), s, true))
    }
    ["cuStreamCreate", 2000, false] fn cuStreamCreate(s: *mut Handle, _flags: c_uint) { done(stream_create().and_then(|h| put(s, h))) }
    ["cuStreamCreateWithPriority", 5050, false] fn cuStreamCreateWithPriority(s: *mut Handle, _flags: c_uint, _prio: c_int) { done(stream_create().and_then(|h| put(s, h))) }
    ["cuStreamDestroy", 4000, false] fn cuStreamDestroy_v2(s: Handle) { done(stream_destroy(s)) }
    ["cuStreamSynchronize", 2000, false] fn cuStreamSynchronize(s: Handle) { done(stream_synchronize(s, false)) }
    ["cuStreamSynchronize", 7000, true] fn cuStreamSynchronize_ptsz(s: Handle) { done(stream_synchronize(s, true)) }
    ["cuStreamQuery", 2000, false] fn cuStreamQuery(s: Handle) { done(stream_query(s, false)) }
    ["cuStreamQuery", 7000, true] fn cuStreamQuery_ptsz(s: Handle) { done(stream_query(s, true)) }
    ["cuStreamBeginCapture", 10010, false] fn cuStreamBeginCapture_v2(s: Handle, _mode: c_int) { done(begin_capture(s, false)) }
    ["cuStreamBeginCapture", 10010, true] fn cuStreamBeginCapture_v2_ptsz(s: Handle, _mode: c_int) { done(begin_capture(s, true)) }
    ["cuStreamEndCapture", 10000, false] fn cuStreamEndCapture(s: Handle, g: *mut Handle) { done(end_capture(s, false).and_then(|h| put(g, h))) }
    ["cuStreamEndCapture", 10000, true] fn cuStreamEndCapture_ptsz(s: Handle, g: *mut Handle) { done(end_capture(s, true).and_then(|h| put(g, h))) }
    ["cuGraphInstantiateWithFlags", 11040, false] fn cuGraphInstantiateWithFlags(e: *mut Handle, g: Handle, _flags: u64) {
        done(graph_instantiate(g).and_then(|h| put(e, h)))
    }
    ["cuGraphLaunch", 10000, false] fn cuGraphLaunch(e: Handle, s: Handle) { done(graph_launch(e, s, false)) }
    ["cuGraphLaunch", 10000, true] fn cuGraphLaunch_ptsz(e: Handle, s: Handle) { done(graph_launch(e, s, true)) }
    ["cuGraphExecDestroy", 10000, false] fn cuGraphExecDestroy(e: Handle) { done(graph_destroy(e)) }
    ["cuGraphDestroy", 10000, false] fn cuGraphDestroy(g: Handle) { done(graph_destroy(g)) }
    // The un-suffixed v1 entry points (CUDA 3.1 and older ABI): 32-bit sizes and device pointers.
    ["cuMemGetInfo", 2000, false] fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
        let narrow = |x: u64| x.min(u32::MAX as u64) as c_uint;
        done(mem_info().and_then(|(f, t)| { put(free, narrow(f))?; put(total, narrow(t)) }))
    }
    ["cuMemAlloc", 2000, false] fn cuMemAlloc(p: *mut u32, size: c_uint) { alloc_out_v1(p, size as u64) }
    ["cuMemAllocPitch", 2000, false] fn cuMemAllocPitch(p: *mut u32, pitch: *mut c_uint, width: c_uint, height: c_uint, _elem: c_uint) {
        let pt = width.div_ceil(512) * 512;
        match put(pitch, pt) { Ok(()) => alloc_out_v1(p, pt as u64 * height as u64), Err(e) => e }
    }
    ["cuMemFree", 2000, false] fn cuMemFree(p: u32) { done(mem_free(p as u64, Mem::Linear)) }
    ["cuCtxCreate", 2000, false] fn cuCtxCreate(ctx: *mut Handle, _flags: c_uint, d: c_int) { done(ctx_create(d).and_then(|h| put(ctx, h))) }
    ["cuCtxDestroy", 2000, false] fn cuCtxDestroy(ctx: Handle) { done(ctx_destroy(ctx)) }
    ["cuDevicePrimaryCtxReset", 7000, false] fn cuDevicePrimaryCtxReset(d: c_int) { done(primary_reset(d)) }
    ["cuArrayCreate", 2000, false] fn cuArrayCreate(a: *mut Handle, d: *const ArrayDescV1) {
        match d.as_ref() {
            Some(d) => {
                let d3 = Array3dDesc { width: d.width as usize, height: d.height as usize, depth: 0, format: d.format, channels: d.channels, flags: 0 };
                array_3d(a, &d3, 1, Mem::Array)
            }
            None => cu::INVALID_VALUE,
        }
    }
    ["cuArray3DCreate", 2000, false] fn cuArray3DCreate(a: *mut Handle, d: *const Array3dDescV1) {
        match d.as_ref() {
            Some(d) => {
                let d3 = Array3dDesc { width: d.width as usize, height: d.height as usize, depth: d.depth as usize, format: d.format, channels: d.channels, flags: d.flags };
                array_3d(a, &d3, 1, Mem::Array)
            }
            None => cu::INVALID_VALUE,
        }
    }
    // Pinned host memory: host memory, not the GPU's.
    ["cuMemAllocHost", 2000, false] fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) { done(host_alloc(size as u64).and_then(|h| put(pp, h))) }
    ["cuMemAllocHost", 3020, false] fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) { done(host_alloc(size as u64).and_then(|h| put(pp, h))) }
    ["cuMemHostAlloc", 2020, false] fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, _flags: c_uint) { done(host_alloc(size as u64).and_then(|h| put(pp, h))) }
    ["cuMemFreeHost", 2000, false] fn cuMemFreeHost(p: *mut c_void) { done(host_free(p)) }
    // Memory pools created by the application.
    ["cuMemPoolCreate", 11020, false] fn cuMemPoolCreate(pool: *mut Handle, props: *const c_void) {
        if props.is_null() { return cu::INVALID_VALUE; }
        done(pool_create().and_then(|h| put(pool, h)))
    }
    ["cuMemPoolDestroy", 11020, false] fn cuMemPoolDestroy(pool: Handle) { done(pool_destroy(pool)) }
    // The virtual memory management path: address ranges, mappings, access.
    ["cuMemAddressReserve", 10020, false] fn cuMemAddressReserve(ptr: *mut Dptr, size: usize, _align: usize, _addr: Dptr, _flags: u64) {
        done(address_reserve(size as u64).and_then(|a| put(ptr, a)))
    }
    ["cuMemAddressFree", 10020, false] fn cuMemAddressFree(ptr: Dptr, size: usize) { done(address_free(ptr, size as u64)) }
    ["cuMemMap", 10020, false] fn cuMemMap(ptr: Dptr, size: usize, _offset: usize, h: u64, _flags: u64) { done(map(ptr, size as u64, h)) }
    ["cuMemSetAccess", 10020, false] fn cuMemSetAccess(ptr: Dptr, _size: usize, desc: *const c_void, count: usize) {
        if desc.is_null() || count == 0 { return cu::INVALID_VALUE; }
        done(set_access(ptr))
    }
    ["cuMemUnmap", 10020, false] fn cuMemUnmap(ptr: Dptr, _size: usize) { done(unmap(ptr)) }
    // Graph memory nodes: the model takes the memory when the node is added
    // and gives it back at its free node (or cuMemFree of the address).
    ["cuGraphCreate", 10000, false] fn cuGraphCreate(g: *mut Handle, _flags: c_uint) { done(graph_create().and_then(|h| put(g, h))) }
    ["cuGraphAddMemAllocNode", 11040, false] fn cuGraphAddMemAllocNode(node: *mut Handle, g: Handle, _deps: *const Handle, _n: usize, params: *mut MemAllocNodeParams) {
        let Some(prm) = params.as_mut() else { return cu::INVALID_VALUE; };
        done(graph_node(g).and_then(|n| {
            prm.dptr = mem_alloc(prm.bytesize as u64, Mem::Linear)?;
            put(node, n)
        }))
    }
    ["cuGraphAddMemFreeNode", 11040, false] fn cuGraphAddMemFreeNode(node: *mut Handle, g: Handle, _deps: *const Handle, _n: usize, dptr: Dptr) {
        done(graph_node(g).and_then(|n| { mem_free(dptr, Mem::Linear)?; put(node, n) }))
    }
    // Legacy launches (execution configuration set beforehand; the fake ignores it).
    ["cuLaunch", 2000, false] fn cuLaunch(f: Handle) { done(launch(f, 1, std::ptr::null_mut(), false)) }
    ["cuLaunchGrid", 2000, false] fn cuLaunchGrid(f: Handle, w: c_int, h: c_int) {
        done(launch(f, blocks(w.max(1) as c_uint, h.max(1) as c_uint, 1), std::ptr::null_mut(), false))
    }
    ["cuLaunchGridAsync", 2000, false] fn cuLaunchGridAsync(f: Handle, w: c_int, h: c_int, s: Handle) {
        done(launch(f, blocks(w.max(1) as c_uint, h.max(1) as c_uint, 1), s, false))
    }
    // CUDA 12 lazy loading: libraries and context-independent kernels.
    ["cuLibraryLoadData", 12000, false] fn cuLibraryLoadData(lib: *mut Handle, code: *const c_void, _jo: *mut c_int, _jv: *mut *mut c_void, _nj: c_uint, _lo: *mut c_int, _lv: *mut *mut c_void, _nl: c_uint) {
        if code.is_null() { return cu::INVALID_VALUE; }
        done(init().and_then(|_| put(lib, new_library())))
    }
    ["cuLibraryLoadFromFile", 12000, false] fn cuLibraryLoadFromFile(lib: *mut Handle, file: *const c_char, _jo: *mut c_int, _jv: *mut *mut c_void, _nj: c_uint, _lo: *mut c_int, _lv: *mut *mut c_void, _nl: c_uint) {
        done(name_of(file).and_then(|_| init()).and_then(|_| put(lib, new_library())))
    }
    ["cuLibraryGetKernel", 12000, false] fn cuLibraryGetKernel(k: *mut Handle, lib: Handle, name: *const c_char) {
        done(library_check(lib).and_then(|_| name_of(name)).and_then(|n| kernel(&n)).and_then(|h| put(k, h)))
    }
    ["cuLibraryUnload", 12000, false] fn cuLibraryUnload(lib: Handle) { done(library_unload(lib)) }
    ["cuKernelGetFunction", 12000, false] fn cuKernelGetFunction(f: *mut Handle, k: Handle) { done(put(f, k)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, v: c_int, flags: u64) -> Option<&'static str> {
        resolve(name, v, flags).ok().map(|e| e.symbol)
    }

    #[test]
    fn variants_by_version_and_flag() {
        assert_eq!(sym("cuMemAlloc", 12000, 0), Some("cuMemAlloc_v2"));
        // Before CUDA 3.2: the v1 (32-bit) variant.
        assert_eq!(sym("cuMemAlloc", 3000, 0), Some("cuMemAlloc"));
        assert_eq!(sym("cuCtxCreate", 3000, 0), Some("cuCtxCreate"));
        assert_eq!(
            resolve("cuMemAlloc", 1000, 0).unwrap_err(),
            STATUS_VERSION_NOT_SUFFICIENT
        );
        assert_eq!(sym("cuLibraryLoadData", 11080, 0), None);
        assert_eq!(sym("cuCtxCreate", 11000, 0), Some("cuCtxCreate_v2"));
        assert_eq!(sym("cuCtxCreate", 11040, 0), Some("cuCtxCreate_v3"));
        assert_eq!(sym("cuCtxCreate", 12050, 0), Some("cuCtxCreate_v4"));
        assert_eq!(sym("cuGetProcAddress", 11080, 0), Some("cuGetProcAddress"));
        assert_eq!(
            sym("cuGetProcAddress", 12000, 0),
            Some("cuGetProcAddress_v2")
        );
        assert_eq!(sym("cuMemGetInfo", 12000, 0), Some("cuMemGetInfo_v2"));
        assert_eq!(sym("cuLaunchKernel", 12000, 0), Some("cuLaunchKernel"));
        assert_eq!(sym("cuLaunchKernel", 12000, 1), Some("cuLaunchKernel"));
        assert_eq!(sym("cuLaunchKernel", 12000, 2), Some("cuLaunchKernel_ptsz"));
        assert_eq!(sym("cuGraphLaunch", 12000, 2), Some("cuGraphLaunch_ptsz"));
        assert_eq!(
            sym("cuMemAllocAsync", 12000, 2),
            Some("cuMemAllocAsync_ptsz")
        );
        assert_eq!(sym("cuMemcpyHtoD", 12000, 2), Some("cuMemcpyHtoD_v2_ptds"));
        // No per-thread variant: the flag falls back to the normal one.
        assert_eq!(sym("cuMemAlloc", 12000, 2), Some("cuMemAlloc_v2"));
        assert_eq!(
            sym("cuDevicePrimaryCtxRelease", 12000, 0),
            Some("cuDevicePrimaryCtxRelease_v2")
        );
        assert_eq!(
            resolve("cuNoSuchThing", 12000, 0).unwrap_err(),
            STATUS_SYMBOL_NOT_FOUND
        );
        // Every export is its own function (no aliases), and counts its calls.
        let mut addrs: Vec<_> = entry_points().iter().map(|e| e.addr).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), entry_points().len());
        let before = calls_of("cuDriverGetVersion").unwrap();
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuDriverGetVersion(&mut v) }, cu::SUCCESS);
        assert_eq!(calls_of("cuDriverGetVersion"), Some(before + 1));
        assert_eq!(calls_of("cuNoSuchThing"), None);
        // Exported names are unique.
        let mut names: Vec<_> = entry_points().iter().map(|e| e.symbol).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), entry_points().len());
    }

    #[test]
    fn array_sizes() {
        const FLOAT: u32 = 0x20;
        assert_eq!(array_bytes([4096, 3072, 0], FLOAT, 1, 1), Ok(48 << 20));
        assert_eq!(array_bytes([100, 0, 0], 0x01, 4, 1), Ok(400));
        // Mipmap levels halve every extent down to 1: 8x4 + 4x2 + 2x1 + 1x1.
        assert_eq!(array_bytes([8, 4, 0], 0x10, 1, 4), Ok((32 + 8 + 2 + 1) * 2));
        for bad in [
            ([0, 1, 1], FLOAT, 1, 1),
            ([1, 1, 1], 0xb0, 1, 1),
            ([1, 1, 1], FLOAT, 5, 1),
            ([1, 1, 1], FLOAT, 1, 0),
        ] {
            assert_eq!(
                array_bytes(bad.0, bad.1, bad.2, bad.3),
                Err(cu::INVALID_VALUE),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn proc_address_returns_own_functions() {
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut st: c_int = -1;
        let name = c"cuLaunchKernel";
        // SAFETY: valid pointers to locals.
        let rc = unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut p, 12040, 2, &mut st) };
        assert_eq!((rc, st), (cu::SUCCESS, STATUS_SUCCESS));
        assert_eq!(p as usize, cuLaunchKernel_ptsz as *const () as usize);
        let bad = c"cuBogus";
        // SAFETY: as above.
        let rc = unsafe { cuGetProcAddress_v2(bad.as_ptr(), &mut p, 12040, 0, &mut st) };
        assert_eq!(
            (rc, st, p.is_null()),
            (cu::NOT_FOUND, STATUS_SYMBOL_NOT_FOUND, true)
        );
    }
}
