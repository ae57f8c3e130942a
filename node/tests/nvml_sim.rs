//! The two-sample NVML read (`nvml::read_with_gpm_gap`, the GPM reading the
//! node's sampler publishes) on the simulated GPU while a trainer runs: SM
//! activity comes from two GPM samples far enough apart
//! for the GPU to have refreshed its counters (`GPM_MIN_GAP`); closer samples
//! read 0, as on a real H100 (real-gpu/README.md).

use std::time::{Duration, Instant};

use muxflow_node::nvml::{self, GpuRead, Reading};
use muxflow_simgpu::testing::{built, SimRoot};

fn read(lib: &std::path::Path, gpm_gap: Duration) -> Reading {
    let t = nvml::read_with_gpm_gap(Some(lib), Duration::ZERO, gpm_gap).expect("NVML read");
    match &t.gpus[0].1 {
        GpuRead::Ok(r) => r.clone(),
        other => panic!("GPU 0: {other:?}"),
    }
}

#[test]
fn sm_activity_is_read_over_the_gpus_refresh_period() {
    let sim = SimRoot::new(1);
    let lib = sim.lib().join("libnvidia-ml.so.1");
    let mut trainer = sim
        .command(&built("muxflow-workload"))
        .args(["offline", "--duration", "20", "--blocks", "132"])
        .spawn()
        .expect("start muxflow-workload");
    let pid = trainer.id();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !read(&lib, Duration::ZERO)
        .processes
        .iter()
        .any(|p| p.pid == pid)
    {
        assert!(
            Instant::now() < deadline,
            "the trainer never showed in NVML"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let r = read(&lib, muxflow::policy::health::GPM_MIN_GAP);
    let sm = r.metrics.sm_activity_pct.expect("GPM SM activity");
    assert!(sm > 50.0, "SM activity {sm} beside a trainer on every SM");
    let short = read(&lib, Duration::from_millis(2));
    assert_eq!(short.metrics.sm_activity_pct, Some(0.0), "2 ms apart");
    // The board's power limit (the share policy's test of a power-capped
    // board): the simulated GPU's default mode models a 70 W T4.
    assert_eq!(r.power_limit_w, Some(70));

    let _ = trainer.kill();
    let _ = trainer.wait();
}
