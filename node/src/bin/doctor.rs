//! `muxflow-doctor`: checks this node's muxflow installation (run as root
//! on the node), or with `--controller` the controller host's. One line per
//! check, `ok` or `FAIL … ; fix: …` (or JSON with `--json`); exit 1 when
//! any check failed, 2 when it could not run at all. See
//! `muxflow_node::doctor`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::Parser;
use muxflow_node::doctor::{self, Check, Inputs};

#[derive(Debug, Parser)]
#[command(
    name = "muxflow-doctor",
    version = muxflow_slurm::version::program_version(),
    about = "Checks this node's (or the controller's) muxflow installation",
    long_about = "Checks this node's muxflow installation, as root on the node: the plugstack \
line (required, its config= the file in use) and the Slurm release the build is for, \
JobSubmitPlugins and GresTypes, the Prolog, Epilog and health-check wiring, this node's \
NodeName line and its Gres= against gres.conf's GPUs and offline slots, the MPS control \
program and its multi-user mode, NVML, xCUDA, the driver's limits (SM partitions, MPS v3, \
dmem), the state, pipe and log directories (root-owned, not writable by users), and \
whether the pipe directories keep ACLs (only users with a job on a GPU reach its MPS \
daemon). With --controller, on the slurmctld host instead: JobSubmitPlugins and GresTypes, \
job_submit.lua beside slurm.conf, the matcher running and rounding, and its shape file \
fresh where job_submit.lua reads it. One line per check, `ok` or `FAIL ...; fix: ...`.",
    after_help = "Exit status: 0 when every check passed, 1 when any failed, 2 when the \
doctor could not run.\n\nJSON (--json): {\"checks\": [{\"name\", \"ok\", \"detail\", \"fix\"}], \
\"failed\": N}; where the doctor could not run, {\"error\": \"...\"}."
)]
struct Cli {
    /// muxflow config file [default: muxflow.toml beside the slurm.conf,
    /// else /etc/slurm/muxflow.toml].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// slurm.conf [default: $SLURM_CONF, else /etc/slurm/slurm.conf].
    #[arg(long, value_name = "FILE")]
    slurm_conf: Option<PathBuf>,
    /// This node's Slurm name (its NodeName in slurm.conf) [default: the
    /// short host name].
    #[arg(long, value_name = "NAME", conflicts_with = "controller")]
    node: Option<String>,
    /// Check the controller host (slurmctld and the matcher) instead of a node.
    #[arg(long)]
    controller: bool,
    /// Print the checks as JSON instead of lines.
    #[arg(long)]
    json: bool,
}

/// The man page's sections beyond `--help`.
const PAGE: muxflow::man::Page = muxflow::man::Page {
    section: "8",
    files: &[
        ("/etc/slurm/slurm.conf", "Slurm's configuration: JobSubmitPlugins, GresTypes, PlugStackConfig, Prolog, Epilog, HealthCheckProgram, PrologFlags and this node's NodeName line (Include files are followed)"),
        ("/etc/slurm/plugstack.conf", "and plugstack.conf.d/: the plugin's line"),
        ("/etc/slurm/gres.conf", "this node's GPUs and offline slots"),
        ("/etc/slurm/muxflow.toml", "muxflow's configuration (muxflow.toml(5))"),
        ("/etc/slurm/job_submit.lua", "with --controller: muxflow's job_submit.lua, beside slurm.conf"),
        ("/var/lib/muxflow-matcher/cluster-shape", "with --controller: the matcher's shape file ([matcher] shape_file)"),
    ],
    environment: &[
        ("SLURM_CONF", "the slurm.conf to check when --slurm-conf is not given"),
    ],
    signals: &[],
    examples: &[
        ("muxflow-doctor", "checks this node, one line per check"),
        ("muxflow-doctor --node gpu01", "checks this host as the Slurm node gpu01 (where the host name is not its NodeName)"),
        ("muxflow-doctor --controller", "checks the controller host: job_submit.lua, the matcher and its shape file"),
        ("muxflow-doctor --json | jq '.checks[] | select(.ok | not)'", "the failed checks, for monitoring"),
    ],
    see_also: &[
        "muxflow.toml(5)",
        "muxflow-matcher(8)",
        "muxflow-health(8)",
        "spank-muxflow(8)",
        "slurm.conf(5)",
        "gres.conf(5)",
    ],
};

fn main() {
    let cli: Cli = muxflow::man::parse_or_print(&PAGE);
    let json = cli.json;
    match run(cli) {
        Ok(checks) => {
            let failed = checks.iter().filter(|c| c.fix.is_some()).count();
            if json {
                let list: Vec<serde_json::Value> = checks
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "name": c.name,
                            "ok": c.fix.is_none(),
                            "detail": c.detail,
                            "fix": c.fix,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({ "checks": list, "failed": failed })
                );
            } else {
                for c in &checks {
                    println!("{}", c.line());
                }
            }
            std::process::exit(i32::from(failed > 0));
        }
        Err(e) => {
            if json {
                println!("{}", serde_json::json!({ "error": format!("{e:#}") }));
            } else {
                println!("FAIL doctor: {e:#}");
            }
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<Vec<Check>> {
    let slurm_conf = cli
        .slurm_conf
        .or_else(muxflow::config::slurm_conf::discover)
        .unwrap_or_else(|| PathBuf::from(muxflow::config::slurm_conf::DEFAULT_SLURM_CONF));
    let (path, config) = muxflow::Config::find(cli.config.as_deref(), Some(&slurm_conf))?;
    let mut checks = vec![Check {
        name: "config",
        fix: None,
        detail: path.display().to_string(),
    }];
    if cli.controller {
        let inputs = Inputs {
            config: &config,
            config_path: &path,
            slurm_conf: &slurm_conf,
        };
        let now_s = muxflow::records::sm_page::now_ms() / 1000;
        checks.extend(doctor::controller::run(&inputs, now_s));
        return Ok(checks);
    }
    let node = match cli.node {
        Some(n) => n,
        None => {
            let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("reading the host name; give --node")?;
            h.trim().split('.').next().unwrap_or("").to_string()
        }
    };
    let config = config.for_node(&node)?;
    let slurmd_v = Command::new("slurmd")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let inputs = Inputs {
        config: &config,
        config_path: &path,
        slurm_conf: &slurm_conf,
    };
    checks.extend(doctor::run(&inputs, &node, &slurmd_v));
    Ok(checks)
}
