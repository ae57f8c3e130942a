//! `muxflow-matcher`: pairs pending offline jobs with GPUs running online
//! jobs and steers Slurm to start them there.
//!
//! * `muxflow-matcher --once [--dry-run] [--json]`: one round; prints the
//!   decision table (or JSON; formats in the library's `round` module docs).
//! * `muxflow-matcher [--interval S]`: a round every `matcher.interval_s`
//!   seconds, one summary line logged per round; errors are logged and the
//!   next round retries (it keeps no state that matters). As a systemd
//!   service: `Type=notify` (ready once its config is read), SIGHUP re-reads
//!   the config before the next round (a bad config is logged and the
//!   previous one kept).
//! * `muxflow-matcher --evaluate [--sacct-json FILE | --synthetic N]`: on
//!   the history's pairs (offline job × online job), 1 in 5 held out: MAE
//!   and pairing quality of the default, row-col means and the model (the
//!   figures `muxflow-sim predictor` reports).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use muxflow_matcher::failed::{FailedPlacements, Remembering};
use muxflow_matcher::hints;
use muxflow_matcher::history::HistoryCache;
use muxflow_matcher::metrics::MatcherMetrics;
use muxflow_matcher::predict::{self, runs_from_sacct, Model};
use muxflow_matcher::reader::{parse_sacct, ClusterState, Names};
use muxflow_matcher::round::{plan_cached, Plan};
use muxflow_matcher::round_cache::RoundCache;
use muxflow_matcher::slurm::SlurmCli;

#[derive(Debug, Parser)]
#[command(
    version = muxflow_slurm::version::program_version(),
    about = "muxflow's matcher: places pending offline jobs next to online jobs",
    after_help = "Decision table columns: JOB NAME ACTION NODE GPU SPEED REASON. ACTION: place \
(hint written), keep (already placed there), park (hint cleared), none (stays parked). SPEED: \
predicted normalized throughput (speed there / speed with an idle partner) ± its standard \
deviation. --json prints {\"summary\": {...}, \"decisions\": [{job, name, user, action, node, gpu, \
predicted, confidence, reason}]}."
)]
struct Cli {
    /// muxflow config file [default: muxflow.toml beside $SLURM_CONF, else
    /// /etc/slurm/muxflow.toml].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Run one round and exit.
    #[arg(long)]
    once: bool,
    /// Decide but change nothing in Slurm.
    #[arg(long)]
    dry_run: bool,
    /// With --once: print the round as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds between rounds (default: matcher.interval_s).
    #[arg(long, value_name = "SECONDS")]
    interval: Option<u64>,
    /// Print the predictor's held-out error and pairing quality next to the baselines' and exit.
    #[arg(long)]
    evaluate: bool,
    /// With --evaluate: read history from this `sacct --json` file.
    #[arg(long, requires = "evaluate", value_name = "FILE")]
    sacct_json: Option<PathBuf>,
    /// With --evaluate: use N synthetic jobs' history (a contention model).
    #[arg(
        long,
        requires = "evaluate",
        conflicts_with = "sacct_json",
        value_name = "N"
    )]
    synthetic: Option<usize>,
}

/// The man page's sections beyond `--help`.
const PAGE: muxflow::man::Page = muxflow::man::Page {
    section: "8",
    files: &[
        ("/etc/slurm/muxflow.toml", "the configuration, [matcher] and [metrics] (muxflow.toml(5))"),
        ("/var/lib/muxflow-matcher/cluster-shape", "the cluster's shape, rewritten every round for job_submit.lua ([matcher] shape_file)"),
        ("/etc/default/muxflow-matcher", "the service's settings: MUXFLOW_MATCHER_ARGS, SLURM_CONF, RUST_LOG"),
        ("/usr/lib/systemd/system/muxflow-matcher.service", "the systemd unit (Type=notify, runs as SlurmUser)"),
        ("/usr/share/muxflow/job_submit.lua", "the job_submit.lua to install beside slurm.conf"),
        ("/usr/share/muxflow/prometheus/muxflow-alerts.yml", "example Prometheus alert rules on the matcher's metrics"),
    ],
    environment: &[
        ("SLURM_CONF", "the cluster's slurm.conf; muxflow.toml is looked for beside it first"),
        ("RUST_LOG", "log filter (error, warn, info, debug; default info); the log goes to stderr, the journal under the unit"),
        ("NOTIFY_SOCKET", "set by systemd: readiness (READY=1) once the config is read"),
    ],
    signals: &[
        ("SIGHUP", "re-reads muxflow.toml before the next round (systemctl reload); a bad file is logged and the previous settings kept"),
        ("SIGTERM", "stops at once; it keeps no state that matters, and the next start repairs the hints from Slurm"),
    ],
    examples: &[
        ("systemctl enable --now muxflow-matcher", "runs it as a service on the controller host"),
        ("sudo -u slurm muxflow-matcher --once --dry-run", "one round, printed as a table, nothing written to Slurm"),
        ("muxflow-matcher --once --dry-run --json", "the same as JSON"),
        ("muxflow-matcher --evaluate", "the predictor's held-out error on the cluster's finished jobs"),
    ],
    see_also: &[
        "muxflow-doctor(8)",
        "muxflow.toml(5)",
        "muxflow-report(1)",
        "spank-muxflow(8)",
        "scontrol(1)",
        "squeue(1)",
        "systemctl(1)",
    ],
};

fn main() -> anyhow::Result<()> {
    let cli: Cli = muxflow::man::parse_or_print(&PAGE);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colour codes only on a terminal: under systemd the journal (or a
        // file) would keep them as escape sequences in every line.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if cli.evaluate {
        return evaluate(&cli);
    }
    let config = load_config(&cli)?;
    let slurm = SlurmCli::new(&config);
    if cli.once {
        let plan = round(
            &config,
            &slurm,
            &mut HistoryCache::default(),
            &mut Kept::default(),
            cli.dry_run,
            Duration::from_secs(cli.interval.unwrap_or(config.matcher.interval_s).max(1)),
        )?;
        if cli.json {
            println!("{}", plan.json());
        } else {
            println!("{}", plan.table());
        }
        return Ok(());
    }
    let mut config = config;
    let mut slurm = slurm;
    let interval_of = |c: &muxflow::Config| {
        Duration::from_secs(cli.interval.unwrap_or(c.matcher.interval_s).max(1))
    };
    let mut interval = interval_of(&config);
    tracing::info!(?interval, dry_run = cli.dry_run, "muxflow-matcher looping");
    if let Err(e) = muxflow_matcher::service::watch_sighup() {
        tracing::warn!("no reload on SIGHUP: {e}");
    }
    // A listen address that cannot be bound is a config error: said before
    // systemd hears READY.
    let served = match config.metrics.listen_addr() {
        Some(addr) => {
            let endpoint = muxflow_matcher::metrics::serve(addr)?;
            if !addr.ip().is_loopback() {
                tracing::info!(%addr, "metrics endpoint reachable from other hosts ([metrics] listen)");
            }
            Some(endpoint)
        }
        None => None,
    };
    if let Err(e) = muxflow_matcher::service::notify("READY=1") {
        tracing::warn!("cannot tell systemd the matcher is ready: {e}");
    }
    // Only the sacct history is carried between rounds, as a cache.
    let mut history = HistoryCache::default();
    // And the last round, for an incremental next one (round_cache).
    let mut kept = Kept::default();
    let mut metrics = MatcherMetrics::new(muxflow_slurm::version::version_string());
    for n in 0u64.. {
        let start = Instant::now();
        match round(
            &config,
            &slurm,
            &mut history,
            &mut kept,
            cli.dry_run,
            interval,
        ) {
            Ok(plan) => {
                tracing::info!("{}", plan.summary_line());
                let now_s = muxflow::records::sm_page::now_ms() as f64 / 1000.0;
                metrics.round_done(&plan, start.elapsed().as_secs_f64(), now_s);
            }
            // The next round reads Slurm afresh.
            Err(e) => {
                tracing::error!("round failed: {e:#}");
                metrics.round_failed(start.elapsed().as_secs_f64());
            }
        }
        if served.is_some() || config.metrics.textfile_dir.is_some() {
            // The predictor's error trains several models: not every round.
            if n % EVALUATE_EVERY_ROUNDS == 0 {
                metrics.evaluated(predict::evaluate(&history.runs()));
            }
            let text = metrics.exposition().render();
            if let Some(dir) = &config.metrics.textfile_dir {
                // `{node}` (for the node programs) is this host here.
                let dir = dir.as_path().to_string_lossy().replace(
                    "{node}",
                    std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .unwrap_or_default()
                        .trim(),
                );
                if let Err(e) = muxflow::records::metrics::write_atomic(
                    std::path::Path::new(&dir),
                    muxflow_matcher::metrics::TEXTFILE,
                    &text,
                ) {
                    tracing::warn!("metrics textfile: {e}");
                }
            }
            if let Some(endpoint) = &served {
                endpoint.publish(text);
            }
        }
        // Sleep in slices, so a SIGHUP is acted on within a second.
        while start.elapsed() < interval && !muxflow_matcher::service::reload_requested() {
            std::thread::sleep(
                Duration::from_millis(200).min(interval.saturating_sub(start.elapsed())),
            );
        }
        if muxflow_matcher::service::take_reload() {
            let _ = muxflow_matcher::service::notify("RELOADING=1");
            match load_config(&cli) {
                Ok(c) => {
                    if c.metrics.listen_addr() != config.metrics.listen_addr() {
                        tracing::warn!(
                            "[metrics] listen changed: the endpoint moves at the next restart, not on SIGHUP"
                        );
                    }
                    slurm = SlurmCli::new(&c);
                    interval = interval_of(&c);
                    config = c;
                    // Weights may follow the config: the next round is cold.
                    kept = Kept::default();
                    tracing::info!(?interval, "config re-read (SIGHUP)");
                }
                Err(e) => tracing::error!("config not re-read, the previous one stays: {e:#}"),
            }
            let _ = muxflow_matcher::service::notify("READY=1");
        }
    }
    Ok(())
}

/// Rounds between two measurements of the predictor's error for metrics.
const EVALUATE_EVERY_ROUNDS: u64 = 10;

/// What the loop keeps from round to round besides the history: the
/// model and the runs it was trained on (trained again only when they
/// change, its epoch counting), and the round cache.
#[derive(Default)]
struct Kept {
    runs: Option<Vec<predict::Run>>,
    model: Model,
    epoch: u64,
    cache: RoundCache,
}

/// One round: read, predict, match, apply. `interval`: the time between
/// rounds in effect (`--interval` or `[matcher] interval_s`), which the
/// parked jobs' notes tell their users.
fn round(
    config: &muxflow::Config,
    slurm: &SlurmCli,
    history: &mut HistoryCache,
    kept: &mut Kept,
    dry_run: bool,
    interval: Duration,
) -> anyhow::Result<Plan> {
    let names = Names::from_config(&config.slurm);
    let (state, shapes) = slurm
        .read_state(&names)
        .context("reading jobs and nodes from Slurm")?;
    if !dry_run {
        let path = config.matcher.shape_file.as_path();
        // Submissions are only checked less: nothing else depends on it.
        if let Err(e) =
            muxflow_matcher::shape::write(path, &shapes, muxflow::records::sm_page::now_ms() / 1000)
        {
            tracing::warn!(
                "{e:#}; job_submit.lua refuses no never-placeable job until it is written"
            );
        }
    }
    for note in &state.notes {
        tracing::warn!("{note}");
    }
    // History is optional: without it every job gets the default prediction.
    if let Err(e) = slurm.refresh_history(history, config.matcher.history_days) {
        tracing::warn!("sacct history not refreshed ({e}); predicting from what was read before");
    }
    let runs = history.runs();
    if kept.runs.as_ref() != Some(&runs) {
        kept.model = Model::train(&runs);
        kept.runs = Some(runs);
        kept.epoch += 1;
    }
    // The cache keeps the plan too: this round's copy takes the update
    // failures' words.
    // What failed placements teach, from the same history: the GPUs'
    // models are read from the state, so it is rebuilt every round (one
    // pass over the runs).
    let models: BTreeMap<(&str, u32), u64> = (state.gpus.iter())
        .map(|g| ((g.node.as_str(), g.index), g.published.mem_mib))
        .collect();
    let failed = FailedPlacements::from_runs(kept.runs.as_deref().unwrap_or_default(), |n, i| {
        models.get(&(n, i)).copied()
    });
    let mut plan = std::sync::Arc::unwrap_or_clone(plan_cached(
        &state,
        &Remembering {
            model: &kept.model,
            failed: &failed,
        },
        &config.policy,
        &config.matcher,
        &names,
        &mut kept.cache,
        kept.epoch,
    ));
    tracing::debug!(kind = ?kept.cache.last, "round solved");
    if !dry_run {
        for d in &mut plan.decisions {
            // The owner's own Comment is kept; muxflow's says where it went.
            let comment = !state.user_comments.contains(&d.job);
            for call in d.update.iter().flatten() {
                let call = match comment {
                    true => &hints::with_placed_comment(call.clone()),
                    false => call,
                };
                if let Err(e) = slurm.scontrol(call) {
                    // The next round sees Slurm's real hints and retries.
                    tracing::warn!("job {}: {e}", d.job);
                    d.reason = format!("update failed ({e}); {}", d.reason);
                    break;
                }
            }
        }
        write_waiting_notes(config, slurm, &state, &plan, interval.as_secs());
    }
    Ok(plan)
}

/// Writes why each parked job waits into its AdminComment where that
/// changed ([`hints::note_args`]), within what the round's hint updates
/// left of `max_updates_per_round`: after a burst of submissions the rest
/// follow in the next rounds, and placements never wait for a note.
fn write_waiting_notes(
    config: &muxflow::Config,
    slurm: &SlurmCli,
    state: &ClusterState,
    plan: &Plan,
    interval_s: u64,
) {
    let since = muxflow_slurm::cli::slurm_time(std::time::SystemTime::now());
    let budget = plan.notes_budget(&config.matcher);
    let notes = plan.decisions.iter().filter_map(|d| {
        let job = state
            .pending
            .binary_search_by_key(&d.job, |p| p.id)
            .ok()
            .map(|k| &state.pending[k])?;
        let comment = !state.user_comments.contains(&job.id);
        hints::note_args(job, d.waiting?, &since, interval_s, comment)
    });
    for call in notes.take(budget) {
        if let Err(e) = slurm.scontrol(&call) {
            // Only words: the next round tries again.
            tracing::warn!("{}: waiting reason not written: {e}", call[1]);
        }
    }
}

/// The config `--config` names, else the one found beside the slurm.conf
/// in use or in /etc/slurm (the error lists where it looked).
fn load_config(cli: &Cli) -> anyhow::Result<muxflow::Config> {
    let slurm_conf = muxflow::config::slurm_conf::discover();
    let (path, config) = muxflow::Config::find(cli.config.as_deref(), slurm_conf.as_deref())?;
    tracing::debug!(config = %path.display(), "muxflow config");
    Ok(config)
}

fn evaluate(cli: &Cli) -> anyhow::Result<()> {
    let runs = if let Some(n) = cli.synthetic {
        predict::synthetic_runs(n, 12, 1)
    } else if let Some(path) = &cli.sacct_json {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        runs_from_sacct(&parse_sacct(&text).with_context(|| path.display().to_string())?)
    } else {
        let config = load_config(cli)?;
        SlurmCli::new(&config)
            .history(config.matcher.history_days)
            .context("reading offline history from sacct")?
    };
    println!("{}", predict::evaluate(&runs));
    Ok(())
}
