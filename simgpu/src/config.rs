//! Per-GPU static configuration: `<gpu dir>/config.toml`, human-editable.

use serde::{Deserialize, Serialize};

/// Static description of one simulated GPU and its model parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Index on its node (the NVML / CUDA ordinal before CUDA_VISIBLE_DEVICES).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub sm_count: u32,
    pub memory_mib: u64,
    pub max_sm_clock_mhz: u32,
    /// Window for utilization / SM activity, and of the power controller
    /// behind the SM clock, milliseconds.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
    /// SM activity above which the clock starts to fall (power capping).
    #[serde(default = "default_clock_knee")]
    pub clock_knee: f64,
    /// Clock at 100% SM activity as a fraction of the max clock.
    #[serde(default = "default_min_clock_frac")]
    pub min_clock_frac: f64,
    /// Share of priority-1 SM demand that still competes with a priority-0
    /// kernel (MPS priority orders pending blocks; resident ones keep their
    /// SMs). Power capping is shared in full regardless (see the model).
    #[serde(default = "default_interference")]
    pub low_priority_interference: f64,
    /// CUDA compute capability NVML reports, "major.minor" (H100: 9.0).
    /// Below 7.0, or a Tegra value, NVIDIA's multi-user MPS is unavailable.
    #[serde(default = "default_compute_capability")]
    pub compute_capability: String,
}

fn default_window_ms() -> u64 {
    1000
}
fn default_clock_knee() -> f64 {
    0.7
}
fn default_min_clock_frac() -> f64 {
    0.75
}
fn default_interference() -> f64 {
    0.1
}
fn default_compute_capability() -> String {
    "9.0".into()
}

impl GpuConfig {
    /// An H100-like default; `node` only feeds the UUID so every GPU differs.
    pub fn h100_like(node: u32, index: u32) -> Self {
        GpuConfig {
            index,
            name: "NVIDIA H100 80GB HBM3 (simulated)".into(),
            uuid: format!("GPU-51a0c0de-0000-4000-8000-{node:06x}{index:06x}"),
            sm_count: 132,
            memory_mib: 81559,
            max_sm_clock_mhz: 1980,
            window_ms: default_window_ms(),
            clock_knee: default_clock_knee(),
            min_clock_frac: default_min_clock_frac(),
            low_priority_interference: default_interference(),
            compute_capability: default_compute_capability(),
        }
    }

    /// [`compute_capability`](Self::compute_capability) as numbers; None
    /// when it does not read as "major.minor".
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        let (major, minor) = self.compute_capability.trim().split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    }

    /// PCI (domain, bus, device) the fake NVML reports and the simulated
    /// kernel log names in Xid lines: bus 0x18 + 0x10 * index, like the
    /// spread-out buses of an 8-GPU server.
    pub fn pci(&self) -> (u32, u32, u32) {
        (0, (0x18 + 0x10 * self.index) % 0x100, 0)
    }

    /// NVML's `busId` form of [`pci`](Self::pci): `00000000:18:00.0`.
    pub fn pci_bus_id(&self) -> String {
        let (domain, bus, device) = self.pci();
        format!("{domain:08X}:{bus:02X}:{device:02X}.0")
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * 1024 * 1024
    }

    pub fn model(&self) -> crate::model::ModelParams {
        crate::model::ModelParams {
            sm_count: self.sm_count.max(1),
            max_clock_mhz: self.max_sm_clock_mhz,
            clock_knee: self.clock_knee,
            min_clock_frac: self.min_clock_frac,
            interference: self.low_priority_interference,
            window_ns: self.window_ms.max(1) * 1_000_000,
        }
    }
}
