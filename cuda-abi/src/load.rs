//! Reaching the CUDA driver the way frameworks do: `dlopen("libcuda.so.1")`
//! and every entry point through `cuGetProcAddress` (or `_v2`) found with
//! `dlsym` on that handle. One loader for `muxflow-workload` and xCUDA's
//! probe.

use std::ffi::{c_int, c_void, CStr};

/// `cuGetProcAddress` (its type from the one entry-point list).
pub type GetProc = crate::fnty::cuGetProcAddress;
/// `cuGetProcAddress_v2` (with the symbol status out-parameter).
pub type GetProc2 = crate::fnty::cuGetProcAddress_v2;
/// `cuLaunchKernel(f, grid xyz, block xyz, shared bytes, stream, params, extra)`.
pub type LaunchKernel = crate::fnty::cuLaunchKernel;

/// The CUDA version the loaders ask entry points for (12.4).
pub const CUDA_VERSION: c_int = 12040;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: the `_ptsz`/`_ptds` variants.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// The driver library, opened `RTLD_NOW | RTLD_LOCAL` and kept for the process.
#[derive(Debug, Clone, Copy)]
pub struct Driver {
    handle: *mut c_void,
}

/// The driver's `cuGetProcAddress`, either version.
#[derive(Debug, Clone, Copy)]
pub enum ProcAddress {
    V1(GetProc),
    V2(GetProc2),
}

impl Driver {
    pub fn open() -> Result<Driver, String> {
        Driver::open_with(libc::RTLD_NOW | libc::RTLD_LOCAL)
    }

    /// With other `dlopen` flags (e.g. `RTLD_DEEPBIND`, as some frameworks use).
    pub fn open_with(flags: c_int) -> Result<Driver, String> {
        // SAFETY: dlopen with a NUL-terminated name; the handle is never closed.
        let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), flags) };
        if handle.is_null() {
            // SAFETY: dlerror after a failed dlopen returns a message or null.
            let e = unsafe { libc::dlerror() };
            let why = if e.is_null() {
                "unknown error".into()
            } else {
                // SAFETY: dlerror's message is NUL-terminated.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            return Err(format!("dlopen(libcuda.so.1): {why}"));
        }
        Ok(Driver { handle })
    }

    /// `dlsym(handle, name)`; 0 when absent.
    pub fn dlsym(&self, name: &CStr) -> usize {
        // SAFETY: dlsym on our open handle with a NUL-terminated name.
        unsafe { libc::dlsym(self.handle, name.as_ptr()) as usize }
    }

    /// `dlvsym(handle, name, version)`; 0 when absent.
    pub fn dlvsym(&self, name: &CStr, version: &CStr) -> usize {
        // SAFETY: dlvsym on our open handle with NUL-terminated strings.
        unsafe { libc::dlvsym(self.handle, name.as_ptr(), version.as_ptr()) as usize }
    }

    /// `cuGetProcAddress` (or `_v2`) as a framework finds it: dlsym on the handle.
    pub fn proc_address(&self, v2: bool) -> Result<ProcAddress, String> {
        let name = if v2 {
            c"cuGetProcAddress_v2"
        } else {
            c"cuGetProcAddress"
        };
        match self.dlsym(name) {
            0 => Err(format!("libcuda.so.1 has no {}", name.to_string_lossy())),
            // SAFETY: the driver's export of that name, of that C signature.
            p if v2 => Ok(ProcAddress::V2(unsafe {
                std::mem::transmute::<usize, GetProc2>(p)
            })),
            // SAFETY: as above.
            p => Ok(ProcAddress::V1(unsafe {
                std::mem::transmute::<usize, GetProc>(p)
            })),
        }
    }
}

impl ProcAddress {
    /// The driver's entry point for base name `name` at `version` with
    /// `flags`; 0 when it has none.
    pub fn resolve(&self, name: &CStr, version: c_int, flags: u64) -> usize {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: cuGetProcAddress(_v2) with a NUL-terminated name and valid
        // out-pointers.
        let rc = unsafe {
            match *self {
                ProcAddress::V1(f) => f(name.as_ptr(), &mut p, version, flags),
                ProcAddress::V2(f) => {
                    let mut status: c_int = -1;
                    f(name.as_ptr(), &mut p, version, flags, &mut status)
                }
            }
        };
        if rc == 0 {
            p as usize
        } else {
            0
        }
    }
}

/// An entry point's address as its C function-pointer type `T`.
///
/// # Safety
/// `addr` must be a non-zero function of exactly the signature `T` declares.
pub unsafe fn as_fn<T: Copy>(addr: usize) -> T {
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<usize>());
    // SAFETY: per the contract, T is a function pointer to what `addr` is.
    unsafe { std::mem::transmute_copy(&addr) }
}
