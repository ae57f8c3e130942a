//! The hints that steer a pending offline job, and the diff between what
//! Slurm has and what the round wants.
//!
//! * **Parked**: held (job_submit.lua submits offline jobs with priority 0,
//!   Reason=JobHeldUser). The daemon then writes why it waits into its
//!   AdminComment (`waiting=free_gpu since=… rounds_every=60s`,
//!   [`Waiting`]) with an operator's hold (`Priority=0` from root:
//!   Reason=JobHeldAdmin), so `squeue` does not show the user's own hold,
//!   `scontrol show job` says why, and its owner cannot release it
//!   ([`note_args`]). It is rewritten only when the reason changes. The
//!   reason in words goes into the job's Comment too, the column a user
//!   can ask squeue for, unless the Comment is the user's own
//!   ([`muxflow::records::job_comment`]); a placement replaces it with
//!   where the job went ([`with_placed_comment`]).
//! * **Placed** on (node K, GPU I): `ReqNodeList=K`, `Gres=<slot>:gI:1`, the
//!   placement in its AdminComment (`placed=K:gI`, see
//!   [`muxflow::records::placement`]: only root and SlurmUser can write it, and the
//!   Prolog refuses an offline job whose slot is not the one written there),
//!   and not held: Slurm starts it there.
//!
//! Placing a held job is `scontrol update …` then `scontrol release`; parking
//! is `scontrol hold`. A matcher killed between the two calls of a placement
//! leaves a held job with its hint; the next round reads that back as parked
//! and places it again (the same values, then the release). Nothing the
//! matcher remembers is needed for that.
//!
//! Slurm 22.05 keeps the first typed GRES a job was given through every
//! later `Gres=` update (a job moved from `mfslot:g0` to `mfslot:g1` would
//! hold both), so a job whose slot type is set is only ever re-placed on the
//! same GPU index, and parking leaves the slot request alone. The count of
//! the same type does change (`mfslot:g0:2` → `:1` → `:2` on a held job,
//! checked on the dev cluster), so a round may resize a placed job's slots.
//!
//! Parking by a constraint no node has is not possible: Slurm 22.05 rejects
//! such a job at submit ("Invalid feature specification").

use muxflow::records::admin_comment::AdminComment;
use muxflow::records::job_comment;
use muxflow::records::placement::{Placement, Waiting};

use crate::reader::{Names, PendingJob};

/// Where the round wants a job: parked, or on these GPUs (ascending; one,
/// or a k-GPU job's gang) of one node, holding `slots[i]` offline slots of
/// `gpus[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Parked,
    Gpus {
        node: String,
        gpus: Vec<u32>,
        slots: Vec<u32>,
    },
}

/// Where Slurm's hints currently put the job.
pub fn current(job: &PendingJob) -> Target {
    match job.held {
        false
            if !job.slot_gpus.is_empty()
                && !job.required_nodes.is_empty()
                && !job.required_nodes.contains(',') =>
        {
            Target::Gpus {
                node: job.required_nodes.clone(),
                gpus: job.slot_gpus.clone(),
                slots: job.slots.clone(),
            }
        }
        // Not held but not fully placed either (e.g. released by hand):
        // treat as parked so the round rewrites it one way or the other.
        _ => Target::Parked,
    }
}

/// The scontrol calls (each a full argument list) that move `job` to
/// `target`, in order, or `None` when Slurm already has it there.
pub fn update_args(job: &PendingJob, target: &Target, names: &Names) -> Option<Vec<Vec<String>>> {
    match target {
        Target::Parked if job.held => None,
        Target::Parked => Some(vec![vec!["hold".to_string(), job.slurm_id()]]),
        t if *t == current(job) => None,
        Target::Gpus { node, gpus, slots } => {
            // Slurm 22.05 takes several typed slots of one GRES in one
            // request (checked on the dev cluster: `mfslot:g0:1,mfslot:g1:1`);
            // a count above 1 takes that many of the GPU's N records.
            let gres: Vec<String> = gpus
                .iter()
                .zip(slots)
                .map(|(g, s)| format!("{}:g{g}:{s}", names.offline_gres))
                .collect();
            let mut update = vec![
                "update".to_string(),
                format!("JobId={}", job.slurm_id()),
                format!("ReqNodeList={node}"),
                format!("Gres={}", gres.join(",")),
                format!(
                    "AdminComment={}",
                    Placement::on(node, gpus).admin_comment(job.refusals, &job.earlier)
                ),
            ];
            let mut calls = Vec::new();
            if job.held {
                // The hold becomes an operator's before the placement is
                // written: a user-level hold beside a placement is its
                // owner's (reader::Unstartable::UserHold), and a matcher
                // killed before the release must not leave one.
                update.push("Priority=0".to_string());
                calls.push(update);
                calls.push(vec!["release".to_string(), job.slurm_id()]);
            } else {
                calls.push(update);
            }
            Some(calls)
        }
    }
}

/// The scontrol call that records why parked `job` waits (`waiting`, since
/// `since`, local time as Slurm prints it; rounds every `every_s`) and
/// holds it as an operator, or `None` when Slurm already shows that reason.
/// Where `comment` (the job's Comment is empty or muxflow's), the reason
/// goes into its Comment too, where `squeue -O Comment` shows it.
pub fn note_args(
    job: &PendingJob,
    waiting: Waiting,
    since: &str,
    every_s: u64,
    comment: bool,
) -> Option<Vec<String>> {
    if !job.held || job.waiting == Some(waiting) {
        return None;
    }
    let mut call = vec![
        "update".to_string(),
        format!("JobId={}", job.id),
        // On a held job, root's Priority=0 turns the user's hold into an
        // operator's (Reason=JobHeldAdmin), which its owner cannot release.
        "Priority=0".to_string(),
        format!(
            "AdminComment={}",
            waiting.admin_comment(job.gpus, job.refusals, since, every_s, &job.earlier)
        ),
    ];
    if comment {
        call.push(format!("Comment={}", job_comment::waiting(waiting, since)));
    }
    Some(call)
}

/// `call` (one of [`update_args`]'s) with the placement it writes also in
/// the job's Comment, replacing the waiting reason there; `call` as it is
/// when it places nothing.
pub fn with_placed_comment(mut call: Vec<String>) -> Vec<String> {
    let placement = call
        .iter()
        .filter_map(|a| a.strip_prefix("AdminComment="))
        .find_map(|c| AdminComment::parse(c).ok()?.placement());
    let comment = match placement {
        Some(Placement::Gpu { node, gpu }) => job_comment::placed(&node, &[gpu]),
        Some(Placement::Gang { node, gpus }) => job_comment::placed(&node, &gpus),
        Some(Placement::AnySlot) | None => return call,
    };
    if call.first().map(String::as_str) == Some("update") {
        call.push(format!("Comment={comment}"));
    }
    call
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            offline_gres: "mfslot".into(),
        }
    }

    fn job(req: &str, slot: Option<u32>) -> PendingJob {
        PendingJob {
            id: 7,
            user: "u".into(),
            account: String::new(),
            name: "n".into(),
            required_nodes: req.into(),
            slot_gpus: slot.into_iter().collect(),
            gpus: 1,
            slots: slot.iter().map(|_| 1).collect(),
            held: false,
            waiting: None,
            refusals: 0,
            earlier: Default::default(),
            need: Default::default(),
            array_task: None,
            unstartable: None,
        }
    }

    fn held(req: &str, slot: Option<u32>) -> PendingJob {
        PendingJob {
            held: true,
            ..job(req, slot)
        }
    }

    #[test]
    fn place_only_when_the_hint_changes() {
        let n = names();
        let t = Target::Gpus {
            node: "node3".into(),
            gpus: vec![1],
            slots: vec![1],
        };
        // As job_submit.lua leaves it: held, no slot.
        let fresh = held("", None);
        assert_eq!(current(&fresh), Target::Parked);
        assert_eq!(
            update_args(&fresh, &t, &n).unwrap(),
            [
                vec![
                    "update",
                    "JobId=7",
                    "ReqNodeList=node3",
                    "Gres=mfslot:g1:1",
                    "AdminComment=muxflow:v1 mode=offline placed=node3:g1",
                    "Priority=0"
                ],
                vec!["release", "7"]
            ]
        );
        assert_eq!(update_args(&fresh, &Target::Parked, &n), None);
        let placed = job("node3", Some(1));
        assert_eq!(current(&placed), t);
        assert_eq!(update_args(&placed, &t, &n), None);
        let moved = Target::Gpus {
            node: "node4".into(),
            gpus: vec![1],
            slots: vec![1],
        };
        assert_eq!(
            update_args(&placed, &moved, &n).unwrap()[0][2],
            "ReqNodeList=node4"
        );
        // Alone on the GPU: both of its N = 2 slots, written as the count;
        // a job placed with one slot is rewritten when it should hold two.
        let whole = Target::Gpus {
            node: "node3".into(),
            gpus: vec![1],
            slots: vec![2],
        };
        assert_eq!(
            update_args(&fresh, &whole, &n).unwrap()[0][3],
            "Gres=mfslot:g1:2"
        );
        assert_eq!(
            update_args(&placed, &whole, &n).unwrap()[0][3],
            "Gres=mfslot:g1:2"
        );
        let placed_whole = PendingJob {
            slots: vec![2],
            ..job("node3", Some(1))
        };
        assert_eq!(current(&placed_whole), whole);
        assert_eq!(update_args(&placed_whole, &whole, &n), None);
    }

    #[test]
    fn a_gang_is_written_as_typed_slots_of_one_node_with_its_count() {
        let n = names();
        let gang = PendingJob {
            gpus: 2,
            ..held("", None)
        };
        let t = Target::Gpus {
            node: "node2".into(),
            gpus: vec![0, 1],
            slots: vec![1, 1],
        };
        assert_eq!(
            update_args(&gang, &t, &n).unwrap()[0],
            [
                "update",
                "JobId=7",
                "ReqNodeList=node2",
                "Gres=mfslot:g0:1,mfslot:g1:1",
                "AdminComment=muxflow:v1 mode=offline gpus=2 placed=node2:g0,g1",
                "Priority=0"
            ]
        );
        let placed = PendingJob {
            gpus: 2,
            slot_gpus: vec![0, 1],
            slots: vec![1, 1],
            ..job("node2", None)
        };
        assert_eq!(current(&placed), t);
        assert_eq!(update_args(&placed, &t, &n), None);
    }

    #[test]
    fn a_parked_jobs_reason_is_written_once_per_change_and_only_while_held() {
        let fresh = held("", None);
        let call = note_args(&fresh, Waiting::FreeGpu, "2026-11-23T12:14:05", 60, false).unwrap();
        assert_eq!(
            call,
            [
                "update",
                "JobId=7",
                "Priority=0",
                "AdminComment=muxflow:v1 mode=offline waiting=free_gpu since=2026-11-23T12:14:05 rounds_every=60s"
            ]
        );
        // Where the Comment is muxflow's to write, the reason is there too.
        let call = note_args(&fresh, Waiting::FreeGpu, "2026-11-23T12:14:05", 60, true).unwrap();
        assert_eq!(
            call[4],
            format!(
                "Comment=muxflow: waiting since 2026-11-23T12:14:05: {}",
                Waiting::FreeGpu.words()
            )
        );
        let noted = PendingJob {
            waiting: Some(Waiting::FreeGpu),
            ..held("", None)
        };
        assert_eq!(note_args(&noted, Waiting::FreeGpu, "later", 60, true), None);
        let changed = note_args(&noted, Waiting::OlderJobsFirst, "later", 60, false).unwrap();
        assert!(
            changed[3].contains("waiting=older_jobs_first since=later"),
            "{changed:?}"
        );
        // Not held (placed, or being parked by `hold` this round): nothing.
        assert_eq!(
            note_args(&job("node1", Some(0)), Waiting::FreeGpu, "t", 60, true),
            None
        );
        // A gang keeps its GPU count.
        let gang = PendingJob {
            gpus: 3,
            ..held("", None)
        };
        let call = note_args(&gang, Waiting::FreeNode, "t", 60, false).unwrap();
        assert!(call[3].contains(" gpus=3 waiting=free_node "), "{call:?}");
    }

    #[test]
    fn a_placement_replaces_the_waiting_reason_in_the_comment() {
        let n = names();
        let one = Target::Gpus {
            node: "node3".into(),
            gpus: vec![1],
            slots: vec![1],
        };
        let calls = update_args(&held("", None), &one, &n).unwrap();
        let update = with_placed_comment(calls[0].clone());
        assert_eq!(
            update.last().unwrap(),
            "Comment=muxflow: placed on node3 GPU 1, released to Slurm"
        );
        // The release, and a call that places nothing, stay as they are.
        assert_eq!(with_placed_comment(calls[1].clone()), calls[1]);
        let hold = vec!["hold".to_string(), "7".to_string()];
        assert_eq!(with_placed_comment(hold.clone()), hold);
        let gang = Target::Gpus {
            node: "node2".into(),
            gpus: vec![0, 1],
            slots: vec![1, 1],
        };
        let calls = update_args(&held("", None), &gang, &n).unwrap();
        assert!(with_placed_comment(calls[0].clone())
            .last()
            .unwrap()
            .ends_with("node2 GPUs 0,1, released to Slurm"));
    }

    #[test]
    fn an_arrays_record_is_placed_and_parked_as_its_first_task_alone() {
        let n = names();
        let t = Target::Gpus {
            node: "node3".into(),
            gpus: vec![1],
            slots: vec![1],
        };
        let tasks = PendingJob {
            array_task: Some(4),
            ..held("", None)
        };
        let calls = update_args(&tasks, &t, &n).unwrap();
        assert_eq!(calls[0][1], "JobId=7_4");
        assert_eq!(calls[1], ["release", "7_4"]);
    }

    #[test]
    fn clearing_holds_and_half_placements_are_repaired() {
        let n = names();
        let placed = job("node3", Some(1));
        assert_eq!(
            update_args(&placed, &Target::Parked, &n).unwrap(),
            [vec!["hold", "7"]]
        );
        // Killed between update and release: held with its hint. Read back
        // as parked; placing it again repeats the update and releases it.
        let half = held("node3", Some(1));
        assert_eq!(current(&half), Target::Parked);
        let t = Target::Gpus {
            node: "node3".into(),
            gpus: vec![1],
            slots: vec![1],
        };
        let calls = update_args(&half, &t, &n).unwrap();
        assert_eq!(calls.last().unwrap(), &vec!["release", "7"]);
        // Released by hand without a slot: not placed, so it is held again.
        let loose = job("", None);
        assert_eq!(current(&loose), Target::Parked);
        assert_eq!(
            update_args(&loose, &Target::Parked, &n).unwrap(),
            [vec!["hold", "7"]]
        );
    }
}
