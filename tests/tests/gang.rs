//! A 2-GPU offline job (issue 15) on the dev cluster (4 nodes x 2
//! simulated GPUs): `--muxflow=offline --gres=gpu:2` is parked with
//! `gpus=2`, muxflow-matcher places it as a gang on both GPUs of the one
//! node whose two online jobs leave room (the other GPUs are held by plain
//! jobs), Slurm starts it on both slots, and each of its tasks gets its own
//! GPU: its CUDA_VISIBLE_DEVICES, MPS pipe, SM share (the policy's for its
//! GPU: the ceiling under the bounded queue; sized in space, the two online
//! jobs differ, so the shares do) and limits; each runs a workload through xCUDA
//! on its GPU without being policed, and on `scancel` (SIGTERM) both leave
//! gracefully, each releasing its own context.
//!
//! One test function: the matcher acts on every pending offline job.

use std::time::Duration;

use muxflow_tests::{decision, kv, Cluster};

const PREFIX: &str = "mfg-";
const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "node2";

#[test]
fn a_two_gpu_offline_job_runs_as_a_gang_each_task_on_its_own_gpu() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let quick = c.health_config("gang-health", "min_dwell_s = 1\nrecovery_quiet_s = 1");

    // Two online jobs on NODE, one per GPU: GPU 0 busy (a third of its
    // SMs, below the Busy thresholds), GPU 1 nearly idle, loaded before the
    // jobs start so every solo sample sees it and the SM policy tells them
    // apart.
    let (busy, quiet) = (0u32, 1u32);
    c.sim_load(NODE, busy, 0.35);
    c.sim_load(NODE, quiet, 0.02);
    let online: Vec<u32> = (0..2)
        .map(|i| {
            let id = c
                .sbatch(
                    &[
                        "--muxflow=online",
                        "--gres=gpu:1",
                        "-w",
                        NODE,
                        "--job-name",
                        &format!("{PREFIX}online-{i}"),
                    ],
                    "#!/bin/sh\nexec sleep 600\n",
                )
                .unwrap();
            c.wait_running(id, WAIT);
            id
        })
        .collect();
    c.settle_healthy(&quick, NODE, busy, 0);
    c.settle_healthy(&quick, NODE, quiet, 0);
    let solo = |g| c.published_gpu(NODE, g).solo_sm_pct.unwrap();
    assert!(
        solo(busy) > solo(quiet) + 20,
        "{} vs {}",
        solo(busy),
        solo(quiet)
    );
    // Everything else is held by plain jobs: NODE is the only place.
    c.hold_free_gpus(&format!("{PREFIX}fill"));

    // Each task prints what it got, then trains on its GPU until signalled.
    let task_script = c.scratch("gang-task").join("task.sh");
    muxflow::test_support::write_executable(
        &task_script,
        &format!(
            "#!/bin/sh\necho task=$SLURM_LOCALID cvd=$CUDA_VISIBLE_DEVICES pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE \
             mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT pipe=$CUDA_MPS_PIPE_DIRECTORY limits=$MUXFLOW_XCUDA_LIMITS_DIR\n{}\n",
            c.workload("offline")
        ),
    );
    let script = format!("#!/bin/sh\nsrun -n 2 {}\n", task_script.display());
    let gang = c
        .sbatch(
            &[
                "--muxflow=offline",
                "--gres=gpu:2",
                "-n",
                "2",
                "--job-name",
                &format!("{PREFIX}gang"),
            ],
            &script,
        )
        .unwrap();
    assert_eq!(c.job_field(gang, "Reason"), "JobHeldUser");
    assert!(
        c.admin_comment(gang).contains("gpus=2"),
        "{}",
        c.admin_comment(gang)
    );

    // The GPUs' facts before the Prolog reads them (the solo SM mean a
    // share sized in space follows moves with each health step).
    let config = c.dir.join("etc/muxflow.toml");
    let policy = muxflow::Config::load(&config).unwrap().policy;
    let facts_before = c.node_state(&config, NODE);

    let round = c.matcher_once();
    let d = decision(&round, gang);
    assert_eq!(d["action"], "place", "{round}");
    assert_eq!(d["node"], NODE, "{round}");
    assert_eq!(d["gpus"], serde_json::json!([0, 1]), "{round}");
    assert!(
        d["reason"].as_str().unwrap().starts_with("gang of 2 GPUs"),
        "{round}"
    );

    let ran_on = c.wait_running(gang, WAIT);
    assert_eq!(ran_on, NODE);
    let gres = c.gres_detail(gang);
    assert!(
        gres.contains("mfslot:g0:1(IDX:0)") && gres.contains("mfslot:g1:1(IDX:1)"),
        "both slots: {gres}"
    );
    // Both tasks training (each printed its pid), then SIGTERM: each
    // process takes xCUDA's graceful exit (sync, release its context on its
    // GPU's MPS server, exit 0 with its report line).
    let start = std::time::Instant::now();
    while c.output_or_empty(gang).matches("pid=").count() < 2 {
        assert!(
            start.elapsed() < WAIT,
            "tasks never started:\n{}",
            c.output_or_empty(gang)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    c.scancel(&[gang]);
    let end = c.wait(gang, WAIT);
    let out = c.output(gang);
    assert_eq!(end.state, "CANCELLED", "{end:?}\n{out}");
    assert!(!out.contains("not yet released"), "{out}");
    let task = |t: u32| -> String {
        out.lines()
            .find(|l| l.starts_with(&format!("task={t} ")))
            .unwrap_or_else(|| panic!("no line of task {t}:\n{out}"))
            .to_string()
    };
    let (t0, t1) = (task(0), task(1));
    let field = |line: &str, k: &str| kv(line, k).unwrap_or_default();
    // Task i on GPU i: its own device (by UUID: each GPU's daemon shows
    // its one device as 0, so the node's index 1 would name nothing),
    // MPS server and limits.
    for (line, g) in [(&t0, 0u32), (&t1, 1)] {
        assert_eq!(field(line, "cvd"), c.gpu_uuid(NODE, g), "{line}");
        assert!(field(line, "pipe").ends_with(&format!("/{g}")), "{line}");
        assert!(field(line, "limits").ends_with(&format!("/g{g}")), "{line}");
        assert!(field(line, "mem").starts_with("0="), "{line}");
    }
    // Each its GPU's SM share, as the policy gives it beside that GPU's
    // online job (under the bounded queue, the cluster's default, the
    // ceiling on both; sized in space, less beside the busier one: unit
    // tests of src/policy/share.rs).
    // The Prolog read the facts between the two readings here: its share
    // lies between what each gives.
    let facts_after = c.node_state(&config, NODE);
    let want = |ns: &muxflow::node::state::NodeState, g: u32| {
        let facts = ns.facts(g).unwrap();
        u32::from(muxflow::policy::share::offline_slot_share(&policy, &facts, 1).sm_pct)
    };
    let pct = |line: &str| field(line, "pct").parse::<u32>().unwrap();
    for (line, g) in [(&t0, 0u32), (&t1, 1)] {
        let (a, b) = (want(&facts_before, g), want(&facts_after, g));
        assert!(
            (a.min(b)..=a.max(b)).contains(&pct(line)),
            "GPU {g}: the policy gives {a} before the job and {b} after: {line}\n{out}"
        );
    }
    // Both workloads ran through xCUDA on their GPU and left gracefully on
    // SIGTERM (a report line each), and none was policed.
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("mode=offline steps="))
            .count(),
        2,
        "{out}"
    );
    let record = c.sacct_until(gang, "AdminComment", |l| l.contains("mode=offline"));
    assert!(!record.contains("policed="), "{record}");
    // Each GPU's figures (a muxflow:v2 record): its SM share, its cap, the
    // online job beside it.
    let r = muxflow::records::report::JobReport::decode(record.split('|').nth(1).unwrap()).unwrap();
    assert_eq!(r.gang.len(), 1, "{record}");
    let (first, second) = (r.gpu.unwrap(), &r.gang[0]);
    assert_ne!(first, second.gpu, "{record}");
    assert!(r.sm_pct.is_some() && second.sm_pct.is_some(), "{record}");
    let partners = [r.partner.unwrap(), second.partner.unwrap()];
    assert!(partners.iter().all(|p| online.contains(p)), "{record}");
    assert_ne!(partners[0], partners[1], "one online job per GPU: {record}");

    c.cancel_named(PREFIX);
    for id in online {
        c.wait(id, WAIT);
    }
    for g in 0..2 {
        c.sim_load(NODE, g, 0.0);
    }
    c.assert_no_drain();
}
