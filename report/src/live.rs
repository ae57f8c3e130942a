//! What muxflow is doing now, from `squeue --json` (and, for a GPU, the
//! node's published record): a running job and the jobs beside it on its
//! GPUs, a user's own muxflow jobs (`--mine`), and an administrator's view
//! of one GPU (`--gpu NODE:INDEX`).
//!
//! sacct holds a job's figures only once its batch step ended; who shares a
//! GPU now is Slurm's allocation: an online job's `gres/gpu` indices and an
//! offline job's typed slot (`mfslot:g<i>`), both in squeue's
//! `gres_detail`. Partners appear by job ID only to a user; names and
//! owners only in the administrator's GPU view.

use std::collections::BTreeMap;

use serde::Serialize;

use muxflow::records::admin_comment::{key as admin_key, AdminComment};
use muxflow::records::published;
use muxflow::Mode;
use muxflow_matcher::reader::{
    expand_hostlist, has_state, parse_gres, slot_index, Names, SacctArray, SacctComment, SacctJob,
    SacctState, SacctTime, SinfoNode, SqueueJob,
};

use crate::{RunsBefore, Viewer};

/// A (node, GPU index).
pub type Gpu = (String, u32);

/// The muxflow jobs Slurm holds now: each one's mode and the GPUs it runs
/// on.
pub struct Live<'a> {
    all: &'a [SqueueJob],
    names: Names,
    jobs: Vec<(&'a SqueueJob, Mode, Vec<Gpu>)>,
}

impl<'a> Live<'a> {
    /// The muxflow jobs of `jobs` (`squeue --json`); `names` gives the
    /// offline slot's GRES name.
    pub fn new(all: &'a [SqueueJob], names: &Names) -> Live<'a> {
        let jobs = all
            .iter()
            .filter_map(|j| {
                let mode = AdminComment::parse(&j.admin_comment).ok()?.mode()?;
                Some((j, mode, gpus_of(j, mode, names)))
            })
            .collect();
        Live {
            all,
            names: names.clone(),
            jobs,
        }
    }

    fn running(&self) -> impl Iterator<Item = &(&'a SqueueJob, Mode, Vec<Gpu>)> {
        self.jobs
            .iter()
            .filter(|(j, _, _)| has_state(&j.job_state, "RUNNING"))
    }

    /// Running muxflow jobs on `gpu` other than `except`, of `mode`.
    fn on(&self, gpu: &Gpu, mode: Mode, except: u32) -> Vec<&'a SqueueJob> {
        self.running()
            .filter(|(j, m, gpus)| *m == mode && j.job_id != except && gpus.contains(gpu))
            .map(|(j, _, _)| *j)
            .collect()
    }

    /// Running job `id` and the jobs beside it on its GPUs now; None when
    /// Slurm does not run it as a muxflow job.
    pub fn running_job(&self, id: u32) -> Option<RunningReport> {
        let (job, mode, gpus) = self.running().find(|(j, _, _)| j.job_id == id)?;
        let ids = |mode: Mode| {
            let mut v: Vec<u32> = gpus
                .iter()
                .flat_map(|g| self.on(g, mode, id))
                .map(|j| j.job_id)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        Some(RunningReport {
            job_id: id,
            name: job.name.clone(),
            mode: mode.as_str(),
            gpus: gpus.iter().map(gpu_words).collect(),
            online_partners: ids(Mode::Online),
            offline_partners: ids(Mode::Offline),
            runs_before: AdminComment::parse(&job.admin_comment)
                .map(|c| RunsBefore::new(&c.runs_before()))
                .unwrap_or_default(),
        })
    }

    /// `viewer`'s own muxflow jobs now, oldest first.
    pub fn mine(&self, viewer: &Viewer) -> Vec<MineRow> {
        let mut rows: Vec<MineRow> = self
            .jobs
            .iter()
            .filter(|(j, _, _)| j.user_name == viewer.user)
            .filter(|(j, _, _)| {
                has_state(&j.job_state, "RUNNING") || has_state(&j.job_state, "PENDING")
            })
            .map(|(j, mode, gpus)| MineRow {
                job: display_id(j),
                job_id: j.job_id,
                name: j.name.clone(),
                mode: mode.as_str(),
                state: j.job_state.join(",").to_lowercase(),
                detail: self.detail(j, *mode, gpus),
            })
            .collect();
        rows.sort_by_key(|r| r.job_id);
        rows
    }

    /// Where a job runs and beside whom, or why it waits.
    fn detail(&self, j: &SqueueJob, mode: Mode, gpus: &[Gpu]) -> String {
        if has_state(&j.job_state, "RUNNING") {
            let place: Vec<String> = gpus.iter().map(gpu_words).collect();
            let other = match mode {
                Mode::Online => Mode::Offline,
                Mode::Offline => Mode::Online,
            };
            let mut beside: Vec<u32> = gpus
                .iter()
                .flat_map(|g| self.on(g, other, j.job_id))
                .map(|p| p.job_id)
                .collect();
            beside.sort_unstable();
            beside.dedup();
            let beside = match (mode, beside.is_empty()) {
                (Mode::Offline, true) => ", an idle GPU".to_string(),
                (Mode::Online, true) => ", no offline job beside it".to_string(),
                (Mode::Offline, false) => format!(", beside online job {}", list(&beside)),
                (Mode::Online, false) => format!(", offline jobs beside it: {}", list(&beside)),
            };
            return format!("on {}{beside}", place.join(" and "));
        }
        if mode == Mode::Online {
            return format!("pending ({}): an ordinary Slurm wait", j.state_reason);
        }
        let Ok(c) = AdminComment::parse(&j.admin_comment) else {
            return String::new();
        };
        if let Some(p) = c.placement() {
            return format!(
                "placed on {p}, Slurm starting it (its reason: {})",
                j.state_reason
            );
        }
        match c.waiting() {
            Some(w) => format!(
                "waiting since {}: {}",
                c.fields().get(admin_key::SINCE).map_or("-", String::as_str),
                w.words()
            ),
            None => "held until the matcher's next round".to_string(),
        }
    }

    /// One GPU as an administrator sees it: who shares it, who is placed
    /// on it and waits for Slurm to start, the offline jobs still waiting
    /// for any GPU, and whether it takes offline work (`nodes`: the node
    /// listing, for its published health).
    pub fn gpu(&self, gpu: &Gpu, nodes: &[SinfoNode], slots_per_gpu: u32) -> GpuReport {
        let who = |j: &SqueueJob| JobWho {
            job: display_id(j),
            user: j.user_name.clone(),
            name: j.name.clone(),
            reason: None,
        };
        let online: Vec<JobWho> = self.on(gpu, Mode::Online, 0).into_iter().map(who).collect();
        let offline: Vec<JobWho> = self
            .on(gpu, Mode::Offline, 0)
            .into_iter()
            .map(who)
            .collect();
        let pending = || {
            self.jobs
                .iter()
                .filter(|(j, m, _)| *m == Mode::Offline && has_state(&j.job_state, "PENDING"))
        };
        let placed_here: Vec<JobWho> = pending()
            .filter(|(j, _, _)| {
                AdminComment::parse(&j.admin_comment)
                    .ok()
                    .and_then(|c| c.placement())
                    .is_some_and(|p| placement_has(&p.to_string(), gpu))
            })
            .map(|(j, _, _)| JobWho {
                reason: Some(j.state_reason.clone()),
                ..who(j)
            })
            .collect();
        let mut parked: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (j, _, _) in pending() {
            let Ok(c) = AdminComment::parse(&j.admin_comment) else {
                continue;
            };
            if c.placement().is_some() {
                continue;
            }
            let why = c
                .waiting()
                .map_or("not looked at yet", |w| w.code())
                .to_string();
            parked.entry(why).or_default().push(display_id(j));
        }
        let node = nodes.iter().find(|n| n.name == gpu.0);
        let record = node.and_then(|n| {
            published::decode(&n.extra)
                .ok()?
                .into_iter()
                .find(|p| p.index == gpu.1)
        });
        // A GPU a job holds as gres/gpu without being muxflow's online job:
        // not muxflow's to share.
        let plain: Vec<JobWho> = self
            .all
            .iter()
            .filter(|j| has_state(&j.job_state, "RUNNING"))
            .filter(|j| AdminComment::parse(&j.admin_comment).is_err())
            .filter(|j| gpus_of(j, Mode::Online, &self.names).contains(gpu))
            .map(who)
            .collect();
        let health = record.as_ref().map(|r| r.state.to_string());
        let takes = match (&record, node) {
            (_, None) => format!("no node {} in Slurm's node list", gpu.0),
            (None, Some(_)) => format!(
                "node {} publishes no muxflow record for GPU {} (is muxflow-health running there? muxflow-doctor on the node says)",
                gpu.0, gpu.1
            ),
            (Some(_), Some(_)) if !plain.is_empty() => format!(
                "none: held by job {}, submitted without --muxflow (not shared)",
                plain.iter().map(|j| j.job.as_str()).collect::<Vec<_>>().join(", ")
            ),
            (Some(r), Some(_)) if r.state != muxflow::policy::health::HealthState::Healthy => {
                format!("no new offline work: the GPU is {}", r.state)
            }
            (Some(_), Some(_)) if offline.len() as u32 >= slots_per_gpu => format!(
                "no new offline work: its offline slots are taken ({} of {slots_per_gpu})",
                offline.len()
            ),
            (Some(_), Some(_)) => format!(
                "takes offline work: {} of {slots_per_gpu} offline slots free",
                slots_per_gpu - offline.len() as u32
            ),
        };
        GpuReport {
            node: gpu.0.clone(),
            index: gpu.1,
            health,
            takes_offline: takes,
            online,
            offline,
            placed_here,
            parked,
        }
    }
}

/// Pending job `id` (an array task: `task` of array `id`, split out or
/// still in the array's record) as a sacct record: Slurm's own state now,
/// where sacct may lag behind a fresh submission or the matcher's latest
/// reason by seconds. None when squeue holds no such pending job.
pub fn pending_record(jobs: &[SqueueJob], id: u32, task: Option<u32>) -> Option<SacctJob> {
    let pending = |j: &&SqueueJob| has_state(&j.job_state, "PENDING");
    let j = match task {
        None => jobs.iter().filter(pending).find(|j| j.job_id == id)?,
        Some(t) => jobs
            .iter()
            .filter(pending)
            .find(|j| {
                j.array_job_id == id && j.array_task_string.is_empty() && j.array_task_id == t
            })
            .or_else(|| {
                jobs.iter()
                    .filter(pending)
                    .find(|j| j.array_job_id == id && task_in(&j.array_task_string, t))
            })?,
    };
    Some(as_sacct(j, task))
}

/// Job `id` as squeue holds it now, in any state, as a sacct record; None
/// once Slurm forgot it.
pub fn current_record(jobs: &[SqueueJob], id: u32) -> Option<SacctJob> {
    jobs.iter()
        .find(|j| j.job_id == id)
        .map(|j| as_sacct(j, None))
}

/// squeue's record `j` as sacct's; `task` names the array task it stands
/// for where the record still holds several.
fn as_sacct(j: &SqueueJob, task: Option<u32>) -> SacctJob {
    SacctJob {
        job_id: j.job_id,
        name: j.name.clone(),
        user: j.user_name.clone(),
        state: SacctState {
            current: j.job_state.clone(),
        },
        comment: SacctComment {
            administrator: (!j.admin_comment.is_empty()).then(|| j.admin_comment.clone()),
        },
        time: SacctTime {
            end: 0,
            submission: j.submit_time,
        },
        array: SacctArray {
            job_id: j.array_job_id,
            task_id: (j.array_job_id != 0).then_some(task.unwrap_or(j.array_task_id)),
        },
    }
}

/// `listing` (sacct's records of job ID `job_id`, perhaps of other IDs too)
/// cut to the one record of the job meant: the latest. Where Slurm still
/// holds the job (`jobs`, from squeue) and sacct has not caught up with it
/// (a job that just started), its record now, lest an older job of the
/// same ID (IDs start over after a cluster's state is reset) stand for it.
pub fn keep_the_job(listing: &mut Vec<SacctJob>, jobs: &[SqueueJob], job_id: u32) {
    listing.retain(|j| j.job_id == job_id);
    let now = current_record(jobs, job_id);
    if let Some(now) = &now {
        if !listing
            .iter()
            .any(|j| j.time.submission >= now.time.submission)
        {
            listing.push(now.clone());
        }
    }
    latest_per_id(listing);
    // Slurm's owner where it still holds the job: 22.05's `sacct --json`
    // names none for a job without an association, and its first record of
    // a job root submitted with `--uid` names root (seen on the dev
    // cluster; a user was refused their own job).
    if let (Some(job), Some(now)) = (listing.first_mut(), now) {
        job.user = now.user;
    }
}

/// One record per job ID: the latest submission (a job ID comes back once a
/// cluster's state is reset; a requeue submits the job again), and of one
/// submission the running record, else the last to end.
pub fn latest_per_id(listing: &mut Vec<SacctJob>) {
    let recency = |j: &SacctJob| {
        (
            j.time.submission,
            match j.time.end {
                0 => u64::MAX,
                e => e,
            },
        )
    };
    listing.sort_by(|a, b| a.job_id.cmp(&b.job_id).then(recency(b).cmp(&recency(a))));
    listing.dedup_by_key(|j| j.job_id);
}

/// Is `task` in an array's task string (`1-7`, `1,3,5-7:2%2`)?
fn task_in(tasks: &str, task: u32) -> bool {
    let tasks = tasks.split('%').next().unwrap_or("");
    tasks.split(',').any(|item| {
        let (range, step) = item.split_once(':').unwrap_or((item, "1"));
        let step: u32 = step.parse().unwrap_or(1).max(1);
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        match (a.parse::<u32>(), b.parse::<u32>()) {
            (Ok(a), Ok(b)) => (a..=b).contains(&task) && (task - a).is_multiple_of(step),
            _ => false,
        }
    })
}

/// Does the placement text `node:g0,g1` name `gpu`?
fn placement_has(placed: &str, gpu: &Gpu) -> bool {
    placed.rsplit_once(':').is_some_and(|(node, list)| {
        node == gpu.0 && list.split(',').filter_map(slot_index).any(|i| i == gpu.1)
    })
}

/// The GPUs a running muxflow job holds: an online job's `gpu` indices,
/// an offline job's typed slots (`mfslot:g<i>`).
fn gpus_of(j: &SqueueJob, mode: Mode, names: &Names) -> Vec<Gpu> {
    if !has_state(&j.job_state, "RUNNING") {
        return Vec::new();
    }
    let mut out = Vec::new();
    // One gres_detail entry per node of the allocation.
    for (node, detail) in expand_hostlist(&j.nodes).iter().zip(&j.gres_detail) {
        for g in parse_gres(detail) {
            match mode {
                Mode::Online if g.name == "gpu" => {
                    out.extend(g.indices.iter().map(|i| (node.clone(), *i)));
                }
                Mode::Offline if g.name == names.offline_gres && g.count > 0 => {
                    if let Some(i) = g.kind.as_deref().and_then(slot_index) {
                        out.push((node.clone(), i));
                    }
                }
                _ => {}
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A job as its owner names it: `A_T` for an array task.
fn display_id(j: &SqueueJob) -> String {
    match (j.array_job_id, j.array_task_string.is_empty()) {
        (0, _) => j.job_id.to_string(),
        (a, true) => format!("{a}_{}", j.array_task_id),
        (a, false) => format!("{a}_[{}]", j.array_task_string),
    }
}

fn gpu_words(g: &Gpu) -> String {
    format!("{} GPU {}", g.0, g.1)
}

fn list(ids: &[u32]) -> String {
    ids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A running muxflow job and its partners now, by job ID.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunningReport {
    pub job_id: u32,
    pub name: String,
    pub mode: &'static str,
    /// "node3 GPU 0"…
    pub gpus: Vec<String>,
    /// Online jobs on its GPUs now.
    pub online_partners: Vec<u32>,
    /// Offline jobs on its GPUs now (for an offline job: its peers).
    pub offline_partners: Vec<u32>,
    /// A requeued job's runs before this one.
    pub runs_before: RunsBefore,
}

impl std::fmt::Display for RunningReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "job {} ({}), {} muxflow job, running",
            self.job_id,
            muxflow::text::printable(&self.name),
            self.mode
        )?;
        writeln!(
            f,
            "  runs on          {}{}",
            self.gpus.join(", "),
            self.runs_before.this_run()
        )?;
        match self.mode {
            "online" if self.offline_partners.is_empty() => {
                writeln!(f, "  shared now with  no offline job")?
            }
            "online" => writeln!(
                f,
                "  shared now with  offline job{} {} (running)",
                if self.offline_partners.len() > 1 {
                    "s"
                } else {
                    ""
                },
                list(&self.offline_partners)
            )?,
            _ => {
                if self.online_partners.is_empty() {
                    writeln!(f, "  shared now with  no online job (an idle GPU)")?;
                } else {
                    writeln!(
                        f,
                        "  shared now with  online job {}",
                        list(&self.online_partners)
                    )?;
                }
                if !self.offline_partners.is_empty() {
                    writeln!(
                        f,
                        "  and with         offline job{} {}",
                        if self.offline_partners.len() > 1 {
                            "s"
                        } else {
                            ""
                        },
                        list(&self.offline_partners)
                    )?;
                }
            }
        }
        writeln!(
            f,
            "  figures          written when its batch step ends: run muxflow-report {} then",
            self.job_id
        )?;
        self.runs_before.write(f)
    }
}

/// One of a user's muxflow jobs now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MineRow {
    /// As the user names it (`A_T` for an array task).
    pub job: String,
    #[serde(skip)]
    pub job_id: u32,
    pub name: String,
    pub mode: &'static str,
    pub state: String,
    /// Where it runs and beside whom, or why it waits.
    pub detail: String,
}

/// `--mine` as text: one line per job.
pub fn mine_text(rows: &[MineRow]) -> String {
    if rows.is_empty() {
        return "no muxflow job of yours is pending or running\n".to_string();
    }
    let w = rows.iter().map(|r| r.job.len()).max().unwrap_or(5).max(5);
    let mut out = format!(
        "{:<w$}  {:<8} {:<8} {:<16} WHERE, OR WHY IT WAITS\n",
        "JOBID", "MODE", "STATE", "NAME"
    );
    for r in rows {
        out += &format!(
            "{:<w$}  {:<8} {:<8} {:<16} {}\n",
            r.job,
            r.mode,
            r.state,
            muxflow::text::printable(&r.name),
            r.detail
        );
    }
    out
}

/// A job in the GPU view: who and what.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobWho {
    pub job: String,
    pub user: String,
    pub name: String,
    /// A placed job's Slurm reason (why it has not started yet).
    pub reason: Option<String>,
}

/// One GPU, for an administrator.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuReport {
    pub node: String,
    pub index: u32,
    /// Its health state as the node publishes it.
    pub health: Option<String>,
    /// Whether the matcher may place offline work there, and why not.
    pub takes_offline: String,
    pub online: Vec<JobWho>,
    pub offline: Vec<JobWho>,
    /// Offline jobs placed on it that Slurm has yet to start.
    pub placed_here: Vec<JobWho>,
    /// Offline jobs waiting for any GPU, by the matcher's reason.
    pub parked: BTreeMap<String, Vec<String>>,
}

impl std::fmt::Display for GpuReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = |j: &JobWho| {
            format!(
                "job {} ({}, {}){}",
                j.job,
                muxflow::text::printable(&j.user),
                muxflow::text::printable(&j.name),
                j.reason
                    .as_ref()
                    .map_or_else(String::new, |r| format!(": Slurm's reason {r}"))
            )
        };
        writeln!(f, "{} GPU {}", self.node, self.index)?;
        writeln!(
            f,
            "  health           {}",
            self.health.as_deref().unwrap_or("unknown")
        )?;
        writeln!(f, "  offline work     {}", self.takes_offline)?;
        let section = |f: &mut std::fmt::Formatter<'_>, title: &str, jobs: &[JobWho]| {
            if jobs.is_empty() {
                return writeln!(f, "  {title:<16} none");
            }
            for (k, j) in jobs.iter().enumerate() {
                let t = if k == 0 { title } else { "" };
                writeln!(f, "  {t:<16} {}", who(j))?;
            }
            Ok(())
        };
        section(f, "online", &self.online)?;
        section(f, "offline", &self.offline)?;
        section(f, "placed, starting", &self.placed_here)?;
        if self.parked.is_empty() {
            writeln!(f, "  waiting for any  none")?;
        }
        for (k, (why, jobs)) in self.parked.iter().enumerate() {
            let t = if k == 0 { "waiting for any" } else { "" };
            writeln!(
                f,
                "  {t:<16} {why}: job{} {}",
                if jobs.len() > 1 { "s" } else { "" },
                jobs.join(", ")
            )?;
        }
        Ok(())
    }
}

/// `NODE:INDEX` (also `NODE:gINDEX`, as placements write it).
pub fn parse_gpu(s: &str) -> Result<Gpu, String> {
    let bad = || format!("'{s}' is not a GPU: give NODE:INDEX, e.g. node3:0");
    let (node, index) = s.rsplit_once(':').ok_or_else(bad)?;
    let index = index.strip_prefix('g').unwrap_or(index);
    if node.is_empty() {
        return Err(bad());
    }
    Ok((node.to_string(), index.parse().map_err(|_| bad())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow_matcher::reader::{parse_sinfo, parse_squeue};

    fn names() -> Names {
        Names {
            offline_gres: "mfslot".into(),
        }
    }

    /// node1 GPU 0: bob's service 1 with alice's offline job 2 and bob's 3;
    /// GPU 1: a plain job 4; alice's 5 parked, 6 placed on GPU 0, 7 an
    /// array task waiting; bob's 8 not looked at yet.
    fn squeue() -> Vec<SqueueJob> {
        parse_squeue(
            r#"{"jobs": [
            {"job_id": 1, "name": "svc", "user_name": "bob", "job_state": "RUNNING", "nodes": "node1",
             "admin_comment": "muxflow:v1 mode=online", "gres_detail": ["gpu:1(IDX:0)"]},
            {"job_id": 2, "name": "train", "user_name": "alice", "job_state": "RUNNING", "nodes": "node1",
             "admin_comment": "muxflow:v1 mode=offline placed=node1:g0", "gres_detail": ["mfslot:g0:1(IDX:0)"]},
            {"job_id": 3, "name": "tune", "user_name": "bob", "job_state": "RUNNING", "nodes": "node1",
             "admin_comment": "muxflow:v1 mode=offline placed=node1:g0", "gres_detail": ["mfslot:g0:1(IDX:1)"]},
            {"job_id": 4, "name": "plain", "user_name": "carol", "job_state": "RUNNING", "nodes": "node1",
             "admin_comment": "", "gres_detail": ["gpu:1(IDX:1)"]},
            {"job_id": 5, "name": "train", "user_name": "alice", "job_state": "PENDING", "state_reason": "JobHeldAdmin",
             "admin_comment": "muxflow:v1 mode=offline waiting=free_gpu since=2026-11-23T12:14:05 rounds_every=60s"},
            {"job_id": 6, "name": "train", "user_name": "alice", "job_state": "PENDING", "state_reason": "Resources",
             "admin_comment": "muxflow:v1 mode=offline placed=node1:g0"},
            {"job_id": 9, "name": "sweep", "user_name": "alice", "job_state": "PENDING", "state_reason": "JobHeldAdmin",
             "array_job_id": 7, "array_task_id": 3,
             "admin_comment": "muxflow:v1 mode=offline waiting=older_jobs_first since=2026-11-23T12:15:00 rounds_every=60s"},
            {"job_id": 8, "name": "eval", "user_name": "bob", "job_state": "PENDING", "state_reason": "JobHeldUser",
             "admin_comment": "muxflow:v1 mode=offline"}
            ]}"#,
        )
        .unwrap()
    }

    fn nodes(state: &str) -> Vec<SinfoNode> {
        parse_sinfo(&format!(
            r#"{{"nodes": [{{"name": "node1", "state": "mixed",
            "extra": "muxflow:v1 gpu0.state={state} gpu0.mem_mib=16000 gpu1.state=healthy gpu1.mem_mib=16000"}}]}}"#
        ))
        .unwrap()
    }

    fn viewer(user: &str) -> Viewer {
        Viewer {
            user: user.into(),
            admin: false,
        }
    }

    #[test]
    fn a_running_jobs_partners_now_are_the_jobs_on_its_gpus() {
        let jobs = squeue();
        let live = Live::new(&jobs, &names());
        let online = live.running_job(1).unwrap();
        assert_eq!(online.offline_partners, [2, 3]);
        assert_eq!(online.gpus, ["node1 GPU 0"]);
        let text = online.to_string();
        assert!(
            text.contains("shared now with  offline jobs 2, 3 (running)"),
            "{text}"
        );
        let offline = live.running_job(2).unwrap();
        assert_eq!(
            (
                offline.online_partners.as_slice(),
                offline.offline_partners.as_slice()
            ),
            (&[1][..], &[3][..])
        );
        assert!(
            !offline.to_string().contains("(run ") && !offline.to_string().contains("  run 1"),
            "{offline}"
        );
        // Placed again after a requeue: its earlier run with it.
        let mut jobs = squeue();
        jobs[1].admin_comment.push_str(
            " runs_before=1 run1.node=node2 run1.gpu=1 run1.run_s=7 run1.requeued=1 run1.partner=90",
        );
        let text = Live::new(&jobs, &names())
            .running_job(2)
            .unwrap()
            .to_string();
        for want in [
            "runs on          node1 GPU 0 (run 2)",
            "run 1            7 s on node2 GPU 1, requeued for online job 90:",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        // Pending, or not muxflow's: no running report.
        assert!(live.running_job(5).is_none());
        assert!(live.running_job(4).is_none());
    }

    #[test]
    fn mine_lists_the_users_own_jobs_where_they_run_or_why_they_wait() {
        let jobs = squeue();
        let rows = Live::new(&jobs, &names()).mine(&viewer("alice"));
        let by_job: BTreeMap<&str, &str> = rows
            .iter()
            .map(|r| (r.job.as_str(), r.detail.as_str()))
            .collect();
        assert_eq!(
            by_job.keys().copied().collect::<Vec<_>>(),
            ["2", "5", "6", "7_3"]
        );
        assert_eq!(by_job["2"], "on node1 GPU 0, beside online job 1");
        assert!(
            by_job["5"].starts_with("waiting since 2026-11-23T12:14:05: waiting for a Healthy GPU")
        );
        assert_eq!(
            by_job["6"],
            "placed on node1:g0, Slurm starting it (its reason: Resources)"
        );
        assert!(by_job["7_3"].contains("waiting behind other held offline jobs"));
        // Nothing of bob's, not even his job's name beside hers.
        let text = mine_text(&rows);
        assert!(!text.contains("tune") && !text.contains("svc"), "{text}");
        let none = Live::new(&jobs, &names()).mine(&viewer("dave"));
        assert!(mine_text(&none).starts_with("no muxflow job of yours"));
    }

    #[test]
    fn the_gpu_view_says_who_shares_who_starts_who_waits_and_why() {
        let jobs = squeue();
        let live = Live::new(&jobs, &names());
        let g = live.gpu(&("node1".into(), 0), &nodes("healthy"), 2);
        let ids = |v: &[JobWho]| v.iter().map(|j| j.job.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&g.online), ["1"]);
        assert_eq!(ids(&g.offline), ["2", "3"]);
        assert_eq!(ids(&g.placed_here), ["6"]);
        assert_eq!(g.placed_here[0].reason.as_deref(), Some("Resources"));
        assert_eq!(g.parked["free_gpu"], ["5"]);
        assert_eq!(g.parked["older_jobs_first"], ["7_3"]);
        assert_eq!(g.parked["not looked at yet"], ["8"]);
        assert!(
            g.takes_offline.contains("offline slots are taken (2 of 2)"),
            "{g:?}"
        );
        let text = g.to_string();
        assert!(text.contains("job 1 (bob, svc)"), "{text}");
        // Why a GPU takes no offline work, case by case.
        let cases = [
            (
                "one slot free",
                nodes("healthy"),
                3,
                ("node1", 0),
                "takes offline work: 1 of 3",
            ),
            (
                "unhealthy",
                nodes("overloaded"),
                3,
                ("node1", 0),
                "the GPU is overloaded",
            ),
            (
                "a plain job's",
                nodes("healthy"),
                1,
                ("node1", 1),
                "held by job 4, submitted without --muxflow",
            ),
            (
                "no record",
                nodes("healthy"),
                1,
                ("node1", 5),
                "publishes no muxflow record for GPU 5",
            ),
            (
                "no node",
                nodes("healthy"),
                1,
                ("node9", 0),
                "no node node9",
            ),
        ];
        for (name, nodes, slots, (node, i), says) in cases {
            let g = live.gpu(&(node.to_string(), i), &nodes, slots);
            assert!(
                g.takes_offline.contains(says),
                "{name}: {}",
                g.takes_offline
            );
        }
    }

    #[test]
    fn a_pending_job_or_array_task_is_read_from_squeue() {
        let mut jobs = squeue();
        jobs.extend(
            parse_squeue(
                r#"{"jobs": [{"job_id": 20, "name": "grid", "user_name": "alice", "job_state": "PENDING",
                "array_job_id": 20, "array_task_string": "1-5:2%2", "submit_time": 1700000000,
                "admin_comment": "muxflow:v1 mode=offline"}]}"#,
            )
            .unwrap(),
        );
        let r = pending_record(&jobs, 5, None).unwrap();
        assert_eq!((r.job_id, r.user.as_str()), (5, "alice"));
        assert!(r
            .comment
            .administrator
            .unwrap()
            .contains("waiting=free_gpu"));
        // Split out: the task's own record.
        let r = pending_record(&jobs, 7, Some(3)).unwrap();
        assert_eq!((r.job_id, r.array.task_id), (9, Some(3)));
        // Not split yet: the array's record stands for tasks it holds.
        let r = pending_record(&jobs, 20, Some(3)).unwrap();
        assert_eq!(
            (r.job_id, r.array.task_id, r.time.submission),
            (20, Some(3), 1_700_000_000)
        );
        for (task, held) in [(1, true), (5, true), (2, false), (7, false)] {
            assert_eq!(
                pending_record(&jobs, 20, Some(task)).is_some(),
                held,
                "task {task}"
            );
        }
        // Running, or unknown: not pending.
        assert!(pending_record(&jobs, 2, None).is_none());
        assert!(pending_record(&jobs, 99, None).is_none());
    }

    #[test]
    fn a_reused_job_id_is_the_job_slurm_holds_now() {
        let sacct = |user: &str, submission: u64, end: u64| SacctJob {
            job_id: 250,
            user: user.into(),
            time: SacctTime { end, submission },
            ..SacctJob::default()
        };
        let now = parse_squeue(
            r#"{"jobs": [{"job_id": 250, "name": "train", "user_name": "nobody",
            "job_state": "RUNNING", "submit_time": 1700000500}]}"#,
        )
        .unwrap();
        // sacct lags: it holds only an older job 250 (root's, from before a
        // state reset, its end never recorded).
        let mut listing = vec![sacct("root", 1_700_000_000, 0)];
        keep_the_job(&mut listing, &now, 250);
        assert_eq!(listing.len(), 1);
        assert_eq!(listing[0].user, "nobody");
        // Caught up: sacct's record of this submission, not squeue's.
        let mut listing = vec![
            sacct("root", 1_700_000_000, 0),
            sacct("nobody", 1_700_000_500, 0),
        ];
        listing[1].name = "from sacct".into();
        keep_the_job(&mut listing, &now, 250);
        assert_eq!(listing.len(), 1);
        assert_eq!(listing[0].name, "from sacct");
        // ... that names no owner, or root for a job root submitted with
        // --uid: Slurm's owner.
        for user in ["", "root"] {
            let mut listing = vec![sacct(user, 1_700_000_500, 0)];
            keep_the_job(&mut listing, &now, 250);
            assert_eq!(listing[0].user, "nobody");
        }
        // Forgotten by Slurm: the latest submission; of one submission
        // (requeued runs) the running record, else the last to end.
        let mut listing = vec![
            sacct("nobody", 1_700_000_500, 1_700_000_600),
            sacct("root", 1_700_000_000, 0),
            sacct("nobody", 1_700_000_500, 1_700_000_900),
        ];
        keep_the_job(&mut listing, &[], 250);
        assert_eq!(listing.len(), 1);
        assert_eq!(
            (listing[0].user.as_str(), listing[0].time.end),
            ("nobody", 1_700_000_900)
        );
    }

    #[test]
    fn a_gpu_is_named_node_colon_index() {
        assert_eq!(parse_gpu("node3:0"), Ok(("node3".into(), 0)));
        assert_eq!(parse_gpu("node3:g1"), Ok(("node3".into(), 1)));
        for bad in ["node3", ":0", "node3:x", "node3:-1"] {
            let e = parse_gpu(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("NODE:INDEX"), "{e}");
        }
    }
}
