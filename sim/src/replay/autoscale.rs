//! Services that come and go (`--autoscale`): each service runs the
//! replicas its load needs, started and stopped at every hourly step; a
//! replica lands where Slurm would put it ([`Sim::slurm_place`]) and the
//! offline jobs on its GPUs are requeued ([`Sim::requeue`]), losing the
//! work since their last checkpoint. [`Churn`] is what it costs.

use serde::Serialize;

use super::outcome::Fixed;
use super::Sim;
use crate::model::{self, GpuRates};
use crate::scenario::{replicas_for, Scenario, Service, REQUEUE_EXIT_S};
use muxflow::policy::health::{Fsm, HealthState};

/// What services coming and going cost (`--autoscale`, issue 30): the
/// policy's figures in `--json` (each field's `rename`), null without.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Churn {
    /// Replicas the hourly steps started and stopped (hour 0's stops
    /// scale the peak placement down to the night's load).
    #[serde(rename = "online_replica_starts")]
    pub replica_starts: u64,
    #[serde(skip)]
    pub replica_stops: u64,
    /// Replica starts whose GPUs held offline work: each waited for it to
    /// leave (the warning's checkpoint, then the job's exit).
    #[serde(rename = "online_starts_delayed")]
    pub starts_delayed: u64,
    /// Seconds each replica start waited for its GPUs (0 where they were
    /// free), summed, their mean over every start (when the replay ends),
    /// and the longest.
    #[serde(skip)]
    pub start_delay_total_s: f64,
    #[serde(rename = "online_start_delay_mean_s")]
    pub start_delay_mean_s: Fixed<3>,
    #[serde(rename = "online_start_delay_max_s")]
    pub start_delay_max_s: Fixed<3>,
    /// Replicas a service wanted that no node could take, summed over the
    /// hourly steps (replica-hours short).
    #[serde(rename = "online_replica_hours_short")]
    pub replica_hours_short: u64,
    /// Offline jobs requeued for a landing replica, and the work they lost
    /// (GPU-hours: seconds of progress since their last checkpoint × their
    /// GPUs), taken off `offline_gpu_hours`.
    #[serde(rename = "offline_requeues")]
    pub requeues: u64,
    #[serde(rename = "offline_lost_gpu_hours")]
    pub lost_gpu_hours: Fixed<1>,
    /// Online GPU-hours (GPUs holding a replica, integrated; when the
    /// replay ends).
    #[serde(skip)]
    pub online_gpu_hours: f64,
}

impl Churn {
    /// The keys of its figures in `--json`, in order: what a policy prints
    /// (null) without `--autoscale`.
    pub const FIGURES: [&'static str; 7] = [
        "online_replica_starts",
        "online_starts_delayed",
        "online_start_delay_mean_s",
        "online_start_delay_max_s",
        "online_replica_hours_short",
        "offline_requeues",
        "offline_lost_gpu_hours",
    ];

    /// The figures at the replay's end, replicas having held their GPUs
    /// for `online_gpu_s` GPU-seconds.
    pub(super) fn ended(self, online_gpu_s: f64) -> Churn {
        Churn {
            start_delay_mean_s: Fixed(self.start_delay_total_s / self.replica_starts.max(1) as f64),
            online_gpu_hours: online_gpu_s / 3600.0,
            ..self
        }
    }
}

/// The services' replicas while they scale (`--autoscale`).
#[derive(Debug, Clone, Default)]
pub(super) struct Scaling {
    /// Per service: its replicas at the daily peak, those running (in start
    /// order) and those stopped (last stopped last).
    peak: Vec<u32>,
    running: Vec<Vec<u32>>,
    stopped: Vec<Vec<u32>>,
    /// Per service, the load each running replica carries (fraction of a
    /// replica's at the peak).
    pub(super) load: Vec<f64>,
    /// Per replica, its GPUs while it runs.
    on: Vec<Vec<u32>>,
    /// Per GPU, its replica's service while one runs there.
    pub(super) service_of: Vec<Option<u32>>,
    next_job_id: u32,
    pub(super) churn: Churn,
}

impl Scaling {
    /// Every replica of the scenario running, on its peak GPUs (the first
    /// hourly step scales them to the load).
    pub(super) fn of(sc: &Scenario) -> Scaling {
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

impl Sim<'_> {
    /// Starts and stops replicas so that each service runs
    /// [`replicas_for`] its peak at the hour's load (`--autoscale`):
    /// services scale in first (newest replica first, as a ReplicaSet
    /// scales down), then out, each new replica placed as Slurm places an
    /// online job ([`Sim::slurm_place`]); the offline jobs on its GPUs are
    /// requeued ([`Sim::requeue`]), as the online job's Prolog does.
    pub(super) fn scale(&mut self) {
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
                c.start_delay_max_s = Fixed(c.start_delay_max_s.0.max(delay));
            }
            let running = sc.running[s].len().max(1) as f64;
            sc.load[s] = (f64::from(sc.peak[s]) * self.load / running).min(1.0);
        }
        self.scaling = Some(sc);
        self.online_ids = (0..self.sc.gpus.len() as u32)
            .filter(|&g| self.online[g as usize].is_some())
            .collect();
        self.tally.sums.online = self.online_ids.len();
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
        self.tally.acc.work -= lost * gpus;
        if job.gpus > 1 {
            self.tally.acc.gang_work -= lost * gpus;
        }
        churn.requeues += 1;
        churn.lost_gpu_hours.0 += lost * gpus / 3600.0;
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
            self.tally.sums.lent -= 1;
        }
        self.online[g as usize] = owner;
        if let Some(svc) = owner {
            // A replica is its service to what failures teach.
            let name = &self.sc.tasks[svc.task as usize].name;
            (self.learning.failed).note_partner(svc.job_id, &super::rounds::sim_key(name));
        }
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
}
