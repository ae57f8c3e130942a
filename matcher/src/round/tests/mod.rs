//! The round's tests, by what they show: placement and reasons
//! ([`placement`]), the window of held jobs ([`window`]), sized slots,
//! pricing, column classes and the cache ([`slots`]).

mod placement;
mod slots;
mod window;

use super::*;
use crate::predict::{Model, Seat};
use crate::reader::{GpuState, PendingJob};
use crate::weights::quantize;
use muxflow::config::CoLocate;
use muxflow::policy::health::HealthState;
use muxflow::records::placement::Waiting;
use muxflow::records::published::GpuPublished;

fn gpu(node: &str, state: HealthState, solo: u8, online_mem: u64, used: bool) -> GpuState {
    GpuState {
        node: node.into(),
        index: 0,
        published: GpuPublished {
            index: 0,
            state,
            solo_sm_pct: Some(solo),
            online_mem_mib: Some(online_mem),
            mem_mib: 81_559,
            offline: 0,
            multiuser: true,
            power_w: None,
        },
        online_jobs: vec![1],
        slots_used: u32::from(used),
        offline_jobs: u32::from(used),
        owners: Vec::new(),
    }
}

fn job(id: u32, name: &str, held: bool, req: &str, slot: Option<u32>) -> PendingJob {
    PendingJob {
        id,
        user: "u".into(),
        account: String::new(),
        name: name.into(),
        required_nodes: req.into(),
        slot_gpus: slot.into_iter().collect(),
        gpus: 1,
        slots: slot.iter().map(|_| 1).collect(),
        held,
        waiting: None,
        refusals: 0,
        earlier: Default::default(),
        need: Default::default(),
        array_task: None,
        unstartable: None,
    }
}

fn names() -> Names {
    Names::from_config(&muxflow::config::Slurm::default())
}

/// A model with no learned part, but peaks for `big` (60 GB).
fn model() -> Model {
    let mut m = Model::default();
    m.profiles.insert(
        ("u".into(), "big".into()),
        crate::predict::Profile {
            peak_mib: Some(60_000),
            ..Default::default()
        },
    );
    m
}

fn needing(id: u32, cpus: u32, mem_mib: u64) -> PendingJob {
    PendingJob {
        need: NodeRoom { cpus, mem_mib },
        ..job(id, "small", true, "", None)
    }
}

fn rooms(list: &[(&str, u32, u64)]) -> std::collections::BTreeMap<String, NodeRoom> {
    list.iter()
        .map(|&(n, cpus, mem_mib)| (n.to_string(), NodeRoom { cpus, mem_mib }))
        .collect()
}
