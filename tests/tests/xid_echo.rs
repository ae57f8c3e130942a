//! A user cannot write an Xid into the kernel log, tried as the
//! unprivileged user `nobody` against this host's real kernel log: in a
//! user namespace of their own, `mount -t tmpfs -o '<text>'` makes the
//! kernel log `tmpfs: Unknown parameter '<text>'` with its own facility.
//! With an Xid's text as the option, the health step used to take it for
//! the driver's and act on the GPU (fault, pause, evict). The step here
//! reads `/dev/kmsg` with a state directory of its own (the cluster's
//! nodes read their simulated GPUs' logs, and their cursors stay theirs).

use std::path::Path;
use std::process::Command;

use muxflow_tests::{set_key, Cluster};

/// Publishes `node`'s own state again when dropped: this test's steps
/// publish its scratch state's.
struct Republish<'a>(&'a Cluster, &'static str);

impl Drop for Republish<'_> {
    fn drop(&mut self) {
        let config = self.0.dir.join("etc/muxflow.toml");
        let _ = self.0.run(self.0.health_cmd(&config, self.1));
    }
}

#[test]
fn a_users_echo_in_the_kernel_log_is_no_xid() {
    let c = Cluster::get();
    let node = "node2";
    let kmsg = Path::new("/dev/kmsg");
    // Root reads /dev/kmsg; a container may not give it (or user
    // namespaces): then the attack cannot be made here either.
    if std::fs::File::open(kmsg).is_err() {
        eprintln!("skipped: /dev/kmsg is not readable here");
        return;
    }
    let scratch = c.scratch("xid-echo");
    let config = c.health_config("xid-echo", "");
    for (key, dir) in [
        ("state_dir", "state"),
        ("mps_pipe_root", "mps"),
        ("mps_log_root", "mps-log"),
    ] {
        set_key(&config, key, &scratch.join(dir).display().to_string());
    }
    set_key(&config, "kernel_log", "/dev/kmsg");
    let _republish = Republish(&c, node);
    // The first step skips the log's history.
    c.health_step(&config, node);
    // GPU 0 of every simulated node is at PCI 0000:18:00.
    let echo = Command::new("runuser")
        .args([
            "-u", "nobody", "--", "unshare", "-Urm", "mount", "-t", "tmpfs",
        ])
        .args(["-o", "NVRM: Xid (PCI:0000:18:00): 79", "none", "/mnt"])
        .output()
        .unwrap();
    let dmesg = Command::new("dmesg").output().unwrap();
    let echoed = String::from_utf8_lossy(&dmesg.stdout)
        .contains("tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:18:00): 79'");
    if !echoed {
        eprintln!(
            "skipped: no echo in the kernel log (user namespaces off?): {}",
            String::from_utf8_lossy(&echo.stderr)
        );
        return;
    }
    let log = c.health_step(&config, node);
    assert!(!log.contains("Xid in the kernel log"), "{log}");
    let ns = c.node_state(&config, node);
    let health = ns.health(0).unwrap().map(|h| h.to_string());
    assert!(
        !matches!(health.as_deref(), Some("faulty" | "lost")),
        "{health:?}\n{log}"
    );
    c.assert_no_drain();
}
