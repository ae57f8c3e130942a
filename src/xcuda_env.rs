//! The settings the plugin hands to xCUDA inside an offline job, as
//! environment variables. The plugin writes them (overwriting whatever the
//! user set); xCUDA reads them once, at its first driver call.

use std::path::PathBuf;

use crate::config::Xcuda;

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

/// Every variable, for clearing user-set values.
pub const ALL: [&str; 11] = [
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
        ];
        if let Some(m) = self.mem_limit_bytes {
            v.push((MEM_LIMIT_BYTES, m.to_string()));
        }
        for (var, path) in [
            (NVML_LIBRARY, &self.nvml_library),
            (HEALTH_FILE, &self.health_file),
            (STATS_DIR, &self.stats_dir),
        ] {
            if let Some(p) = path {
                v.push((var, p.display().to_string()));
            }
        }
        v
    }

    /// Reads the settings with `get` (e.g. `|k| std::env::var(k).ok()`);
    /// missing thresholds take the defaults of `muxflow.toml`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, XcudaEnvError> {
        fn num<T: std::str::FromStr>(var: &'static str, v: String) -> Result<T, XcudaEnvError> {
            v.trim().parse().map_err(|_| XcudaEnvError {
                var,
                value: v,
                why: "not a number",
            })
        }
        let fraction = |var: &'static str, default: f64| -> Result<f64, XcudaEnvError> {
            match get(var) {
                None => Ok(default),
                Some(v) => {
                    let f: f64 = num(var, v.clone())?;
                    if (0.0..=1.0).contains(&f) {
                        Ok(f)
                    } else {
                        Err(XcudaEnvError {
                            var,
                            value: v,
                            why: "must be between 0 and 1",
                        })
                    }
                }
            }
        };
        let path = |var: &'static str| -> Result<Option<PathBuf>, XcudaEnvError> {
            match get(var) {
                None => Ok(None),
                Some(v) if v.starts_with('/') => Ok(Some(PathBuf::from(v))),
                Some(v) => Err(XcudaEnvError {
                    var,
                    value: v,
                    why: "must be an absolute path",
                }),
            }
        };
        let d = Xcuda::default();
        let utilization_brake: u8 = get(UTILIZATION_BRAKE)
            .map(|v| num(UTILIZATION_BRAKE, v))
            .transpose()?
            .unwrap_or(d.utilization_brake.get());
        if utilization_brake > 100 {
            return Err(XcudaEnvError {
                var: UTILIZATION_BRAKE,
                value: utilization_brake.to_string(),
                why: "must be a percentage",
            });
        }
        let sample_interval_ms = get(SAMPLE_INTERVAL_MS)
            .map(|v| num(SAMPLE_INTERVAL_MS, v))
            .transpose()?
            .unwrap_or(d.sample_interval_ms);
        if sample_interval_ms == 0 {
            return Err(XcudaEnvError {
                var: SAMPLE_INTERVAL_MS,
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        Ok(XcudaEnv {
            mem_limit_bytes: get(MEM_LIMIT_BYTES)
                .map(|v| num(MEM_LIMIT_BYTES, v))
                .transpose()?,
            gpu_index: get(GPU_INDEX)
                .map(|v| num(GPU_INDEX, v))
                .transpose()?
                .unwrap_or(0),
            nvml_library: path(NVML_LIBRARY)?,
            health_file: path(HEALTH_FILE)?,
            stats_dir: path(STATS_DIR)?,
            sample_interval_ms,
            clock_brake_fraction: fraction(CLOCK_BRAKE_FRACTION, d.clock_brake_fraction.get())?,
            utilization_brake,
            max_delay_us: get(MAX_DELAY_US)
                .map(|v| num(MAX_DELAY_US, v))
                .transpose()?
                .unwrap_or(d.max_delay_us),
            delay_step_us: get(DELAY_STEP_US)
                .map(|v| num(DELAY_STEP_US, v))
                .transpose()?
                .unwrap_or(d.delay_step_us),
            release_factor: fraction(RELEASE_FACTOR, d.release_factor.get())?,
        })
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
        let vars: HashMap<&str, String> = e.to_env().into_iter().collect();
        assert!(vars.keys().all(|k| ALL.contains(k)));
        let back = XcudaEnv::from_env(|k| vars.get(k).cloned()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn defaults_when_unset_and_errors_name_the_variable() {
        let e = XcudaEnv::from_env(|_| None).unwrap();
        assert_eq!(e, XcudaEnv::from_config(&Xcuda::default(), 0));
        let err =
            XcudaEnv::from_env(|k| (k == MEM_LIMIT_BYTES).then(|| "lots".to_string())).unwrap_err();
        assert_eq!(err.var, MEM_LIMIT_BYTES);
        let err =
            XcudaEnv::from_env(|k| (k == RELEASE_FACTOR).then(|| "2".to_string())).unwrap_err();
        assert!(err.to_string().contains("between 0 and 1"));
        let err = XcudaEnv::from_env(|k| (k == STATS_DIR).then(|| "rel".to_string())).unwrap_err();
        assert_eq!(err.var, STATS_DIR);
    }
}
