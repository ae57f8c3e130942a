//! The node programs find muxflow.toml beside the slurm.conf slurmd gives
//! them, with no `--config` (the dev cluster writes it beside its
//! slurm.conf); with none there, the error lists the places tried and the
//! flag (on stderr and in the default node log), and the program still
//! exits 0 (a node program never fails the node). Runs the built `muxflow-health` against the dev cluster.

use std::path::Path;
use std::process::Command;

use muxflow_tests::{target, Cluster};

fn health(slurm_conf: &Path) -> (bool, String) {
    let out = Command::new(target().join("muxflow-health"))
        .env("SLURM_CONF", slurm_conf)
        .env("SLURMD_NODENAME", "node4")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn health_check_finds_its_config_beside_slurm_conf() {
    let c = Cluster::get();
    let (ok, err) = health(&c.slurm_conf);
    assert!(ok, "{err}");
    assert!(!err.contains("muxflow config"), "{err}");
    // The config found names the node log, which this run opened.
    assert!(!err.contains("no node log"), "{err}");

    if Path::new("/etc/slurm/muxflow.toml").exists() {
        return; // This machine has one: "none" cannot be shown here.
    }
    let bare = c.scratch("no-config");
    let (ok, err) = health(&bare.join("slurm.conf"));
    assert!(ok, "a node program exits 0 whatever its own failure: {err}");
    let want = format!(
        "no muxflow config found: tried {}, /etc/slurm/muxflow.toml; put muxflow.toml in one of these places or give its path with --config PATH",
        bare.join("muxflow.toml").display()
    );
    assert!(err.contains(&want), "{err}");
    // Said where an administrator looks (slurmd drops stderr): the default
    // node log, the config's own being unknown.
    let default_log = muxflow::config::Paths::default().node_log;
    let log = std::fs::read_to_string(default_log.as_path()).unwrap_or_default();
    assert!(
        log.contains(&want),
        "{} lacks: {want}",
        default_log.as_path().display()
    );
}
