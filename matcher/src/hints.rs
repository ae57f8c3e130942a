//! The hints that steer a pending offline job, and the diff between what
//! Slurm has and what the round wants.
//!
//! * **Placed** on (node K, GPU I): `ReqNodeList=K`, `Gres=<slot>:gI:1`, the
//!   constraint without the parking term. Slurm starts it there by itself.
//! * **Parked**: the parking term in the constraint (no node has that
//!   feature: Reason=BadConstraints), `ReqNodeList` empty.
//!
//! Each change is one `scontrol update` (one RPC, applied whole by
//! slurmctld), so a matcher killed at any instant leaves every job either
//! parked or placed, never half-placed; the next round reads the hints back
//! and repairs what it no longer wants. Nothing the matcher remembers is
//! needed for that.
//!
//! Slurm 22.05 keeps the first typed GRES a job was given through every
//! later `Gres=` update (a job moved from `mfslot:g0` to `mfslot:g1` would
//! hold both), so a job whose slot type is set is only ever re-placed on the
//! same GPU index, and parking leaves the slot request alone.

use crate::reader::{Names, PendingJob};

/// Where the round wants a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Parked,
    Gpu { node: String, gpu: u32 },
}

/// The parking term removed from a constraint (`X&park` → `X`).
pub fn strip_parking(features: &str, parking: &str) -> String {
    features
        .split('&')
        .filter(|t| t.trim() != parking)
        .collect::<Vec<_>>()
        .join("&")
}

/// The constraint with the parking term (once).
pub fn with_parking(features: &str, parking: &str) -> String {
    let base = strip_parking(features, parking);
    if base.is_empty() {
        parking.to_string()
    } else {
        format!("{base}&{parking}")
    }
}

pub fn is_parked(job: &PendingJob, names: &Names) -> bool {
    job.features
        .split('&')
        .any(|t| t.trim() == names.parking_feature)
}

/// Where Slurm's hints currently put the job.
pub fn current(job: &PendingJob, names: &Names) -> Target {
    match (is_parked(job, names), job.slot_gpu) {
        (false, Some(gpu))
            if !job.required_nodes.is_empty() && !job.required_nodes.contains(',') =>
        {
            Target::Gpu {
                node: job.required_nodes.clone(),
                gpu,
            }
        }
        // Not parked but not fully placed either (e.g. edited by hand):
        // treat as parked so the round rewrites it one way or the other.
        (false, _) => Target::Parked,
        (true, _) => Target::Parked,
    }
}

/// `scontrol update` arguments that move `job` to `target`, or `None` when
/// Slurm already has it there.
pub fn update_args(job: &PendingJob, target: &Target, names: &Names) -> Option<Vec<String>> {
    let cur = current(job, names);
    let fully_parked = is_parked(job, names) && job.required_nodes.is_empty();
    match target {
        Target::Parked if cur == Target::Parked && fully_parked => None,
        Target::Parked => Some(vec![
            format!("JobId={}", job.id),
            "ReqNodeList=".to_string(),
            format!(
                "Features={}",
                with_parking(&job.features, &names.parking_feature)
            ),
        ]),
        t if *t == cur => None,
        Target::Gpu { node, gpu } => Some(vec![
            format!("JobId={}", job.id),
            format!("ReqNodeList={node}"),
            format!("Gres={}:g{gpu}:1", names.offline_gres),
            format!(
                "Features={}",
                strip_parking(&job.features, &names.parking_feature)
            ),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            offline_gres: "mfslot".into(),
            parking_feature: "muxflow_unplaced".into(),
        }
    }

    fn job(features: &str, req: &str, slot: Option<u32>) -> PendingJob {
        PendingJob {
            id: 7,
            user: "u".into(),
            name: "n".into(),
            features: features.into(),
            required_nodes: req.into(),
            slot_gpu: slot,
        }
    }

    #[test]
    fn parking_term_edits() {
        assert_eq!(strip_parking("muxflow_unplaced", "muxflow_unplaced"), "");
        assert_eq!(
            strip_parking("fast&muxflow_unplaced", "muxflow_unplaced"),
            "fast"
        );
        assert_eq!(with_parking("", "muxflow_unplaced"), "muxflow_unplaced");
        assert_eq!(
            with_parking("fast", "muxflow_unplaced"),
            "fast&muxflow_unplaced"
        );
        assert_eq!(
            with_parking("fast&muxflow_unplaced", "muxflow_unplaced"),
            "fast&muxflow_unplaced"
        );
    }

    #[test]
    fn place_only_when_the_hint_changes() {
        let n = names();
        let parked = job("fast&muxflow_unplaced", "", None);
        let t = Target::Gpu {
            node: "node3".into(),
            gpu: 1,
        };
        assert_eq!(
            update_args(&parked, &t, &n).unwrap(),
            [
                "JobId=7",
                "ReqNodeList=node3",
                "Gres=mfslot:g1:1",
                "Features=fast"
            ]
        );
        assert_eq!(update_args(&parked, &Target::Parked, &n), None);
        let placed = job("fast", "node3", Some(1));
        assert_eq!(current(&placed, &n), t);
        assert_eq!(update_args(&placed, &t, &n), None);
        let moved = Target::Gpu {
            node: "node4".into(),
            gpu: 1,
        };
        assert_eq!(
            update_args(&placed, &moved, &n).unwrap()[1],
            "ReqNodeList=node4"
        );
    }

    #[test]
    fn clearing_restores_parking_and_repairs_half_states() {
        let n = names();
        let placed = job("fast", "node3", Some(1));
        assert_eq!(
            update_args(&placed, &Target::Parked, &n).unwrap(),
            ["JobId=7", "ReqNodeList=", "Features=fast&muxflow_unplaced"]
        );
        // Parked but a node left in ReqNodeList (hand edit): cleaned.
        let stale = job("muxflow_unplaced", "node2", Some(0));
        assert_eq!(current(&stale, &n), Target::Parked);
        assert!(update_args(&stale, &Target::Parked, &n).is_some());
        // Unparked without a typed slot: not placed, so it is parked again.
        let loose = job("", "", None);
        assert_eq!(current(&loose, &n), Target::Parked);
        assert!(update_args(&loose, &Target::Parked, &n).is_some());
    }
}
