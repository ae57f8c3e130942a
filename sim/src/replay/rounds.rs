//! The matcher's rounds under `muxflow`: the production round
//! ([`plan_cached`]) with the learned model beside the oracle's round on
//! the true values, its placements started (or failed at once for memory,
//! and learned), and the AdminComment records the predictor learns from.

use std::sync::Arc;
use std::time::Instant;

use muxflow::policy::health::{Fsm, HealthState};
use muxflow::records::published::GpuPublished;
use muxflow::records::report::{add_peers, GangGpu, JobReport};
use muxflow::Mode;
use muxflow_matcher::failed::{FailedPlacements, Remembering, Start};
use muxflow_matcher::predict::{runs_from_sacct, JobKey, Model, Run};
use muxflow_matcher::reader::{GpuState, SacctComment, SacctJob, SacctTime};
use muxflow_matcher::round::{plan_cached, Action, Decision, Plan};
use muxflow_matcher::round_cache::RoundCache;

use super::oracle::Truth;
use super::{JobSeat, Sim};
use crate::scenario::PairLoad;

/// xCUDA launches per training step of the replay's offline jobs (any
/// constant: a job's speed is only compared with its own).
const LAUNCHES_PER_STEP: f64 = 40.0;

impl Sim<'_> {
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

    /// A matcher round: the pending jobs brought up to date, the learned
    /// model's round planned (and the oracle's, on a sampled round), its
    /// placements scored and started.
    pub(super) fn round(&mut self) {
        if !self.prune_pending() {
            return;
        }
        let sampled = self
            .tally
            .rounds
            .is_multiple_of(u64::from(self.oracle_every));
        let (chosen, oracle) = self.plan_rounds(sampled);
        self.tally.rounds += 1;
        for d in oracle
            .iter()
            .flat_map(|p| &p.decisions)
            .filter(|d| d.action == Action::Place)
        {
            if let Some(gs) = self.gpus_of(d) {
                // Every placement, idle GPUs' too: the two rounds may put
                // different numbers of jobs beside online jobs, and a
                // ratio over the shared ones alone could pass 1.
                self.tally.pair_oracle +=
                    gs.len() as f64 * self.true_speed_on(d.job - 1, &gs, &d.slots);
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
            self.score(d, &gs, sampled);
            if d.update.is_none() {
                continue; // deferred by max_updates_per_round
            }
            self.place(d, &gs);
        }
    }

    /// Sorts the round's pending jobs and drops those no longer waiting;
    /// false when the round has nothing to do (no job waits, or no GPU
    /// has an open slot).
    fn prune_pending(&mut self) -> bool {
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
        !self.state.pending.is_empty()
            && self
                .state
                .open_gpus(u32::from(self.kind.offline_per_gpu()))
                .next()
                .is_some()
    }

    /// The learned model's round and, when `sampled`, the oracle's (the
    /// true values, for `pairing_vs_oracle`) on the same state, side by
    /// side, one core each; a retrained model, when one is due, replaces
    /// the current one.
    fn plan_rounds(&mut self, sampled: bool) -> (Arc<Plan>, Option<Arc<Plan>>) {
        let n = self.learning.runs.len();
        let retrain = self.learning.retrain_due();
        // The oracle's weights change only with the state and the jobs
        // running on each GPU (its key): one epoch. The oracle reads no
        // model, so a retraining runs beside its round, not before it.
        let mut chosen_cache = std::mem::take(&mut self.learning.round_cache);
        let mut oracle_cache = std::mem::take(&mut self.learning.oracle_cache);
        let this = &*self;
        let (chosen, oracle, chosen_s, trained) = std::thread::scope(|s| {
            // Only on a sampled round: no thread for the others.
            let oracle = sampled.then(|| {
                s.spawn(|| {
                    plan_cached(
                        &this.state,
                        &Truth { sim: this },
                        &this.cfg.policy,
                        &this.matcher,
                        &this.names,
                        &mut oracle_cache,
                        0,
                    )
                })
            });
            let trained = retrain.then(|| Model::train(&this.learning.runs));
            // What the daemon's next round knows: the model of its history
            // and what the failed placements in it teach.
            let learned = Remembering {
                model: trained.as_ref().unwrap_or(&this.learning.model),
                failed: &this.learning.failed,
            };
            let started = Instant::now();
            let chosen = plan_cached(
                &this.state,
                &learned,
                &this.cfg.policy,
                &this.matcher,
                &this.names,
                &mut chosen_cache,
                this.learning.epoch + u64::from(retrain),
            );
            let chosen_s = started.elapsed().as_secs_f64();
            let oracle = oracle.map(|o| o.join().expect("the oracle's round"));
            (chosen, oracle, chosen_s, trained)
        });
        self.learning.round_cache = chosen_cache;
        self.learning.oracle_cache = oracle_cache;
        if let Some(model) = trained {
            self.learning.trained(model, n);
        }
        if self.timing {
            self.tally.round_s += chosen_s;
        }
        (chosen, oracle)
    }

    /// Scores the learned round's placement `d` on GPUs `gs` against the
    /// truth: the predictor's error, and on a round the oracle planned too
    /// (`sampled`), its part of `pairing_vs_oracle`.
    fn score(&mut self, d: &Decision, gs: &[u32], sampled: bool) {
        let j = d.job - 1;
        let idle = gs.iter().any(|&g| self.online[g as usize].is_none());
        // A gang is worth k × its slowest GPU's speed, as in the round.
        let truth = self.true_speed_on(j, gs, &d.slots);
        if sampled {
            self.tally.pair_true += gs.len() as f64 * truth;
        }
        // The predictor's error counts the pairs only: on an idle GPU
        // the round predicts the solo speed, 1 by definition. It predicts
        // a pair at its partner's full load (`x`, matcher/src/predict), so
        // it is scored against the truth there, not at the hour's load.
        if !idle {
            let now = std::mem::replace(&mut self.pair_load, PairLoad::Peak);
            let at_peak = self.true_speed_on(j, gs, &d.slots);
            self.pair_load = now;
            self.tally.pred_err += (d.predicted.unwrap_or(0.0) - at_peak).abs();
            self.tally.pred_n += 1;
        }
    }

    /// Carries out placement `d` on GPUs `gs`: refused where Slurm would
    /// refuse it, started where every GPU takes the job, else failed at
    /// once for memory (the whole job exits, its report says so, it waits
    /// again, and the failure is learned).
    fn place(&mut self, d: &Decision, gs: &[u32]) {
        let j = d.job - 1;
        if !gs.iter().all(|&g| self.allowed(j, g)) {
            self.tally.refused += 1;
            return;
        }
        let mut fails = false;
        let seats: Vec<JobSeat> = gs
            .iter()
            .zip(&d.slots)
            .map(|(&g, &slots)| {
                let (seat, starts) = self.seat_for(j, g, slots);
                fails |= !starts;
                seat
            })
            .collect();
        let rt = &mut self.jobs[j as usize];
        // Slurm 22.05 keeps the typed slots: later placements only on
        // these GPU indices.
        rt.slot_gpus = d.gpus.clone();
        if !fails {
            self.start(j, seats);
            return;
        }
        // Its allocations hit the memory cap at once on one of its GPUs.
        self.tally.oom += 1;
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

    /// Job `j`'s seat on GPU `g` with `slots` of its slots, by the
    /// production policy, and whether it starts there (false: it fails at
    /// once for memory, and what the next model would learn from that
    /// run is noted).
    fn seat_for(&mut self, j: u32, g: u32, slots: u32) -> (JobSeat, bool) {
        let job = &self.sc.jobs[j as usize];
        let (budget_pct, sm_pct, cap) = self.policy_for(g, slots);
        let pair = self.fits_beside(j, g);
        let over_cap = cap.is_some_and(|c| job.mem_mib > c) || !self.fits_offline(j, g);
        let starts = if self.online[g as usize].is_none() {
            !over_cap && job.mem_mib <= self.sc.gpus[g as usize].mem_mib
        } else {
            pair.is_some() && !over_cap
        };
        // What the node's record of this start teaches the next round
        // (muxflow_matcher::failed): a failure at the job's measured peak
        // (its cap where it ran over it), a run beside a partner as
        // evidence against a failure's reach. The daemon reads both from
        // its history every round; here each start is recorded as it
        // happens.
        if let (Some(svc), Some(cap_mib)) = (self.online[g as usize].as_ref(), cap) {
            let key = sim_key(&self.sc.tasks[job.task as usize].name);
            let partner = sim_key(&self.sc.tasks[svc.task as usize].name);
            let s = Start {
                job: &key,
                partner: Some(&partner),
                model_mib: self.sc.gpus[g as usize].mem_mib,
                cap_mib,
                beside_offline: !self.gpus[g as usize].offline.is_empty(),
            };
            if starts {
                self.learning.failed.ran(&s);
            } else {
                self.learning.failed.failed(&s, job.mem_mib.min(cap_mib));
            }
        } else if let (false, Some(cap_mib)) = (starts, cap) {
            // On an idle GPU, beside other offline jobs (`muxflow-nK`): its
            // part of the room ran out, a need above it. The replay's record
            // of an idle GPU names no cap, so a daemon reading it would
            // learn only the job's peak and its failures beside offline
            // jobs (`Profile::beside_offline_fail`); the replay keeps the
            // need, as it did before the lessons moved into the matcher.
            let key = sim_key(&self.sc.tasks[job.task as usize].name);
            let s = Start {
                job: &key,
                partner: None,
                model_mib: self.sc.gpus[g as usize].mem_mib,
                cap_mib,
                beside_offline: !self.gpus[g as usize].offline.is_empty(),
            };
            self.learning.failed.failed(&s, job.mem_mib.min(cap_mib));
        }
        let seat = JobSeat {
            sm_pct,
            budget_pct,
            mem_cap_mib: cap,
            slots,
            partner: self.online[g as usize],
            ..JobSeat::on(g, pair)
        };
        (seat, starts)
    }

    /// Every GPU into the round's state as its node first publishes it
    /// (healthy, nothing measured alone yet; an idle GPU with no online
    /// job), and a health state machine on each online one.
    pub(super) fn enter_gpus(&mut self) {
        let sc = self.sc;
        for g in 0..sc.gpus.len() as u32 {
            let gpu = &sc.gpus[g as usize];
            let svc = sc.online[g as usize].as_ref();
            if let Some(svc) = svc {
                self.gpus[g as usize].fsm = Some(Fsm::new(0));
                let name = &sc.tasks[svc.task as usize].name;
                self.learning
                    .failed
                    .note_partner(svc.job_id, &sim_key(name));
            }
            self.state_index[g as usize] = self.state.gpus.len();
            self.state.gpus.push(GpuState {
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
                    power_w: Some(crate::protection::power_limit_w(
                        &sc.models[gpu.model as usize],
                    )),
                },
                // Empty: an idle GPU, the round's solo candidate.
                online_jobs: svc.map(|s| s.job_id).into_iter().collect(),
                slots_used: 0,
                offline_jobs: 0,
                owners: Vec::new(),
            });
        }
    }

    /// The scenario's GPUs a placing decision names.
    fn gpus_of(&self, d: &Decision) -> Option<Vec<u32>> {
        let node = d.node.as_ref()?;
        let gs: Vec<u32> = d
            .gpus
            .iter()
            .map(|&i| self.gpu_of(node, i).expect("a GPU of the scenario"))
            .collect();
        (!gs.is_empty()).then_some(gs)
    }

    /// The AdminComment the plugin writes for this run, read back through
    /// sacct's parser into the predictor's history.
    /// A k-GPU job's record is the plugin's: its first GPU in the main
    /// fields, the others in `gang`; its progress is the gang's (its
    /// slowest GPU's).
    pub(super) fn report(&mut self, j: u32, seats: &[JobSeat], oom: bool) {
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
        // The partner's utilization as muxflow-police samples it: the
        // service's share of the GPU at its load, its mean over the run in
        // percent of the GPU and over its largest.
        let (mean_load, max_load) = if wall > 0.0 {
            let load_s = rt.partner_load_s + rt.partner_load * (self.now - rt.last_s);
            (load_s / wall, rt.partner_load_max.max(rt.partner_load))
        } else {
            (0.0, 0.0)
        };
        let measured = svc.filter(|_| wall > 0.0);
        // Those that shared its GPUs during the run, and those there now
        // (a start refused for memory: the jobs it met).
        let mut peers = rt.peers.clone();
        let now = seats
            .iter()
            .flat_map(|s| &self.gpus[s.g as usize].offline)
            .map(|&k| self.sc.jobs[k as usize].id);
        add_peers(&mut peers, Some(job.id), now);
        self.tally.peer_runs += u64::from(!peers.is_empty());
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
            partner_load_pct: measured
                .filter(|_| max_load > 0.0)
                .map(|_| (100.0 * mean_load / max_load).round().min(100.0) as u8),
            partner_sm_pct: measured
                .map(|s| (100.0 * s.share * mean_load).round().min(100.0) as u8),
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
                ..SacctTime::default()
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
        self.learning.runs.extend(runs_from_sacct(&listing));
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

/// A replayed job's or service's key as the matcher's history names it:
/// (user, name), every replayed job's user the same.
pub(super) fn sim_key(name: &str) -> JobKey {
    ("sim".into(), name.into())
}

/// What `muxflow`'s matcher has learned: the runs parsed back from the
/// finished jobs' records, the model trained on them, and what failed
/// since, with the round caches that depend on it.
pub(super) struct Learning {
    /// Off with `--default-predictor`: the default model throughout.
    learn: bool,
    pub(super) runs: Vec<Run>,
    model: Model,
    trained_on_runs: usize,
    /// The daemon's round cache, for the learned model's rounds and the
    /// oracle's; `epoch` names the learned model (retrained: a new one;
    /// what failed since is each job's key, `Remembering::job_key`).
    round_cache: RoundCache,
    oracle_cache: RoundCache,
    epoch: u64,
    /// What the failed placements teach (`muxflow_matcher::failed`): the
    /// daemon rebuilds it from its whole history every round, and the
    /// history window (30 days) outlasts the replay, so nothing in it is
    /// forgotten at a retraining.
    pub(super) failed: FailedPlacements,
}

impl Learning {
    pub(super) fn new(learn: bool) -> Learning {
        Learning {
            learn,
            runs: Vec::new(),
            model: Model::default(),
            trained_on_runs: 0,
            round_cache: RoundCache::default(),
            oracle_cache: RoundCache::default(),
            epoch: 0,
            failed: FailedPlacements::default(),
        }
    }

    /// Whether this round retrains: the daemon retrains every round on its
    /// whole history; here the model is retrained when the history grew by
    /// a tenth (it moves little in between), which keeps a week's replay
    /// fast.
    fn retrain_due(&self) -> bool {
        let n = self.runs.len();
        self.learn
            && n > self.trained_on_runs
            && (n - self.trained_on_runs) * 10 >= self.trained_on_runs.max(10)
    }

    /// `model`, trained on the first `runs` runs, replaces the model: a new
    /// epoch.
    fn trained(&mut self, model: Model, runs: usize) {
        self.model = model;
        self.trained_on_runs = runs;
        self.epoch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_bound_keeps_the_daemons_rate_per_hour() {
        let m = muxflow::config::Matcher {
            interval_s: 60,
            max_updates_per_round: 200,
            ..muxflow::config::Matcher::default()
        };
        let at_900 = scaled_matcher(&m, 900.0, false);
        assert_eq!(at_900.max_updates_per_round, 3000);
        assert_eq!(at_900.pricing_budget_ms, 600_000);
        // Never below one update a round; no pricing with candidates only.
        let fast = scaled_matcher(&m, 0.1, true);
        assert_eq!(fast.max_updates_per_round, 1);
        assert_eq!(fast.pricing_budget_ms, 0);
    }
}
