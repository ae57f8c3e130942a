//! `muxflow-matcher` finds its config where admins put it: beside the
//! slurm.conf in use, then /etc/slurm; `--config` overrides; without one
//! the error lists the places tried and the flag (not the plugin's
//! plugstack argument). The search itself, /etc/slurm included, is
//! table-tested in `muxflow::config`; this runs the real program.

use std::path::Path;
use std::process::Command;

/// `muxflow-matcher --once --dry-run` with `SLURM_CONF` and extra args;
/// (exit success, stderr). No Slurm answers here: a found config shows as
/// getting as far as asking Slurm.
fn matcher(slurm_conf: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_muxflow-matcher"))
        .args(["--once", "--dry-run"])
        .args(args)
        .env("SLURM_CONF", slurm_conf)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_beside_slurm_conf_flag_and_none() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    let bare = dir.path().join("bare");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::create_dir_all(&bare).unwrap();
    // Slurm's commands from a directory that has none: fails at once.
    std::fs::write(
        site.join("muxflow.toml"),
        "[matcher]\ninterval_s = 5\n[slurm]\nscontrol = \"/nonexistent/scontrol\"\n",
    )
    .unwrap();
    let broken = bare.join("broken.toml");
    std::fs::write(&broken, "[matcher]\ninterval_s = \"soon\"\n").unwrap();

    // Beside $SLURM_CONF: found, so the round gets to asking Slurm.
    let (ok, err) = matcher(&site.join("slurm.conf"), &[]);
    assert!(!ok);
    assert!(err.contains("reading jobs and nodes from Slurm"), "{err}");
    assert!(err.contains("cannot run /nonexistent/squeue"), "{err}");
    assert!(!err.contains("muxflow config"), "{err}");

    if Path::new("/etc/slurm/muxflow.toml").exists() {
        return; // This machine has one: "none" cannot be shown here.
    }
    // None: every place tried, and the flag that fixes it.
    let (ok, err) = matcher(&bare.join("slurm.conf"), &[]);
    assert!(!ok);
    let want = format!(
        "no muxflow config found: tried {}, /etc/slurm/muxflow.toml; put muxflow.toml in one of these places or give its path with --config PATH",
        bare.join("muxflow.toml").display()
    );
    assert!(err.contains(&want), "{err}");
    assert!(!err.contains("plugstack"), "{err}");

    // --config wins over the search: its broken file is the one reported.
    let (ok, err) = matcher(
        &site.join("slurm.conf"),
        &["--config", broken.to_str().unwrap()],
    );
    assert!(!ok);
    assert!(
        err.contains("broken.toml:2") && err.contains("matcher.interval_s"),
        "{err}"
    );
    let missing = bare.join("missing.toml");
    let (_, err) = matcher(
        &site.join("slurm.conf"),
        &["--config", missing.to_str().unwrap()],
    );
    assert!(
        err.contains("missing.toml") && err.contains("give the path with --config PATH"),
        "{err}"
    );
}
