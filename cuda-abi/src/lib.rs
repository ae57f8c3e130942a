//! The CUDA driver ABI, declared once: every entry point muxflow knows
//! (`cuda_entry_points!`: name, base name, CUDA version, per-thread-stream
//! variant, what xCUDA does with it, C signature), the structures they take
//! and the result codes. xCUDA's hook table, the simulated driver's exports
//! and `cuGetProcAddress` table, and the loaders' function types
//! ([`fnty`]) are generated from this one list; xcuda-probe's link stub is
//! generated from this file's text (`simgpu/build.rs`). Its own crate, with
//! no exported symbol, so that the shim, the simulated driver, the
//! simulator's loader ([`load`]) and the probe all use it without depending
//! on one another (the probe must not link the shim, whose exports would
//! interpose inside the probe itself). Only `core` types in the list.
//!
//! Adding an entry point is one line here (the fake then needs its
//! implementation, `simgpu/fakecuda/src/imp.rs`; a hooked one its test).
#![allow(dead_code, non_camel_case_types, non_upper_case_globals)]

use core::ffi::{c_uint, c_void};

pub mod load;

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

/// The types the entry-point list names.
pub mod types {
    pub use super::{
        Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, LaunchConfig, MemAllocNodeParams,
    };
    pub use core::ffi::{c_char, c_int, c_uint, c_void};
    /// CUresult as it crosses the ABI: a raw code, so codes a newer driver
    /// adds pass through untouched.
    pub type CUresult = u32;
    /// An opaque handle (context, stream, function, graph, array, pool...).
    pub type Handle = *mut c_void;
    /// `CUdeviceptr` (64-bit; the v1 entry points take `u32`).
    pub type Dptr = u64;
}

/// CUresult codes (cuda.h), once.
pub mod cu {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const NOT_INITIALIZED: u32 = 3;
    /// Returned by xCUDA to launches once the graceful exit released the contexts.
    pub const DEINITIALIZED: u32 = 4;
    pub const DEVICE_UNAVAILABLE: u32 = 46;
    pub const NO_DEVICE: u32 = 100;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const ECC_UNCORRECTABLE: u32 = 214;
    pub const INVALID_HANDLE: u32 = 400;
    pub const NOT_FOUND: u32 = 500;
    pub const NOT_READY: u32 = 600;
    pub const ILLEGAL_ADDRESS: u32 = 700;
    pub const LAUNCH_FAILED: u32 = 719;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const MPS_CONNECTION_FAILED: u32 = 805;
    pub const MPS_CLIENT_TERMINATED: u32 = 810;
    pub const STREAM_CAPTURE_INVALIDATED: u32 = 901;
    pub const GRAPH_EXEC_UPDATE_FAILURE: u32 = 910;
    /// cuda.h: a client of a daemon in static SM partitioning mode without
    /// a valid `CUDA_MPS_SM_PARTITION` (simgpu/README.md says where that
    /// is a guess).
    pub const INVALID_RESOURCE_CONFIGURATION: u32 = 915;
    pub const UNKNOWN: u32 = 999;
}

/// Calls `$callback!` with every entry point, one per line:
/// `{symbol, "base name", since (1000*major + 10*minor), per-thread
/// default-stream variant, xCUDA action, (C arguments)}`. Actions:
/// `init`, `lookup(name, pfn)`, `gate`, `count(kind, size, out)`,
/// `pitch(out, pitch, width, height)`, `array(kind, out, descriptor,
/// levels)`, `free(kind, handle)`, `cap(free, total)`,
/// `retained`/`released`/`reset(device)`, `created`/`destroyed(ctx)`,
/// `gate` / `gate(stream, per-thread)` (the launch gate and the bounded
/// offline queue on that stream: `muxflow_xcuda::state::queue`; bare: the
/// legacy default stream), `sync` (ends an online busy period: `muxflow_xcuda::state::online`); graph
/// memory (`muxflow_xcuda::state::graphmem`): `stream_alloc(size, out, stream,
/// per-thread)`, `stream_free(ptr, stream, per-thread)`, `graph_alloc(graph,
/// params)`, `graph_free(graph, ptr)`, `capture_begin(stream, per-thread)`,
/// `capture_begin_to(stream, graph, per-thread)`, `capture_end(stream,
/// graph out, per-thread)`, `instantiate(exec out, graph)`,
/// `exec_update(exec, graph)`, `graph_launch(exec, stream, per-thread)` (gated too), `exec_destroyed(exec)`,
/// `graph_destroyed(graph)`, `trim(device)`; `pass` (not hooked, on purpose; the
/// driver's function may still be called by xCUDA itself). Every one
/// returns a `CUresult`.
#[macro_export]
macro_rules! cuda_entry_points {
    ($callback:ident) => {
        $callback! {
            {cuInit, "cuInit", 2000, false, init, (flags: c_uint)}
            {cuDriverGetVersion, "cuDriverGetVersion", 2020, false, pass, (v: *mut c_int)}
            {cuGetErrorString, "cuGetErrorString", 6000, false, pass, (e: CUresult, s: *mut *const c_char)}
            {cuGetErrorName, "cuGetErrorName", 6000, false, pass, (e: CUresult, s: *mut *const c_char)}
            {cuGetProcAddress, "cuGetProcAddress", 11030, false, lookup(symbol, pfn), (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64)}
            {cuGetProcAddress_v2, "cuGetProcAddress", 12000, false, lookup(symbol, pfn), (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int)}
            {cuDeviceGetCount, "cuDeviceGetCount", 2000, false, pass, (n: *mut c_int)}
            {cuDeviceGet, "cuDeviceGet", 2000, false, pass, (d: *mut c_int, ordinal: c_int)}
            {cuDeviceGetName, "cuDeviceGetName", 2000, false, pass, (name: *mut c_char, len: c_int, d: c_int)}
            {cuDeviceGetUuid, "cuDeviceGetUuid", 9020, false, pass, (uuid: *mut [u8; 16], d: c_int)}
            {cuDeviceGetUuid_v2, "cuDeviceGetUuid", 11040, false, pass, (uuid: *mut [u8; 16], d: c_int)}
            {cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, false, pass, (bytes: *mut usize, d: c_int)}
            {cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000, false, pass, (v: *mut c_int, attr: c_int, d: c_int)}
            {cuDeviceComputeCapability, "cuDeviceComputeCapability", 2000, false, pass, (major: *mut c_int, minor: *mut c_int, d: c_int)}
            {cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, false, retained(d), (ctx: *mut Handle, d: c_int)}
            {cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, false, released(d), (d: c_int)}
            {cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, false, released(d), (d: c_int)}
            {cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, false, reset(d), (d: c_int)}
            {cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 7000, false, pass, (d: c_int, flags: *mut c_uint, active: *mut c_int)}
            {cuDevicePrimaryCtxSetFlags_v2, "cuDevicePrimaryCtxSetFlags", 11000, false, pass, (d: c_int, flags: c_uint)}
            {cuCtxCreate_v2, "cuCtxCreate", 3020, false, created(ctx), (ctx: *mut Handle, flags: c_uint, d: c_int)}
            {cuCtxCreate_v3, "cuCtxCreate", 11040, false, created(ctx), (ctx: *mut Handle, params: *mut c_void, n: c_int, flags: c_uint, d: c_int)}
            {cuCtxCreate_v4, "cuCtxCreate", 12050, false, created(ctx), (ctx: *mut Handle, params: *mut c_void, flags: c_uint, d: c_int)}
            {cuCtxDestroy_v2, "cuCtxDestroy", 4000, false, destroyed(ctx), (ctx: Handle)}
            {cuCtxSetCurrent, "cuCtxSetCurrent", 4000, false, pass, (ctx: Handle)}
            {cuCtxGetCurrent, "cuCtxGetCurrent", 4000, false, pass, (ctx: *mut Handle)}
            {cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, false, pass, (ctx: Handle)}
            {cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, false, pass, (ctx: *mut Handle)}
            {cuCtxGetDevice, "cuCtxGetDevice", 2000, false, pass, (d: *mut c_int)}
            {cuCtxSynchronize, "cuCtxSynchronize", 2000, false, sync, ()}
            {cuMemGetInfo_v2, "cuMemGetInfo", 3020, false, cap(free_bytes, total_bytes), (free_bytes: *mut usize, total_bytes: *mut usize)}
            {cuMemAlloc_v2, "cuMemAlloc", 3020, false, count(Device, size, p), (p: *mut Dptr, size: usize)}
            {cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, false, pitch(p, pitch, width, height), (p: *mut Dptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint)}
            {cuMemAllocManaged, "cuMemAllocManaged", 6000, false, count(Device, size, p), (p: *mut Dptr, size: usize, flags: c_uint)}
            {cuMemAllocAsync, "cuMemAllocAsync", 11020, false, stream_alloc(size, p, s, false), (p: *mut Dptr, size: usize, s: Handle)}
            {cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, true, stream_alloc(size, p, s, true), (p: *mut Dptr, size: usize, s: Handle)}
            {cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, false, stream_alloc(size, p, s, false), (p: *mut Dptr, size: usize, pool: Handle, s: Handle)}
            {cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, true, stream_alloc(size, p, s, true), (p: *mut Dptr, size: usize, pool: Handle, s: Handle)}
            {cuMemFree_v2, "cuMemFree", 3020, false, free(Device, p), (p: Dptr)}
            {cuMemFreeAsync, "cuMemFreeAsync", 11020, false, stream_free(p, s, false), (p: Dptr, s: Handle)}
            {cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, true, stream_free(p, s, true), (p: Dptr, s: Handle)}
            {cuMemCreate, "cuMemCreate", 10020, false, count(Vmm, size, h), (h: *mut u64, size: usize, prop: *const c_void, flags: u64)}
            {cuMemRelease, "cuMemRelease", 10020, false, free(Vmm, h), (h: u64)}
            {cuArrayCreate_v2, "cuArrayCreate", 3020, false, array(Array, a, d, 1), (a: *mut Handle, d: *const ArrayDesc)}
            {cuArray3DCreate_v2, "cuArray3DCreate", 3020, false, array(Array, a, d, 1), (a: *mut Handle, d: *const Array3dDesc)}
            {cuArrayDestroy, "cuArrayDestroy", 2000, false, free(Array, a), (a: Handle)}
            {cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, false, array(Mipmapped, m, d, levels), (m: *mut Handle, d: *const Array3dDesc, levels: c_uint)}
            {cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, false, free(Mipmapped, m), (m: Handle)}
            {cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, false, pass, (d: Dptr, h: *const c_void, n: usize)}
            {cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, true, pass, (d: Dptr, h: *const c_void, n: usize)}
            {cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, false, pass, (h: *mut c_void, d: Dptr, n: usize)}
            {cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, true, pass, (h: *mut c_void, d: Dptr, n: usize)}
            {cuModuleLoad, "cuModuleLoad", 2000, false, pass, (m: *mut Handle, fname: *const c_char)}
            {cuModuleLoadData, "cuModuleLoadData", 2000, false, pass, (m: *mut Handle, image: *const c_void)}
            {cuModuleUnload, "cuModuleUnload", 2000, false, pass, (m: Handle)}
            {cuModuleGetFunction, "cuModuleGetFunction", 2000, false, pass, (f: *mut Handle, m: Handle, name: *const c_char)}
            {cuLaunchKernel, "cuLaunchKernel", 4000, false, gate(s, false), (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: Handle, p: *mut *mut c_void, e: *mut *mut c_void)}
            {cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, true, gate(s, true), (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: Handle, p: *mut *mut c_void, e: *mut *mut c_void)}
            {cuLaunchKernelEx, "cuLaunchKernelEx", 11060, false, gate(cfg, false), (cfg: *const LaunchConfig, f: Handle, p: *mut *mut c_void, e: *mut *mut c_void)}
            {cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, true, gate(cfg, true), (cfg: *const LaunchConfig, f: Handle, p: *mut *mut c_void, e: *mut *mut c_void)}
            {cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, false, gate(s, false), (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: Handle, p: *mut *mut c_void)}
            {cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, true, gate(s, true), (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shm: c_uint, s: Handle, p: *mut *mut c_void)}
            {cuStreamCreate, "cuStreamCreate", 2000, false, pass, (s: *mut Handle, flags: c_uint)}
            {cuStreamCreateWithPriority, "cuStreamCreateWithPriority", 5050, false, pass, (s: *mut Handle, flags: c_uint, prio: c_int)}
            {cuStreamDestroy_v2, "cuStreamDestroy", 4000, false, pass, (s: Handle)}
            {cuStreamSynchronize, "cuStreamSynchronize", 2000, false, sync, (s: Handle)}
            {cuStreamSynchronize_ptsz, "cuStreamSynchronize", 7000, true, sync, (s: Handle)}
            {cuStreamQuery, "cuStreamQuery", 2000, false, pass, (s: Handle)}
            {cuStreamQuery_ptsz, "cuStreamQuery", 7000, true, pass, (s: Handle)}
            {cuStreamBeginCapture, "cuStreamBeginCapture", 10000, false, capture_begin(s, false), (s: Handle)}
            {cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, true, capture_begin(s, true), (s: Handle)}
            {cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, false, capture_begin(s, false), (s: Handle, mode: c_int)}
            {cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, true, capture_begin(s, true), (s: Handle, mode: c_int)}
            {cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, false, capture_begin_to(s, g, false), (s: Handle, g: Handle, deps: *const Handle, edges: *const c_void, n: usize, mode: c_int)}
            {cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, true, capture_begin_to(s, g, true), (s: Handle, g: Handle, deps: *const Handle, edges: *const c_void, n: usize, mode: c_int)}
            {cuStreamEndCapture, "cuStreamEndCapture", 10000, false, capture_end(s, g, false), (s: Handle, g: *mut Handle)}
            {cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, true, capture_end(s, g, true), (s: Handle, g: *mut Handle)}
            {cuStreamIsCapturing, "cuStreamIsCapturing", 10000, false, pass, (s: Handle, status: *mut c_int)}
            {cuStreamIsCapturing_ptsz, "cuStreamIsCapturing", 10000, true, pass, (s: Handle, status: *mut c_int)}
            {cuGraphInstantiate, "cuGraphInstantiate", 10000, false, instantiate(e, g), (e: *mut Handle, g: Handle, err_node: *mut Handle, log: *mut c_char, log_size: usize)}
            {cuGraphInstantiate_v2, "cuGraphInstantiate", 11000, false, instantiate(e, g), (e: *mut Handle, g: Handle, err_node: *mut Handle, log: *mut c_char, log_size: usize)}
            {cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, false, instantiate(e, g), (e: *mut Handle, g: Handle, flags: u64)}
            {cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, false, instantiate(e, g), (e: *mut Handle, g: Handle, params: *mut c_void)}
            {cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, true, instantiate(e, g), (e: *mut Handle, g: Handle, params: *mut c_void)}
            {cuGraphLaunch, "cuGraphLaunch", 10000, false, graph_launch(e, s, false), (e: Handle, s: Handle)}
            {cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, true, graph_launch(e, s, true), (e: Handle, s: Handle)}
            {cuGraphExecUpdate, "cuGraphExecUpdate", 10020, false, exec_update(e, g), (e: Handle, g: Handle, err_node: *mut Handle, result: *mut c_int)}
            {cuGraphExecUpdate_v2, "cuGraphExecUpdate", 12000, false, exec_update(e, g), (e: Handle, g: Handle, result_info: *mut c_void)}
            {cuGraphExecDestroy, "cuGraphExecDestroy", 10000, false, exec_destroyed(e), (e: Handle)}
            {cuGraphDestroy, "cuGraphDestroy", 10000, false, graph_destroyed(g), (g: Handle)}
            {cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, false, trim(d), (d: c_int)}
            {cuMemGetInfo, "cuMemGetInfo", 2000, false, cap(free_bytes, total_bytes), (free_bytes: *mut c_uint, total_bytes: *mut c_uint)}
            {cuMemAlloc, "cuMemAlloc", 2000, false, count(Device, size, p), (p: *mut u32, size: c_uint)}
            {cuMemAllocPitch, "cuMemAllocPitch", 2000, false, pitch(p, pitch, width, height), (p: *mut u32, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint)}
            {cuMemFree, "cuMemFree", 2000, false, free(Device, p), (p: u32)}
            {cuCtxCreate, "cuCtxCreate", 2000, false, created(ctx), (ctx: *mut Handle, flags: c_uint, d: c_int)}
            {cuCtxDestroy, "cuCtxDestroy", 2000, false, destroyed(ctx), (ctx: Handle)}
            {cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, false, reset(d), (d: c_int)}
            {cuArrayCreate, "cuArrayCreate", 2000, false, array(Array, a, d, 1), (a: *mut Handle, d: *const ArrayDescV1)}
            {cuArray3DCreate, "cuArray3DCreate", 2000, false, array(Array, a, d, 1), (a: *mut Handle, d: *const Array3dDescV1)}
            {cuMemAllocHost, "cuMemAllocHost", 2000, false, pass, (pp: *mut *mut c_void, size: c_uint)}
            {cuMemAllocHost_v2, "cuMemAllocHost", 3020, false, pass, (pp: *mut *mut c_void, size: usize)}
            {cuMemHostAlloc, "cuMemHostAlloc", 2020, false, pass, (pp: *mut *mut c_void, size: usize, flags: c_uint)}
            {cuMemFreeHost, "cuMemFreeHost", 2000, false, pass, (p: *mut c_void)}
            {cuMemPoolCreate, "cuMemPoolCreate", 11020, false, pass, (pool: *mut Handle, props: *const c_void)}
            {cuMemPoolDestroy, "cuMemPoolDestroy", 11020, false, pass, (pool: Handle)}
            {cuMemAddressReserve, "cuMemAddressReserve", 10020, false, pass, (ptr: *mut Dptr, size: usize, align: usize, addr: Dptr, flags: u64)}
            {cuMemAddressFree, "cuMemAddressFree", 10020, false, pass, (ptr: Dptr, size: usize)}
            {cuMemMap, "cuMemMap", 10020, false, pass, (ptr: Dptr, size: usize, offset: usize, h: u64, flags: u64)}
            {cuMemSetAccess, "cuMemSetAccess", 10020, false, pass, (ptr: Dptr, size: usize, desc: *const c_void, count: usize)}
            {cuMemUnmap, "cuMemUnmap", 10020, false, pass, (ptr: Dptr, size: usize)}
            {cuGraphCreate, "cuGraphCreate", 10000, false, pass, (g: *mut Handle, flags: c_uint)}
            {cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, false, graph_alloc(g, params), (node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *mut MemAllocNodeParams)}
            {cuGraphAddMemFreeNode, "cuGraphAddMemFreeNode", 11040, false, graph_free(g, dptr), (node: *mut Handle, g: Handle, deps: *const Handle, n: usize, dptr: Dptr)}
            {cuLaunch, "cuLaunch", 2000, false, gate, (f: Handle)}
            {cuLaunchGrid, "cuLaunchGrid", 2000, false, gate, (f: Handle, w: c_int, h: c_int)}
            {cuLaunchGridAsync, "cuLaunchGridAsync", 2000, false, gate(s, false), (f: Handle, w: c_int, h: c_int, s: Handle)}
            {cuLibraryLoadData, "cuLibraryLoadData", 12000, false, pass, (lib: *mut Handle, code: *const c_void, jo: *mut c_int, jv: *mut *mut c_void, nj: c_uint, lo: *mut c_int, lv: *mut *mut c_void, nl: c_uint)}
            {cuLibraryLoadFromFile, "cuLibraryLoadFromFile", 12000, false, pass, (lib: *mut Handle, file: *const c_char, jo: *mut c_int, jv: *mut *mut c_void, nj: c_uint, lo: *mut c_int, lv: *mut *mut c_void, nl: c_uint)}
            {cuLibraryGetKernel, "cuLibraryGetKernel", 12000, false, pass, (k: *mut Handle, lib: Handle, name: *const c_char)}
            {cuLibraryUnload, "cuLibraryUnload", 12000, false, pass, (lib: Handle)}
            {cuKernelGetFunction, "cuKernelGetFunction", 12000, false, pass, (f: *mut Handle, k: Handle)}
        }
    };
}

/// One entry point of the list, as data.
#[derive(Debug, Clone, Copy)]
pub struct EntryPoint {
    pub symbol: &'static str,
    pub base: &'static str,
    pub since: i32,
    pub per_thread: bool,
    /// The xCUDA action's name (`pass`: not hooked).
    pub action: &'static str,
}

macro_rules! entry_point_table {
    ($( {$name:ident, $base:literal, $since:literal, $pt:literal, $action:ident $(( $($aa:tt)* ))?, ( $($arg:ident : $ty:ty),* $(,)? )} )*) => {
        /// Every entry point of `cuda_entry_points!`, in its order.
        pub const ENTRY_POINTS: &[EntryPoint] = &[$(EntryPoint {
            symbol: stringify!($name),
            base: $base,
            since: $since,
            per_thread: $pt,
            action: stringify!($action),
        }),*];

        /// Each entry point's C function type, for loaders.
        pub mod fnty {
            #[allow(unused_imports)]
            use super::types::*;
            $(pub type $name = unsafe extern "C" fn($($ty),*) -> CUresult;)*
        }
    };
}
cuda_entry_points!(entry_point_table);
