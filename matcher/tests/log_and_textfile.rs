//! The daemon's log and textfile as an operator's tools read them: a log
//! that is not a terminal (the journal, a file) carries no colour codes,
//! and after rounds that all failed the textfile says which build runs but
//! shows no last successful round (so an alert on its age fires).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_log_off_a_terminal_has_no_colour_and_failed_rounds_leave_no_success() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("muxflow.toml");
    let prom = dir.path().join("prom");
    std::fs::write(
        &config,
        format!(
            "[matcher]\ninterval_s = 1\n[slurm]\nscontrol = \"/nonexistent/scontrol\"\n\
             [metrics]\ntextfile_dir = \"{}\"\n",
            prom.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_muxflow-matcher"))
        .arg("--config")
        .arg(&config)
        .arg("--dry-run")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let textfile = prom.join("muxflow-matcher.prom");
    let start = Instant::now();
    // Two rounds: the first failure logged and its textfile written.
    let (text, metrics) = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let metrics = std::fs::read_to_string(&textfile).unwrap_or_default();
        if text.matches("round failed").count() >= 2 && metrics.contains("rounds_total") {
            break (text, metrics);
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no failed round logged: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in the log: {text:?}"
    );
    assert!(text.contains("INFO"), "{text}");
    assert!(metrics.contains("muxflow_matcher_build_info{"), "{metrics}");
    assert!(
        metrics.contains("muxflow_matcher_round_failures_total"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("muxflow_matcher_last_success_timestamp_seconds "),
        "{metrics}"
    );
}
