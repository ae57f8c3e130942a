//! Where the online GPUs' time goes while offline work waits: sampled
//! after every round under `muxflow` where jobs still wait, each sample
//! standing for the interval to the next round, over the GPUs that hold an
//! online service.
//!
//! The fact that shapes it: a GPU is either holding offline work (every
//! slot taken, so only more jobs per GPU, or a lighter brake, could use
//! what is left) or open, and an open GPU is open for one of four reasons:
//! its health state refuses offline work, no round has run since it
//! opened (measured at the round, from when it opened, and taken out of
//! the held time the last sample counted), or a round left it open —
//! because no waiting job's memory fits its cap, or for anything else that
//! keeps a job off it (the update bound, the pair table, a failure's
//! lesson, `gpu_spec`, a user's GPU).

use serde::Serialize;

use super::outcome::Fixed;
use super::Sim;

/// The breakdown, GPU-hours (`Fixed`: rounded where printed). The open
/// GPUs count up to the GPUs the waiting jobs ask for, shared out by
/// reason in proportion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WhileWaiting {
    /// Online GPUs holding offline work.
    pub held_gpu_hours: Fixed<1>,
    /// Of those, the capacity unused: 1 − their utilization.
    pub held_unused_gpu_hours: Fixed<1>,
    /// Offline work (normalized GPU-hours) xCUDA's protection held back
    /// on them: what the jobs there would have done unprotected, less what
    /// they did.
    pub braked_gpu_hours: Fixed<1>,
    /// Open online GPUs whose health state refuses offline work.
    pub health_gpu_hours: Fixed<1>,
    /// Open and accepting, waiting for the next round since they opened.
    pub rounds_gpu_hours: Fixed<1>,
    /// Left open by a round: no waiting job's memory fits their cap.
    pub memory_gpu_hours: Fixed<1>,
    /// Left open by a round though some waiting job's memory fits.
    pub unplaced_gpu_hours: Fixed<1>,
}

/// The sums behind [`WhileWaiting`], GPU-seconds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct WaitingSums {
    held: f64,
    held_unused: f64,
    braked: f64,
    health: f64,
    rounds: f64,
    memory: f64,
    unplaced: f64,
    /// When a round last ran, and whether jobs still waited after it.
    pub(super) last_round_s: f64,
    last_counted: bool,
}

impl WaitingSums {
    pub(super) fn hours(&self) -> WhileWaiting {
        let h = |s: f64| Fixed(s / 3600.0);
        WhileWaiting {
            held_gpu_hours: h(self.held),
            held_unused_gpu_hours: h(self.held_unused),
            braked_gpu_hours: h(self.braked),
            health_gpu_hours: h(self.health),
            rounds_gpu_hours: h(self.rounds),
            memory_gpu_hours: h(self.memory),
            unplaced_gpu_hours: h(self.unplaced),
        }
    }
}

impl Sim<'_> {
    /// Before a round: the GPUs that opened since the last one waited for
    /// it while jobs waited (the last sample counted them held).
    pub(super) fn waited_for_round(&mut self) {
        let w = &mut self.tally.waiting;
        // Only where the last sample counted the interval (jobs waited
        // then): those GPUs were counted held for it.
        if !w.last_counted {
            return;
        }
        for &g in &self.online_ids {
            let rt = &self.gpus[g as usize];
            let accepts = rt.fsm.is_none_or(|f| f.state.accepts_offline());
            if rt.offline.is_empty() && accepts && rt.open_since_s > w.last_round_s {
                let waited = self.now - rt.open_since_s;
                w.rounds += waited;
                w.held -= waited;
            }
        }
    }

    /// After a round: where each online GPU stands while jobs still wait,
    /// standing for the `dt` seconds to the next round.
    pub(super) fn sample_waiting(&mut self, dt: f64) {
        self.tally.waiting.last_round_s = self.now;
        self.tally.waiting.last_counted = !self.queue.is_empty();
        if self.queue.is_empty() {
            return;
        }
        // The smallest memory of a waiting job: a GPU whose cap is below
        // it fits none of them.
        let smallest_mib = (self.queue.iter())
            .map(|&j| self.sc.jobs[j as usize].mem_mib)
            .min()
            .unwrap_or(0);
        let slots = u32::from(self.kind.offline_per_gpu());
        let mut w = self.tally.waiting;
        // Open GPUs per reason: health, memory, left by the round.
        let mut open = [0.0f64; 3];
        for &g in &self.online_ids {
            let rt = &self.gpus[g as usize];
            if !rt.offline.is_empty() {
                w.held += dt;
                w.held_unused += dt * (1.0 - rt.rates.util).max(0.0);
                let kept = self.protection_now(g).offline_speed;
                if kept > 0.0 {
                    w.braked += dt * rt.rates.offline_speed.max(0.0) * (1.0 / kept - 1.0);
                }
            } else if rt.fsm.is_some_and(|f| !f.state.accepts_offline()) {
                open[0] += 1.0;
            } else if self
                .policy_for(g, slots)
                .2
                .is_some_and(|cap| cap < smallest_mib)
            {
                open[1] += 1.0;
            } else {
                open[2] += 1.0;
            }
        }
        // Idle while work waits: no more open GPUs than the waiting jobs
        // could use (one that failed its start and waits alone does not
        // make every open GPU idle for it), shared out by reason.
        let demand: f64 = (self.queue.iter())
            .map(|&j| f64::from(self.sc.jobs[j as usize].gpus))
            .sum();
        let total: f64 = open.iter().sum();
        let scale = if total > demand { demand / total } else { 1.0 };
        w.health += dt * open[0] * scale;
        w.memory += dt * open[1] * scale;
        w.unplaced += dt * open[2] * scale;
        self.tally.waiting = w;
    }
}
