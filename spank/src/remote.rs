//! Remote context: slurmstepd, once per job step.
//!
//! `init_post_opt` (root) sets the step's environment: MPS pipe directory and
//! client priority for both modes; for offline steps also the GPU, the SM
//! share and memory cap from the policies, the xCUDA settings and xCUDA in
//! LD_PRELOAD — always overwriting what the user set. Nothing here may fail
//! back to Slurm from `init`/`init_post_opt` (that drains the node): problems
//! are logged to the slurmd log, and an offline step that cannot be protected
//! is refused in `task_init` instead (the job fails, the node does not).
//! A k-GPU offline job gets its first GPU's settings for the
//! step and, in `task_init`, each task its own GPU's (task i: GPU i mod k).
//! `exit` of the batch step (root, job still running) writes the job's
//! sharing figures into its AdminComment.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use muxflow::node::state::{write_atomic, NodeState};
use muxflow::records::admin_comment::{self, AdminComment};
use muxflow::records::limits::{EnforcedBy, Enforcer, JobLimits, StopBounds};
use muxflow::records::report::{add_peers, JobReport};
use muxflow::records::runs::EarlierRuns;
use muxflow::records::xcuda_env::{self, XcudaEnv};
use muxflow::{node::mps, records::online_page, Config, Mode};
use muxflow_slurm::cli::{OfflineJob, Scontrol};
use muxflow_slurm::version::{SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT, SLURM_INTERACTIVE_STEP};
use slurm_spank::SpankHandle;

use crate::{preload, settings, OPTION};

/// Where a workload may write its own figures (`key=value`) for the report.
pub const JOB_REPORT_VAR: &str = "MUXFLOW_JOB_REPORT";

#[derive(Default)]
pub struct RemoteState {
    pub mode: Option<Mode>,
    /// Why this offline step must not run; `task_init` refuses with it.
    refusal: Option<String>,
    /// Set in the batch step of a muxflow job: what `exit` reports.
    report: Option<ReportContext>,
    /// A muxflow job on k GPUs: per GPU (in ascending order), the
    /// variables a task on it gets (`None`: unset); task i takes entry i
    /// mod k, at `task_init`, after Slurm set the task's own.
    task_env: Vec<Vec<(&'static str, Option<String>)>>,
}

struct ReportContext {
    config: Config,
    job_id: u32,
    node: String,
    gpu: u32,
    mode: Mode,
    sm_pct: Option<u8>,
    mem_cap_mib: Option<u64>,
    partner: Option<u32>,
    /// Other offline jobs on its GPUs at the start (the report
    /// names them, `peers`).
    peers: Vec<u32>,
    stats_dir: Option<PathBuf>,
    /// A k-GPU job's further GPUs: (GPU, SM share, memory cap).
    gang: Vec<(u32, u8, Option<u64>)>,
    /// When the batch step started (slurmstepd's clock): the report's
    /// `run_s`, which turns xCUDA's launch count into a rate.
    started: std::time::Instant,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl RemoteState {
    pub fn init_post_opt(&mut self, spank: &mut SpankHandle) {
        let step = match spank.job_stepid() {
            Ok(SLURM_EXTERN_CONT) | Ok(SLURM_INTERACTIVE_STEP) => return,
            Ok(s) => s,
            Err(e) => {
                tracing::error!("muxflow: cannot read the step id, leaving the step alone: {e}");
                return;
            }
        };
        let asked = match spank.get_option_value(OPTION) {
            Ok(v) => v.map(|v| v.into_owned()),
            Err(e) => {
                tracing::error!("muxflow: cannot read --{OPTION}: {e}");
                None
            }
        };
        // Validated at submit; a value that still fails here was forged.
        let asked = asked.and_then(|value| match value.parse::<Mode>() {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!("{e}; the step's --{OPTION} is ignored");
                None
            }
        });
        // What the Prolog recorded for the job wins over the step's option,
        // which its user can drop or change in any srun: a step of an
        // offline job stays offline.
        // Read once for the step; quiet when muxflow is not set up here (this
        // runs for every step of every job), an error for a muxflow step.
        let loaded = node_config(spank);
        let recorded = loaded
            .as_ref()
            .ok()
            .and_then(|(_, config)| recorded_mode(spank, config));
        let mode = match (recorded, asked) {
            (Some(recorded), Some(asked)) if recorded != asked => {
                tracing::warn!(
                    "muxflow: step asked for --{OPTION}={asked} in a job recorded as {recorded}; runs as {recorded}"
                );
                recorded
            }
            (Some(recorded), _) => recorded,
            (None, Some(asked)) => asked,
            (None, None) => return,
        };
        self.mode = Some(mode);
        set(spank, crate::submit::MODE_VAR, mode.as_str());
        if let Err(e) = self.prepare(spank, mode, step, loaded) {
            let msg = format!("muxflow: {e}");
            tracing::error!("{msg}");
            if mode == Mode::Offline {
                // Unprotected offline work could hurt the online job: refuse it.
                self.refusal = Some(msg);
            }
        }
    }

    fn prepare(
        &mut self,
        spank: &mut SpankHandle,
        mode: Mode,
        step: u32,
        loaded: anyhow::Result<(String, Config)>,
    ) -> anyhow::Result<()> {
        let (node, config) = loaded?;
        let job_id = spank.job_id()?;
        let state = NodeState::new(config.paths.state_dir.as_path());
        if let Some(why) = state.refusal(job_id)? {
            // The Prolog's checks refused it (not placed by muxflow, GPU not healthy).
            if step != SLURM_BATCH_SCRIPT {
                anyhow::bail!("{}", why.trim());
            }
            let text = back_to_queue(spank, &config, job_id, &node, why.trim(), Stop::Refused);
            anyhow::bail!("{text}");
        }
        let Some((gpu, _)) = state.find_job(job_id)? else {
            let why = no_record(&config, &state, job_id, &node, mode);
            if mode == Mode::Offline && step == SLURM_BATCH_SCRIPT {
                // muxflow's own failure (a full disk, slurmctld away): not the job's loss.
                let text = back_to_queue(spank, &config, job_id, &node, &why, Stop::NotRecorded);
                anyhow::bail!("{text}");
            }
            anyhow::bail!(why);
        };
        // The device and the pipe of its GPU's daemon (a k-GPU job's task
        // gets its own GPU's below: one MPS server per GPU).
        apply(spank, &device_env(&config, gpu));
        if mode == Mode::Online {
            // Again per task, just before exec: Slurm puts its own
            // CUDA_VISIBLE_DEVICES (the node's index) into an online job's
            // tasks, which the GPU's daemon would not recognise.
            self.task_env = match state.job_gpus(job_id)? {
                g if g.is_empty() => vec![device_env(&config, gpu)],
                g => g.iter().map(|&g| device_env(&config, g)).collect(),
            };
        }
        set(
            spank,
            "CUDA_MPS_CLIENT_PRIORITY",
            if mode == Mode::Offline { "1" } else { "0" },
        );
        // The job's static SM partition, where its GPU's daemon has them (the
        // Prolog made it); an offline job's is set again per GPU below.
        unset(spank, muxflow::node::sm_partition::ENV);
        if let Some(p) = state.sm_partition(gpu, job_id) {
            set(spank, muxflow::node::sm_partition::ENV, &p.id);
        }

        let mut ctx = ReportContext {
            config: config.clone(),
            job_id,
            node,
            gpu,
            mode,
            sm_pct: None,
            mem_cap_mib: None,
            partner: partner(&state, gpu, job_id, mode),
            peers: Vec::new(),
            stats_dir: None,
            gang: Vec::new(),
            started: std::time::Instant::now(),
        };
        // Where xCUDA (offline) and the workload itself (both modes) leave
        // figures for the report.
        let stats = state.xcuda_stats_dir(job_id);
        make_user_dir(&stats, spank.job_uid()?, spank.job_gid()?)?;
        set(
            spank,
            JOB_REPORT_VAR,
            stats.join("job.report").to_string_lossy().as_ref(),
        );
        ctx.stats_dir = Some(stats);
        if mode == Mode::Online && config.xcuda.online_counting {
            // Measuring the online job must never stop it: a failure here
            // leaves it unmeasured (the offline gates then brake on the
            // clock and utilization alone), logged.
            if let Err(e) = prepare_online(spank, &config, &ctx) {
                tracing::warn!(
                    job = ctx.job_id,
                    "muxflow: online job runs without xCUDA's counting mode: {e}"
                );
            }
        }
        if mode == Mode::Offline {
            self.prepare_offline(spank, &config, &state, &mut ctx)?;
            let peers = offline_peers(&state, &ctx);
            add_peers(&mut ctx.peers, Some(job_id), peers);
        }
        if step == SLURM_BATCH_SCRIPT {
            self.report = Some(ctx);
        }
        Ok(())
    }

    fn prepare_offline(
        &mut self,
        spank: &mut SpankHandle,
        config: &Config,
        state: &NodeState,
        ctx: &mut ReportContext,
    ) -> anyhow::Result<()> {
        let xcuda = config.paths.xcuda_library.as_path();
        if !xcuda.is_file() {
            anyhow::bail!(
                "the xCUDA library {} is missing, so this offline job cannot run without risk to the online job; \
                 an administrator must install it (or fix paths.xcuda_library in muxflow.toml)",
                xcuda.display()
            );
        }
        let stats = ctx
            .stats_dir
            .clone()
            .expect("prepare made the stats directory");
        // A k-GPU job is recorded on each of its GPUs. MPS runs one
        // server per GPU and a client attaches to one server, so each task
        // gets one GPU (its local task id modulo k): that GPU's pipe, SM share,
        // memory cap and limits. The step itself, and a 1-GPU job, get the
        // first GPU's.
        let gpus = match state.job_gpus(ctx.job_id)? {
            g if g.is_empty() => vec![ctx.gpu],
            g => g,
        };
        let gang = gpus.len() > 1;
        let gid = spank.job_gid()?;
        let stop_grace_ms = stop_grace_ms(config, ctx.job_id);
        let mut per_gpu: Vec<Vec<(&'static str, Option<String>)>> = Vec::new();
        for (n, &gpu) in gpus.iter().enumerate() {
            let dir = if gang {
                muxflow::records::limits::gpu_dir(&state.limits_dir(), gpu)
            } else {
                state.limits_dir()
            };
            let (sm_pct, cap, enforced_by) = job_limits_on(config, state, &dir, ctx.job_id, gpu)?;
            if n == 0 {
                ctx.sm_pct = Some(sm_pct);
                ctx.mem_cap_mib = cap;
            } else {
                ctx.gang.push((gpu, sm_pct, cap));
            }
            if cap.is_none() {
                tracing::warn!(
                    job = ctx.job_id,
                    gpu,
                    "GPU memory not recorded yet: offline job runs without a memory cap"
                );
            }
            let mut env = XcudaEnv::from_config(&config.xcuda, gpu);
            env.mem_limit_bytes = cap.map(|m| m.saturating_mul(1 << 20));
            env.nvml_library = config
                .paths
                .nvml_library
                .as_ref()
                .map(|p| p.as_path().to_path_buf());
            env.health_file = Some(state.health_file(gpu));
            env.stats_dir = Some(stats.clone());
            if config.xcuda.online_counting {
                // The page the GPU's online job publishes (if it has one).
                env.online_page = Some(online_page::path(config.paths.state_dir.as_path(), gpu));
            }
            // xCUDA reads its settings from this root-owned file, never from
            // the environment; the node polices the job against it.
            let limits = JobLimits {
                job_id: ctx.job_id,
                gpu,
                sm_pct,
                mem_cap_mib: cap,
                xcuda: env,
                enforced_by,
            };
            // A latest release an online job's Prolog set stays (a later
            // step must not take it away).
            let stop = StopBounds {
                grace_ms: stop_grace_ms,
                release_by_unix_ms: StopBounds::read_trusted(&dir, ctx.job_id, 0)
                    .ok()
                    .and_then(|b| b.release_by_unix_ms),
            };
            write_limits(&dir, &limits, &stop, gid)?;
            if gang && n == 0 {
                // The first GPU's at the 1-GPU place too (what the health
                // steps and older readers look up).
                write_limits(&state.limits_dir(), &limits, &stop, gid)?;
            }
            per_gpu.push(client_env(
                config, state, ctx.job_id, gpu, sm_pct, cap, &dir,
            ));
        }
        for var in xcuda_env::ALL {
            unset(spank, var);
        }
        apply(spank, &per_gpu[0]);
        self.task_env = per_gpu;
        preload_xcuda(spank, xcuda);
        Ok(())
    }

    /// Per task, as the user: refuse an offline step that cannot be
    /// protected; a task gets its own GPU's settings.
    pub fn task_init(&self, spank: &mut SpankHandle) -> Result<(), Refused> {
        if let Some(why) = &self.refusal {
            return Err(Refused(why.clone()));
        }
        if !self.task_env.is_empty() {
            let local = spank
                .task_id()
                .map_err(|e| Refused(format!("muxflow: cannot read the task id: {e}")))?;
            let k = self.task_env.len();
            apply(spank, &self.task_env[local.max(0) as usize % k]);
        }
        Ok(())
    }

    /// End of the step (root). In the batch step, the job is still running:
    /// the last moment its AdminComment can be written.
    pub fn exit(&mut self) {
        let Some(ctx) = self.report.take() else {
            return;
        };
        if ctx.mode == Mode::Online {
            // Its steps are over: the counting mode's settings go (the page
            // stays, goes stale, and the next online job's replaces it).
            let dir = online_page::limits_dir(ctx.config.paths.state_dir.as_path());
            let _ = std::fs::remove_file(muxflow::records::limits::path(&dir, ctx.job_id));
        }
        let mut report = build_report(&ctx);
        if ctx.mode == Mode::Offline {
            report.requeued = requeued(&ctx);
            report.earlier = earlier_runs(&ctx);
        }
        let text = report.encode();
        if report.requeued {
            // slurmstepd writes its log of the batch step into the job's
            // own output, beside Slurm's "CANCELLED … DUE TO JOB REQUEUE".
            slurm_spank::spank_log(slurm_spank::LogLevel::Error, &requeue_words(&report));
        }
        // A cancelled or preempted job has already ended for slurmctld:
        // the record then goes into its accounting record.
        match Scontrol::new(&ctx.config).record_admin_comment(ctx.job_id, &text) {
            Ok(how) => tracing::info!(job = ctx.job_id, ?how, "muxflow report: {text}"),
            Err(e) => tracing::error!(
                job = ctx.job_id,
                "muxflow: cannot write the AdminComment: {e}"
            ),
        }
    }
}

/// Slurm 25.05 and later, slurmstepd's `init` (root, before options): an
/// offline job (its submit-time mode, [`muxflow::mode::JOB_ENV_VAR`]) on a
/// node whose muxflow config cannot be read fails here with the reason, and
/// Slurm fails the job instead of draining the node (`compat`). Slurm shows
/// the user only "Spank plugin failure" (ExitCode 0:68), so the job's
/// AdminComment gets `failed=node_config` ([`admin_comment::node_config_failed`]) and the node's slurmd log the
/// reason. Online and other jobs pass: they run as before (an online job
/// without MPS). A user who forges the variable only fails their own job.
pub fn check_node_config(spank: &SpankHandle) -> Result<(), Refused> {
    let offline = spank
        .getenv(muxflow::mode::JOB_ENV_VAR)
        .ok()
        .flatten()
        .and_then(|v| v.parse::<Mode>().ok())
        == Some(Mode::Offline);
    if !offline {
        return Ok(());
    }
    let Err(e) = node_config(spank) else {
        return Ok(());
    };
    let job = spank.job_id().ok();
    let node = node_name(spank).unwrap_or_else(|_| "this node".to_string());
    let why = format!(
        "muxflow: offline job {} cannot start on {node}: its muxflow config cannot be used ({e:#}); \
         an administrator must fix it there. The node stays up for other work.",
        job.map_or_else(|| "?".to_string(), |id| id.to_string())
    );
    tracing::error!("{why}");
    if let Some(id) = job {
        // The config names the scontrol to run; it cannot be read, so the
        // default one (a fixed path, never the job's).
        let client = Scontrol::new(&Config::default());
        let prior = client
            .scontrol(&["show", "job", &id.to_string()])
            .ok()
            .and_then(|out| muxflow_slurm::cli::parse_admin_comment(&out));
        // Once per job (each of its steps fails here).
        if let Some(text) = admin_comment::node_config_failed(prior.as_deref()) {
            if let Err(e) = client.set_admin_comment(id, &text) {
                tracing::error!("muxflow: cannot record why job {id} failed: {e}");
            }
        }
    }
    Err(Refused(why))
}

/// A refused offline job's refusals at which it fails instead of going
/// back to the queue again (a bound on a loop between the matcher and a
/// node).
const MAX_REFUSALS: u32 = 3;

/// Why the job's batch step is not started: a Prolog refused it, or
/// muxflow itself failed to record it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Refused,
    NotRecorded,
}

/// A refused offline job is not lost: it goes back to the queue, held, and
/// muxflow-matcher places it again (its tasks are refused meanwhile, so it
/// never runs where it was refused). Returns what the user reads.
fn back_to_queue(
    spank: &SpankHandle,
    config: &Config,
    job_id: u32,
    node: &str,
    why: &str,
    stop: Stop,
) -> String {
    // Set by slurmd for a requeued job; a user who forges it only fails
    // their own job sooner. It also counts requeues for an online job's
    // room, so it bounds only muxflow's own failures.
    let restarts = spank
        .getenv("SLURM_RESTART_COUNT")
        .ok()
        .flatten()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0);
    let scontrol = Scontrol::new(config);
    let gave_up = match stop {
        // The Prolog counted this refusal in the job's AdminComment.
        Stop::Refused => match scontrol.offline_job(job_id, node, &config.slurm.offline_gres) {
            Ok(OfflineJob {
                admin_comment: Some(c),
                ..
            }) => Some(AdminComment::parse(&c).map_or(0, |c| c.refusals()))
                .filter(|&n| n >= MAX_REFUSALS),
            _ => Some(restarts + 1).filter(|&n| n >= MAX_REFUSALS),
        },
        Stop::NotRecorded => Some(restarts + 1).filter(|&n| n >= MAX_REFUSALS),
    };
    if let Some(n) = gave_up {
        return format!(
            "{why} It was stopped {n} times, so it fails now instead of going back to the queue."
        );
    }
    match scontrol.requeue_hold(job_id) {
        Ok(()) => format!(
            "{why} The job goes back to the queue, held, and muxflow-matcher places it again."
        ),
        Err(e) => format!("{why} It cannot go back to the queue ({e}), so it fails."),
    }
}

/// Why the Prolog left no record of the job, as the user should read it.
fn no_record(config: &Config, state: &NodeState, job_id: u32, node: &str, mode: Mode) -> String {
    let consequence = match mode {
        Mode::Offline => "This offline job is not started unprotected",
        Mode::Online => "It runs without MPS",
    };
    if let Some(space) = state.space_problem() {
        return format!(
            "the muxflow Prolog could not record job {job_id} on {node}: {space}. {consequence}; \
             an administrator must free space there."
        );
    }
    let slots = Scontrol::new(config)
        .offline_job(job_id, node, &config.slurm.offline_gres)
        .map(|j| j.slots);
    match (mode, slots) {
        (_, Err(e)) => format!(
            "the muxflow Prolog did not record job {job_id} on {node}, and slurmctld cannot be asked why \
             ({e}). {consequence}."
        ),
        (Mode::Offline, Ok(s)) if s.is_empty() => format!(
            "offline job {job_id} holds no GPU on {node}: muxflow-matcher has not placed it."
        ),
        _ => format!(
            "the muxflow Prolog did not record job {job_id} on {node} (its reason is in {}). {consequence}.",
            config.paths.node_log.as_path().display()
        ),
    }
}

/// The muxflow config the plugstack line names, with this node's Slurm name.
fn node_config(spank: &SpankHandle) -> anyhow::Result<(String, Config)> {
    let (_, config) = settings::load(spank)?;
    let node = node_name(spank)?;
    let config = config.for_node(&node)?;
    Ok((node, config))
}

/// The mode the Prolog recorded for this job on this node (root's record of
/// what slurmctld passed it), if any.
fn recorded_mode(spank: &SpankHandle, config: &Config) -> Option<Mode> {
    let state = NodeState::new(config.paths.state_dir.as_path());
    let (_, record) = state.find_job(spank.job_id().ok()?).ok()??;
    Some(record.mode)
}

/// This node's Slurm name. SLURMD_NODENAME reaches the tasks only later, so
/// for muxflow's single-node jobs the job's node list is the name.
fn node_name(spank: &SpankHandle) -> anyhow::Result<String> {
    for var in ["SLURMD_NODENAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST"] {
        if let Some(v) = spank.getenv(var)? {
            if !v.is_empty() && !v.contains([',', '[']) {
                return Ok(v);
            }
        }
    }
    anyhow::bail!("cannot tell this node's name (multi-node muxflow jobs are not supported)")
}

fn set(spank: &SpankHandle, var: &str, value: &str) {
    if let Err(e) = spank.setenv(var, value, true) {
        tracing::error!("muxflow: cannot set {var}: {e}");
    }
}

/// Sets (or, for `None`, unsets) each variable.
fn apply(spank: &SpankHandle, vars: &[(&'static str, Option<String>)]) {
    for (var, value) in vars {
        match value {
            Some(v) => set(spank, var, v),
            None => unset(spank, var),
        }
    }
}

fn unset(spank: &SpankHandle, var: &str) {
    if let Err(e) = spank.unsetenv(var) {
        tracing::error!("muxflow: cannot unset {var}: {e}");
    }
}

/// Creates `dir` for the job's user (mode 0700) under a root-owned parent,
/// refusing anything that is not a plain directory of that user.
fn make_user_dir(dir: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    let parent = dir
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no parent", dir.display()))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)?;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => std::os::unix::fs::chown(dir, Some(uid), Some(gid))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != uid {
        anyhow::bail!("{} is not a directory of uid {uid}", dir.display());
    }
    Ok(())
}

/// An online step: xCUDA in counting mode (no gate, no cap), preloaded from
/// the admin's `paths.xcuda_library` as for offline jobs, its settings in a
/// root-owned file (role `online`, the GPU's page) the job cannot change,
/// and the GPU's online page made anew, writable by the job's user only
/// (the trust boundary: `muxflow::records::online_page`). The limits file is written
/// before `LD_PRELOAD` is set: xCUDA without its file would take the safe,
/// offline settings, and those would refuse the online job's memory.
fn prepare_online(
    spank: &mut SpankHandle,
    config: &Config,
    ctx: &ReportContext,
) -> anyhow::Result<()> {
    let xcuda = config.paths.xcuda_library.as_path();
    if !xcuda.is_file() {
        anyhow::bail!(
            "the xCUDA library {} is missing (paths.xcuda_library)",
            xcuda.display()
        );
    }
    let state_dir = config.paths.state_dir.as_path();
    let page = online_page::path(state_dir, ctx.gpu);
    let dir = online_page::limits_dir(state_dir);
    // The first step makes the page; a later step (srun) of the same job
    // keeps it (its baseline is the job's).
    let ours = JobLimits::read_trusted(&dir, ctx.job_id, 0).is_ok();
    if !ours {
        online_page::create(&page, ctx.job_id, spank.job_uid()?, spank.job_gid()?)?;
    }
    let mut env = XcudaEnv::from_config(&config.xcuda, ctx.gpu);
    env.role = xcuda_env::Role::Online;
    env.online_page = Some(page);
    let limits = JobLimits {
        job_id: ctx.job_id,
        gpu: ctx.gpu,
        sm_pct: 100,
        mem_cap_mib: None,
        xcuda: env,
        enforced_by: Default::default(),
    };
    // No stop bounds: xCUDA in counting mode holds no gate to release.
    write_limits(&dir, &limits, &StopBounds::default(), spank.job_gid()?)?;
    for var in xcuda_env::ALL {
        unset(spank, var);
    }
    set(spank, xcuda_env::LIMITS_DIR, dir.to_string_lossy().as_ref());
    preload_xcuda(spank, xcuda);
    Ok(())
}

/// The kernel's cap on offline job `job`'s memory on GPU `gpu`, at its first
/// step (root, in slurmstepd, where the job's cgroup exists): `cap_mib`
/// written to the job cgroup's `dmem.max` for the GPU's region, where the
/// Prolog found one ([`muxflow::node::dmem`]). Kernel when written and read
/// back; else xCUDA's cap (with the police) as before, the reason logged.
fn kernel_cap(
    config: &Config,
    state: &NodeState,
    job: u32,
    gpu: u32,
    cap_mib: Option<u64>,
) -> Enforcer {
    let (Some(cap), Some(region)) = (cap_mib, state.dmem_region(gpu)) else {
        return Enforcer::Xcuda;
    };
    // slurmstepd's own cgroup, from the kernel: it lies in the job's.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let root = config.paths.cgroup_root.as_path();
    match muxflow::node::dmem::cap_job(root, &own, job, &region, cap.saturating_mul(1 << 20)) {
        Ok(max) => {
            tracing::info!(
                job,
                gpu,
                region,
                cap_mib = cap,
                "GPU memory cap set in {}",
                max.display()
            );
            Enforcer::Kernel
        }
        Err(e) => {
            tracing::warn!(job, gpu, "GPU memory cap left to xCUDA: {e}");
            Enforcer::Xcuda
        }
    }
}

/// Puts the admin's xCUDA first in the step's `LD_PRELOAD` (de-duplicated).
fn preload_xcuda(spank: &mut SpankHandle, xcuda: &Path) {
    let current = spank.getenv("LD_PRELOAD").ok().flatten();
    set(
        spank,
        "LD_PRELOAD",
        &preload::prepend(xcuda, current.as_deref()),
    );
}

/// How long after SIGTERM xCUDA may leave job `job` its GPU: Slurm's
/// `KillWait` less a margin ([`muxflow::records::limits::stop_grace`]). None when
/// `KillWait` cannot be read: xCUDA then releases at once, as it must when
/// it cannot know when the SIGKILL comes.
fn stop_grace_ms(config: &Config, job: u32) -> Option<u64> {
    // One try: a slurmctld out of reach must not hold the step's start up
    // (the fallback only costs the job its grace).
    let mut scontrol = Scontrol::new(config);
    scontrol.attempts = 1;
    match scontrol.kill_wait() {
        Ok(kill_wait) => Some(muxflow::records::limits::stop_grace(kill_wait).as_millis() as u64),
        Err(e) => {
            tracing::warn!(
                job,
                "cannot read Slurm's KillWait ({e}): xCUDA releases the job's GPU at once on SIGTERM"
            );
            None
        }
    }
}

/// Writes `limits` and the stop bounds in `dir` (root, 0755), which must be
/// a plain directory of root: what xCUDA and the health check trust. The
/// file is root's, readable by the job's group `gid` only (xCUDA reads it
/// as the job's user; other users have no business with another job's
/// share and cap).
fn write_limits(dir: &Path, limits: &JobLimits, stop: &StopBounds, gid: u32) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{} must be a directory of root not writable by others (an administrator must fix it)",
            dir.display()
        );
    }
    let path = muxflow::records::limits::path(dir, limits.job_id);
    write_atomic(&path, (limits.encode() + &stop.encode()).as_bytes())?;
    std::os::unix::fs::chown(&path, Some(0), Some(gid))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640))?;
    Ok(())
}

/// Whether an online job requeued this offline run, which then leaves a
/// line in its own output ([`requeue_words`]) and says so in its report
/// (`requeued=1`). Known by the latest release an online job's Prolog set
/// in the job's root-owned limits file (`make_room`: nothing else sets it,
/// and a restart's Prolog clears what a run before left); false for any
/// other end.
fn requeued(ctx: &ReportContext) -> bool {
    let state = NodeState::new(ctx.config.paths.state_dir.as_path());
    StopBounds::read_trusted(&state.limits_dir(), ctx.job_id, 0)
        .is_ok_and(|b| b.release_by_unix_ms.is_some())
}

/// The runs before this one that the job's text so far keeps
/// ([`AdminComment::runs_before`]), for this run's report to carry on:
/// Slurm closed their accounting records at each requeue with the
/// placement only. Read as the Prolog reads the placement: a field of the
/// job that forges a line of Slurm's makes the text unreadable, and then
/// nothing is carried.
fn earlier_runs(ctx: &ReportContext) -> EarlierRuns {
    let gres = &ctx.config.slurm.offline_gres;
    match Scontrol::new(&ctx.config).offline_job(ctx.job_id, &ctx.node, gres) {
        Ok(OfflineJob {
            admin_comment: Some(text),
            ..
        }) => AdminComment::parse(&text)
            .map(|c| c.runs_before())
            .unwrap_or_default(),
        Ok(_) => {
            tracing::warn!(
                job = ctx.job_id,
                "muxflow: the job's record is unreadable (a forged line): its earlier runs are not carried"
            );
            EarlierRuns::default()
        }
        Err(e) => {
            tracing::warn!(
                job = ctx.job_id,
                "muxflow: cannot read the job's earlier runs: {e}"
            );
            EarlierRuns::default()
        }
    }
}

/// The line an offline job requeued for an online job leaves in its own
/// output: why, and this run's figures (which its AdminComment keeps
/// through its later runs: [`muxflow::records::runs`]).
fn requeue_words(r: &JobReport) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let by = r.partner.map_or_else(
        || "an online job".to_string(),
        |p| format!("online job {p}"),
    );
    format!(
        "muxflow: requeued: {by} needed GPU {} of {}; this job goes back to the queue, held, and muxflow places it again. \
         This run: {} s, SM share {}%, memory cap {} MiB, {} launches ({} delayed, {} ms), OOM refusals {} \
         (its AdminComment keeps them through its next runs: muxflow-report)",
        opt(r.gpu.map(|g| g.to_string())),
        opt(r.node.clone()),
        opt(r.run_s.map(|v| v.to_string())),
        opt(r.sm_pct.map(|v| v.to_string())),
        opt(r.mem_cap_mib.map(|v| v.to_string())),
        opt(r.launches.map(|v| v.to_string())),
        opt(r.delayed.map(|v| v.to_string())),
        opt(r.delay_ms.map(|v| v.to_string())),
        opt(r.oom.map(|v| v.to_string())),
    )
}

/// The job's figures: where it ran, what the policies gave it and what the
/// node measured and policed (root-owned files), then the job's own claims
/// from its stats directory (xCUDA counters, the workload's figures), each
/// bounded ([`muxflow::records::report::claim_bound`]).
fn build_report(ctx: &ReportContext) -> JobReport {
    let mut r = JobReport {
        mode: Some(ctx.mode),
        node: Some(ctx.node.clone()),
        gpu: Some(ctx.gpu),
        sm_pct: ctx.sm_pct,
        mem_cap_mib: ctx.mem_cap_mib,
        run_s: Some(ctx.started.elapsed().as_secs()),
        ..JobReport::default()
    };
    // The partner at the start, else whoever shared the GPU by the end.
    let state = NodeState::new(ctx.config.paths.state_dir.as_path());
    r.partner = ctx
        .partner
        .or_else(|| partner(&state, ctx.gpu, ctx.job_id, ctx.mode));
    r.gang = ctx
        .gang
        .iter()
        .map(
            |&(gpu, sm_pct, mem_cap_mib)| muxflow::records::report::GangGpu {
                gpu,
                sm_pct: Some(sm_pct),
                mem_cap_mib,
                partner: partner(&state, gpu, ctx.job_id, ctx.mode),
            },
        )
        .collect();
    if let Some(text) = read_root_file(&state.terminated_by_other_file(ctx.job_id)) {
        r.terminated_by_other = Some(text.lines().count() as u32).filter(|&n| n > 0);
    }
    if ctx.mode == Mode::Offline {
        r.enforced_by = JobLimits::read_trusted(&state.limits_dir(), ctx.job_id, 0)
            .ok()
            .map(|(l, _)| l.enforced_by.to_string());
    }
    if let Some(text) = read_root_file(&state.policed_file(ctx.job_id)) {
        let codes = muxflow::records::limits::policed_codes(&text);
        r.policed = (!codes.is_empty()).then(|| codes.join(","));
    }
    let measured = read_root_file(&state.measured_file(ctx.job_id))
        .map(|t| muxflow::records::report::Measured::parse(&t))
        .unwrap_or_default();
    r.measured_peak_mib = measured.peak_mib;
    if r.partner.is_some() {
        r.partner_load_pct = measured.partner_load_pct;
        r.partner_sm_pct = measured.partner_sm_pct;
    }
    if ctx.mode == Mode::Offline {
        // At the start, at muxflow-police's checks, and now.
        r.peers = ctx.peers.clone();
        let now = offline_peers(&state, ctx);
        add_peers(
            &mut r.peers,
            Some(ctx.job_id),
            measured.peers.into_iter().chain(now),
        );
    }
    let Some(dir) = &ctx.stats_dir else { return r };
    let files = muxflow::records::report::read_claim_files(dir);
    r.add_claims(files.iter().map(|(n, t)| (n.as_str(), t.as_str())));
    if let Some(refused) = &r.claims_refused {
        tracing::warn!(
            job = ctx.job_id,
            refused,
            "claims out of bounds left out of the report"
        );
    }
    r
}

/// A small file root wrote in a root-owned directory (no symlink, at most
/// 4 KiB).
fn read_root_file(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != 0 {
        return None;
    }
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text).ok()?;
    Some(text)
}

/// A job of the other mode on the GPU: an offline job's online partner, or
/// an offline job an online job hosts.
/// The other offline jobs recorded on the job's GPUs now.
fn offline_peers(state: &NodeState, ctx: &ReportContext) -> Vec<u32> {
    std::iter::once(ctx.gpu)
        .chain(ctx.gang.iter().map(|g| g.0))
        .flat_map(|gpu| state.jobs(gpu).unwrap_or_default())
        .filter(|j| j.mode == Mode::Offline && j.job_id != ctx.job_id)
        .map(|j| j.job_id)
        .collect()
}

fn partner(state: &NodeState, gpu: u32, job_id: u32, mode: Mode) -> Option<u32> {
    let jobs = state.jobs(gpu).unwrap_or_default();
    jobs.into_iter()
        .find(|j| j.mode != mode && j.job_id != job_id)
        .map(|j| j.job_id)
}

/// The SM share, memory cap and enforcers of offline job `job_id` on GPU
/// `gpu`. Fixed by the job's first step (its limits file in `dir`): a later
/// step (srun) gets the same, so the node never polices a running process
/// against limits it did not start with.
fn job_limits_on(
    config: &Config,
    state: &NodeState,
    dir: &Path,
    job_id: u32,
    gpu: u32,
) -> anyhow::Result<(u8, Option<u64>, EnforcedBy)> {
    Ok(match JobLimits::read_trusted(dir, job_id, 0) {
        Ok((l, _)) if l.gpu == gpu => (l.sm_pct, l.mem_cap_mib, l.enforced_by),
        _ => {
            // Its slots' part of the policy's share, for the GPU's
            // online job or, on an idle GPU, for none.
            let share = state.offline_share(&config.policy, gpu, job_id)?;
            // A static SM partition or an MPS v3 namespace the
            // Prolog made holds the job to its SMs in the driver:
            // its share is theirs.
            let ns = state.mps_namespace(gpu, job_id);
            let (sm_pct, sm_by) = match (state.sm_partition(gpu, job_id), &ns) {
                (Some(p), _) => (p.percent(), Enforcer::Driver),
                (None, Some(ns)) => (ns.sm_pct, Enforcer::Driver),
                (None, None) => (share.sm_pct, Enforcer::Xcuda),
            };
            // The namespace's pinned limit is the cap the daemon holds.
            let ns_mem = ns.as_ref().and_then(|n| n.mem_mib);
            let cap = ns_mem.or(share.mem_cap_mib);
            let mem_by = match kernel_cap(config, state, job_id, gpu, cap) {
                Enforcer::Xcuda if ns_mem.is_some() => Enforcer::Driver,
                by => by,
            };
            let enforced_by = EnforcedBy {
                mem: mem_by,
                sm: sm_by,
            };
            (sm_pct, cap, enforced_by)
        }
    })
}

/// The variables every client of GPU `gpu`'s MPS daemon gets: its pipe, and
/// the device as that daemon shows it ([`mps::MpsDaemon::client_device`]:
/// the GPU's UUID, never the node's index, which the daemon renumbers).
fn device_env(config: &Config, gpu: u32) -> Vec<(&'static str, Option<String>)> {
    vec![
        (
            "CUDA_VISIBLE_DEVICES",
            Some(mps::MpsDaemon::for_gpu(config, gpu).client_device()),
        ),
        (
            "CUDA_MPS_PIPE_DIRECTORY",
            Some(mps::pipe_dir(config, gpu).to_string_lossy().into_owned()),
        ),
    ]
}

/// The variables a client of GPU `gpu`'s MPS server gets for offline job
/// `job_id`: the device, the pipe, its SM share and memory cap, its SM
/// partition, where its limits file is (None: unset).
fn client_env(
    config: &Config,
    state: &NodeState,
    job_id: u32,
    gpu: u32,
    sm_pct: u8,
    cap: Option<u64>,
    dir: &Path,
) -> Vec<(&'static str, Option<String>)> {
    let mut env = device_env(config, gpu);
    env.extend([
        (
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            Some(sm_pct.to_string()),
        ),
        // The client sees one device, its daemon's, as device 0.
        (
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            cap.map(|mib| format!("0={mib}M")),
        ),
        (
            muxflow::node::sm_partition::ENV,
            state.sm_partition(gpu, job_id).map(|p| p.id),
        ),
        (
            xcuda_env::LIMITS_DIR,
            Some(dir.to_string_lossy().into_owned()),
        ),
    ]);
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requeue_line_names_the_online_job_the_gpu_and_this_runs_figures() {
        let r = JobReport::decode(
            "muxflow:v1 mode=offline node=node4 gpu=0 sm_pct=80 mem_cap_mib=79511 partner=90 \
             run_s=7 claim.launches=11180 claim.delayed=3 claim.delay_ms=40 claim.oom=0",
        )
        .unwrap();
        let line = requeue_words(&r);
        for want in [
            "muxflow: requeued: online job 90 needed GPU 0 of node4",
            "This run: 7 s, SM share 80%, memory cap 79511 MiB, 11180 launches (3 delayed, 40 ms), OOM refusals 0",
        ] {
            assert!(line.contains(want), "{want:?} not in {line}");
        }
        // One line: slurmstepd prefixes each line of its log.
        assert!(!line.contains('\n'));
        // No partner recorded: said without an ID.
        let r = JobReport::decode("muxflow:v1 mode=offline node=n1 gpu=1 run_s=2").unwrap();
        assert!(
            requeue_words(&r).starts_with("muxflow: requeued: an online job needed GPU 1 of n1")
        );
    }
}
