//! muxflow-matcher on the dev cluster (4 nodes x 2 simulated GPUs).
//!
//! Nothing is scripted behind the node programs' back: online jobs are
//! `--muxflow=online` workloads on the simulated GPUs (an external load on
//! their GPU sets their SM activity, `--alloc-mib` their memory), and the
//! node health checks measure and publish what the matcher reads. A faulty
//! GPU is made by an Xid the health check finds in the kernel log. Offline
//! jobs are `--muxflow=offline`, parked by job_submit.lua's hold.
//!
//! One test function: the matcher acts on every pending offline job of the
//! cluster, so the steps must not run in parallel with each other.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use muxflow::policy::health::HealthState;
use muxflow_tests::{decision, Cluster};

const PREFIX: &str = "mfm-";
const WAIT: Duration = Duration::from_secs(60);

fn scontrol(c: &Cluster, args: &[&str]) -> Result<String, String> {
    let mut cmd = c.cmd("scontrol");
    cmd.args(args);
    let (ok, out, err) = c.run(cmd);
    if ok {
        Ok(out)
    } else {
        Err(format!("scontrol {args:?}: {out}{err}"))
    }
}

/// The cluster's muxflow.toml with short dwell times, for health steps
/// that settle a GPU quickly.
fn quick_config(c: &Cluster) -> PathBuf {
    c.health_config("matcher-health", "min_dwell_s = 1\nrecovery_quiet_s = 1")
}

/// Steps `node` with the cluster's config until GPU `gpu` is published
/// Faulty.
fn faulty_published(c: &Cluster, node: &str, gpu: u32) {
    let config = c.dir.join("etc/muxflow.toml");
    c.step_until(&config, node, &format!("{node} gpu{gpu} Faulty"), || {
        c.published_gpu(node, gpu).state == HealthState::Faulty
    });
}

/// A finished offline run with figures in AdminComment (history).
fn history(c: &Cluster, name: &str, report: &str) -> u32 {
    let id = c
        .sbatch(&["-H", "--job-name", name], "#!/bin/sh\ntrue\n")
        .unwrap();
    scontrol(
        c,
        &[
            "update",
            &format!("JobId={id}"),
            &format!("AdminComment={report}"),
        ],
    )
    .unwrap();
    scontrol(c, &["release", &id.to_string()]).unwrap();
    id
}

/// Waits until the offline job runs; returns (node, slot GRES detail).
fn wait_placed(c: &Cluster, id: u32, timeout: Duration) -> (String, String) {
    let node = c.wait_running(id, timeout);
    (node, c.gres_detail(id))
}

struct Loop(Child);

impl Loop {
    fn start(c: &Cluster) -> Loop {
        let mut cmd = c.matcher();
        cmd.args(["--interval", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        Loop(cmd.spawn().expect("starting muxflow-matcher"))
    }

    fn kill9(mut self) {
        // SIGKILL: no cleanup of any kind in the matcher.
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

#[test]
fn matcher_places_best_total_avoids_unhealthy_gpus_and_converges_after_kill_9() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let quick = quick_config(&c);

    // History: mfm-big needs 60 GB of GPU memory, mfm-small 4 GB,
    // mfm-extra 90 GB (more than any GPU has room for).
    let h = [
        history(
            &c,
            "mfm-extra",
            "muxflow:v1 mode=offline sm_pct=100 peak_mib=90000 steps_per_s=20",
        ),
        history(
            &c,
            "mfm-big",
            "muxflow:v1 mode=offline sm_pct=100 peak_mib=60000 steps_per_s=50",
        ),
        history(
            &c,
            "mfm-small",
            "muxflow:v1 mode=offline sm_pct=100 peak_mib=4000 steps_per_s=90",
        ),
    ];
    for id in h {
        c.sacct_until(id, "AdminComment", |l| l.contains("peak_mib"));
    }

    // node1: a quiet online job with little memory: best for anyone, and
    // the only GPU with room for mfm-big (81559 - 4000 - 2048 >= 60000).
    // node2: busier (a third of the SMs, below the Busy exit threshold, so
    // a spike cannot leave it Busy) with 30 GB: mfm-big does not fit.
    // node3: the quietest, but faulty: must get nothing. node4: no online
    // job and its GPUs held by plain jobs (as are the others' second
    // GPUs), so no candidate.
    let (on1, g1) = c.online_workload("mfm-online-1", "node1", 0.1, 4000);
    let (on2, g2) = c.online_workload("mfm-online-2", "node2", 0.35, 30_000);
    let (on3, g3) = c.online_workload("mfm-online-3", "node3", 0.02, 1000);
    // Idle GPUs take offline work too (issue 15): hold them with plain jobs.
    let fill = c.hold_free_gpus(&format!("{PREFIX}fill"));
    let node4_fill = fill
        .iter()
        .copied()
        .find(|&id| c.job_field(id, "NodeList") == "node4")
        .expect("node4 has no online job, so a plain job holds its GPUs");
    c.settle_healthy(&quick, "node1", g1, 4000);
    c.settle_healthy(&quick, "node2", g2, 30_000);
    c.settle_healthy(&quick, "node3", g3, 1000);
    // The Xid reaches the health check through the kernel log; with the
    // cluster's dwell times the GPU stays Faulty, then Recovering, for
    // 90 s (the health steps below never touch node3).
    c.sim_fault("node3", g3, &["xid", "43"]);
    faulty_published(&c, "node3", g3);
    let solo = |node, g| c.published_gpu(node, g).solo_sm_pct.unwrap();
    let (s1, s2) = (solo("node1", g1), solo("node2", g2));
    assert!(s1 + 10 < s2, "node2 must be the busier: {s1} vs {s2}");

    // Submitted small first: a greedy first-come placement would give
    // mfm-small node1 and leave mfm-big nowhere.
    let small = c.offline_parked("mfm-small");
    let big = c.offline_parked("mfm-big");
    let extra = c.offline_parked("mfm-extra");

    // --dry-run: the decision table, and nothing changes in Slurm.
    let mut cmd = c.matcher();
    cmd.args(["--once", "--dry-run"]);
    let (ok, table, err) = c.run(cmd);
    assert!(ok, "{table}{err}");
    assert!(table.starts_with("JOB "), "{table}");
    let line = |id: u32| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no line for job {id}:\n{table}"))
            .to_string()
    };
    assert!(line(big).contains(" place  node1 "), "{table}");
    assert!(line(small).contains(" place  node2 "), "{table}");
    assert!(line(extra).contains(" none "), "{table}");
    for id in [small, big, extra] {
        assert_eq!(
            c.job_field(id, "Reason"),
            "JobHeldUser",
            "dry run changed job {id}"
        );
        assert_eq!(c.job_field(id, "ReqNodeList"), "(null)", "dry run: {id}");
    }

    let round = c.matcher_once();
    let d_big = decision(&round, big);
    let d_small = decision(&round, small);
    let d_extra = decision(&round, extra);
    let at = |d: &serde_json::Value| {
        (
            d["action"].as_str().map(str::to_string),
            d["node"].as_str().map(str::to_string),
            d["gpu"].as_u64(),
        )
    };
    let want = |node: &str, g: u32| (Some("place".into()), Some(node.into()), Some(g as u64));
    assert_eq!(at(&d_big), want("node1", g1), "{round}");
    assert_eq!(at(&d_small), want("node2", g2), "{round}");
    // Too big for every GPU: stays parked, saying why.
    assert_eq!(d_extra["action"], "none", "{round}");
    assert!(
        d_extra["reason"]
            .as_str()
            .unwrap()
            .starts_with("no candidate"),
        "{round}"
    );
    for d in round["decisions"].as_array().unwrap() {
        assert_ne!(d["node"], "node3", "placed on the faulty GPU: {round}");
        assert_ne!(
            d["node"], "node4",
            "placed without an online partner: {round}"
        );
    }
    assert_eq!(round["summary"]["placed"], 2, "{round}");
    // The total is the sum of what was placed, and beats the greedy one
    // (mfm-small alone on node1, predicted at most 1.0).
    let total = round["summary"]["predicted_total"].as_f64().unwrap();
    let sum = d_big["predicted"].as_f64().unwrap() + d_small["predicted"].as_f64().unwrap();
    assert!((total - sum).abs() < 1e-6, "{round}");
    assert!(total > 1.0 + 1e-6, "{round}");

    // Slurm starts them where placed, on the online job's GPU slot.
    let (n, gres) = wait_placed(&c, big, WAIT);
    assert_eq!(
        (n.as_str(), gres),
        ("node1", format!("mfslot:g{g1}:1(IDX:{g1})"))
    );
    let (n, gres) = wait_placed(&c, small, WAIT);
    assert_eq!(
        (n.as_str(), gres),
        ("node2", format!("mfslot:g{g2}:1(IDX:{g2})"))
    );
    // The parked job says why it waits: held by the operator (the matcher),
    // not by its user, and the reason in words in its AdminComment.
    assert_eq!(c.job_field(extra, "JobState"), "PENDING");
    assert_eq!(d_extra["waiting"], "free_gpu", "{round}");
    assert_eq!(c.job_field(extra, "Reason"), "JobHeldAdmin");
    let noted = c.admin_comment(extra);
    assert!(
        noted.starts_with("muxflow:v1 mode=offline waiting=free_gpu since=20")
            && noted.ends_with(" rounds_every=60s"),
        "{noted}"
    );
    let mut cmd = c.cmd("squeue");
    cmd.args(["-h", "-j", &extra.to_string(), "-o", "%r"]);
    assert_eq!(c.run(cmd).1.trim(), "JobHeldAdmin");

    // A second round changes nothing: hints are only rewritten on change,
    // and so is the reason (its `since` stays).
    let again = c.matcher_once();
    assert_eq!(again["summary"]["updates"], 0, "{again}");
    assert_eq!(decision(&again, extra)["action"], "none");
    assert_eq!(c.admin_comment(extra), noted);

    // Kill -9 mid-loop. Free the slots, add an online job on node4, keep
    // node3 faulty (a new Xid), add jobs.
    c.scancel(&[big, small, extra]);
    for id in [big, small] {
        c.wait(id, WAIT);
    }
    // One of node4's GPUs for its online job.
    c.scancel(&[node4_fill]);
    c.wait(node4_fill, WAIT);
    let (on4, g4) = c.online_workload("mfm-online-4", "node4", 0.2, 1000);
    c.settle_healthy(&quick, "node4", g4, 1000);
    for (node, g) in [("node1", g1), ("node2", g2)] {
        c.settle_healthy(&quick, node, g, 0);
    }
    c.sim_fault("node3", g3, &["xid", "43"]);
    faulty_published(&c, "node3", g3);
    let jobs: Vec<u32> = (1..=3)
        .map(|i| c.offline_parked(&format!("mfm-k{i}")))
        .collect();
    for ms in [150u64, 450, 900] {
        let l = Loop::start(&c);
        std::thread::sleep(Duration::from_millis(ms));
        l.kill9();
    }
    // A stale hint no round wrote: held, with a node in ReqNodeList (the
    // faulty one). The next rounds must repair it too. (Fails harmlessly
    // if the job has started meanwhile.)
    let _ = scontrol(&c, &["hold", &jobs[2].to_string()]);
    let _ = scontrol(
        &c,
        &["update", &format!("JobId={}", jobs[2]), "ReqNodeList=node3"],
    );
    let l = Loop::start(&c);
    let start = Instant::now();
    loop {
        let states: Vec<String> = jobs.iter().map(|&id| c.job_field(id, "JobState")).collect();
        if states.iter().all(|s| s == "RUNNING") {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "offline jobs {jobs:?} not all running after {WAIT:?}: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let placed: Vec<(String, String)> = jobs
        .iter()
        .map(|&id| wait_placed(&c, id, Duration::from_secs(5)))
        .collect();
    l.kill9();

    // Every job runs next to a healthy online job, on that job's GPU, one
    // per GPU: node1, node2 and node4, never the faulty node3.
    let partners = [("node1", g1), ("node2", g2), ("node4", g4)];
    let mut used: Vec<(String, String)> = Vec::new();
    for (id, (node, gres)) in jobs.iter().zip(&placed) {
        let (_, g) = partners
            .iter()
            .find(|(n, _)| n == node)
            .unwrap_or_else(|| panic!("job {id} runs on {node}, not next to a healthy online job"));
        assert_eq!(*gres, format!("mfslot:g{g}:1(IDX:{g})"), "job {id}");
        assert!(
            !used.contains(&(node.clone(), gres.clone())),
            "two on one GPU"
        );
        used.push((node.clone(), gres.clone()));
    }
    // Nothing of ours is left pending.
    let mut cmd = c.cmd("squeue");
    cmd.args(["-h", "-t", "PD", "-o", "%j"]);
    let (_, out, _) = c.run(cmd);
    assert!(
        !out.lines().any(|l| l.starts_with(PREFIX)),
        "stuck pending: {out}"
    );

    c.cancel_named(PREFIX);
    for id in [on1, on2, on3, on4] {
        c.wait(id, WAIT);
    }
    for node in ["node1", "node2", "node3", "node4"] {
        for g in 0..2 {
            c.sim_load(node, g, 0.0);
        }
    }
}

#[test]
fn help_documents_the_decision_table() {
    let c = Cluster::get();
    let mut cmd = c.matcher();
    cmd.arg("--help");
    let (ok, out, err) = c.run(cmd);
    assert!(ok, "{err}");
    for word in [
        "--once",
        "--dry-run",
        "--json",
        "--interval",
        "--evaluate",
        "JOB NAME ACTION NODE GPU SPEED REASON",
    ] {
        assert!(out.contains(word), "--help lacks {word}:\n{out}");
    }
}
