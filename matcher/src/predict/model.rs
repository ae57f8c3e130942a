//! The completed job × partner matrix ([`Model`]): side features, biases and
//! rank-1 factors fitted by alternating ridge, with each prediction's
//! confidence.

use super::*;

/// The baseline: half the SMs needed, speed proportional to the share up to that.
pub fn default_prediction(share: f64) -> f64 {
    (share / DEFAULT_DEMAND).clamp(0.01, 1.0)
}

/// A job's launch rate as a feature in [0, 1]: log10 of launches/s over 5
/// (1/s → 0, 100,000/s → 1); [`DEFAULT_RATE`] when unknown.
pub fn rate_feature(launches_per_s: Option<f64>) -> f64 {
    launches_per_s
        .filter(|r| r.is_finite() && *r > 0.0)
        .map_or(DEFAULT_RATE, |r| (r.log10() / 5.0).clamp(0.0, 1.0))
}

pub(super) fn features(share: f64, mem: f64, rate: f64) -> [f64; FEATURES] {
    [
        1.0,
        share,
        share * share,
        mem,
        share * mem,
        rate,
        share * rate,
    ]
}

/// Weighted ridge regression of the pairs' `x` on their first `used`
/// features (the others' coefficients are 0): `(XᵀWX + λI) b = XᵀWy`.
pub(super) fn ridge(pairs: &[&PairObs], used: usize) -> Option<[f64; FEATURES]> {
    let w = |p: &PairObs| p.runs as f64 / (p.runs as f64 + 1.0);
    let mut a = SMatrix::<f64, FEATURES, FEATURES>::identity() * (RIDGE * pairs.len() as f64);
    let mut v = SVector::<f64, FEATURES>::zeros();
    for p in pairs {
        let mut f = features(p.share, p.mem, p.rate);
        f[used..].iter_mut().for_each(|x| *x = 0.0);
        let x = SVector::<f64, FEATURES>::from(f);
        a += x * x.transpose() * w(p);
        v += x * (p.x * w(p));
    }
    a.cholesky()
        .map(|c| c.solve(&v))
        .filter(|b| b.iter().all(|x| x.is_finite()))
        .map(<[f64; FEATURES]>::from)
}

/// How many features the regression uses: all of them only where the
/// launch rate lowers the error on held-out folds of the pairs by more than
/// one standard error of that difference (the one-standard-error rule: an
/// uninformative feature's chance gains on a few pairs do not count).
pub(super) fn choose_features(pairs: &[PairObs]) -> usize {
    if pairs.len() < 2 * FOLDS {
        return BASE_FEATURES;
    }
    // Squared held-out error of each pair under `used` features.
    let cv = |used: usize| -> Option<Vec<f64>> {
        let mut err = vec![0.0; pairs.len()];
        for fold in 0..FOLDS {
            let train: Vec<&PairObs> = pairs
                .iter()
                .enumerate()
                .filter(|(i, _)| i % FOLDS != fold)
                .map(|(_, p)| p)
                .collect();
            let c = ridge(&train, used)?;
            for (i, p) in pairs.iter().enumerate().skip(fold).step_by(FOLDS) {
                let f = features(p.share, p.mem, p.rate);
                let y: f64 = f.iter().zip(&c).map(|(x, b)| x * b).sum();
                err[i] = (y - p.x).powi(2);
            }
        }
        Some(err)
    };
    let (Some(base), Some(all)) = (cv(BASE_FEATURES), cv(FEATURES)) else {
        return BASE_FEATURES;
    };
    let gain: Vec<f64> = base.iter().zip(&all).map(|(b, a)| b - a).collect();
    let n = gain.len() as f64;
    let mean = gain.iter().sum::<f64>() / n;
    let var = gain.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (n - 1.0);
    if mean > (var / n).sqrt() {
        FEATURES
    } else {
        BASE_FEATURES
    }
}

/// A prediction: normalized throughput if the pair runs, its standard
/// deviation, and the chance that the pair cannot co-locate (untried pairs:
/// from how often the job's and the partner's other pairs failed for
/// memory).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub mean: f64,
    pub sd: f64,
    pub p_fail: f64,
}

impl Estimate {
    /// What the matcher maximizes: the expected throughput with bounded
    /// optimism.
    /// The bonus may lift it above 1: clamped at 1, a pair predicted near 1
    /// would tie with every untried one, and exploration would stop where
    /// the predictions are best.
    pub fn weight(&self) -> f64 {
        ((1.0 - self.p_fail) * self.mean + (EXPLORE_SD * self.sd).min(EXPLORE_MAX))
            .clamp(0.01, 1.0 + EXPLORE_MAX)
    }
}

/// The model's indices of an [`Estimates`]' pairs and infeasible pairs, in
/// their order.
pub(super) struct SeenIds {
    pub(super) pairs: Vec<(u32, u32)>,
    pub(super) infeasible: Vec<(u32, u32)>,
}

/// `k`'s index in `index`, the next one where it is new (the key cloned
/// only then).
pub(super) fn index_of(index: &mut BTreeMap<JobKey, u32>, k: &JobKey) -> u32 {
    if let Some(&i) = index.get(k) {
        return i;
    }
    let n = index.len() as u32;
    index.insert(k.clone(), n);
    n
}

/// One learned row or column: bias and factor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Side {
    pub(super) bias: f64,
    pub(super) factor: f64,
}

/// The trained model (the default when there was no usable history).
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// `None`: the default.
    pub coef: Option<[f64; FEATURES]>,
    pub profiles: BTreeMap<JobKey, Profile>,
    /// Pair estimates used for training.
    pub trained_on: usize,
    pub(super) job_index: BTreeMap<JobKey, u32>,
    pub(super) partner_index: BTreeMap<JobKey, u32>,
    pub(super) partner_by_id: BTreeMap<u32, u32>,
    pub(super) jobs: Vec<Side>,
    pub(super) partners: Vec<Side>,
    /// Sorted by (job, partner): observed x and runs; `x` NaN: cannot
    /// co-locate.
    pub(super) seen: Vec<(u32, u32, f64, u32)>,
    /// Per job, its range in `seen`.
    pub(super) seen_range: Vec<(u32, u32)>,
    pub(super) run_sd: f64,
    /// Standard deviations by what is known (module docs).
    pub(super) sd_both: f64,
    pub(super) sd_one: f64,
    pub(super) sd_none: f64,
    /// Shrunk rates of pairs that failed for memory, per job and partner,
    /// and overall.
    pub(super) job_fail: Vec<f64>,
    pub(super) partner_fail: Vec<f64>,
    pub(super) fail_prior: f64,
    /// Range of (share, mem, rate) over the training pairs: the regression
    /// is not extrapolated beyond what it was fitted on.
    pub(super) seen_range_features: [(f64, f64); 3],
}

impl Model {
    /// Trains on the runs' estimates.
    pub fn train(runs: &[Run]) -> Model {
        Model::from_estimates(&estimate(runs))
    }

    pub fn from_estimates(e: &Estimates) -> Model {
        let mut m = Model {
            profiles: e.profiles.clone(),
            trained_on: e.pairs.len(),
            run_sd: e.run_sd.max(0.02),
            ..Model::default()
        };
        // Each pair's (job, partner) indices, looked up once (string keys).
        let ids = SeenIds {
            pairs: (e.pairs.iter())
                .map(|p| (m.job_id(&p.job), m.partner_id(&p.partner)))
                .collect(),
            infeasible: (e.infeasible.iter())
                .map(|(j, p)| (m.job_id(j), m.partner_id(p)))
                .collect(),
        };
        for (&id, k) in &e.partner_ids {
            let i = m.partner_id(k);
            m.partner_by_id.insert(id, i);
        }
        if e.pairs.is_empty() {
            m.index_seen(e, &ids);
            return m;
        }
        // Side features: weighted ridge (share, memory, and the launch rate
        // where it helps).
        let w = |p: &PairObs| p.runs as f64 / (p.runs as f64 + 1.0);
        let mean_x =
            e.pairs.iter().map(|p| w(p) * p.x).sum::<f64>() / e.pairs.iter().map(w).sum::<f64>();
        let coef = if e.pairs.len() >= MIN_PAIRS {
            let all: Vec<&PairObs> = e.pairs.iter().collect();
            ridge(&all, choose_features(&e.pairs))
        } else {
            None
        };
        let mut constant = [0.0; FEATURES];
        constant[0] = mean_x;
        m.coef = Some(coef.unwrap_or(constant));
        let range = |f: &dyn Fn(&PairObs) -> f64| {
            e.pairs
                .iter()
                .map(f)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                })
        };
        m.seen_range_features = [range(&|p| p.share), range(&|p| p.mem), range(&|p| p.rate)];
        let obs: Vec<(u32, u32, f64, f64)> = (e.pairs.iter().zip(&ids.pairs))
            .map(|(p, &(j, k))| (j, k, p.x - m.raw(p.share, p.mem, p.rate), w(p)))
            .collect();
        m.jobs = vec![Side::default(); m.job_index.len()];
        let lambda = choose_lambda(&obs, m.jobs.len(), m.partner_index.len());
        m.partners =
            SideIndex::of(&obs, m.jobs.len(), m.partner_index.len()).fit(&mut m.jobs, lambda);
        // How far the completion is from the pairs it was fitted on, and
        // the side features alone; the out-of-sample error is larger.
        type Residual = (u32, u32, f64, f64);
        let rms = |f: &dyn Fn(&Residual) -> f64| {
            (obs.iter().map(|o| (o.2 - f(o)).powi(2)).sum::<f64>() / obs.len() as f64).sqrt()
        };
        let fit = rms(&|&(j, k, _, _)| {
            let (a, b) = (m.jobs[j as usize], m.partners[k as usize]);
            a.bias + b.bias + a.factor * b.factor
        });
        let base = rms(&|_| 0.0);
        m.sd_both = (1.5 * fit).max(0.08);
        m.sd_one = (0.5 * (fit + base)).max(m.sd_both + 0.03);
        m.sd_none = base.max(m.sd_one + 0.03);
        m.index_seen(e, &ids);
        m
    }

    fn job_id(&mut self, k: &JobKey) -> u32 {
        index_of(&mut self.job_index, k)
    }

    fn partner_id(&mut self, k: &JobKey) -> u32 {
        index_of(&mut self.partner_index, k)
    }

    fn index_seen(&mut self, e: &Estimates, ids: &SeenIds) {
        let mut jobs = vec![(0.0, 0.0); self.job_index.len()];
        let mut partners = vec![(0.0, 0.0); self.partner_index.len()];
        let pairs = ids.pairs.iter().map(|&(a, b)| (a, b, 0.0));
        let failed = ids.infeasible.iter().map(|&(a, b)| (a, b, 1.0));
        for (a, b, f) in pairs.chain(failed) {
            jobs[a as usize].0 += f;
            jobs[a as usize].1 += 1.0;
            partners[b as usize].0 += f;
            partners[b as usize].1 += 1.0;
        }
        let tries = (e.pairs.len() + e.infeasible.len()) as f64;
        self.fail_prior = if tries > 0.0 {
            e.infeasible.len() as f64 / tries
        } else {
            0.0
        };
        // Two pairs' worth of the overall rate as the prior.
        let prior = self.fail_prior;
        let shrink = |(f, t): (f64, f64)| (f + 2.0 * prior) / (t + 2.0);
        self.job_fail = jobs.into_iter().map(shrink).collect();
        self.partner_fail = partners.into_iter().map(shrink).collect();
        let mut seen: Vec<(u32, u32, f64, u32)> = (e.pairs.iter().zip(&ids.pairs))
            .map(|(p, &(j, k))| (j, k, p.x, p.runs as u32))
            .collect();
        for &(j, k) in &ids.infeasible {
            seen.push((j, k, f64::NAN, 0));
        }
        // An infeasible mark wins over the pair's other runs.
        seen.sort_by_key(|a| (a.0, a.1, !a.2.is_nan()));
        seen.dedup_by_key(|s| (s.0, s.1));
        self.seen_range = vec![(0, 0); self.job_index.len()];
        let mut i = 0;
        while i < seen.len() {
            let j = seen[i].0;
            let start = i;
            while i < seen.len() && seen[i].0 == j {
                i += 1;
            }
            self.seen_range[j as usize] = (start as u32, i as u32);
        }
        self.seen = seen;
    }

    fn raw(&self, share: f64, mem: f64, rate: f64) -> f64 {
        match &self.coef {
            Some(c) => {
                let [s, m, r] = self.seen_range_features;
                features(
                    share.clamp(s.0, s.1),
                    mem.clamp(m.0, m.1),
                    rate.clamp(r.0, r.1),
                )
                .iter()
                .zip(c)
                .map(|(x, b)| x * b)
                .sum()
            }
            None => default_prediction(share),
        }
    }

    /// The job's peak memory from history, MiB.
    pub fn peak_mib(&self, key: &JobKey) -> Option<u64> {
        self.profiles.get(key).and_then(|p| p.peak_mib)
    }

    /// Normalized throughput of job `key` next to GPU `gpu`'s online job
    /// and the offline jobs already there.
    pub fn predict(&self, key: &JobKey, gpu: &GpuState, policy: &Policy) -> Option<Estimate> {
        self.predict_terms(
            &self.job_terms(key),
            &self.gpu_terms(
                gpu,
                policy,
                Seat {
                    slots: gpu.free_slots(u32::from(policy.offline_per_gpu)).max(1),
                    offline_jobs: gpu.offline_jobs + 1,
                },
            ),
        )
    }

    /// The estimate for a pair named by keys, with its features (for
    /// evaluation); `None`: it cannot co-locate.
    pub fn predict_pair(
        &self,
        job: &JobKey,
        partner: &JobKey,
        share: f64,
        mem: f64,
    ) -> Option<Estimate> {
        let g = GpuTerms {
            share,
            room_mib: u64::MAX,
            partner: self.partner_index.get(partner).copied(),
            others: 0,
            budget: share,
        };
        let mut j = self.job_terms(job);
        j.peak_mib = None;
        self.predict_with_mem(&j, &g, mem)
    }

    /// What the model needs of a job, looked up once per round.
    pub fn job_terms(&self, key: &JobKey) -> JobTerms {
        JobTerms {
            index: self.job_index.get(key).copied(),
            peak_mib: self.peak_mib(key),
            rate: rate_feature(self.profiles.get(key).and_then(|p| p.launch_rate)),
            beside_offline: self.profiles.get(key).and_then(|p| p.beside_offline),
            beside_offline_fail: self
                .profiles
                .get(key)
                .map_or(0.0, |p| p.beside_offline_fail),
        }
    }

    /// What the model needs of a GPU, looked up once per round, for a job
    /// in `seat` there (issue 15): it gets its slots' part of the GPU's SM
    /// budget and memory room ([`sm_share_of`]), as the node gives it, and
    /// the other offline jobs there slow it ([`Model::beside_offline`]).
    pub fn gpu_terms(&self, gpu: &GpuState, policy: &Policy, seat: Seat) -> GpuTerms {
        let n = u32::from(policy.offline_per_gpu);
        GpuTerms {
            share: sm_share_of(&gpu.published, policy, seat.slots),
            room_mib: offline_part(memory_room_mib(gpu, policy), seat.slots, n),
            others: seat.offline_jobs.saturating_sub(1),
            budget: sm_share(&gpu.published, policy),
            partner: gpu
                .online_jobs
                .iter()
                .find_map(|id| self.partner_by_id.get(id).copied()),
        }
    }

    /// The prediction from precomputed terms (the per-pair hot path of a
    /// round: no allocation); `None` when the job's recorded peak memory
    /// does not fit the room the online job leaves, or the pair failed for
    /// memory before.
    #[inline]
    pub fn predict_terms(&self, job: &JobTerms, gpu: &GpuTerms) -> Option<Estimate> {
        let mem = match job.peak_mib {
            Some(p) if p > gpu.room_mib => return None,
            Some(p) if gpu.room_mib > 0 => (p as f64 / gpu.room_mib as f64).min(1.0),
            _ => DEFAULT_MEM,
        };
        let e = self.predict_with_mem(job, gpu, mem)?;
        if gpu.others == 0 {
            return Some(e);
        }
        Some(Estimate {
            mean: (e.mean * self.beside_offline(job, gpu.budget).powi(gpu.others as i32))
                .clamp(0.01, 1.0),
            ..e
        })
    }

    /// What one other offline job on the GPU leaves the job (issue 15).
    /// The prior: each other offline job counts as a partner the model
    /// does not know, at the GPU's whole offline budget `budget` — the
    /// completion without a partner (the default's rule without history,
    /// 1 at a share above half). What the job's own runs beside other
    /// offline jobs showed ([`Profile::beside_offline`]) moves it, as n
    /// runs against one pseudo-run of the prior (a geometric mean), so
    /// one run does not decide alone. Scaled by the chance it runs at all
    /// there: 1 − the job's rate of memory failures beside other offline
    /// jobs. No offline × offline pair is learned: the factor is the
    /// job's, whoever the other jobs are.
    pub fn beside_offline(&self, job: &JobTerms, budget: f64) -> f64 {
        let unknown = GpuTerms {
            share: budget,
            room_mib: u64::MAX,
            partner: None,
            others: 0,
            budget,
        };
        let prior = self
            .predict_with_mem(job, &unknown, DEFAULT_MEM)
            .map_or(1.0, |e| e.mean)
            .max(0.01);
        let runs = match job.beside_offline {
            Some((f, n)) => {
                let n = f64::from(n);
                ((n * f.ln() + prior.ln()) / (n + 1.0)).exp()
            }
            None => prior,
        };
        runs * (1.0 - job.beside_offline_fail)
    }

    fn predict_with_mem(&self, job: &JobTerms, gpu: &GpuTerms, mem: f64) -> Option<Estimate> {
        let seen = match (job.index, gpu.partner) {
            (Some(j), Some(k)) => {
                let (s, e) = self.seen_range.get(j as usize).copied().unwrap_or((0, 0));
                let list = &self.seen[s as usize..e as usize];
                list.binary_search_by_key(&k, |x| x.1)
                    .ok()
                    .map(|i| (list[i].2, list[i].3))
            }
            _ => None,
        };
        if seen.is_some_and(|(x, _)| x.is_nan()) {
            return None;
        }
        let p_fail = match seen {
            Some(_) => 0.0,
            None => {
                let r = job.index.and_then(|j| self.job_fail.get(j as usize));
                let c = gpu.partner.and_then(|k| self.partner_fail.get(k as usize));
                let (r, c) = (
                    r.copied().unwrap_or(self.fail_prior),
                    c.copied().unwrap_or(self.fail_prior),
                );
                (r + c - self.fail_prior).clamp(0.0, 0.95)
            }
        };
        if self.coef.is_none() {
            return Some(Estimate {
                mean: default_prediction(gpu.share),
                sd: DEFAULT_SD,
                p_fail,
            });
        }
        let base = self.raw(gpu.share, mem, job.rate);
        let a = job.index.and_then(|j| self.jobs.get(j as usize)).copied();
        let b = gpu
            .partner
            .and_then(|k| self.partners.get(k as usize))
            .copied();
        let (completion, sd) = match (a, b) {
            (Some(a), Some(b)) => (base + a.bias + b.bias + a.factor * b.factor, self.sd_both),
            (Some(a), None) => (base + a.bias, self.sd_one),
            (None, Some(b)) => (base + b.bias, self.sd_one),
            (None, None) => (base, self.sd_none),
        };
        let (mean, sd) = match seen {
            Some((x, n)) => {
                let n = f64::from(n);
                (
                    (n * x + PAIR_PRIOR * completion) / (n + PAIR_PRIOR),
                    self.run_sd / n.sqrt() + sd * PAIR_PRIOR / (n + PAIR_PRIOR),
                )
            }
            None => (completion, sd),
        };
        Some(Estimate {
            mean: mean.clamp(0.01, 1.0),
            sd,
            p_fail,
        })
    }
}

/// The regularization with the least error on held-out folds of `obs`.
pub(super) fn choose_lambda(obs: &[(u32, u32, f64, f64)], jobs: usize, partners: usize) -> f64 {
    if obs.len() < 2 * FOLDS {
        return LAMBDAS[LAMBDAS.len() - 1];
    }
    // Each fold's split and index are the same for every lambda: built once.
    let folds: Vec<_> = (0..FOLDS)
        .map(|f| {
            let (test, train): (Vec<_>, Vec<_>) =
                obs.iter().enumerate().partition(|(i, _)| i % FOLDS == f);
            let train: Vec<_> = train.into_iter().map(|(_, o)| *o).collect();
            let mut seen_j = vec![false; jobs];
            let mut seen_p = vec![false; partners];
            for o in &train {
                seen_j[o.0 as usize] = true;
                seen_p[o.1 as usize] = true;
            }
            let test: Vec<_> = test.into_iter().map(|(_, o)| *o).collect();
            (SideIndex::of(&train, jobs, partners), test, seen_j, seen_p)
        })
        .collect();
    let err = |lambda: f64| {
        let mut sq = 0.0;
        for (index, test, seen_j, seen_p) in &folds {
            let mut j = vec![Side::default(); jobs];
            let p = index.fit(&mut j, lambda);
            for &(a, b, r, w) in test {
                let (sa, sb) = (j[a as usize], p[b as usize]);
                let pred = match (seen_j[a as usize], seen_p[b as usize]) {
                    (true, true) => sa.bias + sb.bias + sa.factor * sb.factor,
                    (true, false) => sa.bias,
                    (false, true) => sb.bias,
                    (false, false) => 0.0,
                };
                sq += w * (r - pred).powi(2);
            }
        }
        sq
    };
    // The lambdas are independent: spread over the solver's workers (the
    // retraining holds up the daemon's round and the replay's).
    let threads = crate::solver::SolveOptions::default().threads.max(1);
    let errs: Vec<f64> = crate::workers::blocks(LAMBDAS.len(), threads, |r| {
        LAMBDAS[r].iter().map(|&l| err(l)).collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect();
    errs.iter()
        .zip(LAMBDAS)
        .min_by(|a, b| a.0.total_cmp(b.0))
        .map_or(1.0, |(_, l)| l)
}

/// Residuals `(job, partner, r, weight)` listed per job and per partner,
/// each list in the residuals' order (the order [`SideIndex::fit`] sums
/// in), contiguous: the fit reads them in sequence, not through an index
/// into the residuals (the model's retraining was 7% of a replayed week).
pub(super) struct SideIndex {
    pub(super) by_job: Lists,
    pub(super) by_partner: Lists,
}

/// Lists of `(other side, r, weight)`: list `k` is `entries[start[k]..start[k + 1]]`.
pub(super) struct Lists {
    pub(super) start: Vec<usize>,
    pub(super) entries: Vec<(u32, f64, f64)>,
}

impl Lists {
    fn of(
        obs: &[(u32, u32, f64, f64)],
        n: usize,
        key: impl Fn(&(u32, u32, f64, f64)) -> (u32, u32),
    ) -> Lists {
        let mut start = vec![0usize; n + 1];
        for o in obs {
            start[key(o).0 as usize + 1] += 1;
        }
        for k in 0..n {
            start[k + 1] += start[k];
        }
        let mut at = start.clone();
        let mut entries = vec![(0, 0.0, 0.0); obs.len()];
        for o in obs {
            let (this, other) = key(o);
            entries[at[this as usize]] = (other, o.2, o.3);
            at[this as usize] += 1;
        }
        Lists { start, entries }
    }

    fn len(&self) -> usize {
        self.start.len() - 1
    }

    fn list(&self, k: usize) -> &[(u32, f64, f64)] {
        &self.entries[self.start[k]..self.start[k + 1]]
    }
}

impl SideIndex {
    fn of(obs: &[(u32, u32, f64, f64)], jobs: usize, partners: usize) -> SideIndex {
        SideIndex {
            by_job: Lists::of(obs, jobs, |o| (o.0, o.1)),
            by_partner: Lists::of(obs, partners, |o| (o.1, o.0)),
        }
    }

    /// Biases and rank-1 factors by alternating ridge: each row's (bias,
    /// factor) is a 2×2 solve given the columns, and the other way round.
    /// Returns the columns.
    fn fit(&self, jobs: &mut [Side], lambda: f64) -> Vec<Side> {
        // Factors start spread (equal ones would only copy the biases).
        let mut partners: Vec<Side> = (0..self.by_partner.len())
            .map(|k| Side {
                bias: 0.0,
                factor: 0.3 * (k as f64 * 2.399 + 1.0).sin(),
            })
            .collect();
        // One side's (bias, factor) given the other's: minimize
        // Σ w (r − other.bias − bias − factor·other.factor)² + λ_b bias² + λ_f factor².
        let solve = |list: &[(u32, f64, f64)], other: &[Side]| -> Side {
            let (mut a11, mut a12, mut a22, mut v1, mut v2) = (lambda, 0.0, lambda, 0.0, 0.0);
            for &(k, r, w) in list {
                let o = other[k as usize];
                let t = r - o.bias;
                a11 += w;
                a12 += w * o.factor;
                a22 += w * o.factor * o.factor;
                v1 += w * t;
                v2 += w * t * o.factor;
            }
            let det = a11 * a22 - a12 * a12;
            if det.abs() < 1e-12 {
                return Side::default();
            }
            Side {
                bias: (a22 * v1 - a12 * v2) / det,
                factor: (a11 * v2 - a12 * v1) / det,
            }
        };
        for _ in 0..ALS_ROUNDS {
            for (j, side) in jobs.iter_mut().enumerate() {
                *side = solve(self.by_job.list(j), &partners);
            }
            for (k, side) in partners.iter_mut().enumerate() {
                *side = solve(self.by_partner.list(k), jobs);
            }
        }
        partners
    }
}
