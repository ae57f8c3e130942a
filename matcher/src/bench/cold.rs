//! `bench` (the default run): one cold round on a synthetic cluster, the
//! references it is measured against, then incremental rounds after small
//! changes (the measures are described in the [module docs](super)).

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    cpu_s, export, fmt_gap, gap, peak_rss_mb, BenchArgs, BenchReport, DenseMode, DENSE_AUTO_MAX,
};
use crate::exact::{Exact, ExactOptions, Incremental};
use crate::reference::{dense_kuhn_munkres, greedy};
use crate::solver::{solve_with, verify_certificate, Edge, Matching, Solution, SolveOptions};
use crate::synth::{Cluster, WeightMode};

/// Changes per incremental round: this share of the jobs are replaced
/// (one ended, one arrived in its slot) and of the GPUs flip health.
pub const INCREMENTAL_CHANGE: f64 = 0.01;
/// Incremental rounds timed (the median is reported).
pub const INCREMENTAL_ROUNDS: usize = 9;

/// The cold round, timed: pruning, the candidate graph's own optimum
/// (what pruning without pricing gives), then the exact round.
struct Cold {
    edges: Vec<Edge>,
    prune_s: f64,
    pruned: Solution,
    pruned_s: f64,
    exact_s: f64,
    exact_cpu_s: f64,
    round_s: f64,
    peak_mb: f64,
    exact: Exact,
}

impl Cold {
    fn measure(args: &BenchArgs, cluster: &Cluster) -> anyhow::Result<(Cold, Incremental)> {
        let opts = SolveOptions {
            threads: args.threads,
            ..SolveOptions::default()
        };
        let t = Instant::now();
        let edges = cluster.candidates(args.candidates_per_job, args.threads);
        let prune_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let pruned = solve_with(args.jobs, args.gpus, &edges, &opts).context("solving")?;
        let pruned_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let cpu0 = cpu_s();
        let inc = Incremental::cold(cluster, &edges, &exact_options(args)).context("solving")?;
        let exact_s = t.elapsed().as_secs_f64();
        let exact_cpu_s = cpu_s() - cpu0;
        let peak_mb = peak_rss_mb().unwrap_or(f64::NAN);
        let exact = inc.exact().clone();
        let cold = Cold {
            edges,
            prune_s,
            pruned,
            pruned_s,
            exact_s,
            exact_cpu_s,
            round_s: prune_s + exact_s,
            peak_mb,
            exact,
        };
        Ok((cold, inc))
    }
}

fn exact_options(args: &BenchArgs) -> ExactOptions {
    ExactOptions {
        threads: args.threads,
        ..ExactOptions::default()
    }
}

/// What the cold round is measured against: its certificate, the
/// full-graph bound (an independent scan), the old top-k rule, greedy and,
/// where it fits, dense Kuhn–Munkres on every feasible pair.
struct References {
    certified: Result<(), String>,
    verify_s: f64,
    bound: i128,
    top_edges: usize,
    top_prune_s: f64,
    top_m: Solution,
    greedy_m: Matching,
    greedy_s: f64,
    full_bound: i128,
    jobs_outside: usize,
    full_bound_s: f64,
    pruned_full_bound: i128,
    pruned_outside: usize,
    cert_violated: u64,
    cert_scored: u64,
    cert_s: f64,
    dense: Option<(Matching, f64)>,
}

impl References {
    fn measure(args: &BenchArgs, cluster: &Cluster, cold: &Cold) -> anyhow::Result<References> {
        let sol = &cold.exact.solution;
        let t = Instant::now();
        let certified = verify_certificate(
            args.jobs,
            args.gpus,
            &cold.exact.edges,
            &sol.matching,
            &sol.duals,
        );
        let verify_s = t.elapsed().as_secs_f64();
        let bound = sol.duals.bound();

        let t = Instant::now();
        let top_edges = cluster.top_k_candidates(args.candidates_per_job, args.threads);
        let top_prune_s = t.elapsed().as_secs_f64();
        let opts = SolveOptions {
            threads: args.threads,
            ..SolveOptions::default()
        };
        let top_m = solve_with(args.jobs, args.gpus, &top_edges, &opts).context("solving top-k")?;

        let t = Instant::now();
        let greedy_m = greedy(args.jobs, args.gpus, &cold.edges);
        let greedy_s = t.elapsed().as_secs_f64();

        // Independent of pricing: raise each job's dual to its best profit over
        // every feasible GPU (a full scan); what that adds is the gap.
        let t = Instant::now();
        let (full_bound, jobs_outside) = cluster.full_graph_bound(&sol.duals, args.threads);
        let full_bound_s = t.elapsed().as_secs_f64();
        let (pruned_full_bound, pruned_outside) =
            cluster.full_graph_bound(&cold.pruned.duals, args.threads);
        let t = Instant::now();
        let (cert_violated, cert_scored) = cluster.certificate_pass(&sol.duals, args.threads);
        let cert_s = t.elapsed().as_secs_f64();

        let run_dense = match args.dense {
            DenseMode::Always => true,
            DenseMode::Never => false,
            DenseMode::Auto => args.gpus <= DENSE_AUTO_MAX && args.jobs <= DENSE_AUTO_MAX,
        };
        let dense = run_dense.then(|| {
            let all = cluster.all_edges();
            let t = Instant::now();
            let m = dense_kuhn_munkres(args.jobs, args.gpus, &all);
            (m, t.elapsed().as_secs_f64())
        });
        Ok(References {
            certified,
            verify_s,
            bound,
            top_edges: top_edges.len(),
            top_prune_s,
            top_m,
            greedy_m,
            greedy_s,
            full_bound,
            jobs_outside,
            full_bound_s,
            pruned_full_bound,
            pruned_outside,
            cert_violated,
            cert_scored,
            cert_s,
            dense,
        })
    }
}

/// The incremental rounds: each after [`INCREMENTAL_CHANGE`] of the jobs
/// were replaced and as many GPUs flipped health, timed, each checked
/// against the full-graph bound.
struct Rounds {
    n_jobs: usize,
    n_gpus: usize,
    ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    /// Per round: pricing passes, rows, columns; searches, reverse searches.
    detail: Vec<(usize, u64, u64, u64, u64)>,
    /// Per round: unchanged jobs the new optimum moved.
    moved: Vec<usize>,
    median_ms: f64,
    ok: Result<(), String>,
}

impl Rounds {
    fn measure(args: &BenchArgs, cluster: &mut Cluster, inc: &mut Incremental) -> Rounds {
        let exact_opts = exact_options(args);
        let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0x1c4e);
        let mut r = Rounds {
            n_jobs: ((args.jobs as f64 * INCREMENTAL_CHANGE) as usize).max(1),
            n_gpus: ((args.gpus as f64 * INCREMENTAL_CHANGE) as usize).max(1),
            ms: Vec::new(),
            cpu_ms: Vec::new(),
            detail: Vec::new(),
            moved: Vec::new(),
            median_ms: 0.0,
            ok: Ok(()),
        };
        for _ in 0..INCREMENTAL_ROUNDS {
            let jobs: Vec<u32> = (0..r.n_jobs)
                .map(|_| rng.gen_range(0..args.jobs as u32))
                .collect();
            let mut gpus: Vec<u32> = (0..r.n_gpus)
                .map(|_| rng.gen_range(0..args.gpus as u32))
                .collect();
            gpus.sort_unstable();
            gpus.dedup();
            for &j in &jobs {
                cluster.replace_job(j as usize, &mut rng);
            }
            for &g in &gpus {
                cluster.toggle_health(g as usize);
            }
            cluster.regroup();
            let before = inc.exact().solution.job_gpu(args.jobs);
            let t = Instant::now();
            let cpu0 = cpu_s();
            let e = inc.update(&*cluster, &jobs, &gpus, &exact_opts);
            r.ms.push(t.elapsed().as_secs_f64() * 1e3);
            r.cpu_ms.push((cpu_s() - cpu0) * 1e3);
            r.detail.push((
                e.pricing.passes,
                e.pricing.rows,
                e.pricing.cols,
                e.solution.stats.searches,
                e.solution.stats.reverse_searches,
            ));
            // How far the optimum itself moved: jobs that did not change but
            // sit on another GPU (or none) now. An exact round has to make
            // each of these moves, whatever it starts from.
            let after = e.solution.job_gpu(args.jobs);
            let changed: std::collections::HashSet<u32> = jobs.iter().copied().collect();
            r.moved.push(
                (0..args.jobs)
                    .filter(|&j| !changed.contains(&(j as u32)) && before[j] != after[j])
                    .count(),
            );
            let e = e.clone();
            let (b, _) = cluster.full_graph_bound(&e.solution.duals, args.threads);
            if b != e.solution.matching.objective as i128 && r.ok.is_ok() {
                r.ok = Err(format!(
                    "incremental round: full-graph bound {b} above its objective {}",
                    e.solution.matching.objective
                ));
            }
        }
        let mut sorted_ms = r.ms.clone();
        sorted_ms.sort_by(f64::total_cmp);
        r.median_ms = sorted_ms[sorted_ms.len() / 2];
        r.cpu_ms.sort_by(f64::total_cmp);
        r
    }
}

/// The round's objective against the best reference.
struct Verdict {
    prod: i128,
    reference: i128,
    gap_reference: &'static str,
    best: i128,
    objective_gap: f64,
    full_graph_gap: f64,
}

impl Verdict {
    fn of(cold: &Cold, refs: &References) -> Verdict {
        let prod = cold.exact.solution.matching.objective as i128;
        let (reference, gap_reference) = match &refs.dense {
            Some((m, _)) => (m.objective as i128, "dense kuhn_munkres (full graph)"),
            None => (refs.full_bound, "LP dual bound over every pair"),
        };
        Verdict {
            prod,
            reference,
            gap_reference,
            best: reference.max(prod),
            objective_gap: gap(reference, prod),
            full_graph_gap: gap(refs.full_bound, prod),
        }
    }
}

pub fn run(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    let t = Instant::now();
    let mut cluster = Cluster::generate(args.gpus, args.jobs, args.seed, args.weights);
    let gen_s = t.elapsed().as_secs_f64();
    let (cold, mut inc) = Cold::measure(args, &cluster)?;
    let refs = References::measure(args, &cluster, &cold)?;
    if let Some(path) = &args.export {
        export(path, args.jobs, args.gpus, &cold.exact.edges)?;
    }
    // Incremental rounds: a small change, then a round from the cache.
    let rounds = Rounds::measure(args, &mut cluster, &mut inc);
    let verdict = Verdict::of(&cold, &refs);
    let mut text = String::new();
    write_header(&mut text, args, &cluster, gen_s, &cold, &refs)?;
    write_table(&mut text, &cold, &refs, &rounds, &verdict)?;
    write_footer(&mut text, &cluster, &cold, &refs, &rounds, &verdict)?;

    let fail = |text: &str, e: String| -> anyhow::Result<BenchReport> {
        print!("{text}");
        bail!("{e}")
    };
    if let Err(e) = &refs.certified {
        return fail(
            &text,
            format!("the solver's optimality certificate failed: {e}"),
        );
    }
    if verdict.objective_gap != 0.0 || verdict.full_graph_gap != 0.0 {
        return fail(
            &text,
            format!(
                "round objective {} differs from {} {} or the full-graph bound {}",
                verdict.prod, verdict.gap_reference, verdict.reference, refs.full_bound
            ),
        );
    }
    if let Err(e) = rounds.ok {
        return fail(&text, e);
    }
    let sol = &cold.exact.solution;
    Ok(BenchReport {
        round_s: cold.round_s,
        peak_mb: cold.peak_mb,
        objective_gap: verdict.objective_gap,
        full_graph_gap: verdict.full_graph_gap,
        incremental_ms: rounds.median_ms,
        gap_reference: verdict.gap_reference,
        matched: sol.matching.pairs.len(),
        top_k_matched: refs.top_m.matching.pairs.len(),
        text,
    })
}

/// The instance, the candidate graph and the certificate.
fn write_header(
    text: &mut String,
    args: &BenchArgs,
    cluster: &Cluster,
    gen_s: f64,
    cold: &Cold,
    refs: &References,
) -> std::fmt::Result {
    let (exact, sol) = (&cold.exact, &cold.exact.solution);
    let mode = match args.weights {
        WeightMode::Structured => "structured",
        WeightMode::Uniform => "uniform",
    };
    writeln!(
        text,
        "muxflow-matcher-bench: {} GPUs ({} eligible) x {} jobs, {mode} weights, seed {}, k={}, {} threads",
        args.gpus,
        cluster.eligible_gpus(),
        args.jobs,
        args.seed,
        args.candidates_per_job,
        args.threads
    )?;
    writeln!(
        text,
        "instance generation {gen_s:.3} s (not part of the round)"
    )?;
    writeln!(
        text,
        "candidate graph: {} edges, pricing added {} in {} passes ({} pairs scored) -> {} edges; solves: {} searches settling {} columns, {} reverse searches",
        cold.edges.len(),
        exact.pricing.added,
        exact.pricing.passes,
        exact.pricing.scored,
        exact.edges.len(),
        sol.stats.searches,
        sol.stats.settled_columns,
        sol.stats.reverse_searches,
    )?;
    writeln!(
        text,
        "certificate (LP duals): {} on the final graph in {:.3} s, dual bound {}; full-graph bound {} ({} jobs with a better GPU outside the graph)",
        match &refs.certified {
            Ok(()) => "valid".to_string(),
            Err(e) => format!("INVALID: {e}"),
        },
        refs.verify_s,
        refs.bound,
        refs.full_bound,
        refs.jobs_outside
    )?;
    writeln!(text)
}

/// One row per step or solver: time, objective, matched, gap to the best,
/// speedup against dense Kuhn–Munkres, time against greedy's.
fn write_table(
    text: &mut String,
    cold: &Cold,
    refs: &References,
    rounds: &Rounds,
    verdict: &Verdict,
) -> std::fmt::Result {
    writeln!(
        text,
        "{:<36} {:>9} {:>14} {:>8} {:>11} {:>12} {:>12}",
        "step / solver",
        "time_s",
        "objective",
        "matched",
        "gap_vs_best",
        "speedup_km",
        "time/greedy"
    )?;
    let dense_s = refs.dense.as_ref().map(|(_, s)| *s);
    let ratio = |s: f64| match dense_s {
        Some(d) if s > 0.0 => format!("{:.1}x", d / s),
        _ => "-".into(),
    };
    let greedy_s = refs.greedy_s;
    let best = verdict.best;
    let row = |text: &mut String, name: &str, s: f64, obj: Option<i128>, matched: Option<usize>| {
        writeln!(
            text,
            "{:<36} {:>9.3} {:>14} {:>8} {:>11} {:>12} {:>12}",
            name,
            s,
            obj.map_or("-".into(), |o| o.to_string()),
            matched.map_or("-".into(), |m| m.to_string()),
            obj.map_or("-".into(), |o| fmt_gap(gap(best, o))),
            ratio(s),
            if greedy_s > 0.0 {
                format!("{:.1}x", s / greedy_s)
            } else {
                "-".into()
            }
        )
    };
    let (prod, matched) = (verdict.prod, cold.exact.solution.matching.pairs.len());
    row(
        text,
        "prune (top k + spread lists)",
        cold.prune_s,
        None,
        None,
    )?;
    row(
        text,
        "solve + pricing (exact, full graph)",
        cold.exact_s,
        Some(prod),
        Some(matched),
    )?;
    row(
        text,
        "production round (prune + exact)",
        cold.round_s,
        Some(prod),
        Some(matched),
    )?;
    row(
        text,
        "incremental round (median, 1% chg)",
        rounds.median_ms / 1e3,
        None,
        None,
    )?;
    match &refs.dense {
        Some((m, s)) => row(
            text,
            "dense kuhn_munkres (full graph)",
            *s,
            Some(m.objective as i128),
            Some(m.pairs.len()),
        )?,
        None => writeln!(
            text,
            "{:<36} {:>9} (skipped: --dense never, or a side > {DENSE_AUTO_MAX} with --dense auto)",
            "dense kuhn_munkres (full graph)", "-"
        )?,
    }
    row(
        text,
        "candidate graph only (no pricing)",
        cold.pruned_s,
        Some(cold.pruned.matching.objective as i128),
        Some(cold.pruned.matching.pairs.len()),
    )?;
    row(
        text,
        "greedy (heaviest edge first)",
        greedy_s,
        Some(refs.greedy_m.objective as i128),
        Some(refs.greedy_m.pairs.len()),
    )
}

/// The bounds, the old rule, the incremental rounds and the key=value line.
fn write_footer(
    text: &mut String,
    cluster: &Cluster,
    cold: &Cold,
    refs: &References,
    rounds: &Rounds,
    verdict: &Verdict,
) -> std::fmt::Result {
    writeln!(
        text,
        "{:<36} {:>9.3} {:>14}   full scan of every pair: pricing leaves {} jobs with a better GPU; without pricing the candidate graph loses at most {:.2}% ({} jobs)",
        "full feasible graph bound",
        refs.full_bound_s,
        refs.full_bound,
        refs.jobs_outside,
        100.0 * gap(refs.pruned_full_bound, cold.pruned.matching.objective as i128),
        refs.pruned_outside
    )?;
    writeln!(
        text,
        "{:<36} {:>9.3} {:>14}   every row priced once at the optimum's duals (bound, then weight): {} of {} feasible pairs scored, {} violated; the least an exact round spends certifying",
        "certificate pass (bounded)",
        refs.cert_s,
        "-",
        refs.cert_scored,
        cluster.feasible_pairs(),
        refs.cert_violated
    )?;
    writeln!(
        text,
        "{:<36} {:>9.3} {:>14} {:>8} {:>11}   old rule: each job's best k only, {} edges (time: its pruning)",
        "top-k only graph (old rule)",
        refs.top_prune_s,
        refs.top_m.matching.objective,
        refs.top_m.matching.pairs.len(),
        fmt_gap(gap(verdict.best, refs.top_m.matching.objective as i128)),
        refs.top_edges
    )?;
    writeln!(
        text,
        "incremental rounds ({} jobs replaced, {} GPU health flips each): ms {}; passes/rows/cols/searches/reverse {}",
        rounds.n_jobs,
        rounds.n_gpus,
        rounds.ms.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(" "),
        rounds.detail.iter().map(|d| format!("{}/{}/{}/{}/{}", d.0, d.1, d.2, d.3, d.4)).collect::<Vec<_>>().join(" ")
    )?;
    writeln!(
        text,
        "CPU time (all threads): cold solve + pricing {:.3} s (wall {:.3} s); incremental median {:.1} ms",
        cold.exact_cpu_s,
        cold.exact_s,
        rounds.cpu_ms[rounds.cpu_ms.len() / 2]
    )?;
    writeln!(
        text,
        "the new optimum moves unchanged jobs to another GPU after each change: {}",
        rounds
            .moved
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    )?;
    writeln!(
        text,
        "speedup_km = dense Kuhn-Munkres time / this row's time; time/greedy = this row's time / greedy's (both measured in this run)"
    )?;
    writeln!(
        text,
        "objective_gap is the round vs {}; full_graph_gap vs the LP bound over every pair; peak_mb is VmHWM after the cold round",
        verdict.gap_reference
    )?;
    writeln!(
        text,
        "round_s={:.3} peak_mb={:.1} objective_gap={} full_graph_gap={} incremental_ms={:.1}",
        cold.round_s,
        cold.peak_mb,
        fmt_gap(verdict.objective_gap),
        fmt_gap(verdict.full_graph_gap),
        rounds.median_ms
    )
}
