//! The exact-matching phase: the 1-GPU jobs' maximum-weight matching on
//! the open GPUs. Cold: the pruned candidate graph
//! ([`crate::slots::slot_candidates`]) solved exactly, then priced out
//! ([`crate::exact`]) within `matcher.pricing_budget_ms`; incremental from
//! the last round ([`RoundCache::matching`]) where a cache is kept and no
//! gang waits; after the gangs ([`super::gangs`]) where some do.

use std::time::{Duration, Instant};

use super::{Predictor, Round};
use crate::exact::{ExactOptions, FnScores, Incremental};
use crate::gang::GangChoice;
use crate::round_cache::{CacheRound, RoundCache, Score};
use crate::slots::slot_candidates;
use crate::solver::{solve_with, Edge, Solution, SolveOptions};

/// What the matching decided.
pub(super) struct Matched {
    /// Per job, the GPUs its gang took (k-GPU jobs only).
    pub(super) gang_of: Vec<Option<GangChoice>>,
    /// The graph the 1-GPU jobs' matching is exact on, sorted by (job,
    /// column).
    pub(super) edges: Vec<Edge>,
    /// The matched (job, column) pairs.
    pub(super) pairs: Vec<(u32, u32)>,
    /// Exact over every feasible pair, not just the candidates.
    pub(super) full_graph: bool,
    /// Per job, its column and weight there.
    pub(super) assigned: Vec<Option<(u32, i64)>>,
    /// Per job, whether it had a candidate at all.
    pub(super) has_edge: Vec<bool>,
}

impl<P: Predictor> Round<'_, P> {
    /// The gangs, then the exact matching of the 1-GPU jobs on the GPUs
    /// they left (marked in `taken`).
    pub(super) fn exact_matching(
        &self,
        mut cache: Option<(&mut RoundCache, u64)>,
        taken: &mut [bool],
    ) -> Matched {
        let gangs = self.gangs();
        // An incremental round needs pricing (it has no candidate graph of its
        // own) and no gangs (their greedy reads the candidate graph's duals).
        let cached = cache
            .as_mut()
            .filter(|_| gangs.is_empty() && self.matcher.pricing_budget_ms > 0);
        let incremental = cached.is_some();
        let (gang_choice, edges, pairs, full_graph) = if let Some((cache, epoch)) = cached {
            let m = self.incremental(cache, *epoch);
            (Vec::new(), m.edges, m.pairs, m.full_graph)
        } else {
            if let Some((cache, _)) = cache {
                cache.forget();
            }
            if gangs.is_empty() {
                let edges = self.candidates();
                let sol = self.cold(&edges);
                let (edges, sol, full) = self.price_out(edges, sol, &|j, c| self.alone(j, c));
                (Vec::new(), edges, sol.matching.pairs, full)
            } else {
                self.gangs_first(&gangs, taken)
            }
        };
        let mut gang_of: Vec<Option<GangChoice>> = vec![None; self.jobs.len()];
        for (&(j, _), c) in gangs.iter().zip(gang_choice) {
            gang_of[j as usize] = c;
        }
        let assigned = assigned(self.jobs.len(), &edges, &pairs);
        let has_edge = self.has_edge(&edges, &assigned, incremental);
        Matched {
            gang_of,
            edges,
            pairs,
            full_graph,
            assigned,
            has_edge,
        }
    }

    /// An incremental round from the last one kept in `cache`.
    fn incremental(&self, cache: &mut RoundCache, epoch: u64) -> crate::round_cache::Matched {
        let budget = Duration::from_millis(self.matcher.pricing_budget_ms);
        let pricing = ExactOptions {
            threads: self.threads,
            deadline: Some(Instant::now() + budget),
            ..ExactOptions::default()
        };
        let job_keys: Vec<u64> = self.jobs.iter().map(|j| self.model.job_key(j)).collect();
        cache.matching(&CacheRound {
            epoch,
            jobs: &self.jobs,
            job_keys: &job_keys,
            open: &self.open,
            col_room: &self.col_room,
            score: &|j, c| self.alone(j, c),
            candidates: |js: &[u32], score: &Score| self.candidates_of(js, score),
            opts: &pricing,
            budget: Some(budget),
            scored_once: self.classes.scored_once(),
        })
    }

    /// The candidate graph of the jobs `js` (ascending; round indices).
    fn candidates_of(&self, js: &[u32], score: &Score) -> Vec<Edge> {
        let mut edges = slot_candidates(
            js.len(),
            &self.slot_cols,
            self.matcher.candidates_per_job,
            self.threads,
            |i, c| score(js[i as usize], c),
        );
        for e in &mut edges {
            e.job = js[e.job as usize];
        }
        edges
    }

    /// The 1-GPU jobs' candidate graph on the columns `score` allows.
    pub(super) fn candidates_by<F>(&self, score: F) -> Vec<Edge>
    where
        F: Fn(u32, u32) -> Option<i64> + Sync,
    {
        slot_candidates(
            self.jobs.len(),
            &self.slot_cols,
            self.matcher.candidates_per_job,
            self.threads,
            score,
        )
    }

    /// The 1-GPU jobs' candidate graph on every column.
    pub(super) fn candidates(&self) -> Vec<Edge> {
        self.candidates_by(|j, c| self.alone(j, c))
    }

    /// The exact matching on `edges`, from scratch.
    pub(super) fn cold(&self, edges: &[Edge]) -> Solution {
        solve_with(
            self.jobs.len(),
            self.cols(),
            edges,
            &SolveOptions::default(),
        )
        .expect("candidate edges are in range, positive and unique")
    }

    /// Pricing (crate::exact) makes the 1-GPU jobs' matching exact over
    /// every pair `score` allows, within the round's budget; whether it got
    /// there.
    pub(super) fn price_out(
        &self,
        edges: Vec<Edge>,
        sol: Solution,
        score: &Score,
    ) -> (Vec<Edge>, Solution, bool) {
        if self.matcher.pricing_budget_ms == 0 {
            return (edges, sol, false);
        }
        // The budget counts from here: pricing's own time, not the solve's.
        let pricing = ExactOptions {
            threads: self.threads,
            deadline: Some(Instant::now() + Duration::from_millis(self.matcher.pricing_budget_ms)),
            ..ExactOptions::default()
        };
        let scores = FnScores {
            jobs: self.jobs.len(),
            gpus: self.cols(),
            score,
        };
        let e = Incremental::from_solution(&scores, edges, sol, &pricing).into_exact();
        (e.edges, e.solution, e.complete)
    }

    /// Whether each job had a candidate. An incremental round's graph
    /// holds only the pairs pricing needed: a job left without one may
    /// still have a feasible GPU (the reason it waits says which).
    fn has_edge(
        &self,
        edges: &[Edge],
        assigned: &[Option<(u32, i64)>],
        incremental: bool,
    ) -> Vec<bool> {
        let mut v = vec![false; self.jobs.len()];
        for e in edges {
            v[e.job as usize] = true;
        }
        if incremental {
            for (j, has) in v.iter_mut().enumerate() {
                if !*has && assigned[j].is_none() && !self.is_gang[j] {
                    *has = (0..self.cols() as u32).any(|c| self.alone(j as u32, c).is_some());
                }
            }
        }
        v
    }
}

/// Each matched job's column and its edge's weight.
fn assigned(jobs: usize, edges: &[Edge], pairs: &[(u32, u32)]) -> Vec<Option<(u32, i64)>> {
    let mut assigned: Vec<Option<(u32, i64)>> = vec![None; jobs];
    for &(j, g) in pairs {
        // slot_candidates returns edges sorted by (job, column).
        let w = edges
            .binary_search_by_key(&(j, g), |e| (e.job, e.gpu))
            .map_or(0, |k| edges[k].weight);
        assigned[j as usize] = Some((g, w));
    }
    assigned
}
