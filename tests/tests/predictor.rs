//! The pair-speed predictor on the dev cluster (issue 14): the matcher
//! reads earlier shared runs from the real sacct (AdminComment records
//! naming their online partner by job id), learns each offline job's
//! speed next to each online job, and places two offline jobs the way
//! their history favours, where the default predictor sees two alike GPUs.
//!
//! The history is written into AdminComment as the plugin writes it (an
//! offline run's launches, the node's `run_s`, its partner, the partner's
//! load `partner_load_pct` that muxflow-police measures: job_path.rs checks
//! that a real shared run records it).

use std::time::Duration;

use muxflow_tests::{decision, CancelNamed, Cluster};

const PREFIX: &str = "mfp-";
const WAIT: Duration = Duration::from_secs(60);

fn scontrol(c: &Cluster, args: &[&str]) {
    let mut cmd = c.cmd("scontrol");
    cmd.args(args);
    let (ok, out, err) = c.run(cmd);
    assert!(ok, "scontrol {args:?}: {out}{err}");
}

/// A finished offline run with `report` in its AdminComment.
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
    );
    scontrol(c, &["release", &id.to_string()]);
    id
}

#[test]
fn history_of_shared_runs_gives_two_jobs_different_predictions_and_the_pairing_it_favours() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    // Its online and fill jobs hold every GPU: gone however the test ends.
    let _cancel = CancelNamed(&c, PREFIX);
    let quick = c.health_config("predictor-health", "min_dwell_s = 1\nrecovery_quiet_s = 1");

    // Two alike online jobs: the same SM activity and memory, so the SM
    // share, the room and the default prediction are the same on both.
    let (on1, g1) = c.online_workload("mfp-online-1", "node1", 0.2, 4000);
    let (on2, g2) = c.online_workload("mfp-online-2", "node2", 0.2, 4000);
    c.settle_healthy(&quick, "node1", g1, 4000);
    c.settle_healthy(&quick, "node2", g2, 4000);
    // Idle GPUs would take both jobs at their solo speed (issue 15): held
    // by plain jobs, only the two online GPUs are candidates.
    c.hold_free_gpus(&format!("{PREFIX}fill"));

    // Earlier shared runs: mfp-a (900 launches/s with an idle partner) ran
    // at 0.9 of that next to online-1 and 0.4 next to online-2; mfp-b (40
    // launches/s) at 0.5 and 0.7. Three runs per pair, at partner loads of
    // 30, 60 and 90%: progress = solo × (1 − load × (1 − x)).
    let mut ids = Vec::new();
    for (job, solo, pairs) in [
        ("mfp-a", 900.0, [(on1, 0.9), (on2, 0.4)]),
        ("mfp-b", 40.0, [(on1, 0.5), (on2, 0.7)]),
    ] {
        for (partner, x) in pairs {
            for load in [30u32, 60, 90] {
                let l = f64::from(load) / 100.0;
                let launches = (solo * (1.0 - l * (1.0 - x)) * 600.0).round() as u64;
                ids.push(history(
                    &c,
                    job,
                    &format!(
                        "muxflow:v1 mode=offline sm_pct=70 mem_cap_mib=75000 partner={partner} \
                         measured_peak_mib=3000 run_s=600 partner_load_pct={load} claim.launches={launches}"
                    ),
                ));
            }
        }
    }
    for id in &ids {
        c.sacct_until(*id, "AdminComment", |l| l.contains("claim.launches"));
    }
    // The matcher keys history by sacct --json's (user, name) and reads it
    // by time window (`-S`), as below. For a moment after a job ends
    // slurmdbd can list it without its user, or named "allocation" and
    // outside the window (seen when the whole suite ran first: the job's
    // start record arrives after its end): wait until every record reads
    // as a daemon's next round would see it.
    let want: std::collections::HashMap<u32, &str> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, if i < ids.len() / 2 { "mfp-a" } else { "mfp-b" }))
        .collect();
    let start = std::time::Instant::now();
    loop {
        let mut cmd = c.cmd("sacct");
        cmd.args(["--json", "-X", "-a", "-S", "now-1days"]);
        let (_, out, _) = c.run(cmd);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let listed = v["jobs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|j| {
                        // A plain number (22.05) or {"number": N} (later releases).
                        let id = j["job_id"]
                            .as_u64()
                            .or_else(|| j["job_id"]["number"].as_u64())
                            .unwrap_or(0) as u32;
                        want.get(&id).is_some_and(|&name| {
                            j["name"].as_str() == Some(name) && j["user"].as_str() == Some("root")
                        })
                    })
                    .count()
            })
            .unwrap_or(0);
        if listed == ids.len() {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "sacct never listed the {} history records by name and owner ({listed} listed): {out}",
            ids.len()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let a = c.offline_parked("mfp-a");
    let b = c.offline_parked("mfp-b");

    let mut cmd = c.matcher();
    cmd.args(["--once", "--dry-run", "--json"]);
    let (ok, out, err) = c.run(cmd);
    assert!(ok, "muxflow-matcher --once: {out}{err}");
    let round: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = |id: u32| decision(&round, id);
    let (da, db) = (d(a), d(b));
    assert_eq!(
        (da["node"].as_str(), da["gpu"].as_u64()),
        (Some("node1"), Some(g1.into())),
        "{round}"
    );
    assert_eq!(
        (db["node"].as_str(), db["gpu"].as_u64()),
        (Some("node2"), Some(g2.into())),
        "{round}"
    );
    let (pa, pb) = (
        da["predicted"].as_f64().unwrap(),
        db["predicted"].as_f64().unwrap(),
    );
    assert!((pa - 0.9).abs() < 0.1, "mfp-a next to online-1: {round}");
    assert!((pb - 0.7).abs() < 0.1, "mfp-b next to online-2: {round}");
    for x in [&da, &db] {
        let sd = x["confidence"].as_f64().unwrap();
        assert!(
            sd > 0.0 && sd < 0.3,
            "a pair with history is surer than the default: {round}"
        );
    }

    // The table shows each prediction with its confidence.
    let mut cmd = c.matcher();
    cmd.args(["--once", "--dry-run"]);
    let (ok, table, err) = c.run(cmd);
    assert!(ok, "{table}{err}");
    let speed = |id: u32| {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no line for {id}:\n{table}"));
        line.split_whitespace().nth(5).unwrap().to_string()
    };
    let (sa, sb) = (speed(a), speed(b));
    assert!(sa.contains('±') && sb.contains('±'), "{table}");
    assert_ne!(sa, sb, "SPEED is not a constant:\n{table}");

    // --evaluate on the cluster's own history prints the same figures as
    // muxflow-sim predictor.
    let mut cmd = c.matcher();
    cmd.arg("--evaluate");
    let (ok, out, err) = c.run(cmd);
    assert!(ok, "{out}{err}");
    assert!(out.lines().last().unwrap().starts_with("mae="), "{out}");

    c.cancel_named(PREFIX);
    for id in [on1, on2] {
        c.wait(id, WAIT);
    }
    for node in ["node1", "node2"] {
        for g in 0..2 {
            c.sim_load(node, g, 0.0);
        }
    }
}
