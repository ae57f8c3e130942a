//! The replay learns from a failed start at once, as the daemon (which
//! retrains every round) does: a job name that could not start beside an
//! online service is not proposed beside it again. A node of 8 GPUs,
//! online services on half of them, a pair table where nothing co-locates.
//! Half a day of short jobs on the idle GPUs builds a long history (the
//! replay retrains only when it grows by a tenth); then a burst of jobs of
//! one name overflows the idle GPUs: each service is tried once.

mod common;

use common::*;
use muxflow_sim::replay::PolicyKind;
use muxflow_sim::scenario::Settings;

#[test]
fn a_pair_that_failed_to_start_is_not_proposed_again() {
    let settings = Settings {
        days: 1.0,
        online_fill: 0.5,
        offline_load: 0.0,
        round_interval_s: 300.0,
        ..Settings::default()
    };
    let inputs = inputs(
        "sn,gpu,model\nn1,8,V100M16\n",
        "name,num_gpu,gpu_milli,gpu_spec,qos\nsvc,1,1000,,LS\nwarm,1,1000,,BE\nburst,1,1000,,BE\n",
        "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,A,10,10,0,0\nA,B,10,10,0,0\nB,B,10,10,0,0\n",
    );
    let mut sc = muxflow_sim::prepare(&inputs, &settings).expect("valid inputs");
    let services = sc.online.iter().filter(|s| s.is_some()).count() as u64;
    // Each name fails at most once in each slot of each GPU (all in its
    // first round there: the round places several jobs of a name at once).
    let names = 2;
    let gpus = 8;
    assert!(services >= 2, "{services} services");
    // 12 h of 60-s jobs every 100 s (task 1): a history of ~430 runs,
    // so the replay's model is retrained only every ~43 more.
    let mut jobs: Vec<_> = (0..430)
        .map(|i| job(i + 1, f64::from(i) * 100.0, 60.0, 1, 0))
        .collect();
    // Then 40 two-hour jobs of one name (task 2) at once.
    jobs.extend((0..40).map(|i| job(431 + i, 44_000.0, 7200.0, 2, 0)));
    sc.jobs = jobs;
    let cfg = muxflow::Config::default();
    for kind in [PolicyKind::Muxflow, PolicyKind::MuxflowN(2)] {
        let o = replay(&sc, kind, &cfg, &settings);
        let failed = o.oom_starts.unwrap();
        let slots = names * gpus * u64::from(kind.offline_per_gpu());
        assert!(
            failed <= slots,
            "{}: {failed} failed starts, {names} names in {slots} slots: a pair that failed was proposed again",
            kind.name()
        );
        assert!(
            o.offline_finished > 400,
            "{}: the idle GPUs still take work",
            kind.name()
        );
    }
}
