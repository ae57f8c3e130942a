//! One NVML read per step: every GPU's utilization, SM clock, memory and
//! compute processes, plus pending Xid events. SM activity (GPM) needs two
//! samples [`GPM_MIN_GAP`](muxflow::policy::health::GPM_MIN_GAP) apart, so the
//! steps take it from the node's sampler ([`crate::sampler`]), which uses
//! [`gpm_sm_activity`]; [`read_with_gpm_gap`] samples it itself, waiting
//! (the example `nvml-sample` and the tests).

use std::time::{Duration, Instant};

use muxflow::policy::health::Metrics;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot initialise NVML ({lib}): {source}")]
    Init {
        lib: String,
        #[source]
        source: NvmlError,
    },
    #[error("NVML device count: {0}")]
    Count(#[source] NvmlError),
}

/// A compute process on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub used_mib: Option<u64>,
}

/// One GPU's reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub metrics: Metrics,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    /// The enforced power limit, W; None where NVML gives none.
    pub power_limit_w: Option<u32>,
    pub processes: Vec<Process>,
}

/// What NVML said about one GPU.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuRead {
    Ok(Reading),
    /// NVML_ERROR_GPU_IS_LOST.
    Lost,
    /// Another failure: which query, and NVML's error.
    Failed(String),
}

/// Everything one step reads.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    pub gpus: Vec<(u32, GpuRead)>,
    /// (GPU index, Xid) in arrival order.
    pub xids: Vec<(u32, u64)>,
    /// (GPU index, PCI location), to place the kernel log's Xid records.
    pub pci: Vec<(u32, crate::kmsg::Pci)>,
}

const MIB: u64 = 1 << 20;

/// Reads every GPU once, without SM activity (no wait: the caller takes it
/// from the sampler's page). `xid_watch` is how long to wait for Xid events
/// after registering for them (0: only those already pending).
pub fn read(lib: Option<&std::path::Path>, xid_watch: Duration) -> Result<Telemetry, ReadError> {
    read_inner(lib, xid_watch, None)
}

/// [`read`] with SM activity from two GPM samples `gpm_gap` apart, taken
/// here (it waits that long).
pub fn read_with_gpm_gap(
    lib: Option<&std::path::Path>,
    xid_watch: Duration,
    gpm_gap: Duration,
) -> Result<Telemetry, ReadError> {
    read_inner(lib, xid_watch, Some(gpm_gap))
}

/// NVML loaded from `lib` (else the loader's libnvidia-ml.so.1).
pub fn open(lib: Option<&std::path::Path>) -> Result<Nvml, ReadError> {
    match lib {
        Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
        None => Nvml::init(),
    }
    .map_err(|source| ReadError::Init {
        lib: lib.map_or("libnvidia-ml.so.1".into(), |p| p.display().to_string()),
        source,
    })
}

/// SM activity, percent, between two GPM samples of one GPU (taken at
/// least [`GPM_MIN_GAP`](muxflow::policy::health::GPM_MIN_GAP) apart, or it reads
/// 0); None when the GPU has no such metric.
pub fn gpm_sm_activity(
    nvml: &Nvml,
    first: &nvml_wrapper::gpm::GpmSample,
    second: &nvml_wrapper::gpm::GpmSample,
) -> Result<Option<f64>, NvmlError> {
    let v = nvml_wrapper::gpm::gpm_metrics_get(nvml, first, second, &[GpmMetricId::SmUtil])?;
    Ok(v.into_iter()
        .next()
        .and_then(|m| m.ok())
        .map(|m| m.value.clamp(0.0, 100.0)))
}

fn read_inner(
    lib: Option<&std::path::Path>,
    xid_watch: Duration,
    gpm_gap: Option<Duration>,
) -> Result<Telemetry, ReadError> {
    let nvml = open(lib)?;
    let count = nvml.device_count().map_err(ReadError::Count)?;

    // Register for Xids first, so events raised during the read are caught.
    let mut events = match nvml.create_event_set() {
        Ok(set) => Some(set),
        Err(e) => {
            tracing::debug!("NVML event set: {e}");
            None
        }
    };
    let mut devices = Vec::new();
    let mut pci = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(|e| classify(("handle", e)));
        if let Ok(p) = d.as_ref().map(|d| d.pci_info()) {
            match p {
                Ok(p) => pci.push((i, (p.domain, p.bus, p.device))),
                Err(e) => tracing::debug!("GPU {i}: no PCI location: {e}"),
            }
        }
        if let (Ok(dev), Some(set)) = (&d, events.take()) {
            events = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => Some(set),
                Err(e) => {
                    tracing::debug!("GPU {i}: Xid events unavailable: {}", e.error);
                    None
                }
            };
        }
        devices.push(d);
    }

    // GPM SM activity is a rate between two samples: take the first of every
    // GPU now, the second after the other queries.
    let first: Vec<_> = devices
        .iter()
        .map(|d| {
            gpm_gap?;
            d.as_ref().ok().and_then(|d| d.gpm_sample().ok())
        })
        .collect();
    let start = Instant::now();
    let mut gpus = Vec::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        let i = i as u32;
        let read = match d {
            Ok(dev) => read_one(dev).map_or_else(classify, GpuRead::Ok),
            Err(e) => e.clone(),
        };
        gpus.push((i, read));
    }
    if let Some(rest) = gpm_gap.and_then(|g| g.checked_sub(start.elapsed())) {
        std::thread::sleep(rest);
    }
    for ((i, read), (d, s1)) in gpus.iter_mut().zip(devices.iter().zip(first)) {
        let (Ok(dev), Some(s1)) = (d, s1) else {
            continue;
        };
        let GpuRead::Ok(r) = read else {
            continue;
        };
        match dev
            .gpm_sample()
            .and_then(|s2| gpm_sm_activity(&nvml, &s1, &s2))
        {
            Ok(v) => r.metrics.sm_activity_pct = v,
            Err(NvmlError::GpuLost) => *read = GpuRead::Lost,
            Err(e) => tracing::debug!("GPU {i}: no GPM SM activity: {e}"),
        }
    }

    let mut xids = Vec::new();
    if let Some(set) = &events {
        if !xid_watch.is_zero() {
            tracing::info!(?xid_watch, "watching for Xid events");
        }
        let deadline = Instant::now() + xid_watch;
        loop {
            // Once something arrived, only drain what is pending: act now.
            let left = if xids.is_empty() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            match set.wait(left.as_millis() as u32) {
                Ok(ev) => {
                    let gpu = ev.device.index().unwrap_or(u32::MAX);
                    if let Some(XidError::Value(x)) = ev.event_data {
                        xids.push((gpu, x));
                    }
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    tracing::debug!("NVML event wait: {e}");
                    break;
                }
            }
        }
    }
    Ok(Telemetry { gpus, xids, pci })
}

fn classify((what, e): (&'static str, NvmlError)) -> GpuRead {
    match e {
        NvmlError::GpuLost => GpuRead::Lost,
        e => GpuRead::Failed(format!("{what}: {e}")),
    }
}

fn read_one(dev: &nvml_wrapper::Device) -> Result<Reading, (&'static str, NvmlError)> {
    let util = dev.utilization_rates().map_err(|e| ("utilization", e))?;
    let mem = dev.memory_info().map_err(|e| ("memory", e))?;
    let clock = dev.clock_info(Clock::SM).map_err(|e| ("SM clock", e))?;
    // A GPU without a max clock reading still has the other metrics.
    let max_clock = dev.max_clock_info(Clock::SM).ok().filter(|&m| m > 0);
    let processes = gpu_processes(dev).map_err(|e| ("compute processes", e))?;
    let total_mib = mem.total / MIB;
    Ok(Reading {
        metrics: Metrics {
            utilization_pct: f64::from(util.gpu),
            sm_activity_pct: None,
            sm_clock_fraction: max_clock.map(|m| f64::from(clock) / f64::from(m)),
            memory_pct: if mem.total == 0 {
                0.0
            } else {
                mem.used as f64 * 100.0 / mem.total as f64
            },
        },
        mem_used_mib: mem.used / MIB,
        mem_total_mib: total_mib,
        // Not every board reports one (NotSupported): the share policy then
        // sizes the offline share in space.
        power_limit_w: dev.enforced_power_limit().ok().map(|mw| mw / 1000),
        processes,
    })
}

/// The compute processes on a GPU with the memory NVML attributes to each.
/// Clients of an MPS server are reported by the MPS variant (Volta and
/// newer); a driver without it leaves the plain list.
pub fn gpu_processes(dev: &nvml_wrapper::Device) -> Result<Vec<Process>, NvmlError> {
    let mut found = dev.running_compute_processes()?;
    match dev.mps_running_compute_processes() {
        Ok(mps) => {
            for p in mps {
                if !found.iter().any(|f| f.pid == p.pid) {
                    found.push(p);
                }
            }
        }
        Err(e) => tracing::debug!("NVML MPS compute processes: {e}"),
    }
    Ok(found
        .into_iter()
        .map(|p| Process {
            pid: p.pid,
            used_mib: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b / MIB),
                UsedGpuMemory::Unavailable => None,
            },
        })
        .collect())
}
