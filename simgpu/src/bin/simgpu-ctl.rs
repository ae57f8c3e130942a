//! simgpu-ctl: create, inspect and script simulated GPUs.

use clap::{Parser, Subcommand};
use muxflow_simgpu::faults::{self, Fault};
use muxflow_simgpu::{state, telemetry, GpuConfig};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "simgpu-ctl",
    about = "Control the simulated GPUs (a model, not real hardware)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create the state layout (flat, or nodes/node1..N with --nodes).
    Init {
        dir: PathBuf,
        #[arg(long)]
        gpus: u32,
        #[arg(long)]
        nodes: Option<u32>,
        #[arg(long, default_value_t = 132)]
        sm_count: u32,
        #[arg(long, default_value_t = 81559)]
        memory_mib: u64,
        #[arg(long, default_value_t = 1980)]
        max_sm_clock_mhz: u32,
        #[arg(long, default_value = "NVIDIA H100 80GB HBM3 (simulated)")]
        name: String,
        /// Telemetry window in ms.
        #[arg(long, default_value_t = 1000)]
        window_ms: u64,
        /// Contention mode: t4-like (power capping), h100-like (clock flat,
        /// shared-path slowdown) or h200-like (that, fitted to an H200, and a
        /// dispatch queue). simgpu/README.md, "The contention model".
        #[arg(long, default_value = "t4-like")]
        model: muxflow_simgpu::config::GpuModel,
    },
    /// Print a telemetry table of every simulated GPU.
    Table { dir: PathBuf },
    /// Inject a fault: sticky | xid CODE | lost | clear.
    Fault {
        dir: PathBuf,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        gpu: u32,
        /// Only this client (sticky / clear); default: every current client.
        #[arg(long)]
        pid: Option<i32>,
        kind: String,
        code: Option<u64>,
    },
    /// Set a constant external load (fraction of SMs busy, 0..1) on a GPU.
    Load {
        dir: PathBuf,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        gpu: u32,
        fraction: f64,
    },
    /// The version the simulated control daemon prints for `-v` (CUDA's
    /// number, e.g. 13010: static SM partitioning, `-S`, needs 13010+), or
    /// `none`: no `-v` and no `-S`, as before.
    MpsVersion { dir: PathBuf, version: String },
    /// Give a node's simulated kernel the cgroup v2 dmem controller (on), or
    /// take it away (off): simgpu/README.md, "The dmem model".
    Dmem {
        dir: PathBuf,
        #[arg(long)]
        node: Option<String>,
        /// on | off
        state: String,
    },
}

fn node_dir(dir: &std::path::Path, node: Option<&str>) -> PathBuf {
    match node {
        Some(n) => dir.join("nodes").join(n),
        None => dir.to_path_buf(),
    }
}

fn run() -> Result<(), String> {
    match Cli::parse().cmd {
        Cmd::Init {
            dir,
            gpus,
            nodes,
            sm_count,
            memory_mib,
            max_sm_clock_mhz,
            name,
            window_ms,
            model,
        } => {
            let mut t = GpuConfig::h100_like(0, 0);
            t.sm_count = sm_count;
            t.memory_mib = memory_mib;
            t.max_sm_clock_mhz = max_sm_clock_mhz;
            t.name = name;
            t.window_ms = window_ms;
            t.model = model;
            state::init(&dir, gpus, nodes, &t).map_err(|e| e.to_string())?;
        }
        Cmd::Table { dir } => {
            println!(
                "{:<8} {:>3} {:>6} {:>6} {:>11} {:>17} {:>7}  clients(pid:prio)",
                "node", "gpu", "util%", "smact%", "clock MHz", "mem MiB", "state"
            );
            let now = muxflow_simgpu::now_ns();
            for (node, d) in state::all_nodes(&dir).map_err(|e| e.to_string())? {
                for g in &d.gpus {
                    let gpu = d.open_gpu(g.index).map_err(|e| e.to_string())?;
                    let r = telemetry::read(g, &gpu, now);
                    let clients: Vec<String> = r
                        .clients
                        .iter()
                        .map(|c| format!("{}:{}", c.pid, c.priority))
                        .collect();
                    println!(
                        "{:<8} {:>3} {:>6.1} {:>6.1} {:>5}/{:<5} {:>8}/{:<8} {:>7}  {} [{}]",
                        if node.is_empty() { "-" } else { &node },
                        g.index,
                        r.utilization * 100.0,
                        r.sm_activity * 100.0,
                        r.sm_clock_mhz,
                        r.max_sm_clock_mhz,
                        r.mem_used >> 20,
                        r.mem_total >> 20,
                        if r.lost {
                            "LOST"
                        } else if r.clients.iter().any(|c| c.sticky != 0) {
                            "FAULT"
                        } else {
                            "ok"
                        },
                        r.clients.len(),
                        clients.join(" ")
                    );
                }
            }
        }
        Cmd::Fault {
            dir,
            node,
            gpu,
            pid,
            kind,
            code,
        } => {
            let fault = match (kind.as_str(), code) {
                ("sticky", _) => Fault::Sticky,
                ("xid", Some(c)) => Fault::Xid(c),
                ("lost", _) => Fault::Lost,
                ("clear", _) => Fault::Clear,
                _ => return Err("fault kind: sticky | xid <code> | lost | clear".into()),
            };
            let d = muxflow_simgpu::SimDir::open(&node_dir(&dir, node.as_deref()))
                .map_err(|e| e.to_string())?;
            let g = d.open_gpu(gpu).map_err(|e| e.to_string())?;
            let pids = faults::inject(&d, gpu, &g, fault, pid);
            println!("fault={fault:?} gpu={gpu} pids={pids:?}");
        }
        Cmd::Load {
            dir,
            node,
            gpu,
            fraction,
        } => {
            let d = muxflow_simgpu::SimDir::open(&node_dir(&dir, node.as_deref()))
                .map_err(|e| e.to_string())?;
            let g = d.open_gpu(gpu).map_err(|e| e.to_string())?;
            g.lock().external_ppm = (fraction.clamp(0.0, 1.0) * 1e6) as u32;
            d.event(gpu, &format!("event=external_load fraction={fraction}"));
        }
        Cmd::MpsVersion { dir, version } => {
            let file = dir.join("mps_version");
            match version.as_str() {
                "none" => {
                    let _ = std::fs::remove_file(&file);
                }
                v if v.parse::<u32>().is_ok() => std::fs::write(&file, format!("{v}\n"))
                    .map_err(|e| format!("{}: {e}", file.display()))?,
                other => {
                    return Err(format!(
                        "mps-version: '{other}' is neither a number nor none"
                    ))
                }
            }
            println!("mps_version={version}");
        }
        Cmd::Dmem { dir, node, state } => {
            let d = muxflow_simgpu::SimDir::open(&node_dir(&dir, node.as_deref()))
                .map_err(|e| e.to_string())?;
            let done = match state.as_str() {
                "on" => muxflow_simgpu::dmem::enable(&d.root, &d.gpus),
                "off" => muxflow_simgpu::dmem::disable(&d.root),
                other => return Err(format!("dmem: '{other}' is neither on nor off")),
            };
            done.map_err(|e| format!("dmem {state}: {e}"))?;
            println!(
                "dmem={state} root={}",
                muxflow_simgpu::dmem::cgroup_root(&d.root).display()
            );
        }
    }
    Ok(())
}

fn main() {
    // Die quietly on a closed pipe (`simgpu-ctl table | head`), like other CLIs.
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    if let Err(e) = run() {
        eprintln!("simgpu-ctl: {e}");
        std::process::exit(1);
    }
}
