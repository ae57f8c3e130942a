//! Remote context: slurmstepd, once per job step.
//!
//! `init_post_opt` (root) sets the step's environment: MPS pipe directory and
//! client priority for both modes; for offline steps also the GPU, the SM
//! share and memory cap from the policies, the xCUDA settings and xCUDA in
//! LD_PRELOAD — always overwriting what the user set. Nothing here may fail
//! back to Slurm from `init`/`init_post_opt` (that drains the node): problems
//! are logged to the slurmd log, and an offline step that cannot be protected
//! is refused in `task_init` instead (the job fails, the node does not).
//! `exit` of the batch step (root, job still running) writes the job's
//! sharing figures into its AdminComment.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use muxflow::limits::JobLimits;
use muxflow::node_state::{write_atomic, NodeState};
use muxflow::policy::{offline_mem_cap_mib, offline_sm_percent};
use muxflow::report::{self, JobReport};
use muxflow::slurm_cli::Scontrol;
use muxflow::slurm_version::{SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT, SLURM_INTERACTIVE_STEP};
use muxflow::xcuda_env::{self, XcudaEnv};
use muxflow::{kv, mps, Config, Mode};
use slurm_spank::SpankHandle;

use crate::{preload, settings, OPTION};

/// The step's mode, exported to its tasks.
pub const MODE_VAR: &str = "MUXFLOW_MODE";
/// Where a workload may write its own figures (`key=value`) for the report.
pub const JOB_REPORT_VAR: &str = "MUXFLOW_JOB_REPORT";

#[derive(Default)]
pub struct RemoteState {
    pub mode: Option<Mode>,
    /// Why this offline step must not run; `task_init` refuses with it.
    refusal: Option<String>,
    /// Set in the batch step of a muxflow job: what `exit` reports.
    report: Option<ReportContext>,
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
    stats_dir: Option<PathBuf>,
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
        let value = match spank.get_option_value(OPTION) {
            Ok(Some(v)) => v.into_owned(),
            Ok(None) => return,
            Err(e) => {
                tracing::error!("muxflow: cannot read --{OPTION}: {e}");
                return;
            }
        };
        // Validated at submit; a value that still fails here was forged.
        let mode = match value.parse::<Mode>() {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("{e}; step runs without muxflow");
                return;
            }
        };
        self.mode = Some(mode);
        set(spank, MODE_VAR, mode.as_str());
        if let Err(e) = self.prepare(spank, mode, step) {
            let msg = format!("muxflow: {e}");
            tracing::error!("{msg}");
            if mode == Mode::Offline {
                // Unprotected offline work could hurt the online job: refuse it.
                self.refusal = Some(msg);
            }
        }
    }

    fn prepare(&mut self, spank: &mut SpankHandle, mode: Mode, step: u32) -> anyhow::Result<()> {
        let (_, config) = settings::load(spank)?;
        let node = node_name(spank)?;
        let config = config.for_node(&node)?;
        let job_id = spank.job_id()?;
        let state = NodeState::new(config.paths.state_dir.as_path());
        let Some((gpu, _)) = state.find_job(job_id)? else {
            anyhow::bail!(match mode {
                Mode::Offline => format!(
                    "offline job {job_id} holds no GPU on {node}: it was started before muxflow-matcher \
                     placed it (was it released by hand?). Resubmit it and let the matcher place it."
                ),
                Mode::Online => format!("job {job_id} was not recorded by the muxflow Prolog on {node}; it runs without MPS"),
            });
        };
        set(
            spank,
            "CUDA_MPS_PIPE_DIRECTORY",
            mps::pipe_dir(&config, gpu).to_string_lossy().as_ref(),
        );
        set(
            spank,
            "CUDA_MPS_CLIENT_PRIORITY",
            if mode == Mode::Offline { "1" } else { "0" },
        );

        let mut ctx = ReportContext {
            config: config.clone(),
            job_id,
            node,
            gpu,
            mode,
            sm_pct: None,
            mem_cap_mib: None,
            partner: partner(&state, gpu, job_id, mode),
            stats_dir: None,
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
        if mode == Mode::Offline {
            self.prepare_offline(spank, &config, &state, &mut ctx)?;
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
        let gpu = ctx.gpu;
        // The job's limits are fixed by its first step: a later step (srun)
        // gets the same, so the node never polices a running process against
        // limits it did not start with.
        let (sm_pct, cap) = match JobLimits::read_trusted(&state.limits_dir(), ctx.job_id, 0) {
            Ok((l, _)) if l.gpu == gpu => (l.sm_pct, l.mem_cap_mib),
            _ => {
                let facts = state.facts(gpu)?;
                (
                    offline_sm_percent(&config.policy, facts.online_solo_sm_pct),
                    offline_mem_cap_mib(&config.policy, &facts),
                )
            }
        };
        ctx.sm_pct = Some(sm_pct);
        ctx.mem_cap_mib = cap;

        set(spank, "CUDA_VISIBLE_DEVICES", &gpu.to_string());
        set(
            spank,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            &sm_pct.to_string(),
        );
        // The client sees one device (CUDA_VISIBLE_DEVICES): device 0.
        match cap {
            Some(mib) => set(
                spank,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                &format!("0={mib}M"),
            ),
            None => {
                unset(spank, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
                tracing::warn!(
                    job = ctx.job_id,
                    gpu,
                    "GPU memory not recorded yet: offline job runs without a memory cap"
                );
            }
        }

        let stats = ctx
            .stats_dir
            .clone()
            .expect("prepare made the stats directory");

        let mut env = XcudaEnv::from_config(&config.xcuda, gpu);
        env.mem_limit_bytes = cap.map(|m| m.saturating_mul(1 << 20));
        env.nvml_library = config
            .paths
            .nvml_library
            .as_ref()
            .map(|p| p.as_path().to_path_buf());
        env.health_file = Some(state.health_file(gpu));
        env.stats_dir = Some(stats.clone());
        // xCUDA reads its settings from this root-owned file, never from the
        // environment; the node polices the job against it.
        let limits = JobLimits {
            job_id: ctx.job_id,
            gpu,
            sm_pct,
            mem_cap_mib: cap,
            xcuda: env,
        };
        write_limits(&state.limits_dir(), &limits)?;
        for var in xcuda_env::ALL {
            unset(spank, var);
        }
        set(
            spank,
            xcuda_env::LIMITS_DIR,
            state.limits_dir().to_string_lossy().as_ref(),
        );
        set(
            spank,
            JOB_REPORT_VAR,
            stats.join("job.report").to_string_lossy().as_ref(),
        );
        let current = spank.getenv("LD_PRELOAD").ok().flatten();
        set(
            spank,
            "LD_PRELOAD",
            &preload::prepend(xcuda, current.as_deref()),
        );
        Ok(())
    }

    /// Per task, as the user: refuse an offline step that cannot be protected.
    pub fn task_init(&self) -> Result<(), Refused> {
        match &self.refusal {
            Some(why) => Err(Refused(why.clone())),
            None => Ok(()),
        }
    }

    /// End of the step (root). In the batch step, the job is still running:
    /// the last moment its AdminComment can be written.
    pub fn exit(&mut self) {
        let Some(ctx) = self.report.take() else {
            return;
        };
        let report = build_report(&ctx);
        let text = report.encode();
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

/// Writes `limits` (root, 0644) in `dir` (root, 0755), which must be a
/// plain directory of root: what xCUDA and the health check trust.
fn write_limits(dir: &Path, limits: &JobLimits) -> anyhow::Result<()> {
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
    let path = muxflow::limits::path(dir, limits.job_id);
    write_atomic(&path, limits.encode().as_bytes())?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// The job's figures: where it ran, what the policies gave it and what the
/// node measured and policed (root-owned files), then the job's own claims
/// from its stats directory (xCUDA counters, the workload's figures), each
/// bounded ([`muxflow::report::claim_bound`]).
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
    if let Some(text) = read_root_file(&state.policed_file(ctx.job_id)) {
        let codes = muxflow::limits::policed_codes(&text);
        r.policed = (!codes.is_empty()).then(|| codes.join(","));
    }
    r.measured_peak_mib = read_root_file(&state.measured_file(ctx.job_id))
        .and_then(|t| kv::parse(t.trim()).ok())
        .and_then(|m| m.get("peak_mib")?.parse().ok());
    let Some(dir) = &ctx.stats_dir else { return r };
    let mut refused: Vec<&'static str> = Vec::new();
    let mut peak_bytes: Option<u64> = None;
    let mut delay_us: Option<u64> = None;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(map) = read_user_kv(&entry.path()) else {
            continue;
        };
        let mut int = |key: &'static str, bound_key: &'static str| -> Option<u64> {
            let raw = map.get(key)?;
            let v = report::claim_u64(bound_key, raw);
            if v.is_none() && !refused.contains(&bound_key) {
                refused.push(bound_key);
            }
            v
        };
        if name.starts_with("xcuda.") {
            let add = |acc: Option<u64>, v: Option<u64>| match (acc, v) {
                (a, None) => a,
                (None, Some(v)) => Some(v),
                (Some(a), Some(v)) => Some(a.saturating_add(v)),
            };
            r.launches = add(r.launches, int("launches", "launches"));
            r.delayed = add(r.delayed, int("delayed", "delayed"));
            r.oom = add(r.oom, int("oom", "oom"));
            // Microseconds, bounded as the milliseconds they become.
            delay_us = add(delay_us, int("delay_us", "delay_ms"));
            let peak = map
                .get("peak_bytes")
                .and_then(|b| b.trim().parse::<u64>().ok());
            match peak.map(|b| b >> 20) {
                Some(mib) if report::claim_u64("peak_mib", &mib.to_string()).is_some() => {
                    peak_bytes = peak_bytes.max(peak);
                }
                None if !map.contains_key("peak_bytes") => {}
                _ => refused.push("peak_mib"),
            }
        } else if name == "job.report" {
            r.steps = int("steps", "steps");
            r.requests = int("requests", "requests");
            let mut float = |key: &'static str| -> Option<f64> {
                let raw = map.get(key)?;
                let v = report::claim_f64(key, raw);
                if v.is_none() && !refused.contains(&key) {
                    refused.push(key);
                }
                v
            };
            r.steps_per_s = float("steps_per_s");
            r.rps = float("rps");
            r.p50_ms = float("p50_ms");
            r.p99_ms = float("p99_ms");
        }
    }
    r.delay_ms = delay_us.map(|us| us / 1000);
    r.peak_mib = peak_bytes.map(|b| b >> 20);
    if !refused.is_empty() {
        tracing::warn!(
            job = ctx.job_id,
            ?refused,
            "claims out of bounds left out of the report"
        );
        r.claims_refused = Some(refused.join(","));
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
fn partner(state: &NodeState, gpu: u32, job_id: u32, mode: Mode) -> Option<u32> {
    let jobs = state.jobs(gpu).unwrap_or_default();
    jobs.into_iter()
        .find(|j| j.mode != mode && j.job_id != job_id)
        .map(|j| j.job_id)
}

/// Reads a small `key=value` file the job's user wrote, as root: no
/// symlinks, no FIFOs (O_NONBLOCK + regular-file check), at most 4 KiB.
fn read_user_kv(path: &Path) -> Option<std::collections::BTreeMap<String, String>> {
    use std::io::Read;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text).ok()?;
    // A workload may write several lines; the last complete one counts.
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let words: Vec<&str> = line
        .split_whitespace()
        .filter(|w| w.contains('='))
        .collect();
    kv::parse(&words.join(" ")).ok()
}
