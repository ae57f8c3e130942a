//! The settings of this process (memory cap, gate thresholds, health and
//! stats files), read once at its first driver call from the one source it
//! may trust.

use muxflow::records::limits::JobLimits;
use muxflow::records::xcuda_env::{self, XcudaEnv};
use std::sync::OnceLock;

#[derive(Debug)]
pub struct Settings {
    pub env: XcudaEnv,
}

/// Where a process's settings come from, decided once at its first driver
/// call. Inside a Slurm job only the job's root-owned limits file counts
/// (the environment is the user's); outside a job, root's environment is
/// trusted (tests, benches, an admin's tools) and anyone else gets the safe
/// settings. A bad value anywhere takes its safe fallback (crate
/// `muxflow::records::xcuda_env`): the gate is never switched off and the cap never
/// lifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A process of job `job`, whose limits file is in `dir` (if named).
    Job { job: u32, dir: Option<String> },
    /// Not in a job, real uid 0.
    RootEnvironment,
    /// Not in a job, another user.
    Nothing,
}

impl Source {
    pub fn of_this_process() -> Source {
        let me = std::process::id();
        match muxflow::node::jobproc::Procfs::default().job_of(me) {
            Some(job) => Source::Job {
                job,
                dir: std::env::var(xcuda_env::LIMITS_DIR).ok(),
            },
            // SAFETY: getuid cannot fail and touches no memory.
            None if unsafe { libc::getuid() } == 0 => Source::RootEnvironment,
            None => Source::Nothing,
        }
    }
}

impl Settings {
    /// The settings from `source`; `get` reads the environment (used only
    /// for [`Source::RootEnvironment`]); `owner` owns trusted files (root).
    /// Every fallback taken is logged, naming the setting.
    pub fn load(source: &Source, get: impl Fn(&str) -> Option<String>, owner: u32) -> Settings {
        let (env, problems) = match source {
            Source::RootEnvironment => {
                let (env, p) = XcudaEnv::from_env_lenient(get);
                (env, p)
            }
            Source::Nothing => {
                crate::log(format_args!(
                    "not in a Slurm job and not root: no settings to trust, so no GPU memory may be allocated"
                ));
                (XcudaEnv::safe(), Vec::new())
            }
            Source::Job { job, dir } => {
                let Some(dir) = dir.as_deref().filter(|d| d.starts_with('/')) else {
                    crate::log(format_args!(
                        "job {job} has no limits directory ({} unset): no GPU memory may be allocated; \
                         was xCUDA preloaded by hand into a job muxflow does not protect?",
                        xcuda_env::LIMITS_DIR
                    ));
                    return Settings {
                        env: XcudaEnv::safe(),
                    };
                };
                match JobLimits::read_trusted(std::path::Path::new(dir), *job, owner) {
                    Ok((limits, p)) => (limits.xcuda, p),
                    Err(e) => {
                        crate::log(format_args!("{e}; no GPU memory may be allocated"));
                        return Settings {
                            env: XcudaEnv::safe(),
                        };
                    }
                }
            }
        };
        for p in problems {
            crate::log(format_args!("{p}; its safe value is used"));
        }
        Settings { env }
    }
}

pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::load(&Source::of_this_process(), |k| std::env::var(k).ok(), 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Settings {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load(&Source::RootEnvironment, |k| m.get(k).cloned(), 0)
    }

    #[test]
    fn a_bad_value_takes_its_safe_fallback_and_the_rest_holds() {
        let s = from(&[
            (xcuda_env::MEM_LIMIT_BYTES, "1048576"),
            (xcuda_env::UTILIZATION_BRAKE, "lots"),
            (xcuda_env::SAMPLE_INTERVAL_MS, "bogus"),
            (xcuda_env::STATS_DIR, "/var/lib/x"),
        ]);
        assert_eq!(s.env.mem_limit_bytes, Some(1 << 20));
        assert_eq!(s.env.stats_dir, Some("/var/lib/x".into()));
        assert_eq!(
            (s.env.utilization_brake, s.env.sample_interval_ms),
            (95, 20)
        );
        let s = from(&[(xcuda_env::MEM_LIMIT_BYTES, "8G")]);
        assert_eq!(
            s.env.mem_limit_bytes,
            Some(0),
            "an unreadable cap allows nothing"
        );
        let s = from(&[(xcuda_env::MEM_LIMIT_BYTES, &u64::MAX.to_string())]);
        assert_eq!(s.env.mem_limit_bytes, Some(0), "a huge cap allows nothing");
    }

    #[test]
    fn in_a_job_only_its_trusted_file_counts_never_the_environment() {
        let env = |k: &str| (k == xcuda_env::MEM_LIMIT_BYTES).then(|| u64::MAX.to_string());
        // SAFETY: geteuid cannot fail and touches no memory.
        let me = unsafe { libc::geteuid() };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_str().unwrap().to_string();
        let job = |dir: Option<String>| Source::Job { job: 7, dir };
        // No file: the safe settings, whatever the environment says.
        let s = Settings::load(&job(Some(dir.clone())), env, me);
        assert_eq!(s.env, XcudaEnv::safe());
        let s = Settings::load(&job(None), env, me);
        assert_eq!(s.env, XcudaEnv::safe());
        // The job's file: its cap.
        let mut x = XcudaEnv::from_config(&muxflow::config::Xcuda::default(), 1);
        x.mem_limit_bytes = Some(64 << 20);
        let limits = JobLimits {
            job_id: 7,
            gpu: 1,
            sm_pct: 30,
            mem_cap_mib: Some(64),
            xcuda: x.clone(),
            enforced_by: Default::default(),
        };
        let path = muxflow::records::limits::path(tmp.path(), 7);
        std::fs::write(&path, limits.encode()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(Settings::load(&job(Some(dir.clone())), env, me).env, x);
        // Another owner's file (as a user's own would be): not trusted.
        assert_eq!(
            Settings::load(&job(Some(dir)), env, me + 1).env,
            XcudaEnv::safe()
        );
        assert_eq!(
            Settings::load(&Source::Nothing, env, me).env,
            XcudaEnv::safe()
        );
    }
}
