//! One matching round on a [`ClusterState`]: candidates, predictions, the
//! exact matching, and the hint updates to send. Pure: Slurm I/O lives in
//! [`crate::slurm`].
//!
//! Candidates of a pending offline job: Healthy GPUs with a free offline
//! slot that either run an online job (scored by the predictor next to it)
//! or are idle — no job holds them as gres/gpu — (scored at the job's solo
//! speed, [`Predictor::solo`]: issue 15), that leave room for the job's
//! memory (its history's peak, or nothing known), and — for a job whose
//! slot type Slurm already fixed — have that GPU index. The graph is pruned
//! with [`crate::prune::spread_scored`] (`matcher.candidates_per_job`) and
//! solved exactly; then the pairs pruning left out are priced against the
//! solution's LP duals and added until none would improve it
//! ([`crate::exact`]), within `matcher.pricing_budget_ms`: the 1-GPU
//! jobs' matching is then exact over every feasible pair, and the summary
//! says whether it got there ("exact over every pair" or "exact on the
//! candidates"; `full_graph` in `--json`).
//!
//! Sized slots (`[policy] offline_per_gpu` = N > 1, issue 15): a job holds
//! s of its GPU's N slots, its part s/N of the GPU's offline SMs and memory
//! ([`muxflow::policy::share::offline_part`]; Slurm holds the slots, the hint is
//! `mfslot:g<i>:<s>`). Each open GPU is one column, the job placed there
//! taking all its free slots (alone on an empty GPU: the whole budget, as
//! with N = 1), so that matching is exact and certified. Then, for n = 2
//! .. N, a GPU whose free slots went to n − 1 jobs of this round may take
//! one more, the slots split among them ([`split_slots`]): an exact
//! assignment of the jobs left to those GPUs, weighted by the new job's
//! speed less what the jobs there lose, edges only where that is positive.
//! So a split never lowers the predicted total; its loss against the best
//! sized placement is measured in the tests (0.6% on small instances).
//! Running jobs keep their slots (MPS fixed their shares). A gang takes
//! all free slots of each of its GPUs.
//!
//! An idle GPU's offline job gets the SM ceiling and the GPU's memory less
//! the reserve ([`muxflow::policy::share::GpuFacts::without_online`]); an online
//! job that lands there later requeues it (the Prolog), and the matcher
//! places it again next to that online job or elsewhere. On a tie with a
//! shared GPU the shared one wins ([`IDLE_TIE_BREAK`]): the same predicted
//! throughput without the risk of that requeue.
//!
//! A GPU is a candidate for a job only where its node has the CPUs and
//! memory the job asked for free (`tres_req_str` against the node's
//! CPUs/RealMemory less what jobs hold): Slurm would leave a job sent
//! elsewhere pending (Resources) while other GPUs sit free. Jobs placed on
//! one node in one round must fit that room together (`fit_node_room`:
//! memory only where Slurm counts it); those that do not wait a round
//! (`node_room`).
//!
//! A round scores every job that holds a hint and held jobs up to
//! [`HELD_JOBS_PER_OPEN_GPU`] per open GPU ([`considered_jobs`]), a user at
//! a time (users take turns, each its oldest first; the user Slurm's fair
//! share owes most goes first in each turn), leaving out jobs no node with an open
//! GPU could take this round: a long queue costs no scoring time beyond
//! what can be placed, and one user's queue, placeable or not, does not
//! keep another user's jobs out. The rest wait, each with a line saying
//! so; the summary counts them (`waiting`).
//!
//! # Decision table (`--once`), one line per pending offline job
//!
//! ```text
//! JOB     NAME        ACTION  NODE    GPU       SPEED  REASON
//! 17      train-x     place   node1   0    0.812±0.05  best total predicted throughput (online job 12)
//! 18      train-y     place   node4   1    1.000±0.00  idle GPU: runs alone at its solo speed (best total predicted throughput)
//! ```
//!
//! ACTION is `place` (hint written), `keep` (already placed there), `park`
//! (hint cleared), `none` (stays parked). SPEED is the predicted normalized
//! throughput ± its standard deviation (how little history the pair has;
//! see [`crate::predict`]), `-` when not placed. The matching maximizes the
//! predictor's weight ([`Predictor::predict`]: for [`Model`](crate::predict::Model) the mean plus
//! a bounded exploration bonus); SPEED and `predicted_total` are means.
//! `--json` prints the same as `{"summary": {...}, "decisions": [{"job",
//! "name", "user", "action", "node", "gpu", "gpus", "slots", "predicted",
//! "confidence", "reason", "waiting"}]}`; `node`, `gpu`, `predicted`,
//! `confidence` are null and `gpus`, `slots` (offline slots held on each
//! of `gpus`) empty when not placed; `waiting` is a
//! parked job's reason code ([`Waiting`](muxflow::records::placement::Waiting), written into its AdminComment by
//! the daemon) and null when placed. A k-GPU job (`gpus=k` in its
//! record) is placed as a gang on k GPUs of one node ([`crate::gang`]):
//! GPU shows them all (`0,1`), SPEED its slowest GPU's, and the summary's
//! `predicted_total` counts it k times. The summary's `full_graph` is true
//! when the 1-GPU jobs' matching is exact over every pair (the summary
//! line: "exact over every pair"). Both formats are stable (fields are
//! only added).
//!
//! # Phases
//!
//! [`plan`] runs one round context (`Round`) through its phases, each in
//! its own file: `candidates.rs` (the jobs a round considers and the open
//! GPUs, its columns), `scores.rs` (what the matching maximizes for a job
//! on a column, scored once per column class), `gangs.rs` (k-GPU jobs
//! first), `matching.rs` (the exact matching of the 1-GPU jobs, cold or
//! from the cache), `splits.rs` (more jobs on a GPU this round's jobs
//! took), `decisions.rs` (one outcome per job, fitted to each node's room)
//! and `budget.rs` (the bound on Slurm updates, then the summary).
//! `output.rs` holds the result's types and formats.

mod budget;
mod candidates;
mod decisions;
mod gangs;
mod matching;
mod output;
mod scores;
mod splits;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use muxflow::config::{Matcher, Policy};

use crate::reader::{ClusterState, Names, NodeRoom, Owner, PendingJob};
use crate::round_cache::RoundCache;
use crate::slots::SlotColumns;

pub use candidates::{considered_jobs, HELD_JOBS_PER_OPEN_GPU};
pub use decisions::IDLE_REASON;
pub use output::{Action, Decision, Plan, Summary};
pub use scores::{idle_room_mib, IdleSlot, Predictor, IDLE_TIE_BREAK};
pub use splits::split_slots;

use candidates::Reach;
use scores::{ColumnClasses, Side};

/// One round's context: its inputs, the columns of its matching (the open
/// GPUs), the jobs it considers and their terms. Built once
/// ([`Round::new`], the candidates phase); every later phase reads it.
struct Round<'a, P: Predictor> {
    state: &'a ClusterState,
    model: &'a P,
    policy: &'a Policy,
    matcher: &'a Matcher,
    names: &'a Names,
    /// `[policy] offline_per_gpu`, at least 1.
    per_gpu: u32,
    /// Column c is GPU `open[c]` of the state's list.
    open: Vec<usize>,
    /// Each column's free offline slots.
    free: Vec<u32>,
    /// Each column's running offline jobs.
    running: Vec<u32>,
    /// One slot column per GPU column (each open GPU is one column).
    slot_cols: SlotColumns,
    /// Each slot column's GPU (for the gangs).
    slot_gpu: Vec<u32>,
    /// What the largest node with an open GPU offers this round.
    reach: Reach,
    /// Indices into `state.pending`: the jobs the round scores, in turn
    /// order ([`considered_jobs`]); the round's job j is `considered[j]`.
    considered: Vec<usize>,
    /// Held jobs no node can take this round.
    unplaceable: Vec<usize>,
    jobs: Vec<&'a PendingJob>,
    /// Each job's owner; its terms and the GPU indices its typed slots
    /// fix (empty: any). Looked up once per job: the per-pair score is
    /// arithmetic.
    owners: Vec<Owner>,
    job_terms: Vec<(P::Job, &'a [u32])>,
    /// Each column's node's free CPUs and memory (None: not known).
    col_room: Vec<Option<NodeRoom>>,
    /// Each column's terms for a job taking all its free slots.
    whole: Vec<Side<P::Gpu>>,
    classes: ColumnClasses,
    /// Whether each job is a k-GPU job (placed as a gang).
    is_gang: Vec<bool>,
    threads: usize,
}

/// Plans a round. `max_updates` bounds the `scontrol update` calls: parks
/// first (they free slots), then placements by predicted speed. Cold: every
/// pair scored, nothing kept ([`plan_cached`] keeps the round for the next).
pub fn plan<P: Predictor>(
    state: &ClusterState,
    model: &P,
    policy: &Policy,
    matcher: &Matcher,
    names: &Names,
) -> Plan {
    plan_with(state, model, policy, matcher, names, None)
}

/// [`plan`] with the last round kept in `cache`: incremental after a small
/// change, the last plan when nothing changed, cold otherwise, with the
/// same certificate rule ([`crate::round_cache`]). `epoch` names the
/// predictor's state: the caller changes it when the model changes (and
/// starts a new cache when the config does).
pub fn plan_cached<P: Predictor>(
    state: &ClusterState,
    model: &P,
    policy: &Policy,
    matcher: &Matcher,
    names: &Names,
    cache: &mut RoundCache,
    epoch: u64,
) -> Arc<Plan> {
    let keys: Vec<u64> = state
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| model.gpu_key(i, g))
        .collect();
    if let Some(p) = cache.observe(state, keys, epoch) {
        return p;
    }
    let p = Arc::new(plan_with(
        state,
        model,
        policy,
        matcher,
        names,
        Some((cache, epoch)),
    ));
    let final_ = p.summary.full_graph || matcher.pricing_budget_ms == 0;
    cache.remember(&p, final_);
    p
}

/// The phases in order. `cache`: the round kept for the next, with the
/// predictor's epoch (an incremental round where it may).
fn plan_with<P: Predictor>(
    state: &ClusterState,
    model: &P,
    policy: &Policy,
    matcher: &Matcher,
    names: &Names,
    cache: Option<(&mut RoundCache, u64)>,
) -> Plan {
    let round = Round::new(state, model, policy, matcher, names);
    let mut taken = vec![false; round.cols()];
    let matched = round.exact_matching(cache, &mut taken);
    let placed = round.split_open_gpus(&matched, &taken);
    let mut decisions = round.decisions(&matched, &placed);
    let deferred = budget::defer_updates(&mut decisions, matcher.max_updates_per_round);
    let summary = round.summary(
        &decisions,
        matched.edges.len() + placed.split_edges,
        matched.full_graph,
        deferred,
    );
    Plan {
        summary,
        decisions,
        notes: state.notes.clone(),
    }
}
