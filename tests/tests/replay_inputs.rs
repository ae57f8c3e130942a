//! `scripts/replay-inputs` on the dev cluster's own Slurm: the node list,
//! the task mix and the offline run times that `muxflow-sim` replays, from
//! `sinfo` and `sacct`, read back by the replay itself.

use std::path::Path;
use std::time::Duration;

use muxflow_tests::{target, CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_sites_nodes_and_jobs_become_a_replay() {
    let c = Cluster::get();
    c.cancel_named("mfri-");
    let _cancel = CancelNamed(&c, "mfri-");
    let since = String::from_utf8(
        std::process::Command::new("date")
            .args(["+%Y-%m-%dT%H:%M:%S", "-d", "-5 seconds"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let since = since.trim();
    let node = "node2";
    let (online, gpu) = c.online_workload("mfri-service", node, 0.2, 512);
    let script = format!("#!/bin/sh\n{}\n", c.workload("offline --duration 2"));
    let offline = c
        .sbatch_as(
            "nobody",
            &["--muxflow=offline", "--job-name", "mfri-train"],
            &script,
        )
        .unwrap();
    c.place(offline, node, gpu);
    assert_eq!(
        c.wait(offline, WAIT).state,
        "COMPLETED",
        "{}",
        c.output(offline)
    );
    c.sacct_until(offline, "AdminComment", |l| l.contains("mode=offline"));
    // The service's record names its GPU once it ended (the dev cluster's
    // accounting keeps no gres/gpu TRES: the AdminComment is what says).
    let mut scancel = c.cmd("scancel");
    scancel.arg(online.to_string());
    assert!(c.run(scancel).0);
    c.sacct_until(online, "AdminComment", |l| l.contains("mode=online"));

    let out = c.scratch("replay-inputs");
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/replay-inputs");
    // Without a type in the dev cluster's gres, the model must be given.
    let mut cmd = c.cmd(tool.to_str().unwrap());
    cmd.args(["--out", out.to_str().unwrap(), "--since", since]);
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("name no GPU type: pass --model"),
        "{stderr}"
    );
    let mut cmd = c.cmd(tool.to_str().unwrap());
    cmd.args(["--out", out.to_str().unwrap(), "--since", since])
        .args(["--model", "SIMGPU", "--gpu-mem-mib", "16384"]);
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{stdout}{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("nodes="), "{stdout}");
    assert!(last.contains(" untyped_nodes=0 "), "{stdout}");

    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    let nodes = read("nodes.csv");
    assert!(
        nodes
            .lines()
            .any(|l| l.starts_with(&format!("{node},")) && l.ends_with(",SIMGPU,16384")),
        "{nodes}"
    );
    let tasks = read("tasks.csv");
    assert!(
        tasks.contains(&format!("job-{online},1,1000,,LS")),
        "{tasks}"
    );
    assert!(
        tasks.contains(&format!("job-{offline},1,1000,,BE")),
        "{tasks}"
    );
    let runtimes = read("runtimes.csv");
    assert!(runtimes.lines().count() >= 2, "{runtimes}");

    // The replay reads them as they are.
    let mut sim = std::process::Command::new(target().join("muxflow-sim"));
    sim.args(["--nodes", out.join("nodes.csv").to_str().unwrap()])
        .args(["--trace", out.join("tasks.csv").to_str().unwrap()])
        .args([
            "--offline-runtimes",
            out.join("runtimes.csv").to_str().unwrap(),
        ])
        .args(["--days", "0.02", "--policies", "exclusive,muxflow"]);
    let (ok, stdout, stderr) = c.run(sim);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("replay: "), "{stdout}");
}
