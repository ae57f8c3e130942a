//! Solver stress run on generated instances (not a test, no assertions on
//! time): `cargo run --release -p muxflow-matcher --example stress -- JOBS GPUS DEGREE KIND`
//! with KIND = product | uniform | clustered.

use std::time::Instant;

use muxflow_matcher::{solve_with, verify_certificate, Edge, SolveOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let gpus: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(18_000);
    let degree: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(16);
    let kind = args.get(4).map_or("product", String::as_str);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let a: Vec<i64> = (0..jobs)
        .map(|_| 500 + rng.gen_range(0..500) as i64)
        .collect();
    let b: Vec<i64> = (0..gpus)
        .map(|_| 500 + rng.gen_range(0..500) as i64)
        .collect();
    let mut edges = Vec::with_capacity(jobs * degree);
    for (j, aj) in a.iter().enumerate() {
        let mut seen = std::collections::HashSet::new();
        while seen.len() < degree.min(gpus) {
            let g = match kind {
                // Jobs crowd onto a window of GPUs near their own rank.
                "clustered" => {
                    let centre = j * gpus / jobs;
                    let span = (4 * degree).min(gpus);
                    (centre + rng.gen_range(0..span as u64) as usize) % gpus
                }
                _ => rng.gen_range(0..gpus as u64) as usize,
            };
            seen.insert(g);
        }
        let mut gs: Vec<usize> = seen.into_iter().collect();
        gs.sort_unstable();
        for g in gs {
            let weight = match kind {
                "uniform" => 1 + rng.gen_range(0..1_000_000) as i64,
                _ => aj * b[g] + rng.gen_range(0..20_000) as i64,
            };
            edges.push(Edge {
                job: j as u32,
                gpu: g as u32,
                weight,
            });
        }
    }
    let t = Instant::now();
    let mut opts = SolveOptions::default();
    if let Some(arr) = std::env::var("ARR").ok().and_then(|s| s.parse().ok()) {
        opts.arr_steps_per_job = arr;
    }
    let sol = solve_with(jobs, gpus, &edges, &opts).expect("valid");
    let s = t.elapsed().as_secs_f64();
    verify_certificate(jobs, gpus, &edges, &sol.matching, &sol.duals).expect("certificate");
    println!(
        "{kind} {jobs}x{gpus} degree {degree}: {} edges, solve {s:.3} s, matched {}, objective {}, {:?}",
        edges.len(),
        sol.matching.pairs.len(),
        sol.matching.objective,
        sol.stats
    );
}
