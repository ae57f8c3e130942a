//! The candidates phase: the open GPUs (the matching's columns, one per
//! GPU with a free offline slot), the jobs a round considers
//! ([`considered_jobs`]: a window of held jobs, users taking turns, those
//! no node could take left out) and what is looked up once per job and
//! per column ([`Round::new`]).

use std::collections::BTreeMap;

use muxflow::config::{Matcher, Policy};
use muxflow::records::placement::Waiting;

use super::decisions::no_room_reason;
use super::scores::{ColumnClasses, Side};
use super::{Predictor, Round};
use crate::reader::{ClusterState, Names, NodeRoom, Owner, PendingJob};
use crate::slots::SlotColumns;
use crate::solver::SolveOptions;

/// Held jobs a round scores per open slot, oldest first (lowest job id). A
/// round places at most one job per open slot, so a longer queue only costs
/// scoring time (jobs × slots); the others wait for a later round.
pub const HELD_JOBS_PER_OPEN_GPU: usize = 4;

/// The pending jobs a round considers: every job that holds a hint (it may
/// need parking), and held jobs up to [`HELD_JOBS_PER_OPEN_GPU`] × open
/// slots among those `placeable` says could go somewhere this round, taken
/// a user at a time: each user's oldest, then each user's second oldest, …
/// so one user's long queue does not keep every other user's jobs out of
/// the round. Users go in the order Slurm's fair share owes them
/// (`fair_share`, highest first; users it has no factor for after those),
/// then of their oldest job. Held jobs that could not be placed (more
/// GPUs, CPUs or memory than any node with an open GPU offers) take no
/// place in the window, and come back second. Indices into `pending` in
/// that turn order (a hinted job takes its user's turn but no place in the
/// window), which is also the solver's: among jobs predicted as fast, the earlier in it
/// wins, so equal jobs of several users share a round's placements turn
/// by turn rather than going to the oldest ids. Jobs Slurm would not start
/// now ([`PendingJob::unstartable`]) are in neither list.
pub fn considered_jobs(
    pending: &[PendingJob],
    open_slots: usize,
    fair_share: &BTreeMap<String, f64>,
    placeable: impl Fn(&PendingJob) -> bool,
) -> (Vec<usize>, Vec<usize>) {
    let window = open_slots.saturating_mul(HELD_JOBS_PER_OPEN_GPU);
    let mut out = Vec::with_capacity(pending.len().min(window + 64));
    let mut unplaceable = Vec::new();
    // Each user's jobs, oldest first (hinted ones too: they take their turn
    // but no place in the window); users by first job.
    let mut by_user: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut user_at: std::collections::HashMap<&str, usize> = Default::default();
    // A user's jobs usually come in runs: the map is asked once per run.
    let mut last: Option<(&str, usize)> = None;
    for (i, j) in pending.iter().enumerate() {
        // Slurm would not start it now: no place in the round at all.
        if j.unstartable.is_some() {
            continue;
        }
        if j.held && !placeable(j) {
            unplaceable.push(i);
            continue;
        }
        let k = match last {
            Some((user, k)) if user == j.user => k,
            _ => *user_at.entry(j.user.as_str()).or_insert_with(|| {
                by_user.push((j.user.as_str(), Vec::new()));
                by_user.len() - 1
            }),
        };
        last = Some((j.user.as_str(), k));
        by_user[k].1.push(i);
    }
    // Stable: users with equal (or no) factors keep their oldest-job order.
    let owed = |user: &str| fair_share.get(user).copied().unwrap_or(f64::NEG_INFINITY);
    by_user.sort_by(|a, b| owed(b.0).total_cmp(&owed(a.0)));
    let mut taken = 0;
    for depth in 0.. {
        let mut any = false;
        for (_, jobs) in &by_user {
            let Some(&i) = jobs.get(depth) else { continue };
            any = true;
            if !pending[i].held {
                out.push(i);
            } else if taken < window {
                out.push(i);
                taken += 1;
            }
        }
        if !any {
            break;
        }
    }
    (out, unplaceable)
}

/// The most any one node with an open GPU offers this round: its open GPUs,
/// and (componentwise) the CPUs and memory free there; `room` None when a
/// node's room is not known (no limit). A held job that needs more is
/// placed nowhere this round.
pub(super) struct Reach {
    gpus: u32,
    room: Option<NodeRoom>,
}

impl Reach {
    pub(super) fn of(state: &ClusterState, open: &[usize]) -> Reach {
        let mut per_node: std::collections::HashMap<&str, u32> = Default::default();
        // A node's GPUs are usually listed together: one entry per run.
        let mut run: Option<(&str, u32)> = None;
        for &i in open {
            let node = state.gpus[i].node.as_str();
            match run.as_mut() {
                Some((n, k)) if *n == node => *k += 1,
                _ => {
                    if let Some((n, k)) = run.replace((node, 1)) {
                        *per_node.entry(n).or_default() += k;
                    }
                }
            }
        }
        if let Some((n, k)) = run {
            *per_node.entry(n).or_default() += k;
        }
        let mut room = Some(NodeRoom::default());
        for node in per_node.keys() {
            match (state.node_room.get(*node), room.as_mut()) {
                (Some(r), Some(max)) => {
                    max.cpus = max.cpus.max(r.cpus);
                    max.mem_mib = max.mem_mib.max(r.mem_mib);
                }
                (None, _) => room = None,
                (Some(_), None) => {}
            }
        }
        Reach {
            gpus: per_node.values().copied().max().unwrap_or(0),
            room,
        }
    }

    /// Why `job` can be placed nowhere this round, or None. With no open
    /// GPU at all every job simply waits for one (`free_gpu`), as before.
    pub(super) fn short_of(&self, job: &PendingJob) -> Option<(Waiting, String)> {
        if self.gpus == 0 {
            return None;
        }
        if job.gpus > self.gpus {
            return Some((
                Waiting::FreeNode,
                format!(
                    "no candidate: no node with {} Healthy GPUs with a free offline slot for it (at most {} on one node this round)",
                    job.gpus, self.gpus
                ),
            ));
        }
        match self.room {
            Some(r) if !r.holds(&job.need, true) => {
                Some((Waiting::NodeRoom, no_room_reason(&job.need)))
            }
            _ => None,
        }
    }
}

impl<'a, P: Predictor> Round<'a, P> {
    /// The round's context: its columns, the jobs it considers (a window,
    /// [`considered_jobs`]) and their terms, each column's terms for a job
    /// taking all its free slots, and the column classes.
    pub(super) fn new(
        state: &'a ClusterState,
        model: &'a P,
        policy: &'a Policy,
        matcher: &'a Matcher,
        names: &'a Names,
    ) -> Self {
        let per_gpu = u32::from(policy.offline_per_gpu).max(1);
        let open: Vec<usize> = state.open_gpus(per_gpu).map(|(i, _)| i).collect();
        // Sized slots (issue 15): each open GPU is one column of the matching,
        // and the job placed there takes all of its free slots — alone on an
        // empty GPU, the whole offline budget, as with one slot per GPU — so
        // this first matching is an exact, certified assignment. Then a GPU
        // whose free slots went to jobs of this round may be split with one
        // more job, its slots shared among them ([`super::split_slots`]), where the
        // predictor says the GPU does more work that way: each split round is
        // again an exact assignment, of the jobs left to those GPUs, weighted
        // by the new job's speed less what the jobs there lose by giving up
        // slots. A running job's slots never change (MPS fixed its share).
        let free: Vec<u32> = open
            .iter()
            .map(|&i| state.gpus[i].free_slots(per_gpu))
            .collect();
        let running: Vec<u32> = open.iter().map(|&i| state.gpus[i].offline_jobs).collect();
        let slot_cols = SlotColumns::new(std::iter::repeat_n(1, open.len()));
        let slot_gpu = slot_cols.gpu_of();
        let reach = Reach::of(state, &open);
        let (considered, unplaceable) = considered_jobs(
            &state.pending,
            free.iter().map(|&f| f as usize).sum(),
            &state.fair_share,
            |j| reach.short_of(j).is_none(),
        );
        let jobs: Vec<&PendingJob> = considered.iter().map(|&i| &state.pending[i]).collect();
        // Lookups once per job and per column; the per-pair score is arithmetic.
        let owners: Vec<Owner> = jobs.iter().map(|j| j.owner()).collect();
        let job_terms: Vec<(P::Job, &[u32])> = jobs
            .iter()
            .map(|j| (model.job_terms(j), &j.slot_gpus[..]))
            .collect();
        // Slurm starts a job only where its node has the CPUs and memory it
        // asked for free: a GPU on a node without them is no candidate.
        let col_room: Vec<Option<NodeRoom>> = open
            .iter()
            .map(|&i| state.node_room.get(&state.gpus[i].node).copied())
            .collect();
        let is_gang: Vec<bool> = jobs.iter().map(|j| j.gpus > 1).collect();
        let mut round = Round {
            state,
            model,
            policy,
            matcher,
            names,
            per_gpu,
            open,
            free,
            running,
            slot_cols,
            slot_gpu,
            reach,
            considered,
            unplaceable,
            jobs,
            owners,
            job_terms,
            col_room,
            whole: Vec::new(),
            classes: ColumnClasses::default(),
            is_gang,
            threads: SolveOptions::default().threads,
        };
        round.whole = (0..round.cols())
            .map(|c| round.side(c, round.seat_of(c, 0, 1)))
            .collect::<Vec<Side<P::Gpu>>>();
        round.classes = round.column_classes();
        round
    }

    /// The matching's columns: the open GPUs.
    pub(super) fn cols(&self) -> usize {
        self.open.len()
    }

    /// Held jobs beyond the window (not scored this round).
    pub(super) fn waiting(&self) -> usize {
        self.state.pending.len() - self.considered.len()
    }
}
