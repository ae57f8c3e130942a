//! Jobs found by the cgroups Slurm makes, on the release the dev cluster
//! runs: `job_<id>` directories on 22.05 and 24.11, the job's SLUID on
//! 26.05 (scripts/devcluster puts each step in job cgroups named so).
//!
//! * A process the job daemonized (a session of its own, reparented to
//!   init, `SLURM_JOB_ID` dropped) is still the job's while the job runs:
//!   it stays in the job's cgroup, so the police do not evict it as a
//!   straggler. Once the job has ended it is one, and is evicted.
//! * The kernel's GPU memory cap (dmem) is written to the job's directory
//!   under the release's name, and read back.

use std::path::Path;
use std::time::{Duration, Instant};

use muxflow::node::jobproc::{job_dir_in_cgroup, JobDirName};
use muxflow_tests::{kv, CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// The job directory a job's `0::` cgroup line (printed as `cgroup=…`)
/// names, checked against the release's naming for job `job`.
fn job_dir_of(c: &Cluster, out: &str, job: u32) -> String {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("cgroup="))
        .unwrap_or_else(|| panic!("no cgroup line:\n{out}"));
    let dir = job_dir_in_cgroup(line).unwrap_or_else(|| panic!("no job cgroup in {line}"));
    match (&dir.name, c.names_job_cgroups_by_sluid()) {
        (JobDirName::Sluid(_), true) => {}
        (JobDirName::Id(id), false) => assert_eq!(*id, job, "{line}"),
        (name, sluid) => panic!("{line}: {name:?}, but the release names by SLUID: {sluid}"),
    }
    dir.path
}

#[test]
fn a_daemonized_process_of_a_running_job_is_kept_and_evicted_once_the_job_ended() {
    let c = Cluster::get();
    let node = "node4";
    const PREFIX: &str = "mfcg-";
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let cfg = c.health_config("cgroup-daemon", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    // A double fork into a session of its own, without SLURM_JOB_ID: out
    // of the job's process tree and its environment, still in its cgroup.
    // The job then runs on until /tmp/…/done appears.
    let scratch = c.scratch("cgroup-daemon");
    muxflow_tests::open_to_all(&scratch);
    let done = scratch.join("done");
    let script = format!(
        "#!/bin/sh\necho cgroup=$(grep '^0::' /proc/self/cgroup)\n\
         (env -u SLURM_JOB_ID -u SLURM_JOBID setsid {} </dev/null & echo daemon-pid=$!)\n\
         while [ ! -e {} ]; do sleep 0.2; done\n",
        c.workload("offline --duration 120 --alloc-mib 256"),
        done.display()
    );
    let offline = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &script);
    let out = c.wait_output(offline, "daemon-pid=", WAIT);
    let pid: u32 = kv(&out, "daemon-pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    job_dir_of(&c, &out, offline);
    // Attached to the GPU's MPS server, then policed a few times while the
    // job runs: it is the job's.
    let start = Instant::now();
    let mut logs = String::new();
    while start.elapsed() < Duration::from_secs(4) {
        logs += &c.health_step(&cfg, node);
        std::thread::sleep(Duration::from_millis(300));
    }
    let evicted = format!("process {pid} is evicted from GPU {gpu}");
    assert!(
        muxflow_tests::process_runs(pid) && !logs.contains(&evicted),
        "the running job's process {pid} was evicted:\n{logs}\n{}",
        c.node_picture(&cfg, node)
    );
    assert_eq!(c.job_field(offline, "JobState"), "RUNNING");
    // The job ends; its daemon is now a straggler and is evicted.
    std::fs::write(&done, "").unwrap();
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}: {out}");
    let start = Instant::now();
    while muxflow_tests::process_runs(pid) {
        assert!(
            start.elapsed() < WAIT,
            "the straggler {pid} still runs:\n{logs}\n{}",
            c.node_picture(&cfg, node)
        );
        logs += &c.health_step(&cfg, node);
        std::thread::sleep(Duration::from_millis(300));
    }
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    assert!(
        node_log
            .lines()
            .any(|l| l.contains(&evicted) && l.contains("no running Slurm job")),
        "{logs}\n{node_log}"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

/// Turns `node`'s simulated dmem controller on; off again when dropped.
struct Dmem<'a>(&'a Cluster, &'static str);

impl Dmem<'_> {
    fn set(c: &Cluster, node: &str, state: &str) {
        let dir = c.dir.join("sim/state");
        c.simgpu(&["dmem", dir.to_str().unwrap(), "--node", node, state]);
    }
}

impl Drop for Dmem<'_> {
    fn drop(&mut self) {
        Self::set(self.0, self.1, "off");
    }
}

#[test]
fn the_dmem_cap_is_written_to_the_job_directory_the_release_names() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let node = "node2";
    const PREFIX: &str = "mfcgd-";
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    Dmem::set(&c, node, "on");
    let _dmem = Dmem(&c, node);
    let cfg = c.health_config("cgroup-dmem", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let scratch = c.scratch("cgroup-dmem");
    muxflow_tests::open_to_all(&scratch);
    let done = scratch.join("done");
    let script = format!(
        "#!/bin/sh\necho cgroup=$(grep '^0::' /proc/self/cgroup)\n\
         while [ ! -e {} ]; do sleep 0.2; done\n",
        done.display()
    );
    let job = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &script);
    let out = c.wait_output(job, "cgroup=", WAIT);
    let dir = job_dir_of(&c, &out, job);
    // The simulated kernel's tree (the node's cgroup_root) holds the cap
    // where the job's cgroup is.
    let max = c
        .dir
        .join(format!("sim/state/nodes/{node}/cgroup"))
        .join(Path::new(dir.trim_start_matches('/')))
        .join("dmem.max");
    let text =
        std::fs::read_to_string(&max).unwrap_or_else(|e| panic!("{}: {e}\n{out}", max.display()));
    let bytes: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("{}: {text}", max.display()));
    assert!(bytes > 0 && bytes < 80 << 30, "{text}");
    std::fs::write(&done, "").unwrap();
    assert_eq!(c.wait(job, WAIT).state, "COMPLETED");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.assert_no_drain();
}
