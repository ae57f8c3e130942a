//! Only muxflow places offline work (issue 13, findings 1 and 4), tried as
//! a user of the cluster would (`nobody`, through runuser): the offline
//! slot cannot be asked for at submit, a parked offline job cannot be
//! moved or released by its user, and the Prolog refuses an offline job
//! whose slot is not the one muxflow-matcher wrote into its AdminComment or
//! whose GPU is not Healthy — the job goes back to the queue, held, with the
//! reason in its output and AdminComment, runs once the matcher places it,
//! and no node drains.

use std::time::Duration;

use muxflow::policy::health::HealthState;
use muxflow_tests::Cluster;

const WAIT: Duration = Duration::from_secs(90);
const USER: &str = "nobody";
const DENIED: &str = "Access/permission denied";
/// GPU 0's offline slot on `node`, as an operator would give it by hand
/// (root, no placement written by the matcher).
fn place_by_hand(c: &Cluster, id: u32, node: &str) {
    let mut cmd = c.cmd("scontrol");
    cmd.args([
        "update",
        &format!("JobId={id}"),
        &format!("ReqNodeList={node}"),
        "Gres=mfslot:g0:1",
    ]);
    assert!(c.run(cmd).0);
}

fn release(c: &Cluster, id: u32) {
    let mut cmd = c.cmd("scontrol");
    cmd.args(["release", &id.to_string()]);
    assert!(c.run(cmd).0);
}

#[test]
fn a_user_cannot_ask_for_the_offline_slot() {
    let c = Cluster::get();
    struct Case {
        name: &'static str,
        args: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "the issue's raw job next to an online job",
            args: &["--gres=mfslot:g0:1", "-w", "node2"],
        },
        Case {
            name: "the slot beside a GPU",
            args: &["--gres=gpu:1,mfslot:g1:1"],
        },
        Case {
            name: "an online job taking a slot too",
            args: &["--muxflow=online", "--gres=mfslot:g0:1"],
        },
        Case {
            name: "an untyped slot",
            args: &["--gres=mfslot:1"],
        },
        Case {
            name: "all slots of a GPU (sized slots are the matcher's too)",
            args: &["--gres=mfslot:g0:2"],
        },
    ];
    for case in cases {
        let got = c.sbatch_as(USER, case.args, "#!/bin/sh\necho raw-ran\n");
        let err = got.expect_err(case.name);
        assert!(
            err.contains("is placed by muxflow only") && err.contains("--muxflow=offline"),
            "{}: {err}",
            case.name
        );
    }

    // Nor can the user add it to a job afterwards.
    let plain = c
        .sbatch_as(USER, &["--gres=gpu:1", "--hold"], "#!/bin/sh\ntrue\n")
        .unwrap();
    let id = plain.to_string();
    let (ok, out) = c.scontrol_as(
        USER,
        &["update", &format!("JobId={id}"), "Gres=mfslot:g0:1"],
    );
    assert!(!ok && out.contains(DENIED), "{out}");
    // Slurm 24.11 writes `gres/gpu:1`.
    assert_eq!(
        c.job_field(plain, "TresPerNode").replace("gres/", "gres:"),
        "gres:gpu:1"
    );
    // Root (an administrator) still can: the rule is about users.
    let mut cmd = c.cmd("scontrol");
    cmd.args(["update", &format!("JobId={id}"), "Comment=checked"]);
    assert!(c.run(cmd).0);
    c.scancel(&[plain]);
    c.assert_no_drain();
}

#[test]
fn a_user_cannot_move_or_release_a_parked_offline_job() {
    let c = Cluster::get();
    let id = c
        .sbatch_as(
            USER,
            &["--muxflow=offline", "--job-name", "guard-parked"],
            "#!/bin/sh\necho offline-ran\n",
        )
        .unwrap();
    let job = format!("JobId={id}");
    let attacks: [&[&str]; 7] = [
        // The attack: place it yourself, then release it.
        &["update", &job, "ReqNodeList=node1", "Gres=mfslot:g0:1"],
        &["update", &job, "Gres=mfslot:g1:1"],
        &["update", &job, "Gres=mfslot:g1:2"],
        &["update", &job, "ReqNodeList=node1"],
        &["update", &job, "ExcNodeList=node3"],
        &["update", &job, "Features=gpu"],
        &["release", &id.to_string()],
    ];
    for args in attacks {
        let (ok, out) = c.scontrol_as(USER, args);
        assert!(!ok && out.contains(DENIED), "{args:?} as {USER}: {out}");
    }
    // Still parked, exactly as job_submit.lua left it.
    assert_eq!(c.job_field(id, "JobState"), "PENDING");
    assert_eq!(c.job_field(id, "Reason"), "JobHeldUser");
    assert_eq!(c.job_field(id, "ReqNodeList"), "(null)");
    assert_eq!(c.job_field(id, "ExcNodeList"), "(null)");
    assert!(
        !c.job_field(id, "TresPerNode").contains("mfslot"),
        "{}",
        c.job_field(id, "TresPerNode")
    );
    // Keeping it held and cancelling it remain the user's.
    let (ok, out) = c.scontrol_as(USER, &["hold", &id.to_string()]);
    assert!(ok, "{out}");

    // The matcher (root here) places it; it runs to the end.
    c.place(id, "node3", 1);
    let end = c.wait(id, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}: {}", c.output_or_empty(id));
    assert!(c.output(id).contains("offline-ran"));
    c.assert_no_drain();
}

#[test]
fn the_prolog_refuses_a_slot_muxflow_did_not_write_and_a_gpu_that_is_not_healthy() {
    let c = Cluster::get();
    let node = "node4";
    let script = "#!/bin/sh\necho offline-ran\n";

    // 1. A slot no matcher wrote (users cannot write one any more; an
    // operator's hand placement or a stale hint can): refused, and back in
    // the queue for the matcher.
    let id = c.sbatch_as(USER, &["--muxflow=offline"], script).unwrap();
    place_by_hand(&c, id, node);
    release(&c, id);
    let out = c.wait_requeued_held(id, WAIT);
    assert!(
        out.contains(&format!("offline job {id} refused on {node}"))
            && out.contains("muxflow-matcher never placed it")
            && out.contains("goes back to the queue"),
        "{out}"
    );
    assert!(!out.contains("offline-ran"), "ran unplaced: {out}");
    assert_eq!(
        c.admin_comment(id),
        "muxflow:v1 mode=offline refusals=1 refused=not_placed"
    );
    c.assert_no_drain();
    // Nothing is lost: placed by the matcher, it runs.
    c.place(id, node, 0);
    c.start_now(id);
    assert_eq!(c.wait(id, WAIT).state, "COMPLETED");
    assert!(c.output(id).contains("offline-ran"));

    // 2. Placed by the matcher, but the GPU turned Faulty (an Xid 79 in
    // the kernel log) before the job started: refused.
    let gpu = 1;
    let cfg = c.health_config(
        "guard",
        "min_dwell_s = 1\nrecovery_quiet_s = 1\nxid_watch_ms = 0\n",
    );
    let ns = c.node_state(&cfg, node);
    c.sim_fault(node, gpu, &["xid", "79"]);
    c.step_until(&cfg, node, "gpu1 faulty", || {
        ns.health(gpu).unwrap() == Some(HealthState::Faulty)
    });
    let id = c.sbatch_as(USER, &["--muxflow=offline"], script).unwrap();
    c.write_placement(id, node, gpu);
    let out = c.wait_requeued_held(id, WAIT);
    assert!(out.contains("GPU 1 is faulty"), "{out}");
    assert!(!out.contains("offline-ran"), "ran on a faulty GPU: {out}");
    assert_eq!(
        c.admin_comment(id),
        "muxflow:v1 mode=offline refusals=1 refused=gpu_faulty"
    );
    assert!(
        ns.find_job(id).unwrap().is_none(),
        "refused jobs are not recorded"
    );
    c.assert_no_drain();

    // Healthy again, the matcher's placement runs.
    c.step_until(&cfg, node, "gpu1 healthy", || {
        ns.health(gpu).unwrap() == Some(HealthState::Healthy)
    });
    assert!(
        ns.refusal(id).unwrap().is_none(),
        "the Epilog forgets the refusal"
    );
    c.place(id, node, gpu);
    c.start_now(id);
    assert_eq!(c.wait(id, WAIT).state, "COMPLETED");
    assert!(c.output(id).contains("offline-ran"));
    c.assert_no_drain();
}

/// A job the nodes keep refusing does not go round for ever: each Prolog's
/// refusal counts in its AdminComment (kept by the matcher's texts), and
/// its third refusal fails it with the reason instead of requeueing it.
#[test]
fn a_job_refused_three_times_fails_instead_of_going_back_again() {
    let c = Cluster::get();
    let node = "node2";
    let id = c
        .sbatch_as(
            USER,
            &["--muxflow=offline"],
            "#!/bin/sh\necho offline-ran\n",
        )
        .unwrap();
    // A slot muxflow never wrote (an operator's hand placement): refused
    // `not_placed` at every start.
    place_by_hand(&c, id, node);
    release(&c, id);
    for n in 1..=2 {
        let out = c.wait_requeued_held_times(id, n, WAIT);
        assert!(out.contains("goes back to the queue"), "{out}");
        assert!(
            c.admin_comment(id).contains(&format!("refusals={n} ")),
            "{}",
            c.admin_comment(id)
        );
        release(&c, id);
        c.start_now(id);
    }
    let end = c.wait(id, WAIT);
    let out = c.output_or_empty(id);
    assert_eq!(end.state, "FAILED", "{end:?}: {out}");
    assert!(out.contains("stopped 3 times, so it fails now"), "{out}");
    assert!(!out.contains("offline-ran"), "{out}");
    c.assert_no_drain();
}
