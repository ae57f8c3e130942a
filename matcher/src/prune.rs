//! Candidate pruning (config `matcher.candidates_per_job` = `k`). Part of
//! the production path; the solver is exact on the pruned graph.
//!
//! * [`prune_scored`]: each job's best `k` GPUs. Alone it fails when every
//!   job ranks GPUs alike (weights ≈ job factor × GPU factor, the usual shape
//!   of throughput predictions): all jobs keep the same few GPUs and the
//!   exact optimum of that graph places a few hundred of 10 000 jobs.
//! * [`spread_scored`], the production rule: the union of each job's best
//!   `k` and a *capacity-spread* list. Jobs are taken strongest first (by
//!   their best weight); each takes its best `k` among GPUs that fewer than
//!   `k` earlier jobs have taken, so strong jobs list the best GPUs and
//!   weaker ones the next best — the assortative shape of the optimum of
//!   such weights. A GPU in at most `k` lists is what keeps Hall's condition:
//!   when all jobs rank GPUs exactly alike, each run of `k` consecutive jobs
//!   shares the same `k` GPUs, and all of them can be placed. The graph then has room for every job that the structure
//!   allows, and contains the plain top-k graph, so its optimum is never
//!   below the old rule's. The bench prints an upper bound on what pruning
//!   costs against the unpruned graph.
//!
//! [`spread_grouped`] builds the same graph from a [`Scores`] with groups
//! and bounds, visiting each job's groups by decreasing bound and scoring
//! only the GPUs whose bound can still enter a list (about 4x faster on the
//! bench's 18,000 × 10,000).
//!
//! Order: higher weight first, on equal weight the lower GPU index, so the
//! kept set is a function of the scores alone (and of `threads` for the
//! spread list, which splits the capacity between workers).

use crate::exact::Scores;
use crate::solver::Edge;

/// The best `k` of a stream of (weight, gpu) offers.
pub(crate) struct TopK {
    k: usize,
    pub(crate) items: Vec<(i64, u32)>,
    /// Index of the worst kept item once full.
    worst: usize,
}

/// `a` ranks above `b`: higher weight, then lower GPU.
fn better(a: (i64, u32), b: (i64, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

impl TopK {
    pub(crate) fn new(k: usize) -> Self {
        TopK {
            k,
            items: Vec::with_capacity(k),
            worst: 0,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.items.clear();
        self.worst = 0;
    }

    /// Cheap pre-check for the hot loop: could weight `w` enter at all?
    /// Strict: every caller offers GPUs in increasing index, and on equal
    /// weight the lower index ranks higher, so a tie never enters (the
    /// structured weights cap at 1.0 and tie often).
    #[inline]
    pub(crate) fn admits(&self, w: i64) -> bool {
        self.items.len() < self.k || w > self.items[self.worst].0
    }

    pub(crate) fn offer(&mut self, item: (i64, u32)) {
        if self.k == 0 {
            return;
        }
        if self.items.len() < self.k {
            self.items.push(item);
            if self.items.len() == self.k {
                self.find_worst();
            }
        } else if better(item, self.items[self.worst]) {
            self.items[self.worst] = item;
            self.find_worst();
        }
    }

    fn find_worst(&mut self) {
        let mut worst = 0;
        for i in 1..self.items.len() {
            if better(self.items[worst], self.items[i]) {
                worst = i;
            }
        }
        self.worst = worst;
    }

    fn drain_into(&mut self, job: u32, out: &mut Vec<Edge>) {
        self.items.sort_unstable_by_key(|&(_, g)| g);
        out.extend(
            self.items
                .iter()
                .map(|&(weight, gpu)| Edge { job, gpu, weight }),
        );
        self.clear();
    }
}

/// Keeps each job's best `k` edges of an explicit edge list. Output sorted by
/// (job, GPU).
pub fn prune_candidates(edges: &[Edge], k: usize) -> Vec<Edge> {
    let mut sorted = edges.to_vec();
    sorted.sort_unstable_by_key(|e| (e.job, e.gpu));
    let mut out = Vec::with_capacity(sorted.len().min(k * 1024));
    let mut top = TopK::new(k);
    let mut i = 0;
    while i < sorted.len() {
        let job = sorted[i].job;
        while i < sorted.len() && sorted[i].job == job {
            top.offer((sorted[i].weight, sorted[i].gpu));
            i += 1;
        }
        top.drain_into(job, &mut out);
    }
    out
}

/// Scores every (job, GPU) pair with `score` (`None` = infeasible) and keeps
/// each job's best `k`, on `threads` threads (jobs split in contiguous
/// blocks). Output sorted by (job, GPU). This is the path a predictor feeds:
/// the dense score matrix is never stored, memory is O(jobs × k).
pub fn prune_scored<F>(jobs: usize, gpus: usize, k: usize, threads: usize, score: F) -> Vec<Edge>
where
    F: Fn(u32, u32) -> Option<i64> + Sync,
{
    let scan = |lo: usize, hi: usize| {
        let mut out = Vec::with_capacity((hi - lo) * k);
        let mut top = TopK::new(k);
        for j in lo..hi {
            for g in 0..gpus as u32 {
                if let Some(w) = score(j as u32, g) {
                    if top.admits(w) {
                        top.offer((w, g));
                    }
                }
            }
            top.drain_into(j as u32, &mut out);
        }
        out
    };
    let threads = threads.clamp(1, jobs.max(1));
    if threads == 1 {
        return scan(0, jobs);
    }
    crate::workers::blocks(jobs, threads, |r| scan(r.start, r.end))
        .into_iter()
        .flatten()
        .collect()
}

/// GPUs sampled to order jobs by strength before the full scan.
const ORDER_SAMPLE: usize = 2048;

/// The production candidate graph: each job's best `k` GPUs ∪ the
/// capacity-spread lists (see the module docs). Output sorted by (job, GPU),
/// no duplicates. One full scan scores every pair once and feeds both lists;
/// the strength order comes from a strided sample of at most
/// `ORDER_SAMPLE` GPUs first (the order only shapes the spread lists, so a
/// sample is enough). Memory O(jobs × k + gpus × threads).
pub fn spread_scored<F>(jobs: usize, gpus: usize, k: usize, threads: usize, score: F) -> Vec<Edge>
where
    F: Fn(u32, u32) -> Option<i64> + Sync,
{
    let stride = gpus.div_ceil(ORDER_SAMPLE).max(1);
    let strength = |j: u32| {
        (0..gpus)
            .step_by(stride)
            .filter_map(|g| score(j, g as u32))
            .max()
            .unwrap_or(0)
    };
    let scan = |j: u32, lists: &mut SpreadLists| {
        for g in 0..gpus as u32 {
            let Some(w) = score(j, g) else { continue };
            if lists.top.admits(w) {
                lists.top.offer((w, g));
            }
            if lists.cap[g as usize] > 0 && lists.spread.admits(w) {
                lists.spread.offer((w, g));
            }
        }
    };
    spread_with(jobs, gpus, k, threads, strength, scan)
}

/// [`spread_scored`] on a [`Scores`] with groups and bounds: the same
/// graph (a test checks it), found without scoring every pair. Each job
/// visits its groups by decreasing bound and stops at the first whose
/// bound cannot beat the `k`-th best of either list; within a group the
/// pair bound skips GPUs before they are scored. Without groups it is
/// [`spread_scored`].
pub fn spread_grouped<S: Scores>(s: &S, k: usize, threads: usize) -> Vec<Edge> {
    let (jobs, gpus) = (s.jobs(), s.gpus());
    let Some((group_of, n_groups)) = s.groups() else {
        return spread_scored(jobs, gpus, k, threads, |j, g| s.weight(j, g));
    };
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); n_groups];
    for (g, &c) in group_of.iter().enumerate() {
        if (c as usize) < n_groups {
            members[c as usize].push(g as u32);
        }
    }
    let stride = gpus.div_ceil(ORDER_SAMPLE).max(1);
    let strength = |j: u32| {
        let mut best = 0;
        for g in (0..gpus as u32).step_by(stride) {
            // A GPU outside every group takes no job (Scores::groups).
            if group_of[g as usize] as usize >= n_groups
                || s.pair_bound(j, g).is_none_or(|b| b <= best)
            {
                continue;
            }
            if let Some(w) = s.weight(j, g) {
                best = best.max(w);
            }
        }
        best
    };
    // Could a pair bounded by `b` enter the list? Ties may (lower index).
    let may_enter = |top: &TopK, b: i64| top.items.len() < top.k || b >= top.items[top.worst].0;
    let scan = |j: u32, lists: &mut SpreadLists| {
        let mut order: Vec<(i64, u32)> = (0..n_groups as u32)
            .filter_map(|c| Some((s.group_bound(j, c)?, c)))
            .filter(|&(_, c)| !members[c as usize].is_empty())
            .collect();
        order.sort_unstable_by_key(|&(b, c)| (std::cmp::Reverse(b), c));
        for (b, c) in order {
            let want_top = may_enter(&lists.top, b);
            let want_spread = may_enter(&lists.spread, b);
            if !want_top && !want_spread {
                break;
            }
            for &g in &members[c as usize] {
                let Some(pb) = s.pair_bound(j, g) else {
                    continue;
                };
                let to_top = want_top && may_enter(&lists.top, pb);
                let to_spread =
                    want_spread && lists.cap[g as usize] > 0 && may_enter(&lists.spread, pb);
                if !(to_top || to_spread) {
                    continue;
                }
                let Some(w) = s.weight(j, g) else { continue };
                // GPUs come out of index order here: offer() breaks ties.
                if to_top {
                    lists.top.offer((w, g));
                }
                if to_spread {
                    lists.spread.offer((w, g));
                }
            }
        }
    };
    spread_with(jobs, gpus, k, threads, strength, scan)
}

/// One worker's lists for the job at hand and its share of the GPUs'
/// spread capacity.
struct SpreadLists {
    top: TopK,
    spread: TopK,
    cap: Vec<u16>,
}

/// The order and the workers of [`spread_scored`]: `strength(j)` orders
/// the jobs (strongest first), `scan(j, lists)` offers job `j`'s pairs to
/// both lists (the spread list only GPUs with `cap > 0`).
fn spread_with<St, Sc>(
    jobs: usize,
    gpus: usize,
    k: usize,
    threads: usize,
    strength: St,
    scan: Sc,
) -> Vec<Edge>
where
    St: Fn(u32) -> i64 + Sync,
    Sc: Fn(u32, &mut SpreadLists) + Sync,
{
    if jobs == 0 || gpus == 0 || k == 0 {
        return Vec::new();
    }
    let threads = threads.clamp(1, jobs);
    let best: Vec<i64> = crate::workers::blocks(jobs, threads, |r| {
        r.map(|j| strength(j as u32)).collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect();
    // Strongest job first: its sampled best weight, then its index.
    let mut order: Vec<u32> = (0..jobs as u32).collect();
    order.sort_unstable_by_key(|&j| (std::cmp::Reverse(best[j as usize]), j));
    // Workers take every `threads`-th job of the order and share each GPU's
    // capacity (k) equally, so the lists interleave as in one sequential pass.
    let per_worker = k.div_ceil(threads).min(u16::MAX as usize) as u16;
    let work = |t: usize| {
        let mut lists = SpreadLists {
            top: TopK::new(k),
            spread: TopK::new(k),
            cap: vec![per_worker; gpus],
        };
        let mut out = Vec::with_capacity(2 * k * (jobs / threads + 1));
        for &j in order.iter().skip(t).step_by(threads) {
            scan(j, &mut lists);
            for &(_, g) in &lists.spread.items {
                lists.cap[g as usize] -= 1;
            }
            lists.top.drain_into(j, &mut out);
            lists.spread.drain_into(j, &mut out);
        }
        out
    };
    let mut all: Vec<Edge> = crate::workers::each(threads, work)
        .into_iter()
        .flatten()
        .collect();
    all.sort_unstable_by_key(|e| (e.job, e.gpu));
    all.dedup_by_key(|e| (e.job, e.gpu));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(job: u32, gpu: u32, weight: i64) -> Edge {
        Edge { job, gpu, weight }
    }

    #[test]
    fn keeps_best_k_with_ties_to_lower_gpu() {
        let edges = vec![
            e(0, 5, 10),
            e(0, 1, 30),
            e(0, 3, 10),
            e(0, 2, 20),
            e(1, 0, 7),
            e(0, 4, 10),
        ];
        let kept = prune_candidates(&edges, 3);
        assert_eq!(
            kept,
            vec![e(0, 1, 30), e(0, 2, 20), e(0, 3, 10), e(1, 0, 7)]
        );
    }

    #[test]
    fn spread_places_every_job_when_all_rank_gpus_alike() {
        // Rank-one weights: every job's top-k is GPUs 0..k.
        let (jobs, gpus, k) = (60, 90, 4);
        let score = |j: u32, g: u32| Some(((200 - j as i64) * (1000 - g as i64)).max(1));
        for threads in [1, 2] {
            let top = prune_scored(jobs, gpus, k, threads, score);
            let spread = spread_scored(jobs, gpus, k, threads, score);
            let placed =
                |edges: &[Edge]| crate::solver::solve(jobs, gpus, edges).unwrap().pairs.len();
            assert_eq!(placed(&top), k);
            assert_eq!(placed(&spread), jobs);
            // It contains the plain top-k graph, sorted and without duplicates.
            assert!(top.iter().all(|e| spread.contains(e)));
            assert!(spread
                .windows(2)
                .all(|w| (w[0].job, w[0].gpu) < (w[1].job, w[1].gpu)));
        }
    }

    #[test]
    fn scored_matches_explicit_on_any_thread_count() {
        let score = |j: u32, g: u32| {
            let h = (j as i64 * 7919 + g as i64 * 104_729) % 97;
            (h % 5 != 0).then_some(h / 3 + 1)
        };
        let mut all = Vec::new();
        for j in 0..37 {
            for g in 0..53 {
                if let Some(w) = score(j, g) {
                    all.push(e(j, g, w));
                }
            }
        }
        let expect = prune_candidates(&all, 6);
        for threads in [1, 2, 3] {
            assert_eq!(prune_scored(37, 53, 6, threads, score), expect);
        }
    }
}
