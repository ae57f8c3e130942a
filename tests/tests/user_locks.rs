//! A user holds none of root's locks, tried as the unprivileged user
//! `nobody`. `flock` works on any descriptor, read-only too: a lock file
//! a user can open is a lock the user can hold against root. Held from a
//! login shell, the node's lock stalled every Prolog and health step of the
//! node; held from an offline job, its GPU's lock stalled the police while
//! the job ran without xCUDA. Every path a lock of root's has had is tried
//! here (today's under the root-only `locks/`, and the older ones beside
//! the state they guard).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use muxflow_tests::{CancelNamed, Cluster, AS_NOBODY};

const WAIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "mful-";
const PREFIX_JOB: &str = "mfuj-";

/// Every path of a lock root takes on `state` for GPU `gpu` and job `job`,
/// today's and older versions'.
fn lock_paths(state: &Path, gpu: u32, job: &str) -> Vec<PathBuf> {
    [
        "node.lock".to_string(),
        "sampler.lock".to_string(),
        format!("gpu{gpu}/lock"),
        format!("police/{job}.lock"),
        "locks/node".to_string(),
        "locks/sampler".to_string(),
        format!("locks/gpu{gpu}"),
        format!("locks/police-{job}"),
    ]
    .iter()
    .map(|p| state.join(p))
    .collect()
}

/// `flock -x -n <path> sleep 40` as `nobody`, in a process group of its own
/// (ended by [`Holders`]).
fn hold_as_nobody(path: &Path) -> Child {
    let mut c = Command::new("runuser");
    c.args(["-u", "nobody", "--", "flock", "-x", "-n"])
        .arg(path)
        .args(["sleep", "40"])
        .stderr(std::process::Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    c.spawn().unwrap()
}

/// The holders this test started, ended with their process groups.
struct Holders(Vec<(PathBuf, Child)>);

impl Drop for Holders {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stderr(std::process::Stdio::null())
                .status();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_user_holds_no_lock_of_roots_and_the_steps_go_on() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let node = "node4";
    let config = c.dir.join("etc/muxflow.toml");
    let ns = c.node_state(&config, node);
    // Root's lock files exist (a step made them).
    c.health_step(&config, node);
    let mut holders = Holders(
        (0..2)
            .flat_map(|g| lock_paths(ns.dir(), g, "1"))
            .map(|p| {
                let child = hold_as_nobody(&p);
                (p, child)
            })
            .collect(),
    );
    std::thread::sleep(Duration::from_secs(1));
    // A health step (as slurmd runs it) and an online job's Prolog are
    // not held up by anything a user did.
    let start = Instant::now();
    let mut step = c.health_cmd(&config, node).spawn().unwrap();
    let status = loop {
        if let Some(s) = step.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = step.kill();
            let _ = step.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let held: Vec<String> = holders
        .0
        .iter_mut()
        .filter_map(|(p, child)| {
            child
                .try_wait()
                .unwrap()
                .is_none()
                .then(|| p.display().to_string())
        })
        .collect();
    assert!(
        status.is_some_and(|s| s.success()),
        "the health step took {:?} ({status:?}); nobody holds {held:?}",
        start.elapsed()
    );
    assert!(held.is_empty(), "nobody holds {held:?}");
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                AS_NOBODY,
                "--gres=gpu:1",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            "#!/bin/sh\nsleep 60\n",
        )
        .unwrap();
    c.wait_running(online, Duration::from_secs(30));
    holders.0.clear();
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.assert_no_drain();
}

#[test]
fn an_offline_job_holds_no_lock_and_is_policed() {
    let c = Cluster::get();
    c.cancel_named(PREFIX_JOB);
    let _cancel = CancelNamed(&c, PREFIX_JOB);
    let node = "node3";
    let config = c.dir.join("etc/muxflow.toml");
    let ns = c.node_state(&config, node);
    let (online, gpu) = c.online_workload(&format!("{PREFIX_JOB}online"), node, 0.05, 1000);
    let workload = c.workload("offline --duration 120 --alloc-mib 256");
    let locks: Vec<String> = lock_paths(ns.dir(), gpu, "$SLURM_JOB_ID")
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // Each lock it gets, it holds for 100 s and says so; then a process
    // without xCUDA, which the police must evict meanwhile.
    let script = format!(
        "#!/bin/sh\n\
         for f in {}; do\n\
         flock -x -n \"$f\" sh -c 'echo locked=$0; sleep 100' \"$f\" &\n\
         done\n\
         sleep 1\n\
         (unset LD_PRELOAD; exec {workload}) &\n\
         wait\n",
        locks.join(" ")
    );
    let offline = c.offline_as_nobody(&format!("{PREFIX_JOB}offline"), node, gpu, &script);
    c.wait_running(offline, WAIT);
    let out = c.wait_output(offline, "pid=", WAIT);
    let pid = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap()
        .to_string();
    let log_path = c.node_path(
        &format!("var/log/muxflow/{{node}}/mps/{gpu}/server.log"),
        node,
    );
    let start = Instant::now();
    let evicted = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains(&format!("Terminating client {pid}")) {
            break true;
        }
        if start.elapsed() > Duration::from_secs(45) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = c.output_or_empty(offline);
    assert!(
        evicted,
        "process {pid} without xCUDA not evicted in {:?}:\n{out}",
        start.elapsed()
    );
    assert!(!out.contains("locked="), "{out}");
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[offline, online]);
    c.wait(offline, WAIT);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}
