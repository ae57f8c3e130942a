//! The gangs phase: k-GPU jobs first, on k GPUs of one node, by the
//! documented greedy ([`crate::gang`]) priced by the 1-GPU jobs' own
//! optimum; then the exact matching of the 1-GPU jobs on the GPUs they
//! left. A gang member takes all free slots of its GPU, as a 1-GPU job
//! does (its part of each GPU as large as it can be; no split steps).

use super::{Predictor, Round};
use crate::gang::{place_gangs, Columns, GangChoice};
use crate::solver::{solve_warm_sorted, Edge, Start};

/// The gangs' choices, then the 1-GPU jobs' graph, matching and whether
/// it is exact over every pair.
type GangsFirst = (Vec<Option<GangChoice>>, Vec<Edge>, Vec<(u32, u32)>, bool);

impl<P: Predictor> Round<'_, P> {
    /// The k-GPU jobs: (round index, k).
    pub(super) fn gangs(&self) -> Vec<(u32, u32)> {
        self.jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| j.gpus > 1)
            .map(|(i, j)| (i as u32, j.gpus))
            .collect()
    }

    /// Each column's node, as a number (only gangs read nodes).
    fn node_ids(&self) -> Vec<u32> {
        let mut ids: std::collections::HashMap<&str, u32> = Default::default();
        (0..self.cols())
            .map(|c| {
                let n = ids.len() as u32;
                *ids.entry(self.gpu_of(c).node.as_str()).or_insert(n)
            })
            .collect()
    }

    /// Places `gangs` (marking their columns `taken`), then matches the
    /// 1-GPU jobs on the columns left.
    pub(super) fn gangs_first(&self, gangs: &[(u32, u32)], taken: &mut [bool]) -> GangsFirst {
        let edges = self.candidates();
        // Each slot's price: its dual in the 1-GPU jobs' own optimum.
        let priced = self.cold(&edges);
        let chosen = place_gangs(
            gangs,
            &Columns {
                node_of: &self.node_ids(),
                gpu_of: &self.slot_gpu,
            },
            &priced.duals.gpu,
            taken,
            &|j, c| self.score(j, c),
        );
        // A fresh candidate graph on the slots left (the first one's lists
        // lean on the slots the gangs took: filtering it lost 12% of the
        // 1-GPU total on the bench), solved from the prices' matching: only
        // what the gangs took is searched again (exact on that graph all
        // the same, with its certificate).
        let taken = &*taken;
        let left = |j: u32, c: u32| (!taken[c as usize]).then(|| self.alone(j, c)).flatten();
        let edges = self.candidates_by(left);
        let sol = solve_warm_sorted(
            self.jobs.len(),
            self.cols(),
            &edges,
            &Start {
                job_gpu: &priced.job_gpu(self.jobs.len()),
                price: &priced.duals.gpu,
            },
        );
        let (edges, sol, full) = self.price_out(edges, sol, &left);
        (chosen, edges, sol.matching.pairs, full)
    }
}
