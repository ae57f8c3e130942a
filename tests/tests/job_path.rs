//! The job path on the dev cluster: an online job and an offline job placed
//! beside it share one per-GPU MPS daemon, the offline environment follows
//! the policies, the daemon goes away with the last job, and sacct shows the
//! AdminComment figures.

use std::time::Duration;

use muxflow::records::report::JobReport;
use muxflow::Mode;
use muxflow_tests::{kv, xcuda_library, Cluster};

const WAIT: Duration = Duration::from_secs(90);

/// `pid=N` lines a job printed.
fn pids(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("pid="))
        .map(str::to_string)
        .collect()
}

/// The single value of `VAR=…` in an `env` dump.
fn env_value(out: &str, var: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{var}=")))
        .map(str::to_string)
}

/// Submits an online workload on `node` (one GPU) and returns (job, GPU index).
fn online_on(c: &Cluster, node: &str, secs: u32, extra: &[&str]) -> (u32, u32) {
    let mut args = vec!["--muxflow=online", "--gres=gpu:1", "-w", node];
    args.extend_from_slice(extra);
    let script = format!(
        "#!/bin/sh\n{}\n",
        c.workload(&format!("online --rate 100 --duration {secs}"))
    );
    let id = c.sbatch(&args, &script).unwrap();
    c.wait_running(id, WAIT);
    c.wait_output(id, "pid=", WAIT);
    let gres = {
        let mut cmd = c.cmd("scontrol");
        cmd.args(["show", "job", "-d", &id.to_string()]);
        c.run(cmd).1
    };
    let gpu = gres
        .split("gpu:1(IDX:")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("no GPU index in {gres}"));
    (id, gpu)
}

#[test]
fn online_and_offline_share_one_daemon_and_report_to_sacct() {
    let c = Cluster::get();
    let node = "node1";
    let (online, gpu) = online_on(&c, node, 8, &[]);

    // The offline job starts held; the user's LD_PRELOAD already names
    // xCUDA and another library, and an inner srun inherits it all.
    let xcuda = xcuda_library().display().to_string();
    let script = format!(
        "#!/bin/sh\nenv | sort\necho ---\nsrun sh -c 'echo \"inner LD_PRELOAD=$LD_PRELOAD\"'\n{}\n",
        c.workload("offline --duration 3")
    );
    let user_preload = format!("LD_PRELOAD={xcuda}:/usr/lib/x86_64-linux-gnu/libm.so.6");
    let offline = c
        .sbatch(
            &[
                "--muxflow=offline",
                &format!("--export=ALL,{user_preload},CUDA_MPS_CLIENT_PRIORITY=0"),
            ],
            &script,
        )
        .unwrap();
    assert_eq!(c.job_field(offline, "JobState"), "PENDING");
    assert_eq!(
        c.job_field(offline, "Reason"),
        "JobHeldUser",
        "offline jobs wait for the matcher"
    );
    c.place(offline, node, gpu);

    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}\n{}", c.output(offline));
    let out = c.output(offline);
    let env = out.split("---").next().unwrap();
    let pipe = c.node_path(&format!("var/run/muxflow/{{node}}/mps/{gpu}"), node);
    assert_eq!(
        env_value(env, "CUDA_MPS_PIPE_DIRECTORY").as_deref(),
        Some(pipe.to_str().unwrap())
    );
    assert_eq!(
        env_value(env, "CUDA_MPS_CLIENT_PRIORITY").as_deref(),
        Some("1"),
        "overrides the user's 0"
    );
    // The GPU by UUID: its MPS daemon shows it as device 0.
    assert_eq!(
        env_value(env, "CUDA_VISIBLE_DEVICES"),
        Some(c.gpu_uuid(node, gpu))
    );
    let pct: u8 = env_value(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (10..=80).contains(&pct),
        "within the policy's floor and ceiling: {pct}"
    );
    let preload = env_value(env, "LD_PRELOAD").unwrap();
    assert_eq!(
        preload,
        format!("{xcuda}:/usr/lib/x86_64-linux-gnu/libm.so.6"),
        "xCUDA first, once"
    );
    let inner = out
        .lines()
        .find_map(|l| l.strip_prefix("inner LD_PRELOAD="))
        .unwrap();
    assert_eq!(inner.matches("libmuxflow_xcuda.so").count(), 1, "{inner}");
    assert!(inner.starts_with(&xcuda), "{inner}");
    // xCUDA's settings are in a root-owned file, not in the environment.
    assert!(env_value(env, "MUXFLOW_XCUDA_LIMITS_DIR").is_some());
    assert!(env_value(env, "MUXFLOW_XCUDA_STATS_DIR").is_none());
    // Memory cap: the GPU's memory (recorded by the health step) less the
    // online job's use and the 2048 MiB reserve, for device 0 of the client.
    let limit = env_value(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").expect("a memory cap");
    let mib: u64 = limit
        .strip_prefix("0=")
        .and_then(|m| m.strip_suffix('M'))
        .unwrap()
        .parse()
        .unwrap();
    assert!(mib > 0 && mib <= 81559 - 2048, "{limit}");
    assert_eq!(env_value(env, "MUXFLOW_XCUDA_MEM_LIMIT_BYTES"), None);

    // Both were clients of the one server of that GPU's daemon.
    let online_pid = pids(&c.output_or_empty(online)).pop().unwrap();
    let offline_pid = pids(&out).pop().unwrap();
    let log_dir = c.node_path(&format!("var/log/muxflow/{{node}}/mps/{gpu}"), node);
    let server_log = std::fs::read_to_string(log_dir.join("server.log")).unwrap();
    let server_of = |pid: &str| {
        server_log
            .lines()
            .find(|l| l.contains(&format!("New client {pid} connected")))
            .and_then(|l| l.split("Server ").nth(1))
            .and_then(|r| r.split(']').next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("client {pid} never connected:\n{server_log}"))
    };
    assert_eq!(server_of(&online_pid), server_of(&offline_pid));
    let control_log = std::fs::read_to_string(log_dir.join("control.log")).unwrap();
    assert!(control_log.contains("multiuser=true"), "{control_log}");

    assert_eq!(c.wait(online, WAIT).state, "COMPLETED");
    // The daemon is gone with the last job, and its pipe directory too.
    let start = std::time::Instant::now();
    while pipe.exists() {
        assert!(start.elapsed() < WAIT, "{} still exists", pipe.display());
        std::thread::sleep(Duration::from_millis(200));
    }

    let line = c.sacct_until(offline, "AdminComment", |l| l.contains("steps="));
    let report = JobReport::decode(line.split('|').nth(1).unwrap()).unwrap();
    assert_eq!(report.mode, Some(Mode::Offline));
    assert_eq!(
        (report.node.as_deref(), report.gpu),
        (Some(node), Some(gpu))
    );
    assert_eq!(report.sm_pct, Some(pct));
    assert_eq!(report.mem_cap_mib, Some(mib));
    assert_eq!(report.partner, Some(online));
    assert!(
        report.steps.unwrap() > 0 && report.steps_per_s.unwrap() > 0.0,
        "{line}"
    );
    assert!(
        report.launches.unwrap() > 0,
        "xCUDA counted launches: {line}"
    );
    // The node's run time turns the launch count into the rate the
    // predictor learns from when a workload reports no steps.
    assert!(report.run_s.is_some(), "{line}");
    // muxflow-police sampled the online partner's SM utilization (NVML's
    // per-process figures) while the job ran: the load the predictor
    // separates a job's solo speed from its pair's slowdown with.
    let load = report
        .partner_load_pct
        .unwrap_or_else(|| panic!("no partner_load_pct: {line}"));
    assert!((1..=100).contains(&load), "{line}");
    // And its mean in percent of the GPU: what the predictor reads against
    // the partner's busiest runs (a run at a steady load is at 100 % of
    // itself, whatever the load).
    let sm = report
        .partner_sm_pct
        .unwrap_or_else(|| panic!("no partner_sm_pct: {line}"));
    assert!((1..=100).contains(&sm), "{line}");
    let line = c.sacct_until(online, "AdminComment", |l| l.contains("requests="));
    let report = JobReport::decode(line.split('|').nth(1).unwrap()).unwrap();
    assert_eq!(report.mode, Some(Mode::Online));
    assert!(report.p99_ms.is_some(), "{line}");
    c.assert_no_drain();
}

#[test]
fn users_of_different_uids_share_one_daemon() {
    let c = Cluster::get();
    let node = "node2";
    let (online, gpu) = online_on(&c, node, 6, &[]);
    let script = format!("#!/bin/sh\nid -u\n{}\n", c.workload("offline --duration 2"));
    let offline = c
        .sbatch(&["--muxflow=offline", muxflow_tests::AS_NOBODY], &script)
        .unwrap();
    c.place(offline, node, gpu);
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?} {}", c.output(offline));
    let out = c.output(offline);
    assert_ne!(out.lines().next(), Some("0"), "ran as nobody");
    let offline_pid = pids(&out).pop().unwrap();
    let online_pid = pids(&c.output_or_empty(online)).pop().unwrap();
    let log = std::fs::read_to_string(c.node_path(
        &format!("var/log/muxflow/{{node}}/mps/{gpu}/server.log"),
        node,
    ))
    .unwrap();
    let server_of = |pid: &str| {
        log.lines()
            .find(|l| l.contains(&format!("New client {pid} connected")))
            .and_then(|l| l.split("Server ").nth(1))
            .and_then(|r| r.split(']').next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{pid} not a client:\n{log}"))
    };
    assert_eq!(
        server_of(&online_pid),
        server_of(&offline_pid),
        "one server for root and nobody"
    );
    assert_eq!(c.wait(online, WAIT).state, "COMPLETED");
    let line = c.sacct_until(offline, "AdminComment", |l| l.contains("gpu="));
    assert!(
        kv(line.split('|').nth(1).unwrap(), "partner") == Some(online.to_string()),
        "{line}"
    );
    c.assert_no_drain();
}

#[test]
fn offline_job_released_unplaced_is_refused_with_a_message() {
    let c = Cluster::get();
    let offline = c
        .sbatch(
            &["--muxflow=offline", "-w", "node4"],
            "#!/bin/sh\necho ran\n",
        )
        .unwrap();
    let mut cmd = c.cmd("scontrol");
    cmd.args(["release", &offline.to_string()]);
    assert!(c.run(cmd).0);
    // Refused, and back in the queue (held) for the matcher: not lost.
    let out = c.wait_requeued_held(offline, WAIT);
    assert!(
        out.contains("holds no GPU") && out.contains("matcher"),
        "{out}"
    );
    assert!(!out.lines().any(|l| l == "ran"), "{out}");
    c.scancel(&[offline]);
    c.assert_no_drain();
}
