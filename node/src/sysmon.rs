//! SysMonitor: one step of every GPU's health state machine.
//!
//! Each Prolog, Epilog and health check calls [`step`]: NVML is read once
//! (no wait: SM activity comes from the node's sampler, [`crate::sampler`],
//! which the step starts when none runs), the MPS logs are scanned from
//! where the last step stopped, the error detector's rules are applied and
//! their actions carried out, the state machine ([`muxflow::policy::health::Fsm`])
//! is stepped, and the result is persisted per GPU under the GPU's lock:
//!
//! ```text
//! <state_dir>/gpu<i>/state         health word (xCUDA reads it)
//! <state_dir>/gpu<i>/record.json   FSM, metric history, solo figures, log cursors, counters
//! ```
//!
//! The records themselves are [`crate::record`]'s; then the node's GPUs are
//! published to slurmctld ([`crate::publish`]).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use muxflow::node::mps::MpsDaemon;
use muxflow::node::state::{write_atomic, GpuLock, JobRecord, NodeState};
use muxflow::policy::health::{Input, Why};
use muxflow::policy::share::GpuFacts;
use muxflow::{Config, Mode};

use crate::detector::{self, Action, Observation};
use crate::nvml::{self, GpuRead, Reading};
pub use crate::record::{load_record, record_path, space_note, GpuRecord, Sample, Solo, Trigger};
use crate::JobEnv;

fn save_record(ns: &NodeState, lock: &GpuLock, gpu: u32, r: &GpuRecord) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(r)?;
    write_atomic(&record_path(ns, gpu), &bytes)?;
    // What the plugin's SM and memory policies read when an offline job starts.
    // (The MPS mode is not among the facts: false is never read here.)
    let p = r.published(gpu, false);
    let facts = GpuFacts {
        online_solo_sm_pct: p.solo_sm_pct,
        online_mem_mib: p.online_mem_mib,
        mem_total_mib: (p.mem_mib > 0).then_some(p.mem_mib),
        power_limit_w: p.power_w,
    };
    if ns.facts(gpu).ok() != Some(facts) {
        ns.set_facts(lock, gpu, &facts)?;
    }
    Ok(())
}

pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The node this program runs for. slurmd sets SLURMD_NODENAME for the
/// Prolog, Epilog and HealthCheckProgram (checked on 22.05), which also
/// tells several `slurmd -N` on one host apart.
pub fn node_name(env: &JobEnv) -> anyhow::Result<String> {
    env.node
        .clone()
        .filter(|n| !n.is_empty())
        .context("SLURMD_NODENAME is not set: run this from slurmd, or set it to the node name")
}

/// `muxflow-health --report`: one step (publishing, no drain), then one
/// line per problem the node's GPUs have — what muxflow would drain for —
/// for the caller (NHC) to act on. Empty: healthy.
pub fn report(config: &Config, env: &JobEnv) -> anyhow::Result<Vec<String>> {
    step(config, env, Trigger::HealthReport)?;
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let mut problems = Vec::new();
    for gpu in ns.gpus()? {
        if load_record(&ns, gpu)?.is_some_and(|r| r.lost) {
            problems.push(format!("gpu{gpu} lost (NVML: GPU is lost)"));
        }
    }
    Ok(problems)
}

/// One step for every GPU of the node, then publishing.
pub fn step(config: &Config, env: &JobEnv, trigger: Trigger) -> anyhow::Result<()> {
    // `config` comes from run_contained with `{node}` already expanded.
    let node = node_name(env)?;
    let started = crate::sampler::ensure(config, &node).is_some();
    let watch = match trigger {
        Trigger::HealthCheck | Trigger::HealthReport => {
            Duration::from_millis(config.health.xid_watch_ms)
        }
        _ => Duration::ZERO,
    };
    let mut telemetry = nvml::read(
        config.paths.nvml_library.as_ref().map(|p| p.as_path()),
        watch,
    );
    if let Ok(t) = &mut telemetry {
        add_sm_activity(config, t, started);
        add_kernel_log_xids(config, t);
        if trigger.is_health_check() {
            // Before the step, so a GPU freed here is stepped as free. A
            // job with a process on a GPU is not gone, whatever Slurm says.
            let on_gpus = t
                .gpus
                .iter()
                .filter_map(|(_, read)| match read {
                    GpuRead::Ok(r) => Some(r.processes.iter()),
                    _ => None,
                })
                .flatten()
                .filter_map(|p| process_job(p.pid).0)
                .collect();
            let now = std::time::SystemTime::now();
            if let Err(e) = crate::job::forget_gone_jobs(config, &node, now, &on_gpus) {
                tracing::warn!(%node, "looking for jobs whose Epilog never ran: {e:#}");
            }
            crate::police::restart_watchers(&NodeState::new(config.paths.state_dir.as_path()));
        }
    }
    let stepped = step_with(config, &node, trigger, telemetry, now_s());
    // Whatever the step did, the figures show the node as it is now.
    crate::metrics::publish(
        config,
        &NodeState::new(config.paths.state_dir.as_path()),
        &node,
    );
    stepped?;
    Ok(())
}

/// Adds each GPU's SM activity from the sampler's page. Without a fresh
/// page (a cold node: the sampler was started just now; a GPU without GPM)
/// the step decides on utilization, clock and memory, and says why.
fn add_sm_activity(config: &Config, t: &mut nvml::Telemetry, sampler_started: bool) {
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let now = muxflow::records::sm_page::now_ms();
    for (gpu, read) in &mut t.gpus {
        let GpuRead::Ok(r) = read else { continue };
        match muxflow::records::sm_page::read(&crate::sampler::page_path(&ns, *gpu), 0, now) {
            Ok(pct) => r.metrics.sm_activity_pct = Some(pct),
            Err(muxflow::records::sm_page::NoReading::Unsupported) => {
                tracing::debug!(gpu, "the GPU gives no SM activity")
            }
            Err(why) => tracing::info!(
                gpu,
                "{why}{}; deciding on utilization, clock and memory",
                if sampler_started {
                    " (the sampler was started just now)"
                } else {
                    ""
                }
            ),
        }
    }
}

/// Adds the Xids the driver logged since the previous run (see
/// [`crate::kmsg`]); one already delivered as an NVML event in this run is
/// not counted twice.
fn add_kernel_log_xids(config: &Config, t: &mut nvml::Telemetry) {
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let logged = match crate::kmsg::new_xids(&ns, config.paths.kernel_log.as_path()) {
        Ok(x) => x,
        Err(e) => {
            // No kernel log (a container, a restricted dmesg): NVML events remain.
            tracing::debug!("{e}");
            return;
        }
    };
    let mut from_events = t.xids.clone();
    for k in logged {
        let Some(&(gpu, _)) = t.pci.iter().find(|(_, p)| *p == k.pci) else {
            tracing::debug!(?k, "Xid of a PCI device that is no GPU here");
            continue;
        };
        tracing::info!(gpu, xid = k.xid, seq = k.seq, "Xid in the kernel log");
        if let Some(i) = from_events.iter().position(|e| *e == (gpu, k.xid)) {
            from_events.swap_remove(i);
        } else {
            t.xids.push((gpu, k.xid));
        }
    }
}

/// [`step`] after the NVML read (the tests feed their own readings).
pub fn step_with(
    config: &Config,
    node: &str,
    trigger: Trigger,
    telemetry: Result<nvml::Telemetry, nvml::ReadError>,
    now: u64,
) -> anyhow::Result<()> {
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let telemetry = match telemetry {
        Ok(t) => t,
        Err(e) => {
            // NVML itself fails: every GPU this node has seen gets the failure.
            tracing::warn!(%node, "{e}");
            nvml::Telemetry {
                gpus: ns
                    .gpus()?
                    .into_iter()
                    .map(|g| (g, GpuRead::Failed(e.to_string())))
                    .collect(),
                xids: Vec::new(),
                pci: Vec::new(),
            }
        }
    };
    // This step's records: published even when the state directory cannot
    // keep them (full), so slurmctld still sees the GPUs' current states.
    let mut stepped = BTreeMap::new();
    for (gpu, read) in &telemetry.gpus {
        let xids = telemetry
            .xids
            .iter()
            .filter(|(g, _)| g == gpu)
            .map(|(_, x)| *x);
        match step_gpu(config, &ns, *gpu, read, xids, now) {
            Ok(rec) => {
                stepped.insert(*gpu, rec);
            }
            // One GPU's trouble must not stop the others' steps.
            Err(e) => tracing::error!(%node, gpu, "health step: {e:#}{}", space_note(&ns)),
        }
    }
    if let Err(e) = crate::publish::publish(config, &ns, node, trigger, now, &stepped) {
        tracing::warn!(%node, "publishing GPU states failed (retried next step): {e:#}");
    }
    Ok(())
}

/// One GPU's step; returns its new record, also when it could not be saved.
fn step_gpu(
    config: &Config,
    ns: &NodeState,
    gpu: u32,
    read: &GpuRead,
    xids: impl Iterator<Item = u64>,
    now: u64,
) -> anyhow::Result<GpuRecord> {
    let lock = ns.lock_gpu(gpu)?;
    let mut rec = match load_record(ns, gpu) {
        Ok(Some(r)) => r,
        Ok(None) => GpuRecord::new(now),
        Err(e) => {
            // A corrupt record is replaced; the history restarts.
            tracing::warn!(gpu, "{e:#}; starting a fresh record");
            GpuRecord::new(now)
        }
    };
    let mps = MpsDaemon::for_gpu(config, gpu);
    let jobs = ns.jobs(gpu)?;
    police_daemon(config, &mps, gpu, &jobs, &mut rec);

    let mut obs: Vec<Observation> = xids.map(Observation::Xid).collect();
    match read {
        GpuRead::Ok(_) => {}
        GpuRead::Lost => obs.push(Observation::Lost),
        GpuRead::Failed(what) => obs.push(Observation::NvmlFailure(what.clone())),
    }
    for line in scan_log(mps.log_dir(), "server.log", &mut rec.log_offsets) {
        if let Some(notice) = detector::server_notice(&line) {
            obs.push(Observation::MpsServer(notice.to_string()));
        }
    }
    notice_foreign_commands(ns, &mps, gpu, &jobs, &mut rec);
    let matches = detector::classify(&obs);
    for (rule, o) in &matches {
        tracing::warn!(gpu, rule = rule.name, observation = ?o, "fault detected");
        rec.count(&format!("rule.{}", rule.name));
        rec.last_fault = Some(format!("{} at {now}", rule.name));
    }
    let actions = detector::actions(&matches);

    let reading = match read {
        GpuRead::Ok(r) => Some(r),
        _ => None,
    };
    let (fsm, why) = rec.fsm().step(
        &Input {
            now_s: now,
            metrics: reading.map(|r| r.metrics),
            fault: actions.contains(&Action::MarkFaulty),
            offline_only: offline_only(&jobs),
        },
        &config.health,
    );
    if fsm.state != rec.fsm().state {
        tracing::info!(gpu, from = %rec.fsm().state, to = %fsm.state, ?why, "GPU health changed");
        rec.count(&format!("enter.{}", fsm.state));
    } else if why == Why::Fault {
        tracing::debug!(gpu, "still faulty");
    }
    rec.state = fsm.state.to_string();
    rec.since_s = fsm.since_s;
    rec.lost = matches!(read, GpuRead::Lost);

    for action in &actions {
        let done = match action {
            Action::MarkFaulty => Ok(true),
            Action::EvictOffline => evict_offline(&mps, ns, gpu, &jobs).map(|n| n > 0),
            Action::RestartMpsIfNoOnline => restart_mps(config, &mps, ns, gpu, &jobs),
            // Carried out node-wide by publish, from the persisted `lost`.
            Action::DrainNode => Ok(true),
        };
        match done {
            Ok(true) => {
                tracing::warn!(gpu, action = %action, "error-handling action taken");
                rec.count(&format!("action.{action}"));
            }
            Ok(false) => tracing::info!(gpu, action = %action, "nothing to do"),
            Err(e) => {
                tracing::error!(gpu, action = %action, "action failed: {e:#}");
                rec.count(&format!("action_failed.{action}"));
            }
        }
    }

    // After any restart above: a daemon started again may have made its
    // pipe directory afresh, open to every user.
    crate::job::admit_recorded_users(config, ns, &lock, gpu);
    if let Some(r) = reading {
        for t in crate::police::police_gpu(config, ns, &mps, gpu, &r.processes) {
            rec.count(&format!("policed.{}", t.verdict.code));
        }
        record_sample(&mut rec, r, &jobs, now, config.health.history_len);
    }
    // A full state directory must not stop the step: the state is still
    // published, and the failure logged with its path.
    if let Err(e) = save_record(ns, &lock, gpu, &rec) {
        tracing::error!(gpu, "cannot save the GPU record: {e:#}{}", space_note(ns));
    }
    if ns.health(gpu).ok().flatten() != Some(fsm.state) {
        if let Err(e) = ns.set_health(&lock, gpu, fsm.state) {
            tracing::error!(gpu, "cannot write the health word: {e}{}", space_note(ns));
        }
    }
    Ok(rec)
}

/// The default SM share muxflow's daemons run with: started with a clean
/// environment, NVIDIA's default.
const DAEMON_DEFAULT_THREAD_PCT: f64 = 100.0;

/// The GPU's MPS control daemon, checked on every step while muxflow jobs
/// are recorded on the GPU. A daemon that is gone (killed, crashed) is
/// started again at once, so the jobs' next CUDA processes get MPS and
/// their limits, rather than at the next job's Prolog. The daemon accepts
/// commands from every user who can reach its socket (and every job user
/// must, to be a client), so what a command can change for later clients
/// is put back: the default active thread percentage.
fn police_daemon(
    config: &Config,
    mps: &MpsDaemon,
    gpu: u32,
    jobs: &[JobRecord],
    rec: &mut GpuRecord,
) {
    if jobs.is_empty() {
        return;
    }
    match mps.send("get_default_active_thread_percentage") {
        Err(e) => {
            tracing::error!(
                gpu,
                jobs = jobs.len(),
                "the MPS control daemon is gone ({e}); starting it again for the muxflow jobs on the GPU"
            );
            let start = crate::job::daemon_to_start(config, gpu);
            match start.ensure_running(|| crate::gpu_caps::device_facts(config, gpu)) {
                Ok(_) => {
                    tracing::warn!(gpu, "MPS control daemon restarted");
                    let state = NodeState::new(config.paths.state_dir.as_path());
                    crate::job::restore_namespaces(config, &state, gpu);
                    rec.count("action.restart_mps_daemon");
                }
                Err(e) => {
                    tracing::error!(gpu, "cannot restart the MPS control daemon: {e}");
                    rec.count("action_failed.restart_mps_daemon");
                }
            }
        }
        Ok(v) if v.trim().parse::<f64>().ok() != Some(DAEMON_DEFAULT_THREAD_PCT) => {
            tracing::warn!(
                gpu,
                value = %v.trim(),
                "the MPS default active thread percentage was changed through the control socket; putting back {DAEMON_DEFAULT_THREAD_PCT}"
            );
            let cmd = format!("set_default_active_thread_percentage {DAEMON_DEFAULT_THREAD_PCT}");
            match mps.send(&cmd) {
                Ok(_) => rec.count("policed.default_active_thread_percentage"),
                Err(e) => tracing::error!(gpu, "{cmd}: {e}"),
            }
        }
        Ok(_) => {}
    }
}

/// Only offline jobs are recorded on the GPU: an idle GPU that took
/// offline work (its load is theirs, see [`Input::offline_only`]).
pub fn offline_only(jobs: &[JobRecord]) -> bool {
    jobs.iter().any(|j| j.mode == Mode::Offline) && jobs.iter().all(|j| j.mode == Mode::Offline)
}

/// Appends a sample and updates the solo figures.
fn record_sample(rec: &mut GpuRecord, r: &Reading, jobs: &[JobRecord], now: u64, keep: usize) {
    let modes: Vec<Option<Mode>> = r
        .processes
        .iter()
        .map(|p| process_mode(p.pid, jobs))
        .collect();
    let registered = |m: Mode| jobs.iter().filter(|j| j.mode == m).count() as u32;
    let running = |m: Mode| modes.iter().filter(|x| **x == Some(m)).count() as u32;
    let online = registered(Mode::Online).max(running(Mode::Online));
    let offline = registered(Mode::Offline).max(running(Mode::Offline));
    let solo = online > 0 && offline == 0;
    rec.mem_total_mib = r.mem_total_mib;
    rec.power_limit_w = r.power_limit_w.or(rec.power_limit_w);
    rec.offline = offline;
    rec.history.push_back(Sample {
        t_s: now,
        util_pct: r.metrics.utilization_pct,
        sm_pct: r.metrics.sm_activity_pct,
        clock_frac: r.metrics.sm_clock_fraction,
        mem_used_mib: r.mem_used_mib,
        mem_total_mib: r.mem_total_mib,
        online,
        offline,
        solo,
    });
    while rec.history.len() > keep {
        rec.history.pop_front();
    }
    if solo {
        let ids: Vec<u32> = jobs
            .iter()
            .filter(|j| j.mode == Mode::Online)
            .map(|j| j.job_id)
            .collect();
        rec.solo = Some(Solo::next(
            rec.solo.take(),
            ids,
            &r.metrics,
            r.mem_used_mib,
            now,
        ));
    }
}

/// The process is gone or a zombie: it holds nothing a restart could break
/// (and its environment can no longer be read).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// The mode of the job a process belongs to, looked up in the GPU's
/// registry. The job comes from [`muxflow::node::jobproc`] (the job cgroup or the
/// root slurmstepd ancestor), never from the process's environment, which
/// its user controls. Only a root process outside any job (an admin's tool,
/// a test) is taken at its word: its SLURM_JOB_ID, else the mode in its
/// environment. None when nothing says (treated as possibly online).
pub fn process_mode(pid: u32, jobs: &[JobRecord]) -> Option<Mode> {
    let (job_id, mode) = process_job(pid);
    job_id
        .and_then(|id| jobs.iter().find(|j| j.job_id == id).map(|j| j.mode))
        .or(mode)
}

/// The job process `pid` belongs to and the muxflow mode it says it runs
/// in: the job from its slurmstepd ancestry or cgroup; from the environment
/// only for a root process (a user's environment is the user's to write).
pub fn process_job(pid: u32) -> (Option<u32>, Option<Mode>) {
    let procfs = muxflow::node::jobproc::Procfs::default();
    if let Some(job) = procfs.job_of(pid) {
        return (Some(job), None);
    }
    let Ok(status) = std::fs::read_to_string(procfs.path(pid, "status")) else {
        return (None, None);
    };
    if muxflow::node::jobproc::real_uid(&status) != Some(0) {
        return (None, None);
    }
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return (None, None);
    };
    let mut job_id = None;
    let mut mode = None;
    for var in environ.split(|b| *b == 0) {
        let Ok(var) = std::str::from_utf8(var) else {
            continue;
        };
        if let Some(v) = var.strip_prefix("SLURM_JOB_ID=") {
            job_id = v.parse::<u32>().ok();
        } else if let Some(v) = var
            .strip_prefix(muxflow::mode::ENV_VAR)
            .or_else(|| var.strip_prefix(muxflow::mode::JOB_ENV_VAR))
            .and_then(|rest| rest.strip_prefix('='))
        {
            mode = mode.or_else(|| v.parse().ok());
        }
    }
    (job_id, mode)
}

/// `terminate_client` for every offline client of the GPU's MPS servers;
/// returns how many.
fn evict_offline(
    mps: &MpsDaemon,
    ns: &NodeState,
    gpu: u32,
    jobs: &[JobRecord],
) -> anyhow::Result<usize> {
    if !mps.is_running() {
        return Ok(0);
    }
    let mut n = 0;
    for server in mps.server_pids()? {
        for client in mps.client_pids(server)? {
            if process_mode(client, jobs) == Some(Mode::Offline) {
                mps.terminate_client(server, client)?;
                tracing::warn!(gpu, server, client, "terminated offline MPS client");
                if let (Some(job), _) = process_job(client) {
                    crate::police::record_health_eviction(
                        ns,
                        job,
                        client,
                        &format!("evicted from GPU {gpu} for the GPU's health"),
                    );
                }
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Why the GPU's MPS daemon must not be restarted now, if it must not: an
/// online job recorded on the GPU still runs (`job_runs`: its slurmstepd),
/// or one of the daemon's live `clients` (pid, its job's mode) may be
/// online. The records count as well as the daemon's list: after a `quit`
/// someone else sent, the daemon started again lists none of the online
/// job's processes, which still use the GPU.
fn restart_blocked(
    jobs: &[JobRecord],
    job_runs: impl Fn(u32) -> bool,
    clients: &[(u32, Option<Mode>)],
) -> Option<String> {
    if let Some(j) = jobs
        .iter()
        .find(|j| j.mode == Mode::Online && job_runs(j.job_id))
    {
        return Some(format!(
            "online job {} is recorded on the GPU and runs",
            j.job_id
        ));
    }
    clients
        .iter()
        .find(|(_, mode)| *mode != Some(Mode::Offline))
        .map(|(pid, _)| format!("client {pid}, which may be online, is attached"))
}

/// Restarts the GPU's MPS daemon when no online job runs on it and no
/// client that may be online is attached (a restart would take an online
/// job down with it).
fn restart_mps(
    config: &Config,
    mps: &MpsDaemon,
    ns: &NodeState,
    gpu: u32,
    jobs: &[JobRecord],
) -> anyhow::Result<bool> {
    if !mps.is_running() {
        return Ok(false);
    }
    let procfs = muxflow::node::jobproc::Procfs::default();
    let mut clients = Vec::new();
    for server in mps.server_pids()? {
        for client in mps.client_pids(server)? {
            if !exited(client) {
                clients.push((client, process_mode(client, jobs)));
            }
        }
    }
    if let Some(why) = restart_blocked(jobs, |j| procfs.stepd_of_job_runs(j), &clients) {
        tracing::info!(gpu, "MPS daemon not restarted: {why}");
        return Ok(false);
    }
    mps.quit()?;
    // Started again only for the jobs still recorded on the GPU; otherwise
    // the next Prolog starts it.
    if !ns.jobs(gpu)?.is_empty() {
        crate::job::daemon_to_start(config, gpu)
            .ensure_running(|| crate::gpu_caps::device_facts(config, gpu))?;
        crate::job::restore_namespaces(config, ns, gpu);
    }
    Ok(true)
}

/// State-changing commands muxflow did not send (`terminate_client`, the
/// `set_*` limits, `quit`): the daemon accepts them from any user who can
/// reach its socket, so they cannot be refused. Each is logged and counted
/// (`noticed.<command>`) at the next step; a server's SM share set by
/// someone else is put back to 100 (muxflow never sets one: the offline
/// share is each client's own). The control log is read for nothing else:
/// it records users' text (see `detector`).
///
/// A `terminate_client` is attributed to the client it ended, not to a
/// sender: the job and user of that client ([`attribute_termination`]),
/// which gets it in its AdminComment (`terminated_by_other`). NVIDIA's
/// daemon logs no sender, and anyone who reaches the socket can send it.
fn notice_foreign_commands(
    ns: &NodeState,
    mps: &MpsDaemon,
    gpu: u32,
    jobs: &[JobRecord],
    rec: &mut GpuRecord,
) {
    for line in scan_log(mps.log_dir(), "control.log", &mut rec.log_offsets) {
        let Some(command) = detector::control_command(&line) else {
            continue;
        };
        if !muxflow::node::mps::is_changing(command) || mps.take_own_command(command) {
            continue;
        }
        let shown: String = command.chars().take(120).collect();
        tracing::warn!(
            gpu,
            "MPS command '{shown}' reached the daemon from someone other than muxflow (any user \
             who can reach its socket can send it)"
        );
        let words: Vec<&str> = command.split_whitespace().collect();
        rec.count(&format!("noticed.{}", words[0]));
        if let ["terminate_client", _, client] = words.as_slice() {
            attribute_termination(ns, gpu, client.parse().ok(), jobs);
        }
        if let ["set_active_thread_percentage", server, pct] = words.as_slice() {
            if pct.parse::<f64>().ok() != Some(DAEMON_DEFAULT_THREAD_PCT) {
                let put_back =
                    format!("set_active_thread_percentage {server} {DAEMON_DEFAULT_THREAD_PCT}");
                match mps.send(&put_back) {
                    Ok(_) => {
                        tracing::warn!(gpu, "put back: {put_back}");
                        rec.count("policed.active_thread_percentage");
                    }
                    Err(e) => tracing::error!(gpu, "{put_back}: {e}"),
                }
            }
        }
    }
    bound_control_log(mps.log_dir(), gpu, rec);
}

/// The control log's size past which the health step empties it once read.
/// The daemon echoes every command into it, users' too, and NVIDIA's
/// daemon caps nothing: 1,000 long commands add megabytes in a fraction of
/// a second.
pub const CONTROL_LOG_MAX_BYTES: u64 = 8 << 20;

/// Empties the GPU's control log when it is past [`CONTROL_LOG_MAX_BYTES`]
/// (what it held was read by the step just before); the daemon's next
/// lines start it again (a daemon writing without `O_APPEND` leaves a hole
/// up to its offset: no disk blocks, and past the bound it is emptied
/// again). A command echoed in the instant between that read and this goes
/// unnoticed.
fn bound_control_log(log_dir: &Path, gpu: u32, rec: &mut GpuRecord) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_dir.join("control.log");
    let Ok(file) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    else {
        return;
    };
    let Ok(meta) = file.metadata() else {
        return;
    };
    let len = meta.len();
    if !meta.is_file() || len <= CONTROL_LOG_MAX_BYTES {
        return;
    }
    match file.set_len(0) {
        Ok(()) => {
            rec.log_offsets.insert("control.log".into(), 0);
            rec.count("bounded.control_log");
            tracing::warn!(
                gpu,
                bytes = len,
                "emptied {}: past {CONTROL_LOG_MAX_BYTES} bytes (commands echoed into it)",
                path.display()
            );
        }
        Err(e) => tracing::error!(gpu, "cannot empty {}: {e}", path.display()),
    }
}

/// Says whose client a foreign `terminate_client` ended, and records it for
/// that job (its AdminComment's `terminated_by_other`, while it runs). The
/// client is known by its process while it lingers, else by what the
/// police noted of it while it ran ([`crate::clients`]), never guessed
/// from the jobs on the GPU now. Who sent it is not known: NVIDIA's daemon
/// names no sender, and anyone who can reach the GPU's socket can send it.
pub fn attribute_termination(ns: &NodeState, gpu: u32, client: Option<u32>, jobs: &[JobRecord]) {
    let noted = client.and_then(|pid| crate::clients::recall(ns, gpu, pid));
    let victim = client
        .and_then(|pid| process_job(pid).0)
        .or(noted.and_then(|o| o.job));
    let owner = victim
        .and_then(|v| jobs.iter().find(|j| j.job_id == v).map(|j| j.uid))
        .or(noted.and_then(|o| o.uid));
    tracing::warn!(
        gpu,
        client = ?client,
        job = ?victim,
        uid = ?owner,
        "an MPS client was ended by a terminate_client muxflow did not send; NVIDIA's daemon names no sender: anyone who can reach the GPU's MPS socket (a user with a job on the GPU; any user on the node where its pipe directory keeps no ACL) or an administrator"
    );
    // Only for a job the node still runs: a forgotten job's files are gone
    // with it, and a job that is not muxflow's has none.
    if let (Some(job), Some(pid)) = (victim, client) {
        if ns.find_job(job).ok().flatten().is_some() {
            record_termination(ns, job, pid);
        }
    }
}

/// Notes in job `job`'s root-owned file that its client `pid` was ended by
/// someone else; once per client (the watcher and the health step may both
/// see the command).
fn record_termination(ns: &NodeState, job: u32, pid: u32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = ns.terminated_by_other_file(job);
    let line = format!("client={pid} sender=unknown\n");
    if std::fs::read_to_string(&path).is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().next() == Some(&format!("client={pid}")))
    }) {
        return;
    }
    let written = std::fs::create_dir_all(ns.limits_dir()).and_then(|()| {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
    });
    if let Err(e) = written {
        tracing::error!(job, "{}: {e}", path.display());
    }
}

/// New complete lines of one MPS log since the recorded offset. A file
/// that shrank (rotated, recreated) is read from its start. A record
/// without an offset for the log (the GPU seen for the first time, or its
/// record lost or replaced) starts at the log's end: what is there is
/// history, acted on before or by nobody's record, and acting on it again
/// would mark the GPU faulty for an old fault. A log not written yet
/// starts at 0: all it will hold is new.
/// The most of a log one step reads (see [`scan_log`]).
const SCAN_MAX_BYTES: u64 = 16 << 20;

pub(crate) fn scan_log(dir: &Path, name: &str, offsets: &mut BTreeMap<String, u64>) -> Vec<String> {
    let Ok(mut f) = std::fs::File::open(dir.join(name)) else {
        offsets.insert(name.into(), 0);
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let Some(mut off) = offsets.get(name).copied() else {
        offsets.insert(name.into(), len);
        return Vec::new();
    };
    if off > len {
        off = 0;
    }
    // A backlog past the bound (a log flooded between two steps) is read
    // from its last SCAN_MAX_BYTES: a step's memory stays bounded.
    let skipped = len - off > SCAN_MAX_BYTES;
    if skipped {
        tracing::warn!(
            "{}: {} bytes since the last step; reading only the last {SCAN_MAX_BYTES}",
            dir.join(name).display(),
            len - off
        );
        off = len - SCAN_MAX_BYTES;
    }
    if off == len || f.seek(SeekFrom::Start(off)).is_err() {
        offsets.insert(name.into(), off);
        return Vec::new();
    }
    let mut buf = Vec::new();
    // Up to the length seen: what comes while reading is the next step's.
    if (&mut f).take(len - off).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    // Only whole lines: a line being written is read next time.
    let whole = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    offsets.insert(name.into(), off + whole as u64);
    // Started mid-line: that line's head is gone.
    let first = if skipped {
        buf[..whole]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(whole, |i| i + 1)
    } else {
        0
    };
    String::from_utf8_lossy(&buf[first..whole])
        .lines()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow::policy::health::Metrics;
    use std::io::Write;

    #[test]
    fn the_daemon_is_restarted_only_without_a_running_online_job_or_client() {
        let job = |job_id, mode| JobRecord {
            job_id,
            mode,
            uid: 1000,
            slots: Vec::new(),
        };
        let online_and_offline = [job(1, Mode::Online), job(2, Mode::Offline)];
        let offline_only = [job(2, Mode::Offline)];
        type Clients<'a> = &'a [(u32, Option<Mode>)];
        // (what, the GPU's jobs, does job 1 run, the daemon's clients, blocked?)
        let rows: [(&str, &[JobRecord], bool, Clients, bool); 6] = [
            (
                "offline clients only",
                &offline_only,
                false,
                &[(7, Some(Mode::Offline))],
                false,
            ),
            (
                "nothing attached, no online job",
                &offline_only,
                false,
                &[],
                false,
            ),
            (
                "a running online job no longer listed (a foreign quit)",
                &online_and_offline,
                true,
                &[(7, Some(Mode::Offline))],
                true,
            ),
            (
                "an online job whose step is gone",
                &online_and_offline,
                false,
                &[],
                false,
            ),
            (
                "an online client listed",
                &offline_only,
                false,
                &[(8, Some(Mode::Online))],
                true,
            ),
            (
                "a client of no known job",
                &offline_only,
                false,
                &[(9, None)],
                true,
            ),
        ];
        for (what, jobs, runs, clients, blocked) in rows {
            assert_eq!(
                restart_blocked(jobs, |j| runs && j == 1, clients).is_some(),
                blocked,
                "{what}"
            );
        }
    }

    #[test]
    fn log_scan_resumes_and_restarts_after_truncation() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("server.log");
        let mut offs = BTreeMap::new();
        assert!(scan_log(tmp.path(), "server.log", &mut offs).is_empty());
        std::fs::write(&log, "a\nb\npartial").unwrap();
        assert_eq!(scan_log(tmp.path(), "server.log", &mut offs), ["a", "b"]);
        assert!(scan_log(tmp.path(), "server.log", &mut offs).is_empty());
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        writeln!(f, " line").unwrap();
        assert_eq!(
            scan_log(tmp.path(), "server.log", &mut offs),
            ["partial line"]
        );
        std::fs::write(&log, "new\n").unwrap();
        assert_eq!(scan_log(tmp.path(), "server.log", &mut offs), ["new"]);
    }

    #[test]
    fn a_flooded_log_is_read_from_its_tail_and_the_control_log_emptied() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("control.log");
        std::fs::write(&log, "").unwrap();
        let mut rec = GpuRecord::new(0);
        assert!(scan_log(tmp.path(), "control.log", &mut rec.log_offsets).is_empty());
        // A flood between two steps, then one command.
        let line = format!("Cmd:get_server_list {}\n", "x".repeat(1000));
        let flood = line.repeat((SCAN_MAX_BYTES as usize / line.len()) + 100);
        std::fs::write(&log, format!("{flood}Cmd:quit\n")).unwrap();
        let lines = scan_log(tmp.path(), "control.log", &mut rec.log_offsets);
        assert_eq!(lines.last().map(String::as_str), Some("Cmd:quit"));
        assert!(
            lines.iter().all(|l| l.starts_with("Cmd:")),
            "whole lines only"
        );
        assert!(
            lines.iter().map(|l| l.len() + 1).sum::<usize>() as u64 <= SCAN_MAX_BYTES,
            "at most the bound read"
        );
        // Past its bound once read: emptied, and read from its start next.
        bound_control_log(tmp.path(), 0, &mut rec);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert_eq!(rec.log_offsets.get("control.log"), Some(&0));
        std::fs::write(&log, "Cmd:quit\n").unwrap();
        assert_eq!(
            scan_log(tmp.path(), "control.log", &mut rec.log_offsets),
            ["Cmd:quit"]
        );
        // Below it: left alone.
        bound_control_log(tmp.path(), 0, &mut rec);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 9);
    }

    #[test]
    fn a_fresh_record_skips_the_log_history_and_reads_what_comes_after() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("server.log");
        std::fs::write(&log, "old fault\n").unwrap();
        let mut offs = BTreeMap::new();
        assert!(scan_log(tmp.path(), "server.log", &mut offs).is_empty());
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        writeln!(f, "new fault").unwrap();
        assert_eq!(scan_log(tmp.path(), "server.log", &mut offs), ["new fault"]);
    }

    #[test]
    fn solo_figures_average_and_restart_for_a_new_online_job() {
        let m = |sm| Metrics {
            sm_activity_pct: Some(sm),
            ..Metrics::default()
        };
        let s = Solo::next(None, vec![1], &m(30.0), 1000, 5);
        let s = Solo::next(Some(s), vec![1], &m(40.0), 800, 6);
        assert_eq!((s.sm_pct, s.mem_mib, s.samples), (Some(35.0), 1000, 2));
        let s = Solo::next(Some(s), vec![2], &m(10.0), 100, 7);
        assert_eq!((s.sm_pct, s.mem_mib, s.samples), (Some(10.0), 100, 1));
    }
}
