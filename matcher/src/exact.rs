//! Exact on the full feasible graph: the solver is exact on the candidate
//! graph it is given; pricing makes the round exact on *every* feasible
//! (job, GPU) pair.
//!
//! # Method (column generation)
//!
//! Solve the candidate graph ([`crate::prune`]), then *price out*: with the
//! solution's duals (`u` per job, `p` per GPU) look for pairs outside the
//! graph with a positive reduced cost `w − u − p`. Each job's most violated
//! pairs (at most [`ExactOptions::per_job`] per pass) join the graph and the
//! solver re-solves from the previous matching and prices
//! ([`solve_warm_sorted`]). When a pass finds no such pair the duals are
//! feasible for every pair, tight on the matching and zero on unmatched
//! vertices: the LP-dual certificate then holds over the full graph, so the
//! matching is a maximum-weight matching of it. Every pass adds at least
//! one edge, so the loop ends.
//!
//! Pricing never stores the full graph. It prices a row with
//! [`Scores::scan_row`], in job blocks on the worker threads: by default
//! each GPU's own bound ([`Scores::pair_bound`], a few multiplications
//! without the pair's noise) rules most pairs out before one is scored; the
//! synthetic cluster does the same class by class on contiguous arrays,
//! which made a pass about 1.5–2× faster than walking pricing groups
//! sorted by price (the groups' bookkeeping cost more than it saved).
//!
//! # Cost, and what shapes it
//!
//! On the bench's weights (job factor × GPU factor × 3% noise per pair) the
//! duals are degenerate: nearly every row has near-ties, and each solve moves
//! most rows' duals, so every pass rescans most rows (bounded) and each
//! re-solve frees most jobs whose best GPU changed. At 18,000 × 10,000: 13
//! passes, 173 M pairs scored; of about 9 s on 2 cores the warm re-solves
//! take about two thirds (the first passes' each search again for nearly
//! every job, settling 1.4–2.4 M columns), pricing the rest. The optimum
//! itself moves about 2,000 of 9,900 unchanged jobs after a 1% change (the
//! bench prints it), so an exact incremental round makes that many moves
//! whatever it starts from: about 1,200 searches settling 1 M columns.
//!
//! Checking the certificate once, every row priced at the optimum's own
//! duals with these bounds, scores 6.3 M of the 118 M feasible pairs and
//! takes 0.33 s on 2 cores (the bench's `certificate pass (bounded)` row,
//! 2026-11-26, on the machine where the cold round took 24 s); with the
//! pruning (0.59 s) and the candidate graph's cold solve (1.18 s) the parts
//! every round has take 2.1 s there, before any pricing pass.
//!
//! Measured and not kept (issue 19), at that size:
//! * an ε-scaling forward auction over every pair as the start (rows
//!   priced on demand, each job's list of its best GPUs valid while prices
//!   only rise): its graph needs 3–4 passes, but on these near-rank-one
//!   weights a job's list is used up by about one bid (195,000 row scans,
//!   5.7 s), and turning its ε-optimal prices into exact duals took 5,600
//!   searches (0.8 s): 7.2 s in all;
//! * the same auction on the candidate graph only, pricing at its prices
//!   until nothing is violated, then one exact solve: each auction costs
//!   15–90 ms, but it takes 21 passes (700 ms of pricing each) and the
//!   exact solve from its prices 17 s (2,800 reverse searches: a forward
//!   auction leaves GPUs that lost their job at a high price);
//! * more pairs per pass (`per_job` 32, near-violated pairs too) or a
//!   larger candidate graph (k = 32, 64): no fewer passes, more time;
//! * no candidate graph at all: successive shortest paths on the implicit
//!   full graph, each tree job's row enumerated lazily in decreasing
//!   profit from the pricing groups (GPUs kept sorted by price, bound
//!   `group_bound − price`), so a search scores only pairs whose bound
//!   beats its distance. Exact, but on these weights a search from zero
//!   prices settles nearly every matched GPU (the job factor × GPU factor
//!   ladder leaves reduced costs along it far below the path's length):
//!   2,000 × 1,200 took 36 s (550 GPUs settled and 180,000 pairs scored
//!   per search); with an ε-scaling auction as the start, each bid scored
//!   about 400 of the 2,000 GPUs (the 3% noise is as wide as the profits'
//!   spread at equilibrium, so bounds prune little);
//! * row reduction (the auction-like start, ε = 0) before the warm
//!   re-solves' searches: it spent its budget on ties and left 8,400 of
//!   9,400 searches (no faster).
//! * near-final prices as the start. A probe with the optimum's own GPU
//!   prices: each job's 16 best pairs by `w − p`, every job free, one warm
//!   solve from those prices: 5 ms, certified after 2 pricing passes. With
//!   each price off by up to ±0.1% (uniform per GPU): 0.13 s + 0.27 s of
//!   pricing (3 passes), 0.4 s in all, within the 1 s goal; ±0.3%: 8 s
//!   (the graph misses too much, pricing adds 970,000 pairs); ±1%: 46 s.
//!   From zero prices the same good graph takes 2.6 s (deep searches).
//!   So the method needs prices within about 0.1% before the exact solve;
//!   nothing tried produced them cheaply:
//! * a forward auction on the candidate graph for those prices (one phase,
//!   ε = 50–1,000 of weights up to 10⁶, then rounds that add each job's
//!   violated pairs at the auction's prices and bid again): 4–8 rounds of
//!   about 75,000 pairs for 9,900 jobs each (the noise keeps every job
//!   near a tie), 1.2–2.6 s, and the exact solve from its prices 4–5 s
//!   (800–1,000 GPUs left free with a price: reverse searches); ε-scaling
//!   was worse (the coarse phases' prices stay on GPUs no job holds);
//! * free jobs searched by decreasing best profit (or increasing) rather
//!   than by index: the candidate graph's cold solve took 1.9 s (0.67 s
//!   increasing) against 0.69 s, measured side by side;
//! * prices from a subsample as that start (every 4th or 8th job and GPU,
//!   solved exactly in 1.9 s or 0.47 s; each GPU priced by interpolating
//!   its class's sampled prices over its factor, or as the largest
//!   `w − u` over the sampled jobs' duals): they sit 2–6% below the exact
//!   prices at the median, the error spread over 6% between the 10th and
//!   90th percentile (fewer competitors price scarcity differently), so a
//!   graph of each job's 16 best pairs by `w − p̂` still took a 1.8 s
//!   solve and 8.3 s of pricing (stride 4) or 3 s and 29 s (stride 8). The
//!   exact prices smoothed over 15 neighbours of a class by factor (error
//!   p50 0.02%, p90 0.16%) would do: 0.33 s + 1.08 s. A warm solve on the
//!   weight-pruned candidate graph forgets any start: 13 passes from
//!   zero, from subsample prices and from smoothed ones alike (measured
//!   2026-11-26, on a machine where the cold round took 23 s);
//! * where the passes' time goes: the GPU prices of each pass's solve
//!   against the final ones (median) run −30%, −28%, +8%, +26%, +26%,
//!   +20%, +12%, +1%, then within 0.01% from the 8th solve on: the graph
//!   the early passes build (each job's most violated pairs at prices far
//!   too low, then too high) has optima far from the full graph's, and
//!   each of those solves searches again for nearly every job (2.5 s
//!   each); passes 9–12 take 1.3 s together. Solving each pass's graph
//!   cold instead of warm follows the same prices and took 6 minutes.
//!   Capping the pairs a pass adds per GPU (its 2, 4 or 8 most violated,
//!   so that jobs do not all pile onto the same under-priced GPUs): 23.4,
//!   19.7 and 20.6 s against 23 s (16, 15, 14 passes; a sixth of the
//!   pairs added at cap 2): nearly every job still gets a better pair each
//!   pass and is searched again.
//! * after a 1% change, the previous round's prices as that start (a
//!   fresh graph at those prices, every job free): 0.28 s + 0.84 s of
//!   pricing, no better than the incremental round below (median 1.4 s).
//!
//! # Incremental rounds
//!
//! [`Incremental`] keeps the last round's edges, matching and duals, all of
//! them certified on the full graph. After a change (jobs or GPUs whose
//! weights changed, appeared or vanished; indices stay put) it drops the
//! changed rows' and columns' edges, re-solves warm, and prices only what
//! can have become violated: changed jobs and GPUs, jobs whose dual fell
//! below the certified one and GPUs whose price did (a pair whose two duals
//! did not fall is still covered by the old certificate). It is a cache:
//! the start only saves work, the certificate is rebuilt each round, and a
//! fresh [`Incremental::cold`] gives the same optimum. The daemon's and the
//! replay's rounds use it through [`crate::round_cache`].

use crate::solver::{
    solve_warm_sorted, solve_with, Edge, InputError, Solution, SolveOptions, Start,
};

/// The full feasible graph, scored on demand.
pub trait Scores: Sync {
    fn jobs(&self) -> usize;
    fn gpus(&self) -> usize;
    /// Integer weight of the pair; `None`: not feasible.
    fn weight(&self, job: u32, gpu: u32) -> Option<i64>;
    /// GPU groups for bounded candidate search ([`crate::prune::spread_grouped`]):
    /// each GPU's group (`u32::MAX`: no job can use it) and the number of
    /// groups. `None`: the search scores every pair.
    fn groups(&self) -> Option<(&[u32], usize)> {
        None
    }
    /// An upper bound on `weight(job, g)` over every GPU `g` of `group`;
    /// `None`: none of them is feasible for the job. Only asked when
    /// [`Scores::groups`] is `Some`.
    fn group_bound(&self, _job: u32, _group: u32) -> Option<i64> {
        Some(i64::MAX)
    }
    /// An upper bound on `weight(job, gpu)` cheaper than the weight itself
    /// (`None`: not feasible); pricing asks it before scoring a pair. The
    /// default knows nothing.
    #[inline]
    fn pair_bound(&self, _job: u32, _gpu: u32) -> Option<i64> {
        Some(i64::MAX)
    }
    /// Prices row `job`: calls `visit(g, w)` for every feasible GPU `g`
    /// with `w − price[g] > floor`, and bounds every other feasible GPU's
    /// `w − price[g]`. The default asks [`Scores::pair_bound`] before
    /// scoring each GPU; an implementation that knows its weights' shape
    /// can do it faster (same result).
    fn scan_row(
        &self,
        job: u32,
        price: &[i64],
        floor: i64,
        visit: &mut dyn FnMut(u32, i64),
    ) -> RowScan {
        let mut r = RowScan::NOTHING;
        for g in 0..self.gpus() as u32 {
            let p = price[g as usize];
            let Some(b) = self.pair_bound(job, g) else {
                continue;
            };
            if b.saturating_sub(p) <= floor {
                r.bound = r.bound.max(b.saturating_sub(p));
                continue;
            }
            r.offer(g, self.weight(job, g), p, floor, visit);
        }
        r
    }
}

/// What [`Scores::scan_row`] did: the bound on the pairs it did not visit
/// (`i64::MIN`: none), and how many pairs it scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowScan {
    pub bound: i64,
    pub scored: u64,
}

impl RowScan {
    /// Nothing scanned yet: no pair bounded, none scored.
    pub const NOTHING: RowScan = RowScan {
        bound: i64::MIN,
        scored: 0,
    };

    /// A pair scored at `w` (`None`: not feasible) against price `p`:
    /// visited when `w − p > floor`, else taken into the bound.
    #[inline]
    pub fn offer(
        &mut self,
        g: u32,
        w: Option<i64>,
        p: i64,
        floor: i64,
        visit: &mut dyn FnMut(u32, i64),
    ) {
        self.scored += 1;
        if let Some(w) = w {
            if w - p > floor {
                visit(g, w);
            } else {
                self.bound = self.bound.max(w - p);
            }
        }
    }
}

/// A score function as [`Scores`] (no groups: pricing scores every pair).
pub struct FnScores<F> {
    pub jobs: usize,
    pub gpus: usize,
    pub score: F,
}

impl<F: Fn(u32, u32) -> Option<i64> + Sync> Scores for FnScores<F> {
    fn jobs(&self) -> usize {
        self.jobs
    }
    fn gpus(&self) -> usize {
        self.gpus
    }
    #[inline]
    fn weight(&self, job: u32, gpu: u32) -> Option<i64> {
        (self.score)(job, gpu)
    }
}

#[derive(Debug, Clone)]
pub struct ExactOptions {
    /// Violated pairs a job (or GPU) adds per pricing pass, most violated
    /// first. More: fewer passes, a larger graph.
    pub per_job: usize,
    /// Worker threads for the first solve and for pricing.
    pub threads: usize,
    /// Pricing stops after the pass that ends past this instant (the pairs
    /// that pass found are added and solved, so the result stays exact on
    /// its graph); `None`: until nothing is left to add.
    pub deadline: Option<std::time::Instant>,
}

impl Default for ExactOptions {
    fn default() -> Self {
        ExactOptions {
            per_job: 8,
            threads: SolveOptions::default().threads,
            deadline: None,
        }
    }
}

/// What pricing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PricingStats {
    /// Pricing passes, the last one finding nothing.
    pub passes: usize,
    /// Edges pricing added to the candidate graph.
    pub added: usize,
    /// Pairs scored by pricing.
    pub scored: u64,
    /// Jobs and GPUs priced (rows and columns scanned), all passes.
    pub rows: u64,
    pub cols: u64,
}

/// A round exact on the full graph: the solution, the final candidate
/// graph (sorted by (job, GPU)) and what pricing did.
#[derive(Debug, Clone, Default)]
pub struct Exact {
    pub solution: Solution,
    pub edges: Vec<Edge>,
    pub pricing: PricingStats,
    /// Pricing found nothing left to add: the duals are a certificate over
    /// every feasible pair. `false` only when [`ExactOptions::deadline`]
    /// stopped it (the solution is then exact on `edges`).
    pub complete: bool,
}

/// Reference duals: for every pair `(j, g)` outside the candidate graph,
/// `w(j, g) ≤ ru[j] + rp[g]`. With the current duals `(u, p)`, a pair can
/// only be violated where `u[j] < ru[j]` or `p[g] < rp[g]`: pricing scans
/// just those rows and columns. `i64::MAX` = unknown (scan it).
#[derive(Debug, Clone, Default)]
struct Reference {
    ru: Vec<i64>,
    rp: Vec<i64>,
}

/// A row whose dropped GPUs are more than 1/this of all is scanned whole.
const DROPS_FOR_FULL_SCAN: usize = 16;

/// Scratch of one pricing worker.
struct Scratch {
    /// GPUs of the row's candidate edges.
    mark: Vec<bool>,
    /// (value, index) pairs above the threshold.
    hits: Vec<(i64, u32)>,
}

/// Keeps the `cap` best hits (value, then lower index); returns the best
/// value left out (`i64::MIN`: none).
fn keep_best(hits: &mut Vec<(i64, u32)>, cap: usize) -> i64 {
    if hits.len() <= cap {
        return i64::MIN;
    }
    // A selection, not a sort: early passes find thousands per row.
    hits.select_nth_unstable_by_key(cap, |&(v, i)| (std::cmp::Reverse(v), i));
    let spill = hits[cap].0;
    hits.truncate(cap);
    spill
}

/// Prices row `j` at prices `rp` (the current ones): pairs outside the
/// graph with `w − rp[g] > u` become candidates (the best `cap`); returns
/// the row's new reference dual, an upper bound on `w − rp[g]` of every
/// other pair outside the graph ([`Scores::scan_row`]).
#[allow(clippy::too_many_arguments)]
fn price_row<S: Scores>(
    s: &S,
    rp: &[i64],
    j: u32,
    u: i64,
    row_edges: &[Edge],
    cap: usize,
    sc: &mut Scratch,
    out: &mut Vec<Edge>,
    scored: &mut u64,
) -> i64 {
    for e in row_edges {
        sc.mark[e.gpu as usize] = true;
    }
    let mut hits = std::mem::take(&mut sc.hits);
    let mark = &sc.mark;
    let r = s.scan_row(j, rp, u, &mut |g, w| {
        if !mark[g as usize] {
            hits.push((w - rp[g as usize], g));
        }
    });
    *scored += r.scored;
    let ru = r.bound.max(keep_best(&mut hits, cap));
    for &(v, g) in &hits {
        out.push(Edge {
            job: j,
            gpu: g,
            weight: v + rp[g as usize],
        });
    }
    hits.clear();
    sc.hits = hits;
    for e in row_edges {
        sc.mark[e.gpu as usize] = false;
    }
    ru
}

/// Pairs of work (items × each item's `cost`) below which `parallel` runs
/// inline: a worker's start (tens of µs) costs more than it saves there.
const PARALLEL_MIN_PAIRS: usize = 16 << 10;

/// Runs `work` over `items` on up to `threads` workers (interleaved blocks)
/// and returns the workers' results; `cost`: pairs each item scans (a
/// replay round's few dozen rows each span about a thousand GPUs).
pub(crate) fn parallel<T: Send, I: Sync>(
    items: &[I],
    threads: usize,
    cost: usize,
    work: impl Fn(&[I]) -> T + Sync,
) -> Vec<T> {
    let threads = if items.len() < 2 || items.len().saturating_mul(cost) < PARALLEL_MIN_PAIRS {
        1
    } else {
        threads.clamp(1, items.len())
    };
    if threads == 1 {
        return vec![work(items)];
    }
    // Blocks of up to 128 items, at least four per worker where there are
    // enough items, so that uneven items even out.
    let block = items.len().div_ceil(threads * 4).clamp(1, 128);
    let chunks: Vec<&[I]> = items.chunks(block).collect();
    crate::workers::each(threads, |t| {
        chunks
            .iter()
            .skip(t)
            .step_by(threads)
            .map(|c| work(c))
            .collect::<Vec<T>>()
    })
    .into_iter()
    .flatten()
    .collect()
}

/// One pricing pass: columns whose price fell below the reference, then
/// the reference prices become the current ones, then rows whose dual is
/// below their reference. Returns the candidates to add, sorted by (job, GPU), unique.
fn price<S: Scores>(
    s: &S,
    edges: &[Edge],
    sol: &Solution,
    r: &mut Reference,
    opts: &ExactOptions,
    stats: &mut PricingStats,
) -> Vec<Edge> {
    let pass = Pass {
        s,
        edges,
        u: &sol.duals.job,
        p: &sol.duals.gpu,
        cap: opts.per_job.max(1),
        threads: opts.threads,
    };
    let (mut out, drops) = pass.columns(r, stats);
    pass.rows(r, &drops, stats, &mut out);
    stats.passes += 1;
    out.sort_unstable_by_key(|e| (e.job, e.gpu));
    out.dedup_by_key(|e| (e.job, e.gpu));
    stats.added += out.len();
    out
}

/// What one pricing pass reads: the scores, the graph (sorted by job,
/// GPU), the solution's duals (`u` the jobs', `p` the GPUs' prices), the
/// pairs a row or column may add, the workers.
struct Pass<'a, S> {
    s: &'a S,
    edges: &'a [Edge],
    u: &'a [i64],
    p: &'a [i64],
    cap: usize,
    threads: usize,
}

impl<S: Scores> Pass<'_, S> {
    /// The columns with no reference (changed GPUs, pending columns),
    /// scanned whole; then the reference prices become the current ones.
    /// The pairs found, and the price drops since the reference, largest
    /// first (a finite drop is priced from the rows' side).
    fn columns(&self, r: &mut Reference, stats: &mut PricingStats) -> (Vec<Edge>, Vec<(i64, u32)>) {
        let (s, u, p, cap) = (self.s, self.u, self.p, self.cap);
        let (jobs, gpus) = (s.jobs(), s.gpus());
        let mut out = Vec::new();
        let cols: Vec<u32> = (0..gpus as u32)
            .filter(|&g| r.rp[g as usize] == i64::MAX)
            .collect();
        let is_edge = |j: u32, g: u32| {
            self.edges
                .binary_search_by_key(&(j, g), |e| (e.job, e.gpu))
                .is_ok()
        };
        // A column with more violated pairs than it may add stays pending (its
        // reference unknown) and is scanned again at the next pass, when its
        // price has moved; otherwise its pairs raise the rows' references.
        let parts = parallel(&cols, self.threads, jobs, |chunk| {
            let mut ru = vec![i64::MIN; jobs];
            let mut found = Vec::new();
            let mut pending = Vec::new();
            let mut hits = Vec::new();
            let mut values = Vec::with_capacity(jobs);
            for &g in chunk {
                let pg = p[g as usize];
                for j in 0..jobs as u32 {
                    if let Some(w) = s.weight(j, g) {
                        let v = w - pg;
                        values.push((j, v));
                        if v > u[j as usize] && !is_edge(j, g) {
                            hits.push((v - u[j as usize], j));
                        }
                    }
                }
                if keep_best(&mut hits, cap) == i64::MIN {
                    for &(j, v) in &values {
                        ru[j as usize] = ru[j as usize].max(v);
                    }
                } else {
                    pending.push(g);
                }
                values.clear();
                found.extend(hits.drain(..).map(|(rc, j)| Edge {
                    job: j,
                    gpu: g,
                    weight: rc + pg + u[j as usize],
                }));
            }
            (ru, found, pending)
        });
        let mut pending = Vec::new();
        for (ru, found, pend) in parts {
            for (a, b) in r.ru.iter_mut().zip(ru) {
                *a = (*a).max(b);
            }
            out.extend(found);
            pending.extend(pend);
        }
        // Price drops since the reference, largest first.
        let mut drops: Vec<(i64, u32)> = (0..gpus as u32)
            .filter(|&g| p[g as usize] < r.rp[g as usize] && r.rp[g as usize] != i64::MAX)
            .map(|g| (r.rp[g as usize] - p[g as usize], g))
            .collect();
        drops.sort_unstable_by_key(|&(d, g)| (std::cmp::Reverse(d), g));
        // The reference prices become the current ones (pending columns stay
        // unknown): raising one keeps the invariant; a drop is paid for below.
        r.rp.copy_from_slice(p);
        for g in pending {
            r.rp[g as usize] = i64::MAX;
        }
        stats.cols += cols.len() as u64;
        stats.scored += (cols.len() * jobs) as u64;
        (out, drops)
    }

    /// Rows: a full scan where the dual fell below the reference; where it
    /// is above by a margin m, only the GPUs whose price fell by more than m
    /// can hold a violated pair (a full scan all the same when they are
    /// many: it prices a GPU for less than a pair bound costs). Adds the
    /// pairs found to `out`.
    fn rows(
        &self,
        r: &mut Reference,
        drops: &[(i64, u32)],
        stats: &mut PricingStats,
        out: &mut Vec<Edge>,
    ) {
        let (s, u, edges, cap) = (self.s, self.u, self.edges, self.cap);
        let (jobs, gpus) = (s.jobs(), s.gpus());
        let max_drop = drops.first().map_or(0, |d| d.0);
        let rows: Vec<(u32, bool)> = (0..jobs as u32)
            .filter_map(|j| {
                let (uj, ru) = (u[j as usize], r.ru[j as usize]);
                let margin = uj.saturating_sub(ru);
                if uj < ru {
                    Some((j, true))
                } else if margin < max_drop {
                    let many =
                        drops.partition_point(|&(d, _)| d > margin) > gpus / DROPS_FOR_FULL_SCAN;
                    Some((j, many))
                } else {
                    None
                }
            })
            .collect();
        // Rows not scanned keep the invariant at the lowered prices by taking
        // on the largest drop (their margin covers it).
        for (j, ru) in r.ru.iter_mut().enumerate() {
            let (uj, v) = (u[j], *ru);
            if uj >= v && uj.saturating_sub(v) >= max_drop {
                *ru = v.saturating_add(max_drop);
            }
        }
        let (rp, ru_old) = (&r.rp, &r.ru);
        let parts = parallel(&rows, self.threads, gpus, |chunk| {
            let mut sc = Scratch {
                mark: vec![false; gpus],
                hits: Vec::new(),
            };
            let mut found = Vec::new();
            let mut ru = Vec::with_capacity(chunk.len());
            let mut scored = 0u64;
            for &(j, full) in chunk {
                let lo = edges.partition_point(|e| e.job < j);
                let hi = lo + edges[lo..].partition_point(|e| e.job == j);
                let row_edges = &edges[lo..hi];
                let uj = u[j as usize];
                let v = if full {
                    price_row(
                        s,
                        rp,
                        j,
                        uj,
                        row_edges,
                        cap,
                        &mut sc,
                        &mut found,
                        &mut scored,
                    )
                } else {
                    let base = ru_old[j as usize];
                    let mut ru_new =
                        self.dropped_columns(j, base, drops, row_edges, &mut sc, &mut scored);
                    ru_new = ru_new.max(keep_best(&mut sc.hits, cap));
                    found.extend(sc.hits.drain(..).map(|(v, g)| Edge {
                        job: j,
                        gpu: g,
                        weight: v + self.p[g as usize],
                    }));
                    ru_new
                };
                ru.push((j, v));
            }
            (ru, found, scored)
        });
        for (ru, found, scored) in parts {
            for (j, v) in ru {
                r.ru[j as usize] = v;
            }
            out.extend(found);
            stats.scored += scored;
        }
        stats.rows += rows.len() as u64;
    }

    /// Row j above its reference `base` by a margin: prices only the GPUs
    /// whose price fell by more than it (`drops`, largest first), the
    /// violated pairs into `sc.hits`; returns the row's new reference
    /// before those hits.
    fn dropped_columns(
        &self,
        j: u32,
        base: i64,
        drops: &[(i64, u32)],
        row_edges: &[Edge],
        sc: &mut Scratch,
        scored: &mut u64,
    ) -> i64 {
        let (s, p) = (self.s, self.p);
        let uj = self.u[j as usize];
        let margin = uj.saturating_sub(base);
        let mut ru_new = base;
        for &(d, g) in drops {
            if d <= margin {
                ru_new = ru_new.max(base + d);
                break;
            }
            // The pair's bound first: it rules most pairs out
            // (an edge of the graph among them only raises the
            // reference, which stays an upper bound).
            match s.pair_bound(j, g) {
                None => continue,
                Some(pb) if pb.saturating_sub(p[g as usize]) <= uj => {
                    ru_new = ru_new.max(pb.saturating_sub(p[g as usize]));
                    continue;
                }
                Some(_) => {}
            }
            if row_edges.binary_search_by_key(&g, |e| e.gpu).is_ok() {
                continue;
            }
            *scored += 1;
            if let Some(w) = s.weight(j, g) {
                let v = w - p[g as usize];
                if v > uj {
                    sc.hits.push((v, g));
                } else {
                    ru_new = ru_new.max(v);
                }
            }
        }
        ru_new
    }
}

/// Merges sorted, disjoint edge lists.
fn merge(a: Vec<Edge>, b: &[Edge]) -> Vec<Edge> {
    if b.is_empty() {
        return a;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut k) = (0, 0);
    while i < a.len() && k < b.len() {
        if (a[i].job, a[i].gpu) <= (b[k].job, b[k].gpu) {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[k]);
            k += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[k..]);
    out
}

fn start_of(sol: &Solution, jobs: usize) -> (Vec<u32>, Vec<i64>) {
    (sol.job_gpu(jobs), sol.duals.gpu.clone())
}

/// Prices and re-solves warm until a pass finds nothing: then every pair
/// outside the graph has `w ≤ ru + rp ≤ u + p` and the solution's
/// certificate holds on the full graph.
fn converge<S: Scores>(
    s: &S,
    mut edges: Vec<Edge>,
    mut sol: Solution,
    r: &mut Reference,
    opts: &ExactOptions,
    stats: &mut PricingStats,
) -> (Vec<Edge>, Solution, bool) {
    loop {
        let t = std::time::Instant::now();
        let before = (stats.rows, stats.cols, stats.scored);
        let add = price(s, &edges, &sol, r, opts, stats);
        tracing::debug!(
            rows = stats.rows - before.0,
            cols = stats.cols - before.1,
            scored = stats.scored - before.2,
            added = add.len(),
            ms = t.elapsed().as_secs_f64() * 1e3,
            searches = sol.stats.searches,
            reverse = sol.stats.reverse_searches,
            "pricing pass"
        );
        if add.is_empty() {
            return (edges, sol, true);
        }
        edges = merge(edges, &add);
        let (job_gpu, prices) = start_of(&sol, s.jobs());
        let t = std::time::Instant::now();
        sol = solve_warm_sorted(
            s.jobs(),
            s.gpus(),
            &edges,
            &Start {
                job_gpu: &job_gpu,
                price: &prices,
            },
        );
        tracing::debug!(
            edges = edges.len(),
            ms = t.elapsed().as_secs_f64() * 1e3,
            searches = sol.stats.searches,
            settled = sol.stats.settled_columns,
            arr = sol.stats.row_reduction_steps,
            "warm solve"
        );
        if opts
            .deadline
            .is_some_and(|d| std::time::Instant::now() >= d)
        {
            return (edges, sol, false);
        }
    }
}

/// The maximum-weight matching of the full graph of `s`, starting from the
/// candidate graph `initial` (any feasible pairs with their weights).
pub fn solve_exact<S: Scores>(
    s: &S,
    initial: &[Edge],
    opts: &ExactOptions,
) -> Result<Exact, InputError> {
    Incremental::cold(s, initial, opts).map(Incremental::into_exact)
}

/// A round cache: the last round's certified state (see the module docs).
#[derive(Debug, Clone)]
pub struct Incremental {
    exact: Exact,
    reference: Reference,
    jobs: usize,
    gpus: usize,
}

impl Incremental {
    /// A cold round ([`solve_exact`]) that later rounds start from.
    pub fn cold<S: Scores>(
        s: &S,
        initial: &[Edge],
        opts: &ExactOptions,
    ) -> Result<Incremental, InputError> {
        let solve_opts = SolveOptions {
            threads: opts.threads.max(1),
            ..SolveOptions::default()
        };
        let sol = solve_with(s.jobs(), s.gpus(), initial, &solve_opts)?;
        let mut edges = initial.to_vec();
        edges.sort_unstable_by_key(|e| (e.job, e.gpu));
        Ok(Incremental::from_solution(s, edges, sol, opts))
    }

    /// Pricing from `sol`, a solution exact on `edges` (sorted by (job,
    /// GPU), unique) with its duals: the caller's own solve, cold or warm.
    pub fn from_solution<S: Scores>(
        s: &S,
        edges: Vec<Edge>,
        sol: Solution,
        opts: &ExactOptions,
    ) -> Incremental {
        let mut reference = Reference {
            ru: vec![i64::MAX; s.jobs()],
            rp: sol.duals.gpu.clone(),
        };
        let mut pricing = PricingStats::default();
        let (edges, solution, complete) =
            converge(s, edges, sol, &mut reference, opts, &mut pricing);
        Incremental {
            exact: Exact {
                solution,
                edges,
                pricing,
                complete,
            },
            reference,
            jobs: s.jobs(),
            gpus: s.gpus(),
        }
    }

    /// The round, kept no longer.
    pub fn into_exact(self) -> Exact {
        self.exact
    }

    /// The current round.
    pub fn exact(&self) -> &Exact {
        &self.exact
    }

    /// The next round after `changed_jobs` and `changed_gpus` (any pair
    /// touching one of them may have a new weight, or none); every other
    /// pair must weigh what it did. Same indices and sizes as before.
    pub fn update<S: Scores>(
        &mut self,
        s: &S,
        changed_jobs: &[u32],
        changed_gpus: &[u32],
        opts: &ExactOptions,
    ) -> &Exact {
        self.update_seeded(s, changed_jobs, changed_gpus, &[], opts)
    }

    /// [`Incremental::update`] with `seed`, candidate pairs of the changed
    /// jobs (sorted by (job, GPU), unique, at their current weights), in
    /// the graph before the warm solve: a changed job's row starts with its
    /// candidate list, as in a cold round, rather than with the few most
    /// violated pairs of each pricing pass (which, where many GPUs tie,
    /// every new job takes from the same few GPUs, pass after pass).
    pub fn update_seeded<S: Scores>(
        &mut self,
        s: &S,
        changed_jobs: &[u32],
        changed_gpus: &[u32],
        seed: &[Edge],
        opts: &ExactOptions,
    ) -> &Exact {
        assert_eq!(
            (s.jobs(), s.gpus()),
            (self.jobs, self.gpus),
            "an incremental round keeps the index space"
        );
        let mut cj = vec![false; self.jobs];
        let mut cg = vec![false; self.gpus];
        for &j in changed_jobs {
            cj[j as usize] = true;
            self.reference.ru[j as usize] = i64::MAX;
        }
        for &g in changed_gpus {
            cg[g as usize] = true;
            self.reference.rp[g as usize] = i64::MAX;
        }
        let mut edges = std::mem::take(&mut self.exact.edges);
        edges.retain(|e| !cj[e.job as usize] && !cg[e.gpu as usize]);
        debug_assert!(
            seed.iter().all(|e| cj[e.job as usize]),
            "seeds only on changed jobs"
        );
        let edges = merge(edges, seed);
        let mut job_gpu = self.exact.solution.job_gpu(self.jobs);
        for (j, g) in job_gpu.iter_mut().enumerate() {
            if cj[j] || (*g as usize) < self.gpus && cg[*g as usize] {
                *g = u32::MAX;
            }
        }
        let mut prices = std::mem::take(&mut self.exact.solution.duals.gpu);
        for (g, p) in prices.iter_mut().enumerate() {
            if cg[g] {
                *p = 0;
            }
        }
        let sol = solve_warm_sorted(
            self.jobs,
            self.gpus,
            &edges,
            &Start {
                job_gpu: &job_gpu,
                price: &prices,
            },
        );
        let mut pricing = PricingStats::default();
        let (edges, solution, complete) =
            converge(s, edges, sol, &mut self.reference, opts, &mut pricing);
        self.exact = Exact {
            solution,
            edges,
            pricing,
            complete,
        };
        &self.exact
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prune::prune_scored;
    use crate::reference::dense_kuhn_munkres;
    use crate::solver::verify_certificate;
    use crate::synth::{Cluster, WeightMode};

    fn check_exact<S: Scores>(s: &S, all: &[Edge], initial: &[Edge], opts: &ExactOptions) -> Exact {
        let exact = solve_exact(s, initial, opts).expect("valid edges");
        let dense = dense_kuhn_munkres(s.jobs(), s.gpus(), all);
        assert_eq!(exact.solution.matching.objective, dense.objective);
        // The certificate holds over every feasible pair.
        verify_certificate(
            s.jobs(),
            s.gpus(),
            all,
            &exact.solution.matching,
            &exact.solution.duals,
        )
        .expect("certificate on the full graph");
        exact
    }

    /// A deadline stops pricing after its pass: the result is exact on
    /// its (larger) graph and says it is not yet exact on every pair.
    #[test]
    fn a_spent_deadline_keeps_the_result_exact_on_its_graph() {
        let c = Cluster::generate(300, 200, 5, WeightMode::Structured);
        let initial = c.top_k_candidates(2, 1);
        let past = ExactOptions {
            deadline: Some(std::time::Instant::now()),
            ..ExactOptions::default()
        };
        let cut = solve_exact(&c, &initial, &past).unwrap();
        assert!(!cut.complete);
        assert_eq!(cut.pricing.passes, 1);
        assert!(
            cut.edges.len() > initial.len(),
            "the pass's pairs were added"
        );
        verify_certificate(
            200,
            300,
            &cut.edges,
            &cut.solution.matching,
            &cut.solution.duals,
        )
        .expect("exact on its graph");
        let full = solve_exact(&c, &initial, &ExactOptions::default()).unwrap();
        assert!(full.complete);
        assert!(cut.solution.matching.objective < full.solution.matching.objective);
    }

    #[test]
    fn pricing_reaches_the_dense_optimum_of_the_full_graph() {
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            for (gpus, jobs, seed) in [(50, 30, 1), (80, 120, 2), (300, 200, 3), (150, 150, 4)] {
                let c = Cluster::generate(gpus, jobs, seed, mode);
                let all = c.all_edges();
                for (k, per_job, threads) in [(2, 1, 1), (4, 8, 2), (16, 3, 2)] {
                    let opts = ExactOptions {
                        per_job,
                        threads,
                        deadline: None,
                    };
                    // Bounded pricing (the cluster's groups) and plain scans.
                    check_exact(&c, &all, &c.candidates(k, threads), &opts);
                    let plain = FnScores {
                        jobs,
                        gpus,
                        score: |j, g| c.weight(j, g),
                    };
                    check_exact(&plain, &all, &c.top_k_candidates(k, threads), &opts);
                }
                // From nothing at all: pricing builds the graph.
                check_exact(&c, &all, &[], &ExactOptions::default());
            }
        }
    }

    /// Every job ranks the same 4 GPUs first; its best partner in the
    /// optimum is a private GPU outside its top 4 (and outside the top 4 of
    /// every other job).
    /// A larger instance than the table above, the bench's shape (more
    /// GPUs than jobs, every job placeable), bounded pricing from the
    /// production graph; dense Kuhn–Munkres checks it.
    #[test]
    fn pricing_matches_dense_kuhn_munkres_on_a_larger_structured_cluster() {
        let (gpus, jobs) = (900, 600);
        let c = Cluster::generate(gpus, jobs, 21, WeightMode::Structured);
        let all = c.all_edges();
        let exact = check_exact(&c, &all, &c.candidates(8, 2), &ExactOptions::default());
        assert!(
            exact.pricing.added > 0,
            "the candidate graph alone was optimal"
        );
    }

    #[test]
    fn planted_optimum_outside_every_top_k_is_found() {
        let (jobs, k) = (40usize, 4usize);
        let gpus = k + jobs + 20;
        let score = |j: u32, g: u32| -> Option<i64> {
            let (j, g) = (j as i64, g as i64);
            Some(if g < k as i64 {
                1000 - j - g
            } else if g == k as i64 + j {
                900
            } else {
                1 + (j * 7 + g * 13) % 50
            })
        };
        let s = FnScores { jobs, gpus, score };
        let mut all = Vec::new();
        for j in 0..jobs as u32 {
            for g in 0..gpus as u32 {
                all.push(Edge {
                    job: j,
                    gpu: g,
                    weight: score(j, g).unwrap(),
                });
            }
        }
        let top = prune_scored(jobs, gpus, k, 1, score);
        let pruned = solve_with(jobs, gpus, &top, &SolveOptions::default()).unwrap();
        assert_eq!(pruned.matching.pairs.len(), k, "top-k alone places k jobs");
        let exact = check_exact(&s, &all, &top, &ExactOptions::default());
        let outside = exact
            .solution
            .matching
            .pairs
            .iter()
            .filter(|&&(j, g)| !top.iter().any(|e| (e.job, e.gpu) == (j, g)))
            .count();
        assert_eq!(outside, jobs - k);
        assert_eq!(
            exact.solution.matching.objective,
            900 * 36 + 1000 * 4 - 6 - 6
        );
    }

    /// A warm start is only a hint: any assignment and prices (stale,
    /// conflicting, out of range) give the cold optimum with a valid
    /// certificate.
    #[test]
    fn any_warm_start_gives_the_cold_optimum() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for seed in 0..20 {
            let mode = if seed % 2 == 0 {
                WeightMode::Structured
            } else {
                WeightMode::Uniform
            };
            let (gpus, jobs) = (rng.gen_range(5..60), rng.gen_range(5..60));
            let c = Cluster::generate(gpus, jobs, seed, mode);
            let mut edges = c.candidates(3, 1);
            edges.sort_unstable_by_key(|e| (e.job, e.gpu));
            let cold = solve_with(jobs, gpus, &edges, &SolveOptions::default()).unwrap();
            let job_gpu: Vec<u32> = (0..jobs)
                .map(|_| match rng.gen_range(0..3) {
                    0 => u32::MAX,
                    1 => rng.gen_range(0..gpus as u32 + 3),
                    _ => rng.gen_range(0..3),
                })
                .collect();
            let price: Vec<i64> = (0..rng.gen_range(0..gpus + 3))
                .map(|_| rng.gen_range(-1000..2_000_000))
                .collect();
            let warm = solve_warm_sorted(
                jobs,
                gpus,
                &edges,
                &Start {
                    job_gpu: &job_gpu,
                    price: &price,
                },
            );
            assert_eq!(warm.matching.objective, cold.matching.objective);
            verify_certificate(jobs, gpus, &edges, &warm.matching, &warm.duals)
                .expect("certificate from a garbage start");
        }
    }

    fn cold(c: &Cluster, opts: &ExactOptions) -> Exact {
        solve_exact(c, &c.candidates(4, 1), opts).unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// After any sequence of job replacements and GPU health flips, the
        /// incremental round has the cold round's optimum and a certificate
        /// on the full graph, whatever the pass size and thread count.
        #[test]
        fn incremental_round_equals_cold_round(
            gpus in 10usize..160,
            jobs in 5usize..120,
            seed in 0u64..1000,
            uniform in proptest::bool::ANY,
            per_job in proptest::sample::select(vec![1usize, 2, 8]),
            threads in 1usize..=2,
            steps in proptest::collection::vec(
                (proptest::collection::vec(0usize..1000, 0..6),
                 proptest::collection::vec(0usize..1000, 0..6)),
                1..5),
        ) {
            use rand::SeedableRng;
            let mode = if uniform { WeightMode::Uniform } else { WeightMode::Structured };
            let mut c = Cluster::generate(gpus, jobs, seed, mode);
            // Pricing runs rows on worker threads from 64 rows on.
            let opts = ExactOptions {
                        per_job,
                        threads,
                        deadline: None,
                    };
            let mut inc = Incremental::cold(&c, &c.candidates(4, threads), &opts).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            for (js, gs) in steps {
                let js: Vec<u32> = js.iter().map(|&j| (j % jobs) as u32).collect();
                let gs: Vec<u32> = gs.iter().map(|&g| (g % gpus) as u32).collect();
                for &j in &js {
                    c.replace_job(j as usize, &mut rng);
                }
                let mut flipped = gs.clone();
                flipped.sort_unstable();
                flipped.dedup();
                for &g in &flipped {
                    c.toggle_health(g as usize);
                }
                c.regroup();
                let got = inc.update(&c, &js, &gs, &opts).clone();
                let want = cold(&c, &opts);
                proptest::prop_assert_eq!(got.solution.matching.objective,
                    want.solution.matching.objective);
                let all = c.all_edges();
                let cert = verify_certificate(jobs, gpus, &all, &got.solution.matching,
                    &got.solution.duals);
                proptest::prop_assert!(cert.is_ok(), "{:?}", cert);
            }
        }
    }
}
