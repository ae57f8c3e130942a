//! One user cannot stop offline placement for everyone else (issue 31,
//! H3), tried as the ordinary user `nobody`: more offline jobs than the
//! round's window (4 per open GPU) that can never be placed (three GPUs on
//! one node, where nodes have two) come first in the queue; another user's
//! placeable job still gets a GPU in the next round, and the unplaceable
//! ones say why they wait (`free_node`). (With the matcher running such
//! jobs are refused at submit: tests/submit_shape.rs.)

use muxflow_tests::{decision, CancelNamed, Cluster};

const PREFIX: &str = "mfq-";

#[test]
fn unplaceable_jobs_of_one_user_do_not_hold_the_round_for_another() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    c.wait_all_gpus_healthy();
    let script = "#!/bin/sh\nexec sleep 300\n";
    // Submitted while no matcher wrote the cluster's shape (it was down),
    // job_submit.lua cannot refuse them (tests/submit_shape.rs): they reach
    // the queue. The round below writes it again.
    let _ = std::fs::remove_file(c.dir.join("var/lib/muxflow-matcher/cluster-shape"));
    // 8 open GPUs: a window of 32 held jobs; 40 that can never go anywhere.
    let blockers: Vec<u32> = (0..40)
        .map(|i| {
            c.sbatch_as(
                "nobody",
                &[
                    "--muxflow=offline",
                    "--gres=gpu:3",
                    "--job-name",
                    &format!("{PREFIX}blocker-{i}"),
                ],
                script,
            )
            .unwrap()
        })
        .collect();
    let theirs = c
        .sbatch(
            &[
                "--muxflow=offline",
                "--job-name",
                &format!("{PREFIX}theirs"),
            ],
            script,
        )
        .unwrap();
    let round = c.matcher_once();
    let d = decision(&round, theirs);
    assert_eq!(d["action"], "place", "{d}");
    for &b in &blockers[..3] {
        let d = decision(&round, b);
        assert_eq!(d["waiting"], "free_node", "{d}");
    }
    c.scancel(&blockers);
    c.scancel(&[theirs]);
    c.assert_no_drain();
}
