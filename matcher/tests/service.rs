//! `muxflow-matcher` as a `Type=notify` systemd service: it sends READY=1
//! once its config is read, and SIGHUP re-reads the config before the next
//! round — a bad file is logged and the previous settings kept. No Slurm
//! here: the rounds fail (logged) and the loop goes on, as it would with
//! slurmctld down.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const CONFIG: &str = "[matcher]\ninterval_s = 1\n[slurm]\nscontrol = \"/nonexistent/scontrol\"\n";

#[test]
fn ready_then_sighup_rereads_the_config_and_keeps_the_old_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("muxflow.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_muxflow-matcher"))
        .arg("--config")
        .arg(&config)
        .arg("--dry-run")
        .env("NOTIFY_SOCKET", &socket_path)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its log, line by line, from a thread.
    let (tx, lines) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |what: &str| -> String {
        loop {
            match lines.recv_timeout(Duration::from_secs(20)) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(e) => panic!("no log line with '{what}': {e}"),
            }
        }
    };
    let mut buf = [0u8; 64];
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    wait_for("round failed");

    let hup = |pid: u32| {
        assert!(Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success())
    };
    std::fs::write(&config, CONFIG.replace("interval_s = 1", "interval_s = 2")).unwrap();
    hup(child.id());
    let line = wait_for("config re-read (SIGHUP)");
    assert!(line.contains("2s"), "{line}");
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"RELOADING=1");
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");

    std::fs::write(&config, "[matcher]\ninterval_s = \"soon\"\n").unwrap();
    hup(child.id());
    let line = wait_for("config not re-read, the previous one stays");
    assert!(line.contains("matcher.interval_s"), "{line}");
    // Still running its rounds.
    wait_for("round failed");
    assert!(child.try_wait().unwrap().is_none());
    child.kill().unwrap();
    child.wait().unwrap();
}
