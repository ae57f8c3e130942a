//! Slurm I/O of a round: the JSON listings in, `scontrol update` out. Each
//! command runs under coreutils `timeout`, so a hung slurmctld cannot hang
//! the daemon; `SLURM_CONF` from the environment selects the cluster.
//! Nodes are read with `sinfo --json` from Slurm 22.05 and with `scontrol
//! show nodes --json` from 23.02 on (its `sinfo --json` groups nodes; see
//! the reader), chosen by the release `scontrol --version` names.

use std::process::Command;
use std::sync::OnceLock;

use crate::history::HistoryCache;
use crate::predict::{runs_from_sacct, Run};
use crate::reader::{self, ClusterState, Names, ReadError};

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("cannot run {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} timed out after {secs} s")]
    Timeout { cmd: String, secs: u64 },
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Runs Slurm's client commands.
#[derive(Debug, Clone)]
pub struct SlurmCli {
    pub timeout_s: u64,
    /// (major, minor) of the Slurm the commands belong to, asked once.
    release: OnceLock<(u32, u32)>,
}

/// (major, minor) from `scontrol --version`: `slurm 24.11.5`,
/// `slurm-wlm 22.05.8`.
pub fn parse_release(version: &str) -> Option<(u32, u32)> {
    let v = version.split_whitespace().nth(1)?;
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

impl SlurmCli {
    pub fn new(timeout_s: u64) -> SlurmCli {
        SlurmCli {
            timeout_s,
            release: OnceLock::new(),
        }
    }

    /// The Slurm release of the client commands (asked once).
    pub fn release(&self) -> Result<(u32, u32), SlurmError> {
        if let Some(r) = self.release.get() {
            return Ok(*r);
        }
        let out = self.run("scontrol", &["--version".into()])?;
        let r = parse_release(&out).ok_or_else(|| SlurmError::Failed {
            cmd: "scontrol --version".into(),
            status: "unrecognized answer".into(),
            stderr: out.trim().to_string(),
        })?;
        Ok(*self.release.get_or_init(|| r))
    }

    fn run(&self, program: &str, args: &[String]) -> Result<String, SlurmError> {
        let cmd = format!("{program} {}", args.join(" "));
        let out = Command::new("timeout")
            .arg("--kill-after=5")
            .arg(self.timeout_s.to_string())
            .arg(program)
            .args(args)
            .output()
            .map_err(|source| SlurmError::Spawn {
                cmd: cmd.clone(),
                source,
            })?;
        if out.status.code() == Some(124) || out.status.code() == Some(137) {
            return Err(SlurmError::Timeout {
                cmd,
                secs: self.timeout_s,
            });
        }
        if !out.status.success() {
            return Err(SlurmError::Failed {
                cmd,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Jobs and nodes, as one [`ClusterState`].
    pub fn read_state(&self, names: &Names) -> Result<ClusterState, SlurmError> {
        // 22.05's `squeue --json` ignores filters: ask for everything once.
        let jobs = reader::parse_squeue(&self.run("squeue", &["--json".into()])?)?;
        let nodes = if self.release()? >= (23, 2) {
            self.run(
                "scontrol",
                &["show".into(), "nodes".into(), "--json".into()],
            )?
        } else {
            self.run("sinfo", &["--json".into()])?
        };
        let nodes = reader::parse_sinfo(&nodes)?;
        Ok(ClusterState::build(&jobs, &nodes, names))
    }

    /// Offline runs of the last `days` days from sacct.
    pub fn history(&self, days: u32) -> Result<Vec<Run>, SlurmError> {
        self.runs_since(u64::from(days) * 86_400)
    }

    /// Offline runs that ran within the last `secs` seconds.
    pub fn runs_since(&self, secs: u64) -> Result<Vec<Run>, SlurmError> {
        let text = self.run(
            "sacct",
            &[
                "--json".into(),
                "-X".into(),
                "-a".into(),
                "-S".into(),
                format!("now-{secs}seconds"),
            ],
        )?;
        Ok(runs_from_sacct(&reader::parse_sacct(&text)?))
    }

    /// Brings `cache` up to date: the whole window the first time, then
    /// only what changed since its last read.
    pub fn refresh_history(&self, cache: &mut HistoryCache, days: u32) -> Result<(), SlurmError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let runs = self.runs_since(cache.lookback_s(now, days))?;
        cache.merge(runs, now, days);
        Ok(())
    }

    /// One scontrol call (`update …`, `hold N`, `release N`).
    pub fn scontrol(&self, args: &[String]) -> Result<(), SlurmError> {
        self.run("scontrol", args).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_from_scontrol_version() {
        assert_eq!(parse_release("slurm-wlm 22.05.8\n"), Some((22, 5)));
        assert_eq!(parse_release("slurm 24.11.5\n"), Some((24, 11)));
        assert_eq!(parse_release("slurm\n"), None);
        assert_eq!(parse_release("scontrol: error: x"), None);
    }
}
