//! One policy's replay of a [`Scenario`]: an event loop over arrivals,
//! finishes, matcher rounds, health checks and hourly load steps. Between
//! two events every GPU's rates are constant, so progress and the time
//! integrals of the counters advance piecewise-linearly.
//!
//! Under `muxflow` the decisions are the production code's:
//! [`muxflow_matcher::round::plan`] on a [`ClusterState`] the replay keeps
//! up to date, [`Model`] trained on runs parsed back from the AdminComment
//! text ([`muxflow::records::report::JobReport`]) that finished jobs leave,
//! [`muxflow::policy::share::offline_sm_percent`] and
//! [`muxflow::policy::share::offline_mem_cap_mib`] at each start, and
//! [`Fsm::step`] at every health
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
//!
//! The replay by concern, each an `impl Sim` of its own file: this module
//! holds [`Sim`]'s state and the event loop ([`run`]); [`speeds`] the
//! model's speeds and rates per GPU; [`placement`] where jobs start and
//! stop; [`rounds`] the matcher's rounds (and the records the predictor
//! learns from), with the oracle's true values in [`oracle`]; [`health`]
//! the health checks; [`autoscale`] services that come and go; and
//! [`outcome`] the integrals and the figures a policy produces.

mod autoscale;
mod health;
mod oracle;
mod outcome;
mod placement;
mod policy;
mod rounds;
mod speeds;
mod waiting;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use muxflow::config::Policy;
use muxflow::policy::health::{Fsm, Solo};
use muxflow_matcher::reader::{ClusterState, Names};

use crate::engine::EventQueue;
use crate::model::{self, GpuRates};
use crate::scenario::{Checkpointing, PairLoad, Scenario, Service};

pub use autoscale::Churn;
pub use outcome::{quantile, round, Fixed, HourRow, Outcome};
pub use policy::PolicyKind;
pub use rounds::scaled_matcher;
pub use waiting::WhileWaiting;

use autoscale::Scaling;
use outcome::Tally;
use rounds::Learning;

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
    /// When its last offline job left (0: never held one).
    open_since_s: f64,
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
    /// Its first GPU's online load as the pair's slowdown follows it
    /// (0 beside no service) since `last_s`, its integral over this run
    /// until then and its largest: the node's figures of the partner's
    /// utilization in the record ([`Sim::report`]).
    partner_load: f64,
    partner_load_s: f64,
    partner_load_max: f64,
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
    /// `muxflow`: the oracle's round (the true values, only for
    /// `pairing_vs_oracle`) beside every this many learned rounds, and the
    /// ratio over those rounds (0 or 1: every round). It costs as much as
    /// the learned round, and decides nothing.
    pub oracle_every: u32,
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
    pair_load: PairLoad,
    idle_free: BTreeSet<u32>,
    slot_free: BTreeSet<u32>,
    queue: BTreeSet<u32>,
    next_arrival: usize,
    /// What the replay counts toward its outcome.
    tally: Tally,
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
    /// What the matcher has learned, and its round caches.
    learning: Learning,
    /// Measure the rounds' wall time.
    timing: bool,
    /// [`RunOptions::oracle_every`], at least 1.
    oracle_every: u32,
    /// xCUDA's protection on each GPU (muxflow policies).
    protection: Vec<model::Protection>,
    /// Simulated seconds replayed, for the progress bar.
    progress: &'a AtomicU64,
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
                if (sim.tally.timeline.len() as u32) < hours {
                    sim.hour(hours);
                }
                break;
            }
            Ev::Hour(h) => sim.hour(h),
            Ev::Arrival => sim.arrival(),
            Ev::Finish { job, version } => sim.finish(job, version),
            Ev::Round => {
                sim.waited_for_round();
                sim.round();
                sim.sample_waiting(settings.round_interval_s.min(sc.end_s - t));
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
            pair_load: settings.pair_load,
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
            tally: Tally::default(),
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
            learning: Learning::new(!opts.default_predictor),
            timing: opts.timing,
            oracle_every: opts.oracle_every.max(1),
            protection: {
                let by_model = crate::protection::per_model(&opts.protection, &sc.models)
                    .expect("sim/data/protection.toml has every mode (sim's tests read it)");
                sc.gpus.iter().map(|g| by_model[g.model as usize]).collect()
            },
            progress,
        };
        if kind.is_muxflow() {
            sim.enter_gpus();
        }
        sim.tally.sums.online = sim.online_ids.len();
        let all: Vec<u32> = (0..n as u32).collect();
        sim.refresh(&all);
        sim
    }

    /// The hourly step at hour `h`: the last hour's timeline row, then the
    /// load of the next (services scale to it under `--autoscale`).
    fn hour(&mut self, h: u32) {
        if h > 0 {
            self.record_hour(h - 1);
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
}
