//! `data/protection.toml` (xCUDA's measured protection per simulated GPU
//! mode, for the replay) reads as the replay will read it, and its
//! summaries agree with the raw closed-loop lines kept beside them: a
//! hand-edited number that no run produced fails here.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Brake {
    online_p99_x: f64,
    online_p99_x_min: Option<f64>,
    online_p99_x_max: Option<f64>,
    latency_excess_left: f64,
    offline_speed: f64,
    offline_speed_min: Option<f64>,
    offline_speed_max: Option<f64>,
    runs: u32,
}

#[derive(Debug, Deserialize)]
struct Raw {
    lines: Vec<String>,
    /// The bounded queue's runs of the modes whose `lines` do not carry it.
    queue_lines: Vec<String>,
}

fn kv(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

/// (median, min, max) of `key` over `lines`.
fn spread(lines: &[BTreeMap<&str, &str>], key: &str) -> (f64, f64, f64) {
    let mut v: Vec<f64> = lines
        .iter()
        .map(|l| {
            l[key]
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{key}: {l:?}"))
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

#[test]
fn the_protection_file_reads_and_agrees_with_its_runs() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/protection.toml"))
            .unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let raw: Raw = doc["raw"].clone().try_into().unwrap();
    for mode in ["t4-like", "h100-like", "h200-like"] {
        let runs: Vec<BTreeMap<&str, &str>> = raw
            .lines
            .iter()
            .map(|l| kv(l))
            .filter(|l| l.get("gpu") == Some(&mode))
            .collect();
        assert!(!runs.is_empty(), "{mode}: no raw lines");
        if mode == "h200-like" {
            assert!(
                runs.iter().all(|l| l.contains_key("queue_p99_x")),
                "{mode}: the queue's figures"
            );
        }
        // The bounded queue's row: of the mode's lines where they carry it,
        // else of its runs kept apart in `queue_lines` (a line marked "(left
        // out)" is not counted).
        let queue_runs: Vec<BTreeMap<&str, &str>> =
            if runs.iter().all(|l| l.contains_key("queue_p99_x")) {
                runs.clone()
            } else {
                raw.queue_lines
                    .iter()
                    .filter(|l| !l.contains("(left out)"))
                    .map(|l| kv(l))
                    .filter(|l| l.get("gpu") == Some(&mode))
                    .collect()
            };
        assert!(!queue_runs.is_empty(), "{mode}: no run of the queue");
        // Latency against unprotected sharing at the policy's share without
        // the queue (`shared_*`, one reference for every row: the replay's
        // latency has no share term); the trainer against the unprotected
        // one at its own share (the closed loop's `queue_steps_x` is against
        // `wide_*` where the queue ran at the ceiling: the replay applies
        // the share itself).
        for (brake, lines, p99_key, steps_key) in [
            ("none", &runs, "shared_p99_x", None),
            ("clock_brake", &runs, "clock_p99_x", Some("clock_steps_x")),
            (
                "online_trigger",
                &runs,
                "online_p99_x",
                Some("online_steps_x"),
            ),
            (
                "bounded_queue",
                &queue_runs,
                "queue_p99_x",
                Some("queue_steps_x"),
            ),
        ] {
            let (shared, ..) = spread(lines, "shared_p99_x");
            let b: Brake = doc[mode][brake]
                .clone()
                .try_into()
                .unwrap_or_else(|e| panic!("[{mode}.{brake}]: {e}"));
            let name = format!("[{mode}.{brake}]");
            assert_eq!(b.runs as usize, lines.len(), "{name}");
            let (med, min, max) = spread(lines, p99_key);
            assert_eq!(
                (
                    b.online_p99_x,
                    b.online_p99_x_min.unwrap_or(min),
                    b.online_p99_x_max.unwrap_or(max)
                ),
                (med, min, max),
                "{name}: p99"
            );
            let left = ((b.online_p99_x - 1.0) / (shared - 1.0)).clamp(0.0, 1.0);
            assert!(
                (b.latency_excess_left - left).abs() < 0.01,
                "{name}: excess left {left}"
            );
            match steps_key {
                Some(k) => {
                    let (med, min, max) = spread(lines, k);
                    assert_eq!(
                        (b.offline_speed, b.offline_speed_min, b.offline_speed_max),
                        (med, Some(min), Some(max)),
                        "{name}: offline speed"
                    );
                }
                None => assert_eq!(b.offline_speed, 1.0, "{name}"),
            }
        }
    }
}
