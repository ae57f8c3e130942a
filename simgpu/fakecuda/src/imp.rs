//! The simulated driver's entry points, one function each, with the C
//! signature the one list declares (`cuda-abi/src/lib.rs`): the exports in
//! `lib.rs` are generated from that list and call these, so a signature
//! that differs from the list does not compile.
#![allow(clippy::missing_safety_doc, non_snake_case, clippy::too_many_arguments)]

use super::*;
use crate::driver::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

pub(crate) unsafe fn cuInit(_flags: c_uint) -> CUresult {
    done(init())
}

pub(crate) unsafe fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    done(put(v, DRIVER_VERSION))
}

pub(crate) unsafe fn cuGetErrorString(e: CUresult, s: *mut *const c_char) -> CUresult {
    match error_strings(e) {
        Some((_, d)) => done(put(s, d)),
        None => {
            let _ = put(s, std::ptr::null());
            cu::INVALID_VALUE
        }
    }
}

pub(crate) unsafe fn cuGetErrorName(e: CUresult, s: *mut *const c_char) -> CUresult {
    match error_strings(e) {
        Some((n, _)) => done(put(s, n)),
        None => {
            let _ = put(s, std::ptr::null());
            cu::INVALID_VALUE
        }
    }
}

pub(crate) unsafe fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
}

pub(crate) unsafe fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    proc_address(symbol, pfn, version, flags, status)
}

pub(crate) unsafe fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    done(with_proc(|p| put(n, p.devs.len() as c_int)))
}

pub(crate) unsafe fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> CUresult {
    done(with_proc(|p| {
        p.dev(ordinal)?;
        put(d, ordinal)
    }))
}

pub(crate) unsafe fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> CUresult {
    done(with_proc(|p| copy_str(name, len, &p.dev(d)?.cfg.name)))
}

pub(crate) unsafe fn cuDeviceGetUuid(uuid: *mut [u8; 16], d: c_int) -> CUresult {
    done(with_proc(|p| put(uuid, p.dev(d)?.uuid_bytes())))
}

pub(crate) unsafe fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], d: c_int) -> CUresult {
    done(with_proc(|p| put(uuid, p.dev(d)?.uuid_bytes())))
}

pub(crate) unsafe fn cuDeviceTotalMem_v2(bytes: *mut usize, d: c_int) -> CUresult {
    done(with_proc(|p| {
        put(bytes, p.dev(d)?.cfg.memory_bytes() as usize)
    }))
}

pub(crate) unsafe fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> CUresult {
    done(with_proc(|p| put(v, p.attribute(d, attr)?)))
}

pub(crate) unsafe fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    _d: c_int,
) -> CUresult {
    done(put(major, 9).and_then(|_| put(minor, 0)))
}

pub(crate) unsafe fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, d: c_int) -> CUresult {
    done(primary_retain(d).and_then(|h| put(ctx, h)))
}

pub(crate) unsafe fn cuDevicePrimaryCtxRelease(d: c_int) -> CUresult {
    done(primary_release(d))
}

pub(crate) unsafe fn cuDevicePrimaryCtxRelease_v2(d: c_int) -> CUresult {
    done(primary_release(d))
}

pub(crate) unsafe fn cuDevicePrimaryCtxReset_v2(d: c_int) -> CUresult {
    done(primary_reset(d))
}

pub(crate) unsafe fn cuDevicePrimaryCtxGetState(
    d: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    done(primary_state(d).and_then(|a| {
        put(flags, 0)?;
        put(active, a as c_int)
    }))
}

pub(crate) unsafe fn cuDevicePrimaryCtxSetFlags_v2(d: c_int, _flags: c_uint) -> CUresult {
    done(with_proc(|p| p.dev(d).map(|_| ())))
}

pub(crate) unsafe fn cuCtxCreate_v2(ctx: *mut Handle, _flags: c_uint, d: c_int) -> CUresult {
    done(ctx_create(d).and_then(|h| put(ctx, h)))
}

pub(crate) unsafe fn cuCtxCreate_v3(
    ctx: *mut Handle,
    _params: *mut c_void,
    _n: c_int,
    _flags: c_uint,
    d: c_int,
) -> CUresult {
    done(ctx_create(d).and_then(|h| put(ctx, h)))
}

pub(crate) unsafe fn cuCtxCreate_v4(
    ctx: *mut Handle,
    _params: *mut c_void,
    _flags: c_uint,
    d: c_int,
) -> CUresult {
    done(ctx_create(d).and_then(|h| put(ctx, h)))
}

pub(crate) unsafe fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    done(ctx_destroy(ctx))
}

pub(crate) unsafe fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    done(ctx_set_current(ctx))
}

pub(crate) unsafe fn cuCtxGetCurrent(ctx: *mut Handle) -> CUresult {
    done(put(ctx, current_ctx()))
}

pub(crate) unsafe fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    done(ctx_push(ctx))
}

pub(crate) unsafe fn cuCtxPopCurrent_v2(ctx: *mut Handle) -> CUresult {
    done(ctx_pop().and_then(|h| if ctx.is_null() { Ok(()) } else { put(ctx, h) }))
}

pub(crate) unsafe fn cuCtxGetDevice(d: *mut c_int) -> CUresult {
    done(current_dev().and_then(|x| put(d, x as c_int)))
}

pub(crate) unsafe fn cuCtxSynchronize() -> CUresult {
    done(ctx_synchronize())
}

pub(crate) unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    done(mem_info().and_then(|(f, t)| {
        put(free, f as usize)?;
        put(total, t as usize)
    }))
}

pub(crate) unsafe fn cuMemAlloc_v2(p: *mut Dptr, size: usize) -> CUresult {
    alloc_out(p, size as u64, Mem::Linear)
}

pub(crate) unsafe fn cuMemAllocPitch_v2(
    p: *mut Dptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _elem: c_uint,
) -> CUresult {
    let pt = width.div_ceil(512) * 512;
    match put(pitch, pt) {
        Ok(()) => alloc_out(p, (pt * height) as u64, Mem::Linear),
        Err(e) => e,
    }
}

pub(crate) unsafe fn cuMemAllocManaged(p: *mut Dptr, size: usize, _flags: c_uint) -> CUresult {
    alloc_out(p, size as u64, Mem::Linear)
}

// Stream-ordered allocations and frees: on a capturing stream, graph
// memory nodes of the capture (driver/graphmem.rs).
pub(crate) unsafe fn cuMemAllocAsync(p: *mut Dptr, size: usize, s: Handle) -> CUresult {
    done(stream_alloc(size as u64, s, false).and_then(|a| put(p, a)))
}

pub(crate) unsafe fn cuMemAllocAsync_ptsz(p: *mut Dptr, size: usize, s: Handle) -> CUresult {
    done(stream_alloc(size as u64, s, true).and_then(|a| put(p, a)))
}

pub(crate) unsafe fn cuMemAllocFromPoolAsync(
    p: *mut Dptr,
    size: usize,
    pool: Handle,
    s: Handle,
) -> CUresult {
    done(
        pool_check(pool).and_then(|()| stream_alloc(size as u64, s, false).and_then(|a| put(p, a))),
    )
}

pub(crate) unsafe fn cuMemAllocFromPoolAsync_ptsz(
    p: *mut Dptr,
    size: usize,
    pool: Handle,
    s: Handle,
) -> CUresult {
    done(pool_check(pool).and_then(|()| stream_alloc(size as u64, s, true).and_then(|a| put(p, a))))
}

pub(crate) unsafe fn cuMemFree_v2(p: Dptr) -> CUresult {
    done(mem_free(p, Mem::Linear))
}

pub(crate) unsafe fn cuMemFreeAsync(p: Dptr, s: Handle) -> CUresult {
    done(stream_free(p, s, false))
}

pub(crate) unsafe fn cuMemFreeAsync_ptsz(p: Dptr, s: Handle) -> CUresult {
    done(stream_free(p, s, true))
}

pub(crate) unsafe fn cuMemCreate(
    h: *mut u64,
    size: usize,
    _prop: *const c_void,
    _flags: u64,
) -> CUresult {
    alloc_out(h, size as u64, Mem::Vmm)
}

pub(crate) unsafe fn cuMemRelease(h: u64) -> CUresult {
    done(mem_free(h, Mem::Vmm))
}

pub(crate) unsafe fn cuArrayCreate_v2(a: *mut Handle, d: *const ArrayDesc) -> CUresult {
    match d.as_ref() {
        Some(d) => {
            let d3 = Array3dDesc {
                width: d.width,
                height: d.height,
                depth: 0,
                format: d.format,
                channels: d.channels,
                flags: 0,
            };
            array_3d(a, &d3, 1, Mem::Array)
        }
        None => cu::INVALID_VALUE,
    }
}

pub(crate) unsafe fn cuArray3DCreate_v2(a: *mut Handle, d: *const Array3dDesc) -> CUresult {
    array_3d(a, d, 1, Mem::Array)
}

pub(crate) unsafe fn cuArrayDestroy(a: Handle) -> CUresult {
    done(mem_free(a as u64, Mem::Array))
}

pub(crate) unsafe fn cuMipmappedArrayCreate(
    m: *mut Handle,
    d: *const Array3dDesc,
    levels: c_uint,
) -> CUresult {
    array_3d(m, d, levels, Mem::Mipmapped)
}

pub(crate) unsafe fn cuMipmappedArrayDestroy(m: Handle) -> CUresult {
    done(mem_free(m as u64, Mem::Mipmapped))
}

pub(crate) unsafe fn cuMemcpyHtoD_v2(_d: Dptr, _h: *const c_void, _n: usize) -> CUresult {
    done(check_current())
}

pub(crate) unsafe fn cuMemcpyHtoD_v2_ptds(_d: Dptr, _h: *const c_void, _n: usize) -> CUresult {
    done(check_current())
}

pub(crate) unsafe fn cuMemcpyDtoH_v2(_h: *mut c_void, _d: Dptr, _n: usize) -> CUresult {
    done(ctx_synchronize())
}

pub(crate) unsafe fn cuMemcpyDtoH_v2_ptds(_h: *mut c_void, _d: Dptr, _n: usize) -> CUresult {
    done(ctx_synchronize())
}

pub(crate) unsafe fn cuModuleLoad(m: *mut Handle, _fname: *const c_char) -> CUresult {
    done(check_current().and_then(|_| put(m, new_handle())))
}

pub(crate) unsafe fn cuModuleLoadData(m: *mut Handle, _image: *const c_void) -> CUresult {
    done(check_current().and_then(|_| put(m, new_handle())))
}

pub(crate) unsafe fn cuModuleUnload(_m: Handle) -> CUresult {
    cu::SUCCESS
}

pub(crate) unsafe fn cuModuleGetFunction(
    f: *mut Handle,
    _m: Handle,
    name: *const c_char,
) -> CUresult {
    if name.is_null() {
        return cu::INVALID_VALUE;
    }
    done(function(&CStr::from_ptr(name).to_string_lossy()).and_then(|h| put(f, h)))
}

pub(crate) unsafe fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    s: Handle,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    done(launch(f, blocks(gx, gy, gz), s, false))
}

pub(crate) unsafe fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    s: Handle,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    done(launch(f, blocks(gx, gy, gz), s, true))
}

pub(crate) unsafe fn cuLaunchKernelEx(
    cfg: *const LaunchConfig,
    f: Handle,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    launch_ex(cfg, f, false)
}

pub(crate) unsafe fn cuLaunchKernelEx_ptsz(
    cfg: *const LaunchConfig,
    f: Handle,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    launch_ex(cfg, f, true)
}

pub(crate) unsafe fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    s: Handle,
    _p: *mut *mut c_void,
) -> CUresult {
    done(launch(f, blocks(gx, gy, gz), s, false))
}

pub(crate) unsafe fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shm: c_uint,
    s: Handle,
    _p: *mut *mut c_void,
) -> CUresult {
    done(launch(f, blocks(gx, gy, gz), s, true))
}

pub(crate) unsafe fn cuStreamCreate(s: *mut Handle, _flags: c_uint) -> CUresult {
    done(stream_create().and_then(|h| put(s, h)))
}

pub(crate) unsafe fn cuStreamCreateWithPriority(
    s: *mut Handle,
    _flags: c_uint,
    _prio: c_int,
) -> CUresult {
    done(stream_create().and_then(|h| put(s, h)))
}

pub(crate) unsafe fn cuStreamDestroy_v2(s: Handle) -> CUresult {
    done(stream_destroy(s))
}

pub(crate) unsafe fn cuStreamSynchronize(s: Handle) -> CUresult {
    done(stream_synchronize(s, false))
}

pub(crate) unsafe fn cuStreamSynchronize_ptsz(s: Handle) -> CUresult {
    done(stream_synchronize(s, true))
}

pub(crate) unsafe fn cuStreamQuery(s: Handle) -> CUresult {
    done(stream_query(s, false))
}

pub(crate) unsafe fn cuStreamQuery_ptsz(s: Handle) -> CUresult {
    done(stream_query(s, true))
}

pub(crate) unsafe fn cuStreamBeginCapture(s: Handle) -> CUresult {
    done(begin_capture(s, false, None))
}

pub(crate) unsafe fn cuStreamBeginCapture_ptsz(s: Handle) -> CUresult {
    done(begin_capture(s, true, None))
}

pub(crate) unsafe fn cuStreamBeginCapture_v2(s: Handle, _mode: c_int) -> CUresult {
    done(begin_capture(s, false, None))
}

pub(crate) unsafe fn cuStreamBeginCapture_v2_ptsz(s: Handle, _mode: c_int) -> CUresult {
    done(begin_capture(s, true, None))
}

pub(crate) unsafe fn cuStreamBeginCaptureToGraph(
    s: Handle,
    g: Handle,
    _deps: *const Handle,
    _edges: *const c_void,
    _n: usize,
    _mode: c_int,
) -> CUresult {
    done(begin_capture(s, false, Some(g)))
}

pub(crate) unsafe fn cuStreamBeginCaptureToGraph_ptsz(
    s: Handle,
    g: Handle,
    _deps: *const Handle,
    _edges: *const c_void,
    _n: usize,
    _mode: c_int,
) -> CUresult {
    done(begin_capture(s, true, Some(g)))
}

pub(crate) unsafe fn cuStreamIsCapturing(s: Handle, status: *mut c_int) -> CUresult {
    done(is_capturing(s, false).and_then(|c| put(status, c)))
}

pub(crate) unsafe fn cuStreamIsCapturing_ptsz(s: Handle, status: *mut c_int) -> CUresult {
    done(is_capturing(s, true).and_then(|c| put(status, c)))
}

pub(crate) unsafe fn cuStreamEndCapture(s: Handle, g: *mut Handle) -> CUresult {
    done(end_capture(s, false).and_then(|h| put(g, h)))
}

pub(crate) unsafe fn cuStreamEndCapture_ptsz(s: Handle, g: *mut Handle) -> CUresult {
    done(end_capture(s, true).and_then(|h| put(g, h)))
}

pub(crate) unsafe fn cuGraphInstantiate(
    e: *mut Handle,
    g: Handle,
    _err_node: *mut Handle,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    done(graph_instantiate(g).and_then(|h| put(e, h)))
}

pub(crate) unsafe fn cuGraphInstantiate_v2(
    e: *mut Handle,
    g: Handle,
    _err_node: *mut Handle,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    done(graph_instantiate(g).and_then(|h| put(e, h)))
}

pub(crate) unsafe fn cuGraphInstantiateWithParams(
    e: *mut Handle,
    g: Handle,
    _params: *mut c_void,
) -> CUresult {
    done(graph_instantiate(g).and_then(|h| put(e, h)))
}

pub(crate) unsafe fn cuGraphInstantiateWithParams_ptsz(
    e: *mut Handle,
    g: Handle,
    _params: *mut c_void,
) -> CUresult {
    done(graph_instantiate(g).and_then(|h| put(e, h)))
}

pub(crate) unsafe fn cuGraphInstantiateWithFlags(
    e: *mut Handle,
    g: Handle,
    _flags: u64,
) -> CUresult {
    done(graph_instantiate(g).and_then(|h| put(e, h)))
}

pub(crate) unsafe fn cuGraphLaunch(e: Handle, s: Handle) -> CUresult {
    done(graph_launch(e, s, false))
}

pub(crate) unsafe fn cuGraphLaunch_ptsz(e: Handle, s: Handle) -> CUresult {
    done(graph_launch(e, s, true))
}

/// `result`: CU_GRAPH_EXEC_UPDATE_SUCCESS (0) or _ERROR (1).
pub(crate) unsafe fn cuGraphExecUpdate(
    e: Handle,
    g: Handle,
    _err_node: *mut Handle,
    result: *mut c_int,
) -> CUresult {
    let r = graph_exec_update(e, g);
    if !result.is_null() {
        // SAFETY: the caller's CUgraphExecUpdateResult out-parameter.
        unsafe { *result = c_int::from(r.is_err()) };
    }
    done(r)
}

/// `result_info` starts with the CUgraphExecUpdateResult (cuda.h's
/// CUgraphExecUpdateResultInfo).
pub(crate) unsafe fn cuGraphExecUpdate_v2(
    e: Handle,
    g: Handle,
    result_info: *mut c_void,
) -> CUresult {
    // SAFETY: as cuGraphExecUpdate's `result`: the struct's first field.
    unsafe { cuGraphExecUpdate(e, g, std::ptr::null_mut(), result_info.cast()) }
}

pub(crate) unsafe fn cuGraphExecDestroy(e: Handle) -> CUresult {
    done(graph_destroy(e))
}

pub(crate) unsafe fn cuGraphDestroy(g: Handle) -> CUresult {
    done(graph_destroy(g))
}

// Graph memory: driver/graphmem.rs.
pub(crate) unsafe fn cuDeviceGraphMemTrim(d: c_int) -> CUresult {
    done(graph_mem_trim(d))
}

// The un-suffixed v1 entry points (CUDA 3.1 and older ABI): 32-bit sizes and device pointers.
pub(crate) unsafe fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let narrow = |x: u64| x.min(u32::MAX as u64) as c_uint;
    done(mem_info().and_then(|(f, t)| {
        put(free, narrow(f))?;
        put(total, narrow(t))
    }))
}

pub(crate) unsafe fn cuMemAlloc(p: *mut u32, size: c_uint) -> CUresult {
    alloc_out_v1(p, size as u64)
}

pub(crate) unsafe fn cuMemAllocPitch(
    p: *mut u32,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    _elem: c_uint,
) -> CUresult {
    let pt = width.div_ceil(512) * 512;
    match put(pitch, pt) {
        Ok(()) => alloc_out_v1(p, pt as u64 * height as u64),
        Err(e) => e,
    }
}

pub(crate) unsafe fn cuMemFree(p: u32) -> CUresult {
    done(mem_free(p as u64, Mem::Linear))
}

pub(crate) unsafe fn cuCtxCreate(ctx: *mut Handle, _flags: c_uint, d: c_int) -> CUresult {
    done(ctx_create(d).and_then(|h| put(ctx, h)))
}

pub(crate) unsafe fn cuCtxDestroy(ctx: Handle) -> CUresult {
    done(ctx_destroy(ctx))
}

pub(crate) unsafe fn cuDevicePrimaryCtxReset(d: c_int) -> CUresult {
    done(primary_reset(d))
}

pub(crate) unsafe fn cuArrayCreate(a: *mut Handle, d: *const ArrayDescV1) -> CUresult {
    match d.as_ref() {
        Some(d) => {
            let d3 = Array3dDesc {
                width: d.width as usize,
                height: d.height as usize,
                depth: 0,
                format: d.format,
                channels: d.channels,
                flags: 0,
            };
            array_3d(a, &d3, 1, Mem::Array)
        }
        None => cu::INVALID_VALUE,
    }
}

pub(crate) unsafe fn cuArray3DCreate(a: *mut Handle, d: *const Array3dDescV1) -> CUresult {
    match d.as_ref() {
        Some(d) => {
            let d3 = Array3dDesc {
                width: d.width as usize,
                height: d.height as usize,
                depth: d.depth as usize,
                format: d.format,
                channels: d.channels,
                flags: d.flags,
            };
            array_3d(a, &d3, 1, Mem::Array)
        }
        None => cu::INVALID_VALUE,
    }
}

// Pinned host memory: host memory, not the GPU's.
pub(crate) unsafe fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> CUresult {
    done(host_alloc(size as u64).and_then(|h| put(pp, h)))
}

pub(crate) unsafe fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    done(host_alloc(size as u64).and_then(|h| put(pp, h)))
}

pub(crate) unsafe fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, _flags: c_uint) -> CUresult {
    done(host_alloc(size as u64).and_then(|h| put(pp, h)))
}

pub(crate) unsafe fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    done(host_free(p))
}

// Memory pools created by the application.
pub(crate) unsafe fn cuMemPoolCreate(pool: *mut Handle, props: *const c_void) -> CUresult {
    if props.is_null() {
        return cu::INVALID_VALUE;
    }
    done(pool_create().and_then(|h| put(pool, h)))
}

pub(crate) unsafe fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    done(pool_destroy(pool))
}

// The virtual memory management path: address ranges, mappings, access.
pub(crate) unsafe fn cuMemAddressReserve(
    ptr: *mut Dptr,
    size: usize,
    _align: usize,
    _addr: Dptr,
    _flags: u64,
) -> CUresult {
    done(address_reserve(size as u64).and_then(|a| put(ptr, a)))
}

pub(crate) unsafe fn cuMemAddressFree(ptr: Dptr, size: usize) -> CUresult {
    done(address_free(ptr, size as u64))
}

pub(crate) unsafe fn cuMemMap(
    ptr: Dptr,
    size: usize,
    _offset: usize,
    h: u64,
    _flags: u64,
) -> CUresult {
    done(map(ptr, size as u64, h))
}

pub(crate) unsafe fn cuMemSetAccess(
    ptr: Dptr,
    _size: usize,
    desc: *const c_void,
    count: usize,
) -> CUresult {
    if desc.is_null() || count == 0 {
        return cu::INVALID_VALUE;
    }
    done(set_access(ptr))
}

pub(crate) unsafe fn cuMemUnmap(ptr: Dptr, _size: usize) -> CUresult {
    done(unmap(ptr))
}

// Graph memory nodes: an allocation node reserves an address; memory is
// mapped at launch into the graph pool (driver/graphmem.rs).
pub(crate) unsafe fn cuGraphCreate(g: *mut Handle, _flags: c_uint) -> CUresult {
    done(graph_create().and_then(|h| put(g, h)))
}

pub(crate) unsafe fn cuGraphAddMemAllocNode(
    node: *mut Handle,
    g: Handle,
    _deps: *const Handle,
    _n: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    let Some(prm) = params.as_mut() else {
        return cu::INVALID_VALUE;
    };
    done(graph_node(g).and_then(|n| {
        prm.dptr = graph_alloc_node(g, prm.bytesize as u64)?;
        put(node, n)
    }))
}

pub(crate) unsafe fn cuGraphAddMemFreeNode(
    node: *mut Handle,
    g: Handle,
    _deps: *const Handle,
    _n: usize,
    dptr: Dptr,
) -> CUresult {
    done(graph_node(g).and_then(|n| {
        graph_free_node(g, dptr)?;
        put(node, n)
    }))
}

// Legacy launches (execution configuration set beforehand; the fake ignores it).
pub(crate) unsafe fn cuLaunch(f: Handle) -> CUresult {
    done(launch(f, 1, std::ptr::null_mut(), false))
}

pub(crate) unsafe fn cuLaunchGrid(f: Handle, w: c_int, h: c_int) -> CUresult {
    done(launch(
        f,
        blocks(w.max(1) as c_uint, h.max(1) as c_uint, 1),
        std::ptr::null_mut(),
        false,
    ))
}

pub(crate) unsafe fn cuLaunchGridAsync(f: Handle, w: c_int, h: c_int, s: Handle) -> CUresult {
    done(launch(
        f,
        blocks(w.max(1) as c_uint, h.max(1) as c_uint, 1),
        s,
        false,
    ))
}

// CUDA 12 lazy loading: libraries and context-independent kernels.
pub(crate) unsafe fn cuLibraryLoadData(
    lib: *mut Handle,
    code: *const c_void,
    _jo: *mut c_int,
    _jv: *mut *mut c_void,
    _nj: c_uint,
    _lo: *mut c_int,
    _lv: *mut *mut c_void,
    _nl: c_uint,
) -> CUresult {
    if code.is_null() {
        return cu::INVALID_VALUE;
    }
    done(init().and_then(|_| put(lib, new_library())))
}

pub(crate) unsafe fn cuLibraryLoadFromFile(
    lib: *mut Handle,
    file: *const c_char,
    _jo: *mut c_int,
    _jv: *mut *mut c_void,
    _nj: c_uint,
    _lo: *mut c_int,
    _lv: *mut *mut c_void,
    _nl: c_uint,
) -> CUresult {
    done(
        name_of(file)
            .and_then(|_| init())
            .and_then(|_| put(lib, new_library())),
    )
}

pub(crate) unsafe fn cuLibraryGetKernel(
    k: *mut Handle,
    lib: Handle,
    name: *const c_char,
) -> CUresult {
    done(
        library_check(lib)
            .and_then(|_| name_of(name))
            .and_then(|n| kernel(&n))
            .and_then(|h| put(k, h)),
    )
}

pub(crate) unsafe fn cuLibraryUnload(lib: Handle) -> CUresult {
    done(library_unload(lib))
}

pub(crate) unsafe fn cuKernelGetFunction(f: *mut Handle, k: Handle) -> CUresult {
    done(put(f, k))
}
