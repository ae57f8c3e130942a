//! muxflow beside a site's own node scripts (issue 17): the shipped
//! prolog.d/epilog.d drop-ins run next to the site's (the dev cluster's
//! slurm.conf has `Prolog=<dir>/prolog.d/*`, with muxflow's `50-muxflow`
//! and a site's `10-site` that logs each job), and the health check as an
//! NHC check: a lost GPU is reported, the node drained with the check's
//! reason, muxflow's own drain not added. No NHC is installed here: the
//! run is NHC-style — the shipped `etc/nhc/muxflow.nhc` sourced by bash
//! with NHC's `die` stood in for by what NHC's node-mark-offline does
//! (`scontrol update State=DRAIN Reason="NHC: <message>"`).

use std::time::Duration;

use muxflow_tests::{target, Cluster};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_site_prolog_and_epilog_run_beside_muxflows() {
    let c = Cluster::get();
    let node = "node2";
    let id = c
        .sbatch(
            &["--muxflow=online", "--gres=gpu:1", "-w", node],
            "#!/bin/sh\necho online-ran\n",
        )
        .unwrap();
    assert_eq!(c.wait(id, WAIT).state, "COMPLETED");
    // The site's scripts ran for this job…
    let line = |hook: &str| format!("site {hook} job={id} node={node}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let prolog = std::fs::read_to_string(c.dir.join("log/site-prolog.log")).unwrap_or_default();
        let epilog = std::fs::read_to_string(c.dir.join("log/site-epilog.log")).unwrap_or_default();
        if prolog.contains(&line("prolog")) && epilog.contains(&line("epilog")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "site scripts did not run for job {id}: {prolog}{epilog}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // …and so did muxflow's: its Prolog recorded the job, its Epilog forgot it.
    let log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("recorded muxflow job") && l.contains(&format!("job={id}"))),
        "{log}"
    );
    c.assert_no_drain();
}

/// One NHC run of the shipped check on `node`: (check's exit, output).
fn nhc_check(c: &Cluster, cfg: &std::path::Path, node: &str) -> (bool, String) {
    let nhc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/nhc/muxflow.nhc");
    let script = format!(
        r#"die() {{ scontrol update NodeName="$HOSTNAME" State=DRAIN Reason="NHC: $2"; echo "died: $2"; }}
           . '{nhc}'
           check_muxflow"#,
        nhc = nhc.display()
    );
    let mut cmd = c.cmd("bash");
    // The program NHC's check runs, with this test's config (as an admin's
    // muxflow.toml would be found beside slurm.conf).
    let health = c.scratch("nhc").join("muxflow-health");
    muxflow::test_support::write_executable(
        &health,
        &format!(
            "#!/bin/sh\nexec {} --config {} \"$@\"\n",
            target().join("muxflow-health").display(),
            cfg.display()
        ),
    );
    cmd.arg("-c")
        .arg(script)
        .env("HOSTNAME", node)
        .env("SLURMD_NODENAME", node)
        .env("MUXFLOW_HEALTH", &health);
    let (ok, out, err) = c.run(cmd);
    (ok, out + &err)
}

#[test]
fn an_nhc_check_reports_a_lost_gpu_and_nhc_drains_with_its_own_reason() {
    let c = Cluster::get();
    let (node, gpu) = ("node3", 1);
    let cfg = c.health_config("nhc", "min_dwell_s = 1\nrecovery_quiet_s = 1\n");
    let (ok, out) = nhc_check(&c, &cfg, node);
    assert!(
        ok && !out.contains("died"),
        "healthy node failed the check: {out}"
    );
    assert!(!c.node_reason(node).0.contains("drain"));

    c.sim_fault(node, gpu, &["lost"]);
    let (ok, out) = nhc_check(&c, &cfg, node);
    let (state, reason) = c.node_reason(node);
    // muxflow's own health check on the drained node, GPU still lost: it
    // neither replaces NHC's reason nor drains a second time.
    c.health_step(&cfg, node);
    let after_muxflow = c.node_reason(node);
    // Undo before asserting, so a failure leaves the cluster usable.
    c.sim_fault(node, gpu, &["clear"]);
    c.health_step(&cfg, node);
    let mut resume = c.cmd("scontrol");
    resume.args(["update", &format!("NodeName={node}"), "State=RESUME"]);
    let resumed = c.run(resume).0;

    assert!(!ok, "the check passed with a lost GPU: {out}");
    assert!(out.contains("died: check_muxflow: gpu1 lost"), "{out}");
    assert!(state.contains("drain"), "{state} {reason}");
    // NHC's reason, not muxflow's own drain.
    assert_eq!(reason, "NHC: check_muxflow: gpu1 lost (NVML: GPU is lost)");
    // Its reason unchanged and the node still drained: the state itself may
    // move from "draining" to "drained" meanwhile, as a job there ends.
    assert_eq!(after_muxflow.1, reason);
    assert!(after_muxflow.0.contains("drain"), "{after_muxflow:?}");
    assert!(resumed);
    c.assert_no_drain();
}
