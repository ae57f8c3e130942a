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
    /// How sharing slows kernels: `t4-like` (power capping: the clock falls
    /// past the knee), `h100-like` (the clock stays flat; co-running work
    /// slows kernels through the memory system and launch path below SM
    /// saturation) or `h200-like` (that, refitted, plus a dispatch queue).
    /// See simgpu/README.md, "The contention model".
    #[serde(default)]
    pub model: GpuModel,
    /// `h100-like` and `h200-like`: a kernel runs `1 + this x (other
    /// processes' SM demand / sm_count)` times longer. Unset: the mode's
    /// value ([`SHARED_PATH_SLOWDOWN`], [`H200_SHARED_PATH_SLOWDOWN`]), so
    /// that switching `model` switches it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_path_slowdown: Option<f64>,
    /// `h200-like`: the dispatch queue's share of a running lower-priority
    /// kernel's remaining time. Unset: [`H200_RESIDENT_WAIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_wait: Option<f64>,
    /// `h200-like`: the dispatch queue's share of same-priority work in
    /// flight. Unset: [`H200_QUEUE_WAIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait: Option<f64>,
    /// SMs in one chunk of MPS static SM partitioning (`sm_partition add
    /// <uuid> <chunks>`): NVIDIA documents that the unit is
    /// architecture-dependent, not its size; 4 is what users report for
    /// Ampere data-centre GPUs, taken here for every simulated GPU (a guess;
    /// simgpu/README.md, "Static SM partitions").
    #[serde(default = "default_sm_per_chunk")]
    pub sm_per_chunk: u32,
    /// The enforced power limit NVML reports, W. Unset: the mode's board
    /// ([`GpuConfig::power_limit_w`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<u32>,
}

fn default_sm_per_chunk() -> u32 {
    4
}

/// The contention modes a simulated GPU can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GpuModel {
    /// Power-limited (MuxFlow's 70 W T4s): sharing raises SM activity past
    /// the knee, the SM clock falls and every kernel on the GPU slows.
    #[default]
    #[serde(rename = "t4-like")]
    T4Like,
    /// Big GPU (the H100 of real-gpu/README.md): the clock stays at its
    /// maximum; what another process runs beside a kernel slows it.
    #[serde(rename = "h100-like")]
    H100Like,
    /// Big GPU fitted to the H200 of `notes/h200-2026-11-28.md`: the clock
    /// stays at its maximum; co-running work slows a kernel, and work
    /// another process has in flight delays its start (a dispatch queue).
    #[serde(rename = "h200-like")]
    H200Like,
}

impl std::str::FromStr for GpuModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "t4-like" => Ok(GpuModel::T4Like),
            "h100-like" => Ok(GpuModel::H100Like),
            "h200-like" => Ok(GpuModel::H200Like),
            other => Err(format!(
                "unknown GPU model '{other}' (accepted: t4-like, h100-like, h200-like)"
            )),
        }
    }
}

/// The `h100-like` slowdown per unit of other processes' SM demand: 0.6.
/// Source: real-gpu/README.md (H100 80GB, 2026-11-26): beside a ResNet-50
/// trainer at 26-32 % SM activity under MPS, with the clock at 1980 MHz,
/// the ResNet-50 service's p50 (at 17 % busy, little queueing: p50 is
/// about its kernels' time) rose x1.03 and x1.32 in two runs; the middle,
/// x1.175, over a co-runner at ~0.29 activity gives 0.175 / 0.29 = 0.6.
/// Not fitted to any mechanism. Cross-check: a trainer that fills the GPU
/// then slows each kernel x1.6, and Tally (ASPLOS'25, A100) measured plain
/// MPS p99 x1.29-3.53 (Llama-2-7B server) beside six trainers: per-kernel
/// x1.6 plus the queueing it causes is in that range.
pub const SHARED_PATH_SLOWDOWN: f64 = 0.6;

// The h200-like parameters, fitted to the H200 rows of
// notes/h200-2026-11-28.md with `scripts/closed-loop --gpu h200-like` (its
// service and trainer are the H200 run's; simgpu/README.md, "h200-like:
// fitted and predicted").
/// `h200-like`: slowdown per unit of other processes' SM demand. Fitted to
/// the unprotected p50, x1.8-2.1 (middle x1.95), beside the H200's trainer
/// as its launch count says it is: ~650 short kernels a step (xCUDA's
/// counters, notes/h200-2026-11-28.md; simgpu/README.md). With kernels
/// that short the dispatch queue's resident wait hardly moves the p50
/// (0.33, 0.5, 0.8 gave x1.56, x1.68, x1.71, three repeats each, under
/// load), so this term carries it: on the quiet machine, three repeats
/// each, 1.0 gave x1.94, 1.1 x2.07, 1.2 x2.17-2.21 (three runs). (With the
/// earlier 20 kernels of 375 us a step the two could not be told apart
/// and this stayed at h100-like's 0.6.)
pub const H200_SHARED_PATH_SLOWDOWN: f64 = 1.0;
/// `h200-like`: share of a running lower-priority kernel's remaining time
/// a kernel waits (resident blocks retire before the freed SMs take it).
/// Fitted to the unprotected p50 beside the earlier trainer shape (20
/// kernels of 375 us a step: 0.30 gave x1.87/x1.66, 0.35 x2.03/x2.08; 0.33
/// between them); kept with today's shape, where it moves the p50 little
/// ([`H200_SHARED_PATH_SLOWDOWN`]).
pub const H200_RESIDENT_WAIT: f64 = 0.33;
/// `h200-like`: share of same-priority in-flight work a kernel waits
/// behind. Fitted to the trainer without client priority (same share):
/// p99 x2.44 of the prioritized one on the H200; with the earlier trainer
/// shape 0.06 gave x1.55, 0.07 x1.91, 0.08 x7.7 (one run each). With
/// today's shape 0.07 and 0.09 both give x1.71 (three repeats each): the
/// row no longer moves with it, so it is kept, and the H200's x2.44 is
/// missed.
pub const H200_QUEUE_WAIT: f64 = 0.07;

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
            model: GpuModel::default(),
            shared_path_slowdown: None,
            resident_wait: None,
            queue_wait: None,
            sm_per_chunk: default_sm_per_chunk(),
            power_limit_w: None,
        }
    }

    /// The enforced power limit NVML reports, W: the configured one, else
    /// the mode's board: `t4-like` a T4's 70 W (the power-limited board it
    /// models), `h100-like` and `h200-like` an SXM board's 700 W.
    pub fn power_limit_w(&self) -> u32 {
        self.power_limit_w.unwrap_or(match self.model {
            GpuModel::T4Like => 70,
            GpuModel::H100Like | GpuModel::H200Like => 700,
        })
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
            // Big GPUs: the clock never falls (knee at full activity).
            clock_knee: match self.model {
                GpuModel::T4Like => self.clock_knee,
                GpuModel::H100Like | GpuModel::H200Like => 1.0,
            },
            min_clock_frac: self.min_clock_frac,
            interference: self.low_priority_interference,
            shared_path_slowdown: match self.model {
                GpuModel::T4Like => 0.0,
                GpuModel::H100Like => self.shared_path_slowdown.unwrap_or(SHARED_PATH_SLOWDOWN),
                GpuModel::H200Like => self
                    .shared_path_slowdown
                    .unwrap_or(H200_SHARED_PATH_SLOWDOWN),
            }
            .max(0.0),
            resident_wait: match self.model {
                GpuModel::H200Like => self.resident_wait.unwrap_or(H200_RESIDENT_WAIT),
                _ => 0.0,
            },
            queue_wait: match self.model {
                GpuModel::H200Like => self.queue_wait.unwrap_or(H200_QUEUE_WAIT),
                _ => 0.0,
            },
            window_ns: self.window_ms.max(1) * 1_000_000,
        }
    }
}
