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
        let (shared, ..) = spread(&runs, "shared_p99_x");
        // The bounded queue's row, where the mode's lines carry it (the
        // others' are of runs kept apart, in `queue_lines`).
        let queue = runs
            .iter()
            .all(|l| l.contains_key("queue_p99_x"))
            .then_some(("bounded_queue", "queue_p99_x", Some("queue_steps_x")));
        for (brake, p99_key, steps_key) in [
            ("none", "shared_p99_x", None),
            ("clock_brake", "clock_p99_x", Some("clock_steps_x")),
            ("online_trigger", "online_p99_x", Some("online_steps_x")),
        ]
        .into_iter()
        .chain(queue)
        {
            let b: Brake = doc[mode][brake]
                .clone()
                .try_into()
                .unwrap_or_else(|e| panic!("[{mode}.{brake}]: {e}"));
            let name = format!("[{mode}.{brake}]");
            assert_eq!(b.runs as usize, runs.len(), "{name}");
            let (med, min, max) = spread(&runs, p99_key);
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
                    let (med, min, max) = spread(&runs, k);
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
