//! One policy's replay of a [`Scenario`]: an event loop over arrivals,
//! finishes, matcher rounds, health checks and hourly load steps. Between
//! two events every GPU's rates are constant, so progress and the time
//! integrals of the counters advance piecewise-linearly.
//!
//! Under `muxflow` the decisions are the production code's:
//! [`muxflow_matcher::round::plan`] on a [`ClusterState`] the replay keeps
//! up to date, [`Model`] trained on runs parsed back from the AdminComment
//! text ([`JobReport`]) that finished jobs leave, [`offline_sm_percent`] and
//! [`offline_mem_cap_mib`] at each start, and [`Fsm::step`] at every health
//! check (placement only where `accepts_offline`, work paused where
//! `pauses_offline`). Idle GPUs (no online service) are the round's
//! candidates too (issue 15), at the job's solo speed: under `muxflow` an
//! arrival waits for the next round rather than taking an idle GPU first
//! come, first served, as the other policies do. With `--autoscale`
//! online services scale with their load ([`Sim::scale`]): a replica
//! lands where Slurm would put it and requeues the offline jobs there,
//! which lose the work since their last checkpoint ([`Sim::requeue`]);
//! without, they never move.
//!
//! A k-GPU offline task is one job on k GPUs of one node (a gang, issue
//! 15) under every policy: started on all of them together (the round's
//! decision under muxflow, the policy's own first fit otherwise), at its
//! slowest GPU's speed, counted by each GPU as one of its offline jobs,
//! and stopped, paused or requeued whole.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use muxflow::config::Policy;
use muxflow::policy::health::{Fsm, HealthState, Input, Metrics, Solo};
use muxflow::policy::share::{offline_mem_cap_mib, offline_part, offline_sm_percent, GpuFacts};
use muxflow::records::published::GpuPublished;
use muxflow::records::report::{add_peers, GangGpu, JobReport};
use muxflow::Mode;
use muxflow_matcher::predict::Seat;
use muxflow_matcher::predict::{runs_from_sacct, GpuTerms, JobTerms, Model, Run};
use muxflow_matcher::reader::{
    ClusterState, GpuState, Names, PendingJob, SacctComment, SacctJob, SacctTime,
};
use muxflow_matcher::round::{plan_cached, Action, IdleSlot, Predictor};
use muxflow_matcher::round_cache::RoundCache;

use crate::engine::EventQueue;
use crate::model::{self, gpu_rates, GpuRates, OfflineSide, OnlineSide, SlotJob, OFFLINE_SM};
use crate::scenario::{replicas_for, Checkpointing, Scenario, Service, REQUEUE_EXIT_S};

/// A sharing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PolicyKind {
    /// No sharing: offline jobs only on GPUs with no online service.
    Exclusive,
    /// Co-location without protection, at the measured pair throughputs.
    TimeSharing,
    /// Co-location with the offline job at low priority.
    Priority,
    /// The matcher, the SM policy, the health FSM and xCUDA.
    Muxflow,
    /// `muxflow` with K offline jobs per GPU (`[policy] offline_per_gpu` =
    /// K, 2 to 4; issue 15): `muxflow-n2` … `muxflow-n4`.
    MuxflowN(u8),
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Exclusive,
        PolicyKind::TimeSharing,
        PolicyKind::Priority,
        PolicyKind::Muxflow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Exclusive => "exclusive",
            PolicyKind::TimeSharing => "time-sharing",
            PolicyKind::Priority => "priority",
            PolicyKind::Muxflow => "muxflow",
            PolicyKind::MuxflowN(2) => "muxflow-n2",
            PolicyKind::MuxflowN(3) => "muxflow-n3",
            PolicyKind::MuxflowN(_) => "muxflow-n4",
        }
    }

    pub fn parse(s: &str) -> Result<PolicyKind, String> {
        if let Some(p) = PolicyKind::ALL.into_iter().find(|p| p.name() == s.trim()) {
            return Ok(p);
        }
        if let Some(k) = s.trim().strip_prefix("muxflow-n") {
            return match k.parse::<u8>() {
                Ok(1) => Ok(PolicyKind::Muxflow),
                Ok(k @ 2..=4) => Ok(PolicyKind::MuxflowN(k)),
                _ => Err(format!(
                    "policy '{s}': muxflow-nK runs K offline jobs per GPU, K from 2 to 4 (as [policy] offline_per_gpu; muxflow is K = 1)"
                )),
            };
        }
        Err(format!(
            "unknown policy '{s}' (expected exclusive, time-sharing, priority, muxflow or muxflow-n2 to muxflow-n4)"
        ))
    }

    /// Its place among the policies (exclusive 0 … muxflow 3, muxflow-nK
    /// 2 + K): colors in the plot.
    pub fn ordinal(self) -> usize {
        match self {
            PolicyKind::Exclusive => 0,
            PolicyKind::TimeSharing => 1,
            PolicyKind::Priority => 2,
            PolicyKind::Muxflow => 3,
            PolicyKind::MuxflowN(k) => 2 + usize::from(k),
        }
    }

    /// `muxflow` or `muxflow-nK`: the production decision code.
    pub fn is_muxflow(self) -> bool {
        matches!(self, PolicyKind::Muxflow | PolicyKind::MuxflowN(_))
    }

    /// Offline jobs per GPU: K under `muxflow-nK`, else 1.
    pub fn offline_per_gpu(self) -> u8 {
        match self {
            PolicyKind::MuxflowN(k) => k,
            _ => 1,
        }
    }

    fn shares(self) -> bool {
        self != PolicyKind::Exclusive
    }
}

/// Hourly figures of one policy (`--timeline`).
#[derive(Debug, Clone, PartialEq)]
pub struct HourRow {
    pub hour: u32,
    pub gpu_util: f64,
    pub sm_activity: f64,
    pub online_gpu_util: f64,
    pub online_load: f64,
    pub offline_running: usize,
    pub offline_waiting: usize,
    pub offline_finished: u64,
    pub lent_gpus: f64,
}

/// xCUDA launches per training step of the replay's offline jobs (any
/// constant: a job's speed is only compared with its own).
const LAUNCHES_PER_STEP: f64 = 40.0;

/// Bins of the online latency factor histogram: 0.001 wide from 1.0.
const LATENCY_BINS: usize = 9001;
const LATENCY_BIN: f64 = 0.001;

/// Everything a replay measured; figures that do not apply are `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub policy: PolicyKind,
    pub gpu_util: f64,
    pub sm_activity: f64,
    pub mem_util: f64,
    pub online_gpu_util: f64,
    pub online_gpu_sm_activity: f64,
    pub online_latency_p50: f64,
    pub online_latency_p99: f64,
    /// Finished offline jobs' completion times (arrival to finish), sorted.
    pub jct_s: Vec<f64>,
    /// Waits from arrival to the first start, of every job that started.
    pub queue_s: Vec<f64>,
    pub offline_gpu_hours: f64,
    pub offline_arrived: u64,
    pub offline_finished: u64,
    pub offline_running_end: u64,
    pub offline_waiting_end: u64,
    pub lent_gpu_hours: f64,
    /// GPU-hours of capacity (all GPUs × the replayed time).
    pub capacity_gpu_hours: f64,
    pub busy_gpu_hours: f64,
    pub rounds: Option<u64>,
    pub round_total_s: Option<f64>,
    pub predictor_mae: Option<f64>,
    pub pairing_vs_oracle: Option<f64>,
    /// muxflow: placements whose job failed at once (the pair cannot
    /// share the GPU's memory, or the job's memory exceeds its cap).
    pub oom_starts: Option<u64>,
    /// muxflow: offline runs whose record names other offline jobs that
    /// shared one of its GPUs (`peers`; only with several slots per GPU).
    pub peer_runs: Option<u64>,
    /// muxflow: placements Slurm would refuse (the job's gpu_spec excludes
    /// the GPU's model; the matcher does not read job constraints).
    pub refused_placements: Option<u64>,
    /// muxflow: offline placements on a GPU whose health state did not
    /// accept offline work, and health checks that found offline work
    /// progressing on a GPU whose state pauses it. Both must stay 0.
    pub health_violations: u64,
    /// Offline jobs that ran on fewer GPUs than they asked for (or on
    /// several nodes): counted from the GPUs each start gave; must be 0.
    pub offline_short_of_gpus: u64,
    /// Jobs asking for more than one GPU (gangs): arrived, finished, and
    /// their part of `offline_gpu_hours`.
    pub gang_arrived: u64,
    pub gang_finished: u64,
    pub gang_gpu_hours: f64,
    pub timeline: Vec<HourRow>,
    /// Seconds of online GPU-time at each latency factor bin.
    pub latency_hist: Vec<f64>,
    /// Services that scale (`--autoscale`); `None` without.
    pub churn: Option<Churn>,
}

/// What services coming and going cost (`--autoscale`, issue 30).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Churn {
    /// Replicas the hourly steps started and stopped (hour 0's stops
    /// scale the peak placement down to the night's load).
    pub replica_starts: u64,
    pub replica_stops: u64,
    /// Replica starts whose GPUs held offline work: each waited for it to
    /// leave (the warning's checkpoint, then the job's exit).
    pub starts_delayed: u64,
    /// Seconds each replica start waited for its GPUs (0 where they were
    /// free), summed, and the longest.
    pub start_delay_total_s: f64,
    pub start_delay_max_s: f64,
    /// Replicas a service wanted that no node could take, summed over the
    /// hourly steps (replica-hours short).
    pub replica_hours_short: u64,
    /// Offline jobs requeued for a landing replica, and the work they lost
    /// (GPU-hours: seconds of progress since their last checkpoint × their
    /// GPUs), taken off `offline_gpu_hours`.
    pub requeues: u64,
    pub lost_gpu_hours: f64,
    /// Online GPU-hours (GPUs holding a replica, integrated).
    pub online_gpu_hours: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Arrival,
    Finish { job: u32, version: u32 },
    Round,
    Health,
    Hour(u32),
    End,
}

#[derive(Debug, Clone, Default)]
struct GpuRt {
    /// Its offline jobs, in start order (one, or up to K under
    /// `muxflow-nK`).
    offline: Vec<u32>,
    rates: GpuRates,
    /// The online latency factor its offline jobs leave (the model's),
    /// kept for when a gang's speed changes on another GPU.
    slowdown: f64,
    latency_since: f64,
    fsm: Option<Fsm>,
    /// The online service's figures while alone, as the node keeps them.
    solo: Option<Solo>,
}

/// A running job's part on one of its GPUs (a k-GPU job has k).
#[derive(Debug, Clone, Copy, Default)]
struct JobSeat {
    g: u32,
    /// Its SM share and memory cap there, fixed at its start, and the
    /// GPU's whole offline SM budget then (percent).
    sm_pct: u8,
    budget_pct: u8,
    mem_cap_mib: Option<u64>,
    /// The GPU's offline slots it holds (`muxflow-nK`: 1..=K).
    slots: u32,
    /// Pair throughputs with the GPU's online service (x_off, x_on).
    pair: Option<(f64, f64)>,
    /// The GPU's online replica when the job started there (its record's
    /// partner, even if the replica stops meanwhile).
    partner: Option<Service>,
    /// The speed this GPU's model gives it; the job runs at its slowest
    /// seat's (synchronous training waits for it).
    speed: f64,
}

impl JobSeat {
    fn on(g: u32, pair: Option<(f64, f64)>) -> JobSeat {
        JobSeat {
            g,
            pair,
            ..JobSeat::default()
        }
    }
}

#[derive(Debug, Clone, Default)]
struct JobRt {
    remaining_s: f64,
    last_s: f64,
    /// Its speed: its slowest seat's.
    speed: f64,
    version: u32,
    /// Its GPUs while it runs (all of one node); empty otherwise.
    seats: Vec<JobSeat>,
    started: bool,
    run_start_s: f64,
    run_remaining_s: f64,
    /// GPU indices of its typed slots once placed (Slurm 22.05 keeps them).
    slot_gpus: Vec<u32>,
    finished: bool,
    /// It ran on fewer GPUs than it asked for, or on several nodes.
    short: bool,
    /// This run's offline peers: the jobs (ids) that shared one of its
    /// GPUs at any time, as the node's `peers` (issue 15).
    peers: Vec<u32>,
    /// Progress (seconds alone) its last checkpoint holds beyond the
    /// periodic ones: one written at a requeue's warning.
    saved_s: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Integrals {
    util: f64,
    sm: f64,
    mem: f64,
    util_online: f64,
    sm_online: f64,
    work: f64,
    /// Of `work`, the k-GPU jobs'.
    gang_work: f64,
    lent: f64,
    /// GPU-seconds of GPUs holding an online replica.
    online: f64,
}

/// The replay's view of the time integrals' integrands.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    util: f64,
    sm: f64,
    mem: f64,
    util_online: f64,
    sm_online: f64,
    /// Work rate: each running job's speed × its GPUs.
    speed: f64,
    gang_speed: f64,
    lent: usize,
    running: usize,
    online: usize,
}

/// Options that are not part of the scenario.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Measure the matcher rounds' wall time (not reproducible; off for
    /// byte-identical output).
    pub timing: bool,
    /// `muxflow`: the matcher keeps the default predictor (nothing learned
    /// from the records), to compare with the learned one.
    pub default_predictor: bool,
    /// Rounds exact on their candidate graphs only, each one cold (no
    /// pricing, no incremental rounds): what exactness over every pair
    /// buys ([`scaled_matcher`]).
    pub candidates_only: bool,
    /// xCUDA's protection under muxflow: measured per GPU mode by default
    /// ([`crate::protection`]).
    pub protection: crate::protection::Choice,
}

struct Sim<'a> {
    sc: &'a Scenario,
    kind: PolicyKind,
    cfg: &'a muxflow::Config,
    q: EventQueue<Ev>,
    now: f64,
    load: f64,
    gpus: Vec<GpuRt>,
    jobs: Vec<JobRt>,
    /// Per GPU, its online replica now (the scenario's peak placement
    /// without `--autoscale`).
    online: Vec<Option<Service>>,
    online_ids: Vec<u32>,
    /// `--autoscale`: the services' replicas.
    scaling: Option<Scaling>,
    checkpoint: Checkpointing,
    idle_free: BTreeSet<u32>,
    slot_free: BTreeSet<u32>,
    queue: BTreeSet<u32>,
    next_arrival: usize,
    sums: Sums,
    acc: Integrals,
    last_s: f64,
    latency_hist: Vec<f64>,
    jct: Vec<f64>,
    queue_s: Vec<f64>,
    finished: u64,
    gang_finished: u64,
    timeline: Vec<HourRow>,
    hour_acc: Integrals,
    // muxflow
    state: ClusterState,
    state_index: Vec<usize>,
    names: Names,
    /// `[matcher]` with `max_updates_per_round` scaled to the replay's
    /// round interval (the same updates per hour as the daemon's).
    matcher: muxflow::config::Matcher,
    in_state: Vec<bool>,
    pending_unsorted: bool,
    node_index: BTreeMap<String, u32>,
    first_gpu: Vec<u32>,
    runs: Vec<Run>,
    model: Model,
    trained_on_runs: usize,
    rounds: u64,
    round_s: f64,
    /// The daemon's round cache, for the learned model's rounds and the
    /// oracle's; `epoch` names the learned model (retrained: a new one;
    /// failures since are each job's key, [`LearnedNow`]).
    round_cache: RoundCache,
    oracle_cache: RoundCache,
    epoch: u64,
    pred_err: f64,
    pred_n: u64,
    pair_true: f64,
    pair_oracle: f64,
    oom: u64,
    peer_runs: u64,
    refused: u64,
    health_violations: u64,
    timing: bool,
    learn: bool,
    /// xCUDA's protection on each GPU (muxflow policies).
    protection: Vec<model::Protection>,
    /// (job name, online partner) pairs whose placement failed at start since
    /// the model was last trained: not proposed again before it learns
    /// them ([`LearnedNow`]). The daemon retrains every round, so a
    /// failure is in its next round's model; the replay retrains more
    /// rarely and must not propose the pair again meanwhile.
    failed_since_training: Failures,
    /// Per job name, the largest memory cap a start failed under since the
    /// model was trained: its need is above it (what the model learns
    /// from such a run, `Profile::peak_mib`).
    needs_above_since_training: BTreeMap<String, u64>,
    progress: &'a AtomicU64,
}

/// The services' replicas while they scale (`--autoscale`).
#[derive(Debug, Clone, Default)]
struct Scaling {
    /// Per service: its replicas at the daily peak, those running (in start
    /// order) and those stopped (last stopped last).
    peak: Vec<u32>,
    running: Vec<Vec<u32>>,
    stopped: Vec<Vec<u32>>,
    /// Per service, the load each running replica carries (fraction of a
    /// replica's at the peak).
    load: Vec<f64>,
    /// Per replica, its GPUs while it runs.
    on: Vec<Vec<u32>>,
    /// Per GPU, its replica's service while one runs there.
    service_of: Vec<Option<u32>>,
    next_job_id: u32,
    churn: Churn,
}

/// Replays `sc` under `kind` with the production settings in `cfg`;
/// `progress` advances by simulated seconds (for a progress bar).
pub fn run(
    sc: &Scenario,
    kind: PolicyKind,
    cfg: &muxflow::Config,
    settings: &crate::scenario::Settings,
    opts: &RunOptions,
    progress: &AtomicU64,
) -> Outcome {
    // muxflow-nK: the production settings with offline_per_gpu = K.
    let cfg = &muxflow::Config {
        policy: Policy {
            offline_per_gpu: kind.offline_per_gpu(),
            ..cfg.policy.clone()
        },
        ..cfg.clone()
    };
    let mut sim = Sim::new(sc, kind, cfg, settings, opts, progress);
    sim.q.push(0.0, Ev::Hour(0));
    if kind.is_muxflow() {
        sim.q.push(0.0, Ev::Health);
        sim.q.push(settings.round_interval_s, Ev::Round);
    }
    if let Some(j) = sc.jobs.first() {
        sim.q.push(j.arrival_s, Ev::Arrival);
    }
    sim.q.push(sc.end_s, Ev::End);
    while let Some((t, ev)) = sim.q.pop() {
        sim.advance(t);
        match ev {
            Ev::End => {
                let hours = (sc.end_s / 3600.0).ceil() as u32;
                if (sim.timeline.len() as u32) < hours {
                    sim.hour(hours);
                }
                break;
            }
            Ev::Hour(h) => sim.hour(h),
            Ev::Arrival => sim.arrival(),
            Ev::Finish { job, version } => sim.finish(job, version),
            Ev::Round => {
                sim.round();
                let next = t + settings.round_interval_s;
                if next < sc.end_s {
                    sim.q.push(next, Ev::Round);
                }
            }
            Ev::Health => {
                sim.health();
                let next = t + settings.health_interval_s;
                if next < sc.end_s {
                    sim.q.push(next, Ev::Health);
                }
            }
        }
    }
    sim.outcome()
}

impl Scaling {
    /// Every replica of the scenario running, on its peak GPUs (the first
    /// hourly step scales them to the load).
    fn of(sc: &Scenario) -> Scaling {
        let mut s = Scaling {
            peak: vec![0; sc.services],
            running: vec![Vec::new(); sc.services],
            stopped: vec![Vec::new(); sc.services],
            load: vec![1.0; sc.services],
            on: Vec::with_capacity(sc.replicas.len()),
            service_of: vec![None; sc.gpus.len()],
            next_job_id: sc
                .online
                .iter()
                .flatten()
                .map(|o| o.job_id)
                .max()
                .unwrap_or(0),
            churn: Churn::default(),
        };
        for (r, rep) in sc.replicas.iter().enumerate() {
            s.peak[rep.service as usize] += 1;
            s.running[rep.service as usize].push(r as u32);
            s.on.push(rep.gpus.clone());
            for &g in &rep.gpus {
                s.service_of[g as usize] = Some(rep.service);
            }
        }
        s
    }
}

impl<'a> Sim<'a> {
    fn new(
        sc: &'a Scenario,
        kind: PolicyKind,
        cfg: &'a muxflow::Config,
        settings: &crate::scenario::Settings,
        opts: &RunOptions,
        progress: &'a AtomicU64,
    ) -> Sim<'a> {
        let n = sc.gpus.len();
        let mut first_gpu = vec![0u32; sc.nodes.len()];
        for (i, g) in sc.gpus.iter().enumerate().rev() {
            first_gpu[g.node as usize] = i as u32;
        }
        let online_ids: Vec<u32> = (0..n as u32)
            .filter(|&g| sc.online[g as usize].is_some())
            .collect();
        let mut sim = Sim {
            sc,
            kind,
            cfg,
            q: EventQueue::default(),
            now: 0.0,
            load: model::diurnal_load(0),
            gpus: vec![GpuRt::default(); n],
            online: sc.online.clone(),
            scaling: settings.autoscale.then(|| Scaling::of(sc)),
            checkpoint: settings.checkpoint,
            jobs: sc
                .jobs
                .iter()
                .map(|j| JobRt {
                    remaining_s: j.work_s,
                    ..JobRt::default()
                })
                .collect(),
            idle_free: (0..n as u32)
                .filter(|&g| sc.online[g as usize].is_none())
                .collect(),
            slot_free: if kind.shares() && !kind.is_muxflow() {
                online_ids.iter().copied().collect()
            } else {
                BTreeSet::new()
            },
            online_ids,
            queue: BTreeSet::new(),
            next_arrival: 0,
            sums: Sums::default(),
            acc: Integrals::default(),
            last_s: 0.0,
            latency_hist: vec![0.0; LATENCY_BINS],
            jct: Vec::new(),
            queue_s: Vec::new(),
            finished: 0,
            gang_finished: 0,
            timeline: Vec::new(),
            hour_acc: Integrals::default(),
            state: ClusterState::default(),
            state_index: vec![usize::MAX; n],
            names: Names::from_config(&cfg.slurm),
            matcher: scaled_matcher(
                &cfg.matcher,
                settings.round_interval_s,
                opts.candidates_only,
            ),
            in_state: vec![false; sc.jobs.len()],
            pending_unsorted: false,
            node_index: sc
                .nodes
                .iter()
                .enumerate()
                .map(|(i, s)| (s.clone(), i as u32))
                .collect(),
            first_gpu,
            runs: Vec::new(),
            model: Model::default(),
            trained_on_runs: 0,
            rounds: 0,
            round_s: 0.0,
            round_cache: RoundCache::default(),
            oracle_cache: RoundCache::default(),
            epoch: 0,
            pred_err: 0.0,
            pred_n: 0,
            pair_true: 0.0,
            pair_oracle: 0.0,
            oom: 0,
            peer_runs: 0,
            refused: 0,
            health_violations: 0,
            timing: opts.timing,
            learn: !opts.default_predictor,
            protection: {
                let by_model = crate::protection::per_model(&opts.protection, &sc.models)
                    .expect("sim/data/protection.toml has every mode (sim's tests read it)");
                sc.gpus.iter().map(|g| by_model[g.model as usize]).collect()
            },
            failed_since_training: Failures::default(),
            needs_above_since_training: BTreeMap::new(),
            progress,
        };
        if kind.is_muxflow() {
            for g in 0..n as u32 {
                let gpu = &sc.gpus[g as usize];
                let svc = sc.online[g as usize].as_ref();
                if svc.is_some() {
                    sim.gpus[g as usize].fsm = Some(Fsm::new(0));
                }
                sim.state_index[g as usize] = sim.state.gpus.len();
                sim.state.gpus.push(GpuState {
                    node: sc.nodes[gpu.node as usize].clone(),
                    index: gpu.index,
                    published: GpuPublished {
                        index: gpu.index,
                        state: HealthState::Healthy,
                        solo_sm_pct: None,
                        online_mem_mib: None,
                        mem_mib: gpu.mem_mib,
                        offline: 0,
                        multiuser: true,
                    },
                    // Empty: an idle GPU, the round's solo candidate.
                    online_jobs: svc.map(|s| s.job_id).into_iter().collect(),
                    slots_used: 0,
                    offline_jobs: 0,
                    owners: Vec::new(),
                });
            }
        }
        sim.sums.online = sim.online_ids.len();
        let all: Vec<u32> = (0..n as u32).collect();
        sim.refresh(&all);
        sim
    }

    /// Integrates the current rates up to `t`.
    fn advance(&mut self, t: f64) {
        let dt = t - self.last_s;
        if dt > 0.0 {
            let s = &self.sums;
            let a = &mut self.acc;
            a.util += s.util * dt;
            a.sm += s.sm * dt;
            a.mem += s.mem * dt;
            a.util_online += s.util_online * dt;
            a.sm_online += s.sm_online * dt;
            a.work += s.speed * dt;
            a.gang_work += s.gang_speed * dt;
            a.lent += s.lent as f64 * dt;
            a.online += s.online as f64 * dt;
            self.last_s = t;
        }
        self.now = t;
    }

    fn online_side(&self, g: u32) -> Option<OnlineSide> {
        let gpu = &self.sc.gpus[g as usize];
        let load = match &self.scaling {
            Some(sc) => sc.service_of[g as usize].map_or(self.load, |s| sc.load[s as usize]),
            None => self.load,
        };
        self.online[g as usize].as_ref().map(|s| OnlineSide {
            share: s.share,
            load,
            mem: s.mem_mib as f64 / gpu.mem_mib as f64,
        })
    }

    /// Job `j`'s seat on GPU `g` (it runs there).
    fn seat(&self, j: u32, g: u32) -> &JobSeat {
        self.jobs[j as usize]
            .seats
            .iter()
            .find(|s| s.g == g)
            .expect("a job on the GPU has a seat there")
    }

    /// The speed GPU `g`'s model gives each of its offline jobs (a gang's
    /// seat there), and the online latency factor they leave.
    fn local_speeds(&self, g: u32) -> (Vec<f64>, f64) {
        let rt = &self.gpus[g as usize];
        let online = self.online_side(g);
        if self.kind.is_muxflow() {
            let paused = rt.fsm.is_some_and(|f| f.state.pauses_offline());
            let members: Vec<SlotJob> = rt
                .offline
                .iter()
                .map(|&j| {
                    let job = &self.sc.jobs[j as usize];
                    let seat = self.seat(j, g);
                    SlotJob {
                        with_online: online.and(seat.pair),
                        share: f64::from(seat.sm_pct) / 100.0,
                        budget: f64::from(seat.budget_pct) / 100.0,
                        demand: OFFLINE_SM * job.share,
                    }
                })
                .collect();
            let types: Vec<u16> = rt
                .offline
                .iter()
                .map(|&j| self.sc.jobs[j as usize].job_type)
                .collect();
            let between = |i: usize, k: usize| {
                // A start checks that every pair of them can co-locate.
                self.sc.pairs.speed(types[i], types[k]).unwrap_or(0.0)
            };
            model::muxflow_slots(&members, between, paused, self.protection[g as usize])
        } else {
            // One offline job at most.
            let mut latency = 1.0;
            let speeds = rt
                .offline
                .iter()
                .map(|&j| match (online.is_some(), self.seat(j, g).pair) {
                    (false, _) | (true, None) => 1.0,
                    (true, Some((x_off, x_on))) => {
                        let (speed, lat) = match self.kind {
                            PolicyKind::Priority => model::priority(x_off, x_on),
                            _ => model::time_sharing(x_off, x_on),
                        };
                        latency = lat;
                        speed
                    }
                })
                .collect();
            (speeds, latency)
        }
    }

    /// Job `j`'s speed from its seats: its slowest GPU's.
    fn gang_speed(&self, j: u32) -> f64 {
        self.jobs[j as usize]
            .seats
            .iter()
            .map(|s| s.speed)
            .fold(f64::INFINITY, f64::min)
    }

    /// GPU `g`'s rates from its jobs' seats: each job counts at its own
    /// (slowest-seat) speed, as a gang's faster GPUs wait for its slowest.
    fn rates_of(&self, g: u32) -> GpuRates {
        let rt = &self.gpus[g as usize];
        let gpu = &self.sc.gpus[g as usize];
        let sides: Vec<OfflineSide> = rt
            .offline
            .iter()
            .map(|&j| {
                let job = &self.sc.jobs[j as usize];
                OfflineSide {
                    share: job.share,
                    mem: job.mem_mib as f64 / gpu.mem_mib as f64,
                    speed: self.gang_speed(j),
                }
            })
            .collect();
        gpu_rates(self.online_side(g), &sides, rt.slowdown)
    }

    /// Carries GPU `g`'s new rates into the sums and the latency
    /// histogram; false when they did not change.
    fn apply_rates(&mut self, g: u32, new: GpuRates) -> bool {
        let online = self.online[g as usize].is_some();
        let rt = &mut self.gpus[g as usize];
        let old = rt.rates;
        if new == old {
            return false;
        }
        let s = &mut self.sums;
        s.util += new.util - old.util;
        s.sm += new.sm - old.sm;
        s.mem += new.mem - old.mem;
        if online {
            s.util_online += new.util - old.util;
            s.sm_online += new.sm - old.sm;
            if new.latency != old.latency {
                if old.latency > 0.0 {
                    self.latency_hist[latency_bin(old.latency)] += self.now - rt.latency_since;
                }
                rt.latency_since = self.now;
            }
        }
        rt.rates = new;
        true
    }

    /// Recomputes the GPUs `gs` (ascending) after a change: each GPU's
    /// model speeds and latency, its jobs' speeds (a gang's is its slowest
    /// seat's) and finish times, and the rates of every GPU a changed gang
    /// also runs on.
    fn refresh(&mut self, gs: &[u32]) {
        debug_assert!(gs.windows(2).all(|w| w[0] < w[1]));
        for &g in gs {
            let (speeds, slowdown) = self.local_speeds(g);
            self.gpus[g as usize].slowdown = slowdown;
            let jobs = std::mem::take(&mut self.gpus[g as usize].offline);
            for (&j, speed) in jobs.iter().zip(speeds) {
                for s in self.jobs[j as usize].seats.iter_mut().filter(|s| s.g == g) {
                    s.speed = speed;
                }
            }
            self.gpus[g as usize].offline = jobs;
        }
        let mut elsewhere: Vec<u32> = Vec::new();
        for &g in gs {
            let changed = self.apply_rates(g, self.rates_of(g));
            let jobs = self.gpus[g as usize].offline.clone();
            for j in jobs {
                let seats = &self.jobs[j as usize].seats;
                // A gang on several of `gs` is set once, at its first.
                if seats
                    .iter()
                    .any(|s| s.g < g && gs.binary_search(&s.g).is_ok())
                {
                    continue;
                }
                let speed = self.gang_speed(j);
                if speed != self.jobs[j as usize].speed {
                    elsewhere.extend(
                        seats
                            .iter()
                            .map(|s| s.g)
                            .filter(|h| gs.binary_search(h).is_err()),
                    );
                } else if !changed {
                    continue;
                }
                self.set_speed(j, speed);
            }
        }
        elsewhere.sort_unstable();
        elsewhere.dedup();
        for h in elsewhere {
            self.apply_rates(h, self.rates_of(h));
        }
    }

    fn set_speed(&mut self, j: u32, speed: f64) {
        let gpus = f64::from(self.sc.jobs[j as usize].gpus);
        let job = &mut self.jobs[j as usize];
        job.remaining_s = (job.remaining_s - job.speed * (self.now - job.last_s)).max(0.0);
        job.last_s = self.now;
        if job.speed == speed && !job.seats.is_empty() {
            return;
        }
        // Work done counts each of its GPUs (GPU-hours, as k workers did).
        self.sums.speed += (speed - job.speed) * gpus;
        if gpus > 1.0 {
            self.sums.gang_speed += (speed - job.speed) * gpus;
        }
        job.speed = speed;
        job.version += 1;
        if speed > 0.0 {
            let at = self.now + job.remaining_s / speed;
            self.q.push(
                at,
                Ev::Finish {
                    job: j,
                    version: job.version,
                },
            );
        }
    }

    fn hour(&mut self, h: u32) {
        if h > 0 {
            let a = self.acc;
            let p = self.hour_acc;
            let n = self.sc.gpus.len().max(1) as f64;
            let n_on = self.online_ids.len().max(1) as f64;
            self.timeline.push(HourRow {
                hour: h - 1,
                gpu_util: (a.util - p.util) / 3600.0 / n,
                sm_activity: (a.sm - p.sm) / 3600.0 / n,
                online_gpu_util: match self.scaling {
                    Some(_) => (a.util_online - p.util_online) / (a.online - p.online).max(1e-9),
                    None => (a.util_online - p.util_online) / 3600.0 / n_on,
                },
                online_load: self.load,
                offline_running: self.sums.running,
                offline_waiting: self.queue.len(),
                offline_finished: self.finished,
                lent_gpus: (a.lent - p.lent) / 3600.0,
            });
            self.hour_acc = a;
            self.progress.fetch_add(3600, Ordering::Relaxed);
        }
        if f64::from(h) * 3600.0 >= self.sc.end_s {
            return;
        }
        self.load = model::diurnal_load(h);
        if self.scaling.is_some() {
            self.scale();
        }
        let online = std::mem::take(&mut self.online_ids);
        self.refresh(&online);
        self.online_ids = online;
        self.resum();
        self.q.push(f64::from(h + 1) * 3600.0, Ev::Hour(h + 1));
    }

    /// Sums again from the GPUs (keeps floating-point drift from piling up).
    fn resum(&mut self) {
        let mut s = Sums {
            lent: self.sums.lent,
            running: self.sums.running,
            online: self.sums.online,
            ..Sums::default()
        };
        for (g, rt) in self.gpus.iter().enumerate() {
            s.util += rt.rates.util;
            s.sm += rt.rates.sm;
            s.mem += rt.rates.mem;
            if self.online[g].is_some() {
                s.util_online += rt.rates.util;
                s.sm_online += rt.rates.sm;
            }
        }
        for (rt, job) in self.jobs.iter().zip(&self.sc.jobs) {
            if !rt.seats.is_empty() {
                let work = rt.speed * f64::from(job.gpus);
                s.speed += work;
                if job.gpus > 1 {
                    s.gang_speed += work;
                }
            }
        }
        self.sums = s;
    }

    fn allowed(&self, j: u32, g: u32) -> bool {
        self.sc.jobs[j as usize]
            .models
            .as_ref()
            .is_none_or(|m| m.contains(&self.sc.gpus[g as usize].model))
    }

    /// Whether job `j` can share GPU `g` with its online service: the pair
    /// was measured together and both fit the GPU's memory.
    fn fits_beside(&self, j: u32, g: u32) -> Option<(f64, f64)> {
        let job = &self.sc.jobs[j as usize];
        let svc = self.online[g as usize].as_ref()?;
        let pair = self.sc.pairs.pair(job.job_type, svc.job_type)?;
        (job.mem_mib + svc.mem_mib <= self.sc.gpus[g as usize].mem_mib).then_some(pair)
    }

    fn arrival(&mut self) {
        let j = self.next_arrival as u32;
        self.next_arrival += 1;
        if let Some(next) = self.sc.jobs.get(self.next_arrival) {
            self.q.push(next.arrival_s, Ev::Arrival);
        }
        // Under muxflow the matcher's round places it, on idle GPUs or
        // beside online services; the other policies place it at once.
        if self.kind.is_muxflow() {
            self.enqueue(j);
            return;
        }
        match self.plain_placement(j, None) {
            Some(seats) => self.start(j, seats),
            None => self.enqueue(j),
        }
    }

    /// GPU ids of node `n`.
    fn node_gpus(&self, n: u32) -> std::ops::Range<u32> {
        let end = self
            .first_gpu
            .get(n as usize + 1)
            .copied()
            .unwrap_or(self.sc.gpus.len() as u32);
        self.first_gpu[n as usize]..end
    }

    /// Where `exclusive`, `time-sharing` and `priority` start job `j` now
    /// (on node `on_node` only, when given): its k GPUs, all of one node,
    /// or nothing. Idle GPUs first (whole; the first node with k of them
    /// that the job's gpu_spec allows), then, when sharing, the first node
    /// whose idle GPUs and free slots beside an online service it fits
    /// make k (idle ones first, then by GPU order). A 1-GPU job thus takes
    /// the first idle GPU, else the first free slot it fits (first fit).
    fn plain_placement(&self, j: u32, on_node: Option<u32>) -> Option<Vec<JobSeat>> {
        let k = self.sc.jobs[j as usize].gpus as usize;
        let range = match on_node {
            Some(n) => self.node_gpus(n),
            None => 0..self.sc.gpus.len() as u32,
        };
        let mut seats: Vec<JobSeat> = Vec::new();
        let mut node = None;
        for g in self.idle_free.range(range.clone()) {
            if !self.allowed(j, *g) {
                continue;
            }
            let n = self.sc.gpus[*g as usize].node;
            if node != Some(n) {
                node = Some(n);
                seats.clear();
            }
            seats.push(JobSeat::on(*g, None));
            if seats.len() == k {
                return Some(seats);
            }
        }
        if !self.kind.shares() {
            return None;
        }
        // No idle GPU it may use anywhere: only slots count below.
        let any_idle = node.is_some();
        let mut last = None;
        for g in self.slot_free.range(range) {
            let n = self.sc.gpus[*g as usize].node;
            if last == Some(n) {
                continue; // this node was tried whole
            }
            last = Some(n);
            seats.clear();
            if any_idle {
                seats.extend(
                    self.idle_free
                        .range(self.node_gpus(n))
                        .filter(|&&h| self.allowed(j, h))
                        .map(|&h| JobSeat::on(h, None)),
                );
            }
            for h in self.slot_free.range(self.node_gpus(n)) {
                if seats.len() == k {
                    break;
                }
                if let Some(pair) = self.fits_beside(j, *h).filter(|_| self.allowed(j, *h)) {
                    seats.push(JobSeat::on(*h, Some(pair)));
                }
            }
            if seats.len() >= k {
                seats.truncate(k);
                return Some(seats);
            }
        }
        None
    }

    fn enqueue(&mut self, j: u32) {
        self.queue.insert(j);
        if self.kind.is_muxflow() && !self.in_state[j as usize] {
            let job = &self.sc.jobs[j as usize];
            if self.state.pending.last().is_some_and(|p| p.id > job.id) {
                self.pending_unsorted = true;
            }
            self.state.pending.push(PendingJob {
                id: job.id,
                user: "sim".into(),
                account: String::new(),
                name: self.sc.tasks[job.task as usize].name.clone(),
                required_nodes: String::new(),
                slot_gpus: self.jobs[j as usize].slot_gpus.clone(),
                // A k-GPU task is one job on k GPUs of one node: the round
                // places it as a gang.
                gpus: job.gpus,
                slots: self.jobs[j as usize].slot_gpus.iter().map(|_| 1).collect(),
                held: true,
                waiting: None,
                refusals: 0,
                // The traces name no CPU or memory request: GPUs only.
                need: Default::default(),
            });
            self.in_state[j as usize] = true;
        }
    }

    /// Starts job `j` on its seats (all its GPUs together).
    fn start(&mut self, j: u32, mut seats: Vec<JobSeat>) {
        seats.sort_by_key(|s| s.g);
        for s in &mut seats {
            s.partner = self.online[s.g as usize];
        }
        self.queue.remove(&j);
        let asked = self.sc.jobs[j as usize].gpus as usize;
        let node = self.sc.gpus[seats[0].g as usize].node;
        // Counted from what it holds, not from what was meant: the row
        // that must read 0.
        let short = seats.len() < asked
            || seats.windows(2).any(|w| w[0].g == w[1].g)
            || seats
                .iter()
                .any(|s| self.sc.gpus[s.g as usize].node != node);
        let job = &mut self.jobs[j as usize];
        if !job.started {
            job.started = true;
            self.queue_s
                .push(self.now - self.sc.jobs[j as usize].arrival_s);
        }
        job.short |= short;
        job.last_s = self.now;
        job.run_start_s = self.now;
        job.run_remaining_s = job.remaining_s;
        job.speed = 0.0;
        job.peers.clear();
        let gs: Vec<u32> = seats.iter().map(|s| s.g).collect();
        job.seats = seats;
        self.sums.running += 1;
        for &g in &gs {
            self.idle_free.remove(&g);
            self.slot_free.remove(&g);
            let online = self.online[g as usize].is_some();
            self.gpus[g as usize].offline.push(j);
            let id = self.sc.jobs[j as usize].id;
            for i in 0..self.gpus[g as usize].offline.len() {
                let k = self.gpus[g as usize].offline[i];
                if k != j {
                    let other = self.sc.jobs[k as usize].id;
                    add_peers(&mut self.jobs[j as usize].peers, Some(id), [other]);
                    add_peers(&mut self.jobs[k as usize].peers, Some(other), [id]);
                }
            }
            let rt = &self.gpus[g as usize];
            let on_gpu = rt.offline.len() as u32;
            if rt.fsm.is_some_and(|f| !f.state.accepts_offline()) {
                self.health_violations += 1;
            }
            // Lent: GPUs owned by online work holding offline work (one
            // however many jobs it holds).
            if online && on_gpu == 1 {
                self.sums.lent += 1;
            }
            self.publish(g);
            // Force new speeds even if the rates look unchanged.
            self.gpus[g as usize].rates.offline_speed = -1.0;
        }
        self.refresh(&gs);
    }

    /// Starts and stops replicas so that each service runs
    /// [`replicas_for`] its peak at the hour's load (`--autoscale`):
    /// services scale in first (newest replica first, as a ReplicaSet
    /// scales down), then out, each new replica placed as Slurm places an
    /// online job ([`Sim::slurm_place`]); the offline jobs on its GPUs are
    /// requeued ([`Sim::requeue`]), as the online job's Prolog does.
    fn scale(&mut self) {
        let mut sc = self.scaling.take().expect("scaling services");
        let mut changed: Vec<u32> = Vec::new();
        for s in 0..sc.peak.len() {
            let want = replicas_for(sc.peak[s], self.load) as usize;
            while sc.running[s].len() > want {
                let r = sc.running[s].pop().expect("a running replica");
                for g in std::mem::take(&mut sc.on[r as usize]) {
                    sc.service_of[g as usize] = None;
                    self.set_owner(g, None);
                    changed.push(g);
                }
                sc.stopped[s].push(r);
                sc.churn.replica_stops += 1;
            }
        }
        let mut requeued: Vec<u32> = Vec::new();
        for s in 0..sc.peak.len() {
            let want = replicas_for(sc.peak[s], self.load) as usize;
            while sc.running[s].len() < want {
                let Some(&r) = sc.stopped[s].last() else {
                    break;
                };
                let Some(gs) = self.slurm_place(r) else {
                    sc.churn.replica_hours_short += (want - sc.running[s].len()) as u64;
                    break;
                };
                sc.stopped[s].pop();
                // The online job's Prolog requeues every offline job there
                // and waits until they have left.
                let mut delay: f64 = 0.0;
                for &g in &gs {
                    for j in self.gpus[g as usize].offline.clone() {
                        delay = delay.max(self.requeue(j, &mut sc.churn, &mut changed));
                        requeued.push(j);
                    }
                }
                let template = self.sc.online[self.sc.replicas[r as usize].gpus[0] as usize]
                    .expect("a replica's GPU holds it at the peak");
                sc.next_job_id += 1;
                for &g in &gs {
                    sc.service_of[g as usize] = Some(s as u32);
                    let share = template.share;
                    let mem =
                        model::MEM_PER_SHARE * share * self.sc.gpus[g as usize].mem_mib as f64;
                    self.set_owner(
                        g,
                        Some(Service {
                            job_id: sc.next_job_id,
                            mem_mib: mem.round() as u64,
                            ..template
                        }),
                    );
                    changed.push(g);
                }
                sc.on[r as usize] = gs;
                sc.running[s].push(r);
                let c = &mut sc.churn;
                c.replica_starts += 1;
                c.starts_delayed += u64::from(delay > 0.0);
                c.start_delay_total_s += delay;
                c.start_delay_max_s = c.start_delay_max_s.max(delay);
            }
            let running = sc.running[s].len().max(1) as f64;
            sc.load[s] = (f64::from(sc.peak[s]) * self.load / running).min(1.0);
        }
        self.scaling = Some(sc);
        self.online_ids = (0..self.sc.gpus.len() as u32)
            .filter(|&g| self.online[g as usize].is_some())
            .collect();
        self.sums.online = self.online_ids.len();
        changed.sort_unstable();
        changed.dedup();
        self.refresh(&changed);
        if !self.kind.is_muxflow() {
            // The other policies place at once: the requeued jobs (oldest
            // first), then what waits, on the nodes that freed GPUs.
            requeued.sort_unstable();
            for j in requeued {
                if let Some(seats) = self.plain_placement(j, None) {
                    self.start(j, seats);
                }
            }
            // `changed` is in GPU order, so a node's GPUs are together.
            let gpus = &self.sc.gpus;
            let by_node: Vec<Vec<u32>> = changed
                .chunk_by(|a, b| gpus[*a as usize].node == gpus[*b as usize].node)
                .map(<[u32]>::to_vec)
                .collect();
            for gs in by_node {
                self.fill(&gs);
            }
        }
    }

    /// Where Slurm starts replica `r` (k GPUs of one node, of a model it
    /// may use, none held by an online job): the first such node in node
    /// order, its lowest free GPUs. Under muxflow an offline job holds no
    /// `gres/gpu`, so Slurm sees its GPU as free and may land there; under
    /// the other policies it holds its GPU, and Slurm preempts it only
    /// when no node has k GPUs free of it.
    fn slurm_place(&self, r: u32) -> Option<Vec<u32>> {
        let rep = &self.sc.replicas[r as usize];
        let k = rep.gpus.len();
        let passes: &[bool] = if self.kind.is_muxflow() {
            &[true]
        } else {
            &[false, true]
        };
        for &preempt in passes {
            for n in 0..self.sc.nodes.len() as u32 {
                let range = self.node_gpus(n);
                let model = self.sc.gpus[range.start as usize].model;
                if rep.models.as_ref().is_some_and(|m| !m.contains(&model)) {
                    continue;
                }
                let gs: Vec<u32> = range
                    .filter(|&g| {
                        self.online[g as usize].is_none()
                            && (preempt || self.gpus[g as usize].offline.is_empty())
                    })
                    .take(k)
                    .collect();
                if gs.len() == k {
                    return Some(gs);
                }
            }
        }
        None
    }

    /// Requeues offline job `j` for a replica landing on one of its GPUs:
    /// its run ends, its record is written, the work since its last
    /// checkpoint is lost (none when it checkpoints at the warning within
    /// the grace), and it waits again. Returns how long the replica waits
    /// for it: the warning's checkpoint (when it takes one) and its exit.
    /// The GPUs it frees go to `freed` (a gang's others are free now).
    fn requeue(&mut self, j: u32, churn: &mut Churn, freed: &mut Vec<u32>) -> f64 {
        if self.kind.is_muxflow() {
            let seats = self.jobs[j as usize].seats.clone();
            self.report(j, &seats, false);
        }
        freed.extend(self.stop(j));
        let ck = self.checkpoint;
        let saves = ck.on_requeue && ck.save_s <= ck.grace_s;
        let job = &self.sc.jobs[j as usize];
        let rt = &mut self.jobs[j as usize];
        let done = job.work_s - rt.remaining_s;
        let kept = if saves {
            done
        } else {
            ((done / ck.interval_s).floor() * ck.interval_s)
                .max(rt.saved_s)
                .min(done)
        };
        rt.saved_s = kept;
        let lost = done - kept;
        rt.remaining_s += lost;
        let gpus = f64::from(job.gpus);
        self.acc.work -= lost * gpus;
        if job.gpus > 1 {
            self.acc.gang_work -= lost * gpus;
        }
        churn.requeues += 1;
        churn.lost_gpu_hours += lost * gpus / 3600.0;
        self.enqueue(j);
        let warned = if ck.on_requeue {
            ck.save_s.min(ck.grace_s)
        } else {
            0.0
        };
        warned + REQUEUE_EXIT_S
    }

    /// Gives GPU `g` to an online replica (`Some`, the GPU holding no
    /// offline work) or takes it back (`None`; its offline jobs run on
    /// alone): the sums, the free sets, the health state and what the
    /// round sees follow.
    fn set_owner(&mut self, g: u32, owner: Option<Service>) {
        // Out of the sums under its old ownership (the latency histogram
        // closes its interval); the next refresh adds it back.
        self.apply_rates(g, GpuRates::default());
        let had = self.online[g as usize].is_some();
        let busy = !self.gpus[g as usize].offline.is_empty();
        debug_assert!(owner.is_none() || !busy, "a replica lands on a freed GPU");
        if had && busy {
            self.sums.lent -= 1;
        }
        self.online[g as usize] = owner;
        let rt = &mut self.gpus[g as usize];
        rt.solo = None;
        rt.fsm = (owner.is_some() && self.kind.is_muxflow()).then(|| Fsm::new(self.now as u64));
        self.slot_free.remove(&g);
        self.idle_free.remove(&g);
        match owner {
            Some(_) if self.kind.shares() && !self.kind.is_muxflow() => {
                self.slot_free.insert(g);
            }
            Some(_) => {}
            None if !busy => {
                self.idle_free.insert(g);
            }
            None => {}
        }
        if let Some(&k) = self
            .state_index
            .get(g as usize)
            .filter(|&&k| k != usize::MAX)
        {
            let gpu = &mut self.state.gpus[k];
            gpu.online_jobs = owner.map(|s| s.job_id).into_iter().collect();
            gpu.published.state = HealthState::Healthy;
            gpu.published.solo_sm_pct = None;
            gpu.published.online_mem_mib = None;
        }
    }

    /// What GPU `g`'s offline jobs hold, in the round's state.
    fn publish(&mut self, g: u32) {
        if let Some(&k) = self
            .state_index
            .get(g as usize)
            .filter(|&&k| k != usize::MAX)
        {
            let slots = self.slots_held(g);
            let on_gpu = self.gpus[g as usize].offline.len() as u32;
            self.state.gpus[k].slots_used = slots;
            self.state.gpus[k].offline_jobs = on_gpu;
            self.state.gpus[k].published.offline = on_gpu;
        }
    }

    /// The offline slots GPU `g`'s running jobs hold.
    fn slots_held(&self, g: u32) -> u32 {
        self.gpus[g as usize]
            .offline
            .iter()
            .flat_map(|&k| self.jobs[k as usize].seats.iter().filter(|s| s.g == g))
            .map(|s| s.slots.max(1))
            .sum()
    }

    /// Takes job `j` off all its GPUs (finished or not); returns them.
    fn stop(&mut self, j: u32) -> Vec<u32> {
        self.set_speed(j, 0.0);
        let job = &mut self.jobs[j as usize];
        // Taken, not cleared: a finished job keeps no allocation.
        let gs: Vec<u32> = std::mem::take(&mut job.seats).iter().map(|s| s.g).collect();
        job.version += 1;
        self.sums.running -= 1;
        for &g in &gs {
            let online = self.online[g as usize].is_some();
            let rt = &mut self.gpus[g as usize];
            rt.offline.retain(|&k| k != j);
            let now_free = rt.offline.is_empty();
            // Force new speeds for the jobs left (their partners changed).
            rt.rates.offline_speed = -1.0;
            self.publish(g);
            if online {
                if now_free {
                    self.sums.lent -= 1;
                }
                if self.kind.shares() && !self.kind.is_muxflow() {
                    self.slot_free.insert(g);
                }
            } else if now_free {
                self.idle_free.insert(g);
            }
        }
        self.refresh(&gs);
        gs
    }

    fn finish(&mut self, j: u32, version: u32) {
        let job = &self.jobs[j as usize];
        if job.version != version || job.seats.is_empty() || job.finished {
            return;
        }
        if self.kind.is_muxflow() {
            let seats = job.seats.clone();
            self.report(j, &seats, false);
        }
        let gs = self.stop(j);
        self.jobs[j as usize].finished = true;
        self.jobs[j as usize].remaining_s = 0.0;
        self.finished += 1;
        if self.sc.jobs[j as usize].gpus > 1 {
            self.gang_finished += 1;
        }
        self.jct.push(self.now - self.sc.jobs[j as usize].arrival_s);
        self.fill(&gs);
    }

    /// Gives freed GPUs (of one node) to the oldest waiting jobs that can
    /// use them, while one of them is free.
    fn fill(&mut self, freed: &[u32]) {
        if self.kind.is_muxflow() {
            return; // the next round places jobs there
        }
        let node = self.sc.gpus[freed[0] as usize].node;
        while freed
            .iter()
            .any(|g| self.idle_free.contains(g) || self.slot_free.contains(g))
        {
            let found = self
                .queue
                .iter()
                .find_map(|&j| Some((j, self.plain_placement(j, Some(node))?)));
            match found {
                Some((j, seats)) => self.start(j, seats),
                None => break,
            }
        }
    }

    /// The AdminComment the plugin writes for this run, read back through
    /// sacct's parser into the predictor's history.
    /// A k-GPU job's record is the plugin's: its first GPU in the main
    /// fields, the others in `gang`; its progress is the gang's (its
    /// slowest GPU's).
    fn report(&mut self, j: u32, seats: &[JobSeat], oom: bool) {
        let job = &self.sc.jobs[j as usize];
        let rt = &self.jobs[j as usize];
        let first = &seats[0];
        let g = first.g;
        let gpu = &self.sc.gpus[g as usize];
        let svc = first.partner.as_ref();
        let solo = self.sc.pairs.solo[job.job_type as usize];
        let wall = self.now - rt.run_start_s;
        let remaining = (rt.remaining_s - rt.speed * (self.now - rt.last_s)).max(0.0);
        let done = rt.run_remaining_s - remaining;
        let steps_per_s = (!oom && wall > 0.0).then(|| solo * done / wall);
        let peak_mib = match (svc, first.mem_cap_mib) {
            (Some(_), Some(cap)) => job.mem_mib.min(cap),
            _ => job.mem_mib,
        };
        // The workload reports no steps: its progress is xCUDA's launch
        // count over the node's run time (`LAUNCHES_PER_STEP` a step).
        let run_s = wall.round().max(1.0);
        // Those that shared its GPUs during the run, and those there now
        // (a start refused for memory: the jobs it met).
        let mut peers = rt.peers.clone();
        let now = seats
            .iter()
            .flat_map(|s| &self.gpus[s.g as usize].offline)
            .map(|&k| self.sc.jobs[k as usize].id);
        add_peers(&mut peers, Some(job.id), now);
        self.peer_runs += u64::from(!peers.is_empty());
        let report = JobReport {
            mode: Some(Mode::Offline),
            node: Some(self.sc.nodes[gpu.node as usize].clone()),
            gpu: Some(gpu.index),
            sm_pct: svc.map(|_| first.sm_pct),
            mem_cap_mib: svc.and(first.mem_cap_mib),
            partner: svc.map(|s| s.job_id),
            oom: Some(u64::from(oom)),
            // The node's NVML reading (what the predictor trusts) and
            // xCUDA's own count (the job's claim) agree in the model.
            measured_peak_mib: Some(peak_mib),
            peak_mib: Some(peak_mib),
            run_s: Some(run_s as u64),
            launches: steps_per_s.map(|s| (s * LAUNCHES_PER_STEP * run_s).round() as u64),
            peers,
            gang: seats[1..]
                .iter()
                .map(|s| {
                    let svc = s.partner.as_ref();
                    GangGpu {
                        gpu: self.sc.gpus[s.g as usize].index,
                        sm_pct: svc.map(|_| s.sm_pct),
                        mem_cap_mib: svc.and(s.mem_cap_mib),
                        partner: svc.map(|p| p.job_id),
                    }
                })
                .collect(),
            ..JobReport::default()
        };
        let sacct = SacctJob {
            job_id: job.id,
            name: self.sc.tasks[job.task as usize].name.clone(),
            user: "sim".into(),
            comment: SacctComment {
                administrator: Some(report.encode()),
            },
            time: SacctTime {
                end: self.now as u64,
            },
            ..SacctJob::default()
        };
        // The online partner, running, in the same listing: its (user,
        // name) names the pair's column.
        let partner = svc.map(|s| SacctJob {
            job_id: s.job_id,
            name: self.sc.tasks[s.task as usize].name.clone(),
            user: "sim".into(),
            ..SacctJob::default()
        });
        let listing: Vec<SacctJob> = std::iter::once(sacct).chain(partner).collect();
        self.runs.extend(runs_from_sacct(&listing));
    }

    /// A SysMonitor step on every online GPU, with the reading the
    /// simulated GPU gives now.
    fn health(&mut self) {
        for i in 0..self.online_ids.len() {
            let g = self.online_ids[i];
            let rt = &mut self.gpus[g as usize];
            let r = rt.rates;
            let metrics = Metrics {
                utilization_pct: r.util * 100.0,
                sm_activity_pct: Some(r.sm * 100.0),
                sm_clock_fraction: Some(model::clock_fraction(r.sm)),
                memory_pct: r.mem * 100.0,
            };
            // Solo figures, as the node records them: the online service's
            // SM activity (running mean) and memory (largest) while no
            // offline job is on the GPU.
            let svc = self.online[g as usize].as_ref().expect("online GPU");
            if rt.offline.is_empty() {
                rt.solo = Some(Solo::next(
                    rt.solo.take(),
                    vec![svc.job_id],
                    &metrics,
                    svc.mem_mib,
                    self.now as u64,
                ));
            }
            let before = rt.fsm.expect("muxflow GPU");
            let (after, _) = before.step(
                &Input {
                    now_s: self.now as u64,
                    metrics: Some(metrics),
                    fault: false,
                    offline_only: false,
                },
                &self.cfg.health,
            );
            rt.fsm = Some(after);
            let k = self.state_index[g as usize];
            let p = &mut self.state.gpus[k].published;
            p.state = after.state;
            if let Some(solo) = &rt.solo {
                p.solo_sm_pct = solo.published_sm_pct();
                p.online_mem_mib = Some(solo.mem_mib);
            }
            if before.state.pauses_offline() != after.state.pauses_offline() {
                // A gang with a seat here pauses (or resumes) whole.
                self.refresh(&[g]);
            }
            let rt = &self.gpus[g as usize];
            if after.state.pauses_offline()
                && rt
                    .offline
                    .iter()
                    .any(|&j| self.jobs[j as usize].speed > 0.0)
            {
                self.health_violations += 1;
            }
        }
    }

    fn gpu_of(&self, node: &str, index: u32) -> Option<u32> {
        let n = *self.node_index.get(node)?;
        let g = self.first_gpu[n as usize] + index;
        (self.sc.gpus.get(g as usize)?.node == n).then_some(g)
    }

    /// Whether job `j` can join the offline jobs on GPU `g` (`muxflow-nK`):
    /// each pair of it and one of them was measured together, and all of
    /// them, the online service's memory included, fit the GPU's memory.
    /// True when the GPU has none.
    fn fits_offline(&self, j: u32, g: u32) -> bool {
        let on = &self.gpus[g as usize].offline;
        if on.is_empty() {
            return true;
        }
        let job = &self.sc.jobs[j as usize];
        let svc_mib = self.online[g as usize].as_ref().map_or(0, |s| s.mem_mib);
        let mut mem = job.mem_mib + svc_mib;
        for &k in on {
            let other = &self.sc.jobs[k as usize];
            if self.sc.pairs.pair(job.job_type, other.job_type).is_none() {
                return false;
            }
            mem += other.mem_mib;
        }
        mem <= self.sc.gpus[g as usize].mem_mib
    }

    /// What a new offline job gets on GPU `g` now, by the production
    /// policy, from what the node published: the GPU's offline SM budget
    /// (percent), and the part of it and of the memory cap that `slots` of
    /// its K slots give ([`offline_part`]).
    fn policy_for(&self, g: u32, slots: u32) -> (u8, u8, Option<u64>) {
        let (budget, cap) = self.budget_for(g);
        let n = u32::from(self.kind.offline_per_gpu());
        (
            budget,
            offline_part(u64::from(budget), slots, n) as u8,
            cap.map(|c| offline_part(c, slots, n)),
        )
    }

    /// The GPU's offline SM budget and memory cap (all its offline jobs
    /// together).
    fn budget_for(&self, g: u32) -> (u8, Option<u64>) {
        let p = &self.state.gpus[self.state_index[g as usize]].published;
        let mut facts = GpuFacts {
            online_solo_sm_pct: p.solo_sm_pct,
            online_mem_mib: p.online_mem_mib,
            mem_total_mib: Some(p.mem_mib),
        };
        if self.online[g as usize].is_none() {
            // What the plugin gives on a GPU with no online job.
            facts = facts.without_online();
        }
        (
            offline_sm_percent(&self.cfg.policy, facts.online_solo_sm_pct),
            offline_mem_cap_mib(&self.cfg.policy, &facts),
        )
    }

    /// The normalized speed job `j` would really get on GPU `g` (0 when it
    /// cannot run there).
    fn true_speed(&self, j: u32, g: u32, slots: u32) -> f64 {
        Truth { sim: self }.speed(j, g, slots).unwrap_or(0.0)
    }

    /// The true speed of job `j` on GPUs `gs` together: its slowest's.
    fn true_speed_on(&self, j: u32, gs: &[u32], slots: &[u32]) -> f64 {
        gs.iter()
            .zip(slots)
            .map(|(&g, &s)| self.true_speed(j, g, s))
            .fold(f64::INFINITY, f64::min)
    }

    fn round(&mut self) {
        if self.pending_unsorted {
            self.state.pending.sort_by_key(|p| p.id);
            self.pending_unsorted = false;
        }
        let queued = &self.queue;
        let in_state = &mut self.in_state;
        self.state.pending.retain(|p| {
            let keep = queued.contains(&(p.id - 1));
            if !keep {
                in_state[(p.id - 1) as usize] = false;
            }
            keep
        });
        if self.state.pending.is_empty()
            || self
                .state
                .open_gpus(u32::from(self.kind.offline_per_gpu()))
                .next()
                .is_none()
        {
            return;
        }
        // The daemon retrains every round on its whole history; here the
        // model is retrained when the history grew by a tenth (it moves
        // little in between), which keeps a week's replay fast.
        let n = self.runs.len();
        let retrain = self.learn
            && n > self.trained_on_runs
            && (n - self.trained_on_runs) * 10 >= self.trained_on_runs.max(10);
        // The learned model's round and the oracle's (the true values, for
        // `pairing_vs_oracle`) read the same state: side by side, one core
        // each. The oracle's weights change only with the state and the
        // jobs running on each GPU (its key): one epoch. The oracle reads
        // no model, so a retraining runs beside its round, not before it.
        let mut chosen_cache = std::mem::take(&mut self.round_cache);
        let mut oracle_cache = std::mem::take(&mut self.oracle_cache);
        let (no_failed, no_needs) = (Failures::default(), BTreeMap::new());
        let this = &*self;
        let (chosen, oracle, chosen_s, trained) = std::thread::scope(|s| {
            let oracle = s.spawn(|| {
                plan_cached(
                    &this.state,
                    &Truth { sim: this },
                    &this.cfg.policy,
                    &this.matcher,
                    &this.names,
                    &mut oracle_cache,
                    0,
                )
            });
            let trained = retrain.then(|| Model::train(&this.runs));
            // What the daemon's next round knows: a new model has learned
            // the failures since the last one.
            let learned = match &trained {
                Some(model) => LearnedNow {
                    model,
                    failed: &no_failed,
                    needs_above: &no_needs,
                },
                None => LearnedNow {
                    model: &this.model,
                    failed: &this.failed_since_training,
                    needs_above: &this.needs_above_since_training,
                },
            };
            let started = Instant::now();
            let chosen = plan_cached(
                &this.state,
                &learned,
                &this.cfg.policy,
                &this.matcher,
                &this.names,
                &mut chosen_cache,
                this.epoch + u64::from(retrain),
            );
            let chosen_s = started.elapsed().as_secs_f64();
            let oracle = oracle.join().expect("the oracle's round");
            (chosen, oracle, chosen_s, trained)
        });
        self.round_cache = chosen_cache;
        self.oracle_cache = oracle_cache;
        if let Some(model) = trained {
            self.model = model;
            self.trained_on_runs = n;
            self.failed_since_training.clear();
            self.needs_above_since_training.clear();
            self.epoch += 1;
        }
        if self.timing {
            self.round_s += chosen_s;
        }
        self.rounds += 1;
        for d in oracle
            .decisions
            .iter()
            .filter(|d| d.action == Action::Place)
        {
            if let Some(gs) = self.gpus_of(d) {
                // Every placement, idle GPUs' too: the two rounds may put
                // different numbers of jobs beside online jobs, and a
                // ratio over the shared ones alone could pass 1.
                self.pair_oracle += gs.len() as f64 * self.true_speed_on(d.job - 1, &gs, &d.slots);
            }
        }
        for d in chosen
            .decisions
            .iter()
            .filter(|d| d.action == Action::Place)
        {
            let Some(gs) = self.gpus_of(d) else {
                continue;
            };
            let j = d.job - 1;
            let idle = gs.iter().any(|&g| self.online[g as usize].is_none());
            // A gang is worth k × its slowest GPU's speed, as in the round.
            let truth = self.true_speed_on(j, &gs, &d.slots);
            self.pair_true += gs.len() as f64 * truth;
            // The predictor's error counts the pairs only: on an idle GPU
            // the round predicts the solo speed, 1 by definition.
            if !idle {
                self.pred_err += (d.predicted.unwrap_or(0.0) - truth).abs();
                self.pred_n += 1;
            }
            if d.update.is_none() {
                continue; // deferred by max_updates_per_round
            }
            if !gs.iter().all(|&g| self.allowed(j, g)) {
                self.refused += 1;
                continue;
            }
            let job = &self.sc.jobs[j as usize];
            let mut seats = Vec::with_capacity(gs.len());
            let mut fails = false;
            for (&g, &slots) in gs.iter().zip(&d.slots) {
                let (budget_pct, sm_pct, cap) = self.policy_for(g, slots);
                let pair = self.fits_beside(j, g);
                let over_cap = cap.is_some_and(|c| job.mem_mib > c) || !self.fits_offline(j, g);
                let starts = if self.online[g as usize].is_none() {
                    !over_cap && job.mem_mib <= self.sc.gpus[g as usize].mem_mib
                } else {
                    pair.is_some() && !over_cap
                };
                fails |= !starts;
                // A pair that cannot share the GPU: what the next model
                // learns from the failed run's record (predict::estimate's
                // infeasible pairs). Beside other offline jobs the daemon
                // first reads it as a need above the slot's cap and learns
                // the pair at the next failure, alone beside the service:
                // here it is learned at once (at most one failure fewer per
                // name and service than the daemon's).
                let name = &self.sc.tasks[job.task as usize].name;
                if let (false, Some(svc)) = (starts, self.online[g as usize].as_ref()) {
                    if pair.is_none() {
                        self.failed_since_training.insert(name, svc.job_id);
                    }
                }
                // Over its cap: a need above it.
                if let (false, true, Some(c)) = (starts, over_cap, cap) {
                    let need = self
                        .needs_above_since_training
                        .entry(name.clone())
                        .or_default();
                    *need = (*need).max(c);
                }
                seats.push(JobSeat {
                    sm_pct,
                    budget_pct,
                    mem_cap_mib: cap,
                    slots,
                    partner: self.online[g as usize],
                    ..JobSeat::on(g, pair)
                });
            }
            let rt = &mut self.jobs[j as usize];
            // Slurm 22.05 keeps the typed slots: later placements only on
            // these GPU indices.
            rt.slot_gpus = d.gpus.clone();
            if !fails {
                self.start(j, seats);
            } else {
                // Its allocations hit the memory cap at once on one of its
                // GPUs: the whole job exits, its report says so, and it
                // waits again.
                self.oom += 1;
                rt.run_start_s = self.now;
                rt.run_remaining_s = rt.remaining_s;
                rt.peers.clear();
                self.report(j, &seats, true);
                let k = self
                    .state
                    .pending
                    .binary_search_by_key(&d.job, |p| p.id)
                    .expect("a pending job");
                self.state.pending[k].slot_gpus = d.gpus.clone();
            }
        }
    }

    /// The scenario's GPUs a placing decision names.
    fn gpus_of(&self, d: &muxflow_matcher::round::Decision) -> Option<Vec<u32>> {
        let node = d.node.as_ref()?;
        let gs: Vec<u32> = d
            .gpus
            .iter()
            .map(|&i| self.gpu_of(node, i).expect("a GPU of the scenario"))
            .collect();
        (!gs.is_empty()).then_some(gs)
    }

    fn outcome(mut self) -> Outcome {
        let end = self.sc.end_s;
        for i in 0..self.online_ids.len() {
            let g = self.online_ids[i] as usize;
            let rt = &self.gpus[g];
            if rt.rates.latency > 0.0 {
                self.latency_hist[latency_bin(rt.rates.latency)] += end - rt.latency_since;
            }
        }
        let n = self.sc.gpus.len().max(1) as f64;
        let n_on = self.online_ids.len().max(1) as f64;
        let t = end.max(1e-9);
        let a = self.acc;
        // Per online GPU-second: a whole replay's worth of each online GPU
        // when services hold their GPUs, the GPU-seconds replicas held
        // them when they scale.
        let scaled = self.scaling.is_some();
        let per_online = |v: f64| {
            if scaled {
                v / a.online.max(1e-9)
            } else {
                v / t / n_on
            }
        };
        self.jct.sort_by(f64::total_cmp);
        let mux = self.kind.is_muxflow();
        Outcome {
            policy: self.kind,
            gpu_util: a.util / t / n,
            sm_activity: a.sm / t / n,
            mem_util: a.mem / t / n,
            online_gpu_util: per_online(a.util_online),
            online_gpu_sm_activity: per_online(a.sm_online),
            online_latency_p50: hist_quantile(&self.latency_hist, 0.5),
            online_latency_p99: hist_quantile(&self.latency_hist, 0.99),
            jct_s: self.jct,
            queue_s: self.queue_s,
            offline_gpu_hours: a.work / 3600.0,
            offline_arrived: self.next_arrival as u64,
            offline_finished: self.finished,
            offline_running_end: self.sums.running as u64,
            offline_waiting_end: self.queue.len() as u64,
            lent_gpu_hours: a.lent / 3600.0,
            capacity_gpu_hours: n * end / 3600.0,
            busy_gpu_hours: a.util / 3600.0,
            rounds: mux.then_some(self.rounds),
            round_total_s: (mux && self.timing).then_some(self.round_s),
            predictor_mae: (mux && self.pred_n > 0).then(|| self.pred_err / self.pred_n as f64),
            pairing_vs_oracle: (mux && self.pair_oracle > 0.0)
                .then(|| self.pair_true / self.pair_oracle),
            oom_starts: mux.then_some(self.oom),
            peer_runs: mux.then_some(self.peer_runs),
            refused_placements: mux.then_some(self.refused),
            health_violations: self.health_violations,
            offline_short_of_gpus: self.jobs.iter().filter(|j| j.short).count() as u64,
            gang_arrived: self.sc.jobs[..self.next_arrival]
                .iter()
                .filter(|j| j.gpus > 1)
                .count() as u64,
            gang_finished: self.gang_finished,
            gang_gpu_hours: a.gang_work / 3600.0,
            timeline: self.timeline,
            latency_hist: self.latency_hist,
            churn: self.scaling.map(|s| Churn {
                online_gpu_hours: a.online / 3600.0,
                ..s.churn
            }),
        }
    }
}

/// The daemon's `[matcher]` for rounds every `interval_s`: its bound on
/// Slurm updates is per round, at `interval_s` of its own; the replay keeps
/// the same bound per hour. Rounds price out to the optimum over every
/// (job, GPU) pair, as the daemon's do within `matcher.pricing_budget_ms`,
/// here with a budget never reached (600 s), so that the result does not
/// depend on the machine; the daemon's round cache makes that affordable
/// (incremental rounds, [`muxflow_matcher::round_cache`]).
/// `candidates_only` (`--candidates-only`): `pricing_budget_ms = 0`, rounds
/// exact on their candidate graphs, every one cold (the replay before
/// issue 30).
pub fn scaled_matcher(
    m: &muxflow::config::Matcher,
    interval_s: f64,
    candidates_only: bool,
) -> muxflow::config::Matcher {
    let per_s = m.max_updates_per_round as f64 / m.interval_s.max(1) as f64;
    muxflow::config::Matcher {
        max_updates_per_round: ((per_s * interval_s).round() as usize).max(1),
        pricing_budget_ms: if candidates_only { 0 } else { 600_000 },
        ..m.clone()
    }
}

fn latency_bin(factor: f64) -> usize {
    (((factor - 1.0) / LATENCY_BIN).round().max(0.0) as usize).min(LATENCY_BINS - 1)
}

/// The time-weighted quantile of the latency histogram (1.0 when empty).
fn hist_quantile(hist: &[f64], q: f64) -> f64 {
    let total: f64 = hist.iter().sum();
    if total <= 0.0 {
        return 1.0;
    }
    let mut acc = 0.0;
    for (i, w) in hist.iter().enumerate() {
        acc += w;
        if acc >= q * total {
            return 1.0 + i as f64 * LATENCY_BIN;
        }
    }
    1.0 + (hist.len() - 1) as f64 * LATENCY_BIN
}

/// (job name, online partner) pairs that failed at start: the daemon's
/// model keys a job by (user, name), and every replayed job's user is the
/// same. Kept by name, and the partners alone, for the round's lookups per
/// job and per GPU (a scan of every pair each time cost more than the
/// round's scoring in busy hours).
#[derive(Debug, Default)]
struct Failures {
    by_name: BTreeMap<String, BTreeSet<u32>>,
    partners: BTreeSet<u32>,
}

impl Failures {
    fn insert(&mut self, name: &str, partner: u32) {
        match self.by_name.get_mut(name) {
            Some(p) => {
                p.insert(partner);
            }
            None => {
                self.by_name
                    .insert(name.to_owned(), BTreeSet::from([partner]));
            }
        }
        self.partners.insert(partner);
    }

    fn clear(&mut self) {
        self.by_name.clear();
        self.partners.clear();
    }

    /// The partners job `name` failed beside, ascending.
    fn partners_of(&self, name: &str) -> impl Iterator<Item = u32> + '_ {
        self.by_name.get(name).into_iter().flatten().copied()
    }
}

/// The production model, less the pairs that failed at start since it was
/// trained ([`Sim::failed_since_training`]): what the daemon's next round
/// would know.
struct LearnedNow<'a> {
    model: &'a Model,
    failed: &'a Failures,
    /// Job name -> a cap it failed under.
    needs_above: &'a BTreeMap<String, u64>,
}

impl LearnedNow<'_> {
    fn failed_beside(&self, job: &(JobTerms, Vec<u32>), gpu: &(GpuTerms, Option<u32>)) -> bool {
        gpu.1.is_some_and(|p| job.1.contains(&p))
    }
}

impl Predictor for LearnedNow<'_> {
    /// The model's terms and the partners the job failed beside.
    type Job = (JobTerms, Vec<u32>);
    type Gpu = (GpuTerms, Option<u32>);
    fn job_terms(&self, job: &PendingJob) -> Self::Job {
        let failed_beside = self.failed.partners_of(&job.name).collect();
        let mut terms = Predictor::job_terms(self.model, job);
        if let Some(&cap) = self.needs_above.get(&job.name) {
            terms.peak_mib = Some(terms.peak_mib.unwrap_or(0).max(cap.saturating_add(1)));
        }
        (terms, failed_beside)
    }
    fn gpu_terms(&self, gpu: &GpuState, policy: &Policy, seat: Seat) -> Self::Gpu {
        (
            Predictor::gpu_terms(self.model, gpu, policy, seat),
            gpu.online_jobs.first().copied(),
        )
    }
    fn predict(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<f64> {
        if self.failed_beside(job, gpu) {
            return None;
        }
        Predictor::predict(self.model, &job.0, &gpu.0)
    }
    fn estimate(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<(f64, f64)> {
        if self.failed_beside(job, gpu) {
            return None;
        }
        Predictor::estimate(self.model, &job.0, &gpu.0)
    }
    fn solo(&self, job: &Self::Job, gpu: &GpuState, slot: &IdleSlot) -> Option<(f64, f64)> {
        Predictor::solo(self.model, &job.0, gpu, slot)
    }
    /// The model's key, and the online job where some job failed beside it.
    fn column_key(
        &self,
        at: usize,
        gpu: &GpuState,
        terms: Option<&Self::Gpu>,
        key: &mut Vec<u64>,
    ) -> bool {
        let Some((terms, online)) = terms else {
            return Predictor::column_key(self.model, at, gpu, None, key);
        };
        let failed_here = online.filter(|o| self.failed.partners.contains(o));
        key.push(failed_here.map_or(u64::MAX, u64::from));
        Predictor::column_key(self.model, at, gpu, Some(terms), key)
    }
    /// What was learned of its name since training: the partners it
    /// failed beside and the cap it failed under.
    fn job_key(&self, job: &PendingJob) -> u64 {
        let fnv = |h: u64, v: u64| (h ^ v).wrapping_mul(0x0100_0000_01b3);
        let h = (self.failed.partners_of(&job.name))
            .fold(0xcbf2_9ce4_8422_2325, |h, p| fnv(h, u64::from(p)));
        fnv(h, self.needs_above.get(&job.name).map_or(u64::MAX, |&c| c))
    }
}

/// The matcher given the true values: what each pair would really run at.
struct Truth<'s, 'a> {
    sim: &'s Sim<'a>,
}

impl Truth<'_, '_> {
    fn speed(&self, j: u32, g: u32, slots: u32) -> Option<f64> {
        let sim = self.sim;
        if !sim.allowed(j, g) || !sim.fits_offline(j, g) {
            return None;
        }
        let (budget_pct, sm_pct, cap) = sim.policy_for(g, slots);
        let job = &sim.sc.jobs[j as usize];
        let pair = if sim.online[g as usize].is_none() {
            let fits = job.mem_mib <= sim.sc.gpus[g as usize].mem_mib
                && cap.is_none_or(|c| job.mem_mib <= c);
            if !fits {
                return None;
            }
            None
        } else {
            let pair = sim.fits_beside(j, g)?;
            if cap.is_some_and(|c| job.mem_mib > c) {
                return None;
            }
            Some(pair)
        };
        let new = SlotJob {
            with_online: pair,
            share: f64::from(sm_pct) / 100.0,
            budget: f64::from(budget_pct) / 100.0,
            demand: OFFLINE_SM * job.share,
        };
        Some(sim.speed_beside(g, new, job.job_type))
    }
}

impl Sim<'_> {
    /// The model's speed of a new job (`new`, of type `job_type`) joining
    /// GPU `g`'s offline jobs ([`model::muxflow_slots`]).
    fn speed_beside(&self, g: u32, new: SlotJob, job_type: u16) -> f64 {
        let on = &self.gpus[g as usize].offline;
        if on.is_empty() && new.share >= new.budget {
            return model::muxflow_slots(&[new], |_, _| 1.0, false, self.protection[g as usize]).0
                [0];
        }
        let partners = on.iter().map(|&k| {
            let t = self.sc.jobs[k as usize].job_type;
            self.sc.pairs.speed(job_type, t).unwrap_or(0.0)
        });
        model::slot_speed(&new, partners, self.protection[g as usize])
    }
}

/// Per-job terms of the oracle: type, SM demand, memory, allowed models,
/// and its mean pair throughput (what it keeps beside a partner not
/// known yet, [`crate::input::Pairs::mean_speed`]: once per job, not per
/// pair).
#[derive(Clone, Copy)]
struct TruthJob<'a> {
    mean_speed: f64,
    job_type: u16,
    demand: f64,
    mem_mib: u64,
    models: Option<&'a [u16]>,
}

/// Per-slot terms of the oracle: what the policy gives there, its side,
/// and the offline jobs already there (`muxflow-nK`).
#[derive(Clone, Copy)]
struct TruthGpu {
    g: u32,
    online_type: u16,
    room_mib: u64,
    share: f64,
    budget: f64,
    cap_mib: Option<u64>,
    model: u16,
    /// Offline jobs of this round beside it that are not running yet
    /// (a split GPU): each leaves it its type's mean pair throughput.
    unknown: i32,
}

impl<'s, 'a> Predictor for Truth<'s, 'a> {
    type Job = TruthJob<'a>;
    type Gpu = TruthGpu;
    fn job_terms(&self, job: &PendingJob) -> TruthJob<'a> {
        let sc: &'a Scenario = self.sim.sc;
        let j = &sc.jobs[(job.id - 1) as usize];
        TruthJob {
            mean_speed: sc.pairs.mean_speed(j.job_type),
            job_type: j.job_type,
            demand: OFFLINE_SM * j.share,
            mem_mib: j.mem_mib,
            models: j.models.as_deref(),
        }
    }
    fn gpu_terms(&self, gpu: &GpuState, _policy: &Policy, seat: Seat) -> TruthGpu {
        let sim = self.sim;
        // The seat's part; the running jobs there are read from the replay.
        let n = u32::from(sim.kind.offline_per_gpu());
        let g = sim
            .gpu_of(&gpu.node, gpu.index)
            .expect("a GPU of the scenario");
        let svc = sim.online[g as usize]
            .as_ref()
            .expect("an online GPU: the round asks solo() of idle ones");
        let (budget_pct, cap_mib) = sim.budget_for(g);
        let others_mib: u64 = sim.gpus[g as usize]
            .offline
            .iter()
            .map(|&k| sim.sc.jobs[k as usize].mem_mib)
            .sum();
        TruthGpu {
            g,
            online_type: svc.job_type,
            room_mib: sim.sc.gpus[g as usize]
                .mem_mib
                .saturating_sub(svc.mem_mib + others_mib),
            share: offline_part(u64::from(budget_pct), seat.slots, n) as f64 / 100.0,
            budget: f64::from(budget_pct) / 100.0,
            cap_mib: cap_mib.map(|c| offline_part(c, seat.slots, n)),
            model: sim.sc.gpus[g as usize].model,
            unknown: unknown_partners(seat.offline_jobs, sim.gpus[g as usize].offline.len()),
        }
    }
    /// The same rules as [`Truth::speed`], from precomputed terms.
    #[inline]
    fn predict(&self, job: &TruthJob, gpu: &TruthGpu) -> Option<f64> {
        if job.models.is_some_and(|m| !m.contains(&gpu.model))
            || job.mem_mib > gpu.room_mib
            || gpu.cap_mib.is_some_and(|c| job.mem_mib > c)
        {
            return None;
        }
        let pair = self.sim.sc.pairs.pair(job.job_type, gpu.online_type)?;
        let unknown = job.mean_speed.powi(gpu.unknown);
        if self.sim.gpus[gpu.g as usize].offline.is_empty() && gpu.share >= gpu.budget {
            let p = self.sim.protection[gpu.g as usize];
            return Some(model::muxflow(pair.0, pair.1, gpu.share, job.demand, p).0 * unknown);
        }
        let on = &self.sim.gpus[gpu.g as usize].offline;
        if on.iter().any(|&k| {
            let t = self.sim.sc.jobs[k as usize].job_type;
            self.sim.sc.pairs.pair(job.job_type, t).is_none()
        }) {
            return None;
        }
        let new = SlotJob {
            with_online: Some(pair),
            share: gpu.share,
            budget: gpu.budget,
            demand: job.demand,
        };
        Some(self.sim.speed_beside(gpu.g, new, job.job_type) * unknown)
    }
    /// What `predict` and `solo` read beside the terms: the GPU's
    /// protection and the offline jobs there (their types; on an idle GPU
    /// their memory, and the GPU's model, memory and budget too).
    /// The state's GPUs are the scenario's, in order ([`Truth::gpu_key`]).
    fn column_key(
        &self,
        at: usize,
        _gpu: &GpuState,
        terms: Option<&TruthGpu>,
        key: &mut Vec<u64>,
    ) -> bool {
        let sim = self.sim;
        let g = at as u32;
        let on = &sim.gpus[g as usize].offline;
        let p = sim.protection[g as usize];
        key.extend([
            p.latency_excess_left.to_bits(),
            p.offline_speed.to_bits(),
            on.len() as u64,
        ]);
        key.extend(
            on.iter()
                .map(|&k| u64::from(sim.sc.jobs[k as usize].job_type)),
        );
        match terms {
            Some(t) => key.extend([
                u64::from(t.online_type),
                t.room_mib,
                t.share.to_bits(),
                t.budget.to_bits(),
                u64::from(t.cap_mib.is_some()),
                t.cap_mib.unwrap_or(0),
                u64::from(t.model),
                t.unknown as u64,
            ]),
            None => key.extend([
                u64::from(sim.sc.gpus[g as usize].model),
                sim.sc.gpus[g as usize].mem_mib,
                on.iter().map(|&k| sim.sc.jobs[k as usize].mem_mib).sum(),
                u64::from(sim.budget_for(g).0),
            ]),
        }
        true
    }
    /// The offline jobs running there (the state's GPUs are the
    /// scenario's, in order).
    fn gpu_key(&self, at: usize, _gpu: &GpuState) -> u64 {
        self.sim.gpus[at]
            .offline
            .iter()
            .fold(0xcbf2_9ce4_8422_2325, |h, &j| {
                (h ^ u64::from(j)).wrapping_mul(0x0100_0000_01b3)
            })
    }
    /// The same rules as [`Truth::speed`] on an idle GPU.
    fn solo(&self, job: &TruthJob, gpu: &GpuState, slot: &IdleSlot) -> Option<(f64, f64)> {
        let sim = self.sim;
        let g = sim
            .gpu_of(&gpu.node, gpu.index)
            .expect("a GPU of the scenario");
        let model = sim.sc.gpus[g as usize].model;
        let on = &sim.gpus[g as usize].offline;
        let others_mib: u64 = on.iter().map(|&k| sim.sc.jobs[k as usize].mem_mib).sum();
        let fits = job.models.is_none_or(|m| m.contains(&model))
            && job.mem_mib <= slot.room_mib
            && job.mem_mib + others_mib <= sim.sc.gpus[g as usize].mem_mib
            && on.iter().all(|&k| {
                let t = sim.sc.jobs[k as usize].job_type;
                sim.sc.pairs.pair(job.job_type, t).is_some()
            });
        if !fits {
            return None;
        }
        let (budget_pct, _) = sim.budget_for(g);
        let unknown = job
            .mean_speed
            .powi(unknown_partners(slot.offline_jobs, on.len()));
        if on.is_empty() && slot.share >= slot.budget {
            return Some((unknown, 0.0));
        }
        let new = SlotJob {
            with_online: None,
            share: slot.share,
            budget: f64::from(budget_pct) / 100.0,
            demand: job.demand,
        };
        Some((sim.speed_beside(g, new, job.job_type) * unknown, 0.0))
    }
}

/// Of `offline_jobs` in a seat (it included), those not running yet.
fn unknown_partners(offline_jobs: u32, running: usize) -> i32 {
    (offline_jobs.saturating_sub(1) as i32 - running as i32).max(0)
}
