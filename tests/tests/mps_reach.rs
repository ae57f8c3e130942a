//! Who may be a client of a GPU's MPS daemon, tried as the unprivileged
//! user `nobody`: every job on the node can name any GPU's pipe directory,
//! so the police judge each client by its job, not by how it got there.
//!
//! * A plain job (no `--muxflow`, no GPU) and an online job of another GPU
//!   that point `CUDA_MPS_PIPE_DIRECTORY` at the pipe of root's online GPU,
//!   priority 0 and every SM: both are evicted by the next health step and
//!   told why; the online job runs on.

use std::time::Duration;

use muxflow_tests::{Cluster, AS_NOBODY};

const WAIT: Duration = Duration::from_secs(90);

/// Script lines that point a job's MPS client at `pipe`, asking for all.
fn reach(pipe: &std::path::Path) -> String {
    format!(
        "export CUDA_MPS_PIPE_DIRECTORY={}\nexport CUDA_MPS_CLIENT_PRIORITY=0\n\
         export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\nunset CUDA_VISIBLE_DEVICES\n",
        pipe.display()
    )
}

#[test]
fn clients_of_jobs_that_are_not_the_gpus_are_evicted() {
    let c = Cluster::get();
    let node = "node1";
    const PREFIX: &str = "mfr-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config("mps-reach", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    let pipe = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string());
    let attack = |what: &str| {
        format!(
            "#!/bin/sh\n{}echo {what}-start\n{}\necho {what}-exit=$?\n",
            reach(&pipe),
            c.workload("offline --duration 120 --alloc-mib 256")
        )
    };
    let plain = c
        .sbatch(
            &[
                AS_NOBODY,
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}plain"),
            ],
            &attack("plain"),
        )
        .unwrap();
    // An online job of nobody on the node's other GPU.
    let other = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                AS_NOBODY,
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}other"),
            ],
            &attack("other"),
        )
        .unwrap();
    let mut pids = Vec::new();
    for job in [plain, other] {
        let out = c.wait_output(job, "pid=", WAIT);
        let pid: u32 = muxflow_tests::kv(&out.replace('\n', " "), "pid")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        pids.push((job, pid));
    }
    let log = c.step_until(&cfg, node, "both attackers gone", || {
        pids.iter()
            .all(|(_, pid)| !muxflow_tests::process_runs(*pid))
    });
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    for (job, pid) in pids {
        let evicted = format!("process {pid} of job {job} is evicted from GPU {gpu}");
        assert!(
            node_log
                .lines()
                .any(|l| l.contains(&evicted) && l.contains("not_on_gpu")),
            "{log}\n{node_log}"
        );
        let end = c.wait(job, WAIT);
        let told = c.output_or_empty(job);
        assert!(
            told.contains(&evicted) && told.contains("only the GPU's own jobs"),
            "{end:?}: {told}"
        );
    }
    // The online job was not touched.
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}
