//! An offline job cannot drop the limits muxflow gives it (issue 13,
//! findings 3 and 7), tried the way a user of the cluster would: each job
//! here runs as the unprivileged user `nobody` next to an online job.
//!
//! * It unsets LD_PRELOAD and the MPS limits and raises its MPS priority:
//!   the node's health step evicts it with `terminate_client`, tells it why
//!   on its stderr and in its AdminComment; the online job runs on.
//! * It sets xCUDA's variables itself (a bogus sampling interval, a huge
//!   memory cap): xCUDA ignores them and keeps the job's cap and gate.
//! * It forges the figures of its own report files: out-of-bounds claims
//!   are left out of AdminComment, the rest are marked as claims.
//!
//! The tests use different nodes, so they can run in parallel.

use std::time::Duration;

use muxflow::records::report::JobReport;
use muxflow_tests::{kv, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// The job's AdminComment once sacct has its final record.
fn admin_comment(c: &Cluster, id: u32, done: &str) -> JobReport {
    let line = c.sacct_until(id, "AdminComment", |l| l.contains(done));
    let text = line.split('|').nth(1).unwrap();
    JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"))
}

fn cancel(c: &Cluster, id: u32) {
    c.scancel(&[id]);
    c.wait(id, WAIT);
}

fn server_log(c: &Cluster, node: &str, gpu: u32) -> String {
    let p = c.node_path(
        &format!("var/log/muxflow/{{node}}/mps/{gpu}/server.log"),
        node,
    );
    std::fs::read_to_string(p).unwrap_or_default()
}

/// One way a job can try to drop a limit, and how the node answers.
struct Attack {
    name: &'static str,
    /// Shell lines the job runs before its workload.
    shell: &'static str,
    code: &'static str,
    /// In the reason the job is told.
    reason: &'static str,
    /// Evicted from the MPS server (else killed: it is not an MPS client).
    by_mps: bool,
}

#[test]
fn a_job_that_drops_its_limits_is_evicted_and_told_why_and_the_online_job_runs_on() {
    let c = Cluster::get();
    let cfg = c.health_config("limits-drop", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let node = "node3";
    let (online, gpu) = c.online_workload("mfl-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let online_pid = kv(&c.output_or_empty(online).replace('\n', " "), "pid").unwrap();
    let attacks = [
        Attack {
            name: "the issue's attack: xCUDA and the MPS limits unset, priority 0",
            shell: "unset LD_PRELOAD CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\n\
                    export CUDA_MPS_CLIENT_PRIORITY=0",
            code: "no_xcuda",
            reason: "xCUDA is not loaded",
            by_mps: true,
        },
        Attack {
            name: "another library at a path ending with xCUDA's (the police read names before)",
            shell: "X=${LD_PRELOAD%%:*}; D=/tmp/mfl-fake-$$\n\
                    mkdir -p \"$D$(dirname \"$X\")\" && cp /lib/x86_64-linux-gnu/libm.so.6 \"$D$X\"\n\
                    export LD_PRELOAD=\"$D$X\"",
            code: "no_xcuda",
            reason: "xCUDA is not loaded",
            by_mps: true,
        },
        Attack {
            name: "priority 0",
            shell: "export CUDA_MPS_CLIENT_PRIORITY=0",
            code: "priority",
            reason: "CUDA_MPS_CLIENT_PRIORITY=0 instead of 1",
            by_mps: true,
        },
        Attack {
            name: "all the SMs",
            shell: "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
            code: "sm_pct",
            reason: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 instead of at most",
            by_mps: true,
        },
        Attack {
            name: "no pinned memory limit",
            shell: "unset CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            code: "mem_limit",
            reason: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=(unset)",
            by_mps: true,
        },
        Attack {
            name: "around MPS, straight to the GPU",
            shell: "unset CUDA_MPS_PIPE_DIRECTORY",
            code: "not_mps",
            reason: "outside the GPU's MPS server",
            by_mps: false,
        },
    ];
    for a in attacks {
        // A previous attack may have overloaded the GPU, which pauses a
        // protected job's launches: start each from a healthy GPU.
        c.settle_healthy(&cfg, node, gpu, 1000);
        let script = format!(
            "#!/bin/sh\n{}\n{}\necho workload-exit=$?\n",
            a.shell,
            c.workload("offline --duration 90 --alloc-mib 512")
        );
        let offline = c.offline_as_nobody("mfl-drop", node, gpu, &script);
        c.wait_running(offline, WAIT);
        let out = c.wait_output(offline, "pid=", WAIT);
        let pid = kv(&out.replace('\n', " "), "pid").unwrap();

        // No health step here: muxflow-police, started by the Prolog, acts
        // within its interval of the attach (slurmd's own health check may
        // come first; the node log says which did).
        let out = c.wait_output(offline, "workload-exit=", WAIT);
        let how = if a.by_mps {
            "evicted from the GPU"
        } else {
            "killed"
        };
        assert!(
            out.contains(&format!(
                "muxflow: process {pid} of offline job {offline} is {how}"
            )) && out.contains(a.reason),
            "{}: the job is told why:\n{out}",
            a.name
        );
        assert!(!out.contains("workload-exit=0"), "{}: {out}", a.name);
        let log = server_log(&c, node, gpu);
        assert_eq!(
            log.contains(&format!("Terminating client {pid}")),
            a.by_mps,
            "{}:\n{log}",
            a.name
        );
        assert!(
            !log.contains(&format!("Terminating client {online_pid}")),
            "{}: the online client was touched:\n{log}",
            a.name
        );
        assert_eq!(c.job_field(online, "JobState"), "RUNNING", "{}", a.name);

        let end = c.wait(offline, WAIT);
        assert!(
            end.state == "COMPLETED" || end.state == "FAILED",
            "{}: {end:?}",
            a.name
        );
        let report = admin_comment(&c, offline, "policed=");
        assert_eq!(report.policed.as_deref(), Some(a.code), "{}", a.name);
        wait_police_done(&c, node, offline);
    }
    cancel(&c, online);
    c.assert_no_drain();
}

/// Waits until the job's muxflow-police has ended (it ends with the job).
fn wait_police_done(c: &Cluster, node: &str, job: u32) {
    let path = c.dir.join(format!("log/muxflow-{node}.log"));
    let start = std::time::Instant::now();
    loop {
        let log = std::fs::read_to_string(&path).unwrap();
        let done = log.lines().any(|l| {
            l.contains("muxflow-police: ")
                && l.contains(&format!("job={job}"))
                && l.contains("done")
        });
        if done {
            return;
        }
        assert!(
            start.elapsed() < WAIT,
            "muxflow-police of {job} still runs:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn xcuda_settings_in_the_jobs_environment_change_nothing() {
    let c = Cluster::get();
    let cfg = c.health_config("limits-env", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let node = "node4";
    let (online, gpu) = c.online_workload("mfe-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);

    // More memory than the cap (GPU memory less the online job's and the
    // reserve), with xCUDA told in the environment that there is no cap and
    // no gate. MPS's own pinned limit would refuse it too; xCUDA's refusal
    // is the one its counter shows.
    let script = format!(
        "#!/bin/sh\n\
         export MUXFLOW_XCUDA_SAMPLE_INTERVAL_MS=bogus MUXFLOW_XCUDA_MEM_LIMIT_BYTES=18446744073709551615\n\
         export MUXFLOW_XCUDA_STATS_DIR=/tmp MUXFLOW_XCUDA_HEALTH_FILE=/dev/null\n\
         echo limits=$(stat -c %a:%g \"$MUXFLOW_XCUDA_LIMITS_DIR/$SLURM_JOB_ID\")\n\
         {}\n\
         echo workload-exit=$?\n",
        c.workload("offline --duration 5 --alloc-mib 80000")
    );
    let offline = c.offline_as_nobody("mfe-env", node, gpu, &script);
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}");
    let out = c.output(offline);
    assert!(
        out.contains("OUT_OF_MEMORY"),
        "the allocation was refused:\n{out}"
    );
    assert!(!out.contains("gate disabled"), "{out}");
    // Its limits file: root's, readable by the job's group only, which is
    // how xCUDA, as the job's user, read it.
    let group = c.job_field(offline, "GroupId");
    let gid = group
        .split_once('(')
        .and_then(|(_, g)| g.strip_suffix(')'))
        .unwrap_or_else(|| panic!("GroupId={group}"));
    assert_eq!(
        kv(&out.replace('\n', " "), "limits"),
        Some(format!("640:{gid}")),
        "{out}"
    );
    let report = admin_comment(&c, offline, "mem_cap_mib=");
    assert_eq!(
        report.oom,
        Some(1),
        "xCUDA refused it with the job's cap: {report:?}"
    );
    assert!(report.mem_cap_mib.unwrap() < 80000, "{report:?}");
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    cancel(&c, online);
    c.assert_no_drain();
}

#[test]
fn forged_figures_in_the_jobs_own_files_are_refused_or_marked_as_claims() {
    let c = Cluster::get();
    let node = "node1";
    let gpu = 1;
    // No GPU work: the job only writes its report files, as a user can.
    let huge = "9".repeat(300);
    let script = format!(
        "#!/bin/sh\n\
         dir=$(dirname \"$MUXFLOW_JOB_REPORT\")\n\
         echo \"steps=42 steps_per_s={huge} rps=inf p99_ms=3.5\" > \"$MUXFLOW_JOB_REPORT\"\n\
         echo \"launches=18446744073709551615 delayed=0 delay_us=0 oom=0 peak_bytes=99999999999999999\" > \"$dir/xcuda.99999\"\n\
         echo wrote\n"
    );
    let offline = c.offline_as_nobody("mff-forge", node, gpu, &script);
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?} {}", c.output(offline));
    let line = c.sacct_until(offline, "AdminComment", |l| l.contains("claims_refused="));
    let text = line.split('|').nth(1).unwrap();
    let report = JobReport::decode(text).unwrap();
    let refused = report.claims_refused.clone().unwrap();
    for key in ["launches", "steps_per_s", "rps", "peak_mib"] {
        assert!(
            refused.split(',').any(|k| k == key),
            "{key} not refused: {text}"
        );
    }
    assert_eq!(
        (report.launches, report.steps_per_s, report.rps),
        (None, None, None),
        "{text}"
    );
    assert_eq!(
        (report.steps, report.p99_ms),
        (Some(42), Some(3.5)),
        "{text}"
    );
    assert!(
        text.contains("claim.steps=42") && !text.contains(" steps=42"),
        "{text}"
    );
    assert!(!text.contains(&huge[..40]), "{text}");
    c.assert_no_drain();
}

/// Issue 13, finding 6: slurmctld ends a cancelled job before its batch
/// step's end, where the plugin writes the record; the record still lands.
#[test]
fn a_cancelled_offline_job_keeps_its_record() {
    let c = Cluster::get();
    let node = "node2";
    let gpu = 1;
    let script = format!("#!/bin/sh\n{}\n", c.workload("offline --duration 120"));
    let offline = c.offline_as_nobody("mfc-cancel", node, gpu, &script);
    c.wait_running(offline, WAIT);
    c.wait_output(offline, "pid=", WAIT);
    // Running on the GPU for a moment, so there are figures to record.
    std::thread::sleep(Duration::from_secs(2));
    let mut cmd = c.cmd("scancel");
    cmd.arg(offline.to_string());
    assert!(c.run(cmd).0);
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "CANCELLED", "{end:?}");
    let report = admin_comment(&c, offline, "claim.launches=");
    assert_eq!(
        (report.node.as_deref(), report.gpu),
        (Some(node), Some(gpu))
    );
    assert!(
        report.sm_pct.is_some() && report.launches.unwrap() > 0,
        "{report:?}"
    );
    // And it stays: slurmctld's own end-of-job record does not overwrite it.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(admin_comment(&c, offline, "claim.launches="), report);
    c.assert_no_drain();
}

/// Which job a process belongs to is the node's to find out, not the
/// process's to say: an offline job that claims in its environment to be
/// its online partner is still evicted by an application Xid, which
/// evicts offline clients only.
#[test]
fn an_offline_job_posing_as_its_online_partner_is_still_evicted_on_an_xid() {
    let c = Cluster::get();
    let cfg = c.health_config("limits-pose", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let node = "node1";
    let (online, gpu) = c.online_workload("mfj-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let online_pid = kv(&c.output_or_empty(online).replace('\n', " "), "pid").unwrap();

    let script = format!(
        "#!/bin/sh\n\
         export SLURM_JOB_ID={online} SLURM_JOBID={online} MUXFLOW_MODE=online SLURM_SPANK_MUXFLOW_MODE=online\n\
         {}\n\
         echo workload-exit=$?\n",
        c.workload("offline --duration 90")
    );
    let offline = c.offline_as_nobody("mfj-pose", node, gpu, &script);
    c.wait_running(offline, WAIT);
    let out = c.wait_output(offline, "pid=", WAIT);
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let start = std::time::Instant::now();
    while !server_log(&c, node, gpu).contains(&format!("New client {pid} connected")) {
        assert!(start.elapsed() < WAIT, "{pid} never attached");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Xid 43 (a GPU stopped processing: one application's fault) between
    // two health checks, read from the kernel log by the next one. Other
    // tests step node1 too, and the steps of a node share the log's cursor:
    // whichever step reads the record acts on it, so step until the job
    // has gone.
    c.sim_fault(node, gpu, &["xid", "43"]);
    let mut logs = String::new();
    let start = std::time::Instant::now();
    while !c.output_or_empty(offline).contains("workload-exit=") {
        assert!(start.elapsed() < WAIT, "not evicted after the Xid:\n{logs}");
        logs.push_str(&c.health_step(&cfg, node));
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = c.output_or_empty(offline);
    assert!(out.contains("CUDA_ERROR_MPS_CLIENT_TERMINATED"), "{out}");
    let log = server_log(&c, node, gpu);
    assert!(
        !log.contains(&format!("Terminating client {online_pid}")),
        "the online client was not touched:\n{log}"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");

    // Leave the GPU healthy for whoever comes next.
    c.sim_fault(node, gpu, &["clear"]);
    let ns = c.node_state(&cfg, node);
    c.step_until(&cfg, node, "the GPU healthy again", || {
        ns.health(gpu).unwrap() == Some(muxflow::policy::health::HealthState::Healthy)
    });
    c.wait(offline, WAIT);
    cancel(&c, online);
    c.assert_no_drain();
}
