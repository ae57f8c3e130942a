//! SysMonitor's per-GPU health states.
//!
//! The transition function lives here too (pure, table-tested); the node
//! programs in `prolog/` feed it NVML readings and persist the result with
//! [`crate::node_state`].

use std::fmt;
use std::str::FromStr;

/// Health of one GPU, as the offline side sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HealthState {
    /// Room to spare: offline work may be placed here and runs.
    Healthy,
    /// The online load is high: offline work runs throttled, nothing new is placed.
    Busy,
    /// The GPU is saturated: offline work is paused (xCUDA closes its gate).
    Overloaded,
    /// Errors were detected: offline work is evicted, nothing is placed.
    Faulty,
    /// Quiet period after Faulty/Overloaded before Healthy again: nothing new is placed.
    Recovering,
}

impl HealthState {
    pub const ALL: [HealthState; 5] = [
        HealthState::Healthy,
        HealthState::Busy,
        HealthState::Overloaded,
        HealthState::Faulty,
        HealthState::Recovering,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Busy => "busy",
            HealthState::Overloaded => "overloaded",
            HealthState::Faulty => "faulty",
            HealthState::Recovering => "recovering",
        }
    }

    /// May the matcher (or the fallback) place a new offline job here?
    pub fn accepts_offline(self) -> bool {
        self == HealthState::Healthy
    }

    /// Must running offline work stop launching kernels?
    pub fn pauses_offline(self) -> bool {
        matches!(self, HealthState::Overloaded | HealthState::Faulty)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown GPU health state '{0}' (expected healthy, busy, overloaded, faulty or recovering)"
)]
pub struct ParseHealthError(pub String);

impl FromStr for HealthState {
    type Err = ParseHealthError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HealthState::ALL
            .into_iter()
            .find(|h| h.as_str() == s.trim())
            .ok_or_else(|| ParseHealthError(s.trim().to_string()))
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for h in HealthState::ALL {
            assert_eq!(h.as_str().parse(), Ok(h));
        }
        assert!("sick"
            .parse::<HealthState>()
            .unwrap_err()
            .to_string()
            .contains("'sick'"));
    }

    #[test]
    fn only_healthy_accepts_offline() {
        let accepting: Vec<_> = HealthState::ALL
            .into_iter()
            .filter(|h| h.accepts_offline())
            .collect();
        assert_eq!(accepting, [HealthState::Healthy]);
        assert!(HealthState::Overloaded.pauses_offline() && HealthState::Faulty.pauses_offline());
        assert!(!HealthState::Busy.pauses_offline());
    }
}
