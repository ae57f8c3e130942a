//! An offline job running next to an online job on the dev cluster is
//! paused while its GPU is not Healthy and resumes when it is again: the
//! node health check writes the GPU's state, xCUDA (preloaded by the plugin
//! into the offline job) holds every launch while the state pauses offline
//! work. Progress is read from the xCUDA stats file the plugin asked for.
//! (That an offline job is never *placed* on a GPU that is not Healthy is
//! shown by the matcher's cluster test.)

use std::path::Path;
use std::time::{Duration, Instant};

use muxflow::policy::health::HealthState;
use muxflow_tests::{kv, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// The offline job's xCUDA launch count (its stats file is rewritten
/// every second); None before the first write.
fn launches(c: &Cluster, config: &Path, node: &str, job: u32) -> Option<u64> {
    let dir = c.node_view(node, &c.node_state(config, node).xcuda_stats_dir(job));
    let mut total = None;
    for e in std::fs::read_dir(&dir).ok()?.flatten() {
        if !e.file_name().to_string_lossy().starts_with("xcuda.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(n) = kv(&text, "launches").and_then(|v| v.parse::<u64>().ok()) {
            *total.get_or_insert(0) += n;
        }
    }
    total
}

/// Waits until the launch count passes `above`; returns it.
fn wait_launches_above(c: &Cluster, config: &Path, node: &str, job: u32, above: u64) -> u64 {
    let start = Instant::now();
    loop {
        if let Some(n) = launches(c, config, node, job).filter(|&n| n > above) {
            return n;
        }
        assert!(
            start.elapsed() < WAIT,
            "offline job {job} launched nothing past {above}:\n{}",
            c.output_or_empty(job)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Steps `node` until GPU `gpu` is in `want`, locally and as published.
fn step_until(c: &Cluster, config: &Path, node: &str, gpu: u32, want: HealthState) {
    let ns = c.node_state(config, node);
    c.step_until(config, node, &format!("{node} gpu{gpu} {want:?}"), || {
        ns.health(gpu).unwrap() == Some(want) && c.published_gpu(node, gpu).state == want
    });
}

#[test]
fn offline_job_pauses_while_its_gpu_is_not_healthy_and_resumes_after() {
    let c = Cluster::get();
    let cfg = c.health_config("pause", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let node = "node2";
    let (online, gpu) = c.online_workload("mfp-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);

    let offline = c.offline_running("mfp-offline", node, gpu, WAIT);
    let running = wait_launches_above(&c, &cfg, node, offline, 0);

    // The online job's GPU saturates: Overloaded pauses offline work.
    c.sim_load(node, gpu, 0.99);
    step_until(&c, &cfg, node, gpu, HealthState::Overloaded);
    // xCUDA reads the state every few tens of ms; the stats file is
    // rewritten every second. Let both catch up, then watch a while.
    std::thread::sleep(Duration::from_millis(2500));
    let paused_at = launches(&c, &cfg, node, offline).unwrap();
    assert!(paused_at >= running);
    std::thread::sleep(Duration::from_secs(3));
    let later = launches(&c, &cfg, node, offline).unwrap();
    assert_eq!(
        later, paused_at,
        "offline job kept launching on an Overloaded GPU"
    );
    assert_eq!(
        c.job_field(offline, "JobState"),
        "RUNNING",
        "paused, not killed"
    );

    // Load gone: Overloaded -> Recovering -> Healthy, and it runs again.
    c.sim_load(node, gpu, 0.0);
    step_until(&c, &cfg, node, gpu, HealthState::Healthy);
    wait_launches_above(&c, &cfg, node, offline, later);

    c.scancel(&[offline, online]);
    for id in [offline, online] {
        c.wait(id, WAIT);
    }
    c.sim_load(node, gpu, 0.0);
}
