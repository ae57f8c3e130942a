//! Misconfiguration on the node side (the config slurmstepd reads): the user
//! gets a clear message, offline work is refused rather than run unprotected,
//! online work still runs, and no node drains. One test, since it rewrites
//! the cluster's muxflow.toml (test binaries run one after another).

use std::path::PathBuf;
use std::time::Duration;

use muxflow_tests::Cluster;

const WAIT: Duration = Duration::from_secs(90);

/// Restores the cluster's muxflow.toml when dropped, even on panic.
struct ConfigGuard {
    path: PathBuf,
    original: String,
}

impl ConfigGuard {
    fn new(c: &Cluster) -> Self {
        let path = c.dir.join("etc/muxflow.toml");
        let original = std::fs::read_to_string(&path).unwrap();
        ConfigGuard { path, original }
    }

    fn set(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
}

impl Drop for ConfigGuard {
    fn drop(&mut self) {
        std::fs::write(&self.path, &self.original).unwrap();
    }
}

fn offline_placed(c: &Cluster, node: &str) -> u32 {
    let id = c
        .sbatch(&["--muxflow=offline"], "#!/bin/sh\necho offline-ran\n")
        .unwrap();
    c.place(id, node, 1);
    id
}

#[test]
fn node_side_misconfiguration_refuses_offline_work_and_drains_nothing() {
    let c = Cluster::get();
    let guard = ConfigGuard::new(&c);

    // 1. The xCUDA library is missing.
    let missing = guard.original.replace(
        "xcuda_library = \"",
        "xcuda_library = \"/nonexistent/muxflow",
    );
    assert_ne!(
        missing, guard.original,
        "the dev config names xcuda_library"
    );
    guard.set(&missing);
    let id = offline_placed(&c, "node4");
    let end = c.wait(id, WAIT);
    assert_eq!(end.state, "FAILED", "{end:?}");
    let out = c.output(id);
    assert!(
        out.contains("xCUDA library /nonexistent/muxflow") && out.contains("is missing"),
        "{out}"
    );
    assert!(
        !out.contains("offline-ran"),
        "the offline task must not run unprotected: {out}"
    );
    let online = c
        .sbatch(
            &["--muxflow=online", "--gres=gpu:1", "-w", "node4"],
            "#!/bin/sh\necho online-ran\n",
        )
        .unwrap();
    assert_eq!(
        c.wait(online, WAIT).state,
        "COMPLETED",
        "online jobs do not need xCUDA"
    );
    c.assert_no_drain();

    // 2. The config gets a bad value after submission (sbatch would reject
    // it): the nodes cannot read it at all when the jobs start.
    let id = c
        .sbatch(&["--muxflow=offline"], "#!/bin/sh\necho offline-ran\n")
        .unwrap();
    let online = c
        .sbatch(
            &["--muxflow=online", "--gres=gpu:1", "-w", "node4", "--hold"],
            "#!/bin/sh\necho online-ran\n",
        )
        .unwrap();
    guard.set(&(guard.original.clone() + "\n[policy]\nsm_floor = 500\n"));
    // (No health step can read this config: the placement alone.)
    c.write_placement(id, "node4", 1);
    let end = c.wait(id, WAIT);
    assert_eq!(end.state, "FAILED", "{end:?}");
    if muxflow_slurm::version::INIT_FAILURE_MODE {
        // Slurm 25.05+: failed in slurmstepd's init, before any output
        // (tests/init_failure.rs); the reason's code in the AdminComment.
        let comment = c.admin_comment(id);
        assert!(comment.ends_with(" failed=node_config"), "{comment}");
    } else {
        let out = c.output(id);
        assert!(
            out.contains("policy.sm_floor") && out.contains("0 to 100"),
            "{out}"
        );
    }
    let mut release = c.cmd("scontrol");
    release.args(["release", &online.to_string()]);
    assert!(c.run(release).0);
    assert_eq!(c.wait(online, WAIT).state, "COMPLETED");
    assert!(c.output(online).contains("online-ran"));
    // The node programs said why where an administrator looks (slurmd drops
    // their stderr): the default node log, the config's own being unknown.
    let default_log = c.node_view(
        "node4",
        muxflow::config::Paths::default().node_log.as_path(),
    );
    let log = std::fs::read_to_string(&default_log).unwrap_or_default();
    assert!(
        log.lines().any(|l| l.contains("policy.sm_floor")
            && l.contains(&format!("job {:?}", Some(online.to_string())))),
        "{}: {}",
        default_log.display(),
        log.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    c.assert_no_drain();
}
