//! The sharing policies a replay compares.

use serde::{Serialize, Serializer};

/// A sharing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PolicyKind {
    /// No sharing: offline jobs only on GPUs with no online service.
    Exclusive,
    /// Co-location without protection, at the measured pair throughputs.
    TimeSharing,
    /// Co-location with the offline job at low priority.
    Priority,
    /// The matcher, the SM policy, the health FSM and xCUDA.
    Muxflow,
    /// `muxflow` with K offline jobs per GPU (`[policy] offline_per_gpu` =
    /// K, 2 to 4; issue 15): `muxflow-n2` … `muxflow-n4`.
    MuxflowN(u8),
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Exclusive,
        PolicyKind::TimeSharing,
        PolicyKind::Priority,
        PolicyKind::Muxflow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Exclusive => "exclusive",
            PolicyKind::TimeSharing => "time-sharing",
            PolicyKind::Priority => "priority",
            PolicyKind::Muxflow => "muxflow",
            PolicyKind::MuxflowN(2) => "muxflow-n2",
            PolicyKind::MuxflowN(3) => "muxflow-n3",
            PolicyKind::MuxflowN(_) => "muxflow-n4",
        }
    }

    pub fn parse(s: &str) -> Result<PolicyKind, String> {
        if let Some(p) = PolicyKind::ALL.into_iter().find(|p| p.name() == s.trim()) {
            return Ok(p);
        }
        if let Some(k) = s.trim().strip_prefix("muxflow-n") {
            return match k.parse::<u8>() {
                Ok(1) => Ok(PolicyKind::Muxflow),
                Ok(k @ 2..=4) => Ok(PolicyKind::MuxflowN(k)),
                _ => Err(format!(
                    "policy '{s}': muxflow-nK runs K offline jobs per GPU, K from 2 to 4 (as [policy] offline_per_gpu; muxflow is K = 1)"
                )),
            };
        }
        Err(format!(
            "unknown policy '{s}' (expected exclusive, time-sharing, priority, muxflow or muxflow-n2 to muxflow-n4)"
        ))
    }

    /// Its place among the policies (exclusive 0 … muxflow 3, muxflow-nK
    /// 2 + K): colors in the plot.
    pub fn ordinal(self) -> usize {
        match self {
            PolicyKind::Exclusive => 0,
            PolicyKind::TimeSharing => 1,
            PolicyKind::Priority => 2,
            PolicyKind::Muxflow => 3,
            PolicyKind::MuxflowN(k) => 2 + usize::from(k),
        }
    }

    /// `muxflow` or `muxflow-nK`: the production decision code.
    pub fn is_muxflow(self) -> bool {
        matches!(self, PolicyKind::Muxflow | PolicyKind::MuxflowN(_))
    }

    /// Offline jobs per GPU: K under `muxflow-nK`, else 1.
    pub fn offline_per_gpu(self) -> u8 {
        match self {
            PolicyKind::MuxflowN(k) => k,
            _ => 1,
        }
    }

    pub(super) fn shares(self) -> bool {
        self != PolicyKind::Exclusive
    }
}

/// A policy prints as its name (`--json`'s `name`).
impl Serialize for PolicyKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}
