//! What a health step decided, per GPU: the record persisted under the GPU's
//! lock (`<state_dir>/gpu<i>/record.json`). [`crate::sysmon`] writes it and
//! [`crate::publish`] reads it; neither imports the other's logic.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use anyhow::Context;
use muxflow::node::state::NodeState;
use muxflow::policy::health::{Fsm, HealthState};
use muxflow::records::published::GpuPublished;
use serde::{Deserialize, Serialize};

/// Which program runs the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    JobStart,
    JobEnd,
    HealthCheck,
    /// `muxflow-health --report` (an NHC check): a health check that
    /// reports a lost GPU and leaves the drain to its caller.
    HealthReport,
}

impl Trigger {
    /// A periodic health check (either way it is run).
    pub fn is_health_check(self) -> bool {
        matches!(self, Trigger::HealthCheck | Trigger::HealthReport)
    }
}

/// One history sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub t_s: u64,
    pub util_pct: f64,
    pub sm_pct: Option<f64>,
    pub clock_frac: Option<f64>,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    /// Online / offline clients (processes and registered jobs) on the GPU.
    pub online: u32,
    pub offline: u32,
    /// An online job ran and no offline one: a solo measurement.
    pub solo: bool,
}

pub use muxflow::policy::health::Solo;

/// Everything persisted per GPU besides the health word.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub state: String,
    pub since_s: u64,
    pub lost: bool,
    pub mem_total_mib: u64,
    /// The board's enforced power limit, W (the last NVML gave; records of
    /// an older muxflow have none).
    #[serde(default)]
    pub power_limit_w: Option<u32>,
    pub history: VecDeque<Sample>,
    pub solo: Option<Solo>,
    /// Byte offsets of the MPS log files already scanned.
    pub log_offsets: BTreeMap<String, u64>,
    /// Matched rules and actions taken, by name.
    pub counters: BTreeMap<String, u64>,
    pub last_fault: Option<String>,
    pub offline: u32,
}

impl GpuRecord {
    pub(crate) fn new(now_s: u64) -> Self {
        GpuRecord {
            state: HealthState::Healthy.to_string(),
            since_s: now_s,
            lost: false,
            mem_total_mib: 0,
            power_limit_w: None,
            history: VecDeque::new(),
            solo: None,
            log_offsets: BTreeMap::new(),
            counters: BTreeMap::new(),
            last_fault: None,
            offline: 0,
        }
    }

    pub fn fsm(&self) -> Fsm {
        Fsm {
            state: self.state.parse().unwrap_or(HealthState::Healthy),
            since_s: self.since_s,
        }
    }

    /// What is published of GPU `index`; `multiuser`: how its MPS daemon
    /// serves users (`MpsDaemon::published_mode`), not kept in the record.
    pub fn published(&self, index: u32, multiuser: bool) -> GpuPublished {
        let solo = self.solo.as_ref();
        GpuPublished {
            index,
            state: self.fsm().state,
            solo_sm_pct: solo.and_then(Solo::published_sm_pct),
            online_mem_mib: solo.map(|s| s.mem_mib),
            mem_mib: self.mem_total_mib,
            offline: self.offline,
            multiuser,
            power_w: self.power_limit_w,
        }
    }

    pub(crate) fn count(&mut self, key: &str) {
        *self.counters.entry(key.to_string()).or_insert(0) += 1;
    }
}

pub fn record_path(ns: &NodeState, gpu: u32) -> PathBuf {
    ns.gpu_dir(gpu).join("record.json")
}

/// GPU `gpu`'s record; None when never written.
pub fn load_record(ns: &NodeState, gpu: u32) -> anyhow::Result<Option<GpuRecord>> {
    let path = record_path(ns, gpu);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{}: corrupt record", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// " (No space left on device: DIR)" when the state directory is full,
/// so a failure says what it is; "" otherwise.
pub fn space_note(ns: &NodeState) -> String {
    ns.space_problem()
        .map(|p| format!(" ({p})"))
        .unwrap_or_default()
}
