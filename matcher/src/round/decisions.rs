//! The decisions phase: one outcome per considered job (its gang, its GPU
//! and seat, or why it waits), fitted to each node's free CPUs and memory
//! together ([`fit_node_room`]), turned into decision lines with the hint
//! updates to send; then a line for every job the round did not score.

use std::fmt::Write as _;

use muxflow::records::placement::Waiting;

use super::matching::Matched;
use super::splits::Placed;
use super::{Action, Decision, Predictor, Round, HELD_JOBS_PER_OPEN_GPU};
use crate::gang::GangChoice;
use crate::hints::{update_args, Target};
use crate::reader::{NodeRoom, PendingJob};
use crate::weights::to_throughput;

const NO_CANDIDATE: &str =
    "no candidate: no Healthy GPU (idle or with an online job) with a free offline slot and room";

/// The reason of a placement on an idle GPU.
pub const IDLE_REASON: &str =
    "idle GPU: runs alone at its solo speed (best total predicted throughput)";

/// A job's target, its predicted speed (mean, sd), the reason and, when
/// parked, why it waits.
type Outcome = (Target, Option<(f64, f64)>, String, Option<Waiting>);

/// Why a job no node with a free GPU has room for waits.
pub(super) fn no_room_reason(need: &NodeRoom) -> String {
    format!(
        "no candidate: no node with a free GPU has the {} it asked for free",
        need_words(need)
    )
}

/// `2 CPUs and 4000 MiB of memory` (what it names).
fn need_words(need: &NodeRoom) -> String {
    let cpus = |c: u32| format!("{c} CPU{}", if c == 1 { "" } else { "s" });
    match (need.cpus, need.mem_mib) {
        (0, 0) => "resources".to_string(),
        (c, 0) => cpus(c),
        (0, m) => format!("{m} MiB of memory"),
        (c, m) => format!("{} and {m} MiB of memory", cpus(c)),
    }
}

/// Jobs placed on one node in one round must fit its free CPUs (and
/// memory, where Slurm counts it) together: each GPU was checked against
/// the node alone, and two jobs can each fit a room only one of them gets.
/// Jobs already hinted to that node keep their place first, then the
/// fastest (a gang counts once per GPU); the rest wait for the next round,
/// which reads what Slurm started meanwhile.
fn fit_node_room(
    jobs: &[&PendingJob],
    outcomes: &mut [Outcome],
    room: &std::collections::BTreeMap<String, NodeRoom>,
    memory: bool,
) {
    let node_of = |o: &Outcome| match &o.0 {
        Target::Gpus { node, .. } => Some(node.clone()),
        Target::Parked => None,
    };
    let mut order: Vec<(bool, i64, u32, usize, String)> = (0..jobs.len())
        .filter_map(|j| {
            let node = node_of(&outcomes[j])?;
            let gpus = match &outcomes[j].0 {
                Target::Gpus { gpus, .. } => gpus.len() as f64,
                Target::Parked => 0.0,
            };
            let value = outcomes[j].1.map_or(0.0, |p| p.0) * gpus;
            let moved = jobs[j].required_nodes != node;
            Some((moved, -(value * 1e6) as i64, jobs[j].id, j, node))
        })
        .collect();
    order.sort();
    let mut left = room.clone();
    for (_, _, _, j, node) in order {
        let Some(free) = left.get_mut(&node) else {
            continue;
        };
        let need = &jobs[j].need;
        if free.holds(need, true) {
            free.take(need, memory);
            continue;
        }
        outcomes[j] = (
            Target::Parked,
            None,
            format!(
                "waiting: jobs placed on {node} this round take the free CPUs and memory it needs ({}); next round",
                need_words(need)
            ),
            Some(Waiting::NodeRoom),
        );
    }
}

impl<P: Predictor> Round<'_, P> {
    /// Every pending job's decision line, by job id.
    pub(super) fn decisions(&self, matched: &Matched, placed: &Placed) -> Vec<Decision> {
        let mut outcomes: Vec<Outcome> = (0..self.jobs.len())
            .map(|j| match (&matched.gang_of[j], placed.assigned[j]) {
                (Some(c), _) => self.gang_outcome(j, c),
                (None, _) if self.is_gang[j] => (
                    Target::Parked,
                    None,
                    format!(
                        "no candidate: no node with {} Healthy GPUs free for it (idle or with an online job, with room)",
                        self.jobs[j].gpus
                    ),
                    Some(Waiting::FreeNode),
                ),
                (None, Some((g, w))) => self.placed_outcome(j, g as usize, w, placed),
                (None, None) => self.parked_outcome(j, matched.has_edge[j]),
            })
            .collect();
        fit_node_room(
            &self.jobs,
            &mut outcomes,
            &self.state.node_room,
            self.state.memory_consumable,
        );
        let mut decisions = Vec::with_capacity(self.state.pending.len());
        for (&job, outcome) in self.jobs.iter().zip(outcomes) {
            decisions.push(self.decision(job, outcome));
        }
        // Held jobs no node can take this round: parked with the reason.
        for &i in &self.unplaceable {
            let job = &self.state.pending[i];
            let (waiting, reason) = self.reach.short_of(job).expect("unplaceable");
            decisions.push(parked(job, reason, waiting));
        }
        // Jobs Slurm would not start now: parked, so a slot they hold goes
        // back to the pool (a user's hold is already a park and stays).
        for job in &self.state.pending {
            if let Some(why) = job.unstartable {
                decisions
                    .push(self.decision(job, (Target::Parked, None, why.words(), why.waiting())));
            }
        }
        self.beyond_the_window(&mut decisions);
        // The table by job id, whatever turn order the round scored them in.
        decisions.sort_by_key(|d| d.job);
        decisions
    }

    /// A gang's outcome: its GPUs on one node, at its slowest GPU's speed
    /// (synchronous training).
    fn gang_outcome(&self, j: usize, c: &GangChoice) -> Outcome {
        let first = self.gpu_of(c.gpus[0] as usize);
        let shown = c
            .gpus
            .iter()
            .filter_map(|&g| self.estimate_at(j, g as usize, &self.whole[g as usize]))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or((to_throughput(c.min_weight), 0.0));
        let mut gpus: Vec<(u32, u32)> = c
            .gpus
            .iter()
            .map(|&g| (self.gpu_of(g as usize).index, self.free[g as usize]))
            .collect();
        gpus.sort_unstable();
        (
            Target::Gpus {
                node: first.node.clone(),
                gpus: gpus.iter().map(|&(i, _)| i).collect(),
                slots: gpus.iter().map(|&(_, s)| s).collect(),
            },
            Some(shown),
            format!(
                "gang of {} GPUs on one node at its slowest GPU's speed (greedy, before the exact matching)",
                self.jobs[j].gpus
            ),
            None,
        )
    }

    /// A 1-GPU job's outcome on column c (matched there with weight `w`,
    /// or 0 when a split put it there), in its seat.
    fn placed_outcome(&self, j: usize, c: usize, w: i64, placed: &Placed) -> Outcome {
        let per_gpu = self.per_gpu;
        let gpu = self.gpu_of(c);
        let at = placed.seat[j].unwrap_or(self.seat_of(c, 0, 1));
        let shown = self
            .estimate_at(j, c, &self.side(c, at))
            .unwrap_or((to_throughput(w), 0.0));
        let alone = at.offline_jobs == 1 && at.slots == per_gpu;
        let mut reason = if gpu.online_jobs.is_empty() && alone {
            IDLE_REASON.to_string()
        } else if gpu.online_jobs.is_empty() {
            "idle GPU: no online job (best total predicted throughput)".to_string()
        } else {
            format!(
                "best total predicted throughput (online job {})",
                gpu.online_jobs
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        if per_gpu > 1 {
            let _ = write!(
                reason,
                "; {} of the GPU's {per_gpu} offline slots, ",
                at.slots
            );
            let _ = match at.offline_jobs {
                1 => write!(reason, "the only offline job there"),
                n => write!(reason, "one of {n} offline jobs there"),
            };
        }
        (
            Target::Gpus {
                node: gpu.node.clone(),
                gpus: vec![gpu.index],
                slots: vec![at.slots],
            },
            Some(shown),
            reason,
            None,
        )
    }

    /// Why a 1-GPU job the matching left out waits; `has_edge`: it had a
    /// candidate.
    fn parked_outcome(&self, j: usize, has_edge: bool) -> Outcome {
        let parked = |reason: String, why: Option<Waiting>| (Target::Parked, None, reason, why);
        if has_edge {
            return parked(
                "its candidate GPUs went to jobs with a higher total".to_string(),
                Some(Waiting::FasterJobsFirst),
            );
        }
        // Open GPUs it fits but may not share: another user's jobs
        // under a daemon that serves one user at a time.
        if let Some(why) = self.barred(j) {
            let words = if why == Waiting::SameUserOnly {
                "no candidate: the GPUs with room for it run another user's jobs under an MPS daemon that serves one user at a time (not in multi-user mode)"
            } else {
                "no candidate: the GPUs with room for it run jobs it may not share with under [policy] co_locate"
            };
            return parked(words.to_string(), Some(why));
        }
        // A node with an open GPU and room for it: its GPUs did not
        // fit otherwise (memory, health, its fixed slot index).
        let need = &self.jobs[j].need;
        if self
            .col_room
            .iter()
            .any(|r| r.is_none_or(|r| r.holds(need, true)))
        {
            let words = (self.model)
                .kept_off_shared(&self.job_terms[j].0)
                .unwrap_or(NO_CANDIDATE);
            parked(words.to_string(), Some(Waiting::FreeGpu))
        } else {
            parked(no_room_reason(need), Some(Waiting::NodeRoom))
        }
    }

    /// A considered job's decision line: the hint update its outcome needs.
    fn decision(&self, job: &PendingJob, outcome: Outcome) -> Decision {
        let (target, predicted, reason, waiting) = outcome;
        let update = update_args(job, &target, self.names);
        let action = match (&target, update.is_some()) {
            (Target::Gpus { .. }, true) => Action::Place,
            (Target::Gpus { .. }, false) => Action::Keep,
            (Target::Parked, true) => Action::Park,
            (Target::Parked, false) => Action::None,
        };
        let (node, gpus, slots) = match target {
            Target::Gpus { node, gpus, slots } => (Some(node), gpus, slots),
            Target::Parked => (None, Vec::new(), Vec::new()),
        };
        Decision {
            job: job.id,
            name: job.name.clone(),
            user: job.user.clone(),
            action,
            node,
            gpu: gpus.first().copied(),
            gpus,
            slots,
            predicted: predicted.map(|p| p.0),
            confidence: predicted.map(|p| p.1),
            reason,
            waiting,
            update,
        }
    }

    /// The held jobs beyond the window stay parked; each still gets its
    /// line, so the table accounts for every pending job.
    fn beyond_the_window(&self, decisions: &mut Vec<Decision>) {
        let no_open_gpu = self.open.is_empty();
        let mut in_window = vec![false; self.state.pending.len()];
        for &i in self.considered.iter().chain(&self.unplaceable) {
            in_window[i] = true;
        }
        for (w, job) in in_window.iter_mut().zip(&self.state.pending) {
            *w |= job.unstartable.is_some();
        }
        for (job, _) in self
            .state
            .pending
            .iter()
            .zip(&in_window)
            .filter(|(_, &w)| !w)
        {
            decisions.push(if no_open_gpu {
                parked(job, NO_CANDIDATE.to_string(), Waiting::FreeGpu)
            } else {
                parked(
                    job,
                    format!(
                        "waiting: held jobs of this and other users fill this round ({HELD_JOBS_PER_OPEN_GPU} per open GPU are scored, users take turns, each its oldest first, the one Slurm's fair share owes most first)"
                    ),
                    Waiting::OlderJobsFirst,
                )
            });
        }
    }
}

/// The line of a job the round left parked without scoring it.
fn parked(job: &PendingJob, reason: String, waiting: Waiting) -> Decision {
    Decision {
        job: job.id,
        name: job.name.clone(),
        user: job.user.clone(),
        action: Action::None,
        node: None,
        gpu: None,
        gpus: Vec::new(),
        slots: Vec::new(),
        predicted: None,
        confidence: None,
        reason,
        waiting: Some(waiting),
        update: None,
    }
}
