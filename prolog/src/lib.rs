//! Shared entry of muxflow's node programs (Prolog, Epilog, HealthCheckProgram).
//!
//! They run as root under slurmd. A Prolog that exits non-zero drains the
//! node and requeues the job, so muxflow's own failures are logged and the
//! program exits 0; only a deliberate, labelled decision may do otherwise.

use std::path::PathBuf;

use clap::Parser;
use muxflow::Config;

#[derive(Debug, Parser)]
pub struct Cli {
    /// muxflow config file.
    #[arg(long, default_value = muxflow::config::DEFAULT_PATH)]
    pub config: PathBuf,
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
            mode: std::env::var("SPANK_MUXFLOW_MODE")
                .ok()
                .and_then(|m| m.parse().ok()),
        }
    }
}

/// Runs `body` with logging set up and every error contained: the process
/// exits 0 whatever muxflow's own code did, after logging what went wrong.
pub fn run_contained(program: &str, body: impl FnOnce(&Config, &JobEnv) -> anyhow::Result<()>) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MUXFLOW_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(false)
        .init();
    let cli = Cli::parse();
    let env = JobEnv::from_env();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let config = Config::load(&cli.config)?;
        body(&config, &env)
    }));
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
