//! Where jobs start and stop: arrivals, the first fit of `exclusive`,
//! `time-sharing` and `priority`, the pending jobs the matcher's round
//! reads, starts (all of a gang's GPUs together), finishes, and what a
//! node publishes for the next start ([`Sim::policy_for`]).

use muxflow::policy::share::{offline_mem_cap_mib, offline_part, offline_sm_budget};
use muxflow::records::report::add_peers;
use muxflow_matcher::reader::PendingJob;

use super::{Ev, JobSeat, Sim};

impl Sim<'_> {
    pub(super) fn allowed(&self, j: u32, g: u32) -> bool {
        self.sc.jobs[j as usize]
            .models
            .as_ref()
            .is_none_or(|m| m.contains(&self.sc.gpus[g as usize].model))
    }

    /// Whether job `j` can share GPU `g` with its online service: the pair
    /// was measured together and both fit the GPU's memory.
    pub(super) fn fits_beside(&self, j: u32, g: u32) -> Option<(f64, f64)> {
        let job = &self.sc.jobs[j as usize];
        let svc = self.online[g as usize].as_ref()?;
        let pair = self.sc.pairs.pair(job.job_type, svc.job_type)?;
        (job.mem_mib + svc.mem_mib <= self.sc.gpus[g as usize].mem_mib).then_some(pair)
    }

    pub(super) fn arrival(&mut self) {
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
    pub(super) fn node_gpus(&self, n: u32) -> std::ops::Range<u32> {
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
    pub(super) fn plain_placement(&self, j: u32, on_node: Option<u32>) -> Option<Vec<JobSeat>> {
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

    pub(super) fn enqueue(&mut self, j: u32) {
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
                earlier: Default::default(),
                // The traces name no CPU or memory request: GPUs only.
                need: Default::default(),
                array_task: None,
                unstartable: None,
            });
            self.in_state[j as usize] = true;
        }
    }

    /// Starts job `j` on its seats (all its GPUs together).
    pub(super) fn start(&mut self, j: u32, mut seats: Vec<JobSeat>) {
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
            self.tally
                .queue_s
                .push(self.now - self.sc.jobs[j as usize].arrival_s);
        }
        job.short |= short;
        job.last_s = self.now;
        job.run_start_s = self.now;
        job.run_remaining_s = job.remaining_s;
        job.speed = 0.0;
        (job.partner_load, job.partner_load_s, job.partner_load_max) = (0.0, 0.0, 0.0);
        job.peers.clear();
        let gs: Vec<u32> = seats.iter().map(|s| s.g).collect();
        job.seats = seats;
        self.tally.sums.running += 1;
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
                self.tally.health_violations += 1;
            }
            // Lent: GPUs owned by online work holding offline work (one
            // however many jobs it holds).
            if online && on_gpu == 1 {
                self.tally.sums.lent += 1;
            }
            self.publish(g);
            // Force new speeds even if the rates look unchanged.
            self.gpus[g as usize].rates.offline_speed = -1.0;
        }
        self.refresh(&gs);
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
    pub(super) fn stop(&mut self, j: u32) -> Vec<u32> {
        self.set_speed(j, 0.0);
        let job = &mut self.jobs[j as usize];
        // Taken, not cleared: a finished job keeps no allocation.
        let gs: Vec<u32> = std::mem::take(&mut job.seats).iter().map(|s| s.g).collect();
        job.version += 1;
        self.tally.sums.running -= 1;
        let now = self.now;
        for &g in &gs {
            let online = self.online[g as usize].is_some();
            let rt = &mut self.gpus[g as usize];
            rt.offline.retain(|&k| k != j);
            let now_free = rt.offline.is_empty();
            if now_free {
                rt.open_since_s = now;
            }
            // Force new speeds for the jobs left (their partners changed).
            rt.rates.offline_speed = -1.0;
            self.publish(g);
            if online {
                if now_free {
                    self.tally.sums.lent -= 1;
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

    pub(super) fn finish(&mut self, j: u32, version: u32) {
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
        self.tally.finished += 1;
        if self.sc.jobs[j as usize].gpus > 1 {
            self.tally.gang_finished += 1;
        }
        self.tally
            .jct
            .push(self.now - self.sc.jobs[j as usize].arrival_s);
        self.fill(&gs);
    }

    /// Gives freed GPUs (of one node) to the oldest waiting jobs that can
    /// use them, while one of them is free.
    pub(super) fn fill(&mut self, freed: &[u32]) {
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

    pub(super) fn gpu_of(&self, node: &str, index: u32) -> Option<u32> {
        let n = *self.node_index.get(node)?;
        let g = self.first_gpu[n as usize] + index;
        (self.sc.gpus.get(g as usize)?.node == n).then_some(g)
    }

    /// Whether job `j` can join the offline jobs on GPU `g` (`muxflow-nK`):
    /// each pair of it and one of them was measured together, and all of
    /// them, the online service's memory included, fit the GPU's memory.
    /// True when the GPU has none.
    pub(super) fn fits_offline(&self, j: u32, g: u32) -> bool {
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
    pub(super) fn policy_for(&self, g: u32, slots: u32) -> (u8, u8, Option<u64>) {
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
    pub(super) fn budget_for(&self, g: u32) -> (u8, Option<u64>) {
        let p = &self.state.gpus[self.state_index[g as usize]].published;
        let mut facts = p.facts();
        if self.online[g as usize].is_none() {
            // What the plugin gives on a GPU with no online job.
            facts = facts.without_online();
        }
        (
            offline_sm_budget(&self.cfg.policy, &facts),
            offline_mem_cap_mib(&self.cfg.policy, &facts),
        )
    }
}
