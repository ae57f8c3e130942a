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

// The driver ABI, declared once (the entry-point list, structures, codes),
// as xCUDA declares it.
pub use cuda_abi as abi;
mod driver;
mod imp;

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

/// The exports, generated from the one entry-point list (`cuda_entry_points!`
/// in cuda-abi/src/lib.rs): each calls its implementation in [`imp`].
macro_rules! cuda_exports {
    ($( {$name:ident, $base:literal, $since:literal, $pt:literal, $action:ident $(( $($aa:tt)* ))?, ( $($arg:ident : $ty:ty),* $(,)? )} )*) => {
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
                guard(|| unsafe { imp::$name($($arg),*) })
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

/// Test hook: what this process holds on device `dev` by the driver's
/// own books (`used`) and the most it held at once (`peak`), in bytes;
/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
///
/// # Safety
/// `used` and `peak` are valid out-pointers (or null: INVALID_VALUE).
#[no_mangle]
pub unsafe extern "C" fn simgpu_mem_books(dev: c_int, used: *mut u64, peak: *mut u64) -> CUresult {
    guard(|| {
        // SAFETY: the caller's out-pointers (checked for null by put).
        done(mem_books(dev).and_then(|(u, p)| unsafe { put(used, u).and_then(|()| put(peak, p)) }))
    })
}

pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub const STATUS_SUCCESS: c_int = 0;
pub const STATUS_SYMBOL_NOT_FOUND: c_int = 1;
pub const STATUS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// Names CUDA renamed in its headers, which the driver answers with the new
/// function from that version on: (asked, since, answered). CUDA 12's
/// cuda.h has `#define cuGraphInstantiate cuGraphInstantiateWithFlags`.
const RENAMED: &[(&str, c_int, &str)] =
    &[("cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags")];

/// Picks the variant the real driver would: the newest one not newer than
/// `version`, the per-thread one when that flag is given and one exists.
pub fn resolve(name: &str, version: c_int, flags: u64) -> Result<&'static Entry, c_int> {
    let name = match RENAMED.iter().find(|r| r.0 == name && version >= r.1) {
        Some(r) => r.2,
        None => name,
    };
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

pub use abi::types::{Dptr, Handle};
pub use abi::{
    Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, LaunchConfig, MemAllocNodeParams,
};

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

cuda_abi::cuda_entry_points!(cuda_exports);

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
