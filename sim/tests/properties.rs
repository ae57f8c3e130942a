//! Properties of random small replays: capacity is never exceeded, no
//! offline work where muxflow's health states forbid it, every job is
//! accounted for, no job runs on fewer GPUs than it asked for, the same
//! seed gives the same result, and exclusive never lends a GPU-hour.

mod common;

use std::sync::atomic::AtomicU64;

use common::*;
use muxflow_sim::replay::{run, PolicyKind, RunOptions};
use muxflow_sim::scenario::{Checkpointing, PairLoad, Settings};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Trace {
    nodes: String,
    trace: String,
    pairs: String,
    runtimes: String,
    settings: Settings,
}

fn trace() -> impl Strategy<Value = Trace> {
    let node = (1u32..=4, prop::bool::ANY);
    let task = (
        1u32..=4,
        prop::sample::select(vec![250u32, 500, 1000]),
        0usize..3,
    );
    let pair = prop::option::weighted(0.85, 0.15f64..1.0);
    (
        prop::collection::vec(node, 1..=3),
        prop::collection::vec(task.clone(), 1..=4),
        prop::collection::vec(task, 1..=3),
        prop::collection::vec(pair, 9),
        prop::collection::vec(30u32..30_000, 1..=6),
        (0.1f64..0.6, 0.0f64..=1.0, 0.3f64..4.0, any::<u64>()),
    )
        .prop_map(
            |(nodes, online, offline, pairs, runtimes, (days, fill, load, seed))| {
                let mut n = String::from("sn,gpu,model\n");
                for (i, (gpus, t4)) in nodes.iter().enumerate() {
                    let model = if *t4 { "T4" } else { "V100M16" };
                    n += &format!("n{i},{gpus},{model}\n");
                }
                let spec = |k: usize| ["", "T4", "V100M16|T4"][k];
                let mut t = String::from("name,num_gpu,gpu_milli,gpu_spec,qos\n");
                for (i, (g, m, k)) in online.iter().enumerate() {
                    t += &format!("svc-{i},{g},{m},{},LS\n", spec(*k));
                }
                for (i, (g, m, k)) in offline.iter().enumerate() {
                    t += &format!("train-{i},{g},{m},{},BE\n", spec(*k));
                }
                let mut p = String::from("job_a,job_b,solo_a,solo_b,shared_a,shared_b\n");
                let types = ["A", "B", "C"];
                for (k, x) in pairs.iter().enumerate() {
                    let (a, b) = (types[k / 3], types[k % 3]);
                    match x {
                        Some(x) => {
                            p += &format!("{a},{b},10,10,{},{}\n", 10.0 * x, 10.0 * (1.1 - x))
                        }
                        None => p += &format!("{a},{b},10,10,0,0\n"),
                    }
                }
                let r = std::iter::once("runtime".to_string())
                    .chain(runtimes.iter().map(u32::to_string))
                    .collect::<Vec<_>>()
                    .join("\n");
                Trace {
                    nodes: n,
                    trace: t,
                    pairs: p,
                    runtimes: r + "\n",
                    settings: Settings {
                        days,
                        online_fill: fill,
                        offline_load: load,
                        seed,
                        round_interval_s: 900.0,
                        health_interval_s: 300.0,
                        // Half the cases with services that scale, half
                        // of those checkpointing at the requeue.
                        autoscale: seed % 2 == 1,
                        checkpoint: Checkpointing {
                            on_requeue: seed % 4 == 3,
                            ..Checkpointing::default()
                        },
                        // The slowdowns at each hour's load, or at the
                        // peak: the properties hold under either.
                        pair_load: if seed % 3 == 0 {
                            PairLoad::Peak
                        } else {
                            PairLoad::Now
                        },
                    },
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn random_small_replays_keep_the_invariants(t in trace()) {
        let mut inputs = inputs(&t.nodes, &t.trace, &t.pairs);
        inputs.runtimes = src("runtimes.csv", &t.runtimes);
        // A random trace may place no online service (models that do not
        // match): that is an input error, reported, never a panic.
        let sc = match muxflow_sim::prepare(&inputs, &t.settings) {
            Ok(sc) => sc,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let cfg = muxflow::Config::default();
        let gpus = sc.gpus.len() as f64;
        let hours = sc.end_s / 3600.0;
        let kinds = PolicyKind::ALL
            .into_iter()
            .chain([PolicyKind::MuxflowN(2), PolicyKind::MuxflowN(4)]);
        for kind in kinds {
            let o = replay(&sc, kind, &cfg, &t.settings);
            let eps = 1e-6;
            // K offline jobs per GPU: each at most its speed alone.
            let per_gpu = f64::from(kind.offline_per_gpu());
            prop_assert!(o.busy_gpu_hours <= gpus * hours + eps, "{kind:?}: busy {} > capacity", o.busy_gpu_hours);
            prop_assert!(o.offline_gpu_hours.0 <= per_gpu * gpus * hours + eps, "{kind:?}: work over capacity");
            prop_assert!(o.lent_gpu_hours.0 <= sc.online_gpus as f64 * hours + eps);
            for v in [o.gpu_util.0, o.sm_activity.0, o.mem_util.0, o.online_gpu_util.0, o.online_gpu_sm_activity.0] {
                prop_assert!((0.0..=1.0 + eps).contains(&v), "{kind:?}: a fraction out of range: {v}");
            }
            prop_assert!(o.online_latency_p50.0 >= 1.0 && o.online_latency_p99.0 >= o.online_latency_p50.0);
            prop_assert_eq!(
                o.offline_arrived,
                o.offline_finished + o.offline_running_end + o.offline_waiting_end,
                "{:?}: every job finished, running or waiting", kind
            );
            prop_assert!(o.offline_running_end as f64 <= per_gpu * gpus);
            prop_assert_eq!(o.jct_s.len() as u64, o.offline_finished);
            prop_assert_eq!(o.health_violations, 0, "{:?}", kind);
            // Gangs (a 2- to 4-GPU task is one job): all or nothing.
            prop_assert_eq!(o.offline_short_of_gpus, 0, "{:?}", kind);
            if kind == PolicyKind::Exclusive {
                prop_assert_eq!(o.lent_gpu_hours.0, 0.0);
            }
            // Services that scale: a requeue loses at most one checkpoint
            // interval on each of its (at most 4) GPUs, nothing when the
            // job checkpoints at the warning; replicas never hold more
            // GPUs than the peak placement.
            prop_assert_eq!(o.churn.is_some(), t.settings.autoscale);
            if let Some(c) = &o.churn {
                let ck = &t.settings.checkpoint;
                prop_assert!(c.lost_gpu_hours.0 >= 0.0);
                prop_assert!(c.lost_gpu_hours.0 * 3600.0 <= c.requeues as f64 * ck.interval_s * 4.0 + eps);
                if ck.on_requeue {
                    prop_assert_eq!(c.lost_gpu_hours.0, 0.0);
                }
                prop_assert!(c.online_gpu_hours <= sc.online_gpus as f64 * hours + eps);
                prop_assert!(c.starts_delayed <= c.replica_starts);
            }
            // Same scenario and seed: the same outcome, field for field.
            let again = muxflow_sim::prepare(&inputs, &t.settings).expect("prepared once");
            prop_assert_eq!(&o, &replay(&again, kind, &cfg, &t.settings), "{:?}: not deterministic", kind);
        }
        // Rounds exact on their candidates only (`--candidates-only`,
        // every round cold): the same invariants, and still the same
        // outcome for the same inputs.
        let opts = RunOptions { candidates_only: true, ..RunOptions::default() };
        let priced = |sc: &muxflow_sim::scenario::Scenario| {
            run(sc, PolicyKind::Muxflow, &cfg, &t.settings, &opts, &AtomicU64::new(0))
        };
        let o = priced(&sc);
        prop_assert_eq!(o.offline_arrived, o.offline_finished + o.offline_running_end + o.offline_waiting_end);
        prop_assert_eq!(o.health_violations, 0);
        prop_assert_eq!(o.offline_short_of_gpus, 0);
        prop_assert!(o.busy_gpu_hours <= gpus * hours + 1e-6);
        let again = muxflow_sim::prepare(&inputs, &t.settings).expect("prepared once");
        prop_assert_eq!(&o, &priced(&again), "priced rounds: not deterministic");
        // The oracle decides nothing: planned beside every third round
        // only, the outcome is the same but for the pairing it measures.
        let every = |n| {
            let opts = RunOptions { oracle_every: n, ..RunOptions::default() };
            run(&sc, PolicyKind::Muxflow, &cfg, &t.settings, &opts, &AtomicU64::new(0))
        };
        let (all, mut third) = (every(1), every(3));
        third.pairing_vs_oracle = all.pairing_vs_oracle;
        prop_assert_eq!(&third, &all, "the oracle's rounds changed the replay");
    }
}
