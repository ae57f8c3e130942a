//! What a round keeps for the next one: the daemon's loop and the replay
//! (`sim/`) call [`crate::round::plan_cached`] with one [`RoundCache`], so
//! that a round after a small change re-solves only what changed
//! ([`Incremental`]) instead of scoring every (job, GPU) pair again.
//!
//! # Rows, columns and what changed
//!
//! The incremental round needs one index space from round to round. Rows
//! are jobs by Slurm id (a job keeps its row while it is considered; a
//! row freed by a job that left is taken by a new one), columns are the
//! state's GPUs by position (the same (node, index) list as last round, or
//! the round is cold). A row or column that holds no job or no open GPU
//! this round has no feasible pair.
//!
//! A pair's weight is a function of what the round reads of its job (its
//! row key: who, what, its fixed slot GPUs, its CPU and memory need, and
//! [`crate::round::Predictor::job_key`], what the predictor reads beside
//! them), of its GPU (the GPU's whole [`crate::reader::GpuState`], its
//! node's free room, and [`crate::round::Predictor::gpu_key`]), of the
//! predictor's state (`epoch`, the caller's: it changes when the model is
//! retrained) and of the config (the caller starts a new cache when it
//! re-reads it). A row or column whose key differs from last round's is
//! *changed*: the incremental round drops its edges and prices it whole;
//! every other pair weighs what it did, as [`Incremental::update`]
//! requires. A changed job's row is seeded with its candidate list (the
//! cold round's pruning on those rows: where many GPUs tie, as idle ones
//! do, pricing's few most violated pairs per pass sent every new job to
//! the same GPUs, pass after pass: 3–5 passes a round in the replay
//! against 1), and rows a round scores twice (that list, then pricing's
//! first pass) are scored once while they fit `DENSE_PAIRS` (32 MiB).
//!
//! # Cold or incremental
//!
//! Cold (the round as before: the candidate graph of every pair scored,
//! solved, priced out) when there is no previous round, the epoch, the
//! GPU list or Slurm's fair share (the round's turn order) changed, a round has k-GPU jobs (their greedy reads the
//! candidate graph's duals), more new jobs come than rows are free, or
//! more than 1/[`COLD_WHEN_CHANGED_ONE_IN`] (0.1%) of the open GPUs or of
//! the jobs changed. Why so few: at 18,000 GPUs × 10,000 jobs
//! (`scripts/bench matcher --daemon-round`, 2026-11-27, 2 cores, the
//! reference scoring every pair once in 1.56 s) the incremental round
//! after 1% of the jobs were replaced took 6.3–6.6 s and its pricing was
//! cut by the 5-s budget (exact on its graph only), where the cold round of
//! the same state took 8.0–8.4 s with pricing finished (exact over every
//! pair); after 1% of the jobs and 1% of the GPUs changed, likewise (an
//! earlier run under a load average of 7–9: incremental 7–17 s, cut;
//! cold 8–29 s, finished). A changed GPU loses its price and moves the
//! warm start's; every pricing pass rescans the rows whose dual dropped,
//! and each row scores every GPU (the round's predictor gives no cheaper
//! bound), so the passes after a change cost about a cold round's pruning
//! each. Until that is better, rounds are incremental only after a
//! handful of changes, and otherwise reuse the last plan or run cold.
//! In the replay at 60-s rounds every round's pending jobs are new (about
//! 25 arrive a minute, and all are placed) and 20–50 of 6,000 open GPUs
//! change: its rounds are cold.
//!
//! # The same certificate rule
//!
//! Both paths end in the same pricing ([`crate::exact`]) under the same
//! `matcher.pricing_budget_ms` deadline: the round is "exact over every
//! pair" (`full_graph`) exactly when pricing finished, the LP-dual
//! certificate then holding over every feasible pair of the round, and
//! its objective is the cold round's (`round::tests`, randomized). With
//! `pricing_budget_ms = 0` (exact on the candidates only) every round is
//! cold: the incremental round has no candidate graph of its own to be
//! exact on.
//!
//! # Rounds where nothing changed
//!
//! A round is a pure function of its inputs once its pricing finished: a
//! round whose state, GPU keys and epoch equal the last one's returns the
//! last plan, unscored ([`RoundCache::reused`]). The state beyond its GPUs
//! (the pending queue holds thousands of jobs in the replay's busy hours)
//! is compared and copied only while the GPUs and keys are the last
//! call's: where they changed the round cannot be the last one, and the
//! copy waits for a call where they did not (timers, 2026-11-27: this
//! comparison took 31.6 s of the round threads' time in a replayed week
//! when every call copied the queue, 4.0–5.5 s in 3 replayed days after).

use std::collections::HashMap;
use std::sync::Arc;

use crate::exact::{ExactOptions, Incremental, RowScan, Scores};
use crate::reader::{ClusterState, NodeRoom, PendingJob};
use crate::round::Plan;
use crate::solver::{solve_with, Edge, SolveOptions};

/// Cold when more than one in this many open GPUs changed (module docs).
pub const COLD_WHEN_CHANGED_ONE_IN: u64 = 1000;

/// Rows kept beyond the jobs of a cold round, for jobs that arrive before
/// the next cold one: a quarter more, at least this many.
const SPARE_ROWS: usize = 64;

/// What a job's weights are computed from.
#[derive(Debug, Clone, PartialEq)]
struct RowKey {
    id: u32,
    user: String,
    account: String,
    name: String,
    slot_gpus: Vec<u32>,
    gpus: u32,
    need: NodeRoom,
    /// [`crate::round::Predictor::job_key`].
    extra: u64,
}

impl RowKey {
    fn of(j: &PendingJob, extra: u64) -> RowKey {
        RowKey {
            id: j.id,
            user: j.user.clone(),
            account: j.account.clone(),
            name: j.name.clone(),
            slot_gpus: j.slot_gpus.clone(),
            gpus: j.gpus,
            need: j.need,
            extra,
        }
    }

    fn matches(&self, j: &PendingJob, extra: u64) -> bool {
        self.id == j.id
            && self.extra == extra
            && self.gpus == j.gpus
            && self.need == j.need
            && self.slot_gpus == j.slot_gpus
            && self.name == j.name
            && self.user == j.user
            && self.account == j.account
    }
}

/// How a round was solved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RoundKind {
    #[default]
    Cold,
    Incremental,
    /// Nothing changed: the last plan.
    Reused,
}

/// The last round, for the next one (module docs).
pub struct RoundCache {
    /// Cold when more than one in this many open GPUs changed
    /// ([`COLD_WHEN_CHANGED_ONE_IN`]).
    pub cold_when_changed_one_in: u64,
    /// The state and GPU keys of the last call (updated in place: only
    /// what changed is copied).
    seen: ClusterState,
    seen_keys: Vec<u64>,
    seen_epoch: u64,
    /// `seen`'s fields other than its GPUs are the last call's.
    seen_rest: bool,
    /// The GPUs whose state or key changed since the last matching.
    gpu_changed: Vec<bool>,
    /// The GPU list itself changed since the last matching.
    gpus_moved: bool,
    /// Slurm's fair share changed since the last matching: it orders the
    /// round's users, and so which of the jobs predicted alike a cold
    /// round places (round::considered_jobs); an incremental round would
    /// keep the last round's choice among them.
    order_moved: bool,
    /// The last matching's epoch, rows and columns.
    epoch: u64,
    row_of: HashMap<u32, u32>,
    row_key: Vec<Option<RowKey>>,
    /// Per column: open with its node's room, or not open (`None`).
    col_room: Vec<Option<Option<NodeRoom>>>,
    inc: Option<Incremental>,
    /// The last call's plan when it is final (pricing done or not asked
    /// for): what a call with the same inputs returns.
    memo: Option<Arc<Plan>>,
    /// Rounds of each kind so far.
    pub cold: u64,
    pub incremental: u64,
    pub reused: u64,
    /// How the last round was solved.
    pub last: RoundKind,
}

trait Restart {
    fn restarted(&self, budget: Option<std::time::Duration>) -> ExactOptions;
}

impl Restart for ExactOptions {
    /// These options with the deadline `budget` from now.
    fn restarted(&self, budget: Option<std::time::Duration>) -> ExactOptions {
        ExactOptions {
            deadline: budget.map(|b| std::time::Instant::now() + b),
            ..self.clone()
        }
    }
}

impl Default for RoundCache {
    fn default() -> Self {
        RoundCache {
            cold_when_changed_one_in: COLD_WHEN_CHANGED_ONE_IN,
            seen: ClusterState::default(),
            seen_keys: Vec::new(),
            seen_epoch: 0,
            seen_rest: false,
            gpu_changed: Vec::new(),
            gpus_moved: false,
            order_moved: false,
            epoch: 0,
            row_of: HashMap::new(),
            row_key: Vec::new(),
            col_room: Vec::new(),
            inc: None,
            memo: None,
            cold: 0,
            incremental: 0,
            reused: 0,
            last: RoundKind::Cold,
        }
    }
}

/// The 1-GPU jobs' matching in the round's own indices: its graph
/// (sorted by (job, column)), its pairs, and whether it is exact over
/// every feasible pair.
pub(crate) struct Matched {
    pub edges: Vec<Edge>,
    pub pairs: Vec<(u32, u32)>,
    pub full_graph: bool,
}

/// One round as the cache reads it: `jobs` and their
/// [`crate::round::Predictor::job_key`]s, `open[c]` column c's position in
/// the state's GPUs, `col_room[c]` its node's room, `score` the round's
/// weights (job, column), `candidates(js)` the candidate graph of jobs `js`
/// (ascending; the edges name the round's jobs), which a cold round starts
/// from and a changed job's row is seeded with; `opts` and `budget` the
/// pricing's; `scored_once`: `score` looks most pairs up (no rows kept
/// scored).
pub(crate) struct CacheRound<'a, C> {
    pub epoch: u64,
    pub jobs: &'a [&'a PendingJob],
    pub job_keys: &'a [u64],
    pub open: &'a [usize],
    pub col_room: &'a [Option<NodeRoom>],
    pub score: &'a Score<'a>,
    pub candidates: C,
    pub opts: &'a ExactOptions,
    pub budget: Option<std::time::Duration>,
    pub scored_once: bool,
}

impl<C> CacheRound<'_, C> {
    /// Jobs `js`'s rows scored once, where that pays: none where `score`
    /// is a lookup already (scored once per column class), keeping rows
    /// scored would only copy them.
    fn scored_rows(&self, js: &[u32]) -> Dense {
        let rows = if self.scored_once { &[][..] } else { js };
        Dense::fill(
            rows,
            self.jobs.len(),
            self.open.len(),
            self.score,
            self.opts.threads,
        )
    }
}

/// The round's open columns on the state's GPUs: each GPU's node room
/// (`None`: not open), its column (`u32::MAX`: none), the open GPUs in
/// order.
struct Columns {
    room: Vec<Option<Option<NodeRoom>>>,
    col_open: Vec<u32>,
    live: Vec<u32>,
}

impl Columns {
    fn of<C>(n: usize, round: &CacheRound<'_, C>) -> Columns {
        let mut room: Vec<Option<Option<NodeRoom>>> = vec![None; n];
        let mut col_open = vec![u32::MAX; n];
        for (c, &i) in round.open.iter().enumerate() {
            room[i] = Some(round.col_room[c]);
            col_open[i] = c as u32;
        }
        let mut live: Vec<u32> = round.open.iter().map(|&i| i as u32).collect();
        live.sort_unstable();
        Columns {
            room,
            col_open,
            live,
        }
    }
}

/// The round's jobs and open GPUs on the cache's rows and columns.
struct Slotted<'a> {
    /// Row -> the round's job (`u32::MAX`: none).
    row_job: Vec<u32>,
    /// Column -> the round's column (`u32::MAX`: not open).
    col_open: Vec<u32>,
    /// The columns with an open GPU.
    live: Vec<u32>,
    score: &'a Score<'a>,
    /// Rows scored once this round, read without calling `score`.
    dense: Option<&'a Dense>,
}

/// A round's weights, (job, column) in the round's indices.
pub(crate) type Score<'a> = dyn Fn(u32, u32) -> Option<i64> + Sync + 'a;

/// Rows of weights scored once, for the rows a round scores twice (its
/// candidate lists, then pricing's first pass), while they fit
/// [`DENSE_PAIRS`]: the sim's rounds (about 25 new jobs × 6,000 GPUs) spent
/// half their time scoring those rows the second time.
struct Dense {
    /// Round job -> its row here (`u32::MAX`: not scored).
    at: Vec<u32>,
    cols: usize,
    /// `i64::MIN`: not feasible.
    w: Vec<i64>,
}

/// The most pairs a round keeps scored (8 bytes each: 32 MiB).
const DENSE_PAIRS: usize = 4 << 20;

impl Dense {
    fn fill(js: &[u32], jobs: usize, cols: usize, score: &Score, threads: usize) -> Dense {
        let mut at = vec![u32::MAX; jobs];
        if js.len().saturating_mul(cols) > DENSE_PAIRS || cols == 0 {
            return Dense {
                at,
                cols,
                w: Vec::new(),
            };
        }
        let parts = crate::exact::parallel(js, threads, cols, |chunk| {
            let mut w = Vec::with_capacity(chunk.len() * cols);
            for &j in chunk {
                w.extend((0..cols as u32).map(|c| score(j, c).unwrap_or(i64::MIN)));
            }
            (chunk.first().copied(), w)
        });
        let mut w = Vec::with_capacity(js.len() * cols);
        let mut rows = 0u32;
        for (first, part) in parts {
            let Some(first) = first else { continue };
            let start = js.partition_point(|&j| j < first);
            for (k, &j) in js[start..start + part.len() / cols].iter().enumerate() {
                at[j as usize] = rows + k as u32;
            }
            rows += (part.len() / cols) as u32;
            w.extend(part);
        }
        Dense { at, cols, w }
    }

    #[inline]
    fn get(&self, j: u32, c: u32) -> Option<Option<i64>> {
        let v = self.row(j)?[c as usize];
        Some((v != i64::MIN).then_some(v))
    }

    /// Job j's row (`i64::MIN`: not feasible), if it was scored.
    #[inline]
    fn row(&self, j: u32) -> Option<&[i64]> {
        let r = *self.at.get(j as usize)?;
        (r != u32::MAX).then(|| &self.w[r as usize * self.cols..(r as usize + 1) * self.cols])
    }
}

impl Scores for Slotted<'_> {
    fn jobs(&self) -> usize {
        self.row_job.len()
    }
    fn gpus(&self) -> usize {
        self.col_open.len()
    }
    #[inline]
    fn weight(&self, r: u32, c: u32) -> Option<i64> {
        let (j, o) = (self.row_job[r as usize], self.col_open[c as usize]);
        if j == u32::MAX || o == u32::MAX {
            return None;
        }
        match self.dense.and_then(|d| d.get(j, o)) {
            Some(w) => w,
            None => (self.score)(j, o),
        }
    }
    /// Only live columns; an empty row scores nothing.
    fn scan_row(
        &self,
        r: u32,
        price: &[i64],
        floor: i64,
        visit: &mut dyn FnMut(u32, i64),
    ) -> RowScan {
        let mut scan = RowScan::NOTHING;
        let j = self.row_job[r as usize];
        if j == u32::MAX {
            return scan;
        }
        // A scored row: an array read per pair instead of a call.
        if let Some(row) = self.dense.and_then(|d| d.row(j)) {
            for &c in &self.live {
                let w = row[self.col_open[c as usize] as usize];
                scan.offer(
                    c,
                    (w != i64::MIN).then_some(w),
                    price[c as usize],
                    floor,
                    visit,
                );
            }
            return scan;
        }
        for &c in &self.live {
            let w = (self.score)(j, self.col_open[c as usize]);
            scan.offer(c, w, price[c as usize], floor, visit);
        }
        scan
    }
}

impl RoundCache {
    /// Takes this call's inputs (`keys`: each GPU's
    /// [`crate::round::Predictor::gpu_key`]); the last plan when they are
    /// the last call's and that plan was final.
    pub(crate) fn observe(
        &mut self,
        state: &ClusterState,
        keys: Vec<u64>,
        epoch: u64,
    ) -> Option<Arc<Plan>> {
        let seen = &mut self.seen;
        let mut same = epoch == self.seen_epoch && seen.gpus.len() == state.gpus.len();
        if seen.gpus.len() != state.gpus.len() {
            seen.gpus.clone_from(&state.gpus);
            self.seen_keys = keys;
            self.gpu_changed = vec![true; state.gpus.len()];
            self.gpus_moved = true;
        } else {
            for (i, (a, b)) in seen.gpus.iter_mut().zip(&state.gpus).enumerate() {
                let key = keys[i] != self.seen_keys[i];
                if a != b || key {
                    same = false;
                    self.gpu_changed[i] = true;
                    self.gpus_moved |= a.node != b.node || a.index != b.index;
                    a.clone_from(b);
                }
            }
            self.seen_keys = keys;
        }
        // The rest of the state (the pending queue can hold thousands of
        // jobs) is compared and kept only while the GPUs and keys are the
        // last call's: a round where they changed cannot be the last one.
        let rest_same = same
            && self.seen_rest
            && seen.pending == state.pending
            && seen.running_offline == state.running_offline
            && seen.notes == state.notes
            && seen.node_room == state.node_room
            && seen.memory_consumable == state.memory_consumable
            && seen.fair_share == state.fair_share;
        if same && !rest_same {
            seen.pending.clone_from(&state.pending);
            seen.running_offline.clone_from(&state.running_offline);
            seen.notes.clone_from(&state.notes);
            seen.node_room.clone_from(&state.node_room);
            seen.memory_consumable = state.memory_consumable;
        }
        // A change of fair share reorders the round's jobs whether or not
        // the GPUs moved (small: one entry per user), so it is always compared.
        if seen.fair_share != state.fair_share {
            self.order_moved = true;
            seen.fair_share.clone_from(&state.fair_share);
        }
        self.seen_rest = same;
        same = rest_same;
        self.seen_epoch = epoch;
        let plan = self.memo.take().filter(|_| same)?;
        self.reused += 1;
        self.last = RoundKind::Reused;
        self.memo = Some(Arc::clone(&plan));
        Some(plan)
    }

    /// Keeps this call's plan for [`RoundCache::observe`] when `final_`
    /// (a round whose pricing was cut goes on at the next call).
    pub(crate) fn remember(&mut self, plan: &Arc<Plan>, final_: bool) {
        self.memo = final_.then(|| Arc::clone(plan));
    }

    /// Forgets the matching (a cold round next).
    pub(crate) fn forget(&mut self) {
        self.inc = None;
    }

    /// The 1-GPU jobs' matching of `round` (see [`CacheRound`]):
    /// incremental from the last round where it is warm and little
    /// changed, else cold; either way kept for the next.
    pub(crate) fn matching<C>(&mut self, round: &CacheRound<'_, C>) -> Matched
    where
        C: Fn(&[u32], &Score) -> Vec<Edge>,
    {
        let cols = Columns::of(self.seen.gpus.len(), round);
        let warm = self.inc.is_some()
            && self.epoch == round.epoch
            && !self.gpus_moved
            && !self.order_moved
            && self.col_room.len() == cols.room.len();
        let slotted = if warm {
            self.rows_for(round.jobs)
        } else {
            None
        };
        let incremental = slotted.and_then(|row_job| self.incremental(round, &cols, row_job));
        let (row_job, kind) = match incremental {
            Some(row_job) => (row_job, RoundKind::Incremental),
            None => (self.cold_round(round, &cols), RoundKind::Cold),
        };
        self.epoch = round.epoch;
        self.gpus_moved = false;
        self.order_moved = false;
        self.gpu_changed.iter_mut().for_each(|c| *c = false);
        self.row_of = row_job
            .iter()
            .enumerate()
            .filter(|(_, &j)| j != u32::MAX)
            .map(|(r, &j)| (round.jobs[j as usize].id, r as u32))
            .collect();
        match kind {
            RoundKind::Incremental => self.incremental += 1,
            _ => self.cold += 1,
        }
        self.last = kind;
        let matched = self.in_round_indices(&row_job, &cols.col_open);
        self.col_room = cols.room;
        matched
    }

    /// The incremental round on the last round's rows `row_job`, or `None`
    /// where too much changed (a cold round then).
    fn incremental<C>(
        &mut self,
        round: &CacheRound<'_, C>,
        cols: &Columns,
        row_job: Vec<u32>,
    ) -> Option<Vec<u32>>
    where
        C: Fn(&[u32], &Score) -> Vec<Edge>,
    {
        let (jobs, job_keys, score) = (round.jobs, round.job_keys, round.score);
        let mut row_of_job = vec![u32::MAX; jobs.len()];
        for (r, &j) in row_job.iter().enumerate() {
            if j != u32::MAX {
                row_of_job[j as usize] = r as u32;
            }
        }
        let changed_rows: Vec<u32> = (0..row_job.len() as u32)
            .filter(|&r| {
                let j = row_job[r as usize];
                match (&self.row_key[r as usize], j) {
                    (None, u32::MAX) => false,
                    (Some(k), j) if j != u32::MAX => {
                        !k.matches(jobs[j as usize], job_keys[j as usize])
                    }
                    _ => true,
                }
            })
            .collect();
        let room = &cols.room;
        let changed_cols: Vec<u32> = (0..room.len() as u32)
            .filter(|&c| {
                let c = c as usize;
                room[c] != self.col_room[c] || (room[c].is_some() && self.gpu_changed[c])
            })
            .collect();
        let one_in = self.cold_when_changed_one_in;
        if changed_cols.len() as u64 * one_in > cols.live.len().max(1) as u64
            || changed_rows.len() as u64 * one_in > jobs.len().max(1) as u64
        {
            return None;
        }
        let s = Slotted {
            row_job: row_job.clone(),
            col_open: cols.col_open.clone(),
            live: cols.live.clone(),
            score,
            dense: None,
        };
        // Changed jobs start from their candidate lists.
        let mut changed_jobs: Vec<u32> = changed_rows
            .iter()
            .map(|&r| row_job[r as usize])
            .filter(|&j| j != u32::MAX)
            .collect();
        changed_jobs.sort_unstable();
        let dense = round.scored_rows(&changed_jobs);
        let score = &|j: u32, c: u32| dense.get(j, c).unwrap_or_else(|| score(j, c));
        let mut seed: Vec<Edge> = (round.candidates)(&changed_jobs, score)
            .into_iter()
            .map(|e| Edge {
                job: row_of_job[e.job as usize],
                gpu: round.open[e.gpu as usize] as u32,
                weight: e.weight,
            })
            .collect();
        seed.sort_unstable_by_key(|e| (e.job, e.gpu));
        // The budget counts pricing's own time, as the cold
        // round's does (from after its candidates and solve).
        let opts = &round.opts.restarted(round.budget);
        self.inc.as_mut().expect("warm").update_seeded(
            &s,
            &changed_rows,
            &changed_cols,
            &seed,
            opts,
        );
        for &r in &changed_rows {
            let j = row_job[r as usize];
            self.row_key[r as usize] =
                (j != u32::MAX).then(|| RowKey::of(jobs[j as usize], job_keys[j as usize]));
        }
        Some(row_job)
    }

    /// A cold round: rows in the round's order, spare ones after; its
    /// rows' jobs.
    fn cold_round<C>(&mut self, round: &CacheRound<'_, C>, cols: &Columns) -> Vec<u32>
    where
        C: Fn(&[u32], &Score) -> Vec<Edge>,
    {
        let (jobs, job_keys, score) = (round.jobs, round.job_keys, round.score);
        let spare = (jobs.len() / 4).max(SPARE_ROWS);
        let mut row_job: Vec<u32> = (0..jobs.len() as u32).collect();
        row_job.resize(jobs.len() + spare, u32::MAX);
        let all: Vec<u32> = (0..jobs.len() as u32).collect();
        let dense = round.scored_rows(&all);
        let score = &|j: u32, c: u32| dense.get(j, c).unwrap_or_else(|| score(j, c));
        let s = Slotted {
            row_job: row_job.clone(),
            col_open: cols.col_open.clone(),
            live: cols.live.clone(),
            score,
            dense: Some(&dense),
        };
        let mut edges: Vec<Edge> = (round.candidates)(&all, score)
            .into_iter()
            .map(|e| Edge {
                gpu: round.open[e.gpu as usize] as u32,
                ..e
            })
            .collect();
        edges.sort_unstable_by_key(|e| (e.job, e.gpu));
        let sol = solve_with(s.jobs(), s.gpus(), &edges, &SolveOptions::default())
            .expect("candidate edges are in range, positive and unique");
        let opts = &round.opts.restarted(round.budget);
        self.inc = Some(Incremental::from_solution(&s, edges, sol, opts));
        self.row_key = row_job
            .iter()
            .map(|&j| (j != u32::MAX).then(|| RowKey::of(jobs[j as usize], job_keys[j as usize])))
            .collect();
        row_job
    }

    /// The kept matching back in the round's indices.
    fn in_round_indices(&self, row_job: &[u32], col_open: &[u32]) -> Matched {
        let exact = self.inc.as_ref().expect("solved").exact();
        let mut edges: Vec<Edge> = exact
            .edges
            .iter()
            .filter_map(|e| {
                let (j, c) = (row_job[e.job as usize], col_open[e.gpu as usize]);
                (j != u32::MAX && c != u32::MAX).then_some(Edge {
                    job: j,
                    gpu: c,
                    weight: e.weight,
                })
            })
            .collect();
        edges.sort_unstable_by_key(|e| (e.job, e.gpu));
        let pairs = exact
            .solution
            .matching
            .pairs
            .iter()
            .map(|&(r, c)| (row_job[r as usize], col_open[c as usize]))
            .collect();
        Matched {
            edges,
            pairs,
            full_graph: exact.complete,
        }
    }

    /// This round's jobs on the last round's rows (a job keeps its row,
    /// new ones take free rows, lowest first); `None` when they do not fit.
    fn rows_for(&self, jobs: &[&PendingJob]) -> Option<Vec<u32>> {
        let mut row_job = vec![u32::MAX; self.row_key.len()];
        let mut new = Vec::new();
        for (j, k) in jobs.iter().enumerate() {
            match self.row_of.get(&k.id) {
                Some(&r) => row_job[r as usize] = j as u32,
                None => new.push(j as u32),
            }
        }
        let free: Vec<usize> = (0..row_job.len())
            .filter(|&r| row_job[r] == u32::MAX)
            .collect();
        if free.len() < new.len() {
            return None;
        }
        for (r, j) in free.into_iter().zip(new) {
            row_job[r] = j;
        }
        Some(row_job)
    }
}
