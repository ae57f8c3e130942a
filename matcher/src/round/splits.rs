//! The slot-splits phase (`[policy] offline_per_gpu` = N > 1): after the
//! exact matching gave each open GPU at most one job taking all its free
//! slots, a GPU whose free slots went to n − 1 jobs of this round may take
//! one more, for n = 2 .. N, its slots split among them ([`split_slots`];
//! [`crate::slots::split_rounds`]: an exact assignment each step, edges
//! only where the GPU does more work that way).

use muxflow::config::CoLocate;

use super::matching::Matched;
use super::{Predictor, Round};
use crate::predict::Seat;
use crate::slots::split_rounds;

/// The slots of the i-th of `jobs` jobs that share `free` slots of a GPU:
/// equal parts, the first ones taking one more while some are left over
/// (5 between 2: 3 and 2). Every job gets at least one while `jobs` ≤
/// `free`.
pub fn split_slots(free: u32, jobs: u32, i: usize) -> u32 {
    let jobs = jobs.max(1);
    free / jobs + u32::from((i as u32) < free % jobs)
}

/// Where the 1-GPU jobs go after the splits.
pub(super) struct Placed {
    /// Per job, its column and the matching's weight there (0 for a job a
    /// split placed).
    pub(super) assigned: Vec<Option<(u32, i64)>>,
    /// Each placed 1-GPU job's seat: its place among its GPU's jobs of
    /// this round.
    pub(super) seat: Vec<Option<Seat>>,
    /// Edges the split steps scored.
    pub(super) split_edges: usize,
}

impl<P: Predictor> Round<'_, P> {
    /// The i-th of n jobs of this round on column c.
    pub(super) fn seat_of(&self, c: usize, i: usize, n: u32) -> Seat {
        Seat {
            slots: split_slots(self.free[c], n, i),
            offline_jobs: self.running[c] + n,
        }
    }

    /// Splits the GPUs the matching gave a job of this round (not those
    /// the gangs `taken`) with the jobs left, where that adds throughput.
    pub(super) fn split_open_gpus(&self, matched: &Matched, taken: &[bool]) -> Placed {
        let jobs = self.jobs.len();
        let mut assigned = matched.assigned.clone();
        // members[c]: the 1-GPU jobs this round puts on column c, in order.
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); self.cols()];
        for &(j, c) in &matched.pairs {
            members[c as usize].push(j);
        }
        let mut waiting_job: Vec<bool> = (0..jobs)
            .map(|j| assigned[j].is_none() && !self.is_gang[j])
            .collect();
        let split_edges = split_rounds(
            &self.free,
            self.per_gpu,
            taken,
            &mut members,
            &mut waiting_job,
            self.matcher.candidates_per_job,
            self.threads,
            |c, i, n| self.side(c, self.seat_of(c, i, n)),
            // No second job of this round on a GPU where who runs there
            // matters (a one-user daemon, a co_locate rule): the two may not go
            // together (the next round sees the first one there and decides).
            |j, c, terms| {
                if self.gpu_of(c).published.multiuser && self.policy.co_locate == CoLocate::Any {
                    self.value(j as usize, c, terms)
                } else {
                    None
                }
            },
        );
        for (c, list) in members.iter().enumerate() {
            for &j in list {
                assigned[j as usize].get_or_insert((c as u32, 0));
            }
        }
        let mut seat: Vec<Option<Seat>> = vec![None; jobs];
        for (c, list) in members.iter().enumerate() {
            for (i, &j) in list.iter().enumerate() {
                seat[j as usize] = Some(self.seat_of(c, i, list.len() as u32));
            }
        }
        Placed {
            assigned,
            seat,
            split_edges,
        }
    }
}
