//! The oracle: the matcher given the true values (what each pair would
//! really run at, by the model), for `pairing_vs_oracle` and for the
//! start of a placement the round decided.

use muxflow::config::Policy;
use muxflow::policy::share::offline_part;
use muxflow_matcher::predict::Seat;
use muxflow_matcher::reader::{GpuState, PendingJob};
use muxflow_matcher::round::{IdleSlot, Predictor};

use super::Sim;
use crate::model::{self, SlotJob, OFFLINE_SM};
use crate::scenario::Scenario;

/// The matcher given the true values: what each pair would really run at.
pub(super) struct Truth<'s, 'a> {
    pub(super) sim: &'s Sim<'a>,
}

impl Truth<'_, '_> {
    pub(super) fn speed(&self, j: u32, g: u32, slots: u32) -> Option<f64> {
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

/// Per-job terms of the oracle: type, SM demand, memory, allowed models,
/// and its mean pair throughput (what it keeps beside a partner not
/// known yet, [`crate::input::Pairs::mean_speed`]: once per job, not per
/// pair).
#[derive(Clone, Copy)]
pub(super) struct TruthJob<'a> {
    mean_speed: f64,
    job_type: u16,
    demand: f64,
    mem_mib: u64,
    models: Option<&'a [u16]>,
}

/// Per-slot terms of the oracle: what the policy gives there, its side,
/// and the offline jobs already there (`muxflow-nK`).
#[derive(Clone, Copy)]
pub(super) struct TruthGpu {
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
            let (x_off, x_on) = self.sim.pair_now(gpu.g, pair);
            let p = self.sim.protection_now(gpu.g);
            return Some(model::muxflow(x_off, x_on, gpu.share, job.demand, p).0 * unknown);
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
        // At the service's load now: the speeds follow it.
        let p = sim.protection_now(g);
        key.extend([
            p.latency_excess_left.to_bits(),
            p.offline_speed.to_bits(),
            sim.pair_now(g, (0.0, 1.0)).0.to_bits(),
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
