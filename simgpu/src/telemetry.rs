//! Readings the NVML fake and `simgpu-ctl table` report, from the same code.

use crate::config::GpuConfig;
use crate::model;
use crate::shared::{SharedGpu, Table};
use std::sync::atomic::Ordering;

#[derive(Debug, Clone, PartialEq)]
pub struct ClientInfo {
    pub pid: i32,
    pub priority: u32,
    pub thread_pct: u32,
    pub mem_used: u64,
    pub mem_limit: u64,
    pub sticky: u32,
    /// The MPS server it is a client of (0: not under MPS).
    pub mps_server: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub utilization: f64,
    pub sm_activity: f64,
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    pub mem_used: u64,
    pub mem_total: u64,
    pub clients: Vec<ClientInfo>,
    pub lost: bool,
}

pub fn clients(t: &Table) -> Vec<ClientInfo> {
    t.clients
        .iter()
        .filter(|c| c.pid.load(Ordering::Relaxed) != 0)
        .map(|c| ClientInfo {
            pid: c.pid.load(Ordering::Relaxed),
            priority: c.priority,
            thread_pct: c.thread_pct,
            mem_used: c.mem_used,
            mem_limit: c.mem_limit,
            sticky: c.sticky.load(Ordering::Relaxed),
            mps_server: c.mps_server,
        })
        .collect()
}

/// Reading at `now` (prunes dead clients as a side effect).
pub fn read(cfg: &GpuConfig, gpu: &SharedGpu, now: u64) -> Reading {
    let p = cfg.model();
    let mut t = gpu.lock();
    t.prune_dead();
    let ks = t.kernels_since(now.saturating_sub(p.window_ns));
    let s = model::sample(&p, &ks, t.external(), now);
    Reading {
        utilization: s.utilization,
        sm_activity: s.sm_activity,
        sm_clock_mhz: s.sm_clock_mhz.round() as u32,
        max_sm_clock_mhz: cfg.max_sm_clock_mhz,
        mem_used: t.mem_used(),
        mem_total: cfg.memory_bytes(),
        clients: clients(&t),
        lost: t.lost.load(Ordering::Relaxed) != 0,
    }
}

/// SM activity over an explicit interval (the GPM stand-in over two samples).
pub fn sm_activity_between(cfg: &GpuConfig, gpu: &SharedGpu, t0: u64, t1: u64) -> f64 {
    let p = cfg.model();
    let t = gpu.lock();
    model::sm_activity(&p, t.spans(), t.external(), t0, t1)
}

/// Each client's SM activity over the window ending at `now`, percent of
/// the GPU's SMs (what `nvmlDeviceGetProcessUtilization` reports as
/// `smUtil`): the client's own kernels' demand, as [`model::sm_activity`]
/// counts the GPU's, without the scripted external load.
pub fn process_sm_pct(cfg: &GpuConfig, gpu: &SharedGpu, now: u64) -> Vec<(i32, u32)> {
    let p = cfg.model();
    let mut t = gpu.lock();
    t.prune_dead();
    let t0 = now.saturating_sub(p.window_ns);
    let ks = t.kernels_since(t0);
    clients(&t)
        .iter()
        .map(|c| {
            let mine = ks.iter().copied().filter(|k| k.pid == c.pid);
            let a = model::sm_activity(&p, mine, model::ExternalLoad::default(), t0, now);
            (c.pid, (a * 100.0).round() as u32)
        })
        .collect()
}
