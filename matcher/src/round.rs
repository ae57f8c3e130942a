//! One matching round on a [`ClusterState`]: candidates, predictions, the
//! exact matching, and the hint updates to send. Pure: Slurm I/O lives in
//! [`crate::slurm`].
//!
//! Candidates of a pending offline job: GPUs that run an online job, are
//! Healthy, have their offline slot free, leave room for the job's memory
//! (its history's peak, or nothing known), and — for a job whose slot type
//! Slurm already fixed — have that GPU index. The graph is pruned with
//! [`crate::prune::spread_scored`] (`matcher.candidates_per_job`), solved,
//! and priced out ([`crate::exact`]) until the matching is a maximum of
//! every feasible pair, not just of the candidates.
//!
//! A round scores every job that holds a hint and the oldest held jobs up
//! to [`HELD_JOBS_PER_OPEN_GPU`] per open GPU ([`considered_jobs`]): a long
//! queue costs no scoring time beyond what can be placed. The rest wait;
//! the summary counts them (`waiting`).
//!
//! # Decision table (`--once`), one line per considered pending offline job
//!
//! ```text
//! JOB     NAME        ACTION  NODE    GPU  SPEED  REASON
//! 17      train-x     place   node1   0    0.812  best total predicted throughput
//! ```
//!
//! ACTION is `place` (hint written), `keep` (already placed there), `park`
//! (hint cleared), `none` (stays parked). SPEED is the predicted normalized
//! throughput, `-` when not placed. `--json` prints the same as
//! `{"summary": {...}, "decisions": [{"job", "name", "user", "action",
//! "node", "gpu", "predicted", "reason"}]}`; `node`, `gpu`, `predicted` are
//! null when not placed. Both formats are stable.

use std::fmt::Write as _;

use muxflow::config::{Matcher, Policy};
use serde::Serialize;

use crate::exact::{solve_exact, ExactOptions, FnScores};
use crate::hints::{update_args, Target};
use crate::predict::{GpuTerms, JobTerms, Model};
use crate::prune::spread_scored;
use crate::reader::{ClusterState, GpuState, Names, PendingJob};
use crate::solver::SolveOptions;
use crate::weights::{quantize, to_throughput};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Place,
    Keep,
    Park,
    None,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Place => "place",
            Action::Keep => "keep",
            Action::Park => "park",
            Action::None => "none",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub job: u32,
    pub name: String,
    pub user: String,
    pub action: Action,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub predicted: Option<f64>,
    pub reason: String,
    /// The scontrol calls (full argument lists) that change the hint.
    #[serde(skip)]
    pub update: Option<Vec<Vec<String>>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub pending_offline: usize,
    pub online_gpus: usize,
    pub open_gpus: usize,
    pub candidate_edges: usize,
    pub placed: usize,
    pub predicted_total: f64,
    pub updates: usize,
    /// Updates left for the next round (bounded per round).
    pub deferred: usize,
    /// Held jobs not considered this round (beyond the window of
    /// [`considered_jobs`]): they stay parked and get no decision line.
    pub waiting: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub summary: Summary,
    pub decisions: Vec<Decision>,
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// What a round needs of a predictor: terms looked up once per job and
/// per GPU, and the per-pair prediction from them (the hot path). [`Model`]
/// is the production one; the cluster replay (`sim/`) also scores rounds
/// with the true values, to measure how much the predictor costs.
pub trait Predictor: Sync {
    type Job: Sync;
    type Gpu: Sync;
    fn job_terms(&self, job: &PendingJob) -> Self::Job;
    fn gpu_terms(&self, gpu: &GpuState, policy: &Policy) -> Self::Gpu;
    /// Normalized throughput of the job there; `None`: not a candidate.
    fn predict(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<f64>;
}

impl Predictor for Model {
    type Job = JobTerms;
    type Gpu = GpuTerms;
    fn job_terms(&self, job: &PendingJob) -> JobTerms {
        Model::job_terms(self, &(job.user.clone(), job.name.clone()))
    }
    fn gpu_terms(&self, gpu: &GpuState, policy: &Policy) -> GpuTerms {
        GpuTerms::new(gpu, policy)
    }
    #[inline]
    fn predict(&self, job: &JobTerms, gpu: &GpuTerms) -> Option<f64> {
        self.predict_terms(job, gpu)
    }
}

/// Held jobs a round scores per open GPU, oldest first (lowest job id). A
/// round places at most one job per open GPU, so a longer queue only costs
/// scoring time (jobs × GPUs); the others wait for a later round.
pub const HELD_JOBS_PER_OPEN_GPU: usize = 4;

/// The pending jobs a round considers: every job that holds a hint (it may
/// need parking), and the oldest held jobs up to
/// [`HELD_JOBS_PER_OPEN_GPU`] × open GPUs. Indices into `pending`.
pub fn considered_jobs(pending: &[PendingJob], open_gpus: usize) -> Vec<usize> {
    let mut window = open_gpus.saturating_mul(HELD_JOBS_PER_OPEN_GPU);
    let mut out = Vec::with_capacity(pending.len().min(window + 64));
    for (i, j) in pending.iter().enumerate() {
        if !j.held {
            out.push(i);
        } else if window > 0 {
            window -= 1;
            out.push(i);
        }
    }
    out
}

/// Largest jobs × GPUs a round keeps as a score matrix (4 bytes a pair).
pub const DENSE_SCORES_MAX: usize = 24 << 20;

/// Every pair's weight (0 = not a candidate), jobs in blocks on `threads`
/// workers; `None` above [`DENSE_SCORES_MAX`] pairs or for a weight that
/// does not fit in 32 bits (weights are ≤ 10⁶ from [`quantize`]).
fn dense_scores(
    jobs: usize,
    gpus: usize,
    threads: usize,
    score: impl Fn(u32, u32) -> Option<i64> + Sync,
) -> Option<Vec<i32>> {
    if jobs.saturating_mul(gpus) > DENSE_SCORES_MAX || jobs == 0 || gpus == 0 {
        return None;
    }
    let mut m = vec![0i32; jobs * gpus];
    let block = jobs.div_ceil(threads.max(1));
    let ok = std::thread::scope(|s| {
        let handles: Vec<_> = m
            .chunks_mut(block * gpus)
            .enumerate()
            .map(|(b, rows)| {
                let score = &score;
                s.spawn(move || {
                    for (r, row) in rows.chunks_mut(gpus).enumerate() {
                        let j = (b * block + r) as u32;
                        for (g, w) in row.iter_mut().enumerate() {
                            if let Some(v) = score(j, g as u32) {
                                *w = i32::try_from(v).ok().filter(|&v| v > 0)?;
                            }
                        }
                    }
                    Some(())
                })
            })
            .collect();
        handles
            .into_iter()
            .all(|h| h.join().expect("scoring worker panicked").is_some())
    });
    ok.then_some(m)
}

/// Plans a round. `max_updates` bounds the `scontrol update` calls: parks
/// first (they free slots), then placements by predicted speed.
pub fn plan<P: Predictor>(
    state: &ClusterState,
    model: &P,
    policy: &Policy,
    matcher: &Matcher,
    names: &Names,
) -> Plan {
    let open: Vec<usize> = state.open_gpus().map(|(i, _)| i).collect();
    let considered = considered_jobs(&state.pending, open.len());
    let waiting = state.pending.len() - considered.len();
    let jobs: Vec<&PendingJob> = considered.iter().map(|&i| &state.pending[i]).collect();
    // Lookups once per job and per GPU; the per-pair score is arithmetic.
    let job_terms: Vec<(P::Job, Option<u32>)> = jobs
        .iter()
        .map(|j| (model.job_terms(j), j.slot_gpu))
        .collect();
    let gpu_terms: Vec<(P::Gpu, u32)> = open
        .iter()
        .map(|&i| (model.gpu_terms(&state.gpus[i], policy), state.gpus[i].index))
        .collect();
    let score = |j: u32, g: u32| -> Option<i64> {
        let (job, slot_gpu) = &job_terms[j as usize];
        let (gpu, index) = &gpu_terms[g as usize];
        // Slurm 22.05 cannot move a job's typed slot to another GPU index.
        if slot_gpu.is_some_and(|i| i != *index) {
            return None;
        }
        model.predict(job, gpu).and_then(quantize)
    };
    let threads = SolveOptions::default().threads;
    // Pricing scores pairs again on each pass: where the score matrix is
    // small, score each pair once and read the matrix afterwards.
    let matrix = dense_scores(jobs.len(), open.len(), threads, score);
    let cached = |j: u32, g: u32| -> Option<i64> {
        match &matrix {
            Some(m) => {
                let w = m[j as usize * open.len() + g as usize];
                (w > 0).then_some(i64::from(w))
            }
            None => score(j, g),
        }
    };
    let edges = spread_scored(
        jobs.len(),
        open.len(),
        matcher.candidates_per_job,
        threads,
        cached,
    );
    // Exact on every feasible pair: pricing adds what pruning left out.
    let exact = solve_exact(
        &FnScores {
            jobs: jobs.len(),
            gpus: open.len(),
            score: cached,
        },
        &edges,
        &ExactOptions {
            threads,
            ..ExactOptions::default()
        },
    )
    .expect("candidate edges are in range, positive and unique");
    let (sol, edges) = (exact.solution, exact.edges);
    let mut assigned: Vec<Option<(u32, i64)>> = vec![None; jobs.len()];
    for &(j, g) in &sol.matching.pairs {
        // The final graph is sorted by (job, GPU).
        let w = edges
            .binary_search_by_key(&(j, g), |e| (e.job, e.gpu))
            .map_or(0, |k| edges[k].weight);
        assigned[j as usize] = Some((g, w));
    }
    let has_edge: Vec<bool> = {
        let mut v = vec![false; jobs.len()];
        for e in &edges {
            v[e.job as usize] = true;
        }
        v
    };

    let mut decisions = Vec::with_capacity(jobs.len());
    for (j, &job) in jobs.iter().enumerate() {
        let (target, predicted, reason) = match assigned[j] {
            Some((g, w)) => {
                let gpu = &state.gpus[open[g as usize]];
                (
                    Target::Gpu {
                        node: gpu.node.clone(),
                        gpu: gpu.index,
                    },
                    Some(to_throughput(w)),
                    format!(
                        "best total predicted throughput (online job {})",
                        gpu.online_jobs
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                )
            }
            None if !has_edge[j] => (
                Target::Parked,
                None,
                "no candidate: no Healthy GPU with an online job, a free offline slot and room"
                    .to_string(),
            ),
            None => (
                Target::Parked,
                None,
                "its candidate GPUs went to jobs with a higher total".to_string(),
            ),
        };
        let update = update_args(job, &target, names);
        let action = match (&target, update.is_some()) {
            (Target::Gpu { .. }, true) => Action::Place,
            (Target::Gpu { .. }, false) => Action::Keep,
            (Target::Parked, true) => Action::Park,
            (Target::Parked, false) => Action::None,
        };
        let (node, gpu) = match &target {
            Target::Gpu { node, gpu } => (Some(node.clone()), Some(*gpu)),
            Target::Parked => (None, None),
        };
        decisions.push(Decision {
            job: job.id,
            name: job.name.clone(),
            user: job.user.clone(),
            action,
            node,
            gpu,
            predicted,
            reason,
            update,
        });
    }

    // Bound the Slurm calls: parks first, then the fastest placements.
    let mut order: Vec<usize> = (0..decisions.len())
        .filter(|&i| decisions[i].update.is_some())
        .collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| {
            (
                decisions[i].action != Action::Park,
                -(decisions[i].predicted.unwrap_or(0.0) * 1e6) as i64,
                decisions[i].job,
            )
        };
        key(a).cmp(&key(b))
    });
    let limit = matcher.max_updates_per_round;
    let mut deferred = 0;
    for &i in order.iter().skip(limit) {
        let d = &mut decisions[i];
        d.update = None;
        d.reason = format!(
            "deferred to the next round (max_updates_per_round = {limit}); {}",
            d.reason
        );
        deferred += 1;
    }
    let placed: Vec<&Decision> = decisions
        .iter()
        .filter(|d| matches!(d.action, Action::Place | Action::Keep))
        .collect();
    let summary = Summary {
        pending_offline: state.pending.len(),
        online_gpus: state.gpus.len(),
        open_gpus: open.len(),
        candidate_edges: edges.len(),
        placed: placed.len(),
        predicted_total: to_throughput(sol.matching.objective),
        updates: decisions.iter().filter(|d| d.update.is_some()).count(),
        deferred,
        waiting,
    };
    Plan {
        summary,
        decisions,
        notes: state.notes.clone(),
    }
}

impl Plan {
    /// The decision table (format documented in the module docs).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<8} {:<16} {:<6} {:<10} {:>3} {:>6}  REASON",
            "JOB", "NAME", "ACTION", "NODE", "GPU", "SPEED"
        );
        for d in &self.decisions {
            let _ = writeln!(
                s,
                "{:<8} {:<16} {:<6} {:<10} {:>3} {:>6}  {}",
                d.job,
                d.name,
                d.action.as_str(),
                d.node.as_deref().unwrap_or("-"),
                d.gpu.map_or("-".into(), |g| g.to_string()),
                d.predicted.map_or("-".into(), |p| format!("{p:.3}")),
                d.reason
            );
        }
        let _ = write!(s, "{}", self.summary_line());
        s
    }

    /// One-line summary, also what loop mode logs.
    pub fn summary_line(&self) -> String {
        let m = &self.summary;
        format!(
            "round: {} pending offline, {} online GPUs ({} open), {} candidate edges, {} placed, predicted total {:.3}, {} updates, {} deferred, {} waiting",
            m.pending_offline, m.online_gpus, m.open_gpus, m.candidate_edges, m.placed,
            m.predicted_total, m.updates, m.deferred, m.waiting
        )
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::{GpuState, PendingJob};
    use muxflow::health::HealthState;
    use muxflow::published::GpuPublished;

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
            },
            online_jobs: vec![1],
            slot_used: used,
        }
    }

    fn job(id: u32, name: &str, held: bool, req: &str, slot: Option<u32>) -> PendingJob {
        PendingJob {
            id,
            user: "u".into(),
            name: name.into(),
            required_nodes: req.into(),
            slot_gpu: slot,
            held,
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

    #[test]
    fn highest_total_wins_and_unhealthy_or_taken_gpus_get_nothing() {
        let state = ClusterState {
            gpus: vec![
                gpu("a", HealthState::Healthy, 10, 4_000, false),
                gpu("b", HealthState::Healthy, 60, 30_000, false),
                gpu("c", HealthState::Faulty, 0, 0, false),
                gpu("d", HealthState::Busy, 0, 0, false),
                gpu("e", HealthState::Healthy, 0, 0, true),
            ],
            pending: vec![
                job(1, "small", true, "", None),
                job(2, "big", true, "", None),
            ],
            ..ClusterState::default()
        };
        let cfg = muxflow::Config::default();
        let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
        let at: Vec<_> = p.decisions.iter().map(|d| d.node.as_deref()).collect();
        // big only fits a; small goes to b; c (faulty), d (busy), e (slot
        // taken) are never used.
        assert_eq!(at, [Some("b"), Some("a")]);
        assert!((p.summary.predicted_total - 1.6).abs() < 1e-9);
        assert_eq!(p.summary.open_gpus, 2);
    }

    #[test]
    fn updates_are_bounded_parks_first_and_the_rest_deferred() {
        let state = ClusterState {
            gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
            pending: vec![
                // Placed on a GPU that is gone; typed for GPU 1, so it cannot
                // go to a (22.05 keeps the first slot type): parked again.
                job(1, "x", false, "gone", Some(1)),
                job(2, "y", true, "", None),
                job(3, "z", true, "", Some(1)),
            ],
            ..ClusterState::default()
        };
        let cfg = muxflow::Config::default();
        let mut matcher = cfg.matcher.clone();
        let p = plan(&state, &model(), &cfg.policy, &matcher, &names());
        let d: Vec<_> = p
            .decisions
            .iter()
            .map(|d| (d.job, d.action, d.update.clone()))
            .collect();
        let call = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let args = |calls: &[&[&str]]| Some(calls.iter().map(|v| call(v)).collect::<Vec<_>>());
        assert_eq!(
            d,
            [
                (1, Action::Park, args(&[&["hold", "1"]])),
                (
                    2,
                    Action::Place,
                    args(&[
                        &["update", "JobId=2", "ReqNodeList=a", "Gres=mfslot:g0:1"],
                        &["release", "2"]
                    ])
                ),
                (3, Action::None, None),
            ]
        );
        // One update per round: the park goes first, the placement waits.
        matcher.max_updates_per_round = 1;
        let p = plan(&state, &model(), &cfg.policy, &matcher, &names());
        assert_eq!((p.summary.updates, p.summary.deferred), (1, 1));
        assert!(p.decisions[0].update.is_some());
        assert!(p.decisions[1].update.is_none());
        assert!(
            p.decisions[1].reason.starts_with("deferred"),
            "{:?}",
            p.decisions[1]
        );
    }

    #[test]
    fn a_long_queue_is_scored_only_up_to_the_window_oldest_first() {
        let state = ClusterState {
            gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
            pending: (1..=40)
                .map(|id| job(id, "x", true, "", None))
                .chain([job(99, "y", false, "gone", Some(0))])
                .collect(),
            ..ClusterState::default()
        };
        let cfg = muxflow::Config::default();
        let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
        // One open GPU: the oldest held jobs of the window and the placed job 99.
        let ids: Vec<u32> = p.decisions.iter().map(|d| d.job).collect();
        let want: Vec<u32> = (1..=HELD_JOBS_PER_OPEN_GPU as u32).chain([99]).collect();
        assert_eq!(ids, want);
        assert_eq!(p.summary.waiting, 40 - HELD_JOBS_PER_OPEN_GPU);
        assert_eq!(p.summary.pending_offline, 41);
        assert_eq!(
            p.decisions[0].node.as_deref(),
            Some("a"),
            "the oldest gets the GPU"
        );
    }
}
