//! Slurm I/O of a round: the JSON listings in, `scontrol update` out,
//! through muxflow's one Slurm client ([`muxflow::slurm_cli::SlurmClient`]:
//! the commands of `slurm.scontrol`'s directory, `matcher.command_timeout_s`
//! per call, bounded retries when slurmctld cannot be reached, one
//! slurm.conf discovery), so a hung slurmctld cannot hang the daemon.
//! Nodes are read with `sinfo --json` from Slurm 22.05 and with `scontrol
//! show nodes --json` from 23.02 on (its `sinfo --json` groups nodes; see
//! the reader), chosen by the release `scontrol --version` names.

use std::sync::OnceLock;
use std::time::Duration;

use muxflow::slurm_cli::{ScontrolError, SlurmClient};

use crate::history::HistoryCache;
use crate::predict::{runs_from_sacct, Run};
use crate::reader::{self, ClusterState, Names, ReadError};

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    Client(#[from] ScontrolError),
    #[error("scontrol --version: unrecognized answer '{0}'")]
    Version(String),
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Runs Slurm's client commands for the matcher.
pub struct SlurmCli {
    client: SlurmClient,
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
    pub fn new(config: &muxflow::Config) -> SlurmCli {
        SlurmCli {
            client: SlurmClient::with_timeout(
                config,
                Duration::from_secs(config.matcher.command_timeout_s),
            ),
            release: OnceLock::new(),
        }
    }

    /// The Slurm release of the client commands (asked once).
    pub fn release(&self) -> Result<(u32, u32), SlurmError> {
        if let Some(r) = self.release.get() {
            return Ok(*r);
        }
        let out = self.client.scontrol(&["--version"])?;
        let r = parse_release(&out).ok_or_else(|| SlurmError::Version(out.trim().to_string()))?;
        Ok(*self.release.get_or_init(|| r))
    }

    /// Jobs and nodes, as one [`ClusterState`].
    pub fn read_state(&self, names: &Names) -> Result<ClusterState, SlurmError> {
        // 22.05's `squeue --json` ignores filters: ask for everything once.
        let jobs = reader::parse_squeue(&self.client.command("squeue", &["--json"])?)?;
        let nodes = if self.release()? >= (23, 2) {
            self.client.scontrol(&["show", "nodes", "--json"])?
        } else {
            self.client.command("sinfo", &["--json"])?
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
        let since = format!("now-{secs}seconds");
        let text = self
            .client
            .command("sacct", &["--json", "-X", "-a", "-S", &since])?;
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
        let mut all = vec!["--json", "-X"];
        all.extend(args.iter().map(String::as_str));
        Ok(reader::parse_sacct(&self.client.command("sacct", &all)?)?)
    }

    /// The owner of job `id` as sacct's text output names it. Slurm 22.05's
    /// `--json` leaves `user` null for a user with no association in the
    /// accounting database; the text output resolves the uid.
    pub fn job_user(&self, id: u32) -> Result<Option<String>, SlurmError> {
        let id = id.to_string();
        let out = self
            .client
            .command("sacct", &["-X", "-nP", "-j", &id, "-o", "User"])?;
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
        let out = self.client.command(
            "sacctmgr",
            &["-nP", "show", "user", user, "format=adminlevel"],
        )?;
        Ok(out
            .lines()
            .any(|l| matches!(l.trim(), "Administrator" | "Operator")))
    }

    /// One scontrol call (`update …`, `hold N`, `release N`).
    pub fn scontrol(&self, args: &[String]) -> Result<(), SlurmError> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.client.scontrol(&args)?;
        Ok(())
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
