//! Services that come and go (`--autoscale`, issue 30), by hand: one node
//! of 2 GPUs, one service of 2 replicas (both GPUs at the peak), one
//! offline job of 50,000 s of work arriving at t = 0; no pair co-locates.
//!
//! The service runs `ceil(2 × load)` replicas: the diurnal load is above
//! 0.5 from 10:00 to 22:00 (0.55 at both), so the newest replica stops at
//! 00:00 (GPU 1 idle), starts again at 10:00 on the first GPU Slurm sees
//! free — GPU 1, where the offline job runs — and stops at 23:00.
//!
//! Under `exclusive` the job starts at once on GPU 1 and has done 36,000 s
//! at 10:00; with a checkpoint every 7,000 s its last one holds 35,000 s,
//! so the requeue costs exactly 1,000 s; it waits (both GPUs online) and
//! runs again from 23:00 to the end of the day (3,600 s).

mod common;

use common::*;
use muxflow_sim::replay::{Churn, Outcome, PolicyKind};
use muxflow_sim::scenario::{replicas_for, Checkpointing, Scenario, Settings, REQUEUE_EXIT_S};

fn scenario(checkpoint: Checkpointing) -> (Scenario, Settings) {
    scenario_on("sn,gpu,model\nn1,2,V100M16\n", checkpoint)
}

fn scenario_on(nodes: &str, checkpoint: Checkpointing) -> (Scenario, Settings) {
    let settings = Settings {
        days: 1.0,
        online_fill: 1.0,
        offline_load: 0.0,
        autoscale: true,
        checkpoint,
        // The hand traces count in the 900-s rounds they were written for.
        round_interval_s: 900.0,
        ..Settings::default()
    };
    let inputs = inputs(
        nodes,
        "name,num_gpu,gpu_milli,gpu_spec,qos\nsvc,1,1000,,LS\ntrain,1,1000,,BE\n",
        "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,A,10,10,0,0\n",
    );
    let mut sc = muxflow_sim::prepare(&inputs, &settings).expect("valid inputs");
    sc.jobs = vec![job(1, 0.0, 50_000.0, 1, 0)];
    (sc, settings)
}

fn every_7000_s() -> Checkpointing {
    Checkpointing {
        interval_s: 7000.0,
        ..Checkpointing::default()
    }
}

fn churn(o: &Outcome) -> &Churn {
    o.churn.as_ref().expect("--autoscale reports its churn")
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() < 1e-6, "{what}: {a} != {b}");
}

#[test]
fn the_scaling_rule_follows_the_load_at_its_documented_points() {
    let load = muxflow_sim::model::diurnal_load;
    assert_eq!(replicas_for(2, load(0)), 1); // 0.325
    assert_eq!(replicas_for(2, load(9)), 1); // 0.434
    assert_eq!(replicas_for(2, load(10)), 2); // 0.55
    assert_eq!(replicas_for(2, load(22)), 2); // 0.55
    assert_eq!(replicas_for(2, load(23)), 1); // 0.434
    assert_eq!(replicas_for(10, load(4)), 1); // 0.10: exactly 1, not 2
    assert_eq!(replicas_for(10, load(16)), 10);
    assert_eq!(replicas_for(1, 0.01), 1); // never below one
}

#[test]
fn a_replica_landing_on_an_idle_gpu_costs_the_work_since_the_checkpoint() {
    let (sc, s) = scenario(every_7000_s());
    assert_eq!((sc.replicas.len(), sc.services), (2, 1));
    let o = replay(&sc, PolicyKind::Exclusive, &muxflow::Config::default(), &s);
    let c = churn(&o);
    assert_eq!(c.requeues, 1);
    close(c.lost_gpu_hours.0 * 3600.0, 1000.0, "lost work, s");
    // Work done: 36,000 s before the requeue, less the 1,000 s lost, and
    // 3,600 s after 23:00.
    close(
        o.offline_gpu_hours.0 * 3600.0,
        36_000.0 - 1000.0 + 3600.0,
        "work, s",
    );
    // One replica started (10:00), and it waited for the job's exit.
    assert_eq!((c.replica_starts, c.replica_stops), (1, 2));
    assert_eq!(c.starts_delayed, 1);
    close(c.start_delay_max_s.0, REQUEUE_EXIT_S, "delay");
    assert_eq!(c.replica_hours_short, 0);
    assert_eq!((o.offline_finished, o.offline_running_end), (0, 1));
    // Online GPU-hours: one replica all day, the other 10:00 to 23:00.
    close(c.online_gpu_hours, 24.0 + 13.0, "online GPU-h");
}

#[test]
fn checkpoint_on_requeue_saves_the_work_and_costs_the_replica_its_save() {
    let on_requeue = Checkpointing {
        on_requeue: true,
        ..every_7000_s()
    };
    let (sc, s) = scenario(on_requeue);
    let o = replay(&sc, PolicyKind::Exclusive, &muxflow::Config::default(), &s);
    let c = churn(&o);
    assert_eq!(c.requeues, 1);
    close(c.lost_gpu_hours.0, 0.0, "lost");
    close(o.offline_gpu_hours.0 * 3600.0, 36_000.0 + 3600.0, "work, s");
    close(c.start_delay_max_s.0, 20.0 + REQUEUE_EXIT_S, "delay");

    // A save longer than the grace does not finish: the periodic
    // checkpoint's loss, and the replica waits the whole grace.
    let too_slow = Checkpointing {
        save_s: 30.0,
        ..on_requeue
    };
    let (sc, s) = scenario(too_slow);
    let o = replay(&sc, PolicyKind::Exclusive, &muxflow::Config::default(), &s);
    let c = churn(&o);
    close(c.lost_gpu_hours.0 * 3600.0, 1000.0, "lost, s");
    close(c.start_delay_max_s.0, 25.0 + REQUEUE_EXIT_S, "delay");
}

#[test]
fn without_autoscale_services_hold_their_gpus() {
    let (sc, mut s) = scenario(every_7000_s());
    s.autoscale = false;
    let o = replay(&sc, PolicyKind::Exclusive, &muxflow::Config::default(), &s);
    assert!(o.churn.is_none());
    // No idle GPU ever: the job never starts.
    assert_eq!(o.offline_gpu_hours.0, 0.0);
}

/// Under muxflow on two 1-GPU nodes (the service's replicas on n1 and
/// n2; n2's stops at 00:00): the round first tries the job beside n1's
/// replica (the pair cannot co-locate: it fails at once and is learned),
/// then places it on n2's idle GPU at the 1,800-s round. At 10:00 n2's
/// replica lands on it: 34,200 s done, the last checkpoint at 28,000 s,
/// 6,200 s lost; it waits (the 36,000-s round tries it beside the new
/// replica, a new job the learned failure does not name) and restarts at
/// the 82,800-s round, just after the 23:00 step freed n2.
#[test]
fn under_muxflow_the_requeued_job_goes_back_to_the_round() {
    let (sc, s) = scenario_on("sn,gpu,model\nn1,1,V100M16\nn2,1,V100M16\n", every_7000_s());
    let o = replay(&sc, PolicyKind::Muxflow, &muxflow::Config::default(), &s);
    let c = churn(&o);
    assert_eq!(o.queue_s, [1800.0]);
    assert_eq!((c.requeues, c.starts_delayed), (1, 1));
    close(c.lost_gpu_hours.0 * 3600.0, 6200.0, "lost work, s");
    close(
        o.offline_gpu_hours.0 * 3600.0,
        34_200.0 - 6200.0 + 3600.0,
        "work, s",
    );
    close(c.start_delay_max_s.0, REQUEUE_EXIT_S, "delay");
    assert_eq!(o.oom_starts, Some(2));
    assert_eq!(o.offline_running_end, 1);
}

/// A 2-GPU job (a gang) is requeued whole and loses its progress since the
/// checkpoint on each of its GPUs. One node of 3 GPUs, a service of 3
/// replicas: `ceil(3 × load)` is 1 until 09:00 (0.325 at 00:00, 0.325 at
/// 08:00), so the gang starts at once on GPUs 1 and 2; at 09:00 (0.434:
/// 2 replicas) a replica lands on GPU 1, the lowest free one: 32,400 s
/// done on each GPU, 28,000 checkpointed, 2 × 4,400 GPU-s lost; it never
/// finds 2 free GPUs again that day.
#[test]
fn a_gang_is_requeued_whole_and_loses_on_each_of_its_gpus() {
    let settings = Settings {
        days: 1.0,
        online_fill: 1.0,
        offline_load: 0.0,
        autoscale: true,
        checkpoint: every_7000_s(),
        round_interval_s: 900.0,
        ..Settings::default()
    };
    let inputs = inputs(
        "sn,gpu,model\nn1,3,V100M16\n",
        "name,num_gpu,gpu_milli,gpu_spec,qos\nsvc,1,1000,,LS\ntrain,2,1000,,BE\n",
        "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,A,10,10,0,0\n",
    );
    let mut sc = muxflow_sim::prepare(&inputs, &settings).expect("valid inputs");
    sc.jobs = vec![muxflow_sim::scenario::OfflineJob {
        gpus: 2,
        ..job(1, 0.0, 50_000.0, 1, 0)
    }];
    assert_eq!(replicas_for(3, muxflow_sim::model::diurnal_load(8)), 1);
    assert_eq!(replicas_for(3, muxflow_sim::model::diurnal_load(9)), 2);
    let o = replay(
        &sc,
        PolicyKind::Exclusive,
        &muxflow::Config::default(),
        &settings,
    );
    let c = churn(&o);
    assert_eq!(c.requeues, 1);
    close(c.lost_gpu_hours.0 * 3600.0, 2.0 * 4400.0, "lost GPU-s");
    close(
        o.offline_gpu_hours.0 * 3600.0,
        2.0 * (32_400.0 - 4400.0),
        "work, GPU-s",
    );
    close(
        o.gang_gpu_hours.0,
        o.offline_gpu_hours.0,
        "all of it the gang's",
    );
    assert_eq!(o.offline_short_of_gpus, 0);
    assert_eq!(o.offline_waiting_end, 1);
}
