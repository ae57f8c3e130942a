//! Reference solvers the production solver is checked against: dense
//! Kuhn–Munkres (pathfinding), brute force, and the greedy baseline.

use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;

use crate::solver::{Edge, Matching};

/// Dense Kuhn–Munkres on the candidate graph: a min(J,G) × max(J,G) matrix
/// with 0 for non-edges. As all weights are ≥ 0 this is max-weight matching
/// with unmatched vertices allowed (a 0 entry = not matched). O(n³) time,
/// 8·J·G bytes.
pub fn dense_kuhn_munkres(jobs: usize, gpus: usize, edges: &[Edge]) -> Matching {
    if jobs == 0 || gpus == 0 {
        return Matching::default();
    }
    let transpose = jobs > gpus;
    let (rows, cols) = if transpose {
        (gpus, jobs)
    } else {
        (jobs, gpus)
    };
    let mut m = Matrix::new(rows, cols, 0i64);
    for e in edges {
        let (r, c) = if transpose {
            (e.gpu as usize, e.job as usize)
        } else {
            (e.job as usize, e.gpu as usize)
        };
        m[(r, c)] = e.weight;
    }
    let (total, assignment) = kuhn_munkres(&m);
    let mut pairs: Vec<(u32, u32)> = assignment
        .iter()
        .enumerate()
        .filter(|&(r, &c)| m[(r, c)] > 0)
        .map(|(r, &c)| {
            if transpose {
                (c as u32, r as u32)
            } else {
                (r as u32, c as u32)
            }
        })
        .collect();
    pairs.sort_unstable();
    Matching {
        pairs,
        objective: total,
    }
}

/// Exhaustive search; for tiny instances (≤ ~8 jobs) only.
pub fn brute_force(jobs: usize, gpus: usize, edges: &[Edge]) -> i64 {
    let mut adj: Vec<Vec<(u32, i64)>> = vec![Vec::new(); jobs];
    for e in edges {
        adj[e.job as usize].push((e.gpu, e.weight));
    }
    fn go(j: usize, adj: &[Vec<(u32, i64)>], used: &mut [bool]) -> i64 {
        if j == adj.len() {
            return 0;
        }
        let mut best = go(j + 1, adj, used);
        for &(g, w) in &adj[j] {
            if !used[g as usize] {
                used[g as usize] = true;
                best = best.max(w + go(j + 1, adj, used));
                used[g as usize] = false;
            }
        }
        best
    }
    go(0, &adj, &mut vec![false; gpus])
}

/// Heaviest edge first, skipping taken vertices. Not exact; at least half the
/// optimum.
pub fn greedy(jobs: usize, gpus: usize, edges: &[Edge]) -> Matching {
    let mut order: Vec<&Edge> = edges.iter().collect();
    order.sort_unstable_by_key(|e| (std::cmp::Reverse(e.weight), e.job, e.gpu));
    let mut job_used = vec![false; jobs];
    let mut gpu_used = vec![false; gpus];
    let mut m = Matching::default();
    for e in order {
        if !job_used[e.job as usize] && !gpu_used[e.gpu as usize] {
            job_used[e.job as usize] = true;
            gpu_used[e.gpu as usize] = true;
            m.pairs.push((e.job, e.gpu));
            m.objective += e.weight;
        }
    }
    m.pairs.sort_unstable();
    m
}
