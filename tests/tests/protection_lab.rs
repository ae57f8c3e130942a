//! `real-gpu/lab`, the protection lab, on the dev cluster's simulated GPU
//! (node1's GPU 0, switched to `h200-like` for the run and back): its
//! cases, windows, statistics, parsing and figure, tested here so that the
//! run on a lent GPU can be believed. Short windows: what is checked is the
//! machinery, not the numbers' precision.

use std::path::{Path, PathBuf};
use std::process::Command;

use muxflow_tests::{kv, one_at_a_time, Cluster};

fn lab() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../real-gpu/lab")
}

fn number(line: &str, key: &str) -> f64 {
    kv(line, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in: {line}"))
}

#[test]
fn the_lab_statistics_pass_their_own_tests() {
    let c = Cluster::get();
    let mut cmd = Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../real-gpu/test_labstats.py"));
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{stdout}{stderr}");
}

/// The plan the help promises: one block with every mechanism fits the
/// budget (four when the xCUDA given does not read the queue's variable);
/// two blocks do not; a GPU run refuses windows under 30 s.
#[test]
fn the_lab_plans_one_device_window() {
    let c = Cluster::get();
    let out = c.scratch("lab-plan");
    let xcuda = std::env::var("MUXFLOW_XCUDA_LIBRARY").expect("source the dev cluster's env");
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(xcuda, bin.join("libmuxflow_xcuda.so")).unwrap();
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(lab());
        cmd.arg("--out")
            .arg(&out)
            .arg("--bin")
            .arg(&bin)
            .args(extra);
        c.run(cmd)
    };
    let (ok, stdout, stderr) = run(&["--plan"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("1 block(s) x 3 repeats x 7 cases x 30 s windows: about 762 s")
            && !stdout.contains("not available"),
        "{stdout}"
    );
    // An xCUDA that does not read the queue's variable: the queue is
    // reported not available and given no window.
    let old = out.join("old-bin");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("libmuxflow_xcuda.so"), b"an older xCUDA").unwrap();
    let mut cmd = Command::new(lab());
    cmd.arg("--out")
        .arg(&out)
        .arg("--bin")
        .arg(&old)
        .arg("--plan");
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("x 6 cases x 30 s windows: about 666 s")
            && stdout.contains("not available: queue"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = run(&["--services", "resnet50,bert"]);
    assert!(
        !ok && stderr.contains("over --budget-s"),
        "{stdout}{stderr}"
    );
    let (ok, _, stderr) = run(&["--window-s", "10", "--plan"]);
    assert!(!ok && stderr.contains("at least 30 s on a GPU"), "{stderr}");
}

#[test]
fn the_lab_runs_on_the_simulated_gpu() {
    let c = Cluster::get();
    // node1's GPU 0 switched to h200-like and back: one lab at a time.
    let _turn = one_at_a_time();
    let out = c.scratch("lab");
    let mut cmd = Command::new(lab());
    cmd.arg("--out").arg(&out).arg("--sim").arg(&c.dir).args([
        "--loads",
        "0.3",
        "--mechanisms",
        "none,mps,trigger,queue,queue2",
        "--window-s",
        "2",
        "--warmup-s",
        "1",
        "--settle-s",
        "0.5",
        "--boot",
        "200",
    ]);
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{stdout}{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "lab=done sim=yes model=h200-like blocks=1 cases=7 windows=21 repeats=3 window_s=2 \
             warmup_s=1 unavailable=none interval=bootstrap95"
        ),
        "{stdout}{stderr}"
    );
    let results = std::fs::read_to_string(out.join("results.txt")).unwrap();
    let case = |name: &str| {
        results
            .lines()
            .find(|l| l.starts_with(&format!("case=resnet50-0.3/{name} ")))
            .unwrap_or_else(|| panic!("no case {name}:\n{results}"))
            .to_string()
    };
    // Every measured mechanism: three ratios and the trainer's fraction,
    // each inside its interval (a small slack: a latency ratio's point is
    // the geometric mean over repeats, the interval a bootstrap's
    // percentiles). A trainer's fraction may be 0 (the online trigger's
    // per-launch delays can leave a 650-launch step unfinished in a short
    // window); a latency ratio may not.
    for m in ["none", "mps", "trigger", "queue", "queue2"] {
        let line = case(m);
        assert_eq!(kv(&line, "available").as_deref(), Some("yes"), "{line}");
        assert!(number(&line, "requests") > 100.0, "{line}");
        for q in ["p50", "p95", "p99", "trainer"] {
            let x = if q == "trainer" {
                number(&line, "trainer_of_solo")
            } else {
                number(&line, &format!("{q}_x"))
            };
            let (lo, hi) = (
                number(&line, &format!("{q}_lo")),
                number(&line, &format!("{q}_hi")),
            );
            let floor_ok = if q == "trainer" { 0.0 <= lo } else { 0.0 < lo };
            assert!(
                floor_ok && lo <= hi && lo * 0.9 <= x && x <= hi * 1.1,
                "{q}: {lo} {x} {hi} in {line}"
            );
        }
        // queue2's figure is its two trainers' steps summed.
        let trainers = if m == "queue2" { 2.0 } else { 1.0 };
        assert_eq!(number(&line, "trainers"), trainers, "{line}");
        assert!(number(&line, "trainer_of_solo") <= 1.2 * trainers, "{line}");
    }
    // The share each trainer ran at: the policy's beside the H200's
    // service without the queue, its ceiling under the queue.
    for (m, pct) in [
        ("none", "100"),
        ("mps", "44"),
        ("trigger", "44"),
        ("queue", "80"),
        ("queue2", "40"),
    ] {
        assert_eq!(
            kv(&case(m), "share_pct").as_deref(),
            Some(pct),
            "{m}: {results}"
        );
    }
    // On h200-like, sharing unprotected (no priority, all SMs) costs the
    // service: its median rises.
    assert!(number(&case("none"), "p50_x") > 1.1, "{results}");
    // The trainer alone made steps (the dev cluster's debug build: a few a
    // second at 650 launches a step).
    assert!(number(&case("solo"), "steps_per_s") > 1.0, "{results}");
    assert!(number(&case("alone"), "p99_ms") > 0.0, "{results}");
    let windows = std::fs::read_to_string(out.join("windows.txt")).unwrap();
    assert_eq!(windows.lines().count(), 21, "{windows}");
    let svg = std::fs::read_to_string(out.join("lab.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.matches("<rect").count() == 5,
        "{svg}"
    );
    // The simulated GPU is back in its own mode.
    let cfg =
        std::fs::read_to_string(c.dir.join("sim/state/nodes/node1/gpus/0/config.toml")).unwrap();
    assert!(!cfg.contains("h200-like"), "{cfg}");
}

/// The one device command (`real-gpu/device-session`), on the simulated
/// GPU: the device-names check, two users with the pipe directory's ACL,
/// then the lab's queue and two jobs under it (queue2), packed
/// into at most three files with a summary that names each result.
#[test]
fn the_device_session_runs_on_the_simulated_gpu() {
    let c = Cluster::get();
    let _turn = one_at_a_time();
    let out = c.scratch("device-session");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../real-gpu/device-session");
    let mut cmd = Command::new(script);
    cmd.arg("--out").arg(&out).arg("--sim").arg(&c.dir).args([
        "--window-s",
        "2",
        "--warmup-s",
        "1",
        "--settle-s",
        "0.5",
        "--budget-s",
        "300",
    ]);
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{stdout}{stderr}");
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    for want in [
        "device_names=done gpus=2 gpu1_checked=yes as_documented=yes",
        "acl_shared=yes acl_kept_out=yes",
        "case=resnet50-0.6/queue ",
        "case=resnet50-0.6/queue2 ",
        "lab=done sim=yes",
        "session=done",
    ] {
        assert!(summary.contains(want), "{want}: {summary}");
    }
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["log.txt", "session.tgz", "summary.txt"]);
    let listed = Command::new("tar")
        .arg("tzf")
        .arg(out.join("session.tgz"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for f in [
        "./lab/results.txt",
        "./lab/windows.txt",
        "./names/device-names.txt",
        "./two-users/two-users.txt",
    ] {
        assert!(listed.lines().any(|l| l == f), "{f}: {listed}");
    }
}
