//! Speeds and rates: what the model gives each GPU's offline jobs (a
//! gang runs at its slowest GPU's speed), the online latency factor they
//! leave, and the GPU's rates that the integrals sum. Between two events
//! they are constant; [`Sim::refresh`] recomputes them after a change.

use super::outcome::latency_bin;
use super::{Ev, JobSeat, PolicyKind, Sim};
use crate::model::{
    self, gpu_rates, GpuRates, OfflineSide, OnlineSide, Protection, SlotJob, OFFLINE_SM,
};
use crate::scenario::PairLoad;

impl Sim<'_> {
    /// GPU `g`'s online load now, fraction of its daily peak (its
    /// service's under `--autoscale`).
    fn online_load(&self, g: u32) -> f64 {
        match &self.scaling {
            Some(sc) => sc.service_of[g as usize].map_or(self.load, |s| sc.load[s as usize]),
            None => self.load,
        }
    }

    fn online_side(&self, g: u32) -> Option<OnlineSide> {
        let gpu = &self.sc.gpus[g as usize];
        self.online[g as usize].as_ref().map(|s| OnlineSide {
            share: s.share,
            load: self.online_load(g),
            mem: s.mem_mib as f64 / gpu.mem_mib as f64,
        })
    }

    /// A measured pair (x_off, x_on) with GPU `g`'s service, at its load
    /// now ([`model::at_load`]: the offline side's slowdown follows it).
    pub(super) fn pair_now(&self, g: u32, (x_off, x_on): (f64, f64)) -> (f64, f64) {
        (model::at_load(x_off, self.pair_load(g)), x_on)
    }

    /// xCUDA's protection on GPU `g` at its service's load now.
    pub(super) fn protection_now(&self, g: u32) -> Protection {
        let p = self.protection[g as usize];
        match self.online[g as usize] {
            Some(_) => p.at_load(self.pair_load(g)),
            None => p,
        }
    }

    /// The load the measured slowdowns on GPU `g` apply at (`--pair-load`).
    fn pair_load(&self, g: u32) -> f64 {
        match self.pair_load {
            PairLoad::Now => self.online_load(g),
            PairLoad::Peak => 1.0,
        }
    }

    /// Job `j`'s seat on GPU `g` (it runs there).
    pub(super) fn seat(&self, j: u32, g: u32) -> &JobSeat {
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
                        with_online: online.and(seat.pair).map(|p| self.pair_now(g, p)),
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
            model::muxflow_slots(&members, between, paused, self.protection_now(g))
        } else {
            // One offline job at most.
            let mut latency = 1.0;
            let speeds = rt
                .offline
                .iter()
                .map(|&j| match (online.is_some(), self.seat(j, g).pair) {
                    (false, _) | (true, None) => 1.0,
                    (true, Some(pair)) => {
                        let (x_off, x_on) = self.pair_now(g, pair);
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
    pub(super) fn gang_speed(&self, j: u32) -> f64 {
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
    pub(super) fn apply_rates(&mut self, g: u32, new: GpuRates) -> bool {
        let online = self.online[g as usize].is_some();
        let rt = &mut self.gpus[g as usize];
        let old = rt.rates;
        if new == old {
            return false;
        }
        let s = &mut self.tally.sums;
        s.util += new.util - old.util;
        s.sm += new.sm - old.sm;
        s.mem += new.mem - old.mem;
        if online {
            s.util_online += new.util - old.util;
            s.sm_online += new.sm - old.sm;
            if new.latency != old.latency {
                if old.latency > 0.0 {
                    self.tally.latency_hist[latency_bin(old.latency)] +=
                        self.now - rt.latency_since;
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
    pub(super) fn refresh(&mut self, gs: &[u32]) {
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

    pub(super) fn set_speed(&mut self, j: u32, speed: f64) {
        let gpus = f64::from(self.sc.jobs[j as usize].gpus);
        let load = (self.jobs[j as usize].seats.first())
            .filter(|s| s.partner.is_some())
            .map_or(0.0, |s| self.pair_load(s.g));
        let job = &mut self.jobs[j as usize];
        job.remaining_s = (job.remaining_s - job.speed * (self.now - job.last_s)).max(0.0);
        job.partner_load_s += job.partner_load * (self.now - job.last_s);
        job.partner_load = load;
        job.partner_load_max = job.partner_load_max.max(load);
        job.last_s = self.now;
        if job.speed == speed && !job.seats.is_empty() {
            return;
        }
        // Work done counts each of its GPUs (GPU-hours, as k workers did).
        self.tally.sums.speed += (speed - job.speed) * gpus;
        if gpus > 1.0 {
            self.tally.sums.gang_speed += (speed - job.speed) * gpus;
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

    /// The model's speed of a new job (`new`, of type `job_type`) joining
    /// GPU `g`'s offline jobs ([`model::muxflow_slots`]).
    /// Its pair with the service is the measured one; the model takes it
    /// at the service's load now.
    pub(super) fn speed_beside(&self, g: u32, new: SlotJob, job_type: u16) -> f64 {
        let new = SlotJob {
            with_online: new.with_online.map(|p| self.pair_now(g, p)),
            ..new
        };
        let p = self.protection_now(g);
        let on = &self.gpus[g as usize].offline;
        if on.is_empty() && new.share >= new.budget {
            return model::muxflow_slots(&[new], |_, _| 1.0, false, p).0[0];
        }
        let partners = on.iter().map(|&k| {
            let t = self.sc.jobs[k as usize].job_type;
            self.sc.pairs.speed(job_type, t).unwrap_or(0.0)
        });
        model::slot_speed(&new, partners, p)
    }
}
