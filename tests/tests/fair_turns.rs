//! One user's long queue does not take a whole round's placements (issue
//! 31, M6), tried as the ordinary user `nobody`: ten offline jobs of
//! nobody come first in the queue, then one of another user; with eight
//! idle GPUs and every job predicted alike, the round places the other
//! user's job too (users take turns: nobody's oldest, the other's, then
//! nobody's next), where it used to place nobody's eight oldest and leave
//! it waiting (`older_jobs_first`).

use muxflow_tests::{decision, CancelNamed, Cluster};

const PREFIX: &str = "mft-";

#[test]
fn one_users_long_queue_does_not_take_the_whole_round() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    c.wait_all_gpus_healthy();
    let script = "#!/bin/sh\nexec sleep 300\n";
    let submit = |user: &str, name: &str| {
        c.sbatch_as(
            user,
            &[
                "--muxflow=offline",
                "--job-name",
                &format!("{PREFIX}{name}"),
            ],
            script,
        )
        .unwrap()
    };
    let queue: Vec<u32> = (0..10).map(|_| submit("nobody", "queue")).collect();
    let theirs = submit("root", "theirs");
    let round = c.matcher_once();
    let d = decision(&round, theirs);
    assert_eq!(d["action"], "place", "{d}\n{round}");
    // The first user still gets its share: seven of the eight GPUs.
    let placed: Vec<u32> = queue
        .iter()
        .copied()
        .filter(|&j| decision(&round, j)["action"] == "place")
        .collect();
    assert_eq!(placed, queue[..7], "{round}");
    c.assert_no_drain();
}
