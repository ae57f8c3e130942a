//! Fake `libnvidia-ml.so.1` over the simulated GPU model. Readings come from
//! `muxflow_simgpu::telemetry`, the same code `simgpu-ctl table` uses.
//! SM activity: the GPM path (nvmlGpmSampleGet + nvmlGpmMetricsGet with
//! SM_UTIL / SM_OCCUPANCY), computed by the model between the two samples.
//! Every export catches panics and returns an nvmlReturn_t.
#![allow(clippy::missing_safety_doc)] // C ABI: nvml.h documents these.
#![allow(non_snake_case)]

use muxflow_simgpu::codes::nvml as rc;
use muxflow_simgpu::shared::{now_ns, SharedGpu};
use muxflow_simgpu::{state, telemetry, SimDir};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::sync::{Mutex, OnceLock};

type Ret = nvmlReturn_t;

struct Gpu {
    cfg: muxflow_simgpu::GpuConfig,
    shared: SharedGpu,
}

struct Lib {
    dir: SimDir,
    gpus: Vec<Gpu>,
}

static LIB: Mutex<Option<&'static Lib>> = Mutex::new(None);
static LOADED: OnceLock<Result<Lib, Ret>> = OnceLock::new();

fn guard(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => rc::SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => rc::UNKNOWN,
    }
}

fn load() -> Result<Lib, Ret> {
    let me = state::object_path_of(load as *const () as usize);
    let root = state::resolve(me.as_deref()).map_err(|e| {
        eprintln!("{e}");
        rc::UNINITIALIZED
    })?;
    let dir = SimDir::open(&root).map_err(|e| {
        eprintln!("{e}");
        rc::UNINITIALIZED
    })?;
    let mut gpus = Vec::new();
    for cfg in &dir.gpus {
        let shared = dir.open_gpu(cfg.index).map_err(|e| {
            eprintln!("{e}");
            rc::UNINITIALIZED
        })?;
        gpus.push(Gpu {
            cfg: cfg.clone(),
            shared,
        });
    }
    Ok(Lib { dir, gpus })
}

fn lib() -> Result<&'static Lib, Ret> {
    LIB.lock()
        .unwrap_or_else(|e| e.into_inner())
        .ok_or(rc::UNINITIALIZED)
}

/// Device handles are 1-based indices disguised as pointers.
fn gpu(d: nvmlDevice_t) -> Result<(&'static Lib, &'static Gpu), Ret> {
    let l = lib()?;
    let g = (d as usize)
        .checked_sub(1)
        .and_then(|i| l.gpus.get(i))
        .ok_or(rc::INVALID_ARGUMENT)?;
    if g.shared.is_lost() {
        return Err(rc::GPU_IS_LOST);
    }
    Ok((l, g))
}

fn handle(i: usize) -> nvmlDevice_t {
    (i + 1) as nvmlDevice_t
}

unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(rc::INVALID_ARGUMENT);
    }
    // SAFETY: non-null out-pointer per nvml.h.
    unsafe { p.write(v) };
    Ok(())
}

unsafe fn put_str(dst: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if dst.is_null() {
        return Err(rc::INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(rc::INSUFFICIENT_SIZE);
    }
    // SAFETY: buffer holds `len` >= s.len()+1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, dst, s.len());
        *dst.add(s.len()) = 0;
    }
    Ok(())
}

fn reading(g: &Gpu) -> telemetry::Reading {
    telemetry::read(&g.cfg, &g.shared, now_ns())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    guard(|| {
        let l = LOADED.get_or_init(load).as_ref().map_err(|e| *e)?;
        *LIB.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    guard(|| {
        lib()?;
        // The loaded state stays cached (cheap); only the "initialized" mark goes.
        *LIB.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(r: Ret) -> *const c_char {
    let s: &'static CStr = match r {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        10 => c"Timeout",
        13 => c"Function Not Found",
        15 => c"GPU is lost",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(v: *mut c_char, len: c_uint) -> Ret {
    guard(|| {
        lib()?;
        put_str(v, len, "550.54.15-simgpu")
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(v: *mut c_char, len: c_uint) -> Ret {
    guard(|| put_str(v, len, "12.550.54.15"))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> Ret {
    guard(|| put(v, 12040))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> Ret {
    guard(|| put(v, 12040))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(n: *mut c_uint) -> Ret {
    guard(|| put(n, lib()?.gpus.len() as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, d: *mut nvmlDevice_t) -> Ret {
    guard(|| {
        let l = lib()?;
        let g = l.gpus.get(i as usize).ok_or(rc::INVALID_ARGUMENT)?;
        put(d, handle(i as usize))?;
        if g.shared.is_lost() {
            return Err(rc::GPU_IS_LOST);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    d: *mut nvmlDevice_t,
) -> Ret {
    guard(|| {
        if uuid.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: NUL-terminated per nvml.h.
        let u = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
        let i = lib()?
            .gpus
            .iter()
            .position(|g| g.cfg.uuid == u)
            .ok_or(rc::NOT_FOUND)?;
        put(d, handle(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(d: nvmlDevice_t, name: *mut c_char, len: c_uint) -> Ret {
    guard(|| put_str(name, len, &gpu(d)?.1.cfg.name))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(d: nvmlDevice_t, uuid: *mut c_char, len: c_uint) -> Ret {
    guard(|| put_str(uuid, len, &gpu(d)?.1.cfg.uuid))
}

/// The configured compute capability (`compute_capability`, "9.0" by
/// default); an unreadable value is NVML's "not supported".
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    d: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    guard(|| {
        let (ma, mi) = gpu(d)?
            .1
            .cfg
            .compute_capability()
            .ok_or(rc::NOT_SUPPORTED)?;
        put(major, ma)?;
        put(minor, mi)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(d: nvmlDevice_t, i: *mut c_uint) -> Ret {
    guard(|| put(i, gpu(d)?.1.cfg.index))
}

/// PCI location; H100's device id 0x2330 (10de vendor in the low half).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(d: nvmlDevice_t, p: *mut nvmlPciInfo_t) -> Ret {
    guard(|| {
        let cfg = &gpu(d)?.1.cfg;
        let (domain, bus, device) = cfg.pci();
        // SAFETY: an all-zero nvmlPciInfo_t is valid (integers and C strings).
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        info.domain = domain;
        info.bus = bus;
        info.device = device;
        info.pciDeviceId = 0x2330_10de;
        info.pciSubSystemId = 0x16c1_10de;
        let id = cfg.pci_bus_id();
        for (dst, b) in info.busId.iter_mut().zip(id.bytes()) {
            *dst = b as c_char;
        }
        let legacy = &id[4..];
        for (dst, b) in info.busIdLegacy.iter_mut().zip(legacy.bytes()) {
            *dst = b as c_char;
        }
        // SAFETY: `p` checked non-null by `put`.
        unsafe { put(p, info) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    d: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> Ret {
    guard(|| {
        let r = reading(gpu(d)?.1);
        let mem = (r.mem_used * 100).checked_div(r.mem_total).unwrap_or(0) as c_uint;
        put(
            u,
            nvmlUtilization_t {
                gpu: (r.utilization * 100.0).round() as c_uint,
                memory: mem,
            },
        )
    })
}

const CLOCK_GRAPHICS: c_uint = 0;
const CLOCK_SM: c_uint = 1;
const CLOCK_MEM: c_uint = 2;
const CLOCK_VIDEO: c_uint = 3;

fn clock(g: &Gpu, ty: c_uint, max: bool) -> Result<c_uint, Ret> {
    match ty {
        CLOCK_GRAPHICS | CLOCK_SM if max => Ok(g.cfg.max_sm_clock_mhz),
        CLOCK_GRAPHICS | CLOCK_SM => Ok(reading(g).sm_clock_mhz),
        CLOCK_MEM => Ok(2619),
        CLOCK_VIDEO => Ok(1755),
        _ => Err(rc::INVALID_ARGUMENT),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    d: nvmlDevice_t,
    ty: nvmlClockType_t,
    c: *mut c_uint,
) -> Ret {
    guard(|| put(c, clock(gpu(d)?.1, ty, false)?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    d: nvmlDevice_t,
    ty: nvmlClockType_t,
    c: *mut c_uint,
) -> Ret {
    guard(|| put(c, clock(gpu(d)?.1, ty, true)?))
}

/// nvmlDeviceGetClock(device, type, id): id 0 = current, others = max-like.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    d: nvmlDevice_t,
    ty: nvmlClockType_t,
    id: nvmlClockId_t,
    c: *mut c_uint,
) -> Ret {
    guard(|| put(c, clock(gpu(d)?.1, ty, id != 0)?))
}

/// The enforced power limit, milliwatts (the GPU's config:
/// `GpuConfig::power_limit_w`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    d: nvmlDevice_t,
    limit: *mut c_uint,
) -> Ret {
    guard(|| put(limit, gpu(d)?.1.cfg.power_limit_w().saturating_mul(1000)))
}

/// The power management limit: as enforced (no other limit is modelled).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    d: nvmlDevice_t,
    limit: *mut c_uint,
) -> Ret {
    guard(|| put(limit, gpu(d)?.1.cfg.power_limit_w().saturating_mul(1000)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(d: nvmlDevice_t, m: *mut nvmlMemory_t) -> Ret {
    guard(|| {
        let r = reading(gpu(d)?.1);
        put(
            m,
            nvmlMemory_t {
                total: r.mem_total,
                free: r.mem_total.saturating_sub(r.mem_used),
                used: r.mem_used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    d: nvmlDevice_t,
    m: *mut nvmlMemory_v2_t,
) -> Ret {
    guard(|| {
        let r = reading(gpu(d)?.1);
        if m.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller set `version`.
        let version = unsafe { (*m).version };
        put(
            m,
            nvmlMemory_v2_t {
                version,
                total: r.mem_total,
                reserved: 0,
                free: r.mem_total.saturating_sub(r.mem_used),
                used: r.mem_used,
            },
        )
    })
}

/// Every client with a context on the GPU, or (`mps_only`) those with an
/// MPS compute context, as nvmlDeviceGetMPSComputeRunningProcesses_v3
/// reports them.
unsafe fn processes(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    mps_only: bool,
) -> Ret {
    guard(|| {
        let mut r = reading(gpu(d)?.1);
        if mps_only {
            r.clients.retain(|c| c.mps_server != 0);
        }
        if count.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-null in/out count.
        let cap = unsafe { *count } as usize;
        put(count, r.clients.len() as c_uint)?;
        if cap < r.clients.len() {
            return Err(rc::INSUFFICIENT_SIZE);
        }
        for (i, c) in r.clients.iter().enumerate() {
            // SAFETY: the caller's array holds `cap` >= len entries.
            unsafe {
                infos.add(i).write(nvmlProcessInfo_t {
                    pid: c.pid as c_uint,
                    usedGpuMemory: c.mem_used,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                })
            };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    processes(d, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    processes(d, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    processes(d, count, infos, true)
}

/// Per-process SM utilization over the model's window (one sample per
/// client, stamped now; `last_seen` is accepted and not used: the model
/// keeps no sample history).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    d: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    _last_seen: c_ulonglong,
) -> Ret {
    guard(|| {
        let g = gpu(d)?.1;
        let now = now_ns();
        let per = telemetry::process_sm_pct(&g.cfg, &g.shared, now);
        if count.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-null in/out count.
        let cap = unsafe { *count } as usize;
        put(count, per.len() as c_uint)?;
        if samples.is_null() || cap < per.len() {
            return Err(rc::INSUFFICIENT_SIZE);
        }
        for (i, &(pid, sm)) in per.iter().enumerate() {
            // SAFETY: the caller's array holds `cap` >= len entries.
            unsafe {
                samples.add(i).write(nvmlProcessUtilizationSample_t {
                    pid: pid as c_uint,
                    timeStamp: now / 1000,
                    smUtil: sm,
                    memUtil: 0,
                    encUtil: 0,
                    decUtil: 0,
                })
            };
        }
        Ok(())
    })
}

// ---- GPM (SM activity) ---------------------------------------------------

/// How often the GPU refreshes the counters behind GPM metrics.
const GPM_REFRESH_NS: u64 = 100_000_000;

struct GpmSample {
    dev: usize,
    t_ns: u64,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    d: nvmlDevice_t,
    s: *mut nvmlGpmSupport_t,
) -> Ret {
    guard(|| {
        gpu(d)?;
        if s.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-null struct provided by the caller.
        unsafe { (*s).isSupportedDevice = 1 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryIfStreamingEnabled(d: nvmlDevice_t, s: *mut c_uint) -> Ret {
    guard(|| {
        gpu(d)?;
        put(s, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(s: *mut nvmlGpmSample_t) -> Ret {
    guard(|| {
        put(
            s,
            Box::into_raw(Box::new(GpmSample {
                dev: usize::MAX,
                t_ns: 0,
            })) as nvmlGpmSample_t,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(s: nvmlGpmSample_t) -> Ret {
    guard(|| {
        if s.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: allocated by nvmlGpmSampleAlloc, freed once per nvml.h.
        drop(unsafe { Box::from_raw(s as *mut GpmSample) });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(d: nvmlDevice_t, s: nvmlGpmSample_t) -> Ret {
    guard(|| {
        gpu(d)?;
        if s.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: a live sample from nvmlGpmSampleAlloc.
        let s = unsafe { &mut *(s as *mut GpmSample) };
        s.dev = d as usize;
        s.t_ns = now_ns();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(m: *mut nvmlGpmMetricsGet_t) -> Ret {
    guard(|| {
        if m.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: non-null request struct owned by the caller.
        let m = unsafe { &mut *m };
        if m.sample1.is_null() || m.sample2.is_null() || m.numMetrics as usize > m.metrics.len() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: live samples from nvmlGpmSampleAlloc.
        let (a, b) = unsafe {
            (
                &*(m.sample1 as *const GpmSample),
                &*(m.sample2 as *const GpmSample),
            )
        };
        if a.dev != b.dev {
            return Err(rc::INVALID_ARGUMENT);
        }
        let (_, g) = gpu(a.dev as nvmlDevice_t)?;
        let (t0, t1) = (a.t_ns.min(b.t_ns), a.t_ns.max(b.t_ns));
        // A real GPU refreshes the counters GPM reads about every 100 ms:
        // samples closer than that read the same counters, so 0 % (measured
        // on an H100, driver 580; `real-gpu/README.md`).
        let act = if t1 - t0 < GPM_REFRESH_NS {
            0.0
        } else {
            telemetry::sm_activity_between(&g.cfg, &g.shared, t0, t1) * 100.0
        };
        for metric in m.metrics.iter_mut().take(m.numMetrics as usize) {
            let (val, short, long): (f64, &'static CStr, &'static CStr) = match metric.metricId {
                x if x == nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => {
                    (act, c"SM_UTIL", c"SM activity (simulated model)")
                }
                x if x == nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => (
                    act,
                    c"SM_OCCUPANCY",
                    c"SM occupancy (simulated: equals SM activity)",
                ),
                _ => {
                    metric.nvmlReturn = rc::NOT_SUPPORTED;
                    continue;
                }
            };
            metric.nvmlReturn = rc::SUCCESS;
            metric.value = val;
            metric.metricInfo.shortName = short.as_ptr() as *mut c_char;
            metric.metricInfo.longName = long.as_ptr() as *mut c_char;
            metric.metricInfo.unit = c"%".as_ptr() as *mut c_char;
        }
        Ok(())
    })
}

// ---- events (Xid) --------------------------------------------------------

struct EventSet {
    /// (device handle, event mask, last Xid seq seen)
    regs: Mutex<Vec<(usize, u64, u64)>>,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    guard(|| {
        lib()?;
        put(
            set,
            Box::into_raw(Box::new(EventSet {
                regs: Mutex::new(Vec::new()),
            })) as nvmlEventSet_t,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    d: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    guard(|| {
        gpu(d)?;
        put(types, nvmlEventTypeXidCriticalError as c_ulonglong)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    d: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    guard(|| {
        let (_, g) = gpu(d)?;
        if set.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        if types & !(nvmlEventTypeXidCriticalError as u64) != 0 {
            return Err(rc::NOT_SUPPORTED);
        }
        // SAFETY: a live set from nvmlEventSetCreate.
        let s = unsafe { &*(set as *const EventSet) };
        let seq = g
            .shared
            .table()
            .xid_next
            .load(std::sync::atomic::Ordering::Acquire);
        s.regs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((d as usize, types, seq));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    guard(|| {
        let l = lib()?;
        if set.is_null() || data.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: a live set from nvmlEventSetCreate.
        let s = unsafe { &*(set as *const EventSet) };
        let deadline = now_ns() + timeout_ms as u64 * 1_000_000;
        loop {
            {
                let mut regs = s.regs.lock().unwrap_or_else(|e| e.into_inner());
                for (h, _, seen) in regs.iter_mut() {
                    let Some(g) = l.gpus.get(*h - 1) else {
                        continue;
                    };
                    if let Some(x) = g.shared.table().xids_after(*seen).first().copied() {
                        *seen = x.seq;
                        return put(
                            data,
                            nvmlEventData_t {
                                device: *h as nvmlDevice_t,
                                eventType: nvmlEventTypeXidCriticalError as c_ulonglong,
                                eventData: x.xid,
                                gpuInstanceId: u32::MAX,
                                computeInstanceId: u32::MAX,
                            },
                        );
                    }
                }
            }
            if now_ns() >= deadline {
                return Err(rc::TIMEOUT);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    guard(|| {
        if set.is_null() {
            return Err(rc::INVALID_ARGUMENT);
        }
        // SAFETY: allocated by nvmlEventSetCreate, freed once.
        drop(unsafe { Box::from_raw(set as *mut EventSet) });
        Ok(())
    })
}

/// Keeps `dir` used: the state directory this library resolved (for debugging).
#[no_mangle]
pub unsafe extern "C" fn muxflowSimStateDir(buf: *mut c_char, len: c_uint) -> Ret {
    guard(|| put_str(buf, len, &lib()?.dir.root.to_string_lossy()))
}
