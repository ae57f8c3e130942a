//! `muxflow-report JOBID`: what sharing did to one job, for its owner, from
//! the records sacct keeps (the AdminComment of the job and of the jobs it
//! shared a GPU with).
//!
//! Who sees what: a user sees their own jobs; an administrator (root, or a
//! Slurm account with AdminLevel) sees every job. Partners are shown by job
//! ID and figures only — never another user's name or job name.
//!
//! The speed figures: the run's progress (steps/s, else launches/s), the
//! job's solo speed as the predictor estimates it from the job's runs that
//! the viewer may see (its own), their ratio (the normalized throughput),
//! and what the production predictor would have predicted for the pair,
//! trained on the history that ended before this run began.

use serde::Serialize;

use muxflow::records::admin_comment::{key as admin_key, AdminComment};
use muxflow::records::placement::Waiting;
use muxflow::records::report::{JobReport, ReportError};
use muxflow::records::runs::{EarlierRuns, MAX_KEPT};
use muxflow::Mode;
use muxflow_matcher::predict::{estimate, progress, runs_from_sacct, Model, Run, Signal};
use muxflow_matcher::reader::SacctJob;

pub mod live;

/// Who asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    pub user: String,
    pub admin: bool,
}

/// Why there is no report, each with what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("job {0}: no such job in the accounting database (check the ID with `sacct -j {0}`; jobs older than the database keeps are gone)")]
    NoSuchJob(u32),
    #[error("job {0} belongs to another user: you can see your own jobs (administrators see all)")]
    NotYours(u32),
    #[error("job {0} is not a muxflow job (it was submitted without --muxflow=online|offline): nothing was shared")]
    NotMuxflow(u32),
    #[error("job {job} has no figures yet ({state}): they are written when its batch step ends; try again then")]
    NoFigures { job: u32, state: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speed {
    /// "steps/s" or "launches/s".
    pub unit: &'static str,
    /// This run's progress next to its partner.
    pub shared: f64,
    /// The job's estimated speed alone (from its runs the viewer may see).
    pub solo_estimate: Option<f64>,
    /// Its runs on an idle GPU (no online partner, no offline peer): the
    /// solo measurements behind the estimate. Without one the estimate
    /// only extrapolates its shared runs, and no ratio is given.
    pub solo_runs: usize,
    /// shared / solo_estimate, where `solo_runs` > 0.
    pub normalized: Option<f64>,
    /// The predictor's normalized throughput for this pair, trained on the
    /// history before this run (mean, sd).
    pub predicted: Option<(f64, f64)>,
}

/// An offline partner of an online job: what the node gave it and held it
/// back by.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OfflinePartner {
    pub job_id: u32,
    pub sm_pct: Option<u8>,
    pub mem_cap_mib: Option<u64>,
    pub throttled_s: Option<f64>,
    pub delayed_launches: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserReport {
    pub job_id: u32,
    /// `<array>_<task>` for an array task.
    pub array_task: Option<String>,
    pub name: String,
    pub state: String,
    pub mode: &'static str,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    /// The job it shared its GPU with (an offline job's online partner, or
    /// an offline job an online job hosted), by ID.
    pub partner: Option<u32>,
    /// Offline jobs: the other offline jobs that shared its GPUs, by ID.
    pub offline_peers: Vec<u32>,
    pub run_s: Option<u64>,
    pub sm_pct: Option<u8>,
    pub mem_cap_mib: Option<u64>,
    pub measured_peak_mib: Option<u64>,
    pub partner_load_pct: Option<u8>,
    /// The partner's mean SM utilization while it ran, percent of the GPU.
    pub partner_sm_pct: Option<u8>,
    pub launches: Option<u64>,
    pub delayed_launches: Option<u64>,
    pub throttled_s: Option<f64>,
    pub oom_refusals: Option<u64>,
    /// Why the node terminated a process of it, if it did.
    pub policed: Option<String>,
    pub speed: Option<Speed>,
    /// Online jobs: the offline jobs that shared its GPU.
    pub offline_partners: Vec<OfflinePartner>,
    pub rps: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Online jobs: what sharing cost the service, from its own figures.
    pub cost: Option<OnlineCost>,
    /// A requeued job's runs before this one.
    pub runs_before: RunsBefore,
}

/// A job's runs before its current one (an online job requeued it, or
/// Slurm did), from its AdminComment: Slurm's accounting keeps only where
/// each was placed.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct RunsBefore {
    /// How many there were.
    pub count: u32,
    /// The latest of them, oldest first, with their figures (the record
    /// keeps the last few).
    pub kept: Vec<EarlierRun>,
}

/// One earlier run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EarlierRun {
    /// Its number, from 1.
    pub run: u32,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub run_s: Option<u64>,
    /// An online job's arrival on its GPU ended it.
    pub requeued: bool,
    /// The online job on its GPU (at its start, else at its end).
    pub partner: Option<u32>,
    pub sm_pct: Option<u8>,
    pub mem_cap_mib: Option<u64>,
    pub measured_peak_mib: Option<u64>,
    pub launches: Option<u64>,
    pub delayed_launches: Option<u64>,
    pub throttled_s: Option<f64>,
    pub oom_refusals: Option<u64>,
    pub steps: Option<u64>,
    pub policed: Option<String>,
}

impl RunsBefore {
    pub fn new(runs: &EarlierRuns) -> RunsBefore {
        let kept = runs
            .kept
            .iter()
            .map(|(n, r)| EarlierRun {
                run: *n,
                node: r.node.clone(),
                gpu: r.gpu,
                run_s: r.run_s,
                requeued: r.requeued,
                partner: r.partner,
                sm_pct: r.sm_pct,
                mem_cap_mib: r.mem_cap_mib,
                measured_peak_mib: r.measured_peak_mib,
                launches: r.launches,
                delayed_launches: r.delayed,
                throttled_s: r.delay_ms.map(|ms| ms as f64 / 1000.0),
                oom_refusals: r.oom,
                steps: r.steps,
                policed: r.policed.clone(),
            })
            .collect();
        RunsBefore {
            count: runs.count,
            kept,
        }
    }

    /// ` (run N)` after the current run's place, where it had runs before.
    pub(crate) fn this_run(&self) -> String {
        match self.count {
            0 => String::new(),
            n => format!(" (run {})", n + 1),
        }
    }

    /// A line per kept run, after a line for those not kept.
    pub(crate) fn write(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let not_kept = self.count.saturating_sub(self.kept.len() as u32);
        if not_kept > 0 {
            writeln!(
                f,
                "  earlier runs     {} in all; the figures of the {not_kept} first are not kept (its record keeps the last {MAX_KEPT})",
                self.count
            )?;
        }
        for r in &self.kept {
            let ended = match (r.requeued, r.partner) {
                (true, Some(p)) => format!(", requeued for online job {p}"),
                (true, None) => ", requeued for an online job".to_string(),
                (false, Some(p)) => format!(", beside online job {p}"),
                (false, None) => String::new(),
            };
            let steps = r.steps.map_or_else(String::new, |s| format!(", {s} steps"));
            writeln!(
                f,
                "  {:<17}{} on {} GPU {}{ended}: SM share {}, memory cap {}, {} launches ({} delayed, {} throttled), OOM refusals {}{steps}",
                format!("run {}", r.run),
                opt(r.run_s, " s"),
                opt(r.node.as_deref(), ""),
                opt(r.gpu, ""),
                opt(r.sm_pct, "%"),
                opt(r.mem_cap_mib, " MiB"),
                opt(r.launches, ""),
                opt(r.delayed_launches, ""),
                r.throttled_s
                    .map_or_else(|| "-".into(), |s| format!("{s:.1} s")),
                opt(r.oom_refusals, ""),
            )?;
            if let Some(p) = &r.policed {
                writeln!(f, "  {:<17}policed {p}", "")?;
            }
        }
        Ok(())
    }
}

/// An online run's p99 over the p99 of the same service's runs (same user
/// and job name) that hosted no offline job: what its partners cost it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlineCost {
    /// Median p99 of the service's unshared runs, ms.
    pub alone_p99_ms: f64,
    pub alone_runs: usize,
    /// This run's p99 / alone_p99_ms.
    pub p99_factor: f64,
}

/// What `muxflow-report JOBID` answers: a finished run's figures, or why
/// a pending offline job waits.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    Figures(Box<UserReport>),
    Waiting(Box<WaitingReport>),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Figures(r) => r.fmt(f),
            Answer::Waiting(w) => w.fmt(f),
        }
    }
}

/// A pending offline job: whose hold it is, why it waits, since when, and
/// what it waits for, from what muxflow wrote into its AdminComment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitingReport {
    pub job_id: u32,
    /// `<array>_<task>` for an array task.
    pub array_task: Option<String>,
    pub name: String,
    pub state: String,
    pub mode: &'static str,
    /// The matcher's reason code (`free_gpu`…); None before its first
    /// look, or once placed.
    pub waiting: Option<&'static str>,
    /// The reason in words.
    pub why: String,
    /// What has to happen for it to move on.
    pub waits_for: String,
    /// Since when (local time as Slurm prints it): the reason's start, or
    /// the submission (or requeue) while the matcher has not looked yet.
    pub since: Option<String>,
    /// How often the matcher looks again.
    pub rounds_every: Option<String>,
    /// Where the matcher placed it, while Slurm has yet to start it.
    pub placed: Option<String>,
    /// The last node refusal's code and how many there were.
    pub refused: Option<String>,
    pub refusals: u32,
    /// A requeued job's runs before, the last one included.
    pub runs_before: RunsBefore,
}

/// What a parked job waits for, for each of the matcher's reasons.
fn waits_for(w: Waiting) -> &'static str {
    match w {
        Waiting::FreeGpu => "a Healthy GPU with a free offline slot: an offline job there to end, or an online job's load to leave room",
        Waiting::FreeNode => "as many such GPUs free at once on one node as it asked for",
        Waiting::FasterJobsFirst => "a round where a GPU it fits is left after the jobs predicted to run faster there",
        Waiting::OlderJobsFirst => "its turn: each round takes users in turns, oldest jobs first",
        Waiting::NodeRoom => "CPUs and memory to free up on the node of a free GPU (asking for less with -c, --mem places it sooner)",
        Waiting::SameUserOnly => "a GPU that runs no other user's job",
        Waiting::CoLocateRule => "a GPU without the jobs the site's co_locate rule keeps it apart from",
        Waiting::BeginTime => "its begin time (--begin, or the two minutes Slurm waits after a requeue)",
        Waiting::Dependency => "its --dependency to be satisfied",
    }
}

/// `A_T` of a sacct record that is one task of an array.
fn array_task(job: &SacctJob) -> Option<String> {
    let task = job.array.task_id?;
    (job.array.job_id != 0).then(|| format!("{}_{task}", job.array.job_id))
}

/// The waiting report of pending offline job `job` (its AdminComment
/// `comment`).
fn waiting_report(job: &SacctJob, comment: &AdminComment) -> WaitingReport {
    let field = |k: &str| comment.fields().get(k).cloned();
    let waiting = comment.waiting();
    let placed = comment.placement().map(|p| p.to_string());
    let (why, waits) = match (waiting, &placed) {
        (_, Some(p)) => (
            format!("placed by muxflow on {p}; Slurm has yet to start it"),
            "Slurm to start it there (squeue's reason says why not yet: usually the node's CPUs or memory, for seconds)".to_string(),
        ),
        (Some(w), None) => (w.words().to_string(), waits_for(w).to_string()),
        (None, None) => (
            "held until muxflow's placement service (the matcher) looks at it".to_string(),
            "the matcher's next round (every minute by default; if this lasts several minutes the matcher is not running: tell your administrator)".to_string(),
        ),
    };
    let since = match waiting {
        Some(_) if placed.is_none() => field(admin_key::SINCE),
        _ => (job.time.submission > 0).then(|| {
            muxflow_slurm::cli::slurm_time(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(job.time.submission),
            )
        }),
    };
    WaitingReport {
        job_id: job.job_id,
        array_task: array_task(job),
        name: job.name.clone(),
        state: job.state.current.join(",").to_lowercase(),
        mode: Mode::Offline.as_str(),
        waiting: waiting.filter(|_| placed.is_none()).map(Waiting::code),
        why,
        waits_for: waits,
        since,
        rounds_every: field(admin_key::ROUNDS_EVERY).filter(|_| waiting.is_some()),
        placed,
        refused: field(admin_key::REFUSED),
        refusals: comment.refusals(),
        runs_before: RunsBefore::new(&comment.runs_before()),
    }
}

impl std::fmt::Display for WaitingReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "job {}{} ({}), {} muxflow job, {}",
            self.job_id,
            self.array_task
                .as_ref()
                .map_or_else(String::new, |t| format!(" (array task {t})")),
            muxflow::text::printable(&self.name),
            self.mode,
            self.state
        )?;
        if self.placed.is_none() {
            writeln!(
                f,
                "  held by          muxflow, not you (squeue shows JobHeldUser or JobHeldAdmin: you need not release it, and cannot)"
            )?;
        }
        writeln!(f, "  why              {}", self.why)?;
        if let Some(since) = &self.since {
            writeln!(f, "  since            {since}")?;
        }
        writeln!(f, "  waits for        {}", self.waits_for)?;
        if let Some(every) = &self.rounds_every {
            writeln!(f, "  looked at        every {every} by the matcher")?;
        }
        self.runs_before.write(f)?;
        if self.refusals > 0 {
            writeln!(
                f,
                "  refused          {} time{} by its node ({}): placed again; after 3 it fails",
                self.refusals,
                if self.refusals > 1 { "s" } else { "" },
                self.refused.as_deref().unwrap_or("-")
            )?;
        }
        Ok(())
    }
}

/// The report of job `job_id` from `listing` (sacct records: the job, the
/// viewer's history, and the jobs that ran beside it), as `viewer` may see
/// it.
pub fn report(job_id: u32, listing: &[SacctJob], viewer: &Viewer) -> Result<Answer, Refusal> {
    let job = listing
        .iter()
        .find(|j| j.job_id == job_id)
        .ok_or(Refusal::NoSuchJob(job_id))?;
    if !viewer.admin && job.user != viewer.user {
        return Err(Refusal::NotYours(job_id));
    }
    let text = job.comment.administrator.as_deref().unwrap_or("");
    let no_figures = || Refusal::NoFigures {
        job: job_id,
        state: job.state.current.join(",").to_lowercase(),
    };
    let comment = AdminComment::parse(text);
    // A pending offline job: why it waits (a requeued one too, whatever
    // its text still says of the run before).
    if let Ok(c) = &comment {
        let pending =
            job.time.end == 0 && muxflow_matcher::reader::has_state(&job.state.current, "PENDING");
        if pending && c.mode() == Some(Mode::Offline) {
            return Ok(Answer::Waiting(Box::new(waiting_report(job, c))));
        }
    }
    // A placed job's record is the matcher's placement until its batch
    // step ends and the node writes the figures over it.
    if comment.as_ref().is_ok_and(|c| c.placement().is_some()) {
        return Err(no_figures());
    }
    let r = match comment.map_err(ReportError::from).and_then(|c| c.report()) {
        Ok(r) => r,
        // Running or pending: muxflow's or not, the figures come at the end.
        Err(_) if job.time.end == 0 => return Err(no_figures()),
        Err(_) => return Err(Refusal::NotMuxflow(job_id)),
    };
    let mode = r.mode.unwrap_or(Mode::Offline);
    let mut out = UserReport {
        job_id,
        array_task: array_task(job),
        name: job.name.clone(),
        state: job.state.current.join(",").to_lowercase(),
        mode: mode.as_str(),
        node: r.node.clone(),
        gpu: r.gpu,
        partner: r.partner,
        offline_peers: r.peers.clone(),
        run_s: r.run_s,
        sm_pct: r.sm_pct,
        mem_cap_mib: r.mem_cap_mib,
        measured_peak_mib: r.measured_peak_mib,
        partner_load_pct: r.partner_load_pct,
        partner_sm_pct: r.partner_sm_pct,
        launches: r.launches,
        delayed_launches: r.delayed,
        throttled_s: r.delay_ms.map(|ms| ms as f64 / 1000.0),
        oom_refusals: r.oom,
        policed: r.policed.clone(),
        speed: None,
        offline_partners: Vec::new(),
        rps: r.rps,
        p50_ms: r.p50_ms,
        p99_ms: r.p99_ms,
        cost: None,
        runs_before: RunsBefore::new(&r.earlier),
    };
    match mode {
        Mode::Offline => out.speed = speed(job, &r, listing),
        Mode::Online => {
            out.offline_partners = listing
                .iter()
                .filter(|j| j.job_id != job_id)
                .filter_map(|j| {
                    let p = JobReport::decode(j.comment.administrator.as_deref()?).ok()?;
                    (p.mode == Some(Mode::Offline) && p.partner == Some(job_id)).then(|| {
                        OfflinePartner {
                            job_id: j.job_id,
                            sm_pct: p.sm_pct,
                            mem_cap_mib: p.mem_cap_mib,
                            throttled_s: p.delay_ms.map(|ms| ms as f64 / 1000.0),
                            delayed_launches: p.delayed,
                        }
                    })
                })
                .collect();
            out.cost = online_cost(job, &r, listing);
        }
    }
    Ok(Answer::Figures(Box::new(out)))
}

/// This online run's p99 against the same service's unshared runs.
fn online_cost(job: &SacctJob, r: &JobReport, listing: &[SacctJob]) -> Option<OnlineCost> {
    let p99 = r.p99_ms?;
    let mut alone: Vec<f64> = listing
        .iter()
        .filter(|j| j.job_id != job.job_id && j.user == job.user && j.name == job.name)
        .filter_map(|j| JobReport::decode(j.comment.administrator.as_deref()?).ok())
        .filter(|x| x.mode == Some(Mode::Online) && x.partner.is_none())
        .filter_map(|x| x.p99_ms)
        .filter(|v| *v > 0.0)
        .collect();
    if alone.is_empty() {
        return None;
    }
    alone.sort_by(f64::total_cmp);
    let median = alone[alone.len() / 2];
    Some(OnlineCost {
        alone_p99_ms: median,
        alone_runs: alone.len(),
        p99_factor: p99 / median,
    })
}

/// The offline run's speed: shared, solo estimate from the owner's runs of
/// the same name, and the prediction from the history before it.
fn speed(job: &SacctJob, r: &JobReport, listing: &[SacctJob]) -> Option<Speed> {
    let runs = runs_from_sacct(listing);
    let key = (job.user.clone(), job.name.clone());
    let mine: Vec<Run> = runs.iter().filter(|x| x.key == key).cloned().collect();
    let est = estimate(&mine);
    let profile = est.profiles.get(&key);
    let signal = profile
        .and_then(|p| p.signal)
        .unwrap_or(Signal::LaunchesPerS);
    let shared = progress(r, signal)?;
    let solo = profile.and_then(|p| p.solo);
    let solo_runs = profile.map_or(0, |p| p.alone_runs);
    // What the matcher could have known: runs that ended before this one
    // began (its end less its run time).
    let began = job.time.end.saturating_sub(r.run_s.unwrap_or(0));
    let before: Vec<Run> = runs
        .iter()
        .filter(|x| x.job_id != job.job_id && x.end_s > 0 && x.end_s <= began)
        .cloned()
        .collect();
    let predicted = r.partner.and_then(|partner_id| {
        let partner = runs
            .iter()
            .find(|x| x.job_id == job.job_id)
            .and_then(|x| x.partner_key.clone())
            .unwrap_or_else(|| (String::new(), format!("job {partner_id}")));
        let model = Model::train(&before);
        let share = r.sm_pct.map_or(1.0, |s| f64::from(s.min(100)) / 100.0);
        let mem = match (r.measured_peak_mib, r.mem_cap_mib) {
            (Some(p), Some(c)) if c > 0 => (p as f64 / c as f64).min(1.0),
            _ => muxflow_matcher::predict::DEFAULT_MEM,
        };
        model
            .predict_pair(&key, &partner, share, mem)
            .map(|e| (e.mean, e.sd))
    });
    Some(Speed {
        unit: match signal {
            Signal::StepsPerS => "steps/s",
            Signal::LaunchesPerS => "launches/s",
        },
        shared,
        solo_estimate: solo,
        solo_runs,
        normalized: solo
            .filter(|s| *s > 0.0 && solo_runs > 0)
            .map(|s| shared / s),
        predicted,
    })
}

fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v}{unit}"))
}

impl std::fmt::Display for UserReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "job {}{} ({}), {} muxflow job, {}",
            self.job_id,
            self.array_task
                .as_ref()
                .map_or_else(String::new, |t| format!(" (array task {t})")),
            muxflow::text::printable(&self.name),
            self.mode,
            self.state
        )?;
        writeln!(
            f,
            "  ran on           {} GPU {} for {}{}",
            opt(self.node.as_deref(), ""),
            opt(self.gpu, ""),
            opt(self.run_s, " s"),
            self.runs_before.this_run()
        )?;
        match (self.mode, self.partner) {
            ("offline", Some(p)) => writeln!(f, "  shared with      online job {p}")?,
            ("offline", None) => writeln!(f, "  shared with      no online job (an idle GPU)")?,
            _ => {}
        }
        if !self.offline_peers.is_empty() {
            let ids: Vec<String> = self.offline_peers.iter().map(u32::to_string).collect();
            writeln!(
                f,
                "  and with         offline job{} {} (each on its part of the offline share)",
                if ids.len() > 1 { "s" } else { "" },
                ids.join(", ")
            )?;
        }
        if self.mode == "offline" {
            writeln!(
                f,
                "  limits           SM share {}, memory cap {} (peak measured {})",
                opt(self.sm_pct, "%"),
                opt(self.mem_cap_mib, " MiB"),
                opt(self.measured_peak_mib, " MiB")
            )?;
            writeln!(
                f,
                "  throttled        {} ({} of {} launches delayed)",
                self.throttled_s
                    .map_or_else(|| "-".into(), |s| format!("{s:.1} s")),
                opt(self.delayed_launches, ""),
                opt(self.launches, "")
            )?;
            writeln!(
                f,
                "  OOM refusals     {} (allocations over the cap, refused by xCUDA)",
                opt(self.oom_refusals, "")
            )?;
            match (self.partner_sm_pct, self.partner_load_pct) {
                (Some(sm), Some(load)) => writeln!(
                    f,
                    "  partner's load   {sm}% of the GPU's SMs on average while this ran ({load}% of its busiest moment then)"
                )?,
                (None, Some(load)) => {
                    writeln!(f, "  partner's load   {load}% of its busiest moment while this ran")?
                }
                (Some(sm), None) => writeln!(
                    f,
                    "  partner's load   {sm}% of the GPU's SMs on average while this ran"
                )?,
                (None, None) => {}
            }
            match &self.speed {
                Some(s) => {
                    match (s.solo_estimate, s.normalized) {
                        (Some(solo), Some(norm)) => writeln!(
                            f,
                            "  speed            {:.2} {} shared; alone about {solo:.2} {} ({} run{} of this job on an idle GPU): {norm:.2} of alone",
                            s.shared,
                            s.unit,
                            s.unit,
                            s.solo_runs,
                            if s.solo_runs > 1 { "s" } else { "" }
                        )?,
                        _ => writeln!(
                            f,
                            "  speed            {:.2} {} shared; of alone: not enough history (no run of this job on an idle GPU to compare with)",
                            s.shared, s.unit
                        )?,
                    }
                    if let Some((m, sd)) = s.predicted {
                        writeln!(
                            f,
                            "  predicted        {m:.2}±{sd:.2} of alone (the matcher's model on the history before this run)"
                        )?;
                    }
                }
                None => writeln!(
                    f,
                    "  speed            no progress figures (no steps, no launches)"
                )?,
            }
        } else {
            writeln!(
                f,
                "  served           {} req/s, p50 {} ms, p99 {} ms",
                opt(self.rps, ""),
                opt(self.p50_ms, ""),
                opt(self.p99_ms, "")
            )?;
            match &self.cost {
                Some(c) => writeln!(
                    f,
                    "  sharing cost     p99 x{:.2} of its runs without partners (median {:.2} ms over {} runs)",
                    c.p99_factor, c.alone_p99_ms, c.alone_runs
                )?,
                None if self.partner.is_some() || !self.offline_partners.is_empty() => writeln!(
                    f,
                    "  sharing cost     unknown: no run of this service without partners in the history read"
                )?,
                None => {}
            }
            if self.offline_partners.is_empty() {
                writeln!(f, "  offline partners none recorded")?;
            }
            for p in &self.offline_partners {
                writeln!(
                    f,
                    "  offline partner  job {}: SM share {}, memory cap {}, held back {} ({} launches delayed)",
                    p.job_id,
                    opt(p.sm_pct, "%"),
                    opt(p.mem_cap_mib, " MiB"),
                    p.throttled_s
                        .map_or_else(|| "-".into(), |s| format!("{s:.1} s")),
                    opt(p.delayed_launches, "")
                )?;
            }
        }
        if let Some(p) = &self.policed {
            writeln!(
                f,
                "  policed          {p} (the node terminated a process out of its limits)"
            )?;
        }
        self.runs_before.write(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow_matcher::reader::{SacctComment, SacctState, SacctTime};

    fn rec(id: u32, user: &str, name: &str, end: u64, comment: &str) -> SacctJob {
        SacctJob {
            job_id: id,
            name: name.into(),
            user: user.into(),
            state: SacctState {
                current: vec![if end > 0 { "COMPLETED" } else { "RUNNING" }.into()],
            },
            comment: SacctComment {
                administrator: (!comment.is_empty()).then(|| comment.to_string()),
            },
            time: SacctTime {
                end,
                submission: 1_700_000_000,
            },
            array: Default::default(),
        }
    }

    fn listing() -> Vec<SacctJob> {
        let off = |id: u32, partner: u32, end: u64, launches: u64| {
            rec(
                id,
                "alice",
                "train",
                end,
                &format!(
                    "muxflow:v1 mode=offline node=n1 gpu=0 sm_pct=40 mem_cap_mib=60000 partner={partner} \
                     measured_peak_mib=2000 run_s=100 partner_load_pct=80 partner_sm_pct=24 claim.launches={launches} \
                     claim.delayed=50 claim.delay_ms=1500 claim.oom=2"
                ),
            )
        };
        vec![
            rec(
                1,
                "svc",
                "secret-service-a",
                5000,
                "muxflow:v1 mode=online node=n1 gpu=0 run_s=4000 claim.rps=100 claim.p99_ms=4.5",
            ),
            rec(
                2,
                "svc",
                "secret-service-b",
                5000,
                "muxflow:v1 mode=online node=n2 gpu=0 run_s=4000",
            ),
            off(10, 1, 1000, 50_000),
            off(11, 2, 2000, 100_000),
            off(12, 1, 3000, 60_000),
            rec(13, "alice", "plain", 3000, ""),
            rec(
                14,
                "alice",
                "train",
                0,
                "muxflow:v1 mode=offline placed=n1:g0",
            ),
        ]
    }

    fn figures(a: Result<Answer, Refusal>) -> UserReport {
        match a {
            Ok(Answer::Figures(r)) => *r,
            other => panic!("not figures: {other:?}"),
        }
    }

    fn alice() -> Viewer {
        Viewer {
            user: "alice".into(),
            admin: false,
        }
    }

    #[test]
    fn the_owner_sees_limits_throttling_speed_and_partner_ids_only() {
        let r = figures(report(12, &listing(), &alice()));
        assert_eq!(
            (r.mode, r.partner, r.sm_pct),
            ("offline", Some(1), Some(40))
        );
        assert_eq!(r.throttled_s, Some(1.5));
        assert_eq!(r.oom_refusals, Some(2));
        let s = r.speed.clone().unwrap();
        assert_eq!(s.unit, "launches/s");
        assert!((s.shared - 600.0).abs() < 1e-9);
        let text = r.to_string();
        assert!(text.contains("online job 1"), "{text}");
        assert!(
            text.contains("partner's load   24% of the GPU's SMs on average while this ran (80% of its busiest moment then)"),
            "{text}"
        );
        assert!(!text.contains("offline job"), "no peers: {text}");
        assert!(!text.contains("secret"), "no partner names: {text}");
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("secret"), "{json}");
    }

    #[test]
    fn the_offline_jobs_that_shared_the_gpu_are_named_by_id() {
        let mut l = listing();
        l.push(rec(
            15,
            "alice",
            "train",
            3500,
            "muxflow:v1 mode=offline node=n1 gpu=0 sm_pct=20 partner=1 peers=12,16 run_s=100",
        ));
        let r = figures(report(15, &l, &alice()));
        assert_eq!(r.offline_peers, [12, 16]);
        let text = r.to_string();
        assert!(
            text.contains("and with         offline jobs 12, 16 (each on its part"),
            "{text}"
        );
    }

    #[test]
    fn another_user_is_refused_and_an_admin_sees_all() {
        let bob = Viewer {
            user: "bob".into(),
            admin: false,
        };
        assert_eq!(report(12, &listing(), &bob), Err(Refusal::NotYours(12)));
        let admin = Viewer {
            user: "root".into(),
            admin: true,
        };
        let r = figures(report(1, &listing(), &admin));
        let partners: Vec<u32> = r.offline_partners.iter().map(|p| p.job_id).collect();
        assert_eq!(partners, vec![10, 12]);
        assert!(r.to_string().contains("offline partner  job 10"));
    }

    #[test]
    fn an_online_runs_cost_is_its_p99_over_its_unshared_runs() {
        let mut l = listing();
        for (id, p99) in [(20, "3.0"), (21, "5.0"), (22, "4.0")] {
            l.push(rec(
                id,
                "svc",
                "secret-service-a",
                100,
                &format!("muxflow:v1 mode=online node=n1 gpu=0 run_s=60 claim.p99_ms={p99}"),
            ));
        }
        let admin = Viewer {
            user: "root".into(),
            admin: true,
        };
        let r = figures(report(1, &l, &admin));
        let c = r.cost.clone().unwrap();
        assert_eq!((c.alone_p99_ms, c.alone_runs), (4.0, 3));
        assert!((c.p99_factor - 4.5 / 4.0).abs() < 1e-9, "{c:?}");
        assert!(r
            .to_string()
            .contains("p99 x1.12 of its runs without partners"));
        // No unshared run: said so.
        let r = figures(report(1, &listing(), &admin));
        assert!(r.cost.is_none());
        assert!(r.to_string().contains("sharing cost     unknown"), "{r}");
    }

    #[test]
    fn each_refusal_names_what_to_do() {
        let l = listing();
        let e = report(99, &l, &alice()).unwrap_err();
        assert_eq!(e, Refusal::NoSuchJob(99));
        assert!(e.to_string().contains("sacct -j 99"));
        let e = report(13, &l, &alice()).unwrap_err();
        assert_eq!(e, Refusal::NotMuxflow(13));
        assert!(e.to_string().contains("--muxflow"));
        let e = report(14, &l, &alice()).unwrap_err();
        assert!(matches!(e, Refusal::NoFigures { job: 14, .. }), "{e:?}");
        assert!(e.to_string().contains("when its batch step ends"));
    }

    #[test]
    fn of_alone_only_where_the_job_ran_on_an_idle_gpu() {
        // Jobs 10–12 all ran beside online job 1: no solo measurement.
        let r = figures(report(12, &listing(), &alice()));
        let s = r.speed.clone().unwrap();
        assert_eq!((s.solo_runs, s.normalized), (0, None));
        let text = r.to_string();
        assert!(text.contains("of alone: not enough history"), "{text}");
        assert!(
            !text.contains("0 of alone") && !text.contains("1.00 of alone"),
            "{text}"
        );
        // One run on an idle GPU (no partner, no peers): a ratio, and says
        // how many runs it stands on.
        let mut l = listing();
        l.push(rec(
            16,
            "alice",
            "train",
            500,
            "muxflow:v1 mode=offline node=n1 gpu=1 sm_pct=100 run_s=100 claim.launches=100000",
        ));
        let r = figures(report(12, &l, &alice()));
        let s = r.speed.clone().unwrap();
        assert_eq!(s.solo_runs, 1);
        assert!(s.normalized.is_some(), "{s:?}");
        assert!(
            r.to_string().contains("(1 run of this job on an idle GPU)"),
            "{r}"
        );
    }

    #[test]
    fn a_pending_offline_job_says_why_since_when_and_what_for() {
        let pending = |comment: &str| {
            let mut j = rec(30, "alice", "train", 0, comment);
            j.state.current = vec!["PENDING".into()];
            j
        };
        let waiting = |a: Result<Answer, Refusal>| match a {
            Ok(Answer::Waiting(w)) => *w,
            other => panic!("not waiting: {other:?}"),
        };
        struct Case {
            name: &'static str,
            comment: &'static str,
            says: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "the matcher's reason",
                comment: "muxflow:v1 mode=offline waiting=same_user_only since=2026-11-23T12:14:05 rounds_every=60s",
                says: &[
                    "held by          muxflow, not you",
                    "why              waiting for a GPU it may share",
                    "since            2026-11-23T12:14:05",
                    "waits for        a GPU that runs no other user's job",
                    "every 60s",
                ],
            },
            Case {
                name: "not looked at yet",
                comment: "muxflow:v1 mode=offline",
                says: &[
                    "held by          muxflow",
                    "until muxflow's placement service (the matcher) looks at it",
                    "since            ",
                    "the matcher is not running: tell your administrator",
                ],
            },
            Case {
                name: "placed, Slurm starting it",
                comment: "muxflow:v1 mode=offline placed=n1:g0",
                says: &["placed by muxflow on n1:g0", "Slurm to start it there"],
            },
            Case {
                name: "requeued, its run's figures not yet replaced",
                comment: "muxflow:v1 mode=offline node=node4 gpu=0 sm_pct=80 partner=90 run_s=7 requeued=1 claim.launches=11180",
                says: &[
                    "held by          muxflow",
                    "run 1            7 s on node4 GPU 0, requeued for online job 90: SM share 80%, memory cap -, 11180 launches (- delayed, - throttled), OOM refusals -",
                ],
            },
            Case {
                name: "requeued, its reason written over its run's report",
                comment: "muxflow:v1 mode=offline waiting=begin_time since=t rounds_every=60s runs_before=1 \
                          run1.node=node4 run1.gpu=0 run1.sm_pct=80 run1.partner=90 run1.run_s=7 run1.requeued=1 \
                          run1.claim.launches=11180 run1.claim.delayed=2 run1.claim.delay_ms=1500 run1.claim.oom=0",
                says: &[
                    "why              Slurm starts it no earlier than its begin time",
                    "run 1            7 s on node4 GPU 0, requeued for online job 90: SM share 80%, memory cap -, 11180 launches (2 delayed, 1.5 s throttled), OOM refusals 0",
                ],
            },
            Case {
                name: "placed again after two requeues",
                comment: "muxflow:v1 mode=offline placed=n2:g1 runs_before=2 run1.node=node4 run1.gpu=0 run1.run_s=7 \
                          run1.requeued=1 run2.node=n3 run2.gpu=1 run2.run_s=30",
                says: &[
                    "placed by muxflow on n2:g1",
                    "run 1            7 s on node4 GPU 0, requeued for an online job:",
                    "run 2            30 s on n3 GPU 1: SM share -",
                ],
            },
            Case {
                name: "refused once by its node",
                comment: "muxflow:v1 mode=offline refused=gpu_faulty refusals=1 waiting=free_gpu since=t rounds_every=60s",
                says: &["refused          1 time by its node (gpu_faulty)"],
            },
        ];
        for case in &cases {
            let w = waiting(report(30, &[pending(case.comment)], &alice()));
            let text = w.to_string();
            for want in case.says {
                assert!(
                    text.contains(want),
                    "{}: {want:?} not in:\n{text}",
                    case.name
                );
            }
        }
        // As JSON: the code and the time, for scripts.
        let w = waiting(report(30, &[pending(cases[0].comment)], &alice()));
        let json = serde_json::to_value(Answer::Waiting(Box::new(w))).unwrap();
        assert_eq!(json["waiting"], "same_user_only");
        assert_eq!(json["since"], "2026-11-23T12:14:05");
        // Another user's waiting job stays refused.
        let bob = Viewer {
            user: "bob".into(),
            admin: false,
        };
        assert_eq!(
            report(30, &[pending(cases[0].comment)], &bob),
            Err(Refusal::NotYours(30))
        );
    }

    #[test]
    fn a_requeued_jobs_report_shows_its_earlier_runs_and_which_run_it_is() {
        let mut l = listing();
        l.push(rec(
            40,
            "alice",
            "train",
            4000,
            "muxflow:v1 mode=offline node=n1 gpu=1 sm_pct=100 run_s=300 claim.launches=90000 \
             runs_before=6 run5.node=node4 run5.gpu=0 run5.sm_pct=80 run5.mem_cap_mib=79511 run5.partner=90 \
             run5.run_s=7 run5.requeued=1 run5.claim.launches=11180 run5.claim.delayed=0 run5.claim.delay_ms=0 \
             run5.claim.oom=0 run5.claim.steps=12 run6.node=n2 run6.gpu=0 run6.run_s=40 run6.policed=memory",
        ));
        let r = figures(report(40, &l, &alice()));
        assert_eq!(r.runs_before.count, 6);
        let runs: Vec<u32> = r.runs_before.kept.iter().map(|k| k.run).collect();
        assert_eq!(runs, [5, 6]);
        let text = r.to_string();
        for want in [
            "ran on           n1 GPU 1 for 300 s (run 7)",
            "earlier runs     6 in all; the figures of the 4 first are not kept (its record keeps the last 4)",
            "run 5            7 s on node4 GPU 0, requeued for online job 90: SM share 80%, memory cap 79511 MiB, 11180 launches (0 delayed, 0.0 s throttled), OOM refusals 0, 12 steps",
            "run 6            40 s on n2 GPU 0: SM share -",
            "policed memory",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["runs_before"]["count"], 6);
        assert_eq!(json["runs_before"]["kept"][0]["partner"], 90);
        // A job never requeued says nothing of it.
        let text = figures(report(12, &listing(), &alice())).to_string();
        assert!(
            !text.contains("(run ") && !text.contains("  run 1") && !text.contains("earlier runs"),
            "{text}"
        );
    }

    #[test]
    fn an_array_task_is_named_as_its_owner_names_it() {
        let mut l = listing();
        l[4].array = muxflow_matcher::reader::SacctArray {
            job_id: 9,
            task_id: Some(2),
        };
        let r = figures(report(12, &l, &alice()));
        assert_eq!(r.array_task.as_deref(), Some("9_2"));
        assert!(
            r.to_string().starts_with("job 12 (array task 9_2) (train)"),
            "{r}"
        );
    }

    #[test]
    fn the_prediction_uses_only_runs_that_ended_before() {
        // Job 10 is the first run: nothing before it, so the default.
        let r = figures(report(10, &listing(), &alice()));
        let (m, sd) = r.speed.unwrap().predicted.unwrap();
        assert_eq!(sd, muxflow_matcher::predict::DEFAULT_SD);
        assert!(m > 0.0);
    }
}
