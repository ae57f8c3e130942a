//! Offline slots as columns of the matching (issue 15: `[policy]
//! offline_per_gpu` = N). A GPU with c free slots is c columns, its copies,
//! so the capacitated assignment of the 1-GPU jobs stays an assignment,
//! which the solver solves exactly with its certificate, unchanged.
//!
//! The fact that shapes it: copies of one GPU score alike (the job beside
//! the same online job, on a smaller part of the same budget), so scoring
//! and pruning every copy would multiply the round's hot path by N for
//! nothing. [`slot_candidates`] prunes on GPUs, each scored at its first
//! usable copy, and then gives every candidate GPU's usable copies as
//! edges: scoring cost as with one slot, plus the candidates' copies.

use crate::prune::spread_scored;
use crate::solver::{solve_with, Edge, SolveOptions};
use crate::weights::quantize;

/// Columns of GPUs with several slots: GPU g's copies are the columns
/// `start[g]..start[g + 1]`, ordered by worth (copy s: the job as one of
/// s + 1 new offline jobs there, [`muxflow::policy::share::offline_share`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotColumns {
    pub start: Vec<u32>,
}

impl SlotColumns {
    /// `free[g]` columns for GPU g.
    pub fn new(free: impl IntoIterator<Item = u32>) -> SlotColumns {
        let mut start = vec![0u32];
        for c in free {
            start.push(start.last().copied().unwrap_or(0) + c);
        }
        SlotColumns { start }
    }
    pub fn gpus(&self) -> usize {
        self.start.len().saturating_sub(1)
    }
    pub fn columns(&self) -> usize {
        self.start.last().copied().unwrap_or(0) as usize
    }
    /// Each column's GPU.
    pub fn gpu_of(&self) -> Vec<u32> {
        (0..self.gpus() as u32)
            .flat_map(|g| {
                let n = self.start[g as usize + 1] - self.start[g as usize];
                std::iter::repeat_n(g, n as usize)
            })
            .collect()
    }
}

/// The candidate graph on columns: [`spread_scored`] on GPUs, a GPU scored
/// at its first column that `score` accepts (a taken column scores
/// `None`), then every accepted column of each chosen GPU. Sorted by (job,
/// column), as the solver's warm start wants.
pub fn slot_candidates<F>(
    jobs: usize,
    cols: &SlotColumns,
    k: usize,
    threads: usize,
    score: F,
) -> Vec<Edge>
where
    F: Fn(u32, u32) -> Option<i64> + Sync,
{
    let range = |g: u32| cols.start[g as usize]..cols.start[g as usize + 1];
    let first = |j: u32, g: u32| range(g).find_map(|c| score(j, c));
    let by_gpu = spread_scored(jobs, cols.gpus(), k, threads, first);
    let mut out = Vec::with_capacity(by_gpu.len());
    for e in by_gpu {
        for c in range(e.gpu) {
            if let Some(weight) = score(e.job, c) {
                out.push(Edge {
                    job: e.job,
                    gpu: c,
                    weight,
                });
            }
        }
    }
    out
}

/// The split steps of a round with sized slots (module docs of
/// [`crate::round`]): for n = 2 ..= `per_gpu`, every column not `taken`
/// whose free slots (`free`) went to n − 1 jobs of this round (`members`,
/// in order) and that has at least n free slots may take one more of the
/// `waiting` jobs. Each step is an exact assignment of the waiting jobs to
/// those columns, weighted by the new job's value as the n-th of n jobs
/// there less what the n − 1 there lose (their value as i-th of n − 1
/// less as i-th of n); only positive weights are edges, so a split never
/// lowers the total. `terms(c, i, n)`: column c's terms for the i-th of n
/// new jobs there; `value(j, c, terms)`: job j's weight with them (`None`:
/// not a candidate; a job already there that would not fit its smaller
/// part makes the column's loss unknown, so it takes no one). Updates
/// `members` and `waiting`; returns the number of edges scored.
#[allow(clippy::too_many_arguments)]
pub fn split_rounds<T, Tf, Vf>(
    free: &[u32],
    per_gpu: u32,
    taken: &[bool],
    members: &mut [Vec<u32>],
    waiting: &mut [bool],
    k: usize,
    threads: usize,
    terms: Tf,
    value: Vf,
) -> usize
where
    T: Sync,
    Tf: Fn(usize, usize, u32) -> T,
    Vf: Fn(u32, usize, &T) -> Option<f64> + Sync,
{
    let mut scored = 0;
    for n in 2..=per_gpu {
        let grow: Vec<usize> = (0..members.len())
            .filter(|&c| !taken[c] && members[c].len() as u32 == n - 1 && free[c] >= n)
            .collect();
        let pool: Vec<u32> = (0..waiting.len() as u32)
            .filter(|&j| waiting[j as usize])
            .collect();
        if grow.is_empty() || pool.is_empty() {
            break;
        }
        let loss: Vec<Option<f64>> = grow
            .iter()
            .map(|&c| {
                members[c].iter().enumerate().try_fold(0.0, |sum, (i, &a)| {
                    let before = value(a, c, &terms(c, i, n - 1))?;
                    let after = value(a, c, &terms(c, i, n))?;
                    Some(sum + before - after)
                })
            })
            .collect();
        let joining: Vec<T> = grow.iter().map(|&c| terms(c, n as usize - 1, n)).collect();
        let gain = |p: u32, k: u32| -> Option<i64> {
            let (j, c) = (pool[p as usize], grow[k as usize]);
            quantize(value(j, c, &joining[k as usize])? - loss[k as usize]?)
        };
        let edges = slot_candidates(
            pool.len(),
            &SlotColumns::new(std::iter::repeat_n(1, grow.len())),
            k,
            threads,
            gain,
        );
        if edges.is_empty() {
            break;
        }
        scored += edges.len();
        let sol = solve_with(pool.len(), grow.len(), &edges, &SolveOptions::default())
            .expect("split edges are in range, positive and unique");
        for &(p, k) in &sol.matching.pairs {
            let (j, c) = (pool[p as usize], grow[k as usize]);
            waiting[j as usize] = false;
            members[c].push(j);
        }
    }
    scored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_candidates_cover_each_chosen_gpus_copies() {
        let cols = SlotColumns::new([2, 0, 1, 3]);
        assert_eq!(cols.start, [0, 2, 2, 3, 6]);
        assert_eq!((cols.gpus(), cols.columns()), (4, 6));
        assert_eq!(cols.gpu_of(), [0, 0, 2, 3, 3, 3]);
        // Copy s worth 1/(s+1); column 3 taken; the job fits GPU 3 only.
        let copy = |c: u32| c - cols.start[cols.gpu_of()[c as usize] as usize];
        let (gpu_of, taken) = (cols.gpu_of(), 3);
        let score = |_: u32, c: u32| {
            (gpu_of[c as usize] == 3 && c != taken).then(|| 600 / i64::from(copy(c) + 1))
        };
        let edges = slot_candidates(1, &cols, 4, 1, score);
        let got: Vec<(u32, i64)> = edges.iter().map(|e| (e.gpu, e.weight)).collect();
        assert_eq!(got, [(4, 300), (5, 200)]);
    }
}
