//! The matcher places an offline job only where Slurm can start it, on the
//! dev cluster (4 nodes x 4 CPUs x 2 simulated GPUs, `CR_Core`): a GPU
//! whose node has too few CPUs free for the job is no candidate (the job
//! waits with `waiting=node_room`, saying what it asked for), and two jobs
//! that each fit a node's free CPUs alone but not together are not both
//! sent there in one round.
//!
//! One test function: the matcher acts on every pending offline job of the
//! cluster, so the steps must not run in parallel with each other.

use std::time::Duration;

use muxflow_tests::{decision, Cluster};

const PREFIX: &str = "mfr-";
const WAIT: Duration = Duration::from_secs(90);
const SLEEP: &str = "#!/bin/sh\nexec sleep 600\n";

#[test]
fn offline_jobs_go_only_where_the_node_has_the_cpus_they_asked_for() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    c.wait_all_gpus_healthy();
    // Every GPU held by a plain job, then node1's given back: its two idle
    // GPUs are the only open ones.
    let holders = c.hold_free_gpus(&format!("{PREFIX}hold"));
    let on_node1: Vec<u32> = holders
        .iter()
        .copied()
        .filter(|&id| c.job_field(id, "NodeList") == "node1")
        .collect();
    assert!(!on_node1.is_empty(), "no GPU of node1 was free");
    c.scancel(&on_node1);
    let cpus = |n: &str| {
        c.sbatch(
            &[
                "-w",
                "node1",
                "-c",
                n,
                "--job-name",
                &format!("{PREFIX}cpus"),
            ],
            SLEEP,
        )
        .unwrap()
    };
    // A plain job takes all of node1's CPUs.
    let all = cpus("4");
    c.wait_running(all, WAIT);

    let offline = |i: u32| {
        let id = c
            .sbatch(
                &[
                    "--muxflow=offline",
                    "-c",
                    "2",
                    "--job-name",
                    &format!("{PREFIX}train-{i}"),
                ],
                SLEEP,
            )
            .unwrap();
        assert_eq!(
            c.job_field(id, "Reason"),
            "JobHeldUser",
            "job {id} not parked"
        );
        id
    };
    let first = offline(1);
    let round = c.matcher_once();
    let d = decision(&round, first);
    assert_eq!(
        d["node"],
        serde_json::Value::Null,
        "placed where it cannot start: {round}"
    );
    assert_eq!(d["waiting"], "node_room", "{round}");
    let reason = d["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no candidate: no node with a free GPU has the 2 CPUs"),
        "{reason}"
    );
    assert!(
        c.admin_comment(first).contains("waiting=node_room"),
        "{}",
        c.admin_comment(first)
    );

    // node1 has 2 CPUs free: room for one of two jobs of 2 CPUs, not both.
    c.scancel(&[all]);
    let half = cpus("2");
    c.wait_running(half, WAIT);
    let second = offline(2);
    let round = c.matcher_once();
    let (a, b) = (decision(&round, first), decision(&round, second));
    let (placed, waits) = match (a["action"].as_str(), b["action"].as_str()) {
        (Some("place"), _) => (first, b),
        (_, Some("place")) => (second, a),
        _ => panic!("neither placed: {round}"),
    };
    assert_eq!(waits["waiting"], "node_room", "{round}");
    assert!(
        waits["reason"]
            .as_str()
            .unwrap()
            .contains("jobs placed on node1 this round"),
        "{round}"
    );
    assert_eq!(c.wait_running(placed, WAIT), "node1");

    c.cancel_named(PREFIX);
    c.assert_no_drain();
}
