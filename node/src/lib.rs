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
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// muxflow-health only: report what is wrong on stdout and exit 1
    /// instead of draining (for an NHC check, which drains with its own
    /// reason); exit 0 when healthy or when muxflow itself failed.
    #[arg(long)]
    pub report: bool,
}

impl Cli {
    /// The command line of node program `program` (its `--version` names
    /// it; `--print-man-page` prints its page, [`program_page`]).
    pub fn parse_for(program: &'static str) -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let (about, long_about, page) = program_page(program);
        let cmd = Cli::command()
            .name(program)
            .about(about)
            .long_about(long_about)
            .after_help(NODE_PROGRAM_NOTES);
        let matches = muxflow::man::print_if_asked(cmd, &page);
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// What every node program's page says of how it fails.
const NODE_PROGRAM_NOTES: &str = "Exit status: 0, also when muxflow itself failed (logged to \
[paths] node_log): a node program never fails a job or drains a node for muxflow's own \
errors. muxflow-health drains a node only for a lost GPU; with --report it prints the \
problems and exits 1 instead.";

/// The environment slurmd gives a node program, as its pages list it.
const SLURMD_ENVIRONMENT: &[(&str, &str)] = &[
    (
        "SLURM_CONF",
        "the slurm.conf in use; muxflow.toml is looked for beside it first",
    ),
    ("SLURM_JOB_ID", "the job the Prolog or Epilog runs for"),
    (
        "SLURMD_NODENAME",
        "this node's Slurm name (expands {node} in muxflow.toml's paths)",
    ),
    (
        "SPANK_MUXFLOW_MODE",
        "the job's mode, online or offline, as the plugin exported it at submit",
    ),
    (
        "MUXFLOW_LOG",
        "log filter (error, warn, info, debug; default info)",
    ),
];

/// The files every node program reads or writes (the defaults of
/// muxflow.toml's [paths]).
const NODE_FILES: &[(&str, &str)] = &[
    (
        "/etc/slurm/muxflow.toml",
        "the configuration (muxflow.toml(5))",
    ),
    (
        "/var/log/muxflow/node.log",
        "the node programs' log ([paths] node_log)",
    ),
    (
        "/var/lib/muxflow",
        "each GPU's health state and the jobs on it ([paths] state_dir)",
    ),
    (
        "/run/muxflow/mps",
        "each GPU's MPS pipe directory ([paths] mps_pipe_root)",
    ),
    (
        "/var/log/muxflow/mps",
        "each GPU's MPS log directory ([paths] mps_log_root)",
    ),
];

const NODE_SEE_ALSO: &[&str] = &[
    "muxflow-prolog(8)",
    "muxflow-epilog(8)",
    "muxflow-health(8)",
    "muxflow-police(8)",
    "muxflow-sampler(8)",
    "muxflow-doctor(8)",
    "muxflow.toml(5)",
    "spank-muxflow(8)",
    "slurm.conf(5)",
];

/// Node program `program`'s one-line purpose, its description, and its
/// man page's sections (section 8: run by slurmd as root).
pub fn program_page(program: &str) -> (&'static str, &'static str, muxflow::man::Page) {
    let page = |examples| muxflow::man::Page {
        section: "8",
        files: NODE_FILES,
        environment: SLURMD_ENVIRONMENT,
        signals: &[],
        examples,
        see_also: NODE_SEE_ALSO,
    };
    match program {
        "muxflow-prolog" => (
            "muxflow's Prolog: starts the MPS daemons of a muxflow job's GPUs and records the job",
            "muxflow's Prolog, run by slurmd as root when a job is allocated (slurm.conf \
Prolog=/etc/slurm/prolog.d/* with PrologFlags=Alloc, through the drop-in \
/etc/slurm/prolog.d/50-muxflow). For a muxflow job it makes sure each of the job's GPUs \
has its MPS control daemon (multi-user where the config and GPU allow), records the job \
on the GPU, starts muxflow-police for an offline job, and steps the GPUs' health state \
machine. Jobs without --muxflow are left alone.",
            page(&[(
                "Prolog=/etc/slurm/prolog.d/*",
                "slurm.conf: runs every drop-in, muxflow's 50-muxflow among the site's own",
            )]),
        ),
        "muxflow-epilog" => (
            "muxflow's Epilog: forgets a muxflow job and stops a GPU's MPS daemon once no muxflow job is left on it",
            "muxflow's Epilog, run by slurmd as root when a job ends (slurm.conf \
Epilog=/etc/slurm/epilog.d/*, through the drop-in /etc/slurm/epilog.d/50-muxflow). It \
removes the job's record from its GPUs, stops a GPU's MPS control daemon once no muxflow \
job is left on it, and steps the GPUs' health state machine.",
            page(&[(
                "Epilog=/etc/slurm/epilog.d/*",
                "slurm.conf: runs every drop-in, muxflow's 50-muxflow among the site's own",
            )]),
        ),
        "muxflow-health" => (
            "muxflow's health check: steps each GPU's health state machine and publishes the GPU states",
            "muxflow's health check, run by slurmd as root every HealthCheckInterval \
(slurm.conf HealthCheckProgram=/usr/sbin/muxflow-health). It steps each GPU's health \
state machine (Healthy, Busy, Overloaded, Faulty, Recovering) from NVML, the kernel log's \
Xid records and the MPS logs, handles detected errors (resets an MPS client or server), \
and publishes the GPU states in the node's Extra for the matcher, which places offline \
work only on Healthy GPUs. It drains a node only for a lost GPU. With NHC, use \
--report from NHC's check instead (etc/nhc/muxflow.nhc).",
            page(&[
                (
                    "HealthCheckProgram=/usr/sbin/muxflow-health",
                    "slurm.conf: with HealthCheckInterval=60 and HealthCheckNodeState=ANY",
                ),
                (
                    "muxflow-health --report",
                    "as NHC's check_muxflow runs it: one line per problem, exit 1, no drain",
                ),
            ]),
        ),
        "muxflow-police" => (
            "muxflow's police: keeps an offline job's processes within its limits",
            "Started by the Prolog for each offline job, as root; it checks the job's \
processes against its limits every [health] police_interval_ms until the Epilog has \
forgotten the job: a process out of bounds (relaunched in a loop, on a GPU the job was \
not placed on, without xCUDA) is terminated and the reason recorded (policed=... in the job's \
AdminComment); after [health] police_cancel_after of them the job is cancelled. Not \
meant to be run by hand.",
            page(&[(
                "muxflow-report JOBID",
                "shows what the police did to a job (its policed= figures)",
            )]),
        ),
        "muxflow-sampler" => (
            "muxflow's SM activity sampler: one per node, for the health checks and the police",
            "The node's one SM activity sampler, started by the health steps and \
muxflow-police when none runs, as root; it samples the GPUs' SM activity for the \
health checks and the police, and exits once the node has not needed it for \
[health] sampler_linger_s. Not meant to be run by hand.",
            page(&[(
                "muxflow-doctor",
                "checks the node's installation, the programs' paths and directories among it",
            )]),
        ),
        _ => (
            "a muxflow node program",
            "a muxflow node program",
            muxflow::man::Page::bare("8"),
        ),
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
