//! The job path on the node: at job start, make sure each of the job's GPUs
//! has its MPS control daemon (multi-user) and record the job there; at job
//! end, forget it and stop the daemon once no muxflow job is left on the GPU.
//!
//! The job's GPUs come from Slurm, never from the user: `SLURM_JOB_GPUS`
//! (set by slurmd for gres/gpu) for online jobs, the typed offline slots
//! (`mfslot:g<i>:<s>`: s of GPU i's `[policy] offline_per_gpu` slots) read
//! from slurmctld for offline jobs. The job's part of the GPU is s of its
//! N parts (`muxflow::policy::share::offline_slot_share`); the Prolog records
//! which s slot indices it holds.
//!
//! An offline job runs only where muxflow placed it: its slot must be the
//! one the matcher wrote into its AdminComment ([`muxflow::records::placement`]), and
//! that GPU must be Healthy. Otherwise the job is refused: the reason goes
//! to `<state_dir>/refused/<job>` (the plugin refuses the job's tasks with
//! it, so the user reads it in the job's output, and puts the job back in
//! the queue, held, for the matcher to place again) and to its AdminComment
//! (`refused=<code>`). The Prolog still exits 0: a failing Prolog would
//! drain the node for what is the job's problem.

use anyhow::{Context, Result};
use muxflow::node::mps::MpsDaemon;
use muxflow::node::mps_v3::Protocol;
use muxflow::node::pipe_access::{self, Access};
use muxflow::node::state::{free_offline_slots, GpuLock, JobRecord, NodeState};
use muxflow::policy::health::HealthState;
use muxflow::records::admin_comment::AdminComment;
use muxflow::records::online_page;
use muxflow::records::placement::refused_admin_comment;
use muxflow::{Config, Mode};
use muxflow_slurm::cli::{HeldSlots, OfflineJob, Scontrol};

use crate::JobEnv;

/// The job's identity as the node programs need it.
struct Job {
    id: u32,
    node: String,
    mode: Mode,
    uid: u32,
    /// The job's SLUID where slurmd gives one (Slurm 26.05's
    /// `SLURM_JOB_SLUID`): the name of its cgroup there by default.
    sluid: Option<String>,
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
        sluid: std::env::var("SLURM_JOB_SLUID").ok(),
    }))
}

/// Why an offline job may not run here: a one-word code for its
/// AdminComment and the sentence the user reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: String,
    pub why: String,
}

/// The checks on an offline job's placement: `slurm` is what slurmctld
/// says of the job, `per_gpu` the slots a GPU has (`[policy]
/// offline_per_gpu`), `health` the recorded health of a GPU (None: never
/// stepped yet). Pure, so every case is a table row in the tests.
pub fn check_offline(
    job_id: u32,
    node: &str,
    slurm: &OfflineJob,
    per_gpu: u8,
    health: impl Fn(u32) -> Option<HealthState>,
) -> Result<(), Refusal> {
    let refuse = |code: &str, why: String| {
        Err(Refusal {
            code: code.to_string(),
            why: format!("offline job {job_id} refused on {node}: {why}"),
        })
    };
    let slots = |s: &[HeldSlots]| {
        if s.is_empty() {
            "no GPU (no offline slot)".to_string()
        } else {
            let v: Vec<String> = s
                .iter()
                .map(|h| match h.count {
                    1 => format!("g{}", h.gpu),
                    n => format!("g{} ({n} slots)", h.gpu),
                })
                .collect();
            format!("offline slot {}", v.join(","))
        }
    };
    let Some(comment) = &slurm.admin_comment else {
        return refuse(
            "unreadable",
            "a field of the job (its name, comment or a path) holds a line break that imitates Slurm's own lines (its AdminComment, its offline slots), so its placement cannot be read."
                .to_string(),
        );
    };
    let Some(placement) = AdminComment::parse(comment)
        .ok()
        .and_then(|c| c.placement())
    else {
        return refuse(
            "not_placed",
            format!(
                "it holds {} here, but muxflow-matcher never placed it (offline jobs run only where muxflow places them).",
                slots(&slurm.slots)
            ),
        );
    };
    if !placement.allows(node, &slurm.gpus()) {
        return refuse(
            "wrong_slot",
            format!(
                "it holds {} here, but muxflow-matcher placed it on {placement}.",
                slots(&slurm.slots)
            ),
        );
    }
    // Slurm keeps the slots of a GPU's jobs within its gres.conf records;
    // more than muxflow.toml's N would give the job more than the GPU's
    // budget.
    if let Some(h) = slurm.slots.iter().find(|h| h.count > u32::from(per_gpu)) {
        return refuse(
            "too_many_slots",
            format!(
                "it holds {} offline slots of GPU {}, more than the {per_gpu} a GPU has ([policy] offline_per_gpu); gres.conf gives the GPU more offline slot records than muxflow.toml allows (muxflow-doctor checks them).",
                h.count, h.gpu
            ),
        );
    }
    for gpu in slurm.gpus() {
        match health(gpu) {
            None | Some(HealthState::Healthy) => {}
            Some(state) => {
                return refuse(
                    &format!("gpu_{state}"),
                    format!("GPU {gpu} is {state} (offline work starts only on a healthy GPU)."),
                )
            }
        }
    }
    Ok(())
}

/// Records the refusal where the plugin and the user find it (`prior`: the
/// job's AdminComment, whose count of refusals it raises). Each part is
/// best effort: a full state directory must not stop the AdminComment.
fn refuse(config: &Config, state: &NodeState, job: &Job, r: &Refusal, prior: &str) {
    tracing::warn!(job = job.id, code = %r.code, "{}", r.why);
    if let Err(e) = state.refuse_job(job.id, &r.why) {
        tracing::error!(job = job.id, "cannot record the refusal: {e}");
    }
    let comment = refused_admin_comment(&r.code, prior);
    if let Err(e) = Scontrol::new(config).set_admin_comment(job.id, &comment) {
        tracing::error!(
            job = job.id,
            "cannot write the refusal into AdminComment: {e}"
        );
    }
}

/// The GPUs Slurm gave the job on this node, each with the number of its
/// offline slots the job holds (0 for an online job); an offline job's
/// only after its placement checks (empty when refused). With them, the
/// job's AdminComment ("" for an online job).
fn job_gpus(config: &Config, state: &NodeState, job: &Job) -> Result<(Vec<HeldSlots>, String)> {
    match job.mode {
        Mode::Online => {
            let list = std::env::var("SLURM_JOB_GPUS").unwrap_or_default();
            list.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let gpu = s
                        .trim()
                        .parse()
                        .with_context(|| format!("SLURM_JOB_GPUS has '{s}'"))?;
                    Ok(HeldSlots { gpu, count: 0 })
                })
                .collect::<Result<_>>()
                .map(|gpus| (gpus, String::new()))
        }
        Mode::Offline => {
            let slurm = Scontrol::new(config)
                .offline_job(job.id, &job.node, &config.slurm.offline_gres)
                .context("reading the job's offline slots from slurmctld")?;
            let health = |gpu| match state.health(gpu) {
                Ok(h) => h,
                Err(e) => {
                    // A corrupt health word: the next step rewrites it.
                    tracing::warn!(gpu, "{e}");
                    None
                }
            };
            let per_gpu = config.policy.offline_per_gpu;
            let prior = slurm.admin_comment.clone().unwrap_or_default();
            match check_offline(job.id, &job.node, &slurm, per_gpu, health) {
                Ok(()) => Ok((slurm.slots, prior)),
                Err(r) => {
                    refuse(config, state, job, &r, &prior);
                    Ok((Vec::new(), prior))
                }
            }
        }
    }
}

/// Prolog: start the GPUs' MPS daemons and record the job.
pub fn start(config: &Config, env: &JobEnv) -> Result<()> {
    let Some(job) = job(env)? else { return Ok(()) };
    let state = NodeState::new(config.paths.state_dir.as_path());
    let (held, prior) = job_gpus(config, &state, &job)?;
    let gpus: Vec<u32> = held.iter().map(|h| h.gpu).collect();
    if gpus.is_empty() {
        if job.mode == Mode::Online {
            tracing::warn!(
                job = job.id,
                "online job holds no GPU on {}; nothing to share",
                job.node
            );
        }
        return Ok(());
    }
    let mut recorded = Vec::new();
    for &slots in &held {
        if let Some(r) = record_on_gpu(config, &state, &job, slots, &mut recorded)? {
            // Nothing of the job stays behind on the GPUs recorded so far.
            refuse(config, &state, &job, &r, &prior);
            for &g in &recorded {
                let lock = state.lock_gpu(g)?;
                drop_namespace(config, &state, &lock, g, job.id);
                state.remove_job(&lock, g, job.id)?;
                admit_recorded_users(config, &state, &lock, g);
            }
            return Ok(());
        }
    }
    bound_job_files(&state, &job);
    if job.mode == Mode::Online {
        bound_online_pages(&state, &job, &gpus);
        make_room(config, &state, &job, &gpus);
        // After the offline jobs it requeued have gone (their partitions
        // with them): a daemon in static mode needs one for this job too.
        give_online_partitions(config, &state, &job, &gpus)?;
    }
    if job.mode == Mode::Offline {
        remove_limits_files(&state, job.id);
    }
    // The config this program runs with, for the watcher: an offline job's
    // polices it; an online job's records a foreign terminate_client of
    // its clients while it runs.
    match crate::config_path() {
        Some(path) => crate::police::spawn_watcher(path, job.id),
        None => tracing::error!(job = job.id, "muxflow-police not started: no config path"),
    }
    Ok(())
}

/// Records `job` on GPU `gpu` with its slots there, the GPU's MPS daemon
/// started, and an offline job's partition, namespace and dmem region;
/// `recorded` gains the GPU once its record is written. A refusal when the
/// job cannot run there (the caller undoes what `recorded` holds).
fn record_on_gpu(
    config: &Config,
    state: &NodeState,
    job: &Job,
    HeldSlots { gpu, count }: HeldSlots,
    recorded: &mut Vec<u32>,
) -> Result<Option<Refusal>> {
    let mut lock = state.lock_gpu(gpu)?;
    // An offline job takes `count` free slots of the GPU (as many as
    // Slurm gave it), under the lock: two Prologs never pick the same
    // one, so the parts of the jobs there never add up to more than the
    // GPU's budget (muxflow::policy::share::offline_slot_share).
    let mut on_gpu = state.jobs(gpu).unwrap_or_default();
    let per_gpu = config.policy.offline_per_gpu;
    let pick = |on_gpu: &[JobRecord]| match job.mode {
        Mode::Online => Some(Vec::new()),
        Mode::Offline => free_offline_slots(on_gpu, job.id, per_gpu, count),
    };
    let mut slots = pick(&on_gpu);
    if slots.is_none() {
        // Slurm gave this job the slots: a record holding them for a job
        // Slurm no longer runs here is one whose Epilog never ran.
        drop(lock);
        let others = on_gpu.iter().map(|r| r.job_id).filter(|&id| id != job.id);
        if let Err(e) = forget_those_gone(config, state, &job.node, &others.collect()) {
            tracing::warn!(job = job.id, gpu, "{e:#}");
        }
        lock = state.lock_gpu(gpu)?;
        on_gpu = state.jobs(gpu).unwrap_or_default();
        slots = pick(&on_gpu);
    }
    let Some(slots) = slots else {
        let others: Vec<&JobRecord> = on_gpu
            .iter()
            .filter(|r| r.mode == Mode::Offline && r.job_id != job.id)
            .collect();
        let taken: usize = others.iter().map(|r| r.slots.len().max(1)).sum();
        return Ok(Some(Refusal {
            code: "no_slot".into(),
            why: format!(
                "offline job {} refused on {}: it holds {count} of GPU {gpu}'s offline slots, but {} offline jobs there already hold {taken} of its {per_gpu} ([policy] offline_per_gpu); gres.conf gives it more mfslot records than muxflow.toml allows (muxflow-doctor checks them).",
                job.id,
                job.node,
                others.len(),
            ),
        }));
    };
    let daemon = daemon_to_start(config, gpu);
    match daemon.ensure_running(|| crate::gpu_caps::device_facts(config, gpu)) {
        Ok(r) if r.started => {
            tracing::info!(gpu, pipe = %daemon.pipe_dir().display(), mode = ?r.mode, "started the MPS control daemon")
        }
        Ok(_) => {}
        // The job still runs (without MPS its CUDA calls go to the GPU directly).
        Err(e) => tracing::error!(
            job = job.id,
            gpu,
            "cannot start the MPS control daemon: {e}"
        ),
    }
    let record = JobRecord {
        job_id: job.id,
        mode: job.mode,
        uid: job.uid,
        slots,
    };
    if let Err(e) = state.add_job(&lock, gpu, &record) {
        // The plugin finds no record and tells the user why (it checks
        // the space itself); the health step still runs and publishes.
        let why = state.space_problem().unwrap_or_else(|| e.to_string());
        anyhow::bail!("cannot record job {} on GPU {gpu}: {why} ({e})", job.id);
    }
    recorded.push(gpu);
    tracing::info!(job = job.id, gpu, mode = %job.mode, slots = ?record.slots, "recorded muxflow job");
    // Before the job's first step: its user may now reach the GPU's daemon.
    admit_recorded_users(config, state, &lock, gpu);
    if job.mode == Mode::Online {
        return Ok(None);
    }
    if daemon.runs_static_partitions() {
        // Every client of a daemon in static mode needs a partition: an
        // offline job that cannot have one does not run here.
        if let Err(why) = give_partition(config, state, &lock, job, gpu, &daemon) {
            return Ok(Some(Refusal {
                code: "no_sm_partition".into(),
                why: format!(
                    "offline job {} refused on {}: GPU {gpu}'s MPS daemon runs static SM partitions and the job cannot have one: {why}",
                    job.id, job.node
                ),
            }));
        }
    }
    if daemon.protocol() == Protocol::V3 {
        give_namespace(config, state, &lock, job, gpu, &daemon);
    }
    // Found per job: a node's kernel or driver may change between jobs.
    // The plugin writes the cap into the job's cgroup at its first step,
    // where the cap is fixed (muxflow::node::dmem).
    let region = crate::gpu_caps::dmem_region(config, gpu);
    if let Err(e) = state.set_dmem_region(&lock, gpu, region.as_deref()) {
        tracing::warn!(
            job = job.id,
            gpu,
            "cannot record the GPU's dmem region: {e}"
        );
    }
    Ok(None)
}

/// An online job's static SM partition on each of its GPUs whose daemon
/// runs in static mode; a GPU where it cannot have one is logged (the job
/// is not refused: it owns the GPU).
fn give_online_partitions(
    config: &Config,
    state: &NodeState,
    job: &Job,
    gpus: &[u32],
) -> Result<()> {
    for &gpu in gpus {
        let daemon = MpsDaemon::for_gpu(config, gpu);
        if !daemon.runs_static_partitions() {
            continue;
        }
        let lock = state.lock_gpu(gpu)?;
        if let Err(why) = give_partition(config, state, &lock, job, gpu, &daemon) {
            tracing::error!(
                job = job.id,
                gpu,
                "online job has no static SM partition, so its CUDA calls fail on this GPU's MPS daemon (static partitioning mode): {why}"
            );
        }
    }
    Ok(())
}

/// Makes job `job`'s static SM partition on GPU `gpu` (its daemon runs in
/// static mode) and records it for the plugin: an online job all the free
/// chunks but the policy's default offline share, an offline job its
/// policy share ([`muxflow::node::sm_partition::plan`]), chunk counts from the
/// daemon's `lspart`. The caller holds the GPU's lock.
fn give_partition(
    config: &Config,
    state: &NodeState,
    lock: &muxflow::node::state::GpuLock,
    job: &Job,
    gpu: u32,
    daemon: &MpsDaemon,
) -> Result<(), String> {
    use muxflow::node::sm_partition;
    let uuid = crate::gpu_caps::uuid(config, gpu).ok_or("NVML gives no UUID for the GPU")?;
    let chunks = daemon.chunks(&uuid).map_err(|e| e.to_string())?;
    let pct = match job.mode {
        Mode::Online => muxflow::policy::share::offline_sm_percent(&config.policy, None),
        Mode::Offline => {
            state
                .offline_share(&config.policy, gpu, job.id)
                .map_err(|e| e.to_string())?
                .sm_pct
        }
    };
    let online = job.mode == Mode::Online;
    let n = sm_partition::plan(online, chunks, pct)
        .ok_or_else(|| format!("no free chunk ({} of {} used)", chunks.used, chunks.total()))?;
    let id = daemon.add_partition(&uuid, n).map_err(|e| e.to_string())?;
    let record = sm_partition::Record {
        uuid,
        id,
        chunks: n,
        total_chunks: chunks.total(),
    };
    tracing::info!(job = job.id, gpu, partition = %record.id, chunks = n, total = record.total_chunks, "made the job's static SM partition");
    state
        .set_sm_partition(lock, gpu, job.id, &record)
        .map_err(|e| e.to_string())
}

/// Job `job`'s cgroup as its release names it, for the namespace the
/// daemon routes its clients by ([`muxflow::node::dmem::job_cgroup_for_prolog`];
/// `CgroupJobIdPaths` from the cgroup.conf beside the node's slurm.conf).
fn job_cgroup(config: &Config, job: &Job) -> String {
    use muxflow::config::slurm_conf;
    let cgroup_conf = slurm_conf::conf_dir(slurm_conf::discover().as_deref()).join("cgroup.conf");
    let id_paths = std::fs::read_to_string(cgroup_conf)
        .map(|t| muxflow::node::dmem::job_id_paths(&t))
        .unwrap_or(false);
    muxflow::node::dmem::job_cgroup_for_prolog(
        config.paths.cgroup_root.as_path(),
        job.id,
        job.sluid.as_deref(),
        id_paths,
    )
}

/// Makes offline job `job`'s MPS v3 namespace on GPU `gpu` (its daemon
/// speaks v3, which muxflow starts only where it routes clients by cgroup)
/// with the job's share, and records it for the plugin and the Epilog.
/// Anything refused: logged, nothing recorded, and the job keeps today's
/// limits (xCUDA's and MPS's client variables, policed). The caller holds
/// the GPU's lock.
fn give_namespace(
    config: &Config,
    state: &NodeState,
    lock: &muxflow::node::state::GpuLock,
    job: &Job,
    gpu: u32,
    daemon: &MpsDaemon,
) {
    let made = state
        .offline_share(&config.policy, gpu, job.id)
        .map_err(|e| e.to_string())
        .and_then(|share| {
            let ns = muxflow::node::mps_v3::Namespace::for_job(
                job.id,
                &job_cgroup(config, job),
                share.mem_cap_mib,
                share.sm_pct,
            );
            daemon.create_namespace(&ns).map_err(|e| e.to_string())?;
            if let Err(e) = state.set_mps_namespace(lock, gpu, job.id, &ns) {
                // Unrecorded, the Epilog would not find it: take it away.
                drop_made_namespace(daemon, job.id, &ns.name);
                return Err(e.to_string());
            }
            Ok(ns)
        });
    match made {
        Ok(ns) => tracing::info!(job = job.id, gpu, namespace = %ns.name, cgroup = %ns.cgroup, mem_mib = ?ns.mem_mib, sm_pct = ns.sm_pct, "made the job's MPS v3 namespace"),
        Err(why) => tracing::error!(
            job = job.id,
            gpu,
            "no MPS v3 namespace for the offline job, its limits stay xCUDA's and MPS's client variables (policed): {why}"
        ),
    }
}

/// GPU `gpu`'s daemon, set up to start as this node's driver allows: MPS
/// v3 for namespaces, or static SM partitions (asked only when none runs).
/// The Prolog and the health step's restarts start it alike.
pub fn daemon_to_start(config: &Config, gpu: u32) -> MpsDaemon {
    let daemon = MpsDaemon::for_gpu(config, gpu);
    if daemon.is_running() {
        return daemon;
    }
    let mut daemon = daemon.with_protocol(crate::gpu_caps::mps_protocol_wanted(config));
    if config.mps.sm_partitions {
        daemon =
            daemon.with_static_partitions(crate::gpu_caps::static_partitions_wanted(config, gpu));
    }
    daemon
}

/// After the health step started GPU `gpu`'s daemon again: the namespaces
/// of the offline jobs recorded there made again (a new daemon has none),
/// so their next processes are held as their limits files say. One that
/// cannot be made is logged; xCUDA and the police still hold the job.
pub fn restore_namespaces(config: &Config, state: &NodeState, gpu: u32) {
    let daemon = MpsDaemon::for_gpu(config, gpu);
    for job in state.jobs(gpu).unwrap_or_default() {
        let Some(ns) = state.mps_namespace(gpu, job.job_id) else {
            continue;
        };
        let made = match daemon.protocol() {
            Protocol::V3 => daemon.create_namespace(&ns).map_err(|e| e.to_string()),
            Protocol::V2 => Err("the daemon came back as MPS v2".to_string()),
        };
        match made {
            Ok(()) => tracing::info!(job = job.job_id, gpu, namespace = %ns.name, "made the job's MPS v3 namespace again"),
            Err(e) => tracing::error!(
                job = job.job_id,
                gpu,
                "cannot make the job's MPS v3 namespace {} again ({e}): its next processes are held by xCUDA and its MPS variables (policed) only",
                ns.name
            ),
        }
    }
}

/// Deletes job `job_id`'s namespace on GPU `gpu`, if the Prolog made one,
/// and its record (the Epilog, and a Prolog that refuses the job).
fn drop_namespace(
    config: &Config,
    state: &NodeState,
    lock: &muxflow::node::state::GpuLock,
    gpu: u32,
    job_id: u32,
) {
    let Some(ns) = state.mps_namespace(gpu, job_id) else {
        return;
    };
    let daemon = MpsDaemon::for_gpu(config, gpu);
    // A daemon gone took its namespaces with it.
    if daemon.is_running() {
        drop_made_namespace(&daemon, job_id, &ns.name);
    }
    state.forget_mps_namespace(lock, gpu, job_id);
}

fn drop_made_namespace(daemon: &MpsDaemon, job_id: u32, name: &str) {
    if let Err(e) = daemon.delete_namespace(name) {
        tracing::warn!(
            job = job_id,
            gpu = daemon.gpu(),
            "cannot delete the job's MPS v3 namespace {name}: {e}"
        );
    }
}

/// How long an online job's Prolog waits for the offline jobs it requeues
/// to leave its GPUs, from its start: the warning's grace, then the
/// requeue's SIGTERM (each job's xCUDA releases its GPU by
/// [`RELEASE_RESERVE`] before this ends, whatever the job does). Past this
/// the online job starts anyway, with the reason logged.
pub const OFFLINE_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(45);

/// What an offline job's release leaves of [`OFFLINE_EXIT_WAIT`] for its
/// process to exit and its Epilog to run.
pub const RELEASE_RESERVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest warning grace (a job's `--signal=…@<lead>`, capped): what
/// [`OFFLINE_EXIT_WAIT`] leaves after [`STOP_PHASE`].
pub const WARNING_GRACE_MAX: std::time::Duration = std::time::Duration::from_secs(25);

/// What the requeue's SIGTERM gets at least before the latest release: a
/// handler that checkpointed on the warning has only to exit.
pub const STOP_PHASE: std::time::Duration = std::time::Duration::from_secs(15);

// The warning, the stop and the exit fit the online job's wait.
const _: () = assert!(
    WARNING_GRACE_MAX.as_secs() + STOP_PHASE.as_secs() + RELEASE_RESERVE.as_secs()
        == OFFLINE_EXIT_WAIT.as_secs()
);

/// The offline jobs an online job arriving on `gpus` requeues: every one
/// recorded there. Each was sized for a GPU without this online job (an
/// idle GPU, or a partner that has since ended), and MPS fixes a client's
/// SM share and memory limit when it starts, so its cap cannot shrink: the
/// online job could otherwise fail for memory the offline job holds.
pub fn offline_jobs_to_requeue(online_job: u32, on_gpus: &[(u32, Vec<JobRecord>)]) -> Vec<u32> {
    let mut out: Vec<u32> = on_gpus
        .iter()
        .flat_map(|(_, jobs)| jobs.iter())
        .filter(|r| r.mode == Mode::Offline && r.job_id != online_job)
        .map(|r| r.job_id)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// An online job landed on GPUs that run offline jobs (idle GPUs
/// take offline work): put those back in the queue, held, for the matcher
/// to place again under the usual policy, and wait (bounded) until their
/// Epilog has run, so their memory is free before the online job starts.
/// Before the requeue each job gets its own warning, if its script asks
/// for one ([`muxflow::records::preempt`]), and up to its lead to checkpoint; its
/// xCUDA is told the latest release (its limits file), so that whatever the
/// job does with the signals its GPU is free within the online job's wait.
/// Best effort: the online job starts whatever happens, with each failure
/// logged.
fn make_room(config: &Config, state: &NodeState, job: &Job, gpus: &[u32]) {
    let start = std::time::Instant::now();
    let on_gpus: Vec<(u32, Vec<JobRecord>)> = gpus
        .iter()
        .map(|&g| (g, state.jobs(g).unwrap_or_default()))
        .collect();
    let victims = offline_jobs_to_requeue(job.id, &on_gpus);
    if victims.is_empty() {
        return;
    }
    let on_its_gpus = |id: u32| {
        gpus.iter().any(|&g| {
            state
                .jobs(g)
                .unwrap_or_default()
                .iter()
                .any(|r| r.job_id == id)
        })
    };
    let scontrol = Scontrol::new(config);
    // Before any signal: xCUDA in each job reads this at its stop signal.
    let release_by = std::time::SystemTime::now() + OFFLINE_EXIT_WAIT - RELEASE_RESERVE;
    let release_by_ms = release_by
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for &id in &victims {
        if let Err(e) =
            muxflow::records::limits::set_release_by(&state.limits_dir(), id, release_by_ms, 0)
        {
            tracing::error!(
                job = id,
                online_job = job.id,
                "cannot set the offline job's latest release ({e}); its xCUDA keeps its GPU until Slurm's KillWait"
            );
        }
    }
    let warn_until = warn(&scontrol, job.id, &victims);
    while start.elapsed() < warn_until && victims.iter().any(|&id| on_its_gpus(id)) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut waiting = Vec::new();
    for &id in &victims {
        let requeued = scontrol.requeue_hold(id).or_else(|e| {
            // Gone from its GPU during the warning: it may have requeued
            // itself (the Slurm recipes do) and wait in the queue, where
            // only a hold keeps it for the matcher; or it ended.
            if on_its_gpus(id) {
                Err(e)
            } else {
                scontrol.hold(id)
            }
        });
        match requeued {
            Ok(()) => {
                tracing::warn!(
                    job = id,
                    online_job = job.id,
                    "offline job requeued (held, for muxflow-matcher to place again): online job {} starts on its GPU",
                    job.id
                );
                waiting.push(id);
            }
            Err(e) => tracing::error!(
                job = id,
                online_job = job.id,
                "cannot requeue the offline job on the online job's GPU: {e}"
            ),
        }
    }
    loop {
        let left: Vec<u32> = waiting
            .iter()
            .copied()
            .filter(|&id| on_its_gpus(id))
            .collect();
        if left.is_empty() {
            tracing::info!(
                online_job = job.id,
                "requeued offline jobs left its GPUs after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            return;
        }
        if start.elapsed() >= OFFLINE_EXIT_WAIT {
            tracing::error!(
                online_job = job.id,
                "requeued offline jobs {left:?} still on its GPUs after {:?}; the online job starts anyway",
                OFFLINE_EXIT_WAIT
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Sends each job of `victims` whose script asks for a warning (`#SBATCH
/// --signal`) its signal; returns how long (from the online job's start)
/// to wait for them before the requeue: the longest lead asked, capped at
/// [`WARNING_GRACE_MAX`]; zero when none asked.
fn warn(scontrol: &Scontrol, online_job: u32, victims: &[u32]) -> std::time::Duration {
    let mut grace = std::time::Duration::ZERO;
    for &id in victims {
        let script = match scontrol.batch_script(id) {
            Ok(s) => s,
            // A slurmctld that does not answer costs one timeout, not one per job.
            Err(e) if e.is_timeout() => {
                tracing::warn!(job = id, "no warnings sent: {e}");
                return grace;
            }
            Err(e) => {
                tracing::warn!(
                    job = id,
                    "cannot read the job's batch script for its --signal: {e}"
                );
                continue;
            }
        };
        let Some(w) = muxflow::records::preempt::warning_in_script(&script) else {
            continue;
        };
        let name = muxflow::records::preempt::signal_name(w.signal).unwrap_or("?");
        match scontrol.signal_job(id, name, w.batch_only) {
            Ok(()) => {
                let g = muxflow::records::preempt::grace(&w, WARNING_GRACE_MAX);
                tracing::warn!(
                    job = id,
                    online_job,
                    "offline job warned with SIG{name} (its --signal): requeued in at most {g:?}"
                );
                grace = grace.max(g);
            }
            Err(e) => tracing::error!(job = id, "cannot send SIG{name} (its --signal): {e}"),
        }
    }
    grace
}

/// What the job's own directory (its xCUDA statistics and report files,
/// the user's to write) may hold: far more than those files need.
const JOB_FILES: muxflow::node::user_tree::Bounds = muxflow::node::user_tree::Bounds {
    mib: 16,
    inodes: 4096,
};

/// Gives the job's own directory a bounded filesystem of its user's, so
/// what the user writes there cannot fill the state filesystem the node's
/// records live on. Without it (no mount allowed here) the plugin makes a
/// plain directory, as before, and the node log says so.
fn bound_job_files(state: &NodeState, job: &Job) {
    let dir = state.xcuda_stats_dir(job.id);
    let gid = std::env::var("SLURM_JOB_GID")
        .ok()
        .and_then(|g| g.parse().ok());
    let made = (|| -> std::io::Result<()> {
        let gid = gid.ok_or_else(|| std::io::Error::other("SLURM_JOB_GID is not set"))?;
        // A run of the same job id before (a requeue) left nothing behind.
        muxflow::node::user_tree::remove(&dir)?;
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        muxflow::node::user_tree::mount_bounded(&dir, job.uid, gid, 0o700, JOB_FILES)
    })();
    if let Err(e) = made {
        tracing::warn!(
            job = job.id,
            "cannot bound the job's own directory {} ({e}); it is a plain directory on the state filesystem",
            dir.display()
        );
    }
}

/// Gives the online job's page on each of its GPUs a filesystem of its own
/// (root's, 0755, [`online_page::PAGE_FS_MIB`]), made anew: the plugin
/// creates the page there, owned by the job's user, who can then grow it
/// only that far. Without a mount (none allowed here) the page lives in a
/// plain directory on the state filesystem, and the node log says so.
fn bound_online_pages(state: &NodeState, job: &Job, gpus: &[u32]) {
    let bounds = muxflow::node::user_tree::Bounds {
        mib: online_page::PAGE_FS_MIB,
        inodes: online_page::PAGE_FS_INODES,
    };
    for &gpu in gpus {
        let dir = online_page::gpu_dir(state.dir(), gpu);
        // Under the GPU's lock: the Epilog of the job before may be
        // removing it.
        let made = state
            .lock_gpu(gpu)
            .map_err(std::io::Error::other)
            .and_then(|_lock| {
                remove_online_page(&dir)?;
                if let Some(parent) = dir.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                muxflow::node::user_tree::mount_bounded(&dir, 0, 0, 0o755, bounds)
            });
        if let Err(e) = made {
            tracing::warn!(
                job = job.id,
                gpu,
                "cannot bound the GPU's online page {} ({e}); it is a plain directory on the state filesystem",
                dir.display()
            );
        }
    }
}

/// Removes a GPU's online page directory `dir` (detaching its filesystem),
/// or the page file an older version kept at that path.
fn remove_online_page(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => muxflow::node::user_tree::remove(dir),
        Ok(_) => std::fs::remove_file(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// GPU `gpu`'s MPS pipe directory opened to the users of the jobs recorded
/// there and closed to every other user (muxflow::node::pipe_access), under
/// the GPU's lock whenever its jobs change and at each health step. It
/// never fails a job: where it cannot, the police still judge every client.
pub fn admit_recorded_users(config: &Config, state: &NodeState, _lock: &GpuLock, gpu: u32) {
    let dir = muxflow::node::mps::pipe_dir(config, gpu);
    // No directory, no daemon: the Prolog that starts one comes here next.
    if !dir.is_dir() {
        return;
    }
    let uids = match state.jobs(gpu) {
        Ok(jobs) => jobs.iter().map(|j| j.uid).collect(),
        Err(e) => {
            tracing::warn!(
                gpu,
                "cannot read the GPU's jobs to set who may reach its MPS daemon: {e}"
            );
            return;
        }
    };
    match pipe_access::admit_only(&dir, &uids) {
        Ok(Access::Users(users)) => {
            tracing::debug!(
                gpu,
                ?users,
                "MPS pipe directory open to its jobs' users only"
            )
        }
        Ok(Access::Open) => tracing::debug!(
            gpu,
            "{} keeps no ACLs: its MPS daemon stays reachable by every user",
            dir.display()
        ),
        Err(e) => tracing::warn!(gpu, "{e}"),
    }
}

/// Epilog: forget the job; stop a GPU's daemon when no muxflow job is left.
pub fn end(config: &Config, env: &JobEnv) -> Result<()> {
    let Some(job) = job(env)? else { return Ok(()) };
    forget(
        config,
        &NodeState::new(config.paths.state_dir.as_path()),
        job.id,
    )
}

/// What the Epilog does for job `job_id`: its records, its GPUs' daemons
/// once no muxflow job is left on them, its refusal, statistics and limits.
fn forget(config: &Config, state: &NodeState, job_id: u32) -> Result<()> {
    for gpu in state.gpus()? {
        let lock = state.lock_gpu(gpu)?;
        if !state.remove_job(&lock, gpu, job_id)? {
            continue;
        }
        tracing::info!(job = job_id, gpu, "forgot muxflow job");
        if let Some(p) = state.sm_partition(gpu, job_id) {
            // Its chunks go back to the GPU for the next job.
            let daemon = MpsDaemon::for_gpu(config, gpu);
            if daemon.is_running() {
                if let Err(e) = daemon.remove_partition(&p.uuid, &p.id) {
                    tracing::warn!(
                        job = job_id,
                        gpu,
                        "cannot remove the job's SM partition {}: {e}",
                        p.id
                    );
                }
            }
            state.forget_sm_partition(&lock, gpu, job_id);
        }
        drop_namespace(config, state, &lock, gpu, job_id);
        let left = state.jobs(gpu)?;
        if !left.iter().any(|j| j.mode == Mode::Online) {
            // The page speaks for no one now: it goes with its job, and
            // its writer's user keeps nothing of the state directory.
            let page = online_page::gpu_dir(state.dir(), gpu);
            if let Err(e) = remove_online_page(&page) {
                tracing::warn!(job = job_id, gpu, "cannot remove {}: {e}", page.display());
            }
        }
        if left.is_empty() {
            stop_daemon(&MpsDaemon::for_gpu(config, gpu));
        } else {
            admit_recorded_users(config, state, &lock, gpu);
        }
    }
    if let Err(e) = state.forget_refusal(job_id) {
        tracing::warn!(job = job_id, "{e}");
    }
    let stats = state.xcuda_stats_dir(job_id);
    if let Err(e) = muxflow::node::user_tree::remove(&stats) {
        tracing::warn!(job = job_id, "cannot remove {}: {e}", stats.display());
    }
    remove_limits_files(state, job_id);
    state.remove_police_claim(job_id);
    Ok(())
}

/// The health check's sweep: a job recorded on a GPU for at least `[health]
/// forget_gone_jobs_after_s` that Slurm no longer lists on `node` (its
/// Epilog never ran: slurmd restarted, the Epilog was killed) is forgotten
/// as its Epilog would have, so the GPU does not stay taken by it. A job
/// with a process on one of the node's GPUs (`on_gpus`) is kept; when Slurm
/// cannot be asked, nothing is forgotten.
pub fn forget_gone_jobs(
    config: &Config,
    node: &str,
    now: std::time::SystemTime,
    on_gpus: &std::collections::BTreeSet<u32>,
) -> Result<()> {
    let state = NodeState::new(config.paths.state_dir.as_path());
    let after = std::time::Duration::from_secs(config.health.forget_gone_jobs_after_s);
    let mut old = std::collections::BTreeSet::new();
    for gpu in state.gpus()? {
        for record in state.jobs(gpu)? {
            let written = state.job_recorded_at(gpu, record.job_id)?;
            let old_enough =
                written.is_some_and(|t| now.duration_since(t).unwrap_or_default() >= after);
            if old_enough && !on_gpus.contains(&record.job_id) {
                old.insert(record.job_id);
            }
        }
    }
    forget_those_gone(config, &state, node, &old)
}

/// Forgets those of `jobs` that Slurm does not list on `node`, as their
/// Epilog would have.
fn forget_those_gone(
    config: &Config,
    state: &NodeState,
    node: &str,
    jobs: &std::collections::BTreeSet<u32>,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    // Every state but finished ones (running, configuring, completing,
    // suspended): a job in its Epilog is still listed.
    let listed = Scontrol::new(config)
        .command("squeue", &["-h", "-w", node, "-o", "%A"])
        .with_context(|| format!("asking Slurm which jobs run on {node}"))?;
    let on_node = parse_job_ids(&listed)
        .with_context(|| format!("squeue's job list for {node}: '{}'", listed.trim()))?;
    for job_id in jobs.difference(&on_node) {
        tracing::warn!(
            job = job_id,
            "job recorded here is not on this node in Slurm (its Epilog never ran?); forgetting it as its Epilog would"
        );
        forget(config, state, *job_id)?;
    }
    Ok(())
}

/// Job ids, one per line (`squeue -o %A`).
fn parse_job_ids(text: &str) -> Result<std::collections::BTreeSet<u32>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.parse::<u32>().with_context(|| format!("job id '{l}'")))
        .collect()
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
    // A k-GPU job's per-GPU files (`limits/g<i>/<job>`).
    let gang_files: Vec<std::path::PathBuf> = std::fs::read_dir(state.limits_dir())
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with('g'))
                .map(|e| muxflow::records::limits::path(&e.path(), job_id))
                .collect()
        })
        .unwrap_or_default();
    for file in [
        muxflow::records::limits::path(&state.limits_dir(), job_id),
        state.policed_file(job_id),
        state.terminated_by_other_file(job_id),
        state.measured_file(job_id),
        state.evicted_file(job_id),
    ]
    .into_iter()
    .chain(gang_files)
    {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(job = job_id, "cannot remove {}: {e}", file.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an earlier run left at a path.
    type Leave = fn(&std::path::Path);

    #[test]
    fn an_online_page_is_bounded_and_whatever_was_left_at_its_path_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let state = NodeState::new(tmp.path());
        let job = Job {
            id: 9,
            node: "n".into(),
            mode: Mode::Online,
            uid: 1000,
            sluid: None,
        };
        // (what an earlier run left at the GPU's page path)
        let rows: [(&str, Leave); 3] = [
            ("nothing", |_| {}),
            ("an older version's page file", |d| {
                std::fs::create_dir_all(d.parent().unwrap()).unwrap();
                std::fs::write(d, [0u8; 64]).unwrap();
            }),
            ("a page directory with a page grown large", |d| {
                std::fs::create_dir_all(d).unwrap();
                std::fs::write(d.join("page"), vec![0u8; 1 << 20]).unwrap();
            }),
        ];
        for (what, leave) in rows {
            let dir = online_page::gpu_dir(state.dir(), 0);
            leave(&dir);
            bound_online_pages(&state, &job, &[0]);
            let m = std::fs::symlink_metadata(&dir).unwrap();
            assert!(m.is_dir(), "{what}");
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{what}");
            online_page::create(&online_page::path(state.dir(), 0), 7, 1000, 1000).unwrap();
            // A mount is not allowed everywhere (a container, not root):
            // there the directory is a plain one.
            let mounted = std::fs::read_to_string("/proc/self/mounts")
                .unwrap()
                .contains(&format!(" {} tmpfs ", dir.display()));
            if mounted {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(online_page::path(state.dir(), 0))
                    .unwrap();
                let grown = std::io::Write::write_all(&mut f, &vec![0u8; 2 << 20]);
                assert!(grown.is_err(), "{what}: the page grew past its filesystem");
            }
            remove_online_page(&dir).unwrap();
            assert!(!dir.exists(), "{what}");
        }
    }

    #[test]
    fn squeue_job_lists_read_as_ids_and_anything_else_is_refused() {
        let ids = parse_job_ids("12\n 345 \n\n").unwrap();
        assert_eq!(ids.into_iter().collect::<Vec<_>>(), [12, 345]);
        assert!(parse_job_ids("").unwrap().is_empty());
        let e = parse_job_ids("12\nsqueue: error: x\n").unwrap_err();
        assert!(format!("{e:#}").contains("squeue: error: x"), "{e:#}");
    }

    #[test]
    fn an_online_job_requeues_every_offline_job_on_its_gpus() {
        let rec = |job_id, mode| JobRecord {
            job_id,
            mode,
            uid: 1000,
            slots: vec![0],
        };
        struct Case {
            name: &'static str,
            on_gpus: Vec<(u32, Vec<JobRecord>)>,
            want: Vec<u32>,
        }
        let cases = [
            Case {
                name: "an idle GPU: nothing to requeue",
                on_gpus: vec![(0, vec![rec(9, Mode::Online)])],
                want: vec![],
            },
            Case {
                name: "an offline job placed while the GPU was idle",
                on_gpus: vec![(0, vec![rec(5, Mode::Offline), rec(9, Mode::Online)])],
                want: vec![5],
            },
            Case {
                name: "two GPUs, one offline job each, one left by an ended partner",
                on_gpus: vec![
                    (0, vec![rec(5, Mode::Offline), rec(9, Mode::Online)]),
                    (1, vec![rec(7, Mode::Offline), rec(9, Mode::Online)]),
                ],
                want: vec![5, 7],
            },
            Case {
                name: "another online job's record is not touched",
                on_gpus: vec![(0, vec![rec(8, Mode::Online), rec(9, Mode::Online)])],
                want: vec![],
            },
        ];
        for c in cases {
            assert_eq!(offline_jobs_to_requeue(9, &c.on_gpus), c.want, "{}", c.name);
        }
    }

    #[test]
    fn an_offline_job_runs_only_where_muxflow_placed_it_on_a_healthy_gpu() {
        struct Case {
            name: &'static str,
            comment: Option<&'static str>,
            /// (GPU, slots held of it), as read from slurmctld.
            slots: &'static [(u32, u32)],
            health: Option<HealthState>,
            refused: Option<&'static str>,
        }
        let placed = Some("muxflow:v1 mode=offline placed=node1:g0");
        let gang = Some("muxflow:v1 mode=offline gpus=2 placed=node1:g0,g1");
        let cases = [
            Case {
                name: "placed by the matcher, healthy",
                comment: placed,
                slots: &[(0, 1)],
                health: Some(HealthState::Healthy),
                refused: None,
            },
            Case {
                name: "placed, GPU never stepped yet",
                comment: placed,
                slots: &[(0, 1)],
                health: None,
                refused: None,
            },
            Case {
                name: "placed on a GPU that turned faulty",
                comment: placed,
                slots: &[(0, 1)],
                health: Some(HealthState::Faulty),
                refused: Some("gpu_faulty"),
            },
            Case {
                name: "placed on a busy GPU",
                comment: placed,
                slots: &[(0, 1)],
                health: Some(HealthState::Busy),
                refused: Some("gpu_busy"),
            },
            Case {
                name: "user moved it to another GPU",
                comment: placed,
                slots: &[(1, 1)],
                health: Some(HealthState::Healthy),
                refused: Some("wrong_slot"),
            },
            Case {
                name: "user added a slot",
                comment: placed,
                slots: &[(0, 1), (1, 1)],
                health: Some(HealthState::Healthy),
                refused: Some("wrong_slot"),
            },
            Case {
                name: "released without a slot",
                comment: Some("muxflow:v1 mode=offline"),
                slots: &[],
                health: None,
                refused: Some("not_placed"),
            },
            Case {
                name: "slot without placement",
                comment: Some("muxflow:v1 mode=offline"),
                slots: &[(0, 1)],
                health: Some(HealthState::Healthy),
                refused: Some("not_placed"),
            },
            Case {
                name: "forged AdminComment line",
                comment: None,
                slots: &[(0, 1)],
                health: Some(HealthState::Healthy),
                refused: Some("unreadable"),
            },
            Case {
                name: "no matcher: any slot",
                comment: Some("muxflow:v1 mode=offline placed=any"),
                slots: &[(1, 1)],
                health: Some(HealthState::Healthy),
                refused: None,
            },
            Case {
                name: "no matcher: faulty slot",
                comment: Some("muxflow:v1 mode=offline placed=any"),
                slots: &[(1, 1)],
                health: Some(HealthState::Faulty),
                refused: Some("gpu_faulty"),
            },
            Case {
                name: "placed alone on its GPU: all its slots (N = 2)",
                comment: placed,
                slots: &[(0, 2)],
                health: Some(HealthState::Healthy),
                refused: None,
            },
            Case {
                name: "more slots than a GPU has (gres.conf has more records than N)",
                comment: placed,
                slots: &[(0, 3)],
                health: Some(HealthState::Healthy),
                refused: Some("too_many_slots"),
            },
            Case {
                name: "a 1-GPU job holding slots of two GPUs",
                comment: placed,
                slots: &[(0, 2), (1, 1)],
                health: Some(HealthState::Healthy),
                refused: Some("wrong_slot"),
            },
            Case {
                name: "a 2-GPU gang, one slot of each",
                comment: gang,
                slots: &[(0, 1), (1, 1)],
                health: Some(HealthState::Healthy),
                refused: None,
            },
            Case {
                name: "a 2-GPU gang, both slots of one of its GPUs",
                comment: gang,
                slots: &[(0, 1), (1, 2)],
                health: Some(HealthState::Healthy),
                refused: None,
            },
            Case {
                name: "a 2-GPU gang holding more than a GPU has",
                comment: gang,
                slots: &[(0, 1), (1, 3)],
                health: Some(HealthState::Healthy),
                refused: Some("too_many_slots"),
            },
            Case {
                name: "a 2-GPU gang short of a GPU",
                comment: gang,
                slots: &[(0, 2)],
                health: Some(HealthState::Healthy),
                refused: Some("wrong_slot"),
            },
        ];
        for c in cases {
            let slurm = OfflineJob {
                slots: c
                    .slots
                    .iter()
                    .map(|&(gpu, count)| HeldSlots { gpu, count })
                    .collect(),
                admin_comment: c.comment.map(str::to_string),
            };
            let got = check_offline(7, "node1", &slurm, 2, |_| c.health);
            assert_eq!(
                got.as_ref().err().map(|r| r.code.as_str()),
                c.refused,
                "{}: {got:?}",
                c.name
            );
            if let Err(r) = got {
                assert!(
                    r.why.starts_with("offline job 7 refused on node1: "),
                    "{}",
                    r.why
                );
            }
        }
    }
}
