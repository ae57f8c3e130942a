//! Slurm I/O of a round: the JSON listings in, `scontrol update` out,
//! through muxflow's one Slurm client ([`muxflow_slurm::cli::SlurmClient`]:
//! the commands of `slurm.scontrol`'s directory, `matcher.command_timeout_s`
//! per call, bounded retries when slurmctld cannot be reached, one
//! slurm.conf discovery), so a hung slurmctld cannot hang the daemon.
//! Nodes are read with `sinfo --json` from Slurm 22.05 and with `scontrol
//! show nodes --json` from 23.02 on (its `sinfo --json` groups nodes; see
//! the reader), chosen by the release `scontrol --version` names. Whether
//! memory is a consumable resource comes from `scontrol show config`
//! (`SelectTypeParameters`), asked once like the release.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use muxflow_slurm::cli::{ScontrolError, SlurmClient};

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
    /// What the round reads of slurm.conf, asked once.
    config_facts: OnceLock<ConfigFacts>,
}

/// What the round needs of `scontrol show config`, read once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConfigFacts {
    /// `SelectTypeParameters` names `MEMORY` (`CR_CPU_Memory`,
    /// `CR_Memory`…): memory is a consumable resource.
    memory_consumable: bool,
    /// `PriorityType` is priority/multifactor: Slurm computes fair share
    /// (under priority/basic `sshare` prints factors that mean nothing).
    fair_share: bool,
}

impl ConfigFacts {
    fn of(config: &str) -> ConfigFacts {
        let value = |key: &str| {
            config.lines().find_map(|line| {
                let (k, v) = line.split_once('=')?;
                (k.trim() == key).then(|| v.trim().to_ascii_lowercase())
            })
        };
        ConfigFacts {
            memory_consumable: value("SelectTypeParameters").is_some_and(|v| v.contains("memory")),
            fair_share: value("PriorityType").is_some_and(|v| v == "priority/multifactor"),
        }
    }
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
            config_facts: OnceLock::new(),
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
    /// The round's state, and the cluster's shape ([`crate::shape`]) from
    /// the same node listing.
    pub fn read_state(
        &self,
        names: &Names,
    ) -> Result<(ClusterState, Vec<crate::shape::NodeShape>), SlurmError> {
        let jobs = self.squeue()?;
        let nodes = self.nodes()?;
        let mut state = ClusterState::build(&jobs, &nodes, names);
        let facts = self.config_facts()?;
        state.memory_consumable = facts.memory_consumable;
        if facts.fair_share {
            state.fair_share = self.fair_share();
        }
        Ok((state, crate::shape::shapes(&nodes)))
    }

    /// Each user's fair-share factor; empty when `sshare` fails: the round
    /// then orders users by their oldest job.
    fn fair_share(&self) -> BTreeMap<String, f64> {
        match self
            .client
            .command("sshare", &["-a", "-n", "-P", "-o", "User,FairShare"])
        {
            Ok(out) => parse_fair_share(&out),
            Err(e) => {
                tracing::debug!("sshare: {e}; users ordered by their oldest job");
                BTreeMap::new()
            }
        }
    }

    /// What the round reads of slurm.conf (asked once).
    fn config_facts(&self) -> Result<ConfigFacts, SlurmError> {
        if let Some(f) = self.config_facts.get() {
            return Ok(*f);
        }
        let config = self.client.scontrol(&["show", "config"])?;
        Ok(*self.config_facts.get_or_init(|| ConfigFacts::of(&config)))
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
        let mut jobs = reader::parse_sacct(&text)?;
        self.fill_users(&mut jobs)?;
        Ok(runs_from_sacct(&jobs))
    }

    /// Names the owner of muxflow records that `sacct --json` left without
    /// one. Slurm 22.05's JSON leaves `user` null for a user with no
    /// association (and, seen on the dev cluster, for a moment after a job
    /// ends); keyed by an empty user, such runs would be nobody's history.
    /// The text output resolves the uid.
    fn fill_users(&self, jobs: &mut [reader::SacctJob]) -> Result<(), SlurmError> {
        let missing: Vec<String> = jobs
            .iter()
            .filter(|j| j.user.is_empty() && j.comment.administrator.is_some())
            .map(|j| j.job_id.to_string())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut users = std::collections::HashMap::new();
        // Bounded command lines, however many records lack a user.
        for ids in missing.chunks(500) {
            let out = self.client.command(
                "sacct",
                &["-X", "-nP", "-o", "JobID,User", "-j", &ids.join(",")],
            )?;
            users.extend(parse_job_users(&out));
        }
        for j in jobs.iter_mut().filter(|j| j.user.is_empty()) {
            if let Some(u) = users.get(&j.job_id) {
                j.user.clone_from(u);
            }
        }
        Ok(())
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

    /// Every job Slurm holds now (`squeue --json`), parsed.
    pub fn squeue(&self) -> Result<Vec<reader::SqueueJob>, SlurmError> {
        // 22.05's `squeue --json` ignores filters: ask for everything once.
        Ok(reader::parse_squeue(
            &self.client.command("squeue", &["--json"])?,
        )?)
    }

    /// Every node, from the listing this release gives per node
    /// ([`reader::release_json`]), parsed.
    pub fn nodes(&self) -> Result<Vec<reader::SinfoNode>, SlurmError> {
        let nodes = match reader::release_json(self.release()?).nodes {
            ["scontrol", args @ ..] => self.client.scontrol(args)?,
            [program, args @ ..] => self.client.command(program, args)?,
            [] => unreachable!("every row of reader::RELEASES names a command"),
        };
        Ok(reader::parse_sinfo(&nodes)?)
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

/// `sacct -X -nP -o JobID,User` lines as job id → user (a reused id keeps
/// its last line, the newest job; lines without a user are skipped).
fn parse_job_users(out: &str) -> std::collections::HashMap<u32, String> {
    out.lines()
        .filter_map(|l| {
            let (id, user) = l.trim().split_once('|')?;
            let (id, user) = (id.trim().parse().ok()?, user.trim());
            (!user.is_empty()).then(|| (id, user.to_string()))
        })
        .collect()
}

/// `sshare -a -n -P -o User,FairShare` lines as user → factor: account
/// lines (no user) and unparsable factors are skipped; a user under several
/// accounts keeps the highest (what it is owed somewhere).
fn parse_fair_share(out: &str) -> BTreeMap<String, f64> {
    let mut users = BTreeMap::new();
    for (user, factor) in out.lines().filter_map(|l| {
        let (user, factor) = l.trim().split_once('|')?;
        let factor: f64 = factor.trim().parse().ok()?;
        let user = user.trim();
        (!user.is_empty() && factor.is_finite()).then(|| (user.to_string(), factor))
    }) {
        let at = users.entry(user).or_insert(factor);
        *at = f64::max(*at, factor);
    }
    users
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_share_lines() {
        let out = "|1.000000\nalice|0.250000\nbob|0.750000\n|0.5\nalice|0.5\neve|\nmallory|nan\n";
        let got = parse_fair_share(out);
        let want: BTreeMap<String, f64> =
            [("alice".to_string(), 0.5), ("bob".to_string(), 0.75)].into();
        assert_eq!(got, want);
    }

    #[test]
    fn releases_from_scontrol_version() {
        assert_eq!(parse_release("slurm-wlm 22.05.8\n"), Some((22, 5)));
        assert_eq!(parse_release("slurm 24.11.5\n"), Some((24, 11)));
        assert_eq!(parse_release("slurm\n"), None);
        assert_eq!(parse_release("scontrol: error: x"), None);
    }

    /// A history read whose JSON left a record's user null asks the text
    /// output for it, once, for just those records.
    #[test]
    fn history_names_the_owner_sacct_json_left_null() {
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls");
        let sacct = format!(
            r#"#!/bin/sh
echo "$*" >> {calls}
case "$*" in
*--json*) cat <<'J'
{{"errors": [], "jobs": [
 {{"job_id": 7, "name": "train", "user": null, "state": {{"current": "COMPLETED"}},
  "comment": {{"administrator": "muxflow:v1 mode=offline steps_per_s=7"}}, "time": {{"end": 5}}}},
 {{"job_id": 8, "name": "train", "user": "bob", "state": {{"current": "COMPLETED"}},
  "comment": {{"administrator": "muxflow:v1 mode=offline steps_per_s=6"}}, "time": {{"end": 6}}}},
 {{"job_id": 9, "name": "plain", "user": null, "state": {{"current": "COMPLETED"}},
  "comment": {{"administrator": null}}, "time": {{"end": 6}}}}
]}}
J
;;
*) echo "7|alice" ;;
esac
"#,
            calls = calls.display()
        );
        let program = dir.path().join("sacct");
        muxflow::test_support::write_executable(&program, &sacct);
        let mut config = muxflow::Config::default();
        config.slurm.scontrol = muxflow::config::AbsPath::new(dir.path().join("scontrol")).unwrap();
        let runs = SlurmCli::new(&config).history(30).unwrap();
        let keys: Vec<(u32, &str)> = runs.iter().map(|r| (r.job_id, r.key.0.as_str())).collect();
        assert_eq!(keys, [(7, "alice"), (8, "bob")]);
        let calls = std::fs::read_to_string(&calls).unwrap();
        assert_eq!(calls.lines().count(), 2, "{calls}");
        assert!(calls.lines().nth(1).unwrap().ends_with("-j 7"), "{calls}");
    }

    #[test]
    fn memory_is_consumable_where_select_type_parameters_name_it() {
        let config = |v: &str| {
            format!("SLUID = x\nSelectType              = select/cons_tres\nSelectTypeParameters    = {v}\nSlurmUser = slurm(64030)\n")
        };
        let memory_consumable = |c: &str| ConfigFacts::of(c).memory_consumable;
        assert!(!memory_consumable(&config("CR_CORE")));
        assert!(!memory_consumable(&config("CR_CPU,CR_ONE_TASK_PER_CORE")));
        assert!(memory_consumable(&config("CR_CORE_MEMORY")));
        assert!(memory_consumable(&config("CR_Socket_Memory,CR_LLN")));
        assert!(memory_consumable(&config("CR_MEMORY")));
        assert!(
            !memory_consumable("SelectType = select/linear\n"),
            "not named: not counted"
        );
    }

    #[test]
    fn fair_share_is_read_only_where_slurm_computes_it() {
        let fair =
            |v: &str| ConfigFacts::of(&format!("PriorityType            = {v}\n")).fair_share;
        assert!(fair("priority/multifactor"));
        assert!(!fair("priority/basic"));
        assert!(!ConfigFacts::of("SelectType = select/cons_tres\n").fair_share);
    }

    #[test]
    fn job_users_from_sacct_text() {
        let users = parse_job_users("101|alice\n102|\nbad|bob\n101|carol\n103|dave\n\n");
        assert_eq!(users.len(), 2);
        assert_eq!(users[&101], "carol", "a reused id: the newest job's line");
        assert_eq!(users[&103], "dave");
    }
}
