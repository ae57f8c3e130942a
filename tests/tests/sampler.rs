//! The node's SM activity sampler (`muxflow-sampler`) on the dev cluster:
//! the health step takes SM activity from its pages without waiting (a
//! GPU turns Busy on SM activity alone), decides without it on a cold node
//! and says so; the sampler is started by the steps, comes back when
//! killed, stays while a muxflow job is on the node and is gone once the
//! last one has ended and it lingered.
//!
//! Each test has its own state directory (and so its own sampler): slurmd's
//! own steps of the node (HealthCheckProgram every 30 s) use the cluster's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use muxflow::node::state::NodeState;
use muxflow::policy::health::HealthState;
use muxflow_tests::{set_key, target, Cluster};

/// A test config with `health` and state (and MPS) directories of its own.
fn own_config(c: &Cluster, name: &str, health: &str) -> PathBuf {
    let cfg = c.health_config(name, health);
    let dir = cfg.parent().unwrap().to_path_buf();
    for (key, sub) in [
        ("state_dir", "state-{node}"),
        ("mps_pipe_root", "mps-{node}"),
        ("mps_log_root", "mps-log-{node}"),
    ] {
        set_key(&cfg, key, dir.join(sub).to_str().unwrap());
    }
    cfg
}

fn state(cfg: &Path, node: &str) -> NodeState {
    let c = muxflow::Config::load(cfg).unwrap().for_node(node).unwrap();
    NodeState::new(c.paths.state_dir.as_path())
}

/// The pid of the sampler of `ns` if it runs: the pid its lock file names,
/// alive (not a zombie) and a `muxflow-sampler`.
fn sampler_pid(ns: &NodeState) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(ns.lock_path("sampler"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(')')?;
    let alive = !matches!(rest.split_whitespace().next(), Some("Z" | "X"));
    (alive && comm == "muxflow-sampler").then_some(pid)
}

/// Polls `f` until it gives Some; panics naming `what` after 60 s.
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn last_sample(ns: &NodeState, gpu: u32) -> serde_json::Value {
    let text = std::fs::read_to_string(ns.gpu_dir(gpu).join("record.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    r["history"].as_array().unwrap().last().unwrap().clone()
}

#[test]
fn the_health_step_reads_sm_activity_from_the_sampler_and_goes_on_without_it_when_cold() {
    let c = Cluster::get();
    // Utilization can never make the GPU Busy here: only SM activity can.
    let cfg = own_config(
        &c,
        "sampler-busy",
        "busy_enter_utilization = 99\nbusy_exit_utilization = 98\n\
         overloaded_enter_utilization = 100\noverloaded_exit_utilization = 99\n\
         busy_enter_sm_activity = 40\nbusy_exit_sm_activity = 30\n\
         min_dwell_s = 2\nsampler_linger_s = 1\n",
    );
    let (node, gpu) = ("node4", 1);
    let ns = state(&cfg, node);
    c.sim_load(node, gpu, 0.5);

    // Cold: no sampler for this state directory yet. The step starts one,
    // decides on what it has, and says so.
    assert_eq!(sampler_pid(&ns), None, "a sampler before the first step");
    let log = c.health_step(&cfg, node);
    assert!(
        log.contains("no SM activity page yet") && log.contains("started just now"),
        "cold step:\n{log}"
    );
    let first = last_sample(&ns, gpu);
    assert!(first["sm_pct"].is_null(), "cold step's sample: {first}");
    assert_eq!(ns.health(gpu).unwrap(), Some(HealthState::Healthy));
    let pid = wait_for("the step started a sampler", || sampler_pid(&ns));

    // Then every step reads the sampler's page: SM activity at the load.
    let mut log = String::new();
    wait_for("the GPU turns Busy on SM activity", || {
        log = c.health_step(&cfg, node);
        (ns.health(gpu).unwrap() == Some(HealthState::Busy)).then_some(())
    });
    let s = last_sample(&ns, gpu);
    let sm = s["sm_pct"].as_f64().unwrap_or_else(|| panic!("{s}\n{log}"));
    assert!((45.0..=55.0).contains(&sm), "SM activity {sm} at 50% load");
    assert!(s["util_pct"].as_f64().unwrap() < 99.0, "utilization: {s}");
    assert_eq!(sampler_pid(&ns), Some(pid), "one sampler throughout");
    c.sim_load(node, gpu, 0.0);
}

#[test]
fn the_sampler_comes_back_when_killed_and_is_gone_after_the_nodes_last_job() {
    let c = Cluster::get();
    let cfg = own_config(&c, "sampler-life", "sampler_linger_s = 2\n");
    let node = "node3";
    let ns = state(&cfg, node);
    // A muxflow online job's Prolog and Epilog, run as slurmd runs them.
    let job_program = |program: &str| {
        let mut cmd = c.cmd(target().join(program).to_str().unwrap());
        cmd.arg("--config")
            .arg(&cfg)
            .env("SLURMD_NODENAME", node)
            .env("SLURM_JOB_ID", "990001")
            .env("SLURM_JOB_UID", "0")
            .env("SLURM_JOB_GPUS", "0")
            .env(muxflow::mode::PROLOG_ENV_VAR, "online")
            .env("MUXFLOW_LOG", "info");
        let (ok, out, err) = c.run(cmd);
        assert!(ok, "{program}: {out}{err}");
        err
    };

    job_program("muxflow-prolog");
    assert_eq!(ns.jobs(0).unwrap().len(), 1, "the job is recorded");
    let first = wait_for("the Prolog started a sampler", || sampler_pid(&ns));

    // Killed: the next step starts another.
    let (ok, _, err) = c.run({
        let mut k = std::process::Command::new("kill");
        k.args(["-KILL", &first.to_string()]);
        k
    });
    assert!(ok, "kill: {err}");
    wait_for("the killed sampler is gone", || {
        (sampler_pid(&ns) != Some(first)).then_some(())
    });
    c.health_step(&cfg, node);
    let second = wait_for("a step started a new sampler", || sampler_pid(&ns));
    assert_ne!(second, first);

    // Past its linger with the job still recorded and no step: it stays.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        sampler_pid(&ns),
        Some(second),
        "the sampler left while a job was on the node"
    );
    let page = ns.gpu_dir(0).join(muxflow::records::sm_page::FILE_NAME);
    assert!(page.is_file(), "no page while the sampler runs");

    // The last job ends: the sampler lingers, then goes, and its pages too.
    job_program("muxflow-epilog");
    assert!(ns.jobs(0).unwrap().is_empty(), "the job is forgotten");
    wait_for("the sampler is gone after the last job", || {
        sampler_pid(&ns).is_none().then_some(())
    });
    assert!(!page.exists(), "its page outlived it");
}
