//! Prints what an NVML read with its own two GPM samples
//! (`muxflow_node::nvml::read_with_gpm_gap`, the readings `muxflow-sampler`
//! publishes for the health check) sees, every `--every-ms` for `--seconds`: one `key=value` line per GPU
//! and sample. For checking the readings on a real GPU beside a known load
//! (`real-gpu/run`); the dev cluster's tests read the simulated GPU.
//!
//! ```text
//! cargo run --release -p muxflow-node --example nvml-sample -- --seconds 10
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use muxflow_node::nvml::{self, GpuRead};

#[derive(Parser)]
struct Cli {
    /// How long to sample.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Time between samples.
    #[arg(long, default_value_t = 250)]
    every_ms: u64,
    /// Time between the two GPM samples of a read [default: the sampler's,
    /// `muxflow::policy::health::GPM_MIN_GAP`].
    #[arg(long)]
    gpm_gap_ms: Option<u64>,
    /// libnvidia-ml to load [default: libnvidia-ml.so.1 from the loader's path].
    #[arg(long)]
    lib: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let start = Instant::now();
    let every = Duration::from_millis(cli.every_ms);
    let mut due = Duration::ZERO;
    while start.elapsed().as_secs_f64() < cli.seconds {
        let gap = cli
            .gpm_gap_ms
            .map_or(muxflow::policy::health::GPM_MIN_GAP, Duration::from_millis);
        let t = nvml::read_with_gpm_gap(cli.lib.as_deref(), Duration::ZERO, gap)?;
        let at = start.elapsed().as_secs_f64();
        for (i, read) in &t.gpus {
            match read {
                GpuRead::Ok(r) => {
                    let m = &r.metrics;
                    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
                    let procs: Vec<String> = r
                        .processes
                        .iter()
                        .map(|p| {
                            format!(
                                "{}:{}",
                                p.pid,
                                p.used_mib.map_or("-".into(), |m| m.to_string())
                            )
                        })
                        .collect();
                    println!(
                        "t={at:.2} gpu={i} util_pct={} sm_activity_pct={} sm_clock_fraction={} \
                         mem_used_mib={} mem_total_mib={} processes={}",
                        m.utilization_pct,
                        opt(m.sm_activity_pct),
                        opt(m.sm_clock_fraction),
                        r.mem_used_mib,
                        r.mem_total_mib,
                        if procs.is_empty() {
                            "-".into()
                        } else {
                            procs.join(",")
                        }
                    );
                }
                GpuRead::Lost => println!("t={at:.2} gpu={i} lost"),
                GpuRead::Failed(e) => println!("t={at:.2} gpu={i} failed={e:?}"),
            }
        }
        if !t.xids.is_empty() {
            println!("t={at:.2} xids={:?}", t.xids);
        }
        // On a fixed grid: a slow read does not stretch the next gap.
        due += every;
        std::thread::sleep(due.saturating_sub(start.elapsed()));
    }
    Ok(())
}
