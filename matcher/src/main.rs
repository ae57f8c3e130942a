//! `muxflow-matcher`: pairs pending offline jobs with GPUs running online
//! jobs. The Slurm-facing round is not built yet; `bench` runs the matching
//! core on a synthetic cluster.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use muxflow_matcher::bench::{self, BenchArgs, DenseMode};
use muxflow_matcher::synth::WeightMode;

#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// muxflow config file.
    #[arg(long, default_value = muxflow::config::DEFAULT_PATH)]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Time one matching round on a synthetic cluster against dense
    /// Kuhn-Munkres; ends with `round_s=X peak_mb=Y objective_gap=Z`.
    Bench {
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
        /// Candidate GPUs kept per job (default: matcher.candidates_per_job's default).
        #[arg(long)]
        candidates_per_job: Option<usize>,
        /// Worker threads for pruning and the solve.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
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
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Bench {
            gpus,
            jobs,
            seed,
            weights,
            dense,
            candidates_per_job,
            threads,
        }) => {
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
            };
            let report = bench::run(&args)?;
            print!("{}", report.text);
            Ok(())
        }
        None => {
            muxflow::Config::load(&cli.config).with_context(|| "loading the muxflow config")?;
            anyhow::bail!("muxflow-matcher: matching is not built yet (see the matcher issue)")
        }
    }
}
