//! The settings the plugin hands to xCUDA inside an offline job, as
//! environment variables. The plugin writes them (overwriting whatever the
//! user set); xCUDA reads them once, at its first driver call.

use std::ops::RangeInclusive;
use std::path::PathBuf;

use crate::config::{self, Xcuda};

pub const MEM_LIMIT_BYTES: &str = "MUXFLOW_XCUDA_MEM_LIMIT_BYTES";
pub const GPU_INDEX: &str = "MUXFLOW_XCUDA_GPU_INDEX";
pub const NVML_LIBRARY: &str = "MUXFLOW_XCUDA_NVML_LIBRARY";
pub const HEALTH_FILE: &str = "MUXFLOW_XCUDA_HEALTH_FILE";
pub const STATS_DIR: &str = "MUXFLOW_XCUDA_STATS_DIR";
pub const SAMPLE_INTERVAL_MS: &str = "MUXFLOW_XCUDA_SAMPLE_INTERVAL_MS";
pub const CLOCK_BRAKE_FRACTION: &str = "MUXFLOW_XCUDA_CLOCK_BRAKE_FRACTION";
pub const UTILIZATION_BRAKE: &str = "MUXFLOW_XCUDA_UTILIZATION_BRAKE";
pub const MAX_DELAY_US: &str = "MUXFLOW_XCUDA_MAX_DELAY_US";
pub const DELAY_STEP_US: &str = "MUXFLOW_XCUDA_DELAY_STEP_US";
pub const RELEASE_FACTOR: &str = "MUXFLOW_XCUDA_RELEASE_FACTOR";
/// `offline` (the gate and the cap) or `online` (counting only: the online
/// page is written, nothing is delayed, capped or refused).
pub const ROLE: &str = "MUXFLOW_XCUDA_ROLE";
/// The online page of the GPU ([`crate::records::online_page`]): written in the
/// online role, read by the gate in the offline role.
pub const ONLINE_PAGE: &str = "MUXFLOW_XCUDA_ONLINE_PAGE";
pub const ONLINE_BRAKE_DEVIATION: &str = "MUXFLOW_XCUDA_ONLINE_BRAKE_DEVIATION";
/// The bounded offline queue's launches in flight (0: off).
pub const QUEUE_INFLIGHT: &str = "MUXFLOW_XCUDA_QUEUE_INFLIGHT";
/// The bounded offline queue's work in flight, in microseconds of GPU time
/// (0: the bound stays at its launches).
pub const QUEUE_INFLIGHT_US: &str = "MUXFLOW_XCUDA_QUEUE_INFLIGHT_US";
/// The root-owned directory of the per-job limits files (see
/// [`crate::records::limits`]); the only variable xCUDA reads inside a job, and only
/// to find a file it then checks.
pub const LIMITS_DIR: &str = "MUXFLOW_XCUDA_LIMITS_DIR";

/// Every variable, for clearing user-set values.
pub const ALL: [&str; 16] = [
    ROLE,
    QUEUE_INFLIGHT,
    QUEUE_INFLIGHT_US,
    ONLINE_PAGE,
    ONLINE_BRAKE_DEVIATION,
    MEM_LIMIT_BYTES,
    GPU_INDEX,
    NVML_LIBRARY,
    HEALTH_FILE,
    STATS_DIR,
    SAMPLE_INTERVAL_MS,
    CLOCK_BRAKE_FRACTION,
    UTILIZATION_BRAKE,
    MAX_DELAY_US,
    DELAY_STEP_US,
    RELEASE_FACTOR,
];

/// Largest memory cap a setting may give: 1 TiB (no GPU has more).
pub const MAX_MEM_LIMIT_BYTES: u64 = 1 << 40;

#[derive(Debug, Clone, PartialEq)]
pub struct XcudaEnv {
    /// Allocation quota; None = no cap.
    pub mem_limit_bytes: Option<u64>,
    /// NVML index of the (physical) GPU the job runs on, for the watcher.
    pub gpu_index: u32,
    /// libnvidia-ml to load; None = the system's.
    pub nvml_library: Option<PathBuf>,
    /// The GPU's health state word (`node_state` layout); Overloaded/Faulty pause the gate.
    pub health_file: Option<PathBuf>,
    /// Where xCUDA writes `xcuda.<pid>` counter files.
    pub stats_dir: Option<PathBuf>,
    pub sample_interval_ms: u64,
    pub clock_brake_fraction: f64,
    pub utilization_brake: u8,
    pub max_delay_us: u64,
    pub delay_step_us: u64,
    pub release_factor: f64,
    pub role: Role,
    pub online_page: Option<PathBuf>,
    /// Brake when the online job's GPU time per launch is this much above
    /// its baseline (0.03: 3 %).
    pub online_brake_deviation: f64,
    /// The bounded offline queue: launches in flight per stream while the
    /// online job is idle, at least; 0 = off.
    pub queue_inflight: u32,
    /// The queue's work in flight while the online job is idle, in us of
    /// GPU time (the bound in launches follows it); 0 = launches only.
    pub queue_inflight_us: u32,
}

/// Which side of the GPU the process is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Gated and capped (the safe default: anything unreadable is offline).
    #[default]
    Offline,
    /// Counted only.
    Online,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Offline => "offline",
            Role::Online => "online",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("xCUDA setting {var}='{value}' is invalid: {why}")]
pub struct XcudaEnvError {
    pub var: &'static str,
    pub value: String,
    pub why: &'static str,
}

impl XcudaEnv {
    /// Settings with the gate thresholds of `cfg` and nothing job-specific.
    pub fn from_config(cfg: &Xcuda, gpu_index: u32) -> Self {
        XcudaEnv {
            mem_limit_bytes: None,
            gpu_index,
            nvml_library: None,
            health_file: None,
            stats_dir: None,
            sample_interval_ms: cfg.sample_interval_ms,
            clock_brake_fraction: cfg.clock_brake_fraction.get(),
            utilization_brake: cfg.utilization_brake.get(),
            max_delay_us: cfg.max_delay_us,
            delay_step_us: cfg.delay_step_us,
            release_factor: cfg.release_factor.get(),
            role: Role::Offline,
            online_page: None,
            online_brake_deviation: cfg.online_brake_deviation.get(),
            queue_inflight: cfg.queue_inflight as u32,
            queue_inflight_us: cfg.queue_inflight_us as u32,
        }
    }

    /// (variable, value) pairs; unset options are left out.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            (GPU_INDEX, self.gpu_index.to_string()),
            (SAMPLE_INTERVAL_MS, self.sample_interval_ms.to_string()),
            (CLOCK_BRAKE_FRACTION, self.clock_brake_fraction.to_string()),
            (UTILIZATION_BRAKE, self.utilization_brake.to_string()),
            (MAX_DELAY_US, self.max_delay_us.to_string()),
            (DELAY_STEP_US, self.delay_step_us.to_string()),
            (RELEASE_FACTOR, self.release_factor.to_string()),
            (ROLE, self.role.as_str().to_string()),
            (
                ONLINE_BRAKE_DEVIATION,
                self.online_brake_deviation.to_string(),
            ),
            (QUEUE_INFLIGHT, self.queue_inflight.to_string()),
            (QUEUE_INFLIGHT_US, self.queue_inflight_us.to_string()),
        ];
        if let Some(m) = self.mem_limit_bytes {
            v.push((MEM_LIMIT_BYTES, m.to_string()));
        }
        for (var, path) in [
            (NVML_LIBRARY, &self.nvml_library),
            (HEALTH_FILE, &self.health_file),
            (STATS_DIR, &self.stats_dir),
            (ONLINE_PAGE, &self.online_page),
        ] {
            if let Some(p) = path {
                v.push((var, p.display().to_string()));
            }
        }
        v
    }

    /// Reads the settings with `get`, strictly: the first bad value is an
    /// error naming it. See [`from_env_lenient`](Self::from_env_lenient).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, XcudaEnvError> {
        let (env, mut problems) = Self::from_env_lenient(get);
        match problems.is_empty() {
            true => Ok(env),
            false => Err(problems.remove(0)),
        }
    }

    /// Reads the settings with `get` (e.g. a root-written limits file);
    /// missing thresholds take the defaults of `muxflow.toml`. Every value
    /// that is malformed or outside the range `muxflow.toml` allows is
    /// replaced by a safe one and reported: a threshold by its default (the
    /// gate stays on), the memory cap by 0 (nothing may be allocated), a
    /// path by none. Never "protection off".
    pub fn from_env_lenient(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<XcudaEnvError>) {
        let d = Xcuda::default();
        let mut problems = Vec::new();
        let mut num = |var: &'static str, range: RangeInclusive<u64>, fallback: u64| -> u64 {
            let Some(v) = get(var) else {
                return fallback;
            };
            match v.trim().parse::<u64>() {
                Ok(n) if range.contains(&n) => n,
                Ok(_) => {
                    problems.push(XcudaEnvError {
                        var,
                        value: crate::text::shorten(&v),
                        why: "out of range",
                    });
                    fallback
                }
                Err(_) => {
                    problems.push(XcudaEnvError {
                        var,
                        value: crate::text::shorten(&v),
                        why: "not a number",
                    });
                    fallback
                }
            }
        };
        let mem_limit_bytes = get(MEM_LIMIT_BYTES)
            .is_some()
            .then(|| num(MEM_LIMIT_BYTES, 0..=MAX_MEM_LIMIT_BYTES, 0));
        let gpu_index = num(GPU_INDEX, 0..=1023, 0) as u32;
        let sample_interval_ms = num(
            SAMPLE_INTERVAL_MS,
            config::SAMPLE_INTERVAL_MS,
            d.sample_interval_ms,
        );
        let utilization_brake = num(
            UTILIZATION_BRAKE,
            1..=100,
            u64::from(d.utilization_brake.get()),
        ) as u8;
        let max_delay_us = num(MAX_DELAY_US, config::MAX_DELAY_US, d.max_delay_us);
        let delay_step_us = num(DELAY_STEP_US, config::DELAY_STEP_US, d.delay_step_us);
        // A bad bound keeps the default (off: the per-launch brakes still work).
        let queue_inflight = num(QUEUE_INFLIGHT, config::QUEUE_INFLIGHT, d.queue_inflight) as u32;
        let queue_inflight_us = num(
            QUEUE_INFLIGHT_US,
            config::QUEUE_INFLIGHT_US,
            d.queue_inflight_us,
        ) as u32;
        let mut fraction = |var: &'static str, fallback: f64| -> f64 {
            let Some(v) = get(var) else {
                return fallback;
            };
            match v.trim().parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => f,
                _ => {
                    problems.push(XcudaEnvError {
                        var,
                        value: crate::text::shorten(&v),
                        why: "must be a number between 0 and 1",
                    });
                    fallback
                }
            }
        };
        let clock_brake_fraction = fraction(CLOCK_BRAKE_FRACTION, d.clock_brake_fraction.get());
        let release_factor = fraction(RELEASE_FACTOR, d.release_factor.get());
        let online_brake_deviation =
            fraction(ONLINE_BRAKE_DEVIATION, d.online_brake_deviation.get());
        let role = match get(ROLE).as_deref().map(str::trim) {
            None | Some("offline") => Role::Offline,
            Some("online") => Role::Online,
            Some(v) => {
                problems.push(XcudaEnvError {
                    var: ROLE,
                    value: crate::text::shorten(v),
                    why: "must be offline or online",
                });
                Role::Offline
            }
        };
        let mut path = |var: &'static str| -> Option<PathBuf> {
            match get(var) {
                None => None,
                Some(v) if v.starts_with('/') => Some(PathBuf::from(v)),
                Some(v) => {
                    problems.push(XcudaEnvError {
                        var,
                        value: crate::text::shorten(&v),
                        why: "must be an absolute path",
                    });
                    None
                }
            }
        };
        let env = XcudaEnv {
            mem_limit_bytes,
            gpu_index,
            nvml_library: path(NVML_LIBRARY),
            health_file: path(HEALTH_FILE),
            stats_dir: path(STATS_DIR),
            sample_interval_ms,
            clock_brake_fraction,
            utilization_brake,
            max_delay_us,
            delay_step_us,
            release_factor,
            role,
            online_page: path(ONLINE_PAGE),
            online_brake_deviation,
            queue_inflight,
            queue_inflight_us,
        };
        (env, problems)
    }

    /// What xCUDA runs with when it has no trustworthy settings: the gate
    /// with its default thresholds, and no GPU memory at all.
    pub fn safe() -> Self {
        XcudaEnv {
            mem_limit_bytes: Some(0),
            ..XcudaEnv::from_config(&Xcuda::default(), 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn round_trip_through_the_environment() {
        let mut e = XcudaEnv::from_config(&Xcuda::default(), 1);
        e.mem_limit_bytes = Some(8 << 30);
        e.stats_dir = Some("/var/lib/muxflow/xcuda/12".into());
        e.role = Role::Online;
        e.online_page = Some("/var/lib/muxflow/online/1".into());
        let vars: HashMap<&str, String> = e.to_env().into_iter().collect();
        assert!(vars.keys().all(|k| ALL.contains(k)));
        let back = XcudaEnv::from_env(|k| vars.get(k).cloned()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn defaults_when_unset_and_errors_name_the_variable() {
        let e = XcudaEnv::from_env(|_| None).unwrap();
        assert_eq!(e, XcudaEnv::from_config(&Xcuda::default(), 0));
        // An unreadable role is the gated one, never "online".
        let (e, p) =
            XcudaEnv::from_env_lenient(|k| (k == ROLE).then(|| "Online ".to_string() + "x"));
        assert_eq!((e.role, p[0].var), (Role::Offline, ROLE));
        let err =
            XcudaEnv::from_env(|k| (k == MEM_LIMIT_BYTES).then(|| "lots".to_string())).unwrap_err();
        assert_eq!(err.var, MEM_LIMIT_BYTES);
        let err =
            XcudaEnv::from_env(|k| (k == RELEASE_FACTOR).then(|| "2".to_string())).unwrap_err();
        assert!(err.to_string().contains("between 0 and 1"));
        let err = XcudaEnv::from_env(|k| (k == STATS_DIR).then(|| "rel".to_string())).unwrap_err();
        assert_eq!(err.var, STATS_DIR);
    }

    #[test]
    fn bad_values_fall_back_to_protection_never_to_none() {
        struct Case {
            name: &'static str,
            var: &'static str,
            value: String,
            check: fn(&XcudaEnv) -> bool,
        }
        let d = XcudaEnv::from_config(&Xcuda::default(), 0);
        let cases = [
            Case {
                name: "a bogus sample interval keeps the default (the gate stays on)",
                var: SAMPLE_INTERVAL_MS,
                value: "bogus".into(),
                check: |e| e.sample_interval_ms == 20,
            },
            Case {
                name: "a zero interval too",
                var: SAMPLE_INTERVAL_MS,
                value: "0".into(),
                check: |e| e.sample_interval_ms == 20,
            },
            Case {
                name: "a huge memory cap is no cap: nothing may be allocated",
                var: MEM_LIMIT_BYTES,
                value: u64::MAX.to_string(),
                check: |e| e.mem_limit_bytes == Some(0),
            },
            Case {
                name: "a 300-digit cap likewise",
                var: MEM_LIMIT_BYTES,
                value: "9".repeat(300),
                check: |e| e.mem_limit_bytes == Some(0),
            },
            Case {
                name: "a delay of hours keeps the default",
                var: MAX_DELAY_US,
                value: "99999999999".into(),
                check: |e| e.max_delay_us == 20_000,
            },
            Case {
                name: "a brake at 0% utilization keeps the default",
                var: UTILIZATION_BRAKE,
                value: "0".into(),
                check: |e| e.utilization_brake == 95,
            },
            Case {
                name: "a fraction above 1 keeps the default",
                var: RELEASE_FACTOR,
                value: "7".into(),
                check: |e| e.release_factor == 0.9,
            },
        ];
        for c in cases {
            let (e, problems) =
                XcudaEnv::from_env_lenient(|k| (k == c.var).then(|| c.value.clone()));
            assert!((c.check)(&e), "{}: {e:?}", c.name);
            assert_eq!(problems.len(), 1, "{}", c.name);
            assert_eq!(problems[0].var, c.var, "{}", c.name);
            assert!(problems[0].value.len() < 100, "{}", c.name);
        }
        let (e, problems) = XcudaEnv::from_env_lenient(|_| None);
        assert_eq!((e, problems.len()), (d, 0));
        assert_eq!(XcudaEnv::safe().mem_limit_bytes, Some(0));
    }
}
