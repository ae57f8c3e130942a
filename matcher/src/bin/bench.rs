//! `muxflow-matcher-bench`: the matcher's benchmarks on synthetic clusters
//! (`scripts/bench matcher`). A binary of its own, built with the
//! `bench` feature, so the daemon and its library carry none of the
//! synthetic clusters and reference solvers.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use muxflow_matcher::bench::{self, BenchArgs, DenseMode};
use muxflow_matcher::synth::WeightMode;

/// Time one matching round (exact on every feasible pair) on a synthetic
/// cluster against dense Kuhn-Munkres, then incremental rounds after 1%
/// changes; ends with `round_s=X peak_mb=Y objective_gap=Z
/// full_graph_gap=W incremental_ms=V`.
#[derive(Debug, Parser)]
#[command(version)]
struct BenchCli {
    #[arg(long, default_value_t = 18_000)]
    gpus: usize,
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = Weights::Structured)]
    weights: Weights,
    /// Dense Kuhn-Munkres reference: auto runs it when both sides are <= 4000.
    #[arg(long, value_enum, default_value_t = Dense::Auto)]
    dense: Dense,
    /// Candidate GPUs per job (default: matcher.candidates_per_job's default).
    #[arg(long)]
    candidates_per_job: Option<usize>,
    /// Worker threads for pruning and the solve.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Write the round's final candidate graph (same optimum as the
    /// full graph, certified) as text: a `# jobs gpus edges` header,
    /// `J G E`, then one `job gpu weight` line per edge.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
    /// Instead: one production round where this share of the jobs are
    /// 2, 4 or 8-GPU gangs (nodes of 8 GPUs), timed against the same
    /// jobs as 1-GPU jobs.
    #[arg(long, value_name = "SHARE")]
    gang_share: Option<f64>,
    /// With --gang-share: offline slots per GPU, 1 to 4 (as
    /// `[policy] offline_per_gpu`).
    #[arg(long, value_name = "N", default_value_t = 1)]
    slots_per_gpu: u32,
    /// With --gang-share: the round's pricing budget (default:
    /// matcher.pricing_budget_ms's default; 0: no pricing).
    #[arg(long, value_name = "MS")]
    pricing_budget_ms: Option<u64>,
    /// Instead: the daemon's own round (round::plan, the predictor, a
    /// synthetic cluster as Slurm lists it) without and with pricing,
    /// against scoring every pair once.
    #[arg(long)]
    daemon_round: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Weights {
    Structured,
    Uniform,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Dense {
    Auto,
    Always,
    Never,
}

fn main() -> anyhow::Result<()> {
    // RUST_LOG=debug shows the round's pricing passes.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let BenchCli {
        gpus,
        jobs,
        seed,
        weights,
        dense,
        candidates_per_job,
        threads,
        export,
        gang_share,
        slots_per_gpu,
        pricing_budget_ms,
        daemon_round,
    } = muxflow::man::parse_or_print(&muxflow::man::Page::bare("1"));
    let args = BenchArgs {
        gpus,
        jobs,
        seed,
        weights: match weights {
            Weights::Structured => WeightMode::Structured,
            Weights::Uniform => WeightMode::Uniform,
        },
        dense: match dense {
            Dense::Auto => DenseMode::Auto,
            Dense::Always => DenseMode::Always,
            Dense::Never => DenseMode::Never,
        },
        candidates_per_job: candidates_per_job
            .unwrap_or(muxflow::config::Matcher::default().candidates_per_job),
        threads: threads.max(1),
        export,
        pricing_budget_ms: pricing_budget_ms
            .unwrap_or(muxflow::config::Matcher::default().pricing_budget_ms),
    };
    if daemon_round {
        print!("{}", bench::daemon_run(&args)?);
        return Ok(());
    }
    if gang_share.is_some() || slots_per_gpu != 1 {
        print!(
            "{}",
            bench::gang_run(&args, slots_per_gpu, gang_share.unwrap_or(0.0))?
        );
        return Ok(());
    }
    let report = bench::run(&args)?;
    print!("{}", report.text);
    Ok(())
}
