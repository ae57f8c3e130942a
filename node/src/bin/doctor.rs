//! `muxflow-doctor`: checks this node's muxflow installation (run as root
//! on the node). One line per check, `ok` or `FAIL … ; fix: …`; exit 1 when
//! any check failed, 2 when it could not run at all. See
//! `muxflow_node::doctor`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "muxflow-doctor",
    version = muxflow_slurm::version::program_version(),
    about = "Checks this node's muxflow installation",
    long_about = "Checks this node's muxflow installation, as root on the node: the plugstack \
line and the Slurm release the build is for, the Prolog, Epilog and health-check wiring, \
gres.conf's offline slots, the MPS control program and its multi-user mode, NVML, xCUDA, \
the driver's limits (SM partitions, MPS v3, dmem), and the state, pipe and log directories \
(root-owned, not writable by users). One line per check, `ok` or `FAIL ...; fix: ...`.",
    after_help = "Exit status: 0 when every check passed, 1 when any failed, 2 when the \
doctor could not run."
)]
struct Cli {
    /// muxflow config file [default: muxflow.toml beside the slurm.conf,
    /// else /etc/slurm/muxflow.toml].
    #[arg(long)]
    config: Option<PathBuf>,
    /// slurm.conf [default: $SLURM_CONF, else /etc/slurm/slurm.conf].
    #[arg(long)]
    slurm_conf: Option<PathBuf>,
    /// This node's Slurm name [default: the short host name].
    #[arg(long)]
    node: Option<String>,
}

fn main() {
    match run() {
        Ok(failed) => std::process::exit(i32::from(failed)),
        Err(e) => {
            println!("FAIL doctor: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let cli: Cli = muxflow::man::parse_or_print("8");
    let slurm_conf = cli
        .slurm_conf
        .or_else(muxflow::config::slurm_conf::discover)
        .unwrap_or_else(|| PathBuf::from(muxflow::config::slurm_conf::DEFAULT_SLURM_CONF));
    let node = match cli.node {
        Some(n) => n,
        None => {
            let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("reading the host name; give --node")?;
            h.trim().split('.').next().unwrap_or("").to_string()
        }
    };
    let (path, config) = muxflow::Config::find(cli.config.as_deref(), Some(&slurm_conf))?;
    let config = config.for_node(&node)?;
    println!("ok   config: {}", path.display());
    let slurmd_v = Command::new("slurmd")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let checks = muxflow_node::doctor::run(&config, &node, &slurm_conf, &slurmd_v);
    for c in &checks {
        println!("{}", c.line());
    }
    Ok(checks.iter().any(|c| c.fix.is_some()))
}
