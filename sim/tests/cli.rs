//! The binary end to end: its interface (--json fields, --timeline,
//! --plot), byte-identical output for a seed, and bad input reported with
//! file:line, column and what was expected, never a panic.

use std::path::Path;
use std::process::{Command, Output};

const NODES: &str =
    "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,4,V100M16\nn2,1000,1000,2,T4\n";
const TRACE: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase\n\
svc-a,1,1,1,1000,,LS,Running\nsvc-b,1,1,1,460,,Burstable,Running\nsvc-c,1,1,2,1000,T4,LS,Running\n\
train-a,1,1,1,1000,,BE,Running\ntrain-b,1,1,1,300,,BE,Running\ncpu-only,1,1,0,0,,BE,Running\n";
const PAIRS: &str = "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,A,10,10,6,6\nA,B,10,20,5,12\nB,A,20,10,12,5\nB,B,20,20,0,0\n";
const RUNTIMES: &str = "runtime\n60\n600\n3600\n0\n";

fn write_inputs(dir: &Path) {
    for (name, text) in [
        ("nodes.csv", NODES),
        ("trace.csv", TRACE),
        ("pairs.csv", PAIRS),
        ("runtimes.csv", RUNTIMES),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

fn sim(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_muxflow-sim"))
        .current_dir(dir)
        .args([
            "--nodes",
            "nodes.csv",
            "--trace",
            "trace.csv",
            "--interference",
            "pairs.csv",
            "--offline-runtimes",
            "runtimes.csv",
            "--days",
            "0.5",
            "--offline-load",
            "2",
        ])
        .args(extra)
        .output()
        .expect("muxflow-sim runs")
}

#[test]
fn json_has_every_documented_field_and_a_seed_gives_byte_identical_output() {
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path());
    let a = sim(dir.path(), &["--json", "--no-timing", "--seed", "7"]);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let b = sim(dir.path(), &["--json", "--no-timing", "--seed", "7"]);
    assert_eq!(a.stdout, b.stdout, "same inputs and seed, same bytes");
    let c = sim(dir.path(), &["--json", "--no-timing", "--seed", "8"]);
    assert_ne!(a.stdout, c.stdout, "another seed, other arrivals");

    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let policies = v["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exclusive", "time-sharing", "priority", "muxflow"]);
    for field in [
        "name",
        "gpu_util",
        "sm_activity",
        "mem_util",
        "online_gpu_util",
        "online_gpu_sm_activity",
        "online_latency_p50",
        "online_latency_p99",
        "offline_jct_mean_s",
        "offline_jct_p50_s",
        "offline_jct_p90_s",
        "offline_queue_mean_s",
        "offline_gpu_hours",
        "offline_finished",
        "lent_gpu_hours",
        "rounds",
        "round_total_s",
        "predictor_mae",
        "pairing_vs_oracle",
    ] {
        for p in policies {
            assert!(p.get(field).is_some(), "{field} missing in {p}");
        }
    }
    // Figures that do not apply are null; exclusive lends nothing.
    assert!(policies[0]["rounds"].is_null() && policies[0]["predictor_mae"].is_null());
    assert_eq!(policies[0]["lent_gpu_hours"], 0.0);
    assert!(policies[3]["rounds"].is_u64());
    assert!(policies[3]["round_total_s"].is_null(), "--no-timing");
    // Where muxflow's online GPUs' time went while offline work waited;
    // the other policies have no rounds to wait for.
    assert!(policies[0]["while_waiting"].is_null());
    let w = &policies[3]["while_waiting"];
    for field in [
        "held_gpu_hours",
        "held_unused_gpu_hours",
        "braked_gpu_hours",
        "health_gpu_hours",
        "rounds_gpu_hours",
        "memory_gpu_hours",
        "unplaced_gpu_hours",
    ] {
        assert!(
            w[field].as_f64().is_some_and(|v| v >= 0.0),
            "{field} in {w}"
        );
    }
    assert_eq!(v["inputs"]["gpus"], 6);
    assert_eq!(v["inputs"]["nodes"], "nodes.csv");

    // --candidates-only: rounds exact on their candidates, cold, still
    // byte-identical.
    let priced = &[
        "--json",
        "--no-timing",
        "--seed",
        "7",
        "--policies",
        "muxflow",
        "--candidates-only",
    ];
    let d = sim(dir.path(), priced);
    assert!(d.status.success(), "{}", String::from_utf8_lossy(&d.stderr));
    assert_eq!(d.stdout, sim(dir.path(), priced).stdout);

    // Churn figures are null without --autoscale.
    assert!(policies[3]["offline_lost_gpu_hours"].is_null());
    assert_eq!(v["inputs"]["autoscale"], false);
}

#[test]
fn autoscale_reports_its_churn_byte_identically() {
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path());
    for extra in [&[][..], &["--checkpoint-on-requeue"][..]] {
        let args: Vec<&str> = ["--json", "--no-timing", "--autoscale"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let a = sim(dir.path(), &args);
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
        assert_eq!(a.stdout, sim(dir.path(), &args).stdout, "{args:?}");
        let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
        assert_eq!(v["inputs"]["autoscale"], true);
        for p in v["policies"].as_array().unwrap() {
            for field in [
                "online_replica_starts",
                "online_starts_delayed",
                "online_start_delay_mean_s",
                "online_start_delay_max_s",
                "online_replica_hours_short",
                "offline_requeues",
                "offline_lost_gpu_hours",
            ] {
                assert!(!p[field].is_null(), "{field} in {p}");
            }
        }
        let table = sim(dir.path(), &args[1..]);
        assert!(String::from_utf8_lossy(&table.stdout).contains("offline work lost, GPU-h"));
    }
    let bad = sim(dir.path(), &["--autoscale", "--checkpoint-interval", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--checkpoint-interval"));
}

#[test]
fn table_timeline_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path());
    let out = sim(
        dir.path(),
        &[
            "--policies",
            "exclusive,muxflow",
            "--timeline",
            "t.csv",
            "--plot",
            "p.svg",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let header = table.lines().nth(1).unwrap();
    assert!(
        header.contains("exclusive") && header.contains("muxflow") && !header.contains("priority")
    );
    assert!(table.contains("GPU utilization (online GPUs)"), "{table}");
    let timeline = std::fs::read_to_string(dir.path().join("t.csv")).unwrap();
    let lines: Vec<&str> = timeline.lines().collect();
    assert!(lines[0].starts_with("policy,hour,online_load,gpu_util"));
    assert_eq!(lines.len(), 1 + 2 * 12, "12 hours per policy");
    assert!(lines[1].starts_with("exclusive,0,") && lines[13].starts_with("muxflow,0,"));
    let svg = std::fs::read_to_string(dir.path().join("p.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("muxflow") && svg.contains("<polyline"));
    // No progress bar when stderr is not a terminal.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_input_says_where_and_what_never_panics() {
    const ABSENT: &str = "(no such file)";
    struct Case {
        what: &'static str,
        file: &'static str,
        text: &'static str,
        extra: &'static [&'static str],
        want: &'static str,
    }
    let cases = [
        Case {
            what: "malformed number",
            file: "nodes.csv",
            text: "sn,gpu,model\nn1,4,V100M16\nn2,x,T4\n",
            extra: &[],
            want: "nodes.csv:3: column 'gpu': 'x' is not a GPU count",
        },
        Case {
            what: "missing column",
            file: "trace.csv",
            text: "name,num_gpu,gpu_milli,qos\na,1,1000,LS\n",
            extra: &[],
            want: "trace.csv: missing column 'gpu_spec'",
        },
        Case {
            what: "no offline task",
            file: "trace.csv",
            text: "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1000,,LS\n",
            extra: &[],
            want: "no offline (qos BE) task",
        },
        Case {
            what: "no online task",
            file: "trace.csv",
            text: "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1000,,BE\n",
            extra: &[],
            want: "no online (qos LS, Guaranteed or Burstable) task",
        },
        Case {
            what: "ragged row",
            file: "pairs.csv",
            text: "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,A,1,1,0.5\n",
            extra: &[],
            want: "pairs.csv:2: 5 fields where the header has 6",
        },
        Case {
            what: "not UTF-8",
            file: "runtimes.csv",
            text: "runtime\n\u{0}\n",
            extra: &[],
            want: "runtimes.csv:2: column 'runtime'",
        },
        Case {
            what: "online services on models no node has",
            file: "trace.csv",
            text: "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1000,A100,LS\nb,1,100,,BE\n",
            extra: &[],
            want: "no online task fits any node",
        },
        Case {
            what: "bad option value",
            file: "nodes.csv",
            text: NODES,
            extra: &["--online-fill", "1.5"],
            want: "--online-fill must be in [0, 1]",
        },
        Case {
            what: "unknown policy",
            file: "nodes.csv",
            text: NODES,
            extra: &["--policies", "muxflow,fifo"],
            want: "unknown policy 'fifo'",
        },
        Case {
            what: "more offline jobs per GPU than offline_per_gpu allows",
            file: "nodes.csv",
            text: NODES,
            extra: &["--policies", "muxflow-n5"],
            want: "K from 2 to 4",
        },
        Case {
            what: "missing file",
            file: "trace.csv",
            text: ABSENT,
            extra: &[],
            want: "reading trace.csv",
        },
    ];
    for c in cases {
        let dir = tempfile::tempdir().unwrap();
        write_inputs(dir.path());
        if c.text == ABSENT {
            std::fs::remove_file(dir.path().join(c.file)).unwrap();
        } else {
            std::fs::write(dir.path().join(c.file), c.text).unwrap();
        }
        let out = sim(dir.path(), c.extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", c.what);
        assert!(err.contains(c.want), "{}: {err}", c.what);
        assert!(!err.contains("panicked"), "{}: {err}", c.what);
    }
}

/// `muxflow-sim`'s man page (section 1) comes from its `--help`.
#[test]
fn muxflow_sim_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        std::path::Path::new(env!("CARGO_BIN_EXE_muxflow-sim")),
        "muxflow-sim",
        "1",
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
    )
    .unwrap();
    assert!(page.contains("\\-\\-policies"), "{page}");
}
