//! Idle GPUs take offline work (issue 15), on the dev cluster (4 nodes x 2
//! simulated GPUs): on an otherwise idle cluster muxflow-matcher places
//! parked offline jobs on idle GPUs, each line saying so, and Slurm starts
//! them there; an online job that later lands on such a GPU gets it back:
//! its Prolog requeues the offline job (held, for the matcher to place
//! again) and its script starts only once the offline job's process is
//! gone, so it never meets memory the offline job holds.
//!
//! One test function: the matcher acts on every pending offline job of the
//! cluster, so the steps must not run in parallel with each other.

use std::collections::BTreeSet;
use std::time::Duration;

use muxflow::policy::health::HealthState;
use muxflow_tests::{decision, Cluster};

const PREFIX: &str = "mfi-";
const WAIT: Duration = Duration::from_secs(90);
#[test]
fn offline_jobs_start_on_idle_gpus_and_leave_when_an_online_job_lands() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    c.wait_all_gpus_healthy();

    // An idle cluster: three parked offline jobs, no online job anywhere.
    let pid_dir = c.scratch("idle-pids");
    let script = |i: u32| {
        format!(
            "#!/bin/sh\necho $$ > {}/{i}\nexec sleep 300\n",
            pid_dir.display()
        )
    };
    let jobs: Vec<u32> = (1..=3)
        .map(|i| {
            let id = c
                .sbatch(
                    &[
                        "--muxflow=offline",
                        "--job-name",
                        &format!("{PREFIX}train-{i}"),
                    ],
                    &script(i),
                )
                .unwrap();
            assert_eq!(
                c.job_field(id, "Reason"),
                "JobHeldUser",
                "job {id} not parked"
            );
            id
        })
        .collect();

    let round = c.matcher_once();
    assert!(
        round["summary"]["idle_gpus"].as_u64().unwrap() >= 3,
        "{round}"
    );
    let mut slots = BTreeSet::new();
    for &id in &jobs {
        let d = decision(&round, id);
        assert_eq!(d["action"], "place", "{round}");
        // muxflow_matcher::round::IDLE_REASON
        assert!(
            d["reason"]
                .as_str()
                .unwrap()
                .starts_with("idle GPU: runs alone at its solo speed"),
            "{round}"
        );
        assert_eq!(d["predicted"], 1.0, "solo speed: {round}");
        let slot = (
            d["node"].as_str().unwrap().to_string(),
            d["gpu"].as_u64().unwrap(),
        );
        assert!(slots.insert(slot), "two jobs on one idle GPU: {round}");
    }
    // Slurm starts each on the idle GPU's slot the matcher wrote.
    let mut placed = Vec::new();
    for &id in &jobs {
        let ran_on = c.wait_running(id, WAIT);
        let gres = c.gres_detail(id);
        let gpu: u32 = gres
            .strip_prefix("mfslot:g")
            .and_then(|s| s.split(':').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("job {id}: GRES '{gres}'"));
        assert!(
            slots.contains(&(ran_on.clone(), u64::from(gpu))),
            "job {id} runs on {ran_on} g{gpu}, not where placed: {slots:?}"
        );
        placed.push((id, ran_on, gpu));
    }

    // The offline job alone saturates its GPU: its own load is not
    // contention, so the GPU stays Healthy (it would otherwise turn
    // Overloaded and pause the job that caused it).
    let (_, node0, gpu0) = placed[0].clone();
    let cfg = c.health_config("idle-health", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    c.sim_load(&node0, gpu0, 0.99);
    for _ in 0..3 {
        c.health_step(&cfg, &node0);
    }
    assert_eq!(
        c.published_gpu(&node0, gpu0).state,
        HealthState::Healthy,
        "an offline job alone overloaded its GPU"
    );
    c.sim_load(&node0, gpu0, 0.0);

    // An online job takes the whole node of the first offline job (both of
    // its GPUs, so Slurm's choice of GPU cannot dodge it). The other
    // offline jobs end first, so only the first is on that node.
    let (victim, node, _) = placed[0].clone();
    let others: Vec<u32> = placed[1..].iter().map(|p| p.0).collect();
    c.scancel(&others);
    for &id in &others {
        c.wait(id, WAIT);
    }
    let pid_file = pid_dir.join("1");
    let start = std::time::Instant::now();
    while !pid_file.exists() {
        assert!(
            start.elapsed() < WAIT,
            "job {victim} never started its script"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let online_script = format!(
        "#!/bin/sh\nif kill -0 $(cat {}) 2>/dev/null; then echo offline-still-there; else echo offline-gone; fi\nexec sleep 300\n",
        pid_file.display()
    );
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:2",
                "-w",
                &node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            &online_script,
        )
        .unwrap();
    // The offline job goes back to the queue, held, for the matcher.
    c.wait_requeued_held(victim, WAIT);
    c.wait_running(online, WAIT);
    let out = c.wait_output(online, "offline-", WAIT);
    assert!(
        out.contains("offline-gone"),
        "the online job started while the offline job still ran: {out}"
    );
    // Slurm delays a requeued job (BeginTime, about two minutes): no round
    // gives it a slot meanwhile.
    let round = c.matcher_once();
    let d = decision(&round, victim);
    assert_eq!(d["waiting"], "begin_time", "{round}");
    // Once it may start, the next round places it again (Slurm 22.05 keeps
    // its typed slot, so on the same GPU index): beside the online job or on
    // another idle GPU.
    c.start_now(victim);
    let round = c.matcher_once();
    let d = decision(&round, victim);
    assert_eq!(d["action"], "place", "{round}");
    assert_eq!(d["gpu"].as_u64(), Some(u64::from(placed[0].2)), "{round}");

    c.cancel_named(PREFIX);
    for id in [victim, online] {
        c.wait(id, WAIT);
    }
    c.assert_no_drain();
}
