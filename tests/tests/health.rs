//! SysMonitor on the dev cluster: the health state machine driven by
//! scripted load on simulated GPUs, what it publishes in Slurm, concurrent
//! steps, error handling (evict the offline client, keep the online job) and
//! the GPU-lost drain.
//!
//! The tests run `muxflow-health` directly (as slurmd would, with
//! SLURMD_NODENAME) with a test config of short dwell times; each test uses
//! its own GPU, and tests that share a node take turns (`hold_node`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use muxflow::node::mps::MpsDaemon;
use muxflow::node::state::{JobRecord, NodeState};
use muxflow::policy::health::HealthState;
use muxflow::{Config, Mode};
use muxflow_tests::{set_key, Cluster};

fn node_config(config: &Path, node: &str) -> Config {
    Config::load(config).unwrap().for_node(node).unwrap()
}

fn record(ns: &NodeState, gpu: u32) -> serde_json::Value {
    let text = std::fs::read_to_string(ns.gpu_dir(gpu).join("record.json")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("corrupt record: {e}: {text}"))
}

/// Steps `node` and checks that GPU `gpu` is in `want`, locally (health
/// word, record) and as published in Slurm.
fn expect(c: &Cluster, config: &Path, node: &str, gpu: u32, want: HealthState, what: &str) {
    let log = c.health_step(config, node);
    let ns = NodeState::new(node_config(config, node).paths.state_dir.as_path());
    assert_eq!(ns.health(gpu).unwrap(), Some(want), "{what}: local\n{log}");
    assert_eq!(record(&ns, gpu)["state"], want.as_str(), "{what}: record");
    let p = c.published(node);
    let g = p.iter().find(|g| g.index == gpu).expect("GPU published");
    assert_eq!(g.state, want, "{what}: published in Slurm ({p:?})");
}

/// Tests on one node run one at a time: a health step reads and acts on
/// the whole node (every GPU, the kernel log); tests on different nodes run
/// in parallel.
fn hold_node(node: &str) -> MutexGuard<'static, ()> {
    static NODES: [Mutex<()>; 4] = [const { Mutex::new(()) }; 4];
    let i: usize = node.trim_start_matches("node").parse().expect("nodeN");
    NODES[i - 1].lock().unwrap_or_else(|e| e.into_inner())
}

const DWELL: &str = "min_dwell_s = 2\nrecovery_quiet_s = 3\nhistory_len = 500\n";

/// Sleeps past the test config's dwell (2 s) or quiet period (3 s).
fn pass(secs: u64) {
    std::thread::sleep(Duration::from_millis(secs * 1000 + 200));
}

#[test]
fn scripted_load_walks_the_states_with_hysteresis_and_slurm_agrees() {
    let c = Cluster::get();
    let cfg = c.health_config("load", DWELL);
    let (node, gpu) = ("node1", 1);
    let _node = hold_node(node);
    c.sim_load(node, gpu, 0.0);
    // Start from a settled Healthy GPU.
    c.health_step(&cfg, node);
    pass(3);
    c.health_step(&cfg, node);
    pass(3);
    expect(&c, &cfg, node, gpu, HealthState::Healthy, "idle");

    c.sim_load(node, gpu, 0.75);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Busy,
        "75% enters Busy at once",
    );
    c.sim_load(node, gpu, 0.5);
    expect(&c, &cfg, node, gpu, HealthState::Busy, "50% within dwell");
    c.sim_load(node, gpu, 0.97);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Overloaded,
        "97% (clock falls too)",
    );
    pass(2);
    c.sim_load(node, gpu, 0.9);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Overloaded,
        "90%: above the exit threshold 85",
    );
    c.sim_load(node, gpu, 0.6);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Busy,
        "60% after dwell: calmed to Busy",
    );
    c.sim_load(node, gpu, 0.3);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Busy,
        "30% but within Busy's dwell",
    );
    pass(2);
    expect(&c, &cfg, node, gpu, HealthState::Healthy, "30% after dwell");

    // Overloaded straight to idle goes through the quiet period.
    c.sim_load(node, gpu, 0.99);
    expect(&c, &cfg, node, gpu, HealthState::Overloaded, "99%");
    c.sim_load(node, gpu, 0.1);
    pass(2);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Recovering,
        "idle after overload",
    );
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Recovering,
        "within the quiet period",
    );
    pass(3);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Healthy,
        "after the quiet period",
    );

    // The other GPU of the node never moved, and no node was drained.
    assert_eq!(
        c.published(node)
            .iter()
            .find(|g| g.index == 0)
            .unwrap()
            .state,
        HealthState::Healthy
    );
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

#[test]
fn concurrent_steps_never_corrupt_or_lose_a_record() {
    let c = Cluster::get();
    let cfg = c.health_config("concurrent", DWELL);
    // Its own state directory: slurmd's HealthCheckProgram also steps node3
    // every 30 s, and its sample would count as one this test did not make.
    let own = cfg.parent().unwrap().join("state-{node}");
    set_key(&cfg, "state_dir", own.to_str().unwrap());
    let node = "node3";
    let _node = hold_node(node);
    let ns = NodeState::new(node_config(&cfg, node).paths.state_dir.as_path());
    c.health_step(&cfg, node);
    let before: Vec<usize> = (0..2)
        .map(|g| record(&ns, g)["history"].as_array().unwrap().len())
        .collect();
    let (rounds, width) = (4, 8);
    for _ in 0..rounds {
        let children: Vec<Child> = (0..width)
            .map(|_| {
                c.health_cmd(&cfg, node)
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut ch in children {
            assert!(ch.wait().unwrap().success());
        }
    }
    for g in 0..2u32 {
        let r = record(&ns, g);
        let n = r["history"].as_array().unwrap().len();
        // Every step's sample is there: no write was lost or torn.
        assert_eq!(n, (before[g as usize] + rounds * width).min(500), "gpu{g}");
        assert!(ns.health(g).unwrap().is_some());
    }
    let leftovers: Vec<_> = std::fs::read_dir(ns.gpu_dir(0))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// An MPS daemon on `node`/`gpu` with `offline` offline workloads attached
/// (each its own job, as with `[policy] offline_per_gpu` > 1) and, unless
/// started `offline_only`, an online one (registered as jobs `base`,
/// `base + 1`, …).
struct Pair {
    online: Option<Child>,
    offline: Vec<Child>,
    mps: MpsDaemon,
    ns: NodeState,
    gpu: u32,
    jobs: Vec<u32>,
}

impl Pair {
    fn start(c: &Cluster, config: &Path, node: &str, gpu: u32, base: u32) -> Pair {
        Pair::start_with(c, config, node, gpu, base, true, 1)
    }

    fn offline_only(c: &Cluster, config: &Path, node: &str, gpu: u32, base: u32) -> Pair {
        Pair::start_with(c, config, node, gpu, base, false, 1)
    }

    fn start_with(
        c: &Cluster,
        config: &Path,
        node: &str,
        gpu: u32,
        base: u32,
        with_online: bool,
        offline: u32,
    ) -> Pair {
        let cfg = node_config(config, node);
        let mps = MpsDaemon::for_gpu(&cfg, gpu);
        mps.ensure_running(muxflow::node::mps::DeviceFacts::default)
            .unwrap();
        let ns = NodeState::new(cfg.paths.state_dir.as_path());
        let jobs: Vec<u32> = (base..=base + offline).collect();
        {
            let lock = ns.lock_gpu(gpu).unwrap();
            for (i, &id) in jobs.iter().enumerate().skip(usize::from(!with_online)) {
                let job = JobRecord {
                    job_id: id,
                    mode: if i == 0 { Mode::Online } else { Mode::Offline },
                    uid: 0,
                    slots: if i == 0 {
                        Vec::new()
                    } else {
                        vec![(i - 1) as u8]
                    },
                };
                ns.add_job(&lock, gpu, &job).unwrap();
            }
        }
        let spawn = |args: &[&str], job: u32| {
            let mut cmd = Command::new(c.sim_bin("muxflow-workload"));
            cmd.args(args)
                .env("LD_LIBRARY_PATH", c.sim_lib_dir())
                .env("MUXFLOW_SIM_NODE", node)
                .env("CUDA_VISIBLE_DEVICES", mps.client_device())
                .env("CUDA_MPS_PIPE_DIRECTORY", mps.pipe_dir())
                .env("SLURM_JOB_ID", job.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().unwrap()
        };
        let online = with_online.then(|| spawn(&["online", "--duration", "120"], jobs[0]));
        let offline = jobs[1..]
            .iter()
            .map(|&j| spawn(&["offline", "--duration", "120"], j))
            .collect();
        let pair = Pair {
            online,
            offline,
            mps,
            ns,
            gpu,
            jobs,
        };
        pair.wait_clients(pair.offline.len() + usize::from(with_online));
        pair
    }

    fn clients(&self) -> Vec<u32> {
        let mut all = Vec::new();
        for s in self.mps.server_pids().unwrap_or_default() {
            all.extend(self.mps.client_pids(s).unwrap_or_default());
        }
        all
    }

    fn wait_clients(&self, n: usize) {
        let start = Instant::now();
        while self.clients().len() < n {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "MPS clients: {:?}",
                self.clients()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every offline workload was evicted (exited on its own: terminated
    /// by MPS) while the online one still runs.
    fn assert_offline_evicted_online_alive(&mut self) {
        for offline in &mut self.offline {
            let start = Instant::now();
            let status = loop {
                if let Some(s) = offline.try_wait().unwrap() {
                    break s;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "offline client {} still running",
                    offline.id()
                );
                std::thread::sleep(Duration::from_millis(100));
            };
            let mut out = String::new();
            std::io::Read::read_to_string(offline.stdout.as_mut().unwrap(), &mut out).unwrap();
            std::io::Read::read_to_string(offline.stderr.as_mut().unwrap(), &mut out).unwrap();
            assert!(!status.success(), "offline: {out}");
            assert!(out.contains("CUDA_ERROR_MPS_CLIENT_TERMINATED"), "{out}");
        }
        let online = self.online.as_mut().expect("an online workload");
        assert!(online.try_wait().unwrap().is_none(), "the online job died");
        let pid = online.id();
        assert!(self.clients().contains(&pid), "online detached");
    }

    fn stop(mut self) {
        // SIGTERM: the workload's graceful exit (sync, release, exit 0).
        if let Some(online) = &self.online {
            let _ = Command::new("kill")
                .args(["-TERM", &online.id().to_string()])
                .status();
        }
        for offline in &mut self.offline {
            let _ = offline.kill();
        }
        let online = self.online.take().map(|o| o.wait_with_output().unwrap());
        for offline in &mut self.offline {
            let _ = offline.wait();
        }
        let _ = self.mps.quit();
        let lock = self.ns.lock_gpu(self.gpu).unwrap();
        for &j in &self.jobs {
            self.ns.remove_job(&lock, self.gpu, j).unwrap();
        }
        let Some(online) = online else {
            return;
        };
        let out = String::from_utf8_lossy(&online.stdout);
        assert!(
            online.status.success(),
            "online job failed: {out}{}",
            String::from_utf8_lossy(&online.stderr)
        );
    }
}

fn counter(r: &serde_json::Value, key: &str) -> u64 {
    r["counters"][key].as_u64().unwrap_or(0)
}

#[test]
fn mps_fault_line_evicts_the_offline_client_and_keeps_the_online_job() {
    let c = Cluster::get();
    let cfg = c.health_config("mpsfault", DWELL);
    let (node, gpu) = ("node2", 0);
    let _node = hold_node(node);
    // Two offline clients ([policy] offline_per_gpu = 2): a fault of one
    // forces every client of the GPU to exit; both are evicted, the online
    // job keeps running.
    let mut pair = Pair::start_with(&c, &cfg, node, gpu, 990_001, true, 2);
    // Before the fault: whatever the load makes it, not Faulty.
    c.health_step(&cfg, node);
    assert_ne!(pair.ns.health(gpu).unwrap(), Some(HealthState::Faulty));
    let before = record(&pair.ns, gpu);
    let offline = pair.offline[0].id();
    // The server's report of a client fault, as the MPS server logs it.
    let log = pair.mps.log_dir().join("server.log");
    let mut text = std::fs::read_to_string(&log).unwrap_or_default();
    text.push_str(&format!(
        "[2026-01-01 00:00:00.000 Server 1] The following clients have a sticky error set: {offline}\n"
    ));
    std::fs::write(&log, text).unwrap();

    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Faulty,
        "after the fault line",
    );
    pair.assert_offline_evicted_online_alive();
    let r = record(&pair.ns, gpu);
    let delta = |key: &str| counter(&r, key) - counter(&before, key);
    assert_eq!(delta("rule.mps_client_sticky_error"), 1, "{r}");
    assert_eq!(delta("action.evict_offline"), 1, "{r}");
    // The online client is attached: the daemon is not restarted.
    assert_eq!(delta("action.restart_mps"), 0, "{r}");
    // The line is handled once: no second eviction, and Faulty passes.
    pass(2);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Recovering,
        "quiet after the fault",
    );
    assert_eq!(
        counter(&record(&pair.ns, gpu), "action.evict_offline"),
        counter(&r, "action.evict_offline")
    );
    pair.stop();
    c.assert_no_drain();
}

/// A GPU whose record is gone (the state directory wiped, a tmpfs after a
/// reboot, a corrupt record replaced) starts reading its MPS server's log
/// at the end: an old fault line there is history, not a new fault. A line
/// written after that counts as before.
#[test]
fn a_fresh_record_does_not_act_on_old_mps_log_lines() {
    let c = Cluster::get();
    let cfg = c.health_config("freshrecord", DWELL);
    let (node, gpu) = ("node2", 1);
    let _node = hold_node(node);
    let ns = NodeState::new(node_config(&cfg, node).paths.state_dir.as_path());
    let mps = MpsDaemon::for_gpu(&node_config(&cfg, node), gpu);
    let log = mps.log_dir().join("server.log");
    let sticky =
        "[2026-01-01 00:00:00.000 Server 1] The following clients have a sticky error set: 4242\n";
    let append = |line: &str| {
        std::fs::create_dir_all(mps.log_dir()).unwrap();
        let mut text = std::fs::read_to_string(&log).unwrap_or_default();
        text.push_str(line);
        std::fs::write(&log, text).unwrap();
    };
    c.health_step(&cfg, node);
    append(sticky);
    std::fs::remove_file(ns.gpu_dir(gpu).join("record.json")).unwrap();
    let step = c.health_step(&cfg, node);
    assert_ne!(
        ns.health(gpu).unwrap(),
        Some(HealthState::Faulty),
        "an old line marked the GPU faulty:\n{step}"
    );
    assert_eq!(
        counter(&record(&ns, gpu), "rule.mps_client_sticky_error"),
        0
    );
    // A new line is a new fault.
    append(sticky);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Faulty,
        "after a new fault line",
    );
    assert_eq!(
        counter(&record(&ns, gpu), "rule.mps_client_sticky_error"),
        1
    );
    pass(2);
    expect(
        &c,
        &cfg,
        node,
        gpu,
        HealthState::Recovering,
        "quiet after it",
    );
    pass(3);
    expect(&c, &cfg, node, gpu, HealthState::Healthy, "healthy again");
    c.assert_no_drain();
}

#[test]
fn xid_event_evicts_the_offline_client_and_keeps_the_online_job() {
    let c = Cluster::get();
    let cfg = c.health_config("xid", &format!("{DWELL}xid_watch_ms = 30000\n"));
    let (node, gpu) = ("node2", 1);
    let _node = hold_node(node);
    let mut pair = Pair::start(&c, &cfg, node, gpu, 990_011);
    let before = pair
        .ns
        .health(gpu)
        .ok()
        .flatten()
        .map(|_| record(&pair.ns, gpu));
    // Xid events reach only a program registered for them: inject while
    // the health check watches.
    let mut child = c
        .health_cmd(&cfg, node)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains("watching for Xid events") {
            break;
        }
    }
    // Xid 31 (MMU fault) implicates one application, not the whole GPU.
    c.sim_fault(node, gpu, &["xid", "31"]);
    for line in lines {
        log.push_str(&line.unwrap());
        log.push('\n');
    }
    assert!(child.wait().unwrap().success(), "{log}");
    assert!(log.contains("xid_app"), "{log}");
    assert_eq!(pair.ns.health(gpu).unwrap(), Some(HealthState::Faulty));
    let p = c.published(node);
    assert_eq!(
        p.iter().find(|g| g.index == gpu).unwrap().state,
        HealthState::Faulty
    );
    pair.assert_offline_evicted_online_alive();
    let r = record(&pair.ns, gpu);
    let delta = |key: &str| counter(&r, key) - before.as_ref().map_or(0, |b| counter(b, key));
    assert_eq!(delta("rule.xid_app"), 1, "{r}");
    assert_eq!(delta("action.evict_offline"), 1, "{r}");
    pair.stop();
    c.assert_no_drain();
}

#[test]
fn xid_between_health_checks_is_read_from_the_kernel_log() {
    let c = Cluster::get();
    // No NVML watch window: only the kernel log can tell. (slurmd's own
    // health check may read the record first; it acts the same.)
    let cfg = c.health_config("kmsg", &format!("{DWELL}xid_watch_ms = 0\n"));
    let (node, gpu) = ("node1", 0);
    let _node = hold_node(node);
    let mut pair = Pair::start(&c, &cfg, node, gpu, 990_021);
    c.health_step(&cfg, node);
    let before = record(&pair.ns, gpu);
    // Xid 43 (GPU stopped processing) while no program watches NVML events.
    c.sim_fault(node, gpu, &["xid", "43"]);
    let log = c.step_until(&cfg, node, "Faulty after the Xid", || {
        pair.ns.health(gpu).unwrap() == Some(HealthState::Faulty)
    });
    pair.assert_offline_evicted_online_alive();
    let delta = |key: &str| {
        let r = record(&pair.ns, gpu);
        (counter(&r, key) - counter(&before, key), r)
    };
    let (n, r) = delta("rule.xid_app");
    assert_eq!(n, 1, "{r}\n{log}");
    assert_eq!(delta("action.evict_offline").0, 1, "{r}");
    // The record is acted on once.
    c.health_step(&cfg, node);
    assert_eq!(delta("rule.xid_app").0, 1);
    pair.stop();
    assert_not_drained(&c, node);
}

#[test]
fn fatal_xid_restarts_the_mps_daemon_only_without_an_online_client() {
    let c = Cluster::get();
    let cfg = c.health_config("restart", DWELL);
    let (node, gpu) = ("node4", 0);
    let _node = hold_node(node);
    // Two offline clients, no online one: the restart waits for no one.
    let mut pair = Pair::start_with(&c, &cfg, node, gpu, 990_031, false, 2);
    c.health_step(&cfg, node);
    let before = record(&pair.ns, gpu);
    let servers = pair.mps.server_pids().unwrap();
    assert_eq!(servers.len(), 1, "{servers:?}");
    // Xid 48 (double-bit ECC): every client of the GPU fails.
    c.sim_fault(node, gpu, &["xid", "48"]);
    let log = c.step_until(&cfg, node, "the MPS daemon restarted", || {
        counter(&record(&pair.ns, gpu), "action.restart_mps")
            > counter(&before, "action.restart_mps")
    });
    let r = record(&pair.ns, gpu);
    let delta = |key: &str| counter(&r, key) - counter(&before, key);
    assert_eq!(delta("rule.xid_fatal"), 1, "{r}\n{log}");
    assert_eq!(delta("action.restart_mps"), 1, "{r}\n{log}");
    assert_eq!(pair.ns.health(gpu).unwrap(), Some(HealthState::Faulty));
    // The old server is gone; the daemon is back for the job still recorded.
    assert!(pair.mps.is_running(), "daemon not restarted:\n{log}");
    let now = pair.mps.server_pids().unwrap_or_default();
    assert!(
        !now.contains(&servers[0]),
        "old server {servers:?} still up"
    );
    for offline in &mut pair.offline {
        let start = Instant::now();
        while offline.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "offline client {} alive",
                offline.id()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    c.sim_fault(node, gpu, &["clear"]);
    pair.stop();
    // (node4's gpu1 is drained on purpose by the lost-GPU test.)
    let (_, reason) = c.node_reason(node);
    assert!(!reason.contains("gpu0"), "{reason}");
}

fn assert_not_drained(c: &Cluster, node: &str) {
    let (state, reason) = c.node_reason(node);
    assert!(!state.contains("drain"), "{node}: {state} {reason}");
}

#[test]
fn only_a_lost_gpu_drains_and_only_muxflows_drain_is_undone() {
    let c = Cluster::get();
    let cfg = c.health_config("lost", DWELL);
    let (node, gpu) = ("node4", 1);
    let _node = hold_node(node);
    c.health_step(&cfg, node);
    assert!(!c.node_reason(node).0.contains("drain"));

    c.sim_fault(node, gpu, &["lost"]);
    c.health_step(&cfg, node);
    let (state, reason) = c.node_reason(node);
    assert!(state.contains("drain"), "{state} {reason}");
    assert!(reason.starts_with("muxflow:"), "{reason}");
    assert!(reason.contains("gpu1"), "{reason}");
    let ns = NodeState::new(node_config(&cfg, node).paths.state_dir.as_path());
    assert_eq!(ns.health(gpu).unwrap(), Some(HealthState::Faulty));
    // Only this node.
    let others: Vec<_> = c
        .drained_nodes()
        .into_iter()
        .filter(|l| !l.starts_with(node))
        .collect();
    assert!(others.is_empty(), "{others:?}");

    c.sim_fault(node, gpu, &["clear"]);
    c.health_step(&cfg, node);
    let (state, reason) = c.node_reason(node);
    assert!(!state.contains("drain"), "still {state}: {reason}");

    // An administrator's drain is never undone by muxflow.
    let mut cmd = c.cmd("scontrol");
    cmd.args([
        "update",
        &format!("NodeName={node}"),
        "State=DRAIN",
        "Reason=admin: maintenance",
    ]);
    assert!(c.run(cmd).0);
    c.sim_fault(node, gpu, &["lost"]);
    c.health_step(&cfg, node);
    c.sim_fault(node, gpu, &["clear"]);
    c.health_step(&cfg, node);
    let (state, reason) = c.node_reason(node);
    let mut cmd = c.cmd("scontrol");
    cmd.args(["update", &format!("NodeName={node}"), "State=RESUME"]);
    assert!(c.run(cmd).0);
    assert!(state.contains("drain"), "{state}");
    assert_eq!(reason, "admin: maintenance");
}

/// Sends `line` to the GPU's MPS control daemon as user `nobody`, the way
/// any user with a job on the GPU can. The pair's records are root's, so
/// nobody is let in first as a job of its own would let it in (the pipe
/// directory's ACL; the next health step closes it again).
fn mps_command_as_nobody(c: &Cluster, mps: &MpsDaemon, line: &str) -> String {
    use std::io::Write;
    muxflow::node::pipe_access::admit_only(mps.pipe_dir(), &[65534].into()).unwrap();
    let mut child = Command::new("runuser")
        .args(["-u", "nobody", "--", "env"])
        .arg(format!(
            "CUDA_MPS_PIPE_DIRECTORY={}",
            mps.pipe_dir().display()
        ))
        .arg(c.sim_bin("nvidia-cuda-mps-control"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{line}").unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn a_users_mps_commands_neither_fault_the_gpu_nor_keep_their_settings() {
    let c = Cluster::get();
    let cfg = c.health_config("mpsuser", DWELL);
    let (node, gpu) = ("node3", 0);
    let _node = hold_node(node);
    let mut pair = Pair::start(&c, &cfg, node, gpu, 990_041);
    c.health_step(&cfg, node);
    assert_ne!(pair.ns.health(gpu).unwrap(), Some(HealthState::Faulty));
    let before = record(&pair.ns, gpu);
    let offline = pair.offline[0].id();
    let server_log = pair.mps.log_dir().join("server.log");
    let server_before = std::fs::read_to_string(&server_log).unwrap_or_default();

    // The attack: fault words in a command, which the daemon
    // echoes into control.log as NVIDIA's does ...
    let forged = "get_client_list Server is handling a fatal GPU error. FAULT";
    mps_command_as_nobody(&c, &pair.mps, forged);
    let control = std::fs::read_to_string(pair.mps.log_dir().join("control.log")).unwrap();
    assert!(control.contains(&format!("Cmd:{forged}")), "{control}");
    // ... a fault claimed for another user's client (the daemon takes a
    // client's identity from the connection, not from what it says) ...
    mps_command_as_nobody(&c, &pair.mps, &format!("@fault {offline} 13"));
    let control = std::fs::read_to_string(pair.mps.log_dir().join("control.log")).unwrap();
    assert!(
        control.contains("User did not send valid credentials"),
        "{control}"
    );
    let server_after = std::fs::read_to_string(&server_log).unwrap_or_default();
    assert_eq!(
        server_after.get(server_before.len()..).unwrap_or(""),
        "",
        "a user wrote into the server's log"
    );
    // ... and settings for later clients, which the daemon accepts from anyone.
    mps_command_as_nobody(&c, &pair.mps, "set_default_active_thread_percentage 37");
    let server = pair.mps.server_pids().unwrap()[0];
    mps_command_as_nobody(
        &c,
        &pair.mps,
        &format!("set_active_thread_percentage {server} 5"),
    );
    assert_eq!(
        pair.mps
            .send("get_default_active_thread_percentage")
            .unwrap(),
        "37.0"
    );

    let log = c.health_step(&cfg, node);
    assert_ne!(
        pair.ns.health(gpu).unwrap(),
        Some(HealthState::Faulty),
        "a user's text marked the GPU faulty:\n{log}"
    );
    let r = record(&pair.ns, gpu);
    let delta = |key: &str| counter(&r, key) - counter(&before, key);
    for rule in ["rule.mps_fatal_gpu_error", "rule.mps_client_sticky_error"] {
        assert_eq!(delta(rule), 0, "{rule}: {r}\n{log}");
    }
    assert_eq!(delta("action.evict_offline"), 0, "{r}");
    // The node put its setting back and says so.
    assert_eq!(
        delta("policed.default_active_thread_percentage"),
        1,
        "{r}\n{log}"
    );
    assert!(log.contains("putting back 100"), "{log}");
    assert_eq!(
        pair.mps
            .send("get_default_active_thread_percentage")
            .unwrap(),
        "100.0"
    );
    assert_eq!(
        delta("noticed.set_active_thread_percentage"),
        1,
        "{r}\n{log}"
    );
    assert_eq!(delta("policed.active_thread_percentage"), 1, "{r}\n{log}");
    assert!(
        log.contains(&format!(
            "put back: set_active_thread_percentage {server} 100"
        )),
        "{log}"
    );
    // Nobody lost anything.
    assert!(
        pair.offline[0].try_wait().unwrap().is_none(),
        "offline client killed"
    );
    let clients = pair.clients();
    assert!(clients.contains(&offline), "{clients:?}");
    pair.stop();
    assert_not_drained(&c, node);
}

#[test]
fn a_killed_mps_control_daemon_is_restarted_by_the_health_check() {
    let c = Cluster::get();
    let cfg = c.health_config("mpskilled", DWELL);
    let (node, gpu) = ("node3", 1);
    let _node = hold_node(node);
    let pair = Pair::offline_only(&c, &cfg, node, gpu, 990_051);
    c.health_step(&cfg, node);
    let before = record(&pair.ns, gpu);
    let pid_file = pair.mps.pipe_dir().join("nvidia-cuda-mps-control.pid");
    let old: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let killed = Command::new("kill")
        .args(["-KILL", &old.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let start = Instant::now();
    while pair.mps.is_running() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "daemon survived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The next health check, not the next job's Prolog, brings it back.
    let log = c.health_step(&cfg, node);
    assert!(log.contains("the MPS control daemon is gone"), "{log}");
    assert!(pair.mps.is_running(), "not restarted:\n{log}");
    let new: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new, old);
    let r = record(&pair.ns, gpu);
    assert_eq!(
        counter(&r, "action.restart_mps_daemon") - counter(&before, "action.restart_mps_daemon"),
        1,
        "{r}"
    );
    pair.stop();
    assert_not_drained(&c, node);
}

#[test]
fn a_users_terminate_client_is_noticed_and_muxflows_own_is_not() {
    let c = Cluster::get();
    let cfg = c.health_config("mpsterminate", DWELL);
    let (node, gpu) = ("node3", 0);
    let _node = hold_node(node);
    let mut pair = Pair::start(&c, &cfg, node, gpu, 990_061);
    c.health_step(&cfg, node);
    let before = record(&pair.ns, gpu);
    let server = pair.mps.server_pids().unwrap()[0];
    let online = pair.online.as_ref().unwrap().id();
    let offline = pair.offline[0].id();
    // NVIDIA's daemon takes this from any user who can reach it (see
    // simgpu/README.md): it cannot be refused, only noticed.
    mps_command_as_nobody(
        &c,
        &pair.mps,
        &format!("terminate_client {server} {online}"),
    );
    let log = c.health_step(&cfg, node);
    assert!(
        log.contains(&format!(
            "MPS command 'terminate_client {server} {online}' reached the daemon from someone other than muxflow"
        )),
        "{log}"
    );
    let noticed = |r: &serde_json::Value| {
        counter(r, "noticed.terminate_client") - counter(&before, "noticed.terminate_client")
    };
    assert_eq!(noticed(&record(&pair.ns, gpu)), 1);
    // Attributed as far as it can be: the ended client's job gets it (its
    // AdminComment's terminated_by_other), the log names the users on the GPU.
    assert!(
        log.contains("NVIDIA's daemon names no sender") && log.contains("job=Some(990061)"),
        "{log}"
    );
    let file = pair.ns.terminated_by_other_file(990_061);
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        text.contains(&format!("client={online}")),
        "{file:?}: {text}"
    );
    let _ = std::fs::remove_file(&file);
    // muxflow's own eviction is not taken for a user's.
    pair.mps.terminate_client(server, offline).unwrap();
    let log = c.health_step(&cfg, node);
    assert!(!log.contains("someone other than muxflow"), "{log}");
    assert_eq!(noticed(&record(&pair.ns, gpu)), 1);
    // The terminated online workload fails (what the attack costs); clean up.
    if let Some(mut o) = pair.online.take() {
        let _ = o.kill();
        let _ = o.wait();
    }
    pair.stop();
    assert_not_drained(&c, node);
}
