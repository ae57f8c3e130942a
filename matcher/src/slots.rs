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
use crate::solver::Edge;

/// Columns of GPUs with several slots: GPU g's copies are the columns
/// `start[g]..start[g + 1]`, ordered by worth (copy s: the job as one of
/// s + 1 new offline jobs there, [`muxflow::policy::offline_share`]).
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
