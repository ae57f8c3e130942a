//! Synthetic clusters for tests and the bench, deterministic by seed.
//!
//! A cluster is GPUs of a few models, each running an online service of some
//! kind (SM activity, memory), and pending offline jobs of a few kinds (SM
//! demand, memory). The stand-in for the predictor gives the normalized
//! offline throughput of job `j` on GPU `g`:
//!
//! ```text
//! base(kind, model, online) = speed(model) · min(1, (1 − sm(online)) / demand(kind))
//!                                          · (1 − 0.3 · sm(online))
//! w(j, g) = base · job_factor(j) · gpu_factor(g) · (1 ± 3% noise(j, g))
//! ```
//!
//! capped at 1.0, and absent (infeasible) when the GPU is unhealthy (5%), its
//! offline slot is taken (10%), or job memory + online memory + 2 GB headroom
//! exceeds the GPU's memory. That is the "job factor times GPU factor plus
//! noise" shape that makes dense Kuhn–Munkres slow. `Uniform` mode keeps the
//! health/slot filter and draws every feasible weight uniformly from (0, 1].
//! Per-pair values are hashes of (seed, job, GPU): the dense weight matrix is
//! never stored, a pair costs a few nanoseconds to score.

use rand::distributions::{Distribution, WeightedIndex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::exact::{RowScan, Scores};
#[cfg(test)]
use crate::prune::spread_scored;
use crate::prune::{prune_scored, spread_grouped};
use crate::solver::Edge;
use crate::weights::quantize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightMode {
    Structured,
    Uniform,
}

pub struct GpuModel {
    pub name: &'static str,
    /// Offline speed alone on the GPU, relative to the fastest model.
    pub speed: f64,
    pub mem_gb: f64,
    pub share: f64,
}

pub struct OnlineKind {
    pub name: &'static str,
    pub sm_activity: f64,
    pub mem_gb: f64,
    pub share: f64,
}

pub struct OfflineKind {
    pub name: &'static str,
    pub sm_demand: f64,
    pub mem_gb: f64,
    pub share: f64,
}

pub const GPU_MODELS: [GpuModel; 4] = [
    GpuModel {
        name: "H100",
        speed: 1.0,
        mem_gb: 80.0,
        share: 0.20,
    },
    GpuModel {
        name: "A100",
        speed: 0.60,
        mem_gb: 80.0,
        share: 0.45,
    },
    GpuModel {
        name: "L40",
        speed: 0.42,
        mem_gb: 48.0,
        share: 0.20,
    },
    GpuModel {
        name: "A10",
        speed: 0.22,
        mem_gb: 24.0,
        share: 0.15,
    },
];

pub const ONLINE_KINDS: [OnlineKind; 4] = [
    OnlineKind {
        name: "search-embedding",
        sm_activity: 0.12,
        mem_gb: 8.0,
        share: 0.30,
    },
    OnlineKind {
        name: "ads-ranking",
        sm_activity: 0.25,
        mem_gb: 18.0,
        share: 0.30,
    },
    OnlineKind {
        name: "llm-serving",
        sm_activity: 0.45,
        mem_gb: 40.0,
        share: 0.20,
    },
    OnlineKind {
        name: "video-ocr",
        sm_activity: 0.60,
        mem_gb: 12.0,
        share: 0.20,
    },
];

pub const OFFLINE_KINDS: [OfflineKind; 5] = [
    OfflineKind {
        name: "cv-train",
        sm_demand: 0.35,
        mem_gb: 10.0,
        share: 0.30,
    },
    OfflineKind {
        name: "bert-finetune",
        sm_demand: 0.55,
        mem_gb: 22.0,
        share: 0.25,
    },
    OfflineKind {
        name: "recsys-train",
        sm_demand: 0.45,
        mem_gb: 16.0,
        share: 0.20,
    },
    OfflineKind {
        name: "llm-lora",
        sm_demand: 0.85,
        mem_gb: 34.0,
        share: 0.15,
    },
    OfflineKind {
        name: "rl-rollout",
        sm_demand: 0.25,
        mem_gb: 6.0,
        share: 0.10,
    },
];

const CLASSES: usize = GPU_MODELS.len() * ONLINE_KINDS.len();
const NOISE: f64 = 0.03;
const UNHEALTHY: f64 = 0.05;
const SLOT_TAKEN: f64 = 0.10;
const MEM_HEADROOM_GB: f64 = 2.0;

#[derive(Debug, Clone, Copy)]
pub struct Gpu {
    pub model: u8,
    pub online: u8,
    pub healthy: bool,
    pub slot_free: bool,
    pub factor: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub kind: u8,
    pub factor: f64,
}

pub struct Cluster {
    pub mode: WeightMode,
    pub seed: u64,
    pub gpus: Vec<Gpu>,
    pub jobs: Vec<Job>,
    /// Per GPU: its class (model × online kind), or `u8::MAX` when it cannot
    /// take an offline job at all (unhealthy, slot taken).
    eligible_class: Vec<u8>,
    /// `base[kind][class]`, 0.0 where the job does not fit.
    base: Vec<[f64; CLASSES]>,
    /// Pricing groups ([`Scores::groups`]): per GPU, its class × a band of
    /// its factor (`u32::MAX` when not eligible), and per group the largest
    /// factor in it.
    group_of: Vec<u32>,
    group_factor: Vec<f64>,
    /// Per class its eligible GPUs, increasing, and their factors (row
    /// scans, [`Scores::scan_row`]).
    class_gpus: Vec<Vec<u32>>,
    class_factor: Vec<Vec<f64>>,
}

/// Bands of the GPU factor per class for pricing groups: narrower bands
/// give tighter bounds, more groups cost more checks per job.
const FACTOR_BANDS: usize = 16;

/// Draws an index with probability proportional to `shares`.
fn pick(rng: &mut ChaCha8Rng, shares: &[f64]) -> u8 {
    WeightedIndex::new(shares).map_or(0, |d| d.sample(rng) as u8)
}

/// SplitMix64's finalizer as a stateless hash: a pair's noise is a function
/// of (seed, job, GPU), so any pair can be scored in any order without
/// storing the weight matrix (an RNG stream could not do that).
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) from (seed, job, GPU).
#[inline]
fn pair_unit(seed: u64, j: u32, g: u32) -> f64 {
    let h = mix(seed ^ ((j as u64) << 32 | g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl Cluster {
    pub fn generate(gpus: usize, jobs: usize, seed: u64, mode: WeightMode) -> Cluster {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let model_shares: Vec<f64> = GPU_MODELS.iter().map(|m| m.share).collect();
        let online_shares: Vec<f64> = ONLINE_KINDS.iter().map(|k| k.share).collect();
        let kind_shares: Vec<f64> = OFFLINE_KINDS.iter().map(|k| k.share).collect();
        let gpus: Vec<Gpu> = (0..gpus)
            .map(|_| Gpu {
                model: pick(&mut rng, &model_shares),
                online: pick(&mut rng, &online_shares),
                healthy: rng.gen::<f64>() >= UNHEALTHY,
                slot_free: rng.gen::<f64>() >= SLOT_TAKEN,
                factor: 0.85 + 0.15 * rng.gen::<f64>(),
            })
            .collect();
        let jobs: Vec<Job> = (0..jobs)
            .map(|_| Job {
                kind: pick(&mut rng, &kind_shares),
                factor: 0.8 + 0.2 * rng.gen::<f64>(),
            })
            .collect();
        let base = OFFLINE_KINDS
            .iter()
            .map(|kind| {
                let mut row = [0.0; CLASSES];
                for (m, model) in GPU_MODELS.iter().enumerate() {
                    for (o, online) in ONLINE_KINDS.iter().enumerate() {
                        let fits = kind.mem_gb + online.mem_gb + MEM_HEADROOM_GB <= model.mem_gb;
                        if fits {
                            let share = ((1.0 - online.sm_activity) / kind.sm_demand).min(1.0);
                            row[m * ONLINE_KINDS.len() + o] =
                                model.speed * share * (1.0 - 0.3 * online.sm_activity);
                        }
                    }
                }
                row
            })
            .collect();
        let mut c = Cluster {
            mode,
            seed,
            gpus,
            jobs,
            eligible_class: Vec::new(),
            base,
            group_of: Vec::new(),
            group_factor: Vec::new(),
            class_gpus: Vec::new(),
            class_factor: Vec::new(),
        };
        c.regroup();
        c
    }

    /// Recomputes the pricing groups (after changing `gpus` or `jobs`).
    pub fn regroup(&mut self) {
        self.eligible_class = self
            .gpus
            .iter()
            .map(|g| {
                if g.healthy && g.slot_free {
                    g.model * ONLINE_KINDS.len() as u8 + g.online
                } else {
                    u8::MAX
                }
            })
            .collect();
        self.class_gpus = vec![Vec::new(); CLASSES];
        self.class_factor = vec![Vec::new(); CLASSES];
        for (g, &c) in self.eligible_class.iter().enumerate() {
            if c != u8::MAX {
                self.class_gpus[c as usize].push(g as u32);
                self.class_factor[c as usize].push(self.gpus[g].factor);
            }
        }
        self.group_factor = vec![0.0; CLASSES * FACTOR_BANDS];
        self.group_of = (0..self.gpus.len())
            .map(|g| {
                let class = self.eligible_class[g];
                if class == u8::MAX {
                    return u32::MAX;
                }
                let f = self.gpus[g].factor;
                let band =
                    (((f - 0.85) / 0.15 * FACTOR_BANDS as f64) as usize).min(FACTOR_BANDS - 1);
                let group = class as usize * FACTOR_BANDS + band;
                self.group_factor[group] = self.group_factor[group].max(f);
                group as u32
            })
            .collect();
    }

    /// Predicted normalized throughput of job `j` on GPU `g`; `None` when the
    /// pair is infeasible.
    #[inline]
    pub fn throughput(&self, j: u32, g: u32) -> Option<f64> {
        let class = self.eligible_class[g as usize];
        if class == u8::MAX {
            return None;
        }
        let u = pair_unit(self.seed, j, g);
        match self.mode {
            // 1 − u is in (0, 1].
            WeightMode::Uniform => Some(1.0 - u),
            WeightMode::Structured => {
                let job = self.jobs[j as usize];
                let b = self.base[job.kind as usize][class as usize];
                if b == 0.0 {
                    return None;
                }
                let w =
                    b * job.factor * self.gpus[g as usize].factor * (1.0 + NOISE * (2.0 * u - 1.0));
                Some(w.min(1.0))
            }
        }
    }

    /// Job `j`'s throughput on GPU `g` holding `part` (0..=1) of its
    /// offline SMs and memory room (sized slots, issue 15): the SM limit
    /// `min(1, part · (1 − sm(online)) / demand)` in place of the whole
    /// GPU's; `None` when its memory does not fit its part of the room.
    pub fn throughput_part(&self, j: u32, g: u32, part: f64) -> Option<f64> {
        let whole = self.throughput(j, g)?;
        if part >= 1.0 {
            return Some(whole);
        }
        match self.mode {
            WeightMode::Uniform => Some(whole * part),
            WeightMode::Structured => {
                let kind = &OFFLINE_KINDS[self.jobs[j as usize].kind as usize];
                let gpu = self.gpus[g as usize];
                let model = &GPU_MODELS[gpu.model as usize];
                let online = &ONLINE_KINDS[gpu.online as usize];
                if kind.mem_gb > part * (model.mem_gb - online.mem_gb - MEM_HEADROOM_GB) {
                    return None;
                }
                let free = 1.0 - online.sm_activity;
                let limit = |p: f64| (p * free / kind.sm_demand).min(1.0);
                Some(whole * limit(part) / limit(1.0))
            }
        }
    }

    /// Integer weight of a pair (see [`crate::weights`]).
    #[inline]
    pub fn weight(&self, j: u32, g: u32) -> Option<i64> {
        self.throughput(j, g).and_then(quantize)
    }

    /// The production candidate graph ([`crate::prune::spread_scored`], found through
    /// the pricing groups: [`spread_grouped`]).
    pub fn candidates(&self, k: usize, threads: usize) -> Vec<Edge> {
        spread_grouped(self, k, threads)
    }

    /// The old rule, each job's best `k` only (for comparison).
    pub fn top_k_candidates(&self, k: usize, threads: usize) -> Vec<Edge> {
        prune_scored(self.jobs.len(), self.gpus.len(), k, threads, |j, g| {
            self.weight(j, g)
        })
    }

    /// All feasible edges (tests and small instances only: |J|·|G| of them).
    pub fn all_edges(&self) -> Vec<Edge> {
        let mut out = Vec::new();
        for j in 0..self.jobs.len() as u32 {
            for g in 0..self.gpus.len() as u32 {
                if let Some(weight) = self.weight(j, g) {
                    out.push(Edge {
                        job: j,
                        gpu: g,
                        weight,
                    });
                }
            }
        }
        out
    }

    /// An upper bound on the maximum-weight matching of the *full* feasible
    /// graph (every pair, no pruning), from a solution's duals on the pruned
    /// graph: raising each job's dual to its best profit `w − price` over all
    /// feasible GPUs makes the duals feasible for the full graph. Returns the
    /// bound and how many jobs needed raising (they have a better GPU
    /// outside their candidates at the current prices).
    pub fn full_graph_bound(&self, duals: &crate::solver::Duals, threads: usize) -> (i128, usize) {
        let rows: Vec<u32> = (0..self.jobs.len() as u32).collect();
        let raised = crate::exact::parallel(&rows, threads, self.gpus.len(), |chunk| {
            let (mut sum, mut count) = (0i128, 0usize);
            for &j in chunk {
                let mut best = duals.job[j as usize];
                for g in 0..self.gpus.len() {
                    if let Some(w) = self.weight(j, g as u32) {
                        best = best.max(w - duals.gpu[g]);
                    }
                }
                if best > duals.job[j as usize] {
                    count += 1;
                }
                sum += best as i128;
            }
            (sum, count)
        });
        let gpu_sum: i128 = duals.gpu.iter().map(|&p| p as i128).sum();
        raised
            .iter()
            .fold((gpu_sum, 0), |(s, c), &(rs, rc)| (s + rs, c + rc))
    }

    /// The certificate's own cost: every row priced once at `duals` the way
    /// pricing does ([`Scores::scan_row`]: a bound first, the weight only
    /// where the bound beats the job's dual). Returns the pairs it found
    /// violated and the pairs it scored. No exact round can check its
    /// duals over every pair for less with these bounds.
    pub fn certificate_pass(&self, duals: &crate::solver::Duals, threads: usize) -> (u64, u64) {
        let rows: Vec<u32> = (0..self.jobs.len() as u32).collect();
        crate::exact::parallel(&rows, threads, self.gpus.len(), |chunk| {
            let (mut violated, mut scored) = (0u64, 0u64);
            for &j in chunk {
                let floor = duals.job[j as usize];
                scored += self
                    .scan_row(j, &duals.gpu, floor, &mut |_, _| violated += 1)
                    .scored;
            }
            (violated, scored)
        })
        .into_iter()
        .fold((0, 0), |(v, n), (a, b)| (v + a, n + b))
    }

    /// A new offline job in slot `j` (the old one ended), drawn from `rng`.
    pub fn replace_job(&mut self, j: usize, rng: &mut ChaCha8Rng) {
        let kind_shares: Vec<f64> = OFFLINE_KINDS.iter().map(|k| k.share).collect();
        self.jobs[j] = Job {
            kind: pick(rng, &kind_shares),
            factor: 0.8 + 0.2 * rng.gen::<f64>(),
        };
    }

    /// GPU `g` turns unhealthy, or healthy again. Call [`Cluster::regroup`]
    /// after a batch of changes.
    pub fn toggle_health(&mut self, g: usize) {
        self.gpus[g].healthy = !self.gpus[g].healthy;
    }

    /// How many (job, GPU) pairs are feasible (counted by class, no pair
    /// scored).
    pub fn feasible_pairs(&self) -> u64 {
        let eligible = self.eligible_gpus() as u64;
        self.jobs
            .iter()
            .map(|j| match self.mode {
                WeightMode::Uniform => eligible,
                WeightMode::Structured => (0..CLASSES)
                    .filter(|&c| self.base[j.kind as usize][c] != 0.0)
                    .map(|c| self.class_gpus[c].len() as u64)
                    .sum(),
            })
            .sum()
    }

    pub fn eligible_gpus(&self) -> usize {
        self.eligible_class
            .iter()
            .filter(|&&c| c != u8::MAX)
            .count()
    }
}

impl Scores for Cluster {
    fn jobs(&self) -> usize {
        self.jobs.len()
    }
    fn gpus(&self) -> usize {
        self.gpus.len()
    }
    #[inline]
    fn weight(&self, job: u32, gpu: u32) -> Option<i64> {
        Cluster::weight(self, job, gpu)
    }
    fn groups(&self) -> Option<(&[u32], usize)> {
        Some((&self.group_of, self.group_factor.len()))
    }
    /// The pair's weight at the largest noise, multiplied in the order
    /// [`Cluster::throughput`] does (rounding is monotone), plus one unit.
    #[inline]
    fn pair_bound(&self, job: u32, gpu: u32) -> Option<i64> {
        let class = self.eligible_class[gpu as usize];
        if class == u8::MAX {
            return None;
        }
        match self.mode {
            WeightMode::Uniform => quantize(1.0),
            WeightMode::Structured => {
                let job = self.jobs[job as usize];
                let b = self.base[job.kind as usize][class as usize];
                if b == 0.0 {
                    return None;
                }
                let w = b * job.factor * self.gpus[gpu as usize].factor * (1.0 + NOISE);
                quantize(w.min(1.0)).map(|w| w + 1)
            }
        }
    }
    /// Class by class, a float bound per GPU (the largest noise; the
    /// rounding error of a different multiplication order is far below
    /// the unit of margin) rules out most GPUs before any pair is hashed.
    fn scan_row(
        &self,
        job: u32,
        price: &[i64],
        floor: i64,
        visit: &mut dyn FnMut(u32, i64),
    ) -> RowScan {
        let mut r = RowScan::NOTHING;
        if self.mode == WeightMode::Uniform {
            // No shape to use: every eligible pair is scored.
            for gpus in &self.class_gpus {
                for &g in gpus {
                    let w = Cluster::weight(self, job, g);
                    r.offer(g, w, price[g as usize], floor, visit);
                }
            }
            return r;
        }
        let jb = self.jobs[job as usize];
        for (c, (gpus, factors)) in self.class_gpus.iter().zip(&self.class_factor).enumerate() {
            let b = self.base[jb.kind as usize][c];
            if b == 0.0 {
                continue;
            }
            let coef = b * jb.factor * (1.0 + NOISE) * crate::weights::SCALE;
            for (&g, &f) in gpus.iter().zip(factors) {
                let p = price[g as usize];
                // ≥ the quantized weight: quantize adds ½ and truncates.
                let ub = ((coef * f).min(crate::weights::SCALE) + 1.0) as i64 - p;
                if ub <= floor {
                    r.bound = r.bound.max(ub);
                    continue;
                }
                r.offer(g, Cluster::weight(self, job, g), p, floor, visit);
            }
        }
        r
    }
    /// The group's largest GPU factor and the largest noise, multiplied in
    /// the order [`Cluster::throughput`] does (rounding is monotone, so the
    /// bound is never below a member's weight), plus one unit of margin.
    fn group_bound(&self, job: u32, group: u32) -> Option<i64> {
        match self.mode {
            WeightMode::Uniform => quantize(1.0),
            WeightMode::Structured => {
                let class = group as usize / FACTOR_BANDS;
                let job = self.jobs[job as usize];
                let b = self.base[job.kind as usize][class];
                if b == 0.0 {
                    return None;
                }
                let w = b * job.factor * self.group_factor[group as usize] * (1.0 + NOISE);
                quantize(w.min(1.0)).map(|w| w + 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_by_seed_and_in_range() {
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            let a = Cluster::generate(50, 30, 7, mode).all_edges();
            let b = Cluster::generate(50, 30, 7, mode).all_edges();
            let c = Cluster::generate(50, 30, 8, mode).all_edges();
            assert_eq!(a, b);
            assert_ne!(a, c);
            assert!(!a.is_empty());
            assert!(a.iter().all(|e| e.weight > 0 && e.weight <= 1_000_000));
        }
    }

    /// Pricing skips pairs on these bounds, so a bound below a weight
    /// would lose the optimum without a trace.
    #[test]
    fn pair_and_group_bounds_are_upper_bounds() {
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            let c = Cluster::generate(300, 120, 11, mode);
            let (group_of, _) = c.groups().unwrap();
            for j in 0..120u32 {
                for g in 0..300u32 {
                    let pair = Scores::pair_bound(&c, j, g);
                    match c.weight(j, g) {
                        None => continue,
                        Some(w) => {
                            assert!(pair.is_some_and(|b| b >= w), "({j},{g}): {pair:?} < {w}")
                        }
                    }
                    let group = c.group_bound(j, group_of[g as usize]);
                    assert!(group >= pair, "({j},{g}): group {group:?} < pair {pair:?}");
                }
            }
        }
    }

    /// The grouped search skips pairs on bounds; the graph must be the
    /// one a full scan builds, ties and capacity split included.
    #[test]
    fn grouped_candidates_equal_the_full_scan() {
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            for (gpus, jobs, seed, k) in [(300, 200, 1, 4), (500, 700, 2, 16), (90, 40, 3, 8)] {
                let c = Cluster::generate(gpus, jobs, seed, mode);
                for threads in [1, 2, 3] {
                    let full = spread_scored(jobs, gpus, k, threads, |j, g| c.weight(j, g));
                    assert_eq!(
                        c.candidates(k, threads),
                        full,
                        "{mode:?} {gpus}x{jobs} k={k} threads={threads}"
                    );
                }
            }
        }
    }

    /// Pricing trusts the row scan: it must visit exactly the pairs above
    /// the floor and bound every other one, as the trait's plain scan does.
    #[test]
    fn fast_row_scan_equals_the_plain_scan() {
        use crate::exact::FnScores;
        use rand::{Rng, SeedableRng};
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            let c = Cluster::generate(400, 60, 9, mode);
            // The trait's default scan_row (no pair bound: scores all).
            let plain = FnScores {
                jobs: 60,
                gpus: 400,
                score: |j, g| c.weight(j, g),
            };
            for round in 0..40 {
                let price: Vec<i64> = (0..400)
                    .map(|_| match round % 3 {
                        0 => 0,
                        1 => rng.gen_range(0..600_000),
                        _ => rng.gen_range(0..60_000) * 10,
                    })
                    .collect();
                for j in 0..60u32 {
                    let floor = rng.gen_range(-100_000..700_000);
                    let (mut fast, mut want) = (Vec::new(), Vec::new());
                    let r = c.scan_row(j, &price, floor, &mut |g, w| fast.push((g, w)));
                    plain.scan_row(j, &price, floor, &mut |g, w| want.push((g, w)));
                    fast.sort_unstable();
                    assert_eq!(fast, want, "{mode:?} job {j} floor {floor}");
                    // Every pair not visited is within the bound, which is
                    // at most the floor.
                    let worst = (0..400u32)
                        .filter(|g| !fast.iter().any(|v| v.0 == *g))
                        .filter_map(|g| Some(c.weight(j, g)? - price[g as usize]))
                        .max();
                    if let Some(worst) = worst {
                        assert!(worst <= r.bound && r.bound <= floor, "{worst} {r:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn certificate_pass_finds_what_a_full_scan_finds() {
        for mode in [WeightMode::Structured, WeightMode::Uniform] {
            let c = Cluster::generate(300, 120, 5, mode);
            let feasible = (0..120u32)
                .flat_map(|j| (0..300u32).map(move |g| (j, g)))
                .filter(|&(j, g)| c.weight(j, g).is_some())
                .count() as u64;
            assert_eq!(c.feasible_pairs(), feasible);
            // The candidate graph's duals leave pairs outside it violated;
            // the bounded pass finds as many as scoring every pair does.
            let edges = c.candidates(4, 2);
            let sol = crate::solver::solve_with(120, 300, &edges, &Default::default()).unwrap();
            let d = &sol.duals;
            let violated = (0..120u32)
                .flat_map(|j| (0..300u32).map(move |g| (j, g)))
                .filter(|&(j, g)| {
                    c.weight(j, g)
                        .is_some_and(|w| w - d.gpu[g as usize] > d.job[j as usize])
                })
                .count() as u64;
            let (found, scored) = c.certificate_pass(d, 2);
            assert_eq!(found, violated, "{mode:?}");
            assert!(scored <= feasible, "{mode:?}: {scored} of {feasible}");
            if mode == WeightMode::Structured {
                assert!(violated > 0, "the candidate graph misses nothing here");
            }
        }
    }

    #[test]
    fn structured_excludes_memory_misfits() {
        let c = Cluster::generate(400, 100, 1, WeightMode::Structured);
        // llm-lora (34 GB) never fits an A10 (24 GB).
        let lora = OFFLINE_KINDS
            .iter()
            .position(|k| k.name == "llm-lora")
            .unwrap() as u8;
        let a10 = GPU_MODELS.iter().position(|m| m.name == "A10").unwrap() as u8;
        for (j, job) in c.jobs.iter().enumerate() {
            for (g, gpu) in c.gpus.iter().enumerate() {
                if job.kind == lora && gpu.model == a10 {
                    assert_eq!(c.weight(j as u32, g as u32), None);
                }
                if !gpu.healthy || !gpu.slot_free {
                    assert_eq!(c.weight(j as u32, g as u32), None);
                }
            }
        }
    }
}
