//! How far muxflow-police reaches (issue 31, M1 and a low finding):
//!
//! * An offline job's process on a GPU it was not placed on, tried as the
//!   unprivileged user `nobody`: it picks the node's other GPU itself (its
//!   own `CUDA_VISIBLE_DEVICES`, without its MPS daemon, which shows only
//!   its own GPU) and relaunches there in a loop. The job's
//!   muxflow-police watches every GPU of the node, so each launch is
//!   stopped within its interval, not at the next health check; the job is
//!   cancelled once `[health] police_cancel_after` (3) of its processes
//!   were, with the reason in its AdminComment.
//! * A killed muxflow-police is started again by the next health check.
//! * A trainer that outlived its job (it escaped the job's process tree, so
//!   `proctrack/linuxproc` did not end it) is evicted from the GPU by the
//!   next health check, while the online job there runs on; also when it
//!   names, in its own `SLURM_JOB_ID`, another user's job on the GPU.
//!
//! The tests use different nodes (node2, node4, node3, node1), so they can
//! run in parallel.

use std::time::Duration;

use muxflow::records::report::JobReport;
use muxflow_tests::Cluster;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_job_relaunching_on_another_gpu_is_stopped_each_time_and_cancelled_at_the_limit() {
    let c = Cluster::get();
    let node = "node2";
    const PREFIX: &str = "mfw-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    let other = 1 - gpu;
    // Ten tries of 60 s each on the other GPU: unpoliced, this runs 10 min.
    let script = format!(
        "#!/bin/sh\nunset CUDA_MPS_PIPE_DIRECTORY\nfor i in 1 2 3 4 5 6 7 8 9 10; do\n\
         CUDA_VISIBLE_DEVICES={other} {}\necho try-$i-exit=$?\ndone\n",
        c.workload("offline --duration 60 --alloc-mib 256")
    );
    let offline = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &script);
    let end = c.wait(offline, WAIT);
    let out = c.output_or_empty(offline);
    assert_eq!(end.state, "CANCELLED", "{end:?}: {out}");
    // Each try was stopped (killed: no MPS server serves it there) and told
    // why, and none ran to its end; the job was cancelled (unpoliced, or
    // uncancelled, its ten tries end and it completes). The police cancels
    // at the third; a try or two more may start and be stopped while the
    // cancel reaches the step on a loaded machine (CI saw a fifth start).
    let stopped = out
        .matches(&format!(
            "it uses GPU {other}, but the job was placed on GPU {gpu}"
        ))
        .count();
    assert!(stopped >= 3, "{out}");
    assert!(!out.contains("exit=0"), "{out}");
    let line = c.sacct_until(offline, "AdminComment", |l| l.contains("policed="));
    let text = line.split('|').nth(1).unwrap();
    let report = JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(
        report.policed.as_deref(),
        Some("wrong_gpu,cancelled"),
        "{line}"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

/// The pids of the muxflow-police processes watching job `job`.
fn watchers(job: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let for_job = environ
            .split(|b| *b == 0)
            .any(|v| v == format!("SLURM_JOB_ID={job}").as_bytes());
        if comm.trim() == "muxflow-police" && for_job {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_killed_watcher_is_started_again_by_the_next_health_check() {
    let c = Cluster::get();
    let node = "node4";
    const PREFIX: &str = "mfk-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config("police-restart", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let offline = c.offline_running(&format!("{PREFIX}offline"), node, gpu, WAIT);
    let start = std::time::Instant::now();
    let first = loop {
        let w = watchers(offline);
        if !w.is_empty() || start.elapsed() > WAIT {
            break w;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(first.len(), 1, "one watcher per job: {first:?}");
    // An administrator's mistake, or an OOM kill.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let log = c.step_until(&cfg, node, "a new muxflow-police", || {
        let w = watchers(offline);
        !w.is_empty() && !w.contains(&first[0])
    });
    assert!(log.contains("starting it again"), "{log}");
    // One at a time: the next step leaves the new watcher alone.
    c.health_step(&cfg, node);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(watchers(offline).len(), 1, "{:?}", watchers(offline));
    c.scancel(&[offline, online]);
    c.wait(offline, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

#[test]
fn a_trainer_that_outlives_its_job_is_evicted_by_the_next_health_check() {
    straggler_is_evicted("node3", "mfg-", false);
}

/// The same straggler naming, in its own `SLURM_JOB_ID`, the online job of
/// another user (root's here) still running on the GPU: that job's record
/// shelters only its own user's processes.
#[test]
fn a_trainer_naming_another_users_job_is_evicted_all_the_same() {
    straggler_is_evicted("node1", "mfb-", true);
}

/// An offline job of `nobody` on `node` leaves a trainer behind (naming the
/// online job beside it when `borrow`); a health step evicts it.
fn straggler_is_evicted(node: &str, prefix: &'static str, borrow: bool) {
    let c = Cluster::get();
    c.cancel_named(prefix);
    let _cancel = muxflow_tests::CancelNamed(&c, prefix);
    let cfg = c.health_config("police-straggler", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{prefix}online"), node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    // The batch script ends while its trainer runs on in the background, in
    // a session of its own: reparented to init and out of the job's process
    // group, the trainer is out of linuxproc's reach.
    let borrowed = if borrow {
        format!("SLURM_JOB_ID={online} ")
    } else {
        String::new()
    };
    let script = format!(
        "#!/bin/sh\n{borrowed}setsid {} &\necho straggler-pid=$!\nsleep 3\n",
        c.workload("offline --duration 120 --alloc-mib 256")
    );
    let offline = c.offline_as_nobody(&format!("{prefix}offline"), node, gpu, &script);
    let out = c.wait_output(offline, "straggler-pid=", WAIT);
    let pid: u32 = muxflow_tests::kv(&out, "straggler-pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}: {out}");
    // The Epilog's step may already have evicted it; else a health step does.
    let start = std::time::Instant::now();
    let mut logs = String::new();
    while muxflow_tests::process_runs(pid) {
        assert!(
            start.elapsed() < WAIT,
            "the straggler {pid} still runs on the GPU:\n{logs}\n{}",
            c.node_picture(&cfg, node)
        );
        logs += &c.health_step(&cfg, node);
        std::thread::sleep(Duration::from_millis(300));
    }
    // muxflow ended it (not Slurm: then this test would show nothing), and
    // told it why on its own stderr, the job's output.
    let evicted = format!("process {pid} is evicted from GPU {gpu}");
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    assert!(
        node_log
            .lines()
            .any(|l| l.contains(&evicted) && l.contains("no running Slurm job")),
        "{logs}\n{node_log}"
    );
    let told = c.output_or_empty(offline);
    assert!(
        told.contains(&evicted) && told.contains("a process must end with its job"),
        "{told}"
    );
    // The online job was not touched.
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}
