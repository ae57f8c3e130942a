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

/// `CUDA_ARRAY_DESCRIPTOR_v1` (the un-suffixed `cuArrayCreate`): 32-bit extents.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (the un-suffixed `cuArray3DCreate`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDescV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`cuGraphAddMemAllocNode`): `bytesize` in,
/// `dptr` out. `CUmemPoolProps` is 88 bytes (two enums, a location, a
/// pointer, 64 reserved bytes) and only passed through.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocNodeParams {
    pub pool_props: [u8; 88],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}
