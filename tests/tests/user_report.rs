//! `muxflow-report JOBID` on the dev cluster (issue 18): a user reads what
//! sharing did to their own job from the real sacct; another user is
//! refused without learning any name; an administrator sees every job; a
//! running job says where it runs and when its figures come; a job
//! submitted without --muxflow gets an error that says what to do.

use std::time::Duration;

use muxflow_tests::{target, CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(60);
const USER: &str = "nobody";

/// `muxflow-report args…` as `user` (None: root): (success, stdout, stderr).
fn report(c: &Cluster, user: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let program = target().join("muxflow-report");
    let mut cmd = match user {
        Some(u) => c.cmd_as(u, program.to_str().unwrap()),
        None => c.cmd(program.to_str().unwrap()),
    };
    cmd.args(args);
    c.run(cmd)
}

#[test]
fn a_user_reads_their_job_others_are_refused_admins_see_all() {
    let c = Cluster::get();
    c.cancel_named("mfr-");
    let _cancel = CancelNamed(&c, "mfr-");
    let node = "node3";
    // root's service, named so that a leak would show.
    let (online, gpu) = c.online_workload("mfr-secret-service", node, 0.2, 512);

    // While the service runs: where, and that its figures come at the end.
    let (ok, out, err) = report(&c, None, &[&online.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("runs on") && out.contains("written when its batch step ends"),
        "{out}"
    );

    let script = format!("#!/bin/sh\n{}\n", c.workload("offline --duration 3"));
    let offline = c
        .sbatch_as(
            USER,
            &["--muxflow=offline", "--job-name", "mfr-train"],
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
    c.sacct_until(offline, "AdminComment", |l| l.contains("run_s="));
    c.sacct_until(offline, "User", |l| l.contains(USER));

    // The owner: partner by ID, limits, throttling, speed; no partner name.
    let (ok, out, err) = report(&c, Some(USER), &[&offline.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("shared with      online job {online}")),
        "{out}"
    );
    assert!(
        out.contains("SM share") && out.contains("memory cap"),
        "{out}"
    );
    assert!(
        out.contains("throttled") && out.contains("OOM refusals"),
        "{out}"
    );
    assert!(out.contains("speed"), "{out}");
    assert!(
        !out.contains("secret"),
        "another user's job name leaked:\n{out}"
    );
    let (ok, json, err) = report(&c, Some(USER), &[&offline.to_string(), "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["partner"], online);
    assert_eq!(v["mode"], "offline");
    assert!(!json.contains("secret"), "{json}");

    // Another user's job: refused, nothing of it printed.
    let (ok, out, err) = report(&c, Some(USER), &[&online.to_string()]);
    assert!(!ok, "{out}");
    assert!(err.contains("belongs to another user"), "{err}");
    assert!(
        !err.contains("secret") && !out.contains("secret"),
        "{out}{err}"
    );

    // An administrator (root) sees the service once it ended, with its
    // offline partner by ID.
    c.cancel_named("mfr-secret");
    c.wait(online, WAIT);
    let line = c.sacct_until(online, "AdminComment", |l| l.contains("mode=online"));
    assert!(line.contains("mode=online"), "{line}");
    let (ok, out, err) = report(&c, None, &[&online.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("offline partner  job {offline}")),
        "{out}"
    );
    // Its cost needs unshared runs of the same service to compare with.
    assert!(out.contains("sharing cost     unknown"), "{out}");

    // A job submitted without --muxflow.
    let plain = c
        .sbatch_as(USER, &["--job-name", "mfr-plain"], "#!/bin/sh\ntrue\n")
        .unwrap();
    c.wait(plain, WAIT);
    c.sacct_until(plain, "State", |l| l.contains("COMPLETED"));
    // Seen here: for a moment after a job of a user without an accounting
    // association ends, sacct names root as its owner (the report then
    // refuses, the safe side); wait for the record to settle.
    c.sacct_until(plain, "User", |l| l.contains(USER));
    let (ok, _, err) = report(&c, Some(USER), &[&plain.to_string()]);
    assert!(
        !ok && err.contains("not a muxflow job") && err.contains("--muxflow"),
        "{err}"
    );

    // No such job.
    let (ok, _, err) = report(&c, Some(USER), &["999999"]);
    assert!(!ok && err.contains("no such job"), "{err}");
    c.assert_no_drain();
}
