//! Slurm 25.05 and later: muxflow's own failure inside slurmstepd fails the
//! job, never drains the node (the plugin exports
//! `slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE`; without it the
//! same failure drains the node, as seen on 26.05). node4's muxflow config is
//! broken for node4 alone: an offline job placed there fails with the
//! reason (AdminComment `failed=node_config`, the text in node4's slurmd
//! log), node4 stays up and runs the next job.
//! Skipped, with the reason printed, on releases before 25.05 (CI runs it
//! in its 26.05 pass: scripts/test).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use muxflow_tests::Cluster;

const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "node4";

/// A broken muxflow.toml bind-mounted over the config in one slurmd's mount
/// namespace (the chrooted dev cluster starts each slurmd in its own:
/// scripts/in-slurm-root), so that node alone reads it; unmounted on drop.
struct BrokenOnOneNode {
    pid: String,
    target: PathBuf,
}

impl BrokenOnOneNode {
    fn new(c: &Cluster, node: &str, broken: &str) -> Self {
        let root = std::env::var("MUXFLOW_SLURM_ROOT")
            .expect("a cluster of Slurm 25.05+ runs from a Slurm root (devcluster up --slurm)");
        let pid = std::fs::read_to_string(c.dir.join(format!("run/slurmd.{node}.pid")))
            .unwrap()
            .trim()
            .to_string();
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
        assert_ne!(
            ns(&pid),
            ns("self"),
            "slurmd of {node} shares this mount namespace: cannot break one node's config"
        );
        let file = c.dir.join("muxflow-broken.toml");
        std::fs::write(&file, broken).unwrap();
        // The dev directory appears at its own path inside the root.
        let config = c.dir.join("etc/muxflow.toml");
        let target = PathBuf::from(format!("{root}{}", config.display()));
        let guard = BrokenOnOneNode { pid, target };
        guard.nsenter(&["mount", "--bind", &file.to_string_lossy()]);
        guard
    }

    fn nsenter(&self, args: &[&str]) {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid, "-m"])
            .args(args)
            .arg(&self.target)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nsenter {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for BrokenOnOneNode {
    fn drop(&mut self) {
        self.nsenter(&["umount"]);
    }
}

#[test]
fn a_broken_node_config_fails_the_offline_job_and_the_node_takes_the_next_job() {
    if !muxflow_slurm::version::INIT_FAILURE_MODE {
        // scripts/test sets this on 25.05 and later: a build that lost the
        // mode fails here instead of skipping.
        assert!(
            std::env::var_os("MUXFLOW_EXPECT_INIT_FAILURE_MODE").is_none(),
            "built for Slurm {} without the init-failure mode, though this run expects it",
            muxflow_slurm::version::version_string()
        );
        eprintln!(
            "skipped: built for Slurm {}, which has no SPANK init-failure mode (25.05 and later); \
             scripts/test runs this on 26.05",
            muxflow_slurm::version::version_string()
        );
        return;
    }
    let c = Cluster::get();
    let original = std::fs::read_to_string(c.dir.join("etc/muxflow.toml")).unwrap();
    let broken = BrokenOnOneNode::new(&c, NODE, &format!("{original}\n[policy]\nsm_floor = 500\n"));

    let offline = c
        .sbatch(&["--muxflow=offline"], "#!/bin/sh\necho offline-ran\n")
        .unwrap();
    c.place(offline, NODE, 1);
    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "FAILED", "{end:?}");
    // The reason: a code in the job's AdminComment (Slurm itself shows
    // only "Spank plugin failure", ExitCode 0:68), the text in the node's log.
    let comment = c.admin_comment(offline);
    assert!(
        comment.starts_with("muxflow:v1 mode=offline") && comment.ends_with(" failed=node_config"),
        "{comment}"
    );
    let log = std::fs::read_to_string(c.dir.join(format!("log/slurmd.{NODE}.log"))).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains(&format!("offline job {offline} cannot start on {NODE}")))
        .unwrap_or_else(|| panic!("no reason in slurmd.{NODE}.log:\n{log}"));
    assert!(line.contains("policy.sm_floor"), "{line}");
    // Not run, and the node neither drained nor down.
    assert!(!c.output_or_empty(offline).contains("offline-ran"));
    c.assert_no_drain();
    assert_eq!(c.job_field(offline, "NodeList"), NODE);

    // The node takes the next job, config still broken (an online job runs
    // as before, without MPS).
    let online = c
        .sbatch(
            &["--muxflow=online", "--gres=gpu:1", "-w", NODE],
            "#!/bin/sh\necho online-ran\n",
        )
        .unwrap();
    assert_eq!(c.wait(online, WAIT).state, "COMPLETED");
    assert!(c.output(online).contains("online-ran"));
    c.assert_no_drain();
    drop(broken);
}
