//! The health checks: a SysMonitor step of the production health state
//! machine ([`Fsm::step`]) on every online GPU, with the reading the
//! simulated GPU gives now; what it publishes is what the next round and
//! the next start read.

use muxflow::policy::health::{Input, Metrics, Solo};

use super::Sim;
use crate::model;

impl Sim<'_> {
    /// A SysMonitor step on every online GPU, with the reading the
    /// simulated GPU gives now.
    pub(super) fn health(&mut self) {
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
                self.tally.health_violations += 1;
            }
        }
    }
}
