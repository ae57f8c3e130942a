//! The matcher gives no slot to an offline job Slurm would not start now,
//! and takes back one it gave, tried as the ordinary user `nobody` with
//! another user's (root's) job that must get the GPUs: jobs with a begin
//! time two hours ahead, an `afterok` chain, an array (placed task by task,
//! its tasks side by side), a job its owner requeued (Slurm delays it about
//! two minutes) and a placed job its owner held (left alone until its owner
//! releases it). A heterogeneous offline job and `--hold` are refused at
//! submit (`offline_refusals.rs` style, here beside the rest).

use std::time::{Duration, Instant};

use muxflow_tests::{decision, one_at_a_time, CancelNamed, Cluster};

const PREFIX: &str = "mfu-";
const USER: &str = "nobody";
/// The dev cluster's GPUs (4 nodes × 2).
const GPUS: usize = 8;
const SCRIPT: &str = "#!/bin/sh\nexec sleep 300\n";

fn submit(c: &Cluster, user: &str, name: &str, args: &[&str]) -> u32 {
    let name = format!("{PREFIX}{name}");
    let mut all = vec!["--muxflow=offline", "--job-name", name.as_str()];
    all.extend_from_slice(args);
    c.sbatch_as(user, &all, SCRIPT)
        .unwrap_or_else(|e| panic!("sbatch {name}: {e}"))
}

/// The cluster with every GPU Healthy and no job of an earlier run.
fn fresh() -> (std::sync::MutexGuard<'static, ()>, Cluster) {
    let lock = one_at_a_time();
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    c.wait_all_gpus_healthy();
    (lock, c)
}

/// Job `id` is parked and holds no slot: held, and its round line neither
/// places nor keeps it.
fn holds_no_slot(c: &Cluster, round: &serde_json::Value, id: u32, waiting: Option<&str>) {
    let d = decision(round, id);
    assert!(
        d["action"] == "none" || d["action"] == "park",
        "job {id} kept a slot: {d}\n{round}"
    );
    if let Some(w) = waiting {
        assert_eq!(d["waiting"], w, "job {id}: {d}");
    }
    let reason = c.job_field(id, "Reason");
    assert!(reason.starts_with("JobHeld"), "job {id}: Reason={reason}");
}

fn placed(round: &serde_json::Value, id: u32) -> (String, u64) {
    let d = decision(round, id);
    assert_eq!(d["action"], "place", "job {id}: {d}\n{round}");
    (
        d["node"].as_str().unwrap().to_string(),
        d["gpu"].as_u64().unwrap(),
    )
}

#[test]
fn jobs_with_a_begin_time_ahead_get_no_slot() {
    let (_lock, c) = fresh();
    let _cancel = CancelNamed(&c, PREFIX);
    let later: Vec<u32> = (0..GPUS)
        .map(|_| submit(&c, USER, "later", &["--begin=now+2hours"]))
        .collect();
    let round = c.matcher_once();
    for &id in &later {
        holds_no_slot(&c, &round, id, Some("begin_time"));
    }
    let theirs = submit(&c, "root", "theirs", &[]);
    let round = c.matcher_once();
    placed(&round, theirs);
    for &id in &later {
        holds_no_slot(&c, &round, id, Some("begin_time"));
    }
    assert!(
        c.admin_comment(later[0]).contains("waiting=begin_time"),
        "{}",
        c.admin_comment(later[0])
    );
    c.assert_no_drain();
}

#[test]
fn an_afterok_chain_gets_a_slot_one_link_at_a_time() {
    let (_lock, c) = fresh();
    let _cancel = CancelNamed(&c, PREFIX);
    // The chain's head: a plain job (no GPU) that ends soon, successfully.
    let head = c
        .sbatch_as(
            USER,
            &["--job-name", &format!("{PREFIX}head")],
            "#!/bin/sh\nsleep 4\n",
        )
        .unwrap();
    let mut chain = Vec::new();
    let mut prev = head;
    for _ in 0..GPUS {
        let dep = format!("--dependency=afterok:{prev}");
        prev = submit(&c, USER, "chain", &[&dep]);
        chain.push(prev);
    }
    let round = c.matcher_once();
    for &id in &chain {
        holds_no_slot(&c, &round, id, Some("dependency"));
    }
    let theirs = submit(&c, "root", "theirs", &[]);
    let round = c.matcher_once();
    placed(&round, theirs);
    for &id in &chain {
        holds_no_slot(&c, &round, id, Some("dependency"));
    }
    // The head ends: Slurm clears the first link's dependency (held jobs
    // too, within a minute) and the next round places it, and only it.
    let start = Instant::now();
    while c.job_field(chain[0], "Dependency") != "(null)" {
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "job {}'s dependency never cleared: {}",
            chain[0],
            c.job_field(chain[0], "Dependency")
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let round = c.matcher_once();
    placed(&round, chain[0]);
    for &id in &chain[1..] {
        holds_no_slot(&c, &round, id, Some("dependency"));
    }
    c.assert_no_drain();
}

#[test]
fn an_arrays_tasks_are_placed_one_by_one_and_run_side_by_side() {
    let (_lock, c) = fresh();
    let _cancel = CancelNamed(&c, PREFIX);
    const TASKS: usize = 3;
    let array = submit(&c, USER, "array", &[&format!("--array=0-{}", TASKS - 1)]);
    let theirs = submit(&c, "root", "theirs", &[]);
    let mut gpus = std::collections::BTreeSet::new();
    for task in 0..TASKS {
        let round = c.matcher_once();
        if task == 0 {
            placed(&round, theirs);
        }
        // The array's record stands for its first pending task.
        let d = decision(&round, array);
        assert_eq!(d["action"], "place", "task {task}: {d}\n{round}");
        gpus.insert((d["node"].as_str().unwrap().to_string(), d["gpu"].as_u64()));
        let task_id = format!("{array}_{task}");
        let start = Instant::now();
        loop {
            let mut cmd = c.cmd("squeue");
            cmd.args(["-h", "-j", &task_id, "-o", "%T"]);
            let (_, out, _) = c.run(cmd);
            if out.trim() == "RUNNING" {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{task_id} not running: {out}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    assert_eq!(gpus.len(), TASKS, "each task on a GPU of its own: {gpus:?}");
    let mut cmd = c.cmd("squeue");
    cmd.args([
        "-h",
        "-r",
        "-t",
        "R",
        "-n",
        &format!("{PREFIX}array"),
        "-o",
        "%i",
    ]);
    let (_, out, _) = c.run(cmd);
    assert_eq!(out.lines().count(), TASKS, "side by side: {out}");
    c.assert_no_drain();
}

#[test]
fn a_requeued_job_gives_its_gpu_back_while_slurm_delays_it() {
    let (_lock, c) = fresh();
    let _cancel = CancelNamed(&c, PREFIX);
    let jobs: Vec<u32> = (0..GPUS).map(|_| submit(&c, USER, "run", &[])).collect();
    let round = c.matcher_once();
    let mut at = std::collections::BTreeMap::new();
    for &id in &jobs {
        at.insert(id, placed(&round, id));
    }
    for &id in &jobs {
        c.wait_running(id, Duration::from_secs(60));
    }
    // Every GPU's slot is taken; its owner requeues one.
    let requeued = jobs[0];
    let (ok, out) = c.scontrol_as(USER, &["requeue", &requeued.to_string()]);
    assert!(ok, "requeue: {out}");
    let start = Instant::now();
    while c.job_field(requeued, "JobState") != "PENDING" || !c.gres_detail(requeued).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "not requeued");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(c.job_field(requeued, "Reason"), "BeginTime");
    // Its Epilog gives the slot back to Slurm.
    std::thread::sleep(Duration::from_secs(2));
    let theirs = submit(&c, "root", "theirs", &[]);
    let round = c.matcher_once();
    let d = decision(&round, requeued);
    assert_eq!(d["action"], "park", "{d}\n{round}");
    assert_eq!(d["waiting"], "begin_time", "{d}");
    assert_eq!(placed(&round, theirs), at[&requeued], "{round}");
    assert!(c.job_field(requeued, "Reason").starts_with("JobHeld"));
    c.assert_no_drain();
}

#[test]
fn a_placed_job_its_owner_holds_is_left_alone_until_released() {
    let (_lock, c) = fresh();
    let _cancel = CancelNamed(&c, PREFIX);
    // root's job takes node1 GPU 0's slot, so that nobody's job, placed
    // there too, waits in Slurm (Resources) long enough to be held.
    let blocker = submit(&c, "root", "blocker", &[]);
    c.place(blocker, "node1", 0);
    c.wait_running(blocker, Duration::from_secs(60));
    let mine = submit(&c, USER, "mine", &[]);
    c.place(mine, "node1", 0);
    let (ok, out) = c.scontrol_as(USER, &["hold", &mine.to_string()]);
    assert!(ok, "hold: {out}");
    assert_eq!(c.job_field(mine, "Reason"), "JobHeldUser");
    c.scancel(&[blocker]);
    let theirs = submit(&c, "root", "theirs", &[]);
    for _ in 0..2 {
        let round = c.matcher_once();
        let d = decision(&round, mine);
        assert_eq!(d["action"], "none", "{d}\n{round}");
        assert_eq!(c.job_field(mine, "Reason"), "JobHeldUser", "{round}");
        // Placed in the first round; kept in the second while Slurm starts it.
        if c.job_field(theirs, "JobState") == "PENDING" {
            let a = &decision(&round, theirs)["action"];
            assert!(a == "place" || a == "keep", "{round}");
        }
    }
    // Its owner releases it; the next round takes it again.
    let (ok, out) = c.scontrol_as(USER, &["release", &mine.to_string()]);
    assert!(ok, "its owner's release: {out}");
    assert!(!c.job_field(mine, "Reason").starts_with("JobHeld"));
    c.assert_no_drain();
}

#[test]
fn heterogeneous_and_held_offline_jobs_are_refused_at_submit() {
    let c = Cluster::get();
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "heterogeneous, offline first",
            &["--muxflow=offline", "-n1", ":", "-n1"],
            "a heterogeneous job",
        ),
        (
            "heterogeneous, offline second",
            &["-n1", ":", "--muxflow=offline", "-n1"],
            "a heterogeneous job",
        ),
        (
            "held at submit",
            &["--muxflow=offline", "--hold"],
            "-H/--hold cannot be used with --muxflow=offline",
        ),
    ];
    for (name, args, says) in cases {
        let mut all = vec!["--job-name", "refusal"];
        all.extend_from_slice(args);
        let err = c.sbatch_as(USER, &all, SCRIPT).expect_err(name);
        assert!(err.contains(says), "{name}: {err}");
        assert!(err.contains("muxflow: "), "{name}: {err}");
    }
}
