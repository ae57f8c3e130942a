//! Exact sparse maximum-weight bipartite matching (jobs × GPUs).
//!
//! # Problem
//!
//! Jobs `J`, GPUs `G`, candidate edges `(j, g, w)` with integer `w > 0`. Find a
//! matching (each job at most one GPU, each GPU at most one job) of maximum
//! total weight. It need not be perfect: a job may stay unmatched (weight 0).
//! Weights are integers so that "exact" means exact; [`crate::weights`] turns
//! predicted throughputs into integers.
//!
//! # Method
//!
//! Each job gets a private zero-weight "unmatched" column, which makes the
//! problem a rectangular assignment in which every job is assigned. It is
//! solved with dual prices, in max form:
//!
//! * `price[g] ≥ 0` per GPU; the profit of job `j` on `g` is `w(j,g) − price[g]`,
//!   on its unmatched column 0.
//! * Invariant (dual feasibility + complementary slackness on what is
//!   assigned): every assigned job sits on a column of maximum profit; a GPU
//!   with `price > 0` is assigned.
//!
//! 1. **Split** the candidate graph into connected components (union-find);
//!    they are independent and are solved on worker threads (largest first).
//! 2. **Augmenting row reduction** (the auction-like start of Jonker–Volgenant
//!    LAPJV, with ε = 0): a free job takes its best column and raises its
//!    price by the gap to its second best, evicting the previous holder. It
//!    keeps the invariant, so whatever it leaves behind is a valid start; it
//!    runs for a bounded number of steps because ε = 0 bidding can stall.
//! 3. **Successive shortest augmenting paths**: for each still-free job, a
//!    Dijkstra search over the alternating tree with reduced costs (all ≥ 0 by
//!    the invariant), ending at the nearest free GPU or at the unmatched
//!    column of a job in the tree; prices of the settled GPUs are raised by
//!    `μ − d(g)`, then the path is flipped. This is the sparse Hungarian
//!    method (LAPJVsp); each search stops at the first free end, so it only
//!    touches the part of the component it needs.
//!
//! At the end every job is on a column of maximum profit, so the prices and
//! the jobs' profits form an optimal LP dual: [`Duals`] is returned as a
//! certificate and [`verify_certificate`] checks it in O(|E|).
//!
//! Complexity: components O(|E| α); row reduction O(steps × degree) with
//! steps ≤ `arr_steps_per_job × |J|`; each augmentation O(E' log E') where E'
//! is the part of the component its search reaches, so O(|J| |E| log |E|) in
//! the worst case. Memory O(|J| + |G| + |E|).
//!
//! Measured (release, 2 cores; `bench` and `examples/stress.rs`): the bench's
//! top-k-only graphs (10 000 jobs × 18 000 GPUs, k = 16, 160 000 edges)
//! solve in about 10 ms, its production graphs (top k ∪ spread lists, about
//! 320 000 edges, every job placeable) in 0.6–0.7 s structured and 10–20 ms
//! uniform; rank-one weights (job factor × GPU factor + noise) on random
//! candidates take 0.2 s at degree 16 and 2.7 s at degree 64; the unpruned
//! structured 2000 × 2000 graph (2.9 M edges) takes 6 s (dense Kuhn–Munkres:
//! about 18 s). Deep searches on dense rank-one graphs are the weak spot;
//! a multi-source (phase-wise) Hungarian would be the next step there.
//!
//! # Determinism and ties
//!
//! The result depends only on the edge set, not on its order: edges are
//! sorted by (job, GPU) first. Jobs are processed in increasing index; on equal
//! profit the lower GPU index wins; a Dijkstra search ends at a free GPU rather
//! than at an unmatched column of equal distance (more jobs placed), and pops
//! equal distances by increasing GPU index. Among several optimal matchings
//! the one returned is the one this fixed order produces; the objective is
//! the unique optimum.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// A candidate: job `job` may run on GPU `gpu` with integer weight `weight > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Edge {
    pub job: u32,
    pub gpu: u32,
    pub weight: i64,
}

/// A matching: `(job, gpu)` pairs sorted by job, and their total weight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matching {
    pub pairs: Vec<(u32, u32)>,
    pub objective: i64,
}

/// LP dual of the matching: `job[j] + gpu[g] ≥ w(j,g)` for every edge, all
/// ≥ 0; with equality on matched edges and zeros on unmatched vertices it
/// proves the matching optimal (the dual objective equals the primal).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Duals {
    pub job: Vec<i64>,
    pub gpu: Vec<i64>,
}

impl Duals {
    /// Σ duals: an upper bound on any matching's weight when feasible.
    pub fn bound(&self) -> i128 {
        self.job.iter().chain(&self.gpu).map(|&v| v as i128).sum()
    }
}

/// What the solver did, for the bench table and for tuning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SolveStats {
    pub components: usize,
    pub largest_component_edges: usize,
    pub row_reduction_steps: u64,
    pub searches: u64,
    pub settled_columns: u64,
    /// Searches from a free GPU whose price must come down (warm starts).
    pub reverse_searches: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Solution {
    pub matching: Matching,
    pub duals: Duals,
    pub stats: SolveStats,
}

#[derive(Debug, Clone)]
pub struct SolveOptions {
    /// Worker threads for independent components (1 = inline).
    pub threads: usize,
    /// Row-reduction budget, in steps per job of the component. More steps
    /// leave fewer searches but did not pay off on the measured instances.
    pub arr_steps_per_job: usize,
}

/// Two workers at most, fewer on a smaller host; asked once (the answer
/// reads cgroup files: a replayed week asked it 60,000 times).
fn default_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(2)))
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            // The controller host also runs slurmctld: two workers at most.
            threads: default_threads(),
            arr_steps_per_job: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("edge {edge:?}: job index ≥ job count {jobs}")]
    JobOutOfRange { edge: Edge, jobs: usize },
    #[error("edge {edge:?}: GPU index ≥ GPU count {gpus}")]
    GpuOutOfRange { edge: Edge, gpus: usize },
    #[error("edge {edge:?}: weight must be > 0 (leave pairs that are not worth running out)")]
    NonPositiveWeight { edge: Edge },
    #[error("more than one edge between job {job} and GPU {gpu}")]
    DuplicateEdge { job: u32, gpu: u32 },
    #[error("{count} {what}: indices must fit below u32::MAX - 1")]
    TooLarge { what: &'static str, count: usize },
}

/// Maximum-weight matching of the candidate graph, exact on integer weights.
pub fn solve(jobs: usize, gpus: usize, edges: &[Edge]) -> Result<Matching, InputError> {
    solve_with(jobs, gpus, edges, &SolveOptions::default()).map(|s| s.matching)
}

/// [`solve`] with options, returning the dual certificate and statistics.
pub fn solve_with(
    jobs: usize,
    gpus: usize,
    edges: &[Edge],
    opts: &SolveOptions,
) -> Result<Solution, InputError> {
    // Two values at the top of u32 are sentinels.
    for (what, count) in [("jobs", jobs), ("GPUs", gpus), ("edges", edges.len())] {
        if count >= (u32::MAX - 1) as usize {
            return Err(InputError::TooLarge { what, count });
        }
    }
    for &edge in edges {
        if edge.job as usize >= jobs {
            return Err(InputError::JobOutOfRange { edge, jobs });
        }
        if edge.gpu as usize >= gpus {
            return Err(InputError::GpuOutOfRange { edge, gpus });
        }
        if edge.weight <= 0 {
            return Err(InputError::NonPositiveWeight { edge });
        }
    }
    let mut sorted = edges.to_vec();
    sorted.sort_unstable_by_key(|e| (e.job, e.gpu));
    if let Some(w) = sorted
        .windows(2)
        .find(|w| (w[0].job, w[0].gpu) == (w[1].job, w[1].gpu))
    {
        return Err(InputError::DuplicateEdge {
            job: w[0].job,
            gpu: w[0].gpu,
        });
    }

    let components = split_components(jobs, gpus, &sorted);
    let stats = SolveStats {
        components: components.len(),
        largest_component_edges: components.iter().map(|c| c.w.len()).max().unwrap_or(0),
        ..SolveStats::default()
    };

    let results = run_components(&components, opts);
    Ok(assemble(jobs, gpus, &components, &results, stats))
}

/// Global duals, pairs and objective from the components' results.
fn assemble(
    jobs: usize,
    gpus: usize,
    components: &[Component],
    results: &[LocalResult],
    mut stats: SolveStats,
) -> Solution {
    let mut duals = Duals {
        job: vec![0; jobs],
        gpu: vec![0; gpus],
    };
    let mut pairs = Vec::new();
    let mut objective = 0i64;
    for (comp, res) in components.iter().zip(results) {
        stats.row_reduction_steps += res.stats.row_reduction_steps;
        stats.searches += res.stats.searches;
        stats.settled_columns += res.stats.settled_columns;
        stats.reverse_searches += res.stats.reverse_searches;
        for (local, &g) in comp.gpus.iter().enumerate() {
            duals.gpu[g as usize] = res.price[local];
        }
        for (local, &j) in comp.jobs.iter().enumerate() {
            let c = res.row_col[local];
            if c < DUMMY {
                let w = res.row_w[local];
                pairs.push((j, comp.gpus[c as usize]));
                objective += w;
                duals.job[j as usize] = w - res.price[c as usize];
            }
        }
    }
    pairs.sort_unstable();
    Solution {
        matching: Matching { pairs, objective },
        duals,
        stats,
    }
}

/// Where a warm solve starts: a previous round's assignment (`job_gpu[j]`,
/// `u32::MAX` = unmatched) and GPU prices. Only a hint: any start gives the
/// exact optimum; a good one saves work.
#[derive(Debug, Clone, Copy)]
pub struct Start<'a> {
    pub job_gpu: &'a [u32],
    pub price: &'a [i64],
}

impl Solution {
    /// This solution's assignment per job (`u32::MAX` = unmatched), for a
    /// [`Start`].
    pub fn job_gpu(&self, jobs: usize) -> Vec<u32> {
        let mut v = vec![u32::MAX; jobs];
        for &(j, g) in &self.matching.pairs {
            v[j as usize] = g;
        }
        v
    }
}

/// [`solve_with`] from a warm [`Start`], on edges already sorted by (job,
/// GPU) without duplicates (checked in debug builds). Every job whose start
/// column is not among its columns of maximum profit at the start prices
/// (edge gone, better edge added, GPU taken twice) is freed and searched
/// for again; GPUs left free with a positive price are brought down by
/// reverse searches. The result carries the same certificate as a cold
/// solve; the work is proportional to what changed. One thread.
pub fn solve_warm_sorted(jobs: usize, gpus: usize, sorted: &[Edge], start: &Start) -> Solution {
    debug_assert!(sorted
        .windows(2)
        .all(|w| (w[0].job, w[0].gpu) < (w[1].job, w[1].gpu)));
    debug_assert!(sorted
        .iter()
        .all(|e| (e.job as usize) < jobs && (e.gpu as usize) < gpus && e.weight > 0));
    let c = Component::whole(jobs, gpus, sorted);
    let t = c.transpose();
    let price: Vec<i64> = (0..gpus)
        .map(|g| start.price.get(g).copied().unwrap_or(0).max(0))
        .collect();
    let (mut lap, free) = Lap::warm(&c, price, start.job_gpu);
    let mut ws = Workspace::new(gpus);
    for r in free {
        lap.augment(r, &mut ws);
    }
    for g in 0..gpus as u32 {
        if lap.col_row[g as usize] == FREE && lap.price[g as usize] > 0 {
            lap.reverse(g, &t, &mut ws);
        }
    }
    debug_assert!(lap.row_col.iter().all(|&c| c != FREE));
    let stats = SolveStats {
        components: 1,
        largest_component_edges: sorted.len(),
        ..SolveStats::default()
    };
    let res = LocalResult {
        row_col: lap.row_col,
        row_w: lap.row_w,
        price: lap.price,
        stats: lap.stats,
    };
    assemble(
        jobs,
        gpus,
        std::slice::from_ref(&c),
        std::slice::from_ref(&res),
        stats,
    )
}

/// Checks that `duals` certify `matching` optimal on `edges`: feasibility
/// (all ≥ 0, `job + gpu ≥ w` on every edge), tightness on matched edges, zero
/// on unmatched vertices, and equal objectives. Also checks the matching is
/// one (no vertex twice, every pair an edge, objective right).
pub fn verify_certificate(
    jobs: usize,
    gpus: usize,
    edges: &[Edge],
    matching: &Matching,
    duals: &Duals,
) -> Result<(), String> {
    if duals.job.len() != jobs || duals.gpu.len() != gpus {
        return Err("dual vectors have the wrong length".into());
    }
    let mut job_gpu = vec![u32::MAX; jobs];
    let mut gpu_taken = vec![false; gpus];
    for &(j, g) in &matching.pairs {
        let (ju, gu) = (j as usize, g as usize);
        if ju >= jobs || gu >= gpus {
            return Err(format!("pair ({j},{g}) out of range"));
        }
        if job_gpu[ju] != u32::MAX || gpu_taken[gu] {
            return Err(format!("pair ({j},{g}) reuses a vertex"));
        }
        job_gpu[ju] = g;
        gpu_taken[gu] = true;
    }
    let mut objective = 0i64;
    let mut matched_edges = 0usize;
    for e in edges {
        let slack = duals.job[e.job as usize] + duals.gpu[e.gpu as usize] - e.weight;
        if slack < 0 {
            return Err(format!("dual infeasible on {e:?} (slack {slack})"));
        }
        if job_gpu[e.job as usize] == e.gpu {
            if slack != 0 {
                return Err(format!("matched edge {e:?} not tight (slack {slack})"));
            }
            objective += e.weight;
            matched_edges += 1;
        }
    }
    if matched_edges != matching.pairs.len() {
        return Err("a matched pair is not a candidate edge".into());
    }
    if objective != matching.objective {
        return Err(format!(
            "objective {} but the pairs weigh {objective}",
            matching.objective
        ));
    }
    for (j, &d) in duals.job.iter().enumerate() {
        if d < 0 || (d > 0 && job_gpu[j] == u32::MAX) {
            return Err(format!("job {j}: dual {d} on an unmatched job or negative"));
        }
    }
    for (g, &d) in duals.gpu.iter().enumerate() {
        if d < 0 || (d > 0 && !gpu_taken[g]) {
            return Err(format!("GPU {g}: dual {d} on an unmatched GPU or negative"));
        }
    }
    if duals.bound() != objective as i128 {
        return Err(format!(
            "dual bound {} differs from objective {objective}",
            duals.bound()
        ));
    }
    Ok(())
}

/// One connected component in local indices, rows (jobs) in CSR form.
#[derive(Debug, Default)]
struct Component {
    jobs: Vec<u32>,
    gpus: Vec<u32>,
    row_start: Vec<u32>,
    col: Vec<u32>,
    w: Vec<i64>,
}

impl Component {
    /// All jobs and GPUs as one component with identity indices (warm
    /// solves: a start refers to global indices). `sorted` by (job, GPU).
    fn whole(jobs: usize, gpus: usize, sorted: &[Edge]) -> Component {
        let mut row_start = Vec::with_capacity(jobs + 1);
        row_start.push(0u32);
        let mut k = 0usize;
        for j in 0..jobs as u32 {
            while k < sorted.len() && sorted[k].job == j {
                k += 1;
            }
            row_start.push(k as u32);
        }
        Component {
            jobs: (0..jobs as u32).collect(),
            gpus: (0..gpus as u32).collect(),
            row_start,
            col: sorted.iter().map(|e| e.gpu).collect(),
            w: sorted.iter().map(|e| e.weight).collect(),
        }
    }

    /// The same edges by column (for reverse searches), rows increasing.
    fn transpose(&self) -> Transposed {
        let m = self.gpus.len();
        let mut col_start = vec![0u32; m + 1];
        for &g in &self.col {
            col_start[g as usize + 1] += 1;
        }
        for g in 0..m {
            col_start[g + 1] += col_start[g];
        }
        let mut fill = col_start.clone();
        let mut row = vec![0u32; self.col.len()];
        let mut w = vec![0i64; self.col.len()];
        for r in 0..self.jobs.len() {
            for e in self.row_start[r] as usize..self.row_start[r + 1] as usize {
                let g = self.col[e] as usize;
                let at = fill[g] as usize;
                row[at] = r as u32;
                w[at] = self.w[e];
                fill[g] += 1;
            }
        }
        Transposed { col_start, row, w }
    }
}

/// A component's edges in column-major (CSR by GPU) order.
struct Transposed {
    col_start: Vec<u32>,
    row: Vec<u32>,
    w: Vec<i64>,
}

fn find(parent: &mut [u32], mut x: u32) -> u32 {
    while parent[x as usize] != x {
        let p = parent[x as usize];
        parent[x as usize] = parent[p as usize];
        x = p;
    }
    x
}

/// Splits `sorted` (by job, then GPU) into connected components. Jobs without
/// edges are left out (they stay unmatched). Components come out ordered by
/// their smallest job, local indices follow global order.
fn split_components(jobs: usize, gpus: usize, sorted: &[Edge]) -> Vec<Component> {
    let n = jobs + gpus;
    let mut parent: Vec<u32> = (0..n as u32).collect();
    for e in sorted {
        let a = find(&mut parent, e.job);
        let b = find(&mut parent, jobs as u32 + e.gpu);
        if a != b {
            // Smaller root wins so the result does not depend on edge order.
            let (lo, hi) = if a < b { (a, b) } else { (b, a) };
            parent[hi as usize] = lo;
        }
    }
    const NONE: u32 = u32::MAX;
    let mut comp_of_root = vec![NONE; n];
    let mut local = vec![0u32; n];
    let mut comps: Vec<Component> = Vec::new();
    let mut last_job = NONE;
    for e in sorted {
        let root = find(&mut parent, e.job) as usize;
        if comp_of_root[root] == NONE {
            comp_of_root[root] = comps.len() as u32;
            comps.push(Component {
                row_start: vec![0],
                ..Component::default()
            });
        }
        let c = &mut comps[comp_of_root[root] as usize];
        if e.job != last_job {
            local[e.job as usize] = c.jobs.len() as u32;
            c.jobs.push(e.job);
            c.row_start.push(0);
            last_job = e.job;
        }
        let gv = jobs + e.gpu as usize;
        // Local GPU ids are given in first-seen order here and renumbered below.
        if comp_of_root[gv] == NONE {
            comp_of_root[gv] = 0;
            local[gv] = c.gpus.len() as u32;
            c.gpus.push(e.gpu);
        }
        c.col.push(local[gv]);
        c.w.push(e.weight);
        let rows = c.row_start.len();
        c.row_start[rows - 1] = c.col.len() as u32;
    }
    // Renumber GPUs in increasing global order so ties break by GPU index.
    for c in &mut comps {
        let mut order: Vec<u32> = (0..c.gpus.len() as u32).collect();
        order.sort_unstable_by_key(|&l| c.gpus[l as usize]);
        let mut new_of_old = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_of_old[old as usize] = new as u32;
        }
        for col in &mut c.col {
            *col = new_of_old[*col as usize];
        }
        c.gpus = order.iter().map(|&old| c.gpus[old as usize]).collect();
        // Keep each row's edges sorted by (new) GPU index.
        for r in 0..c.jobs.len() {
            let (s, t) = (c.row_start[r] as usize, c.row_start[r + 1] as usize);
            let mut row: Vec<(u32, i64)> = c.col[s..t]
                .iter()
                .copied()
                .zip(c.w[s..t].iter().copied())
                .collect();
            row.sort_unstable_by_key(|&(g, _)| g);
            for (k, (g, w)) in row.into_iter().enumerate() {
                c.col[s + k] = g;
                c.w[s + k] = w;
            }
        }
    }
    comps
}

fn run_components(components: &[Component], opts: &SolveOptions) -> Vec<LocalResult> {
    let threads = opts.threads.max(1).min(components.len().max(1));
    if threads == 1 {
        return components
            .iter()
            .map(|c| Lap::new(c).run(opts.arr_steps_per_job))
            .collect();
    }
    // Longest-processing-time first, with edge count as the size.
    let mut order: Vec<usize> = (0..components.len()).collect();
    order.sort_by_key(|&i| Reverse(components[i].w.len()));
    let mut load = vec![0usize; threads];
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); threads];
    for i in order {
        let t = (0..threads).min_by_key(|&t| (load[t], t)).unwrap_or(0);
        load[t] += components[i].w.len() + components[i].jobs.len();
        assigned[t].push(i);
    }
    let mut results: Vec<Option<LocalResult>> = (0..components.len()).map(|_| None).collect();
    let solved = crate::workers::each(threads, |t| {
        assigned[t]
            .iter()
            .map(|&i| (i, Lap::new(&components[i]).run(opts.arr_steps_per_job)))
            .collect::<Vec<_>>()
    });
    for (i, r) in solved.into_iter().flatten() {
        results[i] = Some(r);
    }
    results
        .into_iter()
        .map(|r| r.expect("every component solved"))
        .collect()
}

/// Column sentinels in `row_col`.
const FREE: u32 = u32::MAX;
const DUMMY: u32 = u32::MAX - 1;

struct LocalResult {
    row_col: Vec<u32>,
    row_w: Vec<i64>,
    price: Vec<i64>,
    stats: SolveStats,
}

/// The assignment state of one component.
struct Lap<'a> {
    c: &'a Component,
    price: Vec<i64>,
    row_col: Vec<u32>,
    /// Weight of the row's assigned edge (profit = row_w − price).
    row_w: Vec<i64>,
    col_row: Vec<u32>,
    stats: SolveStats,
}

impl<'a> Lap<'a> {
    fn new(c: &'a Component) -> Self {
        let (n, m) = (c.jobs.len(), c.gpus.len());
        Lap {
            c,
            price: vec![0; m],
            row_col: vec![FREE; n],
            row_w: vec![0; n],
            col_row: vec![FREE; m],
            stats: SolveStats::default(),
        }
    }

    /// A Lap at `price` keeping each job of `job_gpu` whose column is
    /// still one of its columns of maximum profit (the invariant); returns
    /// the jobs left free, increasing.
    fn warm(c: &'a Component, price: Vec<i64>, job_gpu: &[u32]) -> (Self, Vec<u32>) {
        let mut lap = Lap::new(c);
        lap.price = price;
        let mut free = Vec::new();
        for r in 0..c.jobs.len() as u32 {
            let mut best = 0i64;
            let mut held = None;
            let want = job_gpu.get(r as usize).copied().unwrap_or(FREE);
            for e in lap.row(r) {
                let (g, w) = (c.col[e], c.w[e]);
                best = best.max(w - lap.price[g as usize]);
                if g == want {
                    held = Some(w);
                }
            }
            match held {
                Some(w)
                    if w - lap.price[want as usize] == best
                        && lap.col_row[want as usize] == FREE =>
                {
                    lap.assign(r, want, w)
                }
                _ if best == 0 => lap.assign(r, DUMMY, 0),
                _ => free.push(r),
            }
        }
        (lap, free)
    }

    fn row(&self, r: u32) -> std::ops::Range<usize> {
        self.c.row_start[r as usize] as usize..self.c.row_start[r as usize + 1] as usize
    }

    fn assign(&mut self, r: u32, g: u32, w: i64) {
        self.row_col[r as usize] = g;
        self.row_w[r as usize] = w;
        if g < DUMMY {
            self.col_row[g as usize] = r;
        }
    }

    fn run(mut self, arr_steps_per_job: usize) -> LocalResult {
        let free = self.row_reduction(arr_steps_per_job.saturating_mul(self.c.jobs.len()));
        let mut ws = Workspace::new(self.c.gpus.len());
        for r in free {
            self.augment(r, &mut ws);
        }
        debug_assert!(self.row_col.iter().all(|&c| c != FREE));
        LocalResult {
            row_col: self.row_col,
            row_w: self.row_w,
            price: self.price,
            stats: self.stats,
        }
    }

    /// Augmenting row reduction with ε = 0; returns the rows left free.
    fn row_reduction(&mut self, budget: usize) -> Vec<u32> {
        let mut queue: VecDeque<u32> = (0..self.c.jobs.len() as u32).collect();
        let mut steps = 0usize;
        while let Some(r) = queue.pop_front() {
            if steps >= budget {
                queue.push_front(r);
                break;
            }
            steps += 1;
            // The unmatched column (profit 0) is the first contender.
            let (mut p1, mut g1, mut w1) = (0i64, DUMMY, 0i64);
            let (mut p2, mut g2, mut w2) = (i64::MIN, FREE, 0i64);
            for e in self.row(r) {
                let (g, w) = (self.c.col[e], self.c.w[e]);
                let p = w - self.price[g as usize];
                if p > p1 {
                    (p2, g2, w2) = (p1, g1, w1);
                    (p1, g1, w1) = (p, g, w);
                } else if p > p2 {
                    (p2, g2, w2) = (p, g, w);
                }
            }
            if g1 == DUMMY {
                self.assign(r, DUMMY, 0);
                continue;
            }
            // g1 is a GPU, so the unmatched column is at worst second: p2 ≥ 0.
            if p1 > p2 {
                self.price[g1 as usize] += p1 - p2;
                let prev = self.col_row[g1 as usize];
                self.assign(r, g1, w1);
                if prev != FREE {
                    self.row_col[prev as usize] = FREE;
                    // Re-bid at once: its best just got dearer, like an auction.
                    queue.push_front(prev);
                }
            } else if self.col_row[g1 as usize] == FREE {
                self.assign(r, g1, w1);
            } else if g2 == DUMMY {
                self.assign(r, DUMMY, 0);
            } else {
                let prev = self.col_row[g2 as usize];
                self.assign(r, g2, w2);
                if prev != FREE {
                    self.row_col[prev as usize] = FREE;
                    queue.push_back(prev);
                }
            }
        }
        self.stats.row_reduction_steps = steps as u64;
        queue.into_iter().collect()
    }

    /// One shortest augmenting path from free row `r0` (Dijkstra on reduced
    /// costs), then the dual update and the flip.
    fn augment(&mut self, r0: u32, ws: &mut Workspace) {
        self.stats.searches += 1;
        let mut pi0 = 0i64;
        for e in self.row(r0) {
            pi0 = pi0.max(self.c.w[e] - self.price[self.c.col[e] as usize]);
        }
        // Best end so far: an unmatched column (of this row or of a row in the
        // tree) or a free GPU seen at a tentative distance. Nothing at or
        // beyond it needs exploring.
        let mut dummy_end = (pi0, r0);
        let mut bound = pi0;
        self.relax(r0, 0, pi0, ws, &mut bound);
        let end_col;
        let mu;
        loop {
            let top = loop {
                match ws.heap.peek() {
                    None => break None,
                    Some(&Reverse((d, _, g))) => {
                        if ws.done[g as usize] || d > ws.dist[g as usize] {
                            ws.heap.pop();
                        } else {
                            break Some((d, g));
                        }
                    }
                }
            };
            match top {
                Some((d, g)) if d <= dummy_end.0 => {
                    ws.heap.pop();
                    if self.col_row[g as usize] == FREE {
                        end_col = g;
                        mu = d;
                        break;
                    }
                    ws.done[g as usize] = true;
                    ws.settled.push(g);
                    let r = self.col_row[g as usize];
                    let pi = self.row_w[r as usize] - self.price[g as usize];
                    if d + pi < dummy_end.0 {
                        dummy_end = (d + pi, r);
                        bound = bound.min(dummy_end.0);
                    }
                    self.relax(r, d, pi, ws, &mut bound);
                }
                _ => {
                    end_col = DUMMY;
                    mu = dummy_end.0;
                    break;
                }
            }
        }
        self.stats.settled_columns += ws.settled.len() as u64;
        for &g in &ws.settled {
            self.price[g as usize] += mu - ws.dist[g as usize];
        }
        // Flip the path: each row takes the column it reached, the row that
        // held that column moves on towards r0.
        let (mut col, mut row) = if end_col == DUMMY {
            let r = dummy_end.1;
            let prev = self.row_col[r as usize];
            self.assign(r, DUMMY, 0);
            if r == r0 {
                ws.reset();
                return;
            }
            (prev, ws.pred[prev as usize])
        } else {
            (end_col, ws.pred[end_col as usize])
        };
        loop {
            let prev = self.row_col[row as usize];
            let w = self.edge_weight(row, col);
            self.assign(row, col, w);
            if row == r0 {
                break;
            }
            col = prev;
            row = ws.pred[col as usize];
        }
        ws.reset();
    }

    /// Brings down the price of free GPU `g0` (price > 0): a shortest
    /// alternating path search from `g0` over GPUs, distances the slacks
    /// `u(r) + price(g) − w` of the edges it crosses (matched edges are
    /// tight, so a job is reached together with its GPU). It ends where
    /// the price of a reached GPU can drop to 0 (at `d(g) + price(g)`) or
    /// at an unmatched job (at `d` of the edge reaching it). Prices of the
    /// settled GPUs fall by `μ − d(g)`, which raises their jobs' profits
    /// by the same and keeps every edge feasible; then the path flips:
    /// `g0` is matched, or its price is 0. The mirror of [`Lap::augment`].
    fn reverse(&mut self, g0: u32, t: &Transposed, ws: &mut Workspace) {
        #[derive(Clone, Copy)]
        enum End {
            /// This GPU's price drops to 0; it ends free.
            Drop(u32),
            /// The unmatched job takes this GPU.
            Take(u32, u32),
        }
        self.stats.reverse_searches += 1;
        let mut best = (self.price[g0 as usize], End::Drop(g0));
        ws.dist[g0 as usize] = 0;
        ws.touched.push(g0);
        ws.heap.push(Reverse((0, false, g0)));
        loop {
            let top = loop {
                match ws.heap.peek() {
                    None => break None,
                    Some(&Reverse((d, _, g))) => {
                        if ws.done[g as usize] || d > ws.dist[g as usize] {
                            ws.heap.pop();
                        } else {
                            break Some((d, g));
                        }
                    }
                }
            };
            let Some((d, g)) = top.filter(|&(d, _)| d < best.0) else {
                break;
            };
            ws.heap.pop();
            let gu = g as usize;
            ws.done[gu] = true;
            ws.settled.push(g);
            if d + self.price[gu] < best.0 {
                best = (d + self.price[gu], End::Drop(g));
            }
            let holder = self.col_row[gu];
            for e in t.col_start[gu] as usize..t.col_start[gu + 1] as usize {
                let r = t.row[e];
                if r == holder {
                    continue;
                }
                let rc = self.row_col[r as usize];
                let u = if rc == DUMMY {
                    0
                } else {
                    self.row_w[r as usize] - self.price[rc as usize]
                };
                let nd = d + u + self.price[gu] - t.w[e];
                if rc == DUMMY {
                    if nd < best.0 {
                        best = (nd, End::Take(r, g));
                    }
                    continue;
                }
                let cu = rc as usize;
                if !ws.done[cu] && nd < ws.dist[cu] && nd < best.0 {
                    if ws.dist[cu] == i64::MAX {
                        ws.touched.push(rc);
                    }
                    ws.dist[cu] = nd;
                    ws.pred[cu] = g;
                    ws.heap.push(Reverse((nd, false, rc)));
                }
            }
        }
        let mu = best.0;
        self.stats.settled_columns += ws.settled.len() as u64;
        for &g in &ws.settled {
            self.price[g as usize] -= mu - ws.dist[g as usize];
        }
        // Flip: each moved job takes the GPU its path came from, towards g0.
        let (mut row, mut tgt) = match best.1 {
            End::Drop(g) if g == g0 => {
                ws.reset();
                return;
            }
            End::Drop(g) => {
                let r = self.col_row[g as usize];
                self.col_row[g as usize] = FREE;
                (r, ws.pred[g as usize])
            }
            End::Take(r, g) => (r, g),
        };
        loop {
            let next = self.col_row[tgt as usize];
            let w = self.edge_weight(row, tgt);
            self.assign(row, tgt, w);
            if tgt == g0 {
                break;
            }
            row = next;
            tgt = ws.pred[tgt as usize];
        }
        ws.reset();
    }

    /// Offers the edges of row `r` (settled at distance `d`, profit `pi`).
    fn relax(&self, r: u32, d: i64, pi: i64, ws: &mut Workspace, bound: &mut i64) {
        for e in self.row(r) {
            let g = self.c.col[e];
            let gu = g as usize;
            if ws.done[gu] {
                continue;
            }
            let nd = d + pi - (self.c.w[e] - self.price[gu]);
            if nd < ws.dist[gu] && nd <= *bound {
                if ws.dist[gu] == i64::MAX {
                    ws.touched.push(g);
                }
                ws.dist[gu] = nd;
                ws.pred[gu] = r;
                ws.heap.push(Reverse((nd, self.col_row[gu] != FREE, g)));
                if self.col_row[gu] == FREE {
                    *bound = (*bound).min(nd);
                }
            }
        }
    }

    fn edge_weight(&self, r: u32, g: u32) -> i64 {
        let range = self.row(r);
        let cols = &self.c.col[range.clone()];
        let k = cols.binary_search(&g).expect("path edge exists");
        self.c.w[range.start + k]
    }
}

/// Per-search scratch, reset in O(touched).
struct Workspace {
    dist: Vec<i64>,
    pred: Vec<u32>,
    done: Vec<bool>,
    touched: Vec<u32>,
    settled: Vec<u32>,
    /// (distance, column matched, column): among equal distances a free
    /// column pops first, so a search on tied weights ends at the first
    /// free one it reaches instead of settling the matched ones beside it.
    heap: BinaryHeap<Reverse<(i64, bool, u32)>>,
}

impl Workspace {
    fn new(m: usize) -> Self {
        Workspace {
            dist: vec![i64::MAX; m],
            pred: vec![FREE; m],
            done: vec![false; m],
            touched: Vec::new(),
            settled: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    fn reset(&mut self) {
        for &g in &self.touched {
            self.dist[g as usize] = i64::MAX;
            self.done[g as usize] = false;
        }
        self.touched.clear();
        self.settled.clear();
        self.heap.clear();
    }
}
