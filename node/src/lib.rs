//! Shared entry of muxflow's node programs (Prolog, Epilog, HealthCheckProgram).
//!
//! They run as root under slurmd. A Prolog that exits non-zero drains the
//! node and requeues the job, so muxflow's own failures are logged and the
//! program exits 0; only a deliberate, labelled decision may do otherwise.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::Parser;
use muxflow::Config;

#[derive(Debug, Parser)]
#[command(version = muxflow_slurm::version::program_version())]
pub struct Cli {
    /// muxflow config file [default: muxflow.toml beside the slurm.conf in
    /// use ($SLURM_CONF, or slurmd's), else /etc/slurm/muxflow.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// muxflow-health only: report what is wrong on stdout and exit 1
    /// instead of draining (for an NHC check, which drains with its own
    /// reason); exit 0 when healthy or when muxflow itself failed.
    #[arg(long)]
    pub report: bool,
}

impl Cli {
    /// The command line of node program `program` (its `--version` names it).
    pub fn parse_for(program: &'static str) -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().name(program).get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// The config file this program runs with, once found.
static CONFIG_PATH: OnceLock<PathBuf> = OnceLock::new();

/// The config file this program runs with (what `muxflow-police` is given).
pub fn config_path() -> Option<&'static Path> {
    CONFIG_PATH.get().map(PathBuf::as_path)
}

/// What a node program knows of the job it runs for, from slurmd's environment.
#[derive(Debug, Clone, Default)]
pub struct JobEnv {
    pub job_id: Option<String>,
    pub node: Option<String>,
    /// Exported by the plugin at submit (`SPANK_MUXFLOW_MODE`).
    pub mode: Option<muxflow::Mode>,
}

impl JobEnv {
    pub fn from_env() -> Self {
        JobEnv {
            job_id: std::env::var("SLURM_JOB_ID").ok(),
            node: std::env::var("SLURMD_NODENAME").ok(),
            mode: std::env::var(muxflow::mode::PROLOG_ENV_VAR)
                .ok()
                .and_then(|m| m.parse().ok()),
        }
    }
}

/// Runs `body` with logging set up and every error contained: the process
/// exits 0 whatever muxflow's own code did, after logging what went wrong.
/// `body` gets the config as this node uses it (`{node}` expanded). Logs go
/// to `paths.node_log` (slurmd drops a Prolog's output; the default path
/// when the config cannot be read) and to stderr.
pub fn run_contained(
    program: &'static str,
    body: impl FnOnce(&Config, &JobEnv) -> anyhow::Result<()>,
) {
    let cli = Cli::parse_for(program);
    let env = JobEnv::from_env();
    let slurm_conf = muxflow::config::slurm_conf::discover();
    let config = Config::find(cli.config.as_deref(), slurm_conf.as_deref())
        .map(|(path, c)| {
            let _ = CONFIG_PATH.set(path);
            c
        })
        .map_err(anyhow::Error::from)
        .and_then(|c| match &env.node {
            Some(node) => Ok(c.for_node(node)?),
            None => Ok(c),
        });
    init_logging(config.as_ref().ok());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&config?, &env)));
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(
            "{program}: {e:#} (job {:?}); continuing without muxflow",
            env.job_id
        ),
        Err(_) => tracing::error!(
            "{program}: internal error (panic) (job {:?}); continuing without muxflow",
            env.job_id
        ),
    }
}

fn init_logging(config: Option<&Config>) {
    use std::io::Write;
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("MUXFLOW_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Without a config (it cannot be read: the error to be logged), the
    // default node log, where an administrator looks first: slurmd drops
    // the programs' stderr.
    let default_log = muxflow::config::Paths::default().node_log;
    let path = config.map_or(default_log.as_path(), |c| c.paths.node_log.as_path());
    let file = (|| {
        std::fs::create_dir_all(path.parent()?).ok()?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    })();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    match file {
        Some(f) => {
            let file = std::sync::Mutex::new(f);
            let _ = builder.with_writer(std::io::stderr.and(file)).try_init();
        }
        None => {
            let _ = builder.with_writer(std::io::stderr).try_init();
            let _ = writeln!(
                std::io::stderr(),
                "muxflow: no node log; logging to stderr only"
            );
        }
    }
}

pub mod clients;
pub mod detector;
pub mod doctor;
pub mod gpu_caps;
pub mod job;
pub mod kmsg;
pub mod metrics;
pub mod nvml;
pub mod police;
pub mod publish;
pub mod record;
pub mod sampler;
pub mod sysmon;
