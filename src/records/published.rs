//! What a node publishes to slurmctld about its GPUs, for the matcher and
//! the offline gating: one line in the node's `Extra` field, e.g.
//!
//! ```text
//! muxflow:v1 gpu0.state=healthy gpu0.solo_sm=35 gpu0.online_mem_mib=12000 gpu0.mem_mib=81559 gpu0.offline=0 gpu1.state=busy …
//! ```
//!
//! `solo_sm` is the online job's SM activity (percent) measured while no
//! offline client ran on that GPU; absent when never measured.
//! `power_w`: the board's enforced power limit (W), absent where NVML gives
//! none. `multiuser=1`: the GPU's MPS daemon serves every user's clients in one
//! server (`crate::node::mps`); `0`, or absent (a node of an older muxflow): one
//! user at a time, so only one user's jobs may share the GPU.

use crate::policy::health::HealthState;
use crate::records::kv::{self, Fields, KvError};

pub const TAG: &str = "muxflow:v1";

/// One GPU as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPublished {
    pub index: u32,
    pub state: HealthState,
    pub solo_sm_pct: Option<u8>,
    pub online_mem_mib: Option<u64>,
    pub mem_mib: u64,
    /// Offline jobs running on it.
    pub offline: u32,
    /// Its MPS daemon serves clients of every user (multi-user mode).
    pub multiuser: bool,
    /// The board's enforced power limit, W; None where NVML gives none (or
    /// a node of an older muxflow).
    pub power_w: Option<u32>,
}

impl GpuPublished {
    /// What the share policy knows of this GPU
    /// ([`crate::policy::share::offline_sm_budget`]).
    pub fn facts(&self) -> crate::policy::share::GpuFacts {
        crate::policy::share::GpuFacts {
            online_solo_sm_pct: self.solo_sm_pct,
            online_mem_mib: self.online_mem_mib,
            mem_total_mib: Some(self.mem_mib),
            power_limit_w: self.power_w,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PublishedError {
    #[error("node Extra does not start with '{TAG}'")]
    NotMuxflow,
    #[error("node Extra: {0}")]
    Kv(#[from] KvError),
}

pub fn encode(gpus: &[GpuPublished]) -> String {
    let mut w = kv::Writer::new().tag(TAG);
    for g in gpus {
        let k = |f: &str| format!("gpu{}.{f}", g.index);
        w.push(&k("state"), g.state)
            .push_opt(&k("solo_sm"), g.solo_sm_pct)
            .push_opt(&k("online_mem_mib"), g.online_mem_mib)
            .push(&k("mem_mib"), g.mem_mib)
            .push(&k("offline"), g.offline)
            .push(&k("multiuser"), u8::from(g.multiuser))
            .push_opt(&k("power_w"), g.power_w);
    }
    w.finish()
}

/// Parses a node's Extra; GPUs come back by ascending index.
pub fn decode(extra: &str) -> Result<Vec<GpuPublished>, PublishedError> {
    let rest = extra
        .trim()
        .strip_prefix(TAG)
        .ok_or(PublishedError::NotMuxflow)?;
    let map = kv::parse(rest)?;
    let mut indices: Vec<u32> = map
        .keys()
        .filter_map(|k| k.strip_prefix("gpu")?.split_once('.')?.0.parse().ok())
        .collect();
    indices.sort_unstable();
    indices.dedup();
    let f = Fields(&map);
    indices
        .into_iter()
        .map(|i| {
            let k = |f: &str| format!("gpu{i}.{f}");
            Ok(GpuPublished {
                index: i,
                state: f.require(&k("state"))?,
                solo_sm_pct: f.get(&k("solo_sm"))?,
                online_mem_mib: f.get(&k("online_mem_mib"))?,
                mem_mib: f.require(&k("mem_mib"))?,
                offline: f.get(&k("offline"))?.unwrap_or(0),
                multiuser: f.get::<u8>(&k("multiuser"))?.unwrap_or(0) == 1,
                power_w: f.get(&k("power_w"))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, state: HealthState) -> GpuPublished {
        GpuPublished {
            index,
            state,
            solo_sm_pct: Some(35),
            online_mem_mib: None,
            mem_mib: 81559,
            offline: 1,
            multiuser: index.is_multiple_of(2),
            // Published where NVML gave one, absent where not.
            power_w: (index == 0).then_some(700),
        }
    }

    #[test]
    fn round_trip() {
        let gpus = vec![
            gpu(0, HealthState::Healthy),
            gpu(1, HealthState::Faulty),
            gpu(10, HealthState::Busy),
        ];
        let text = encode(&gpus);
        assert!(
            text.starts_with("muxflow:v1 gpu0.state=healthy gpu0.solo_sm=35 "),
            "{text}"
        );
        assert_eq!(decode(&text).unwrap(), gpus);
    }

    #[test]
    fn rejects_foreign_and_broken_text() {
        assert_eq!(decode("rack=12"), Err(PublishedError::NotMuxflow));
        assert!(decode("muxflow:v1 gpu0.state=sick gpu0.mem_mib=1")
            .unwrap_err()
            .to_string()
            .contains("gpu0.state"));
        assert!(decode("muxflow:v1 gpu0.state=healthy")
            .unwrap_err()
            .to_string()
            .contains("gpu0.mem_mib"));
        assert_eq!(decode("muxflow:v1").unwrap(), vec![]);
    }

    #[test]
    fn a_node_that_does_not_say_multiuser_serves_one_user() {
        let old = decode("muxflow:v1 gpu0.state=healthy gpu0.mem_mib=1").unwrap();
        assert!(!old[0].multiuser);
        let new = decode("muxflow:v1 gpu0.state=healthy gpu0.mem_mib=1 gpu0.multiuser=1").unwrap();
        assert!(new[0].multiuser);
        assert!(decode("muxflow:v1 gpu0.state=healthy gpu0.mem_mib=1 gpu0.multiuser=yes").is_err());
    }
}
