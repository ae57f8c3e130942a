//! A user's commands do not grow a GPU's MPS control log without bound,
//! tried as the unprivileged user `nobody`. The control daemon echoes every
//! command it is sent into `control.log`, and any user who can reach its
//! socket can send it commands: long ones add megabytes a second. The
//! health step empties the log once it is past its bound and read.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use muxflow_tests::{CancelNamed, Cluster};

const PREFIX: &str = "mfcl-";

#[test]
fn a_flood_of_commands_is_emptied_by_the_next_health_step() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let node = "node4";
    let config = c.dir.join("etc/muxflow.toml");
    let cfg = muxflow::Config::load(&config)
        .unwrap()
        .for_node(node)
        .unwrap();
    // The GPU's daemon runs while its online job does: nobody's, so nobody
    // reaches the daemon (only users with a job on the GPU do).
    let (online, gpu) = c.online_workload_as(
        &format!("{PREFIX}online"),
        node,
        0.05,
        100,
        &[muxflow_tests::AS_NOBODY],
    );
    let pipe = muxflow::node::mps::pipe_dir(&cfg, gpu);
    let log = cfg
        .paths
        .mps_log_root
        .as_path()
        .join(gpu.to_string())
        .join("control.log");
    // 10 MiB of commands, sent as nobody in one session.
    let mut flood = Command::new("runuser")
        .args(["-u", "nobody", "--", "env"])
        .arg(format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()))
        .arg(cfg.paths.mps_control.as_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        let mut stdin = flood.stdin.take().unwrap();
        let command = format!("get_client_list {}\n", "9".repeat(6000));
        for _ in 0..((10 << 20) / command.len()) {
            if stdin.write_all(command.as_bytes()).is_err() {
                break;
            }
        }
    }
    let _ = flood.wait();
    let grown = std::fs::metadata(&log).map_or(0, |m| m.len());
    assert!(grown > 8 << 20, "the flood reached {grown} bytes only");
    c.health_step(&config, node);
    let after = std::fs::metadata(&log).map_or(0, |m| m.len());
    assert!(after < 1 << 20, "{after} bytes after the step");
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, Duration::from_secs(90));
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}
