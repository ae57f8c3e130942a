//! Policing offline jobs' processes: what the job could take out of its own
//! environment (xCUDA in LD_PRELOAD, the MPS client settings) is checked
//! from outside, on every step of the GPU (Prolog, Epilog, health check).
//!
//! A process is policed when it belongs to an offline job with a limits
//! file on this node ([`muxflow::node::jobproc`] says which job, from the job's
//! cgroup or its root slurmstepd ancestor; never from its environment) and
//! it is on this GPU (an NVML compute process or a client of the GPU's MPS
//! server). Checked against the job's root-owned limits
//! ([`muxflow::records::limits`]):
//!
//! | code | what |
//! |---|---|
//! | `wrong_gpu` | it uses a GPU other than the one the job was placed on |
//! | `not_mps` | it is on the GPU but not a client of the GPU's MPS server |
//! | `no_xcuda` | xCUDA is not mapped in it (`/proc/<pid>/maps`), or it is but its start-up never ran there (no stats file naming the process's start) |
//! | `priority` | it started with `CUDA_MPS_CLIENT_PRIORITY` other than 1 |
//! | `sm_partition` | the job has a static SM partition and it started with another `CUDA_MPS_SM_PARTITION` |
//! | `sm_pct` | its `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` is missing or above the job's |
//! | `mem_limit` | its `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` is missing or above the job's cap |
//! | `mem_used` | NVML reports it using more GPU memory than the job's cap |
//!
//! Any job on the node can name a GPU's pipe directory, whatever its own
//! GPUs: a client of the GPU's MPS daemon whose job is neither the GPU's
//! recorded online job nor an offline job placed there (a job that is not
//! muxflow's, another GPU's online job) is evicted (`not_on_gpu`).
//!
//! A client of the GPU's MPS daemon that belongs to no running job is a
//! straggler (`no_job`): it escaped its job's process tree, so it outlived
//! the job, and it is evicted once the job it names is no longer recorded
//! on the GPU for its own user (see [`police_gpu`]).
//!
//! The environment checked is `/proc/<pid>/environ`: what the process
//! started with, which is what the MPS client library read at its start
//! (the settings are fixed then). A process can overwrite that memory
//! afterwards; the memory check does not depend on it.
//!
//! Two programs police: every health step (all offline jobs of the GPU,
//! every `HealthCheckInterval` and at each Prolog and Epilog), and
//! `muxflow-police`, which the Prolog starts for each offline job and which
//! checks the job's GPU every `health.police_interval_ms` until the Epilog
//! has forgotten the job ([`watch`]).
//!
//! An MPS client out of bounds is evicted with `terminate_client` (safe for
//! the server and the other clients); a process on the GPU outside MPS is
//! killed (it shares no server to hurt). The reason goes to the process's
//! stderr (written with the process owner's rights, never root's), the
//! slurmd log, and `<state_dir>/limits/<job>.policed`, which the plugin puts
//! into the job's AdminComment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use muxflow::node::jobproc::Procfs;
use muxflow::node::mps::MpsDaemon;
use muxflow::node::state::NodeState;
use muxflow::records::limits::JobLimits;
use muxflow::records::report::{add_peers, format_peers, parse_peers};
use muxflow::Config;

use crate::nvml::Process;

/// What the node knows about one process on the GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub xcuda_mapped: bool,
    /// xCUDA's start-up ran in it: its stats file names the process's
    /// start ([`muxflow::records::report::xcuda_started`]).
    pub xcuda_started: bool,
    /// The MPS variables it started with.
    pub env: BTreeMap<String, String>,
    /// GPU memory NVML attributes to it.
    pub used_mib: Option<u64>,
    /// The MPS server it is a client of, if any.
    pub mps_server: Option<u32>,
}

/// Why a process is out of bounds: (code, reason for the user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub code: &'static str,
    pub reason: String,
}

/// The MPS settings a client reads from its environment at its start.
const ENV_VARS: [&str; 4] = [
    "CUDA_MPS_CLIENT_PRIORITY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    muxflow::node::sm_partition::ENV,
];

/// Checks one process of job `limits.job_id` seen on GPU `gpu`;
/// `partition`: the job's static SM partition there, if it has one (the
/// driver holds a client to the partition it names, so the name is what
/// is policed: another job's would give it that job's SMs).
pub fn check(
    facts: &Facts,
    limits: &JobLimits,
    gpu: u32,
    partition: Option<&str>,
) -> Option<Verdict> {
    let v = |code, reason: String| Some(Verdict { code, reason });
    if gpu != limits.gpu {
        return v(
            "wrong_gpu",
            format!(
                "it uses GPU {gpu}, but the job was placed on GPU {}",
                limits.gpu
            ),
        );
    }
    if facts.mps_server.is_none() {
        return v(
            "not_mps",
            format!(
                "it uses GPU {gpu} outside the GPU's MPS server (CUDA_MPS_PIPE_DIRECTORY changed)"
            ),
        );
    }
    if !facts.xcuda_mapped {
        return v(
            NO_XCUDA,
            "xCUDA is not loaded in it (LD_PRELOAD changed)".into(),
        );
    }
    if !facts.xcuda_started {
        return v(
            NO_XCUDA,
            "xCUDA's start-up did not run in it (the library is mapped, but never started)".into(),
        );
    }
    let env = |k: &str| facts.env.get(k).map(String::as_str);
    if env("CUDA_MPS_CLIENT_PRIORITY").map(str::trim) != Some("1") {
        return v(
            "priority",
            format!(
                "it started with CUDA_MPS_CLIENT_PRIORITY={} instead of 1",
                env("CUDA_MPS_CLIENT_PRIORITY").unwrap_or("(unset)")
            ),
        );
    }
    if let Some(want) = partition {
        let given = env(muxflow::node::sm_partition::ENV);
        if given.map(str::trim) != Some(want) {
            return v(
                "sm_partition",
                format!(
                    "it started with {}={} instead of the job's partition {want}",
                    muxflow::node::sm_partition::ENV,
                    given.unwrap_or("(unset)")
                ),
            );
        }
    }
    let pct = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if pct
        .and_then(|p| p.trim().parse::<f64>().ok())
        .is_none_or(|p| p > f64::from(limits.sm_pct))
    {
        return v(
            "sm_pct",
            format!(
                "it started with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={} instead of at most {}",
                pct.unwrap_or("(unset)"),
                limits.sm_pct
            ),
        );
    }
    if let Some(cap) = limits.mem_cap_mib {
        let given = env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
        if given.and_then(pinned_limit_mib).is_none_or(|m| m > cap) {
            return v(
                "mem_limit",
                format!(
                    "it started with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={} instead of at most 0={cap}M",
                    given.unwrap_or("(unset)")
                ),
            );
        }
        if let Some(used) = facts.used_mib.filter(|u| *u > cap) {
            return v(
                "mem_used",
                format!("it uses {used} MiB of GPU memory, above the job's cap of {cap} MiB"),
            );
        }
    }
    None
}

/// The code of a process without a running xCUDA.
pub const NO_XCUDA: &str = "no_xcuda";

/// Device 0's limit in `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` ("0=8G,1=512M"),
/// in MiB (rounded up); None when absent or unreadable.
pub fn pinned_limit_mib(value: &str) -> Option<u64> {
    let v = value
        .split(',')
        .find_map(|e| e.trim().strip_prefix("0="))?
        .trim();
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let bytes = match unit {
        "" => Some(n),
        "K" | "k" => n.checked_mul(1 << 10),
        "M" | "m" => n.checked_mul(1 << 20),
        "G" | "g" => n.checked_mul(1 << 30),
        "T" | "t" => n.checked_mul(1 << 40),
        _ => None,
    }?;
    Some(bytes.div_ceil(1 << 20))
}

/// A process the node terminated: which, of which job (None: of no
/// running job, a straggler), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminated {
    pub pid: u32,
    pub job: Option<u32>,
    pub verdict: Verdict,
}

/// A process to evict: what it is and why, its MPS server, the writer
/// telling it why.
type Eviction = (Terminated, Option<u32>, Option<std::process::Child>);

/// The code of a straggler: an MPS client of the GPU's daemon that belongs
/// to no running Slurm job.
pub const NO_JOB: &str = "no_job";

/// Polices every process of an offline job on GPU `gpu`, and evicts the
/// GPU's stragglers; returns the processes terminated.
///
/// A straggler is a client of muxflow's MPS daemon (which only jobs' steps
/// reach) that belongs to no running job step and whose job, as its
/// `SLURM_JOB_ID` names it, is not recorded on the GPU for its own user: it escaped its job's
/// process tree (a double fork, or a fork while Slurm was killing the
/// step), so Slurm's `proctrack/linuxproc` did not end it with its job, and
/// nothing else would: its job's limits and watcher are gone, and the
/// daemon runs on for the GPU's other jobs.
pub fn police_gpu(
    config: &Config,
    ns: &NodeState,
    mps: &MpsDaemon,
    gpu: u32,
    nvml_processes: &[Process],
) -> Vec<Terminated> {
    let procfs = &Procfs::default();
    // The limits files are root's (muxflow's node programs run as root).
    let owner = 0;
    let limits_dir = ns.limits_dir();
    // MPS clients of this GPU's servers: pid -> server (none without a
    // daemon: nothing is asked then).
    let clients = mps_clients(mps);
    let any_offline = std::fs::read_dir(&limits_dir)
        .map(|d| {
            d.flatten().any(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
        })
        .unwrap_or(false);
    if !any_offline && clients.is_empty() {
        return Vec::new();
    }
    note_clients(ns, procfs, gpu, &clients);
    let used: BTreeMap<u32, Option<u64>> =
        nvml_processes.iter().map(|p| (p.pid, p.used_mib)).collect();
    let pids: BTreeSet<u32> = clients.keys().chain(used.keys()).copied().collect();
    // xCUDA is known by the file itself (device and inode), not its name.
    let xcuda = FileId::of(config.paths.xcuda_library.as_path());
    let mut out = Vec::new();
    let mut evict: Vec<Eviction> = Vec::new();
    let mut peaks: BTreeMap<u32, u64> = BTreeMap::new();
    // The jobs recorded on the GPU (under the caller's lock of it), read
    // only if a process of no job is found.
    let recorded = std::cell::OnceCell::new();
    for pid in pids {
        let Some(job) = procfs.job_of(pid) else {
            let Some(&server) = clients.get(&pid) else {
                continue;
            };
            let recorded = recorded.get_or_init(|| recorded_jobs(ns, gpu));
            if names_a_recorded_job(procfs, pid, recorded) {
                continue;
            }
            let verdict = Verdict {
                code: NO_JOB,
                reason: "it belongs to no running Slurm job (it outlived its job)".into(),
            };
            let message = format!(
                "muxflow: process {pid} is evicted from GPU {gpu} (MPS terminate_client) \
                 by the node: {}; a process must end with its job",
                verdict.reason
            );
            let terminated = Terminated {
                pid,
                job: None,
                verdict,
            };
            evict.push(announce(
                config,
                procfs,
                gpu,
                terminated,
                Some(server),
                &message,
            ));
            continue;
        };
        // A k-GPU job's limits for this GPU, else the job's (1-GPU) file.
        let gang_dir = muxflow::records::limits::gpu_dir(&limits_dir, gpu);
        let limits = match JobLimits::read_trusted(&gang_dir, job, owner)
            .or_else(|_| JobLimits::read_trusted(&limits_dir, job, owner))
        {
            Ok((l, _)) => l,
            // Not an offline job of this node: an online job, or a job that
            // is not muxflow's. Only the GPU's own jobs may be its clients.
            Err(muxflow::records::limits::LimitsError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                let recorded = recorded.get_or_init(|| recorded_jobs(ns, gpu));
                if let Some(server) = foreign_client(job, recorded, clients.get(&pid).copied()) {
                    evict.extend(evict_foreign(config, procfs, ns, gpu, pid, job, server));
                }
                continue;
            }
            Err(e) => {
                tracing::error!(gpu, pid, job, "cannot police: {e}");
                continue;
            }
        };
        let stats_dir = ns.xcuda_stats_dir(job);
        let facts = Facts {
            xcuda_mapped: xcuda.is_some_and(|id| maps_executable(procfs, pid, id)),
            xcuda_started: xcuda_started(procfs, &stats_dir, pid),
            env: environ(procfs, pid, &ENV_VARS),
            used_mib: used.get(&pid).copied().flatten(),
            mps_server: clients.get(&pid).copied(),
        };
        if let Some(mib) = facts.used_mib {
            let peak = peaks.entry(job).or_insert(0);
            *peak = peak.saturating_add(mib);
        }
        let partition = ns.sm_partition(gpu, job).map(|p| p.id);
        let Some(verdict) = check(&facts, &limits, gpu, partition.as_deref()) else {
            continue;
        };
        // A process NVML saw before it showed in the server's list (it was
        // connecting) is not outside MPS: ask the server again first.
        if verdict.code == "not_mps" && !outside_mps_after_grace(procfs, mps, pid) {
            continue;
        }
        if already_policed(ns, job, pid) || evicted_for_health_lately(ns, job, pid) {
            // Terminated before; it stays listed until it exits (MPS lists
            // an evicted client until then) and can no longer use the GPU.
            tracing::debug!(gpu, pid, job, "already terminated");
            continue;
        }
        // xCUDA starts right after the driver's cuInit, which attached the
        // client: one caught in between is given a moment.
        if verdict.code == NO_XCUDA
            && facts.xcuda_mapped
            && starts_xcuda_within_grace(procfs, &stats_dir, pid)
        {
            continue;
        }
        let how = match facts.mps_server {
            Some(_) => "evicted from the GPU (MPS terminate_client)",
            None => "killed",
        };
        let message = format!(
            "muxflow: process {pid} of offline job {job} is {how} by the node: {}; \
             an offline job must run with the limits muxflow gives it",
            verdict.reason
        );
        let terminated = Terminated {
            pid,
            job: Some(job),
            verdict,
        };
        evict.push(announce(
            config,
            procfs,
            gpu,
            terminated,
            facts.mps_server,
            &message,
        ));
    }
    // Each told process gets its message before its eviction, unless its
    // stderr does not drain: one short wait for all of them together, so
    // a full pipe never holds the GPU's lock or the next eviction.
    let writers: Vec<&mut std::process::Child> =
        evict.iter_mut().filter_map(|e| e.2.as_mut()).collect();
    wait_briefly(writers, TELL_WAIT);
    for (terminated, server, writer) in evict {
        let Terminated { pid, job, verdict } = &terminated;
        let (pid, job) = (*pid, *job);
        if let Some(mut child) = writer {
            // Reaped by its own thread (killed by `timeout` at the latest).
            std::thread::spawn(move || {
                let _ = child.wait();
            });
        }
        // Recorded first: a process that exits at once on its eviction ends
        // its job's step, whose report reads this record.
        if let Some(job) = job {
            record(ns, job, pid, verdict);
        }
        let done = match server {
            Some(server) => mps.terminate_client(server, pid).map_err(|e| e.to_string()),
            None => {
                // SAFETY: kill(2) on a pid; no memory is touched.
                match unsafe { libc::kill(pid as i32, libc::SIGKILL) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error().to_string()),
                }
            }
        };
        if let Err(e) = done {
            tracing::error!(gpu, pid, ?job, code = verdict.code, "cannot terminate: {e}");
            // Not evicted: the next pass must try again, not skip it.
            if let Some(job) = job {
                unrecord(ns, job, pid, verdict);
            }
            continue;
        }
        out.push(terminated);
    }
    for (job, mib) in peaks {
        record_peak(ns, job, mib);
    }
    out
}

/// The jobs recorded on GPU `gpu`: job -> uid. The caller holds the GPU's
/// lock.
fn recorded_jobs(ns: &NodeState, gpu: u32) -> BTreeMap<u32, u32> {
    ns.jobs(gpu)
        .unwrap_or_default()
        .iter()
        .map(|j| (j.job_id, j.uid))
        .collect()
}

/// The server of a process of job `job` (no offline job of the node) that
/// is a client of the GPU's daemon (`server`) although its job is not
/// recorded on the GPU (`recorded`); None for the GPU's own jobs and for
/// processes outside MPS (a job's GPU outside MPS is Slurm's, by its
/// device cgroup).
fn foreign_client(job: u32, recorded: &BTreeMap<u32, u32>, server: Option<u32>) -> Option<u32> {
    server.filter(|_| !recorded.contains_key(&job))
}

/// The code of a client of the GPU's MPS daemon whose job is not the GPU's:
/// neither its recorded online job nor an offline job placed there.
pub const NOT_ON_GPU: &str = "not_on_gpu";

/// Evicts process `pid` of job `job`, a client of `server` on GPU `gpu`
/// although its job is not recorded there: it reached the GPU's pipe
/// directory itself (any job on the node can name it, whatever device
/// cgroups the site has). A muxflow job of the node (an online job of
/// another GPU) gets the code in its AdminComment; another job's is logged
/// and told only (the node keeps no files for jobs it does not run).
fn evict_foreign(
    config: &Config,
    procfs: &Procfs,
    ns: &NodeState,
    gpu: u32,
    pid: u32,
    job: u32,
    server: u32,
) -> Option<Eviction> {
    let muxflow_job = ns.find_job(job).ok().flatten().is_some();
    if muxflow_job && already_policed(ns, job, pid) {
        // Terminated before; listed by MPS until it exits.
        return None;
    }
    let verdict = Verdict {
        code: NOT_ON_GPU,
        reason: format!(
            "it belongs to job {job}, which is neither GPU {gpu}'s online job nor an offline job placed there"
        ),
    };
    let message = format!(
        "muxflow: process {pid} of job {job} is evicted from GPU {gpu} (MPS terminate_client) \
         by the node: {}; only the GPU's own jobs may be clients of its MPS server",
        verdict.reason
    );
    let terminated = Terminated {
        pid,
        job: muxflow_job.then_some(job),
        verdict,
    };
    Some(announce(
        config,
        procfs,
        gpu,
        terminated,
        Some(server),
        &message,
    ))
}

/// Logs why `t` is terminated and tells the process, before its eviction:
/// once evicted, it may exit at once.
fn announce(
    config: &Config,
    procfs: &Procfs,
    gpu: u32,
    t: Terminated,
    server: Option<u32>,
    message: &str,
) -> Eviction {
    tracing::warn!(
        gpu,
        pid = t.pid,
        job = t.job,
        code = t.verdict.code,
        "{message}"
    );
    let writer = tell_process(
        procfs,
        t.pid,
        message,
        Duration::from_millis(config.mps.command_timeout_ms),
    );
    (t, server, writer)
}

/// Whether a process of no job step names (`SLURM_JOB_ID`) a job still
/// recorded on the GPU: then it is left alone, so a running job's child
/// that left its tree (daemonized) goes when that job does. The name is
/// the process's own to set, so it only ever buys time until a recorded
/// job ends.
/// Whether process `pid` names, in its own `SLURM_JOB_ID`, a job recorded
/// on the GPU (`recorded`: job -> uid) of its own user. The name is the
/// process's to write: another user's job (the GPU's online job, say)
/// would shelter it for that job's whole run.
fn names_a_recorded_job(procfs: &Procfs, pid: u32, recorded: &BTreeMap<u32, u32>) -> bool {
    let Some((uid, _)) = process_ids(procfs, pid) else {
        return false;
    };
    environ(procfs, pid, &["SLURM_JOB_ID"])
        .get("SLURM_JOB_ID")
        .and_then(|j| j.parse::<u32>().ok())
        .is_some_and(|j| recorded.get(&j) == Some(&uid))
}

/// Process `pid`'s real uid and gid (`/proc/<pid>/status`).
fn process_ids(procfs: &Procfs, pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(procfs.path(pid, "status")).ok()?;
    let id = |key: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((id("Uid:")?, id("Gid:")?))
}

/// Whether xCUDA's start-up ran in process `pid`, by its stats file in the
/// job's stats directory `dir`.
fn xcuda_started(procfs: &Procfs, dir: &Path, pid: u32) -> bool {
    muxflow::node::offline_procs::ProcId::of(procfs, pid)
        .is_some_and(|p| muxflow::records::report::xcuda_started(dir, pid, p.start_ticks))
}

/// How long a process that maps xCUDA gets to show that it started it.
const XCUDA_START_GRACE: Duration = Duration::from_secs(1);

/// Whether a process that maps xCUDA but has not shown its start-up shows
/// it (or exits) within [`XCUDA_START_GRACE`]. Only on suspicion.
fn starts_xcuda_within_grace(procfs: &Procfs, dir: &Path, pid: u32) -> bool {
    let until = Instant::now() + XCUDA_START_GRACE;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        if xcuda_started(procfs, dir, pid) || !procfs.path(pid, "stat").exists() {
            return true;
        }
    }
    false
}

/// How long a process NVML lists outside MPS gets to show up as a client
/// (connecting) or to die (exiting) before it counts as outside.
const NOT_MPS_GRACE: Duration = Duration::from_millis(300);

/// A process NVML lists but the MPS server does not: at its connect (NVML
/// sees the context before the server lists the client) and at its exit
/// (the server drops the client before the process is gone) that is no
/// escape. Asks again after [`NOT_MPS_GRACE`]: outside only if the process
/// still runs and is still no client. Only on suspicion, so a check costs
/// nothing more otherwise.
fn outside_mps_after_grace(procfs: &Procfs, mps: &MpsDaemon, pid: u32) -> bool {
    if mps_clients(mps).contains_key(&pid) {
        return false;
    }
    std::thread::sleep(NOT_MPS_GRACE);
    let running = std::fs::read_to_string(procfs.path(pid, "stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command's closing parenthesis.
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false);
    running && !mps_clients(mps).contains_key(&pid)
}

/// Raises the job's measured peak GPU memory (all its processes on the GPU
/// at one step) to `mib`, in `<state_dir>/limits/<job>.measured`.
fn record_peak(ns: &NodeState, job: u32, mib: u64) {
    update_measured(ns, job, |m| {
        let old: u64 = m.get("peak_mib").and_then(|v| v.parse().ok()).unwrap_or(0);
        (mib > old).then(|| {
            m.insert("peak_mib".into(), mib.to_string());
        })
    });
}

/// Adds one sample of the online partner's SM utilization (percent of the
/// GPU, summed over its processes) to the job's measured file: count, sum
/// and largest, from which the report's `partner_load_pct` is the mean
/// over the largest ([`muxflow::records::report::partner_load_pct`]).
fn record_partner_load(ns: &NodeState, job: u32, sm_pct: u32) {
    update_measured(ns, job, |m| {
        let get = |m: &BTreeMap<String, String>, k: &str| -> u64 {
            m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        let (n, sum, max) = (get(m, "load_n"), get(m, "load_sum"), get(m, "load_max"));
        m.insert("load_n".into(), (n + 1).to_string());
        m.insert("load_sum".into(), (sum + u64::from(sm_pct)).to_string());
        m.insert("load_max".into(), max.max(u64::from(sm_pct)).to_string());
        Some(())
    });
}

/// Adds the other offline jobs recorded on `gpu` now to the job's measured
/// `peers` (the matcher must know which runs shared a GPU with
/// other offline jobs). The caller holds the GPU's lock.
fn record_peers(ns: &NodeState, job: u32, gpu: u32) {
    let others: Vec<u32> = ns
        .jobs(gpu)
        .unwrap_or_default()
        .into_iter()
        .filter(|j| j.mode == muxflow::Mode::Offline && j.job_id != job)
        .map(|j| j.job_id)
        .collect();
    if others.is_empty() {
        return;
    }
    update_measured(ns, job, |m| {
        let old = m.get("peers").map_or_else(Vec::new, |l| parse_peers(l));
        let mut peers = old.clone();
        add_peers(&mut peers, Some(job), others);
        (peers != old).then(|| {
            m.insert("peers".into(), format_peers(&peers));
        })
    });
}

/// Reads, changes and rewrites (atomically) the job's measured file, a
/// `key=value` line root writes; `change` returns None to leave it as it is.
fn update_measured(
    ns: &NodeState,
    job: u32,
    change: impl FnOnce(&mut BTreeMap<String, String>) -> Option<()>,
) {
    let path = ns.measured_file(job);
    let mut map = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| muxflow::records::kv::parse(t.trim()).ok())
        .unwrap_or_default();
    if change(&mut map).is_none() {
        return;
    }
    let text = map
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
        + "\n";
    if let Err(e) = muxflow::node::state::write_atomic(&path, text.as_bytes()) {
        tracing::error!(job, "{e}");
    }
}

/// The online partner's SM utilization on `gpu` now: the summed NVML
/// per-process samples of the processes of the GPU's online jobs. None
/// when there is no online job or NVML has no per-process figures.
fn partner_sm_pct(
    ns: &NodeState,
    procfs: &Procfs,
    dev: &nvml_wrapper::Device,
    gpu: u32,
) -> Option<u32> {
    let online: BTreeSet<u32> = ns
        .jobs(gpu)
        .ok()?
        .into_iter()
        .filter(|j| j.mode == muxflow::Mode::Online)
        .map(|j| j.job_id)
        .collect();
    if online.is_empty() {
        return None;
    }
    let samples = match dev.process_utilization_stats(None) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(gpu, "NVML per-process utilization: {e}");
            return None;
        }
    };
    Some(
        samples
            .iter()
            .filter(|s| procfs.job_of(s.pid).is_some_and(|j| online.contains(&j)))
            .map(|s| s.sm_util.min(100))
            .sum::<u32>()
            .min(100),
    )
}

/// Writes the GPU's offline processes (of the NVML processes, those of an
/// offline job recorded on the GPU, by [`Procfs::job_of`]) where xCUDA's
/// brake reads them ([`muxflow::node::offline_procs`]); rewritten only when the
/// list changes. The caller holds the GPU's lock. A failure is logged: the
/// brakes then count every other process, as with one offline job.
fn publish_offline_procs(ns: &NodeState, procfs: &Procfs, gpu: u32, processes: &[Process]) {
    use muxflow::node::offline_procs::{self, ProcId};
    let offline_jobs: BTreeSet<u32> = ns
        .jobs(gpu)
        .unwrap_or_default()
        .into_iter()
        .filter(|j| j.mode == muxflow::Mode::Offline)
        .map(|j| j.job_id)
        .collect();
    let pids = offline_procs::offline_of(processes.iter().map(|p| p.pid), &offline_jobs, |pid| {
        procfs.job_of(pid)
    });
    let procs: BTreeSet<ProcId> = pids
        .into_iter()
        .filter_map(|pid| ProcId::of(procfs, pid))
        .collect();
    let text = offline_procs::encode(&procs);
    let path = ns.offline_procs_file(gpu);
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return;
    }
    match muxflow::node::state::write_atomic(&path, text.as_bytes()) {
        Ok(()) => tracing::debug!(gpu, "offline processes for the brake: {}", text.trim()),
        Err(e) => tracing::error!(
            gpu,
            "cannot publish the offline processes for xCUDA's brake: {e}"
        ),
    }
}

/// How long `muxflow-police` waits for the job's slurmstepd to appear
/// before it concludes the job never started here.
const NO_STEPD_GIVE_UP: Duration = Duration::from_secs(300);

/// `muxflow-police` for offline job `job`: polices the job's GPU every
/// `health.police_interval_ms`, so a process out of bounds is caught about
/// when it attaches rather than at the next health check. It also keeps the
/// node's SM activity sampler running for node `node` ([`crate::sampler`]):
/// xCUDA's gate reads its pages between health checks. Ends when the
/// Epilog has forgotten the job, or when the job's slurmstepd has gone (or
/// never came). For an online job it only watches for a foreign
/// `terminate_client` of the job's clients ([`watch_online`]).
pub fn watch(config: &Config, job: u32, node: Option<&str>) -> anyhow::Result<()> {
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let interval = Duration::from_millis(config.health.police_interval_ms);
    if is_online_here(&ns, job)? {
        return watch_online(config, &ns, job, interval);
    }
    let nvml = match config.paths.nvml_library.as_ref() {
        Some(p) => nvml_wrapper::Nvml::builder()
            .lib_path(p.as_path().as_os_str())
            .init(),
        None => nvml_wrapper::Nvml::init(),
    };
    let nvml = match nvml {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::warn!(
                job,
                "muxflow-police: no NVML ({e}); memory use is not checked"
            );
            None
        }
    };
    // One watcher per job: a health step that finds the claim free starts
    // one again (this one was killed).
    let Some(_claim) = ns.try_claim_police(job)? else {
        tracing::info!(
            job,
            "muxflow-police: another watcher runs for the job; done"
        );
        return Ok(());
    };
    let procfs = Procfs::default();
    let started = Instant::now();
    let mut stepd_seen = false;
    let mut sampler: Option<std::process::Child> = None;
    // Where this watcher has read each of its GPUs' control logs (from
    // their end when it starts).
    let mut control_offsets: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for gpu in ns.job_gpus(job)? {
        let mps = MpsDaemon::for_gpu(config, gpu);
        let offsets = control_offsets.entry(gpu).or_default();
        crate::sysmon::scan_log(mps.log_dir(), "control.log", offsets);
    }
    tracing::info!(job, ?interval, "muxflow-police: watching offline job");
    loop {
        std::thread::sleep(interval);
        // While the job runs, the node's SM activity sampler is back within
        // an interval if it was killed (its exit is reaped here).
        if let Some(node) = node {
            if sampler
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
            {
                sampler = None;
            }
            if let Some(child) = crate::sampler::ensure(config, node) {
                sampler = Some(child);
            }
        }
        if let Some(why) = watch_over(&ns, &procfs, job, started, &mut stepd_seen)? {
            tracing::info!(job, "muxflow-police: {why}; done");
            return Ok(());
        }
        // Every GPU the job is on (a k-GPU job: k).
        let gpus = ns.job_gpus(job)?;
        // Every GPU of the node: a process of the job on another GPU (its
        // own CUDA_VISIBLE_DEVICES and pipe directory) is caught within an
        // interval too, not only at the next health step.
        let node_gpus: BTreeSet<u32> = match nvml.as_ref().map(|n| n.device_count()) {
            Some(Ok(n)) => (0..n).collect(),
            _ => ns.gpus()?.into_iter().collect(),
        };
        for gpu in node_gpus.union(&gpus.iter().copied().collect()) {
            let gpu = *gpu;
            let own = gpus.contains(&gpu);
            let device = nvml.as_ref().and_then(|n| n.device_by_index(gpu).ok());
            let processes = device
                .as_ref()
                .and_then(|d| crate::nvml::gpu_processes(d).ok())
                .unwrap_or_default();
            let partner_sm = own
                .then(|| {
                    device
                        .as_ref()
                        .and_then(|d| partner_sm_pct(&ns, &procfs, d, gpu))
                })
                .flatten();
            // The measured file is also written by the health steps: under
            // the GPU's lock. One held past its bound skips this GPU for
            // one pass, not the job's whole watch.
            let lock = match ns.lock_gpu(gpu) {
                Ok(lock) => lock,
                Err(e) => {
                    tracing::warn!(job, gpu, "muxflow-police: {e}");
                    continue;
                }
            };
            if own {
                if let Some(sm) = partner_sm {
                    record_partner_load(&ns, job, sm);
                }
                record_peers(&ns, job, gpu);
            }
            if device.is_some() {
                publish_offline_procs(&ns, &procfs, gpu, &processes);
            }
            let mps = MpsDaemon::for_gpu(config, gpu);
            if own {
                let offsets = control_offsets.entry(gpu).or_default();
                notice_terminations_of(&ns, &mps, gpu, job, offsets);
            }
            for t in police_gpu(config, &ns, &mps, gpu, &processes) {
                tracing::warn!(
                    job = ?t.job,
                    pid = t.pid,
                    gpu,
                    code = t.verdict.code,
                    "muxflow-police: terminated a process out of bounds"
                );
            }
            drop(lock);
        }
        // After the locks: a call to slurmctld must not hold up the GPUs.
        escalate(config, &ns, job);
    }
}

/// Whether `job` is recorded on this node's GPUs as an online job.
fn is_online_here(ns: &NodeState, job: u32) -> anyhow::Result<bool> {
    for gpu in ns.job_gpus(job)? {
        let jobs = ns.jobs(gpu).unwrap_or_default();
        if jobs
            .iter()
            .any(|r| r.job_id == job && r.mode == muxflow::Mode::Online)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Why a watcher of `job` stops now, if it does: the Epilog forgot the
/// job, its slurmstepd is gone, or it never came. `stepd_seen` remembers
/// a sighting across passes.
fn watch_over(
    ns: &NodeState,
    procfs: &Procfs,
    job: u32,
    started: Instant,
    stepd_seen: &mut bool,
) -> anyhow::Result<Option<&'static str>> {
    if ns.job_gpus(job)?.is_empty() {
        return Ok(Some("job forgotten by the Epilog"));
    }
    Ok(match (procfs.stepd_of_job_runs(job), *stepd_seen) {
        (true, _) => {
            *stepd_seen = true;
            None
        }
        (false, true) => Some("the job's slurmstepd is gone"),
        (false, false) if started.elapsed() > NO_STEPD_GIVE_UP => {
            Some("the job never started here")
        }
        (false, false) => None,
    })
}

/// `muxflow-police` for online job `job`: the online job owns its GPUs and
/// is not policed, but a `terminate_client` someone else sends ends its
/// clients as readily as an offline job's. Every `interval` it notes the
/// GPUs' clients and records, while the job runs, a foreign
/// `terminate_client` of the job's own client ([`notice_terminations_of`]):
/// its AdminComment then says so, and its ending is never left to a
/// health step that comes after its Epilog. Ends as the offline watcher does.
fn watch_online(
    config: &Config,
    ns: &NodeState,
    job: u32,
    interval: Duration,
) -> anyhow::Result<()> {
    let Some(_claim) = ns.try_claim_police(job)? else {
        tracing::info!(
            job,
            "muxflow-police: another watcher runs for the job; done"
        );
        return Ok(());
    };
    let procfs = Procfs::default();
    let started = Instant::now();
    let mut stepd_seen = false;
    let mut control_offsets: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for gpu in ns.job_gpus(job)? {
        let mps = MpsDaemon::for_gpu(config, gpu);
        let offsets = control_offsets.entry(gpu).or_default();
        crate::sysmon::scan_log(mps.log_dir(), "control.log", offsets);
    }
    tracing::info!(
        job,
        ?interval,
        "muxflow-police: watching online job's MPS clients"
    );
    loop {
        std::thread::sleep(interval);
        if let Some(why) = watch_over(ns, &procfs, job, started, &mut stepd_seen)? {
            tracing::info!(job, "muxflow-police: {why}; done");
            return Ok(());
        }
        for gpu in ns.job_gpus(job)? {
            let mps = MpsDaemon::for_gpu(config, gpu);
            let lock = match ns.lock_gpu(gpu) {
                Ok(lock) => lock,
                Err(e) => {
                    tracing::warn!(job, gpu, "muxflow-police: {e}");
                    continue;
                }
            };
            note_clients(ns, &procfs, gpu, &mps_clients(&mps));
            let offsets = control_offsets.entry(gpu).or_default();
            notice_terminations_of(ns, &mps, gpu, job, offsets);
            drop(lock);
        }
    }
}

/// A `terminate_client` someone other than muxflow sent to GPU `gpu`'s
/// daemon that ended a client of job `job`, recorded for the job within the
/// watcher's interval: while the job still runs, so its AdminComment says
/// so (the health step reads the command too, but usually after the job's
/// Epilog). Reads the control log from `offsets` (this watcher's own), and
/// only its `Cmd:` echoes. muxflow's own evictions are known by their
/// notes: the daemon's list of muxflow's commands, the job's policed and
/// evicted files.
fn notice_terminations_of(
    ns: &NodeState,
    mps: &MpsDaemon,
    gpu: u32,
    job: u32,
    offsets: &mut BTreeMap<String, u64>,
) {
    let procfs = Procfs::default();
    for line in crate::sysmon::scan_log(mps.log_dir(), "control.log", offsets) {
        let Some(command) = crate::detector::control_command(&line) else {
            continue;
        };
        let Some(pid) = terminated_client(command) else {
            continue;
        };
        if mps.is_own_command(command)
            || already_policed(ns, job, pid)
            || names_pid(&ns.evicted_file(job), pid, |_| true)
        {
            continue;
        }
        let victim = procfs
            .job_of(pid)
            .or_else(|| crate::clients::recall(ns, gpu, pid).and_then(|o| o.job));
        if victim == Some(job) {
            let jobs = ns.jobs(gpu).unwrap_or_default();
            crate::sysmon::attribute_termination(ns, gpu, Some(pid), &jobs);
        }
    }
}

/// The client a `terminate_client <server> <client>` command ends.
fn terminated_client(command: &str) -> Option<u32> {
    match command.split_whitespace().collect::<Vec<_>>()[..] {
        ["terminate_client", _, client] => client.parse().ok(),
        _ => None,
    }
}

/// The code of the line the policed file gets when its job is cancelled.
const CANCELLED: &str = "cancelled";

/// A job whose processes keep being terminated out of bounds (relaunched in
/// a loop, on another GPU, without xCUDA) is cancelled once `[health]
/// police_cancel_after` of them were, with the reason in its policed file
/// (so in its AdminComment's `policed=`) and the slurmd log.
pub fn escalate(config: &Config, ns: &NodeState, job: u32) {
    let limit = config.health.police_cancel_after;
    let Ok(text) = std::fs::read_to_string(ns.policed_file(job)) else {
        return;
    };
    let Some(why) = cancel_reason(&text, limit) else {
        return;
    };
    tracing::warn!(job, "muxflow-police: cancelling the job: {why}");
    record(
        ns,
        job,
        0,
        &Verdict {
            code: CANCELLED,
            reason: why,
        },
    );
    let id = job.to_string();
    if let Err(e) = muxflow_slurm::cli::Scontrol::new(config).command("scancel", &[&id]) {
        tracing::error!(job, "muxflow-police: cannot cancel the job: {e}");
    }
}

/// Why a job whose policed file is `text` is cancelled now: `limit` (not 0)
/// of its processes were terminated and it was not cancelled before.
pub fn cancel_reason(text: &str, limit: u32) -> Option<String> {
    let code = |l: &str| l.split_whitespace().next().unwrap_or("").to_string();
    if limit == 0 || text.lines().any(|l| code(l) == CANCELLED) {
        return None;
    }
    let terminated: Vec<String> = text.lines().map(code).filter(|c| !c.is_empty()).collect();
    if terminated.len() < limit as usize {
        return None;
    }
    let mut codes = terminated.clone();
    codes.sort();
    codes.dedup();
    Some(format!(
        "{} of its processes were terminated out of bounds ({}); a job is cancelled once {limit} were ([health] police_cancel_after)",
        terminated.len(),
        codes.join(",")
    ))
}

/// Starts muxflow-police again for each job recorded on the node whose
/// watcher is gone (killed, crashed): a health step's part, so a process
/// out of bounds is back to being stopped, and a foreign terminate_client
/// of an online job's client recorded, within an interval.
pub fn restart_watchers(ns: &NodeState) {
    let Some(path) = crate::config_path() else {
        return;
    };
    let mut jobs = BTreeSet::new();
    for gpu in ns.gpus().unwrap_or_default() {
        for r in ns.jobs(gpu).unwrap_or_default() {
            jobs.insert(r.job_id);
        }
    }
    let procfs = Procfs::default();
    for job in jobs {
        // A job whose slurmstepd is gone needs no watcher (its Epilog, or
        // the health check's sweep, forgets it).
        if !procfs.stepd_of_job_runs(job) {
            continue;
        }
        match ns.try_claim_police(job) {
            Ok(Some(claim)) => {
                drop(claim);
                tracing::warn!(
                    job,
                    "muxflow-police of the job was not running; starting it again"
                );
                spawn_watcher(path, job);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(job, "{e}"),
        }
    }
}

/// Starts `muxflow-police` (next to this program) for job `job`,
/// detached in its own process group with the config `config_path`. A
/// failure is logged: the job is then policed at the health steps only.
pub fn spawn_watcher(config_path: &Path, job: u32) {
    let program = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("muxflow-police"),
        Err(e) => {
            tracing::error!(
                job,
                "cannot find muxflow-police: {e}; policed at health checks only"
            );
            return;
        }
    };
    let mut cmd = Command::new(&program);
    cmd.arg("--config")
        .arg(config_path)
        .env("SLURM_JOB_ID", job.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    match cmd.spawn() {
        // Not waited for: it outlives the Prolog and is reaped by init.
        Ok(child) => tracing::info!(job, pid = child.id(), "started muxflow-police"),
        Err(e) => tracing::error!(
            job,
            "cannot start {}: {e}; the job is policed at health checks only",
            program.display()
        ),
    }
}

/// A file as the kernel knows it: its device (major, minor) and inode, as
/// `/proc/<pid>/maps` shows them for each file mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub major: u64,
    pub minor: u64,
    pub inode: u64,
}

impl FileId {
    /// The file at `path` (symlinks followed: the loader maps the target).
    pub fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let dev = m.dev();
        Some(FileId {
            major: u64::from(libc::major(dev)),
            minor: u64::from(libc::minor(dev)),
            inode: m.ino(),
        })
    }
}

/// Whether the process maps the file `lib` executable: a line of its
/// `/proc/<pid>/maps` (`address perms offset dev inode path`) with `x` in
/// its permissions and the file's device and inode. The path is not read:
/// a library of the same name elsewhere (`/tmp/u/<xCUDA's path>`) or the
/// real file mapped read-only does not pass; a bind mount (containers)
/// keeps the device and inode and does.
fn maps_executable(procfs: &Procfs, pid: u32, lib: FileId) -> bool {
    let Ok(maps) = std::fs::read_to_string(procfs.path(pid, "maps")) else {
        return false;
    };
    maps.lines().any(|l| maps_line_is(l, lib))
}

/// One `/proc/<pid>/maps` line maps `lib` executable.
fn maps_line_is(line: &str, lib: FileId) -> bool {
    let mut f = line.split_whitespace();
    let (Some(_addr), Some(perms), Some(_offset), Some(dev), Some(inode)) =
        (f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return false;
    };
    let Some((major, minor)) = dev.split_once(':') else {
        return false;
    };
    perms.as_bytes().get(2) == Some(&b'x')
        && u64::from_str_radix(major, 16).ok() == Some(lib.major)
        && u64::from_str_radix(minor, 16).ok() == Some(lib.minor)
        && inode.parse::<u64>().ok() == Some(lib.inode)
}

/// The variables `keys` of the process's starting environment.
fn environ(procfs: &Procfs, pid: u32, keys: &[&str]) -> BTreeMap<String, String> {
    let bytes = std::fs::read(procfs.path(pid, "environ")).unwrap_or_default();
    bytes
        .split(|b| *b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok()?.split_once('='))
        .filter(|(k, _)| keys.contains(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Writes `message` to the process's stderr, as the process's owner: the
/// user chose where fd 2 points, so root never opens it. Never blocks on
/// the write: a stderr that does not drain (a full pipe nobody reads) must
/// not hold the GPU's lock, delay the eviction or the next process's. The
/// writer is started and handed the message (far below a pipe's buffer,
/// so handing it over cannot block); `timeout` kills it after `limit`;
/// the caller waits for all of a pass's writers together, briefly
/// ([`TELL_WAIT`]), then reaps them from threads of their own.
fn tell_process(
    procfs: &Procfs,
    pid: u32,
    message: &str,
    limit: Duration,
) -> Option<std::process::Child> {
    use std::io::Write;
    let (uid, gid) = process_ids(procfs, pid)?;
    let mut cmd = muxflow::node::process::command(Path::new(TIMEOUT));
    // Seconds, as coreutils reads a duration (no "ms" suffix).
    cmd.args([
        "-s",
        "KILL",
        &format!("{:.3}", limit.as_secs_f64().max(0.001)),
    ])
    .args(["/bin/sh", "-c", "cat >> \"$1\"", "sh"])
    .arg(procfs.path(pid, "fd/2"))
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    std::os::unix::process::CommandExt::uid(&mut cmd, uid);
    std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(pid, "cannot start the writer to the process's stderr: {e}");
            return None;
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        if let Err(e) = stdin
            .write_all(message.as_bytes())
            .and_then(|()| stdin.write_all(b"\n"))
        {
            tracing::debug!(pid, "cannot hand the message over: {e}");
        }
    }
    Some(child)
}

/// How long one police pass waits, in all, for its messages to be written.
const TELL_WAIT: Duration = Duration::from_millis(250);

/// Waits until every writer has exited, or `limit` has passed.
fn wait_briefly(mut writers: Vec<&mut std::process::Child>, limit: Duration) {
    let until = std::time::Instant::now() + limit;
    while !writers.is_empty() && std::time::Instant::now() < until {
        writers.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// coreutils' `timeout`: bounds the writer of [`tell_process`].
const TIMEOUT: &str = "/usr/bin/timeout";

/// Notes whose each of the GPU's MPS clients (`clients`) is, while it
/// runs: a foreign terminate_client is usually read after the client and
/// its job are gone ([`crate::clients`]). The caller holds the GPU's lock.
fn note_clients(ns: &NodeState, procfs: &Procfs, gpu: u32, clients: &BTreeMap<u32, u32>) {
    let seen: Vec<(u32, crate::clients::Owner)> = clients
        .keys()
        .map(|&pid| {
            let owner = crate::clients::Owner {
                job: crate::sysmon::process_job(pid).0,
                uid: process_ids(procfs, pid).map(|(uid, _)| uid),
            };
            (pid, owner)
        })
        .collect();
    crate::clients::remember(ns, gpu, &seen, unix_now_s());
}

/// The clients of the GPU's MPS servers: pid -> server.
fn mps_clients(mps: &MpsDaemon) -> BTreeMap<u32, u32> {
    let mut clients = BTreeMap::new();
    if mps.pipe_dir().join("control").exists() {
        for server in mps.server_pids().unwrap_or_default() {
            for c in mps.client_pids(server).unwrap_or_default() {
                clients.insert(c, server);
            }
        }
    }
    clients
}

/// Whether the node already terminated process `pid` of job `job` for its
/// limits (the job's policed file).
fn already_policed(ns: &NodeState, job: u32, pid: u32) -> bool {
    names_pid(&ns.policed_file(job), pid, |_| true)
}

/// How long a process the node evicted for its GPU's health is left to
/// exit: it is then no client of the daemon restarted meanwhile, and
/// judged as outside MPS it would be killed and its job blamed. One still
/// on the GPU after this is judged as any other.
const HEALTH_EVICTION_GRACE: Duration = Duration::from_secs(10);

/// Whether the node evicted process `pid` of job `job` for its GPU's health
/// within [`HEALTH_EVICTION_GRACE`] (the job's evicted file).
fn evicted_for_health_lately(ns: &NodeState, job: u32, pid: u32) -> bool {
    let now = unix_now_s();
    names_pid(&ns.evicted_file(job), pid, |line| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("at="))
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|at| now.saturating_sub(at) <= HEALTH_EVICTION_GRACE.as_secs())
    })
}

/// Whether a line of the file at `path` names `pid` (its second word,
/// `pid=<pid>`) and passes `also`.
fn names_pid(path: &Path, pid: u32, also: impl Fn(&str) -> bool) -> bool {
    let want = format!("pid={pid}");
    std::fs::read_to_string(path).is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()) && also(l))
    })
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Appends `code pid reason` to the job's policed file (root, 0644).
fn record(ns: &NodeState, job: u32, pid: u32, verdict: &Verdict) {
    append_line(
        job,
        &ns.policed_file(job),
        &format!("{} pid={pid} {}\n", verdict.code, verdict.reason),
    );
}

/// Takes back the line [`record`] wrote for `pid` (its eviction failed).
fn unrecord(ns: &NodeState, job: u32, pid: u32, verdict: &Verdict) {
    let path = ns.policed_file(job);
    let line = format!("{} pid={pid} {}", verdict.code, verdict.reason);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let mut lines: Vec<&str> = text.lines().collect();
    let Some(at) = lines.iter().rposition(|l| *l == line) else {
        return;
    };
    lines.remove(at);
    let kept: String = lines.iter().map(|l| format!("{l}\n")).collect();
    if let Err(e) = muxflow::node::state::write_atomic(&path, kept.as_bytes()) {
        tracing::warn!(
            job,
            pid,
            "cannot take back the policed record in {}: {e}",
            path.display()
        );
    }
}

/// The code of a process the node evicted for its GPU's health.
pub const GPU_HEALTH: &str = "gpu_health";

/// Notes that the node evicted process `pid` of job `job` for its GPU's
/// health (the job's evicted file, root, 0644): the police leave it to
/// exit for [`HEALTH_EVICTION_GRACE`], and the job is not blamed for it.
pub fn record_health_eviction(ns: &NodeState, job: u32, pid: u32, why: &str) {
    append_line(
        job,
        &ns.evicted_file(job),
        &format!("{GPU_HEALTH} pid={pid} at={} {why}\n", unix_now_s()),
    );
}

/// Appends `line` to `path`, a root file of job `job` (0644, never
/// through a link); a failure is logged.
fn append_line(job: u32, path: &Path, line: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let res = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = res {
        tracing::error!(job, "{}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_cancelled_once_at_its_limit_of_terminated_processes() {
        let line = |code: &str, pid: u32| format!("{code} pid={pid} why\n");
        let two = line("wrong_gpu", 10) + &line("no_xcuda", 11);
        assert_eq!(cancel_reason(&two, 3), None, "below the limit");
        let three = two.clone() + &line("wrong_gpu", 12);
        let why = cancel_reason(&three, 3).expect("at the limit");
        assert!(
            why.starts_with("3 of its processes") && why.contains("(no_xcuda,wrong_gpu)"),
            "{why}"
        );
        assert_eq!(cancel_reason(&three, 0), None, "0: never");
        let cancelled = three + &line(CANCELLED, 0);
        assert_eq!(cancel_reason(&cancelled, 3), None, "once only");
        assert_eq!(cancel_reason("", 1), None);
    }

    /// Recorded before the eviction (its process may exit and end the step
    /// at once); taken back where the eviction failed, so the next pass
    /// tries again instead of taking it as done.
    #[test]
    fn a_failed_eviction_takes_its_record_back() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        std::fs::create_dir_all(ns.limits_dir()).unwrap();
        let verdict = |code| Verdict {
            code,
            reason: "its SM share was raised".into(),
        };
        record(&ns, 5, 41, &verdict("sm_pct"));
        record(&ns, 5, 42, &verdict("sm_pct"));
        unrecord(&ns, 5, 42, &verdict("sm_pct"));
        assert!(already_policed(&ns, 5, 41));
        assert!(!already_policed(&ns, 5, 42));
        let text = std::fs::read_to_string(ns.policed_file(5)).unwrap();
        assert_eq!(text, "sm_pct pid=41 its SM share was raised\n");
    }

    #[test]
    fn a_process_the_node_evicted_for_the_gpus_health_is_left_to_exit_unblamed() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        std::fs::create_dir_all(ns.limits_dir()).unwrap();
        assert!(!evicted_for_health_lately(&ns, 5, 42));
        record_health_eviction(&ns, 5, 42, "evicted from GPU 0 for the GPU's health");
        assert!(evicted_for_health_lately(&ns, 5, 42), "left to exit");
        assert!(!evicted_for_health_lately(&ns, 5, 43), "another process");
        assert!(!evicted_for_health_lately(&ns, 6, 42), "another job");
        // Nothing the job is blamed for (its AdminComment's `policed=`),
        // nothing that counts towards cancelling it.
        assert!(!already_policed(&ns, 5, 42));
        assert!(!ns.policed_file(5).exists());
        // Still on the GPU long after: judged as any other process.
        let old = unix_now_s() - HEALTH_EVICTION_GRACE.as_secs() - 1;
        std::fs::write(
            ns.evicted_file(7),
            format!("{GPU_HEALTH} pid=42 at={old} evicted from GPU 0\n"),
        )
        .unwrap();
        assert!(!evicted_for_health_lately(&ns, 7, 42));
    }

    #[test]
    fn only_the_gpus_own_jobs_may_be_clients_of_its_daemon() {
        // The GPU's jobs: 10 (online) and 11 (offline, placed here).
        let recorded = BTreeMap::from([(10, 1001), (11, 1002)]);
        // (what, its job, the server it is a client of, evicted?)
        let rows = [
            ("the GPU's online job", 10, Some(77), false),
            ("an offline job placed here", 11, Some(77), false),
            ("a plain job that named the pipe", 20, Some(77), true),
            ("another GPU's online job", 21, Some(77), true),
            ("a plain job outside MPS (Slurm's)", 20, None, false),
        ];
        for (what, job, server, evicted) in rows {
            assert_eq!(
                foreign_client(job, &recorded, server).is_some(),
                evicted,
                "{what}"
            );
        }
    }

    #[test]
    fn a_straggler_is_sheltered_only_by_a_recorded_job_of_its_own_user() {
        let tmp = tempfile::tempdir().unwrap();
        let procfs = Procfs::at(tmp.path());
        // The GPU's jobs: 10 of uid 1001 (online), 11 of uid 1002.
        let recorded = BTreeMap::from([(10, 1001), (11, 1002)]);
        // (what, its uid, its SLURM_JOB_ID, sheltered?)
        let rows = [
            (
                "its own user's job, still recorded",
                Some(1002),
                Some("11"),
                true,
            ),
            (
                "another user's job (the online one)",
                Some(1002),
                Some("10"),
                false,
            ),
            ("a job no longer recorded", Some(1002), Some("12"), false),
            ("no job named", Some(1002), None, false),
            ("a name that is no job id", Some(1002), Some("11x"), false),
            (
                "a process already gone (no status)",
                None,
                Some("11"),
                false,
            ),
        ];
        for (pid, (what, uid, job, sheltered)) in (100u32..).zip(rows) {
            let dir = tmp.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(uid) = uid {
                std::fs::write(
                    dir.join("status"),
                    format!(
                        "Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\t100\t100\t100\n"
                    ),
                )
                .unwrap();
            }
            let env = job.map_or(String::new(), |j| format!("SLURM_JOB_ID={j}\0"));
            std::fs::write(dir.join("environ"), format!("HOME=/\0{env}")).unwrap();
            assert_eq!(
                names_a_recorded_job(&procfs, pid, &recorded),
                sheltered,
                "{what}"
            );
        }
    }

    #[test]
    fn xcuda_is_known_by_its_file_and_an_executable_mapping_not_its_name() {
        let lib = FileId {
            major: 0xfd,
            minor: 1,
            inode: 4242,
        };
        for (line, mapped, what) in [
            (
                "7f00-7f10 r-xp 00000000 fd:01 4242 /usr/lib/libmuxflow_xcuda.so",
                true,
                "the real file, executable",
            ),
            (
                "7f00-7f10 r-xp 00000000 fd:01 4242 /enroot/rootfs/usr/lib/libmuxflow_xcuda.so",
                true,
                "bind-mounted into a container",
            ),
            (
                "7f00-7f10 r--p 00000000 fd:01 4242 /usr/lib/libmuxflow_xcuda.so",
                false,
                "the real file mapped read-only",
            ),
            (
                "7f00-7f10 r-xp 00000000 fd:01 9999 /tmp/u/usr/lib/libmuxflow_xcuda.so",
                false,
                "another file ending with its path",
            ),
            (
                "7f00-7f10 r-xp 00000000 08:02 4242 /usr/lib/libmuxflow_xcuda.so",
                false,
                "same inode on another device",
            ),
            ("7f00-7f10 rw-p 00000000 00:00 0", false, "anonymous"),
            ("garbage", false, "not a maps line"),
        ] {
            assert_eq!(maps_line_is(line, lib), mapped, "{what}");
        }
    }
    use muxflow::config::Xcuda;
    use muxflow::records::xcuda_env::XcudaEnv;

    fn limits() -> JobLimits {
        JobLimits {
            job_id: 5,
            gpu: 1,
            sm_pct: 30,
            mem_cap_mib: Some(60000),
            xcuda: XcudaEnv::from_config(&Xcuda::default(), 1),
            enforced_by: Default::default(),
        }
    }

    fn good() -> Facts {
        Facts {
            xcuda_mapped: true,
            xcuda_started: true,
            env: [
                ("CUDA_MPS_CLIENT_PRIORITY", "1"),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30"),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=60000M"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            used_mib: Some(2048),
            mps_server: Some(77),
        }
    }

    #[test]
    fn each_limit_the_job_could_drop_is_caught() {
        struct Case {
            name: &'static str,
            change: fn(&mut Facts),
            gpu: u32,
            code: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "within its limits",
                change: |_| {},
                gpu: 1,
                code: None,
            },
            Case {
                name: "a tighter share and cap are fine",
                change: |f| {
                    f.env
                        .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "10".into());
                    f.env
                        .insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=8G".into());
                },
                gpu: 1,
                code: None,
            },
            Case {
                name: "on another GPU",
                change: |_| {},
                gpu: 0,
                code: Some("wrong_gpu"),
            },
            Case {
                name: "outside MPS",
                change: |f| f.mps_server = None,
                gpu: 1,
                code: Some("not_mps"),
            },
            Case {
                name: "LD_PRELOAD unset",
                change: |f| {
                    f.xcuda_mapped = false;
                    f.xcuda_started = false;
                },
                gpu: 1,
                code: Some("no_xcuda"),
            },
            Case {
                name: "xCUDA mapped by another library, never started",
                change: |f| f.xcuda_started = false,
                gpu: 1,
                code: Some("no_xcuda"),
            },
            Case {
                name: "priority 0",
                change: |f| {
                    f.env.insert("CUDA_MPS_CLIENT_PRIORITY".into(), "0".into());
                },
                gpu: 1,
                code: Some("priority"),
            },
            Case {
                name: "priority unset",
                change: |f| {
                    f.env.remove("CUDA_MPS_CLIENT_PRIORITY");
                },
                gpu: 1,
                code: Some("priority"),
            },
            Case {
                name: "SM share unset",
                change: |f| {
                    f.env.remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
                },
                gpu: 1,
                code: Some("sm_pct"),
            },
            Case {
                name: "SM share raised",
                change: |f| {
                    f.env
                        .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "100".into());
                },
                gpu: 1,
                code: Some("sm_pct"),
            },
            Case {
                name: "pinned limit unset",
                change: |f| {
                    f.env.remove("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
                },
                gpu: 1,
                code: Some("mem_limit"),
            },
            Case {
                name: "pinned limit raised",
                change: |f| {
                    f.env
                        .insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=80G".into());
                },
                gpu: 1,
                code: Some("mem_limit"),
            },
            Case {
                name: "memory over the cap",
                change: |f| f.used_mib = Some(80625),
                gpu: 1,
                code: Some("mem_used"),
            },
        ];
        for c in cases {
            let mut f = good();
            (c.change)(&mut f);
            assert_eq!(
                check(&f, &limits(), c.gpu, None).map(|v| v.code),
                c.code,
                "{}",
                c.name
            );
        }
        // With a static SM partition: the job's own, named exactly.
        let mine = "GPU-1/p2";
        for (name, given, code) in [
            ("its partition", Some(mine), None),
            ("unset", None, Some("sm_partition")),
            ("the online job's", Some("GPU-1/p1"), Some("sm_partition")),
        ] {
            let mut f = good();
            if let Some(g) = given {
                f.env
                    .insert(muxflow::node::sm_partition::ENV.into(), g.into());
            }
            assert_eq!(
                check(&f, &limits(), 1, Some(mine)).map(|v| v.code),
                code,
                "{name}"
            );
        }
    }

    #[test]
    fn peers_seen_at_any_check_stay_in_the_measured_file() {
        use muxflow::node::state::JobRecord;
        let dir = tempfile::tempdir().unwrap();
        let ns = NodeState::new(dir.path());
        std::fs::create_dir_all(ns.limits_dir()).unwrap();
        let job = |job_id, mode| JobRecord {
            job_id,
            mode,
            uid: 1000,
            slots: if mode == muxflow::Mode::Offline {
                vec![0]
            } else {
                Vec::new()
            },
        };
        let lock = ns.lock_gpu(0).unwrap();
        ns.add_job(&lock, 0, &job(5, muxflow::Mode::Offline))
            .unwrap();
        ns.add_job(&lock, 0, &job(3, muxflow::Mode::Online))
            .unwrap();
        // Alone with its online partner: nothing to write.
        record_peers(&ns, 5, 0);
        assert!(!ns.measured_file(5).exists());
        ns.add_job(&lock, 0, &job(9, muxflow::Mode::Offline))
            .unwrap();
        record_peers(&ns, 5, 0);
        // The peer leaves, another comes: both stay named.
        ns.remove_job(&lock, 0, 9).unwrap();
        ns.add_job(&lock, 0, &job(7, muxflow::Mode::Offline))
            .unwrap();
        record_peers(&ns, 5, 0);
        let text = std::fs::read_to_string(ns.measured_file(5)).unwrap();
        assert_eq!(
            muxflow::records::report::Measured::parse(&text).peers,
            [7, 9],
            "{text}"
        );
    }

    #[test]
    fn pinned_limits_read_like_mps_does() {
        for (text, mib) in [
            ("0=60000M", Some(60000)),
            ("0=8G,1=512M", Some(8192)),
            ("1=512M,0=1G", Some(1024)),
            ("0=1048576", Some(1)),
            ("0=1T", Some(1 << 20)),
            ("1=512M", None),
            ("0=lots", None),
            ("0=99999999999999999999G", None),
        ] {
            assert_eq!(pinned_limit_mib(text), mib, "{text}");
        }
    }
}
