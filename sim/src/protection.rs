//! xCUDA's protection per GPU, from the closed loop's measurements
//! (`data/protection.toml`, written by `scripts/closed-loop` on the
//! simulated GPU's contention modes): what the replay's muxflow policies
//! apply to each GPU ([`crate::model::Protection`]).
//!
//! Which mode a GPU stands for is a model choice, stated here: T4 and A10
//! (70–150 W inference boards, the kind MuxFlow's clock trigger was made
//! for) are `t4-like`; every other model — P100, V100 and the trace's
//! anonymized G2/G3 — `h200-like`, the big-GPU mode fitted to a real GPU's
//! sharing (an H200: the clock flat, the service slowed ×1.8–2.1 at p50;
//! simgpu/README.md). `h100-like`, the kinder mode it replaced here, stays
//! selectable with `--protection h100-like`; no run on those exact boards
//! says more.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::Protection;

/// The file, carried in the binary so a replay needs nothing beside it.
pub const MEASURED: &str = include_str!("../data/protection.toml");

/// Which brake muxflow runs: xCUDA's bounded offline queue, the shipped
/// default (`[xcuda] queue_inflight = 2`, `queue_inflight_us = 250`; the
/// file's `bounded_queue` rows).
const MUXFLOW_BRAKE: &str = "bounded_queue";

/// What `--protection` chooses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Choice {
    /// Each GPU by its model's mode (module docs).
    #[default]
    Measured,
    /// None: the unprotected pairs.
    None,
    /// Every GPU as this mode (`t4-like`, `h100-like`, `h200-like`).
    Mode(String),
}

impl std::str::FromStr for Choice {
    type Err = String;
    fn from_str(s: &str) -> Result<Choice, String> {
        match s {
            "measured" => Ok(Choice::Measured),
            "none" => Ok(Choice::None),
            m if table().map_err(|e| e.to_string())?.contains_key(m) => Ok(Choice::Mode(m.into())),
            other => Err(format!(
                "'{other}' is not a protection: use measured (each GPU by its model), none, or one of {} (sim/data/protection.toml)",
                modes().join(", ")
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Row {
    latency_excess_left: f64,
    offline_speed: f64,
}

/// mode -> brake -> its row.
type Table = BTreeMap<String, BTreeMap<String, Row>>;

#[derive(Debug, thiserror::Error)]
pub enum ProtectionError {
    #[error("sim/data/protection.toml: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("sim/data/protection.toml: no [\"{mode}\".{brake}] row")]
    Missing { mode: String, brake: String },
}

fn table() -> Result<Table, ProtectionError> {
    let mut value: toml::Table = toml::from_str(MEASURED)?;
    // The other tables (source, raw, superseded, load_curve) are not modes.
    for other in ["source", "raw", "superseded", "load_curve"] {
        value.remove(other);
    }
    Ok(toml::Value::Table(value).try_into()?)
}

/// The modes the file measured.
pub fn modes() -> Vec<String> {
    table().map(|t| t.into_keys().collect()).unwrap_or_default()
}

/// muxflow's protection in `mode`.
pub fn of_mode(mode: &str) -> Result<Protection, ProtectionError> {
    let t = table()?;
    let row = t
        .get(mode)
        .and_then(|m| m.get(MUXFLOW_BRAKE))
        .ok_or_else(|| ProtectionError::Missing {
            mode: mode.into(),
            brake: MUXFLOW_BRAKE.into(),
        })?;
    Ok(Protection {
        latency_excess_left: row.latency_excess_left.clamp(0.0, 1.0),
        offline_speed: row.offline_speed.clamp(0.0, 1.0),
    })
}

/// The mode a GPU model stands for (module docs).
pub fn mode_of_model(model: &str) -> &'static str {
    match model {
        "T4" | "A10" => "t4-like",
        _ => "h200-like",
    }
}

/// A board's power limit, W, as the node would read it from NVML and
/// publish it (it decides the offline share under the bounded queue:
/// `muxflow::policy::share::offline_sm_budget`): NVIDIA's figures for the
/// power-limited inference boards `t4-like` stands for (T4 70 W, A10
/// 150 W); every other model as a data-centre board of 300 W (a V100's; a
/// P100 has 250 W, the trace's anonymized G2/G3 are taken as such boards).
pub fn power_limit_w(model: &str) -> u32 {
    match model {
        "T4" => 70,
        "A10" => 150,
        _ => 300,
    }
}

/// Each of `models` (the scenario's GPU model names) under `choice`.
pub fn per_model(choice: &Choice, models: &[String]) -> Result<Vec<Protection>, ProtectionError> {
    models
        .iter()
        .map(|m| match choice {
            Choice::None => Ok(Protection::NONE),
            Choice::Mode(mode) => of_mode(mode),
            Choice::Measured => of_mode(mode_of_model(m)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_of_the_file_gives_muxflows_protection() {
        let modes = modes();
        for mode in ["t4-like", "h100-like", "h200-like"] {
            assert!(modes.contains(&mode.to_string()), "{mode}: {modes:?}");
        }
        for m in &modes {
            let p = of_mode(m).unwrap();
            assert!((0.0..=1.0).contains(&p.latency_excess_left), "{m}");
            assert!(p.offline_speed > 0.0 && p.offline_speed <= 1.0, "{m}");
        }
    }

    #[test]
    fn the_choice_reads_and_names_the_modes_when_wrong() {
        assert_eq!("none".parse::<Choice>(), Ok(Choice::None));
        assert_eq!(
            "h100-like".parse::<Choice>(),
            Ok(Choice::Mode("h100-like".into()))
        );
        let e = "a100".parse::<Choice>().unwrap_err();
        assert!(e.contains("h100-like") && e.contains("t4-like"), "{e}");
        let models = vec!["T4".to_string(), "V100M16".to_string()];
        let p = per_model(&Choice::Measured, &models).unwrap();
        assert_eq!(p[0], of_mode("t4-like").unwrap());
        assert_eq!(p[1], of_mode("h200-like").unwrap());
        assert_eq!(
            per_model(&Choice::None, &models).unwrap(),
            vec![Protection::NONE; 2]
        );
    }
}
