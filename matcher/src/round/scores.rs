//! The scores phase: what the matching maximizes for a job on a column
//! ([`Round::value`]: the [`Predictor`]'s weight next to an online job, its
//! solo speed less [`IDLE_TIE_BREAK`] on an idle GPU, nothing where the
//! job may not go), quantized ([`Round::score`]) and computed once per
//! column class ([`ColumnClasses`]).

use muxflow::config::Policy;
use muxflow::policy::share::{offline_mem_cap_mib, offline_part, offline_sm_percent, GpuFacts};
use muxflow::records::placement::Waiting;

use super::Round;
use crate::predict::{default_prediction, GpuTerms, JobTerms, Model, Seat, DEFAULT_SD};
use crate::reader::{GpuState, PendingJob};
use crate::weights::quantize;

/// What a round needs of a predictor: terms looked up once per job and
/// per GPU, and the per-pair prediction from them (the hot path). [`Model`]
/// is the production one; the cluster replay (`sim/`) also scores rounds
/// with the true values, to measure how much the predictor costs.
pub trait Predictor: Sync {
    type Job: Sync;
    type Gpu: Sync;
    fn job_terms(&self, job: &PendingJob) -> Self::Job;
    /// The GPU's terms for a job in `seat` there (issue 15).
    fn gpu_terms(&self, gpu: &GpuState, policy: &Policy, seat: Seat) -> Self::Gpu;
    /// What the matching maximizes for the job there; `None`: not a
    /// candidate.
    fn predict(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<f64>;
    /// The normalized throughput shown for a chosen pair and its standard
    /// deviation; by default the weight, exact.
    fn estimate(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<(f64, f64)> {
        self.predict(job, gpu).map(|p| (p, 0.0))
    }
    /// The job on idle GPU `gpu` in `slot` (one of `slot.offline_jobs`
    /// offline jobs there): its normalized throughput (alone: 1 by definition, its
    /// speed there ÷ its speed alone) and standard deviation; `None`: not
    /// a candidate (its memory does not fit `slot.room_mib`, or the GPU is
    /// not one it may use).
    fn solo(&self, job: &Self::Job, gpu: &GpuState, slot: &IdleSlot) -> Option<(f64, f64)>;
    /// Why the job is no candidate beside any online job, where the
    /// predictor keeps it off them all (its reason when it finds no GPU);
    /// `None` by default.
    fn kept_off_shared(&self, _job: &Self::Job) -> Option<&'static str> {
        None
    }
    /// What the weights of GPU `gpu`, `at` in the state's list, depend on
    /// beyond its [`GpuState`] and the predictor's epoch ([`super::plan_cached`]):
    /// a value that changes when that does. [`Model`] reads only the state.
    fn gpu_key(&self, _at: usize, _gpu: &GpuState) -> u64 {
        0
    }
    /// The same for a job beyond its [`PendingJob`] fields that the
    /// round reads (who, what, fixed slots, need).
    fn job_key(&self, _job: &PendingJob) -> u64 {
        0
    }
    /// Columns alike (issue 30): appends to `key` everything
    /// [`Predictor::predict`] reads of GPU `gpu` (`at` in the state's list)
    /// beyond a job's terms, where `terms` are the GPU's, or, for an idle
    /// GPU (`terms` `None`), everything [`Predictor::solo`] reads of it
    /// beyond the job's terms and the slot. Two GPUs whose keys are equal
    /// must give every job the same value; the round then scores a job
    /// once per distinct key (most GPUs of a cluster repeat a few service
    /// types, and idle GPUs are alike). `false`: no key, the GPU is scored
    /// on its own (the default).
    fn column_key(
        &self,
        _at: usize,
        _gpu: &GpuState,
        _terms: Option<&Self::Gpu>,
        _key: &mut Vec<u64>,
    ) -> bool {
        false
    }
}

impl Predictor for Model {
    type Job = JobTerms;
    type Gpu = GpuTerms;
    fn job_terms(&self, job: &PendingJob) -> JobTerms {
        Model::job_terms(self, &(job.user.clone(), job.name.clone()))
    }
    fn gpu_terms(&self, gpu: &GpuState, policy: &Policy, seat: Seat) -> GpuTerms {
        Model::gpu_terms(self, gpu, policy, seat)
    }
    #[inline]
    fn predict(&self, job: &JobTerms, gpu: &GpuTerms) -> Option<f64> {
        self.predict_terms(job, gpu).map(|e| e.weight())
    }
    fn estimate(&self, job: &JobTerms, gpu: &GpuTerms) -> Option<(f64, f64)> {
        self.predict_terms(job, gpu).map(|e| (e.mean, e.sd))
    }
    /// The terms alone: `predict` reads nothing else, `solo` nothing of
    /// the GPU but its slot.
    fn column_key(
        &self,
        _at: usize,
        _gpu: &GpuState,
        terms: Option<&GpuTerms>,
        key: &mut Vec<u64>,
    ) -> bool {
        if let Some(t) = terms {
            t.key_words(key);
        }
        true
    }
    fn solo(&self, job: &JobTerms, _gpu: &GpuState, slot: &IdleSlot) -> Option<(f64, f64)> {
        // The node-measured peak decides, as next to an online job.
        let fits = job.peak_mib.is_none_or(|p| p <= slot.room_mib);
        // Alone with the whole ceiling: 1. In one of several slots: the
        // default's rule on its slot's part of the SMs, times what each
        // other offline job there leaves it (Model::beside_offline).
        fits.then(|| {
            if slot.offline_jobs <= 1 && slot.share >= slot.budget {
                (1.0, 0.0)
            } else {
                let others = self
                    .beside_offline(job, slot.budget)
                    .powi(slot.offline_jobs as i32 - 1);
                (
                    (default_prediction(slot.share) * others).clamp(0.01, 1.0),
                    DEFAULT_SD,
                )
            }
        })
    }
}

/// What an idle GPU's weight is lowered by, so that a shared GPU predicted
/// as fast wins the tie: one unit of the solver's integer weights.
pub const IDLE_TIE_BREAK: f64 = 1.0 / crate::weights::SCALE;

/// Memory the offline jobs may use on an idle GPU together: the GPU's less
/// the reserve ([`GpuFacts::without_online`]); 0 when the GPU's is unknown.
pub fn idle_room_mib(gpu: &GpuState, policy: &Policy) -> u64 {
    let facts = GpuFacts {
        online_solo_sm_pct: None,
        online_mem_mib: None,
        mem_total_mib: (gpu.published.mem_mib > 0).then_some(gpu.published.mem_mib),
        power_limit_w: None,
    };
    offline_mem_cap_mib(policy, &facts.without_online()).unwrap_or(0)
}

/// What a job gets in a seat on an idle GPU: its slots' part
/// ([`offline_part`]) of the SM ceiling and of [`idle_room_mib`], as one
/// of `offline_jobs` offline jobs there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleSlot {
    pub room_mib: u64,
    /// SM share, a fraction.
    pub share: f64,
    /// The GPU's whole offline SM share (the ceiling), a fraction.
    pub budget: f64,
    pub offline_jobs: u32,
}

impl IdleSlot {
    pub fn new(gpu: &GpuState, policy: &Policy, seat: Seat) -> IdleSlot {
        let n = u32::from(policy.offline_per_gpu);
        let ceiling = u64::from(offline_sm_percent(policy, Some(0)));
        IdleSlot {
            room_mib: offline_part(idle_room_mib(gpu, policy), seat.slots, n),
            share: offline_part(ceiling, seat.slots, n) as f64 / 100.0,
            budget: ceiling as f64 / 100.0,
            offline_jobs: seat.offline_jobs,
        }
    }
}

/// A candidate slot's terms: next to an online job, or on an idle GPU.
pub(super) enum Side<G> {
    Shared(G),
    Idle(IdleSlot),
}

/// Columns grouped by what a job's value there reads
/// ([`Predictor::column_key`], with their side and idle slot): a job's
/// value is computed once per class, on first use, and looked up for every
/// other column of the class. In the replay's default week a round's open
/// GPUs (about 1,250 on average) fall into about 400 classes (services
/// repeat, idle GPUs are alike; the learned model's terms hold each
/// service's memory room, which splits them further); in the daemon bench
/// the 3,600 idle GPUs are one class and every online GPU its own.
#[derive(Default)]
pub(super) struct ColumnClasses {
    /// Column -> class (`u32::MAX`: scored on its own).
    of: Vec<u32>,
    /// Each class's first column.
    first: Vec<u32>,
    /// Per job, its quantized value in each class.
    rows: Vec<std::sync::OnceLock<Box<[Option<i64>]>>>,
}

/// A multiply-rotate hash of words (FxHash's step): the class map hashes
/// each open column's key every round, where SipHash cost more than the
/// lookups it serves. Not for keys an outsider chooses.
#[derive(Default, Clone, Copy)]
struct WordHash;

#[derive(Default)]
struct WordHasher(u64);

impl std::hash::BuildHasher for WordHash {
    type Hasher = WordHasher;
    fn build_hasher(&self) -> WordHasher {
        WordHasher::default()
    }
}

impl std::hash::Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.write_u64(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        for &b in words.remainder() {
            self.write_u64(u64::from(b));
        }
    }
}

impl ColumnClasses {
    /// `key(c, terms, key)`: [`Predictor::column_key`] of column c. A
    /// class of one column is none: scored on its own, it costs no row
    /// entry where a job's row is only partly scanned.
    fn of<G>(
        jobs: usize,
        whole: &[Side<G>],
        key: impl Fn(usize, &Side<G>, &mut Vec<u64>) -> bool,
    ) -> ColumnClasses {
        let mut ids: std::collections::HashMap<Vec<u64>, u32, WordHash> =
            std::collections::HashMap::with_capacity_and_hasher(whole.len() / 4, WordHash);
        let mut of = vec![u32::MAX; whole.len()];
        let mut first = Vec::new();
        let mut words = Vec::new();
        for (c, terms) in whole.iter().enumerate() {
            words.clear();
            match terms {
                Side::Shared(_) => words.push(0),
                Side::Idle(s) => words.extend([
                    1,
                    s.room_mib,
                    s.share.to_bits(),
                    s.budget.to_bits(),
                    u64::from(s.offline_jobs),
                ]),
            }
            if !key(c, terms, &mut words) {
                continue;
            }
            let next = first.len() as u32;
            let k = match ids.get(&words[..]) {
                Some(&k) => k,
                None => {
                    ids.insert(words.clone(), next);
                    first.push(c as u32);
                    next
                }
            };
            of[c] = k;
        }
        let mut members = vec![0u32; first.len()];
        for &k in of.iter().filter(|&&k| k != u32::MAX) {
            members[k as usize] += 1;
        }
        let mut id = vec![u32::MAX; first.len()];
        let mut shared = Vec::new();
        for (k, &c) in first.iter().enumerate() {
            if members[k] > 1 {
                id[k] = shared.len() as u32;
                shared.push(c);
            }
        }
        for k in of.iter_mut().filter(|k| **k != u32::MAX) {
            *k = id[*k as usize];
        }
        let first = shared;
        ColumnClasses {
            of,
            rows: (0..if first.is_empty() { 0 } else { jobs })
                .map(|_| Default::default())
                .collect(),
            first,
        }
    }

    /// Most columns are in a class: a pair's value is a lookup.
    pub(super) fn scored_once(&self) -> bool {
        self.of.iter().filter(|&&k| k != u32::MAX).count() * 2 > self.of.len()
    }

    /// Job j's value on column c; `at(c)` computes it on a column.
    #[inline]
    fn value(&self, j: usize, c: usize, at: impl Fn(usize) -> Option<i64>) -> Option<i64> {
        match self.of[c] {
            u32::MAX => at(c),
            k => self.rows[j].get_or_init(|| self.first.iter().map(|&c| at(c as usize)).collect())
                [k as usize],
        }
    }
}

impl<P: Predictor> Round<'_, P> {
    /// Column c's GPU.
    #[inline]
    pub(super) fn gpu_of(&self, c: usize) -> &GpuState {
        &self.state.gpus[self.open[c]]
    }

    /// Whether column c's node has the CPUs and memory job j asked for
    /// free (or its room is not known).
    pub(super) fn room_for(&self, j: usize, c: usize) -> bool {
        self.col_room[c].is_none_or(|r| r.holds(&self.jobs[j].need, true))
    }

    /// Column c's terms for a job in `seat` there.
    pub(super) fn side(&self, c: usize, seat: Seat) -> Side<P::Gpu> {
        let gpu = self.gpu_of(c);
        if gpu.online_jobs.is_empty() {
            Side::Idle(IdleSlot::new(gpu, self.policy, seat))
        } else {
            Side::Shared(self.model.gpu_terms(gpu, self.policy, seat))
        }
    }

    /// Job j's shown speed (mean, sd) on column c with these terms.
    pub(super) fn estimate_at(
        &self,
        j: usize,
        c: usize,
        terms: &Side<P::Gpu>,
    ) -> Option<(f64, f64)> {
        match terms {
            Side::Shared(gpu) => self.model.estimate(&self.job_terms[j].0, gpu),
            Side::Idle(slot) => self.model.solo(&self.job_terms[j].0, self.gpu_of(c), slot),
        }
    }

    /// What the matching maximizes for job j on column c with these terms.
    #[inline]
    pub(super) fn value(&self, j: usize, c: usize, terms: &Side<P::Gpu>) -> Option<f64> {
        let (job, slot_gpus) = &self.job_terms[j];
        let gpu = self.gpu_of(c);
        // Slurm 22.05 cannot move a job's typed slots to other GPU indices.
        if !slot_gpus.is_empty() && !slot_gpus.contains(&gpu.index) {
            return None;
        }
        if !self.room_for(j, c) {
            return None;
        }
        // A daemon serving one user at a time would queue this job's
        // clients behind another user's; the site may allow fewer pairs.
        if !gpu.admits(&self.owners[j], self.policy.co_locate) {
            return None;
        }
        match terms {
            Side::Shared(gpu) => self.model.predict(job, gpu),
            Side::Idle(slot) => self
                .model
                .solo(job, gpu, slot)
                .map(|(mean, _)| mean - IDLE_TIE_BREAK),
        }
    }

    /// Job j's quantized value on column c taking all its free slots, once
    /// per column class.
    #[inline]
    pub(super) fn score(&self, j: u32, c: u32) -> Option<i64> {
        let (j, c) = (j as usize, c as usize);
        self.classes.value(j, c, |c| {
            self.value(j, c, &self.whole[c]).and_then(quantize)
        })
    }

    /// [`Round::score`] for 1-GPU jobs; none for a gang's.
    #[inline]
    pub(super) fn alone(&self, j: u32, c: u32) -> Option<i64> {
        (!self.is_gang[j as usize])
            .then(|| self.score(j, c))
            .flatten()
    }

    /// The columns' classes. A column's class keys what [`Round::value`]
    /// reads beside the predictor: its node's room, its index where a job
    /// names its slots' GPUs, and no one running there (else whose jobs
    /// run there decides: no class).
    pub(super) fn column_classes(&self) -> ColumnClasses {
        let any_slot_gpus = self.jobs.iter().any(|j| !j.slot_gpus.is_empty());
        ColumnClasses::of(self.jobs.len(), &self.whole, |c, terms, key| {
            let (at, gpu) = (self.open[c], self.gpu_of(c));
            if !gpu.owners.is_empty() {
                return false;
            }
            match self.col_room[c] {
                Some(r) => key.extend([1, u64::from(r.cpus), r.mem_mib]),
                None => key.push(0),
            }
            if any_slot_gpus {
                key.push(u64::from(gpu.index));
            }
            match terms {
                Side::Shared(t) => self.model.column_key(at, gpu, Some(t), key),
                Side::Idle(_) => self.model.column_key(at, gpu, None, key),
            }
        })
    }

    /// Why job j has no candidate, when only who runs there keeps it off
    /// GPUs it fits: a one-user MPS daemon, else the site's co_locate rule.
    pub(super) fn barred(&self, j: usize) -> Option<Waiting> {
        let fits = |c: usize| {
            let gpu = self.gpu_of(c);
            (self.job_terms[j].1.is_empty() || self.job_terms[j].1.contains(&gpu.index))
                && self.room_for(j, c)
        };
        let owner = &self.owners[j];
        let by_daemon =
            (0..self.cols()).any(|c| fits(c) && self.gpu_of(c).one_user_daemon_bars(owner));
        let by_rule = (0..self.cols())
            .any(|c| fits(c) && !self.gpu_of(c).admits(owner, self.policy.co_locate));
        match (by_daemon, by_rule) {
            (true, _) => Some(Waiting::SameUserOnly),
            (false, true) => Some(Waiting::CoLocateRule),
            _ => None,
        }
    }
}
