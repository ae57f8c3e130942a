//! The job path on the node: at job start, make sure each of the job's GPUs
//! has its MPS control daemon (multi-user) and record the job there; at job
//! end, forget it and stop the daemon once no muxflow job is left on the GPU.
//!
//! The job's GPUs come from Slurm, never from the user: `SLURM_JOB_GPUS`
//! (set by slurmd for gres/gpu) for online jobs, the typed offline slot
//! (`mfslot:g<i>`) read from slurmctld for offline jobs.

use anyhow::{Context, Result};
use muxflow::mps::MpsDaemon;
use muxflow::node_state::{JobRecord, NodeState};
use muxflow::slurm_cli::Scontrol;
use muxflow::{Config, Mode};

use crate::JobEnv;

/// The job's identity as the node programs need it.
struct Job {
    id: u32,
    node: String,
    mode: Mode,
    uid: u32,
}

fn job(env: &JobEnv) -> Result<Option<Job>> {
    let Some(mode) = env.mode else {
        return Ok(None); // not a muxflow job
    };
    let id = env
        .job_id
        .as_deref()
        .context("SLURM_JOB_ID is not set")?
        .parse()
        .context("SLURM_JOB_ID is not a number")?;
    let node = env.node.clone().context("SLURMD_NODENAME is not set")?;
    let uid = std::env::var("SLURM_JOB_UID")
        .ok()
        .and_then(|u| u.parse().ok())
        .context("SLURM_JOB_UID is not set")?;
    Ok(Some(Job {
        id,
        node,
        mode,
        uid,
    }))
}

/// The GPUs Slurm gave the job on this node.
fn job_gpus(config: &Config, job: &Job) -> Result<Vec<u32>> {
    match job.mode {
        Mode::Online => {
            let list = std::env::var("SLURM_JOB_GPUS").unwrap_or_default();
            list.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.trim()
                        .parse()
                        .with_context(|| format!("SLURM_JOB_GPUS has '{s}'"))
                })
                .collect()
        }
        Mode::Offline => Scontrol::new(config)
            .offline_slots(job.id, &job.node, &config.slurm.offline_gres)
            .context("reading the job's offline slot from slurmctld"),
    }
}

/// Prolog: start the GPUs' MPS daemons and record the job.
pub fn start(config: &Config, env: &JobEnv) -> Result<()> {
    let Some(job) = job(env)? else { return Ok(()) };
    let gpus = job_gpus(config, &job)?;
    if gpus.is_empty() {
        tracing::warn!(
            job = job.id,
            mode = %job.mode,
            "muxflow job holds no GPU on {} (an offline job released before the matcher placed it?); nothing to share",
            job.node
        );
        return Ok(());
    }
    let state = NodeState::new(config.paths.state_dir.as_path());
    for gpu in gpus {
        let lock = state.lock_gpu(gpu)?;
        let daemon = MpsDaemon::for_gpu(config, gpu);
        match daemon.ensure_running() {
            Ok(true) => {
                tracing::info!(gpu, pipe = %daemon.pipe_dir().display(), "started the MPS control daemon")
            }
            Ok(false) => {}
            // The job still runs (without MPS its CUDA calls go to the GPU directly).
            Err(e) => tracing::error!(
                job = job.id,
                gpu,
                "cannot start the MPS control daemon: {e}"
            ),
        }
        state.add_job(
            &lock,
            gpu,
            &JobRecord {
                job_id: job.id,
                mode: job.mode,
                uid: job.uid,
            },
        )?;
        tracing::info!(job = job.id, gpu, mode = %job.mode, "recorded muxflow job");
    }
    if job.mode == Mode::Offline {
        remove_limits_files(&state, job.id);
        // The config path this program was given, for the watcher.
        match <crate::Cli as clap::Parser>::try_parse() {
            Ok(cli) => crate::police::spawn_watcher(&cli.config, job.id),
            Err(e) => tracing::error!(job = job.id, "muxflow-police not started: {e}"),
        }
    }
    Ok(())
}

/// Epilog: forget the job; stop a GPU's daemon when no muxflow job is left.
pub fn end(config: &Config, env: &JobEnv) -> Result<()> {
    let Some(job) = job(env)? else { return Ok(()) };
    let state = NodeState::new(config.paths.state_dir.as_path());
    for gpu in state.gpus()? {
        let lock = state.lock_gpu(gpu)?;
        if !state.remove_job(&lock, gpu, job.id)? {
            continue;
        }
        tracing::info!(job = job.id, gpu, "forgot muxflow job");
        if state.jobs(gpu)?.is_empty() {
            stop_daemon(&MpsDaemon::for_gpu(config, gpu));
        }
    }
    let stats = state.xcuda_stats_dir(job.id);
    match std::fs::remove_dir_all(&stats) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(job = job.id, "cannot remove {}: {e}", stats.display()),
    }
    remove_limits_files(&state, job.id);
    Ok(())
}

/// Evicts stragglers (clients whose job is gone but whose process lingers)
/// the safe way, then stops the daemon and removes its pipe directory.
fn stop_daemon(daemon: &MpsDaemon) {
    if daemon.is_running() {
        for server in daemon.server_pids().unwrap_or_default() {
            for client in daemon.client_pids(server).unwrap_or_default() {
                match daemon.terminate_client(server, client) {
                    Ok(()) => tracing::info!(
                        gpu = daemon.gpu(),
                        server,
                        client,
                        "terminated straggling MPS client"
                    ),
                    Err(e) => {
                        tracing::warn!(gpu = daemon.gpu(), client, "terminate_client failed: {e}")
                    }
                }
            }
        }
    }
    match daemon.quit() {
        Ok(()) => tracing::info!(gpu = daemon.gpu(), "stopped the MPS control daemon"),
        Err(e) => tracing::error!(
            gpu = daemon.gpu(),
            "cannot stop the MPS control daemon: {e}"
        ),
    }
}

/// Removes job `job_id`'s limits, policing and measurement files (at its
/// end, and at its start in case an earlier job of that id left them).
fn remove_limits_files(state: &NodeState, job_id: u32) {
    for file in [
        muxflow::limits::path(&state.limits_dir(), job_id),
        state.policed_file(job_id),
        state.measured_file(job_id),
    ] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(job = job_id, "cannot remove {}: {e}", file.display()),
        }
    }
}
