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

/// The replay's `--pair-load now` (`model::at_load`) against the closed
/// loop at a part of the service's rate: the unprotected trainer (at the
/// queue's share) loses the service's part of its speed in proportion to
/// the load, and the bounded queue costs it no more than in proportion.
#[test]
fn the_load_curve_follows_the_models_form() {
    use muxflow_sim::model::at_load;
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/protection.toml"))
            .unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let lines: Vec<String> = doc["load_curve"]["lines"].clone().try_into().unwrap();
    let num = |l: &BTreeMap<&str, &str>, k: &str| -> f64 {
        l[k].parse().unwrap_or_else(|_| panic!("{k}: {l:?}"))
    };
    let runs: Vec<(f64, f64, f64)> = lines
        .iter()
        .map(|l| {
            let l = kv(l);
            (
                num(&l, "online_load"),
                num(&l, "wide_steps_per_s"),
                num(&l, "queue_steps_x"),
            )
        })
        .collect();
    let loads: Vec<f64> = runs.iter().map(|r| r.0).collect();
    assert!(
        loads.contains(&1.0) && loads.iter().any(|&l| l <= 0.25),
        "the peak and a quiet hour: {loads:?}"
    );
    // The trainer beside no service: the least-squares line's value at 0.
    let n = runs.len() as f64;
    let (mx, my) = (
        runs.iter().map(|r| r.0).sum::<f64>() / n,
        runs.iter().map(|r| r.1).sum::<f64>() / n,
    );
    let slope = runs.iter().map(|r| (r.0 - mx) * (r.1 - my)).sum::<f64>()
        / runs.iter().map(|r| (r.0 - mx).powi(2)).sum::<f64>();
    let alone = my - slope * mx;
    let peak = runs.iter().find(|r| r.0 == 1.0).unwrap();
    for &(load, wide, queue) in &runs {
        let model = at_load(peak.1 / alone, load);
        assert!(
            (wide / alone - model).abs() <= 0.01,
            "unprotected at load {load}: {:.3} measured, {model:.3} by the model",
            wide / alone
        );
        let kept = at_load(peak.2, load);
        assert!(
            queue >= kept - 0.01,
            "the queue at load {load}: {queue} measured, the model keeps {kept:.3}"
        );
    }
}
