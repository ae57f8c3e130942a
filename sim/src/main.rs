//! `muxflow-sim`: replays a GPU cluster under several sharing policies and
//! prints their figures side by side. With no arguments it replays the
//! shipped default (sim/data/). Options and the model: sim/README.md.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use muxflow_sim::input::Source;
use muxflow_sim::output::{self, InputFigures};
use muxflow_sim::{Inputs, PolicyKind, RunOptions, Settings};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Replays a GPU cluster through muxflow's production decision code under several sharing policies",
    after_help = "Defaults: the shipped Alibaba OpenB node list and task mix, Philly run times and \
Gavel's V100 pair table (sim/data/). The model and every figure's meaning: sim/README.md."
)]
struct Cli {
    /// Node list CSV (columns sn, gpu, model).
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Task mix CSV (columns name, num_gpu, gpu_milli, gpu_spec, qos).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Offline run times CSV (column runtime, seconds alone on a GPU).
    #[arg(long)]
    offline_runtimes: Option<PathBuf>,
    /// Measured pair throughputs CSV (job_a, job_b, solo_a, solo_b, shared_a, shared_b).
    #[arg(long)]
    interference: Option<PathBuf>,
    /// Simulated days.
    #[arg(long, default_value_t = 7.0)]
    days: f64,
    /// Fraction of the GPUs that hold an online service.
    #[arg(long, default_value_t = 0.8)]
    online_fill: f64,
    /// Offline demand as a multiple of the online GPUs' count.
    #[arg(long, default_value_t = 1.0)]
    offline_load: f64,
    /// Policies to replay, comma-separated: exclusive, time-sharing, priority, muxflow.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "exclusive,time-sharing,priority,muxflow"
    )]
    policies: Vec<String>,
    /// Seed of the offline arrivals (same inputs and seed: same output).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// muxflow config (TOML) whose [policy], [health] and [matcher] drive the replay (default: the built-in defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Seconds between matcher rounds (default: the config's matcher.interval_s, the daemon's: 60 built in).
    #[arg(long)]
    round_interval: Option<f64>,
    /// Seconds between health checks.
    #[arg(long, default_value_t = 300.0)]
    health_interval: f64,
    /// Online services scale with their load: replicas started and stopped at each hourly load step, placed as Slurm places an online job; offline jobs where one lands are requeued (sim/README.md, "Services that come and go").
    #[arg(long)]
    autoscale: bool,
    /// Offline jobs checkpoint every this many seconds of progress at full speed (--autoscale: a requeue loses the work since).
    #[arg(long, default_value_t = 3600.0)]
    checkpoint_interval: f64,
    /// Seconds an offline job's checkpoint takes to write.
    #[arg(long, default_value_t = 20.0)]
    checkpoint_save: f64,
    /// Offline jobs checkpoint when warned of a requeue, within --requeue-grace; without, they lose the work since their last periodic checkpoint.
    #[arg(long)]
    checkpoint_on_requeue: bool,
    /// Longest warning before a requeue, seconds (the plugin's cap).
    #[arg(long, default_value_t = 25.0)]
    requeue_grace: f64,
    /// The online load the offline side's measured slowdowns apply at: now (each hour's load: the slowdown in proportion to it, the simulated GPU's closed loop at 0.1 to 1 of the service's rate) or peak (every hour as measured, both jobs busy).
    #[arg(long, value_enum, default_value_t = muxflow_sim::scenario::PairLoad::Now)]
    pair_load: muxflow_sim::scenario::PairLoad,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write hourly figures per policy to this CSV.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// Draw utilization over time and the offline JCT CDF to this SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Leave out the matcher's wall-clock time (the one figure that differs between equal runs).
    #[arg(long)]
    no_timing: bool,
    /// muxflow's matcher keeps the default predictor (learns nothing from the records), for comparison.
    #[arg(long)]
    default_predictor: bool,
    /// Matcher rounds exact on their candidate graphs only, each one cold (no pricing, no round cache; default: priced out over every (job, GPU) pair, incremental, as the daemon's).
    #[arg(long)]
    candidates_only: bool,
    /// xCUDA's protection under the muxflow policies, as the closed loop measured it on the simulated GPU (sim/data/protection.toml): measured (each GPU by its model: T4 and A10 as t4-like, the others as h200-like), none (the unprotected pairs), t4-like, h100-like or h200-like (every GPU).
    #[arg(long, default_value = "measured")]
    protection: muxflow_sim::protection::Choice,
    /// muxflow's pairing vs oracle over every this many matcher rounds: the oracle's round (the true values) costs as much as the learned one and decides nothing (1: every round).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    oracle_every: u32,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Score the production predictor on a measured pair table: history from
    /// a random fraction of its pairs (AdminComment records, launches/s, no
    /// run alone), hidden pairs scored; last line `mae=X pairing=Y
    /// default_pairing=Z`. Model and assumptions: sim/src/predictor.rs.
    Predictor {
        /// Measured pair throughputs CSV (default: the shipped Gavel V100 table).
        #[arg(long)]
        interference: Option<PathBuf>,
        /// Fraction of the offline x online pairs that ran.
        #[arg(long, default_value_t = 0.2)]
        observed: f64,
        /// Random splits (seeds 1..=N), figures averaged.
        #[arg(long, default_value_t = 10)]
        seeds: u64,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The man page's sections beyond `--help`.
const PAGE: muxflow::man::Page = muxflow::man::Page {
    section: "1",
    files: &[
        (
            "/usr/share/doc/muxflow-sim/README.md",
            "the replay's model, its inputs and every figure's meaning",
        ),
        (
            "/usr/share/doc/muxflow-sim/replay.md",
            "what the replay shows of a whole cluster",
        ),
    ],
    // None is read; the progress bar is drawn only when stderr is a terminal.
    environment: &[],
    signals: &[],
    examples: &[
        (
            "muxflow-sim",
            "the shipped default: OpenB's nodes, 80% online, 7 days, four policies",
        ),
        (
            "muxflow-sim --plot week.svg --json",
            "the table as JSON, and GPU utilization and JCT plotted",
        ),
        (
            "muxflow-sim predictor",
            "the production predictor scored on the measured pair table",
        ),
    ],
    see_also: &["muxflow-matcher(8)", "muxflow-report(1)"],
};

fn main() -> anyhow::Result<()> {
    let cli: Cli = muxflow::man::parse_or_print(&PAGE);
    if let Some(Command::Predictor {
        interference,
        observed,
        seeds,
        json,
    }) = &cli.command
    {
        let bytes = interference.as_deref().map(read).transpose()?;
        let source = match (&bytes, interference) {
            (Some(b), Some(p)) => Source {
                name: p.display().to_string(),
                bytes: b.as_slice(),
            },
            _ => Inputs::shipped().pairs,
        };
        let pairs = muxflow_sim::input::read_pairs(&source)?;
        let report = muxflow_sim::predictor::run(&pairs, *observed, *seeds)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if *json {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).expect("serializes")
            );
        } else {
            print!("{}", report.table());
        }
        return Ok(());
    }
    let policies = cli
        .policies
        .iter()
        .map(|p| PolicyKind::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--policies: {e}"))?;
    if policies.is_empty() {
        anyhow::bail!("--policies: name at least one policy");
    }
    let config = match &cli.config {
        Some(p) => muxflow::Config::load(p)
            .with_context(|| format!("loading the muxflow config {}", p.display()))?,
        None => muxflow::Config::default(),
    };
    let settings = Settings {
        days: cli.days,
        online_fill: cli.online_fill,
        offline_load: cli.offline_load,
        seed: cli.seed,
        round_interval_s: cli
            .round_interval
            .unwrap_or(config.matcher.interval_s as f64),
        health_interval_s: cli.health_interval,
        autoscale: cli.autoscale,
        checkpoint: muxflow_sim::scenario::Checkpointing {
            interval_s: cli.checkpoint_interval,
            save_s: cli.checkpoint_save,
            on_requeue: cli.checkpoint_on_requeue,
            grace_s: cli.requeue_grace,
        },
        pair_load: cli.pair_load,
    };
    let files: Vec<Option<Vec<u8>>> = [
        &cli.nodes,
        &cli.trace,
        &cli.offline_runtimes,
        &cli.interference,
    ]
    .iter()
    .map(|p| p.as_deref().map(read).transpose())
    .collect::<anyhow::Result<_>>()?;
    let shipped = Inputs::shipped();
    let pick = |i: usize, path: &Option<PathBuf>, default: &Source<'static>| match (&files[i], path)
    {
        (Some(bytes), Some(p)) => Source {
            name: p.display().to_string(),
            bytes: bytes.as_slice(),
        },
        _ => default.clone(),
    };
    let inputs = Inputs {
        nodes: pick(0, &cli.nodes, &shipped.nodes),
        trace: pick(1, &cli.trace, &shipped.trace),
        runtimes: pick(2, &cli.offline_runtimes, &shipped.runtimes),
        pairs: pick(3, &cli.interference, &shipped.pairs),
    };
    let scenario = muxflow_sim::prepare(&inputs, &settings)?;

    let progress = AtomicU64::new(0);
    let total = (scenario.end_s / 3600.0).ceil() as u64 * 3600 * policies.len() as u64;
    let opts = RunOptions {
        timing: !cli.no_timing,
        default_predictor: cli.default_predictor,
        candidates_only: cli.candidates_only,
        protection: cli.protection.clone(),
        oracle_every: cli.oracle_every,
    };
    let outcomes = std::thread::scope(|s| {
        let work = s.spawn(|| {
            muxflow_sim::simulate(&scenario, &policies, &config, &settings, &opts, &progress)
        });
        show_progress(&work, &progress, total);
        work.join().expect("the replay panicked")
    });

    let names = [
        &inputs.nodes.name,
        &inputs.trace.name,
        &inputs.runtimes.name,
        &inputs.pairs.name,
    ]
    .map(|s| s.as_str());
    let input_figures = InputFigures::of(&scenario, &settings, names);
    if let Some(path) = &cli.timeline {
        std::fs::write(path, output::timeline_csv(&outcomes))
            .with_context(|| format!("writing the timeline {}", path.display()))?;
    }
    if let Some(path) = &cli.plot {
        let svg =
            output::plot_svg(&outcomes).map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        std::fs::write(path, svg)
            .with_context(|| format!("writing the plot {}", path.display()))?;
    }
    if cli.json {
        println!("{}", output::json(&outcomes, &input_figures));
    } else {
        print!("{}", output::table(&outcomes, &input_figures));
    }
    Ok(())
}

/// A progress bar on stderr, only when stderr is a terminal and the replay
/// has run for more than a second.
fn show_progress<T>(work: &std::thread::ScopedJoinHandle<'_, T>, progress: &AtomicU64, total: u64) {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {percent}% simulated time")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut shown = false;
    while !work.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if tty && !shown && started.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_position(progress.load(Ordering::Relaxed).min(total));
    }
    if shown {
        bar.finish_and_clear();
    }
}
