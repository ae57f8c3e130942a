//! What pruning really costs on a synthetic cluster small enough to solve
//! unpruned: the exact optimum of every feasible pair against the production
//! candidate graph's. `cargo run --release -p muxflow-matcher --example
//! pruning_loss -- GPUS JOBS [structured|uniform]`.

use muxflow_matcher::synth::{Cluster, WeightMode};
use muxflow_matcher::{solve_with, SolveOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let gpus: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let jobs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let mode = match args.get(3).map(String::as_str) {
        Some("uniform") => WeightMode::Uniform,
        _ => WeightMode::Structured,
    };
    let c = Cluster::generate(gpus, jobs, 1, mode);
    let opts = SolveOptions::default();
    let pruned = c.candidates(16, 2);
    let p = solve_with(jobs, gpus, &pruned, &opts).expect("valid");
    let t = std::time::Instant::now();
    let all = c.all_edges();
    let f = solve_with(jobs, gpus, &all, &opts).expect("valid");
    println!(
        "{gpus}x{jobs}: full optimum {} ({} matched, {:.1} s), production graph {} ({} matched), loss {:.3}%",
        f.matching.objective,
        f.matching.pairs.len(),
        t.elapsed().as_secs_f64(),
        p.matching.objective,
        p.matching.pairs.len(),
        100.0 * (f.matching.objective - p.matching.objective) as f64 / f.matching.objective as f64
    );
}
