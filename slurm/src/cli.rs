//! muxflow's one Slurm client: every Slurm command the plugin, the node
//! programs and the matcher run goes through [`SlurmClient`].
//!
//! * Programs come from the directory of `slurm.scontrol` (root-owned
//!   config; never the caller's PATH), with a scrubbed environment and the
//!   slurm.conf of [`muxflow::config::slurm_conf::discover`].
//! * Each call has a timeout: a slurmctld that stops answering costs one
//!   timeout, not a hung Prolog. A call that fails fast because slurmctld
//!   cannot be reached is tried again, a bounded number of times
//!   ([`SlurmClient::attempts`]); a timed-out call is not (it would multiply
//!   the wait).
//! * The calls are typed: an offline job's slot, AdminComment (with
//!   `scontrol` while the job runs, else — a cancelled job is "already
//!   finished" for slurmctld before its batch step ends — with `sacctmgr`
//!   into the accounting record), node fields and updates, JSON listings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use muxflow::node::process::{self, RunError};
use muxflow::Config;

#[derive(Debug, thiserror::Error)]
pub enum ScontrolError {
    #[error("{0}{hint}", hint = run_hint(.0))]
    Run(#[from] RunError),
    #[error("{args}: {output}")]
    Failed { args: String, output: String },
}

/// The setting behind a command that could not run or did not finish.
fn run_hint(e: &RunError) -> &'static str {
    match e {
        RunError::Spawn { .. } => " (check slurm.scontrol in muxflow.toml)",
        RunError::Timeout { .. } => {
            " (slurmctld did not answer; the limit is slurm.command_timeout_ms in muxflow.toml)"
        }
    }
}

impl ScontrolError {
    /// slurmctld did not answer in time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ScontrolError::Run(RunError::Timeout { .. }))
    }
}

/// Slurm's words for a controller it cannot reach right now: worth another
/// try after a pause.
const UNREACHABLE: &[&str] = &[
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted or received",
];

/// Whether a failed call's output says slurmctld could not be reached.
pub fn unreachable(output: &str) -> bool {
    UNREACHABLE.iter().any(|w| output.contains(w))
}

/// Where an AdminComment was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Through slurmctld, the job still running.
    Slurmctld,
    /// Into the accounting record, the job already ended.
    Accounting,
}

/// The name the plugin knows the client by.
pub type Scontrol = SlurmClient;

pub struct SlurmClient {
    program: PathBuf,
    slurm_conf: Option<PathBuf>,
    timeout: Duration,
    /// Tries per call when slurmctld cannot be reached (at least 1).
    pub attempts: u32,
    /// Pause between tries.
    pub retry_pause: Duration,
}

impl SlurmClient {
    /// The node side's client: `slurm.scontrol`'s directory,
    /// `slurm.command_timeout_ms` per call.
    pub fn new(config: &Config) -> Self {
        SlurmClient::with_timeout(
            config,
            Duration::from_millis(config.slurm.command_timeout_ms),
        )
    }

    /// The same client with another timeout per call (the matcher's).
    pub fn with_timeout(config: &Config, timeout: Duration) -> Self {
        SlurmClient {
            program: config.slurm.scontrol.as_path().to_path_buf(),
            slurm_conf: muxflow::config::slurm_conf::discover(),
            timeout,
            attempts: 3,
            retry_pause: Duration::from_millis(500),
        }
    }

    /// The timeout of one call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, args: &[&str]) -> Result<String, ScontrolError> {
        self.run_program(&self.program, args)
    }

    /// Runs Slurm command `name` (`squeue`, `sinfo`, …) from the directory of
    /// `slurm.scontrol`; its stdout.
    pub fn command(&self, name: &str, args: &[&str]) -> Result<String, ScontrolError> {
        self.run_program(&self.program.with_file_name(name), args)
    }

    fn run_program(&self, program: &Path, args: &[&str]) -> Result<String, ScontrolError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.run_once(program, args) {
                Err(ScontrolError::Failed { output, .. })
                    if unreachable(&output) && tries < self.attempts.max(1) =>
                {
                    tracing::debug!(
                        program = %program.display(),
                        "{output}; trying again ({tries} of {})",
                        self.attempts
                    );
                    std::thread::sleep(self.retry_pause);
                }
                other => return other,
            }
        }
    }

    fn run_once(&self, program: &Path, args: &[&str]) -> Result<String, ScontrolError> {
        let mut c = process::command(program);
        if let Some(conf) = &self.slurm_conf {
            c.env("SLURM_CONF", conf);
        }
        c.args(args);
        let out = process::run(c, None, self.timeout, process::Output::Collect)?;
        if out.success {
            Ok(out.stdout)
        } else {
            Err(ScontrolError::Failed {
                args: format!(
                    "{} {}",
                    program.file_name().unwrap_or_default().to_string_lossy(),
                    args.join(" ")
                ),
                output: format!("{}{}", out.stdout, out.stderr).trim().to_string(),
            })
        }
    }

    /// `scontrol update NodeName=node <fields>` (root/SlurmUser).
    pub fn update_node(&self, node: &str, fields: &[&str]) -> Result<(), ScontrolError> {
        let name = format!("NodeName={node}");
        let mut args = vec!["update", name.as_str()];
        args.extend_from_slice(fields);
        self.run(&args).map(drop)
    }

    /// A node field through sinfo's `-O` (values with spaces intact); ""
    /// for none.
    pub fn node_field(&self, node: &str, field: &str) -> Result<String, ScontrolError> {
        let out = self.command(
            "sinfo",
            &["-h", "-N", "-n", node, "-O", &format!("{field}:4096")],
        )?;
        let v = out.lines().next().unwrap_or("").trim();
        Ok(if v == "none" || v == "(null)" {
            String::new()
        } else {
            v.to_string()
        })
    }

    /// One `scontrol` call with the caller's arguments (`update …`, `hold N`,
    /// `release N`: the matcher's planned updates).
    pub fn scontrol(&self, args: &[&str]) -> Result<String, ScontrolError> {
        self.run(args)
    }

    /// The offline slots job `job_id` holds on `node` and its AdminComment,
    /// from one `scontrol show job -d`.
    pub fn offline_job(
        &self,
        job_id: u32,
        node: &str,
        gres: &str,
    ) -> Result<OfflineJob, ScontrolError> {
        let all = self.run(&["show", "job", "-d", &job_id.to_string()])?;
        let out = job_record(&all, job_id);
        let slots = parse_offline_slots(out, node, gres);
        Ok(OfflineJob {
            // Forged slot lines make the whole record unreadable.
            admin_comment: slots.as_ref().and_then(|_| parse_admin_comment(out)),
            slots: slots.unwrap_or_default(),
        })
    }

    /// Puts job `job_id` back in the queue, held (root/SlurmUser): it
    /// waits there until released (the matcher does, when it places it).
    pub fn requeue_hold(&self, job_id: u32) -> Result<(), ScontrolError> {
        self.run(&["requeuehold", &job_id.to_string()]).map(drop)
    }

    /// Holds pending job `job_id` (root/SlurmUser).
    pub fn hold(&self, job_id: u32) -> Result<(), ScontrolError> {
        self.run(&["hold", &job_id.to_string()]).map(drop)
    }

    /// Slurm's `KillWait`: how long slurmd waits between a job's SIGTERM
    /// and its SIGKILL (`scontrol show config`).
    pub fn kill_wait(&self) -> Result<Duration, ScontrolError> {
        let out = self.run(&["show", "config"])?;
        parse_kill_wait(&out).ok_or_else(|| ScontrolError::Failed {
            args: "scontrol show config".into(),
            output: "no 'KillWait = <n> sec' line".into(),
        })
    }

    /// Job `job_id`'s batch script (root/SlurmUser, or its owner).
    pub fn batch_script(&self, job_id: u32) -> Result<String, ScontrolError> {
        self.run(&["write", "batch_script", &job_id.to_string(), "-"])
    }

    /// Sends `signal` (its name without `SIG`) to job `job_id`: its batch
    /// shell only when `batch_only` (Slurm's `--signal=B:`), else every
    /// step but the batch shell (as Slurm sends a `--signal` warning).
    pub fn signal_job(
        &self,
        job_id: u32,
        signal: &str,
        batch_only: bool,
    ) -> Result<(), ScontrolError> {
        let sig = format!("--signal={signal}");
        let job = job_id.to_string();
        let mut args = vec![sig.as_str()];
        if batch_only {
            args.push("--batch");
        }
        args.push(&job);
        self.command("scancel", &args).map(drop)
    }

    /// Writes job `job_id`'s AdminComment: through slurmctld while the job
    /// runs; once slurmctld has ended it (cancelled, preempted, timed out),
    /// into its accounting record with `sacctmgr`, read back with `sacct`
    /// until it holds (slurmctld's own end-of-job record may land after a
    /// first write). Slurm 22.05's sacctmgr lower-cases the value.
    pub fn record_admin_comment(&self, job_id: u32, text: &str) -> Result<Written, ScontrolError> {
        let err = match self.set_admin_comment(job_id, text) {
            Ok(()) => return Ok(Written::Slurmctld),
            Err(e) => e,
        };
        if !err.to_string().contains("already finished") {
            return Err(err);
        }
        let sibling = |name: &str| self.program.with_file_name(name);
        // The accounting record may trail the job's end: a few tries.
        let job = job_id.to_string();
        let mut last = String::new();
        for attempt in 0..5 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(400));
            }
            self.run_program(
                &sibling("sacctmgr"),
                &[
                    "-i",
                    "modify",
                    "job",
                    "where",
                    &format!("jobid={job}"),
                    "set",
                    &format!("AdminComment={text}"),
                ],
            )?;
            std::thread::sleep(Duration::from_millis(200));
            last = self.run_program(
                &sibling("sacct"),
                &["-n", "-X", "-P", "-j", &job, "-o", "AdminComment"],
            )?;
            if last.trim().eq_ignore_ascii_case(text.trim()) {
                return Ok(Written::Accounting);
            }
        }
        Err(ScontrolError::Failed {
            args: format!("sacctmgr modify job where jobid={job} set AdminComment=…"),
            output: format!("sacct still shows '{}'", last.trim()),
        })
    }

    /// Sets job `job_id`'s AdminComment (root/SlurmUser, while it runs).
    pub fn set_admin_comment(&self, job_id: u32, text: &str) -> Result<(), ScontrolError> {
        self.run(&[
            "update",
            &format!("JobId={job_id}"),
            &format!("AdminComment={text}"),
        ])
        .map(drop)
    }
}

/// `t` as Slurm prints times (`SubmitTime=2026-11-23T12:14:05`): local
/// time, no zone.
pub fn slurm_time(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: localtime_r fills the zeroed tm we own from a valid time_t;
    // it returns null only for times out of range, checked.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return "unknown".to_string();
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// How many of one GPU's offline slots (its typed `mfslot` records, `g<i>`)
/// a job holds on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldSlots {
    pub gpu: u32,
    /// The number of `g<gpu>` records slurmctld allocated the job (the
    /// matcher's `mfslot:g<i>:<count>`), at least 1.
    pub count: u32,
}

/// What the node side reads of an offline job from slurmctld.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflineJob {
    /// The offline slots it holds on this node, by GPU (ascending).
    pub slots: Vec<HeldSlots>,
    /// Its AdminComment ("" when none); None when it, or the job's slot
    /// line, cannot be told apart from text the user put in another field
    /// (see [`parse_admin_comment`], [`parse_offline_slots`]).
    pub admin_comment: Option<String>,
}

/// `KillWait` from `scontrol show config` (`KillWait                = 30 sec`).
pub fn parse_kill_wait(show_config: &str) -> Option<Duration> {
    show_config.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        if k.trim() != "KillWait" {
            return None;
        }
        let n = v.trim().strip_suffix("sec")?.trim().parse::<u64>().ok()?;
        Some(Duration::from_secs(n))
    })
}

/// The `AdminComment=` line of `scontrol show job` (the value runs to the
/// end of the line and may hold spaces); "" when absent or `(null)`.
/// Fields the user sets (job name, comment, output paths) may hold line
/// breaks and so forge a line of their own: when more than one line reads
/// `AdminComment=`, which is Slurm's cannot be told, and the answer is None.
/// Job `job_id`'s own record in `scontrol show job` output. Asked for an
/// array's id, scontrol lists every task of the array, one record each
/// (`JobId=<task's id> ArrayJobId=<id> …`), the task whose id is the
/// array's among them (its last task not split out): that record alone.
/// Anything else — one record, or none or several starting `JobId=<id> ` —
/// is returned whole, for the parsers to judge as before.
pub fn job_record(show_job: &str, job_id: u32) -> &str {
    let head = format!("JobId={job_id} ");
    // Byte offsets of the lines that start a record.
    let mut starts: Vec<usize> = Vec::new();
    let mut at = 0;
    for line in show_job.split_inclusive('\n') {
        if line.starts_with("JobId=") {
            starts.push(at);
        }
        at += line.len();
    }
    if starts.len() < 2 {
        return show_job;
    }
    let ends = starts.iter().skip(1).copied().chain([show_job.len()]);
    let mut own = starts
        .iter()
        .zip(ends)
        .map(|(&a, b)| &show_job[a..b])
        .filter(|r| r.starts_with(&head));
    match (own.next(), own.next()) {
        (Some(r), None) => r,
        _ => show_job,
    }
}

pub fn parse_admin_comment(show_job: &str) -> Option<String> {
    let mut lines = show_job
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("AdminComment="));
    let value = lines.next().map(str::trim);
    if lines.next().is_some() {
        return None;
    }
    Some(value.filter(|v| *v != "(null)").unwrap_or("").to_string())
}

impl OfflineJob {
    /// The GPUs it holds offline slots of on this node, ascending.
    pub fn gpus(&self) -> Vec<u32> {
        self.slots.iter().map(|h| h.gpu).collect()
    }
}

/// Parses the per-node detail lines of `scontrol show job -d`, e.g.
/// `     Nodes=node3 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0),mfslot:g1:2(IDX:2-3)`:
/// for each GPU `i` whose type `g<i>` of `gres` has a non-zero count, how
/// many of its records the job holds (the count; `IDX` numbers records, not
/// GPUs, and is not read). Slurm prints one such line per node; None when
/// more than one names `node` with a `GRES=`: a line break in a field the
/// user chose (its name, comment, a path) forged one, and which is Slurm's
/// cannot be told (the job is then refused as unreadable, like a forged
/// AdminComment).
pub fn parse_offline_slots(show_job: &str, node: &str, gres: &str) -> Option<Vec<HeldSlots>> {
    let mut held: Vec<HeldSlots> = Vec::new();
    let mut detail_lines = 0;
    for line in show_job.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let on_node = words.iter().any(|w| w.strip_prefix("Nodes=") == Some(node));
        if !on_node {
            continue;
        }
        let Some(list) = words.iter().find_map(|w| w.strip_prefix("GRES=")) else {
            continue;
        };
        detail_lines += 1;
        if detail_lines > 1 {
            return None;
        }
        for item in split_gres(list) {
            // mfslot:g1:1(IDX:1)
            let spec = item.split('(').next().unwrap_or("");
            let mut parts = spec.split(':');
            let (Some(name), Some(ty), Some(count)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let count: u32 = count.parse().unwrap_or(0);
            if name == gres && count > 0 {
                if let Some(gpu) = ty.strip_prefix('g').and_then(|i| i.parse().ok()) {
                    // The same type twice (listed per record) adds up.
                    match held.iter_mut().find(|h| h.gpu == gpu) {
                        Some(h) => h.count = h.count.saturating_add(count),
                        None => held.push(HeldSlots { gpu, count }),
                    }
                }
            }
        }
    }
    held.sort_unstable_by_key(|h| h.gpu);
    Some(held)
}

/// Splits a GRES list on commas outside parentheses (`IDX:0,2` has commas).
fn split_gres(list: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items
}

#[cfg(test)]
mod tests {
    /// `scontrol show job -d 323` of array 323 whose tasks 0 and 1 were
    /// split out as jobs 324 and 325 (shortened from the dev cluster).
    #[test]
    fn an_arrays_own_id_reads_its_own_record_only() {
        let out = "JobId=324 ArrayJobId=323 ArrayTaskId=0 JobName=x\n   AdminComment=muxflow:v1 mode=offline placed=node1:g0 \n     Nodes=node1 CPU_IDs=0 Mem=0 GRES=mfslot:g0:1(IDX:0)\n\n\
JobId=325 ArrayJobId=323 ArrayTaskId=1 JobName=x\n   AdminComment=muxflow:v1 mode=offline placed=node1:g1 \n     Nodes=node1 CPU_IDs=1 Mem=0 GRES=mfslot:g1:1(IDX:1)\n\n\
JobId=323 ArrayJobId=323 ArrayTaskId=2 JobName=x\n   AdminComment=muxflow:v1 mode=offline placed=node2:g0 \n\n";
        let own = super::job_record(out, 323);
        assert!(own.starts_with("JobId=323 "), "{own}");
        assert_eq!(
            super::parse_admin_comment(own).as_deref(),
            Some("muxflow:v1 mode=offline placed=node2:g0")
        );
        assert_eq!(super::job_record(out, 324).lines().count(), 4);
        // One record, or no record of that id: the whole output.
        let one = "JobId=7 JobName=y\n   AdminComment=a\n";
        assert_eq!(super::job_record(one, 7), one);
        assert_eq!(super::job_record(out, 9), out);
    }

    #[test]
    fn kill_wait_is_read_from_show_config() {
        let cfg = "KeepAliveTime           = SYSTEM_DEFAULT\nKillOnBadExit           = 0\nKillWait                = 30 sec\nLaunchParameters        = (null)\n";
        assert_eq!(parse_kill_wait(cfg), Some(Duration::from_secs(30)));
        assert_eq!(parse_kill_wait("KillOnBadExit = 0\n"), None);
        assert_eq!(parse_kill_wait("KillWait = soon\n"), None);
    }

    #[test]
    fn slurm_time_has_slurms_shape() {
        let t = super::slurm_time(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000),
        );
        let b = t.as_bytes();
        assert_eq!(t.len(), 19, "{t}");
        assert!(t.starts_with("2027-01-1"), "{t}");
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16]),
            (b'-', b'-', b'T', b':', b':'),
            "{t}"
        );
    }

    use super::*;

    const SHOW: &str = "JobId=10 JobName=wrap\n   JobState=RUNNING Reason=None\n   JOB_GRES=gpu:1,mfslot:g1:1\n     Nodes=node3 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0),mfslot:g1:1(IDX:1)\n   Features=(null)\n";

    fn held(pairs: &[(u32, u32)]) -> Vec<HeldSlots> {
        pairs
            .iter()
            .map(|&(gpu, count)| HeldSlots { gpu, count })
            .collect()
    }

    #[test]
    fn finds_the_slot_on_this_node() {
        assert_eq!(
            parse_offline_slots(SHOW, "node3", "mfslot"),
            Some(held(&[(1, 1)]))
        );
        assert_eq!(parse_offline_slots(SHOW, "node1", "mfslot"), Some(vec![]));
        assert_eq!(parse_offline_slots(SHOW, "node3", "other"), Some(vec![]));
        // A job name with a line break forges a second slot line for the
        // node: which one is Slurm's cannot be told.
        let forged = format!(
            "JobId=35 JobName=train\n     Nodes=node3 CPU_IDs=0 Mem=0 GRES=mfslot:g0:1(IDX:0)\n{SHOW}"
        );
        assert_eq!(parse_offline_slots(&forged, "node3", "mfslot"), None);
    }

    #[test]
    fn reads_the_admin_comment_with_its_spaces() {
        let show = "JobId=6 JobName=wrap\n   WorkDir=/tmp\n   AdminComment=muxflow:v1 mode=offline placed=node1:g0 \n   StdErr=/dev/null\n";
        assert_eq!(
            parse_admin_comment(show).as_deref(),
            Some("muxflow:v1 mode=offline placed=node1:g0")
        );
        assert_eq!(parse_admin_comment(SHOW).as_deref(), Some(""));
        assert_eq!(
            parse_admin_comment("   AdminComment=(null)\n").as_deref(),
            Some("")
        );
        // A job name with a line break forges a line: not Slurm's, not trusted.
        let forged = "JobId=6 JobName=x\n   AdminComment=muxflow:v1 mode=offline placed=node1:g0\n   AdminComment=muxflow:v1 mode=offline \n";
        assert_eq!(parse_admin_comment(forged), None);
    }

    #[test]
    fn ignores_zero_counts_and_handles_index_lists() {
        let show = "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=mfslot:g1:0(IDX:),mfslot:g0:1(IDX:0),gpu:2(IDX:0,1)\n";
        assert_eq!(
            parse_offline_slots(show, "n1", "mfslot"),
            Some(held(&[(0, 1)]))
        );
        assert_eq!(
            parse_offline_slots("JobId=1\n", "n1", "mfslot"),
            Some(vec![])
        );
        // offline_per_gpu = 2: the second job on GPU 0 holds the second
        // g0 record (IDX:1 numbers records, not GPUs): still GPU 0.
        let second = "     Nodes=n1 CPU_IDs=1 Mem=0 GRES=mfslot:g0:1(IDX:1)\n";
        assert_eq!(
            parse_offline_slots(second, "n1", "mfslot"),
            Some(held(&[(0, 1)]))
        );
    }

    #[test]
    fn counts_the_slots_held_of_each_gpu() {
        struct Row {
            name: &'static str,
            line: &'static str,
            want: &'static [(u32, u32)],
        }
        let rows = [
            Row {
                name: "both slots of GPU 0 (offline_per_gpu = 2, alone on it)",
                line: "GRES=mfslot:g0:2(IDX:0-1)",
                want: &[(0, 2)],
            },
            Row {
                name: "records listed apart add up",
                line: "GRES=mfslot:g1:1(IDX:2),mfslot:g1:1(IDX:3)",
                want: &[(1, 2)],
            },
            Row {
                name: "a 2-GPU gang, one slot each",
                line: "GRES=mfslot:g1:1(IDX:1),mfslot:g0:1(IDX:0)",
                want: &[(0, 1), (1, 1)],
            },
            Row {
                name: "more than a GPU has (gres.conf wrong): read as it is",
                line: "GRES=mfslot:g0:5(IDX:0-4)",
                want: &[(0, 5)],
            },
            Row {
                name: "slots of two GPUs",
                line: "GRES=mfslot:g0:2(IDX:0-1),mfslot:g1:1(IDX:2)",
                want: &[(0, 2), (1, 1)],
            },
        ];
        for r in rows {
            let show = format!("     Nodes=n1 CPU_IDs=0 Mem=0 {}\n", r.line);
            assert_eq!(
                parse_offline_slots(&show, "n1", "mfslot"),
                Some(held(r.want)),
                "{}",
                r.name
            );
        }
    }
}

#[cfg(test)]
mod client_tests {
    use super::*;

    /// A fake `scontrol` in a directory of its own: `script` is its body.
    fn fake(dir: &Path, script: &str) -> SlurmClient {
        let program = dir.join("scontrol");
        muxflow::test_support::write_executable(&program, &format!("#!/bin/sh\n{script}\n"));
        SlurmClient {
            program,
            slurm_conf: Some(dir.join("slurm.conf")),
            timeout: Duration::from_millis(500),
            attempts: 3,
            retry_pause: Duration::from_millis(1),
        }
    }

    #[test]
    fn an_unreachable_controller_is_tried_a_bounded_number_of_times() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let c = fake(
            dir.path(),
            &format!(
                "echo x >> {0}; echo 'slurm_update error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
                count.display()
            ),
        );
        let e = c.update_node("n1", &["Extra=x"]).unwrap_err();
        assert!(
            e.to_string().contains("Unable to contact slurm controller"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 3);
    }

    #[test]
    fn a_refusal_is_not_retried_and_a_hang_costs_one_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let c = fake(
            dir.path(),
            &format!(
                "echo x >> {0}; echo 'Invalid node name specified' >&2; exit 1",
                count.display()
            ),
        );
        assert!(c.update_node("n1", &["Extra=x"]).is_err());
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);

        let hung = fake(dir.path(), "exec sleep 30");
        let start = std::time::Instant::now();
        let e = hung.update_node("n1", &["Extra=x"]).unwrap_err();
        assert!(e.is_timeout(), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn commands_get_the_discovered_slurm_conf_and_come_from_scontrols_directory() {
        let dir = tempfile::tempdir().unwrap();
        let c = fake(dir.path(), "echo \"$SLURM_CONF $0 $*\"");
        let out = c.scontrol(&["show", "node", "n1"]).unwrap();
        assert_eq!(
            out.trim(),
            format!(
                "{0}/slurm.conf {0}/scontrol show node n1",
                dir.path().display()
            )
        );
        // sinfo from the same directory: missing here, so the error names it.
        let e = c.node_field("n1", "Reason").unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("{}/sinfo", dir.path().display())),
            "{e}"
        );
    }
}
