//! CUDA driver ABI structures, once: xCUDA reads them, and the simulated
//! driver and xcuda-probe include this file by path (the fake cannot depend
//! on this crate; the probe must not link it, whose exports would interpose
//! inside the probe itself). Only `core` types.

use core::ffi::{c_uint, c_void};

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `CUlaunchConfig` (`cuLaunchKernelEx`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: *mut c_void,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}
