//! The exact solver against brute force (tiny), dense Kuhn–Munkres (up to
//! 300), and its own LP-dual certificate. No timing assertions here.

use muxflow_matcher::reference::{brute_force, dense_kuhn_munkres, greedy};
use muxflow_matcher::synth::{Cluster, WeightMode};
use muxflow_matcher::{
    prune_candidates, solve, solve_with, verify_certificate, Edge, InputError, Matching,
    SolveOptions,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn e(job: u32, gpu: u32, weight: i64) -> Edge {
    Edge { job, gpu, weight }
}

/// Random sparse instance; `max_w` small makes ties likely.
fn random_instance(
    rng: &mut ChaCha8Rng,
    jobs: usize,
    gpus: usize,
    density: f64,
    max_w: u64,
) -> Vec<Edge> {
    let mut edges = Vec::new();
    for j in 0..jobs as u32 {
        for g in 0..gpus as u32 {
            if rng.gen::<f64>() < density {
                edges.push(e(j, g, 1 + rng.gen_range(0..max_w) as i64));
            }
        }
    }
    edges
}

/// Rank-one weights (job factor × GPU factor + small noise), the shape that
/// is slow for dense Kuhn–Munkres and makes long augmenting paths.
fn product_instance(rng: &mut ChaCha8Rng, jobs: usize, gpus: usize, density: f64) -> Vec<Edge> {
    let a: Vec<i64> = (0..jobs)
        .map(|_| 500 + rng.gen_range(0..500) as i64)
        .collect();
    let b: Vec<i64> = (0..gpus)
        .map(|_| 500 + rng.gen_range(0..500) as i64)
        .collect();
    let mut edges = Vec::new();
    for (j, aj) in a.iter().enumerate() {
        for (g, bg) in b.iter().enumerate() {
            if rng.gen::<f64>() < density {
                let w = aj * bg + rng.gen_range(0..2000) as i64;
                edges.push(e(j as u32, g as u32, w));
            }
        }
    }
    edges
}

/// Solves, checks the matching and its certificate, returns it.
fn checked_solve(jobs: usize, gpus: usize, edges: &[Edge], threads: usize) -> Matching {
    let opts = SolveOptions {
        threads,
        ..SolveOptions::default()
    };
    let sol = solve_with(jobs, gpus, edges, &opts).expect("valid input");
    verify_certificate(jobs, gpus, edges, &sol.matching, &sol.duals)
        .unwrap_or_else(|err| panic!("certificate: {err} on {jobs}x{gpus} {edges:?}"));
    sol.matching
}

#[test]
fn tiny_instances_match_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    for case in 0..3000 {
        let jobs = 1 + rng.gen_range(0..7) as usize;
        let gpus = 1 + rng.gen_range(0..7) as usize;
        let density = 0.2 + 0.8 * rng.gen::<f64>();
        let max_w = [3, 10, 1000][case % 3];
        let edges = random_instance(&mut rng, jobs, gpus, density, max_w);
        let m = checked_solve(jobs, gpus, &edges, 1 + case % 2);
        assert_eq!(
            m.objective,
            brute_force(jobs, gpus, &edges),
            "case {case}: {jobs}x{gpus} {edges:?}"
        );
    }
}

#[test]
fn random_sparse_instances_match_dense_km() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..40 {
        let jobs = 20 + rng.gen_range(0..280) as usize;
        let gpus = 20 + rng.gen_range(0..280) as usize;
        let density = [0.01, 0.05, 0.2][case % 3];
        let max_w = [5, 1_000_000][case % 2];
        let edges = random_instance(&mut rng, jobs, gpus, density, max_w);
        let m = checked_solve(jobs, gpus, &edges, 2);
        assert_eq!(
            m.objective,
            dense_kuhn_munkres(jobs, gpus, &edges).objective,
            "case {case}"
        );
    }
}

#[test]
fn rank_one_instances_match_dense_km() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..20 {
        let jobs = 30 + rng.gen_range(0..270) as usize;
        let gpus = 30 + rng.gen_range(0..270) as usize;
        let density = [1.0, 0.3, 0.05][case % 3];
        let edges = product_instance(&mut rng, jobs, gpus, density);
        let m = checked_solve(jobs, gpus, &edges, 2);
        assert_eq!(
            m.objective,
            dense_kuhn_munkres(jobs, gpus, &edges).objective,
            "case {case}"
        );
        // Pruned like production, too.
        let pruned = prune_candidates(&edges, 4);
        let m = checked_solve(jobs, gpus, &pruned, 1);
        assert_eq!(
            m.objective,
            dense_kuhn_munkres(jobs, gpus, &pruned).objective,
            "case {case} pruned"
        );
    }
}

#[test]
fn synthetic_clusters_match_dense_km() {
    for (seed, (gpus, jobs)) in [(300, 200), (200, 300), (300, 300), (64, 250)]
        .into_iter()
        .enumerate()
    {
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            let cluster = Cluster::generate(gpus, jobs, seed as u64, mode);
            for k in [16, 3] {
                let edges = cluster.candidates(k, 2);
                let m = checked_solve(jobs, gpus, &edges, 2);
                let dense = dense_kuhn_munkres(jobs, gpus, &edges);
                assert_eq!(m.objective, dense.objective, "{gpus}x{jobs} {mode:?} k={k}");
                assert!(greedy(jobs, gpus, &edges).objective <= m.objective);
            }
            // Unpruned: every feasible pair.
            let all = cluster.all_edges();
            let m = checked_solve(jobs, gpus, &all, 2);
            assert_eq!(
                m.objective,
                dense_kuhn_munkres(jobs, gpus, &all).objective,
                "{gpus}x{jobs} {mode:?} all"
            );
        }
    }
}

#[test]
fn all_equal_weights_give_a_maximum_cardinality_matching() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..50 {
        let (jobs, gpus) = (
            1 + rng.gen_range(0..40) as usize,
            1 + rng.gen_range(0..40) as usize,
        );
        let edges = random_instance(&mut rng, jobs, gpus, 0.1, 1);
        let m = checked_solve(jobs, gpus, &edges, 2);
        assert_eq!(
            m.objective,
            dense_kuhn_munkres(jobs, gpus, &edges).objective
        );
        assert_eq!(m.objective as usize, m.pairs.len());
    }
}

/// A search on tied weights ends at the first free column it reaches: on
/// a complete graph of equal weights no job settles a matched column (the
/// heap pops free columns first among equal distances). Counted work, not
/// time; the daemon's round on tied predictions is where it shows
/// (`bench --daemon-round`).
#[test]
fn tied_weights_end_each_search_at_a_free_column() {
    let (jobs, gpus) = (300, 500);
    let edges: Vec<Edge> = (0..jobs as u32)
        .flat_map(|j| (0..gpus as u32).map(move |g| e(j, g, 1_000)))
        .collect();
    let sol = solve_with(
        jobs,
        gpus,
        &edges,
        &SolveOptions {
            threads: 1,
            arr_steps_per_job: 0,
        },
    )
    .unwrap();
    assert_eq!(sol.matching.pairs.len(), jobs);
    assert!(sol.stats.searches > 0, "{:?}", sol.stats);
    assert_eq!(sol.stats.settled_columns, 0, "{:?}", sol.stats);
}

#[test]
fn result_does_not_depend_on_edge_order_or_threads() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let edges = random_instance(&mut rng, 120, 90, 0.05, 4);
    let base = checked_solve(120, 90, &edges, 1);
    let mut shuffled = edges.clone();
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.gen_range(0..i as u64 + 1) as usize);
    }
    for threads in [1, 2, 4] {
        assert_eq!(checked_solve(120, 90, &shuffled, threads), base);
    }
}

#[test]
fn disconnected_blocks_are_solved_independently() {
    // Three blocks with known optima plus an isolated job and GPU.
    let edges = vec![
        e(0, 0, 5),
        e(0, 1, 4),
        e(1, 0, 4),
        e(1, 1, 1), // block A: optimum 8 (0-1, 1-0)
        e(2, 2, 7), // block B: 7
        e(3, 3, 2),
        e(4, 3, 3), // block C: 3
    ];
    let m = checked_solve(6, 5, &edges, 2);
    assert_eq!(m.objective, 18);
    assert_eq!(m.pairs, vec![(0, 1), (1, 0), (2, 2), (4, 3)]);
}

#[test]
fn empty_and_edgeless_inputs() {
    assert_eq!(solve(0, 0, &[]).unwrap(), Matching::default());
    assert_eq!(solve(5, 3, &[]).unwrap(), Matching::default());
    let m = checked_solve(3, 0, &[], 2);
    assert!(m.pairs.is_empty());
}

#[test]
fn bad_input_is_rejected() {
    assert!(matches!(
        solve(1, 1, &[e(1, 0, 1)]),
        Err(InputError::JobOutOfRange { .. })
    ));
    assert!(matches!(
        solve(1, 1, &[e(0, 1, 1)]),
        Err(InputError::GpuOutOfRange { .. })
    ));
    assert!(matches!(
        solve(1, 1, &[e(0, 0, 0)]),
        Err(InputError::NonPositiveWeight { .. })
    ));
    assert_eq!(
        solve(1, 1, &[e(0, 0, 3), e(0, 0, 2)]),
        Err(InputError::DuplicateEdge { job: 0, gpu: 0 })
    );
}

#[test]
fn certificate_rejects_a_suboptimal_matching() {
    let edges = vec![e(0, 0, 5), e(0, 1, 4), e(1, 0, 4)];
    let sol = solve_with(2, 2, &edges, &SolveOptions::default()).unwrap();
    assert_eq!(sol.matching.objective, 8);
    let worse = Matching {
        pairs: vec![(0, 0)],
        objective: 5,
    };
    assert!(verify_certificate(2, 2, &edges, &worse, &sol.duals).is_err());
}
