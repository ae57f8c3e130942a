//! Slurm I/O of a round: the JSON listings in, `scontrol update` out. Each
//! command runs under coreutils `timeout`, so a hung slurmctld cannot hang
//! the daemon; `SLURM_CONF` from the environment selects the cluster.

use std::process::Command;

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
}

impl SlurmCli {
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
        let nodes = reader::parse_sinfo(&self.run("sinfo", &["--json".into()])?)?;
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

    /// `sacct --json -X` with `args` (filters), parsed.
    pub fn sacct(&self, args: &[String]) -> Result<Vec<reader::SacctJob>, SlurmError> {
        let mut all = vec!["--json".to_string(), "-X".to_string()];
        all.extend_from_slice(args);
        Ok(reader::parse_sacct(&self.run("sacct", &all)?)?)
    }

    /// The owner of job `id` as sacct's text output names it. Slurm 22.05's
    /// `--json` leaves `user` null for a user with no association in the
    /// accounting database; the text output resolves the uid.
    pub fn job_user(&self, id: u32) -> Result<Option<String>, SlurmError> {
        let out = self.run(
            "sacct",
            &[
                "-X".into(),
                "-nP".into(),
                "-j".into(),
                id.to_string(),
                "-o".into(),
                "User".into(),
            ],
        )?;
        // A reused ID (a cluster whose state was reset) lists older jobs
        // first: the last line is the newest.
        Ok(out
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map(str::to_string))
    }

    /// `sacctmgr show user NAME`'s AdminLevel says the user administers
    /// Slurm (Operator or Administrator).
    pub fn is_slurm_admin(&self, user: &str) -> Result<bool, SlurmError> {
        let out = self.run(
            "sacctmgr",
            &[
                "-nP".into(),
                "show".into(),
                "user".into(),
                user.into(),
                "format=adminlevel".into(),
            ],
        )?;
        Ok(out
            .lines()
            .any(|l| matches!(l.trim(), "Administrator" | "Operator")))
    }

    /// One scontrol call (`update …`, `hold N`, `release N`).
    pub fn scontrol(&self, args: &[String]) -> Result<(), SlurmError> {
        self.run("scontrol", args).map(|_| ())
    }
}
