//! Predicts an offline job's normalized throughput next to an online job
//! (its speed there ÷ its speed with an idle partner), with a confidence,
//! from what the cluster records: the AdminComment of earlier shared runs.
//!
//! The fact that shapes it: under muxflow an offline job never runs alone
//! and nothing profiles it, so its solo speed is never observed. It is
//! estimated, per job, from its shared runs across partners and across the
//! online load's swings; what two jobs cost each other depends on the pair,
//! so the pair (offline job × online service) is what is modelled.
//!
//! # What a run gives ([`estimate`])
//!
//! * Progress: the job's own `claim.steps_per_s` where its workload reports
//!   it, else xCUDA's `claim.launches` over the node's `run_s` (launches/s,
//!   which every CUDA process has). One signal per job (steps when any of
//!   its runs has them), so a job is only compared with itself: the units
//!   cancel in the ratio.
//! * The partner: the online job (`partner`, a job id) resolved to its
//!   (user, name) from the same sacct listing ([`runs_from_sacct`]).
//! * The partner's load: `partner_load_pct` when the record has it (a node
//!   measurement), else taken as 1 (the pair at whatever load it ran).
//! * A k-GPU job's run counts only when all its GPUs had the same partner
//!   (or none): beside different online jobs it ran at its slowest GPU's
//!   pace, and the record cannot say which partner set it.
//! * Memory: the node-measured `measured_peak_mib` ([`trusted_peak_mib`]);
//!   a run that failed at once for memory (`claim.oom` > 0 and no progress)
//!   marks the pair as one that cannot co-locate: it is excluded from the
//!   candidates, not predicted slow.
//!
//! Solo speed `σ` and pair slowdowns `d` fit `progress = σ · (1 − load · d)`
//! by alternating least squares over the job's runs (a run next to a
//! near-idle partner is close to solo); runs with no partner (an idle GPU)
//! give `σ` directly. The pair's normalized throughput is `x = 1 − d`: its
//! speed next to that partner at full load. Without load figures `σ` is
//! the job's best run (the envelope) and `x` the pair's mean ratio to it.
//!
//! # Model ([`Model::train`])
//!
//! Gavel's estimator completes a job × job throughput matrix from a fraction
//! of profiled pairs; here the rows are offline jobs (user, name) and the
//! columns online jobs, and the matrix is completed with side features:
//! `x ≈ base(share, mem) + b_job + c_partner + u_job · v_partner`, where
//! `base` is a ridge regression on `[1, share, share², mem, share·mem]`
//! (`share`: the SM share the policy gives next to that online job; `mem`:
//! the job's peak over the room the online job leaves), and the biases and
//! the rank-1 factors are fitted by alternating ridge on the residuals.
//! A pair seen `n` times is predicted as `(n·x + completion) / (n + 1)`.
//!
//! # Confidence and exploration
//!
//! Each prediction carries a standard deviation that widens with what is
//! unknown: a pair seen (shrinks with its runs) < both sides seen, pair not
//! < one side seen < neither (side features only) < no history at all (the
//! default, [`DEFAULT_SD`]). The matcher maximizes `mean + min(EXPLORE_SD ×
//! sd, EXPLORE_MAX)`: an untried pair gets at most [`EXPLORE_MAX`] of
//! optimism, so a well-known pair at 0.70 still beats a new one predicted
//! 0.62 ± 0.20 (0.67), and loses to one predicted 0.68 ± 0.20 (0.73).
//!
//! # Trust
//!
//! Peaks and failures for memory use what the node measured or decided.
//! Progress is the job's own claim, bounded by the report codec: a user who
//! writes false steps or launches skews the predictions of their own job
//! only (its σ and its pairs), never another job's row; partners' columns
//! pool many jobs, each weighted by its runs.
//!
//! # Default
//!
//! With no usable history: a job needs half of the SMs and runs at
//! `min(1, share / 0.5)` of its speed alone ([`default_prediction`]).

use std::collections::{BTreeMap, BTreeSet};

use muxflow::config::Policy;
use muxflow::policy::share::{offline_mem_cap_mib, offline_part, offline_sm_percent, GpuFacts};
use muxflow::records::report::JobReport;
use muxflow::Mode;
use nalgebra::{SMatrix, SVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::reader::{GpuState, SacctJob};
use crate::round::Seat;

/// SM demand assumed when nothing is known.
pub const DEFAULT_DEMAND: f64 = 0.5;
/// Memory feature when the job has no recorded peak.
pub const DEFAULT_MEM: f64 = 0.5;
/// Fewer pair estimates than this: the side-feature regression is a
/// constant (their mean).
pub const MIN_PAIRS: usize = 8;
/// Standard deviation of the default prediction.
pub const DEFAULT_SD: f64 = 0.30;
/// Exploration: the matcher adds `EXPLORE_SD × sd`, at most `EXPLORE_MAX`.
pub const EXPLORE_SD: f64 = 0.25;
pub const EXPLORE_MAX: f64 = 0.05;
const RIDGE: f64 = 1e-3;
const FEATURES: usize = 7;
/// The first `BASE_FEATURES` features are share and memory; the rest use
/// the job's launch rate, kept only where it lowers the cross-validated
/// error ([`choose_features`]).
const BASE_FEATURES: usize = 5;
/// Launch-rate feature when the job's is unknown: the middle of its scale.
pub const DEFAULT_RATE: f64 = 0.5;
/// Regularization of the biases and factors (in run-weights) tried; the
/// one with the least cross-validated error on the training pairs wins, so
/// no table's scale is built in.
const LAMBDAS: [f64; 6] = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0];
const FOLDS: usize = 4;
const ALS_ROUNDS: usize = 60;
/// A pair's own estimate weighs as this many completions less than its runs.
const PAIR_PRIOR: f64 = 1.0;

/// Identifies "the same job" across runs: (user, job name).
pub type JobKey = (String, String);

/// One finished (or running) offline run from sacct.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job_id: u32,
    pub key: JobKey,
    pub report: JobReport,
    /// When the run ended (Unix seconds); 0 while it runs.
    pub end_s: u64,
    /// The online partner's (user, name), when the listing had it.
    pub partner_key: Option<JobKey>,
}

/// Offline runs in a `sacct --json` listing (other records are skipped);
/// each partner's job id is resolved to its (user, name) from the same
/// listing.
pub fn runs_from_sacct(jobs: &[SacctJob]) -> Vec<Run> {
    let names: BTreeMap<u32, &SacctJob> = jobs.iter().map(|j| (j.job_id, j)).collect();
    jobs.iter()
        .filter_map(|j| {
            let report = JobReport::decode(j.comment.administrator.as_deref()?).ok()?;
            // A run the node had to police did not run within its limits:
            // its figures say nothing about a protected run.
            let learnable = report.mode == Some(Mode::Offline) && report.policed.is_none();
            let partner_key = report
                .partner
                .and_then(|p| names.get(&p))
                .map(|p| (p.user.clone(), p.name.clone()));
            learnable.then(|| Run {
                job_id: j.job_id,
                key: (j.user.clone(), j.name.clone()),
                report,
                end_s: j.time.end,
                partner_key,
            })
        })
        .collect()
}

/// The job's peak GPU memory as the predictor uses it: what the node
/// measured; for records without a measurement (written before the node
/// measured), the job's own claim, never above the cap the node gave it.
pub fn trusted_peak_mib(r: &JobReport) -> Option<u64> {
    const MAX_MIB: u64 = 1 << 20;
    r.measured_peak_mib.or_else(|| {
        let claim = r.peak_mib?;
        Some(claim.min(r.mem_cap_mib.unwrap_or(MAX_MIB)).min(MAX_MIB))
    })
}

/// A job's progress signal, in its own units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    StepsPerS,
    LaunchesPerS,
}

/// The run's progress in `signal`'s units, when it has one.
pub fn progress(r: &JobReport, signal: Signal) -> Option<f64> {
    let v = match signal {
        Signal::StepsPerS => r.steps_per_s?,
        Signal::LaunchesPerS => r.launches? as f64 / r.run_s.filter(|&s| s > 0)? as f64,
    };
    (v.is_finite() && v > 0.0).then_some(v)
}

/// Every GPU of the run had the same partner (or none): a k-GPU job
/// beside different online jobs runs at its slowest GPU's pace, which no
/// one of its partners can be credited or blamed for.
fn one_partner(r: &JobReport) -> bool {
    r.gang.iter().all(|g| g.partner == r.partner)
}

/// The run's speed is its speed beside its partner (or alone) and nothing
/// else: [`one_partner`], and no other offline job shared its GPUs
/// (`peers`, issue 15), whose part of the GPU would be counted against the
/// partner or the job's solo speed.
fn beside_its_partner_only(r: &JobReport) -> bool {
    one_partner(r) && r.peers.is_empty()
}

/// The partner's load during the run, a fraction (1 when not measured).
fn partner_load(r: &JobReport) -> f64 {
    r.partner_load_pct
        .map_or(1.0, |l| f64::from(l.min(100)) / 100.0)
}

fn failed_for_memory(r: &JobReport) -> bool {
    r.oom.unwrap_or(0) > 0
        && progress(r, Signal::StepsPerS).is_none()
        && progress(r, Signal::LaunchesPerS).is_none()
}

/// The partner as the model names it: its (user, name), else its job id.
fn partner_of(r: &Run) -> Option<JobKey> {
    r.partner_key
        .clone()
        .or_else(|| Some(unresolved_partner(r.report.partner?)))
}

fn unresolved_partner(id: u32) -> JobKey {
    (String::new(), format!("job {id}"))
}

/// What history says about one offline job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// Estimated speed with an idle partner (or alone), in `signal` units.
    pub solo: Option<f64>,
    pub signal: Option<Signal>,
    pub peak_mib: Option<u64>,
    pub runs: usize,
    pub alone_runs: usize,
    /// Runs beside other offline jobs on a GPU (`peers`): counted in
    /// `runs`, left out of the solo speed, pair and launch-rate estimates
    /// ([`estimate`]).
    pub peer_runs: usize,
    /// What one other offline job on its GPU leaves it, from its peer runs
    /// (learned in [`estimate`], used by [`Model::beside_offline`]), and
    /// how many runs it comes from; `None`: no such run to learn from.
    pub beside_offline: Option<(f64, u32)>,
    /// Of its runs beside other offline jobs, those that failed for memory,
    /// as a rate shrunk towards 0: failures / (peer runs + 1).
    pub beside_offline_fail: f64,
    /// Mean kernel launches per second over its runs (xCUDA's count over the
    /// node's run time), whatever its progress signal.
    pub launch_rate: Option<f64>,
}

/// One (offline job, online partner) pair's estimate from its runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PairObs {
    pub job: JobKey,
    pub partner: JobKey,
    /// Normalized throughput at full partner load.
    pub x: f64,
    pub runs: usize,
    /// Mean SM share and memory feature of its runs.
    pub share: f64,
    pub mem: f64,
    /// The job's launch-rate feature ([`rate_feature`]).
    pub rate: f64,
}

/// What the runs say, before any model: per-job profiles, per-pair
/// estimates, the pairs that cannot co-locate, and the partners' job ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Estimates {
    pub profiles: BTreeMap<JobKey, Profile>,
    pub pairs: Vec<PairObs>,
    pub infeasible: BTreeSet<(JobKey, JobKey)>,
    pub partner_ids: BTreeMap<u32, JobKey>,
    /// Pooled standard deviation of single runs around their pair's curve.
    pub run_sd: f64,
}

struct Obs {
    partner: Option<usize>,
    load: f64,
    p: f64,
    share: f64,
    mem: f64,
}

/// Estimates solo speeds and pair throughputs from `runs` (module docs).
pub fn estimate(runs: &[Run]) -> Estimates {
    // Runs grouped by job: hashed, then the groups in key order (a tree
    // compared both strings of every run's key at each level).
    let mut group_of: std::collections::HashMap<&JobKey, usize> = Default::default();
    let mut by_job: Vec<(&JobKey, Vec<&Run>)> = Vec::new();
    let mut out = Estimates::default();
    for r in runs {
        let g = *group_of.entry(&r.key).or_insert_with(|| {
            by_job.push((&r.key, Vec::new()));
            by_job.len() - 1
        });
        by_job[g].1.push(r);
        if let (Some(id), Some(k)) = (r.report.partner, &r.partner_key) {
            out.partner_ids.insert(id, k.clone());
        }
    }
    // A partner the listing did not resolve (sacct may not list a running
    // job yet) is known by its job id, so a GPU whose online job has that
    // id still finds the pair.
    for r in runs {
        if let Some(id) = r.report.partner {
            out.partner_ids
                .entry(id)
                .or_insert_with(|| unresolved_partner(id));
        }
    }
    // One name per partner: the resolved one wherever any run resolved it
    // (read by reference: the map goes back into `out` at the end).
    let names = std::mem::take(&mut out.partner_ids);
    let canonical = |r: &Run| canonical_partner(&names, r);
    let (mut sq, mut dof) = (0.0, 0usize);
    drop(group_of);
    by_job.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (key, job_runs) in by_job {
        let mut prof = Profile {
            runs: job_runs.len(),
            ..Profile::default()
        };
        for r in &job_runs {
            prof.peak_mib = prof.peak_mib.max(trusted_peak_mib(&r.report));
            if failed_for_memory(&r.report) && beside_its_partner_only(&r.report) {
                if let Some(p) = canonical(r) {
                    out.infeasible.insert((key.clone(), p.clone()));
                }
            } else if failed_for_memory(&r.report) && !r.report.peers.is_empty() {
                // Beside other offline jobs it had its part of the room: not
                // the pair's failure, but it needs more than that cap.
                let needs = r.report.mem_cap_mib.map(|c| c.saturating_add(1));
                prof.peak_mib = prof.peak_mib.max(needs);
                prof.beside_offline_fail += 1.0;
            }
        }
        prof.peer_runs = job_runs
            .iter()
            .filter(|r| !r.report.peers.is_empty())
            .count();
        prof.beside_offline_fail /= (prof.peer_runs + 1) as f64;
        let signal = if job_runs
            .iter()
            .any(|r| progress(&r.report, Signal::StepsPerS).is_some())
        {
            Signal::StepsPerS
        } else {
            Signal::LaunchesPerS
        };
        let mut partners: Vec<JobKey> = Vec::new();
        let mut obs: Vec<Obs> = Vec::new();
        for r in job_runs
            .iter()
            .filter(|r| beside_its_partner_only(&r.report))
        {
            let Some(p) = progress(&r.report, signal) else {
                continue;
            };
            let partner = if r.report.partner.is_some() {
                let k = canonical(r).expect("has a partner");
                Some(match partners.iter().position(|x| x == k) {
                    Some(i) => i,
                    None => {
                        partners.push(k.clone());
                        partners.len() - 1
                    }
                })
            } else {
                None
            };
            let mem = match (trusted_peak_mib(&r.report), r.report.mem_cap_mib) {
                (Some(pk), Some(c)) if c > 0 => (pk as f64 / c as f64).min(1.0),
                _ => DEFAULT_MEM,
            };
            obs.push(Obs {
                partner,
                load: partner_load(&r.report),
                p,
                share: r
                    .report
                    .sm_pct
                    .map_or(1.0, |s| f64::from(s.min(100)) / 100.0),
                mem,
            });
        }
        if obs.is_empty() {
            out.profiles.insert(key.clone(), prof);
            continue;
        }
        prof.signal = Some(signal);
        // Other offline jobs on its GPU slow its launches too.
        let rates: Vec<f64> = job_runs
            .iter()
            .filter(|r| r.report.peers.is_empty())
            .filter_map(|r| progress(&r.report, Signal::LaunchesPerS))
            .collect();
        prof.launch_rate =
            (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64);
        let rate = rate_feature(prof.launch_rate);
        let alone: Vec<f64> = obs
            .iter()
            .filter(|o| o.partner.is_none())
            .map(|o| o.p)
            .collect();
        prof.alone_runs = alone.len();
        let (sigma, d) = fit_solo(&obs, partners.len(), alone);
        prof.solo = Some(sigma);
        prof.beside_offline =
            beside_offline_factor(&job_runs, signal, sigma, &partners, &d, &names);
        for (k, partner) in partners.into_iter().enumerate() {
            let mine: Vec<&Obs> = obs.iter().filter(|o| o.partner == Some(k)).collect();
            let n = mine.len() as f64;
            for o in &mine {
                sq += (o.p / sigma - (1.0 - o.load * d[k])).powi(2);
            }
            dof += mine.len().saturating_sub(1);
            out.pairs.push(PairObs {
                job: key.clone(),
                partner,
                x: (1.0 - d[k]).clamp(0.0, 1.2),
                runs: mine.len(),
                share: mine.iter().map(|o| o.share).sum::<f64>() / n,
                mem: mine.iter().map(|o| o.mem).sum::<f64>() / n,
                rate,
            });
        }
        out.profiles.insert(key.clone(), prof);
    }
    out.run_sd = if dof > 0 {
        (sq / dof as f64).sqrt()
    } else {
        0.05
    };
    out.partner_ids = names;
    out
}

/// The one name of run `r`'s partner ([`estimate`]'s `names`).
fn canonical_partner<'n>(names: &'n BTreeMap<u32, JobKey>, r: &Run) -> Option<&'n JobKey> {
    r.report.partner.and_then(|id| names.get(&id))
}

/// What one other offline job on its GPU leaves a job, learned from its
/// runs that had offline peers (issue 15): each such run's speed over what
/// the job does without them beside the same partner (`σ (1 − load·d_k)`,
/// or `σ` alone), to the power 1/peers; the geometric mean over the runs,
/// within [0.05, 1]. It holds both what the peers take and the smaller
/// part of the GPU the job had beside them, as [`Model::predict_terms`]
/// applies it to a pair it has seen; for an unseen pair the regression's
/// share term lowers the estimate for the smaller part too, so there the
/// two overlap (an approximation: the factor would need the share it came
/// from to avoid it). Runs beside a partner the job never ran with alone, or on
/// GPUs with different partners, say nothing here.
fn beside_offline_factor(
    runs: &[&Run],
    signal: Signal,
    sigma: f64,
    partners: &[JobKey],
    d: &[f64],
    names: &BTreeMap<u32, JobKey>,
) -> Option<(f64, u32)> {
    let logs: Vec<f64> = runs
        .iter()
        .filter(|r| !r.report.peers.is_empty() && one_partner(&r.report))
        .filter_map(|r| {
            let p = progress(&r.report, signal)?;
            let without = match canonical_partner(names, r) {
                None => sigma,
                Some(k) => {
                    let i = partners.iter().position(|x| x == k)?;
                    sigma * (1.0 - partner_load(&r.report) * d[i])
                }
            };
            (without > 0.0).then(|| {
                let ratio = (p / without).clamp(1e-6, 1.0);
                ratio.ln() / r.report.peers.len() as f64
            })
        })
        .collect();
    (!logs.is_empty()).then(|| {
        let f = (logs.iter().sum::<f64>() / logs.len() as f64)
            .exp()
            .clamp(0.05, 1.0);
        (f, u32::try_from(logs.len()).unwrap_or(u32::MAX))
    })
}

/// `progress = σ (1 − load·d_k)` by alternating least squares; `σ` is the
/// mean of runs alone when there are any.
fn fit_solo(obs: &[Obs], partners: usize, alone: Vec<f64>) -> (f64, Vec<f64>) {
    let known = (!alone.is_empty()).then(|| alone.iter().sum::<f64>() / alone.len() as f64);
    let mut sigma = known.unwrap_or_else(|| obs.iter().map(|o| o.p).fold(0.0, f64::max));
    let mut d = vec![0.0; partners];
    for _ in 0..50 {
        for (k, dk) in d.iter_mut().enumerate() {
            let (mut num, mut den) = (0.0, 0.0);
            for o in obs.iter().filter(|o| o.partner == Some(k)) {
                num += o.load * (sigma - o.p);
                den += o.load * o.load;
            }
            *dk = if den > 0.0 {
                (num / (sigma * den)).clamp(-0.2, 0.99)
            } else {
                0.0
            };
        }
        if known.is_some() {
            continue;
        }
        let (mut num, mut den) = (0.0, 0.0);
        for o in obs {
            let g = o.partner.map_or(1.0, |k| 1.0 - o.load * d[k]);
            num += o.p * g;
            den += g * g;
        }
        if den > 0.0 && num > 0.0 {
            sigma = num / den;
        }
    }
    (sigma, d)
}

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

fn features(share: f64, mem: f64, rate: f64) -> [f64; FEATURES] {
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
fn ridge(pairs: &[&PairObs], used: usize) -> Option<[f64; FEATURES]> {
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
fn choose_features(pairs: &[PairObs]) -> usize {
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
struct SeenIds {
    pairs: Vec<(u32, u32)>,
    infeasible: Vec<(u32, u32)>,
}

/// `k`'s index in `index`, the next one where it is new (the key cloned
/// only then).
fn index_of(index: &mut BTreeMap<JobKey, u32>, k: &JobKey) -> u32 {
    if let Some(&i) = index.get(k) {
        return i;
    }
    let n = index.len() as u32;
    index.insert(k.clone(), n);
    n
}

/// One learned row or column: bias and factor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Side {
    bias: f64,
    factor: f64,
}

/// The trained model (the default when there was no usable history).
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// `None`: the default.
    pub coef: Option<[f64; FEATURES]>,
    pub profiles: BTreeMap<JobKey, Profile>,
    /// Pair estimates used for training.
    pub trained_on: usize,
    job_index: BTreeMap<JobKey, u32>,
    partner_index: BTreeMap<JobKey, u32>,
    partner_by_id: BTreeMap<u32, u32>,
    jobs: Vec<Side>,
    partners: Vec<Side>,
    /// Sorted by (job, partner): observed x and runs; `x` NaN: cannot
    /// co-locate.
    seen: Vec<(u32, u32, f64, u32)>,
    /// Per job, its range in `seen`.
    seen_range: Vec<(u32, u32)>,
    run_sd: f64,
    /// Standard deviations by what is known (module docs).
    sd_both: f64,
    sd_one: f64,
    sd_none: f64,
    /// Shrunk rates of pairs that failed for memory, per job and partner,
    /// and overall.
    job_fail: Vec<f64>,
    partner_fail: Vec<f64>,
    fail_prior: f64,
    /// Range of (share, mem, rate) over the training pairs: the regression
    /// is not extrapolated beyond what it was fitted on.
    seen_range_features: [(f64, f64); 3],
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
            share: sm_share_of(gpu.published.solo_sm_pct, policy, seat.slots),
            room_mib: offline_part(memory_room_mib(gpu, policy), seat.slots, n),
            others: seat.offline_jobs.saturating_sub(1),
            budget: sm_share(gpu.published.solo_sm_pct, policy),
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
fn choose_lambda(obs: &[(u32, u32, f64, f64)], jobs: usize, partners: usize) -> f64 {
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
    let mut errs = [0.0; LAMBDAS.len()];
    std::thread::scope(|s| {
        let err = &err;
        let mut parts: Vec<_> = errs.chunks_mut(LAMBDAS.len().div_ceil(threads)).collect();
        let last = parts.pop();
        let mut at = 0;
        for part in parts {
            let from = at;
            at += part.len();
            s.spawn(move || {
                for (e, &l) in part.iter_mut().zip(&LAMBDAS[from..]) {
                    *e = err(l);
                }
            });
        }
        if let Some(part) = last {
            for (e, &l) in part.iter_mut().zip(&LAMBDAS[at..]) {
                *e = err(l);
            }
        }
    });
    errs.iter()
        .zip(LAMBDAS)
        .min_by(|a, b| a.0.total_cmp(b.0))
        .map_or(1.0, |(_, l)| l)
}

/// Residuals `(job, partner, r, weight)` listed per job and per partner,
/// each list in the residuals' order (the order [`SideIndex::fit`] sums
/// in), contiguous: the fit reads them in sequence, not through an index
/// into the residuals (the model's retraining was 7% of a replayed week).
struct SideIndex {
    by_job: Lists,
    by_partner: Lists,
}

/// Lists of `(other side, r, weight)`: list `k` is `entries[start[k]..start[k + 1]]`.
struct Lists {
    start: Vec<usize>,
    entries: Vec<(u32, f64, f64)>,
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

/// Per-job inputs of [`Model::predict_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobTerms {
    index: Option<u32>,
    pub peak_mib: Option<u64>,
    /// [`rate_feature`] of the job's launch rate.
    pub rate: f64,
    /// [`Profile::beside_offline`], [`Profile::beside_offline_fail`].
    pub beside_offline: Option<(f64, u32)>,
    pub beside_offline_fail: f64,
}

/// Per-GPU inputs of [`Model::predict_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTerms {
    /// The job's SM share there (its part of the budget).
    pub share: f64,
    pub room_mib: u64,
    partner: Option<u32>,
    /// Offline jobs already there (it would be one of `others + 1`).
    pub others: u32,
    /// The GPU's whole offline SM share.
    pub budget: f64,
}

impl GpuTerms {
    /// Appends every field ([`crate::round::Predictor::column_key`]):
    /// [`Model::predict_terms`] reads nothing else of the GPU.
    pub fn key_words(&self, key: &mut Vec<u64>) {
        key.extend([
            self.share.to_bits(),
            self.room_mib,
            self.partner.map_or(u64::MAX, u64::from),
            u64::from(self.others),
            self.budget.to_bits(),
        ]);
    }
}

/// The SM share muxflow's policy gives an offline job next to an online job
/// with this solo SM activity (fraction): [`offline_sm_percent`].
pub fn sm_share(solo_sm_pct: Option<u8>, p: &Policy) -> f64 {
    f64::from(offline_sm_percent(p, solo_sm_pct)) / 100.0
}

/// The SM share of a job holding `slots` of the GPU's offline slots: its part
/// ([`offline_part`]) of [`offline_sm_percent`], `slots` of `[policy]
/// offline_per_gpu`.
pub fn sm_share_of(solo_sm_pct: Option<u8>, p: &Policy, slots: u32) -> f64 {
    let budget = u64::from(offline_sm_percent(p, solo_sm_pct));
    offline_part(budget, slots, u32::from(p.offline_per_gpu)) as f64 / 100.0
}

/// GPU memory the offline jobs may use there together: [`offline_mem_cap_mib`].
pub fn memory_room_mib(gpu: &GpuState, p: &Policy) -> u64 {
    let g = &gpu.published;
    offline_mem_cap_mib(
        p,
        &GpuFacts {
            online_solo_sm_pct: g.solo_sm_pct,
            online_mem_mib: g.online_mem_mib,
            mem_total_mib: Some(g.mem_mib),
        },
    )
    .unwrap_or(0)
}

/// Row + column means of the pair estimates: the baseline the evaluation
/// reports (job mean + partner mean − overall mean).
pub struct RowColMeans {
    mean: f64,
    rows: BTreeMap<JobKey, f64>,
    cols: BTreeMap<JobKey, f64>,
}

impl RowColMeans {
    pub fn fit(pairs: &[PairObs]) -> RowColMeans {
        let mean = pairs.iter().map(|p| p.x).sum::<f64>() / pairs.len().max(1) as f64;
        let avg = |key: fn(&PairObs) -> &JobKey| {
            let mut acc: BTreeMap<JobKey, (f64, f64)> = BTreeMap::new();
            for p in pairs {
                let e = acc.entry(key(p).clone()).or_default();
                e.0 += p.x;
                e.1 += 1.0;
            }
            acc.into_iter().map(|(k, (s, n))| (k, s / n)).collect()
        };
        RowColMeans {
            mean: if pairs.is_empty() { 1.0 } else { mean },
            rows: avg(|p| &p.job),
            cols: avg(|p| &p.partner),
        }
    }

    pub fn predict(&self, job: &JobKey, partner: &JobKey) -> f64 {
        let r = self.rows.get(job).map_or(0.0, |v| v - self.mean);
        let c = self.cols.get(partner).map_or(0.0, |v| v - self.mean);
        (self.mean + r + c).clamp(0.01, 1.0)
    }
}

/// The pairing quality of a predictor: assign each of `rows` (offline) to
/// one of `cols` (online; rows ≤ cols) maximizing the sum of `predicted`;
/// the result is that assignment's sum of `truth` over the best sum of
/// `truth`. `None` entries cannot co-locate (never chosen when avoidable;
/// worth 0).
pub fn pairing_quality(
    rows: usize,
    cols: usize,
    predicted: &dyn Fn(usize, usize) -> Option<f64>,
    truth: &dyn Fn(usize, usize) -> Option<f64>,
) -> f64 {
    use pathfinding::kuhn_munkres::kuhn_munkres;
    use pathfinding::matrix::Matrix;
    if rows == 0 || cols < rows {
        return 1.0;
    }
    let scaled = |v: Option<f64>| v.map_or(-1_000_000_000, |x| (x * 1e6).round() as i64);
    let assign = |f: &dyn Fn(usize, usize) -> Option<f64>| {
        let mut m = Matrix::new(rows, cols, 0i64);
        for r in 0..rows {
            for c in 0..cols {
                m[(r, c)] = scaled(f(r, c));
            }
        }
        kuhn_munkres(&m).1
    };
    let sum = |a: &[usize]| {
        a.iter()
            .enumerate()
            .map(|(r, &c)| truth(r, c).unwrap_or(0.0))
            .sum::<f64>()
    };
    let best = sum(&assign(truth));
    if best <= 0.0 {
        return 1.0;
    }
    sum(&assign(predicted)) / best
}

/// Held-out split: 1 in 5 pairs by a hash of their keys.
pub fn is_held_out(job: &JobKey, partner: &JobKey) -> bool {
    // FNV-1a: stable across runs and builds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in [&job.0, &job.1, &partner.0, &partner.1]
        .iter()
        .flat_map(|s| s.bytes().chain([0]))
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    // splitmix64's finalizer: FNV's high bits barely move with the last
    // bytes, and keys often differ only there.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (h ^ (h >> 31)).is_multiple_of(5)
}

/// `--evaluate`'s figures (and `muxflow-sim predictor`'s, per seed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    pub records: usize,
    pub train_pairs: usize,
    pub test_pairs: usize,
    pub default_mae: f64,
    pub rowcol_mae: f64,
    pub model_mae: f64,
    pub default_pairing: f64,
    pub rowcol_pairing: f64,
    pub model_pairing: f64,
    /// Mean predicted sd over the held-out pairs.
    pub model_sd: f64,
}

impl std::fmt::Display for Evaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "offline runs {} -> pairs (offline job x online job): {} to train on, {} held out \
             (normalized throughput = speed next to the partner at full load / speed with an idle partner)",
            self.records, self.train_pairs, self.test_pairs
        )?;
        if self.test_pairs == 0 {
            writeln!(
                f,
                "no held-out pair: a pair is an offline job's shared runs next to one online job"
            )?;
            return write!(f, "mae=- pairing=- default_pairing=-");
        }
        writeln!(f, "{:<34} {:>8} {:>8}", "predictor", "MAE", "pairing")?;
        for (name, mae, pairing) in [
            (
                "default (min(1, share/0.5))",
                self.default_mae,
                self.default_pairing,
            ),
            ("row-col means", self.rowcol_mae, self.rowcol_pairing),
            (
                "model (side features + MF)",
                self.model_mae,
                self.model_pairing,
            ),
        ] {
            writeln!(f, "{name:<34} {mae:>8.3} {pairing:>8.3}")?;
        }
        writeln!(
            f,
            "model's mean predicted sd on held-out pairs: {:.3}",
            self.model_sd
        )?;
        write!(
            f,
            "mae={:.3} pairing={:.3} default_pairing={:.3}",
            self.model_mae, self.model_pairing, self.default_pairing
        )
    }
}

/// Scores the three predictors on `test` pairs given a model trained
/// without them and the row-col baseline fitted on `train`. Pairing:
/// among the test pairs' jobs and partners, each job to one partner
/// (pairs not in `test` unknown: cannot be chosen).
pub fn score(model: &Model, train: &[PairObs], test: &[PairObs]) -> Evaluation {
    let rc = RowColMeans::fit(train);
    let n = test.len().max(1) as f64;
    let pred = |p: &PairObs| model.predict_pair(&p.job, &p.partner, p.share, p.mem);
    let mut e = Evaluation {
        train_pairs: train.len(),
        test_pairs: test.len(),
        ..Evaluation::default()
    };
    for p in test {
        e.default_mae += (default_prediction(p.share) - p.x).abs() / n;
        e.rowcol_mae += (rc.predict(&p.job, &p.partner) - p.x).abs() / n;
        let m = pred(p).unwrap_or(Estimate {
            mean: 0.01,
            sd: 0.0,
            p_fail: 1.0,
        });
        e.model_mae += (m.mean - p.x).abs() / n;
        e.model_sd += m.sd / n;
    }
    let rows: Vec<&JobKey> = test
        .iter()
        .map(|p| &p.job)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let cols: Vec<&JobKey> = test
        .iter()
        .map(|p| &p.partner)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let at: BTreeMap<(usize, usize), &PairObs> = test
        .iter()
        .map(|p| {
            let r = rows.binary_search(&&p.job).expect("collected");
            let c = cols.binary_search(&&p.partner).expect("collected");
            ((r, c), p)
        })
        .collect();
    // More jobs than partners: the assignment runs the other way round.
    let (nr, nc, flip) = if rows.len() <= cols.len() {
        (rows.len(), cols.len(), false)
    } else {
        (cols.len(), rows.len(), true)
    };
    let get = |r: usize, c: usize| at.get(&if flip { (c, r) } else { (r, c) }).copied();
    let truth = |r, c| get(r, c).map(|p| p.x);
    e.default_pairing = pairing_quality(
        nr,
        nc,
        &|r, c| get(r, c).map(|p| default_prediction(p.share)),
        &truth,
    );
    e.rowcol_pairing = pairing_quality(
        nr,
        nc,
        &|r, c| get(r, c).map(|p| rc.predict(&p.job, &p.partner)),
        &truth,
    );
    e.model_pairing = pairing_quality(
        nr,
        nc,
        &|r, c| get(r, c).and_then(&pred).map(|m| m.mean),
        &truth,
    );
    e
}

/// `muxflow-matcher --evaluate`: the pairs of the history, 1 in 5 held out
/// ([`is_held_out`]); the model and the baseline learn from the runs of
/// the other pairs; each held-out pair's truth is its estimate from all
/// runs (solo speeds from all runs: the denominator, not a prediction).
pub fn evaluate(runs: &[Run]) -> Evaluation {
    let all = estimate(runs);
    let (test, train): (Vec<PairObs>, Vec<PairObs>) = all
        .pairs
        .iter()
        .cloned()
        .partition(|p| is_held_out(&p.job, &p.partner));
    let train_runs: Vec<Run> = runs
        .iter()
        .filter(|r| !partner_of(r).is_some_and(|p| is_held_out(&r.key, &p)))
        .cloned()
        .collect();
    let model = Model::train(&train_runs);
    Evaluation {
        records: runs.len(),
        ..score(&model, &train, &test)
    }
}

/// Synthetic offline history for tests and `--evaluate --synthetic N`:
/// `jobs` offline jobs and 8 online services; a pair's normalized
/// throughput is low-rank (job sensitivity × service pressure) and runs
/// next to a partner at a random load progress at `σ (1 − load (1 − x))`
/// launches/s with 3% noise. No run alone. A model of contention, not a
/// measurement. Returns the runs and the true x per (job, service).
pub fn synthetic_runs(jobs: usize, runs_per_job: usize, seed: u64) -> Vec<Run> {
    synthetic(jobs, runs_per_job, seed).0
}

/// [`synthetic_runs`] with the hidden truth: solo launches/s per job and
/// x per (job, service index).
pub fn synthetic(
    jobs: usize,
    runs_per_job: usize,
    seed: u64,
) -> (Vec<Run>, Vec<f64>, Vec<Vec<f64>>) {
    const SERVICES: usize = 8;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pressure: Vec<f64> = (0..SERVICES).map(|_| rng.gen_range(0.1..0.9)).collect();
    let mut out = Vec::new();
    let mut solo = Vec::new();
    let mut truth = Vec::new();
    let mut id = 1000u32;
    for j in 0..jobs {
        let sensitivity: f64 = rng.gen_range(0.2..0.8);
        let sigma: f64 = rng.gen_range(50.0..5000.0);
        let peak: u64 = rng.gen_range(2_000..20_000);
        let key = (format!("user{}", j % 7), format!("train-{j}"));
        let x: Vec<f64> = pressure.iter().map(|p| 1.0 - sensitivity * p).collect();
        for _ in 0..runs_per_job {
            let k = rng.gen_range(0..SERVICES);
            let load: f64 = rng.gen_range(0.1..1.0);
            let noise: f64 = rng.gen_range(0.97..1.03);
            let rate = sigma * (1.0 - load * (1.0 - x[k])) * noise;
            let run_s = 600;
            id += 1;
            out.push(Run {
                job_id: id,
                key: key.clone(),
                report: JobReport {
                    mode: Some(Mode::Offline),
                    sm_pct: Some(50),
                    mem_cap_mib: Some(40_000),
                    measured_peak_mib: Some(peak),
                    partner: Some(k as u32 + 1),
                    partner_load_pct: Some((load * 100.0).round() as u8),
                    run_s: Some(run_s),
                    launches: Some((rate * run_s as f64).round() as u64),
                    ..JobReport::default()
                },
                end_s: 0,
                partner_key: Some(("svc".into(), format!("online-{k}"))),
            });
        }
        solo.push(sigma);
        truth.push(x);
    }
    (out, solo, truth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow::policy::health::HealthState;
    use muxflow::records::published::GpuPublished;
    use muxflow::records::report::GangGpu;

    fn key(u: &str, n: &str) -> JobKey {
        (u.to_string(), n.to_string())
    }

    #[test]
    fn learned_model_beats_the_default_on_held_out_pairs() {
        let runs = synthetic_runs(60, 12, 7);
        let e = evaluate(&runs);
        assert!(e.test_pairs > 20 && e.train_pairs > 100, "{e:?}");
        assert!(e.model_mae < e.default_mae * 0.5, "{e}");
        assert!(e.model_mae <= e.rowcol_mae, "{e}");
        assert!(
            e.model_pairing > e.default_pairing - 0.05 && e.model_pairing > 0.8,
            "{e}"
        );
    }

    #[test]
    fn a_planted_low_rank_matrix_is_recovered_from_a_third_of_its_pairs() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (rows, cols) = (30, 20);
        let a: Vec<f64> = (0..rows).map(|_| rng.gen_range(0.1..0.9)).collect();
        let b: Vec<f64> = (0..cols).map(|_| rng.gen_range(0.1..0.9)).collect();
        let x = |i: usize, k: usize| 1.0 - a[i] * b[k];
        let (mut train, mut test) = (Vec::new(), Vec::new());
        for i in 0..rows {
            for k in 0..cols {
                let p = PairObs {
                    job: key("u", &format!("j{i}")),
                    partner: key("s", &format!("k{k}")),
                    x: x(i, k),
                    runs: 3,
                    share: 0.5,
                    mem: 0.5,
                    rate: DEFAULT_RATE,
                };
                if rng.gen_bool(0.33) {
                    train.push(p)
                } else {
                    test.push(p)
                }
            }
        }
        let m = Model::from_estimates(&Estimates {
            pairs: train.clone(),
            ..Estimates::default()
        });
        let e = score(&m, &train, &test);
        assert!(e.model_mae < 0.03, "{e}");
        assert!(e.model_mae < e.rowcol_mae * 0.6, "{e}");
        assert!(e.model_pairing > 0.98, "{e}");
    }

    /// A gang beside two different online jobs says nothing about either
    /// pair; beside one online job on all its GPUs it is that pair's run.
    #[test]
    fn gang_runs_count_only_beside_one_partner() {
        let (runs, _, _) = synthetic(1, 12, 5);
        let base = estimate(&runs);
        // Partner id k + 1 is ("svc", "online-k") in `synthetic`.
        let pair_x = |e: &Estimates, id: u32| {
            let want: JobKey = ("svc".into(), format!("online-{}", id - 1));
            e.pairs
                .iter()
                .find(|p| p.partner == want)
                .map(|p| (p.x, p.runs))
        };
        let first = runs[0].report.partner.unwrap();
        let before = pair_x(&base, first).unwrap();
        // The same pair, a run far slower than any before, as a gang whose
        // second GPU was beside another online job, then beside the same.
        let mut gang = runs[0].clone();
        gang.job_id = 99_999;
        gang.report.launches = gang.report.launches.map(|l| l / 10);
        gang.report.gang = vec![GangGpu {
            gpu: 1,
            partner: Some(first % 8 + 1),
            ..GangGpu::default()
        }];
        let mixed: Vec<Run> = runs.iter().cloned().chain([gang.clone()]).collect();
        assert_eq!(pair_x(&estimate(&mixed), first), Some(before));
        gang.report.gang[0].partner = gang.report.partner;
        let same: Vec<Run> = runs.iter().cloned().chain([gang]).collect();
        let after = pair_x(&estimate(&same), first).unwrap();
        assert_eq!(after.1, before.1 + 1);
        assert!(after.0 < before.0, "{after:?} vs {before:?}");
    }

    /// A run that shared its GPU with other offline jobs is slower for
    /// their sake: neither its solo speed nor its pair may learn from it.
    #[test]
    fn runs_beside_other_offline_jobs_teach_nothing() {
        let (mut runs, _, _) = synthetic(1, 12, 5);
        let first = runs[0].report.partner.unwrap();
        let mut alone = runs[0].clone();
        alone.report.partner = None;
        alone.report.partner_load_pct = None;
        alone.partner_key = None;
        runs.push(alone);
        let base = estimate(&runs);
        let profile = |e: &Estimates| e.profiles[&runs[0].key].clone();
        let pair = |e: &Estimates| {
            let want: JobKey = ("svc".into(), format!("online-{}", first - 1));
            e.pairs.iter().find(|p| p.partner == want).cloned().unwrap()
        };
        // The same runs a third as fast, beside another offline job: alone
        // and beside the first partner.
        let slow: Vec<Run> = runs[..1]
            .iter()
            .chain(runs.last())
            .map(|r| {
                let mut r = r.clone();
                r.job_id += 50_000;
                r.report.launches = r.report.launches.map(|l| l / 3);
                r.report.peers = vec![77];
                r
            })
            .collect();
        let with = estimate(&runs.iter().cloned().chain(slow.clone()).collect::<Vec<_>>());
        assert_eq!(profile(&with).solo, profile(&base).solo);
        assert_eq!(pair(&with), pair(&base));
        assert_eq!(profile(&with).runs, profile(&base).runs + 2);
        assert_eq!(profile(&with).peer_runs, 2);
        // Failing for memory beside another offline job: no pair is ruled
        // out, but the job needs more than the cap it had there.
        let mut failed = runs[0].clone();
        failed.job_id = 70_000;
        failed.report.launches = None;
        failed.report.oom = Some(1);
        failed.report.mem_cap_mib = Some(30_000);
        failed.report.peers = vec![77];
        let e = estimate(
            &runs
                .iter()
                .cloned()
                .chain([failed.clone()])
                .collect::<Vec<_>>(),
        );
        assert!(e.infeasible.is_empty());
        assert_eq!(profile(&e).peak_mib, Some(30_001));
        failed.report.peers.clear();
        let e = estimate(&runs.iter().cloned().chain([failed]).collect::<Vec<_>>());
        assert_eq!(e.infeasible.len(), 1, "alone with its partner: the pair's");
        // Without the peers they are read as the job's own runs (the check
        // above can fail).
        let unmarked: Vec<Run> = slow
            .into_iter()
            .map(|mut r| {
                r.report.peers.clear();
                r
            })
            .collect();
        let read = estimate(&runs.iter().cloned().chain(unmarked).collect::<Vec<_>>());
        assert!(profile(&read).solo < profile(&base).solo);
    }

    /// What other offline jobs on its GPU cost a job is learned from its
    /// own runs beside them, per other job.
    #[test]
    fn the_cost_of_offline_peers_is_learned_per_job() {
        let (runs, _, _) = synthetic(2, 12, 9);
        let key = runs[0].key.clone();
        let other = runs.iter().find(|r| r.key != key).unwrap().key.clone();
        // Job 0's runs again: beside one peer at 60% of the speed, beside
        // two at 36% (0.6 each).
        let peer_runs: Vec<Run> = runs
            .iter()
            .filter(|r| r.key == key)
            .take(6)
            .enumerate()
            .map(|(i, r)| {
                let mut r = r.clone();
                r.job_id += 50_000;
                let (factor, peers) = if i % 2 == 0 {
                    (0.6, vec![1])
                } else {
                    (0.36, vec![1, 2])
                };
                r.report.launches = r.report.launches.map(|l| (l as f64 * factor) as u64);
                r.report.peers = peers;
                r
            })
            .collect();
        let all: Vec<Run> = runs.iter().cloned().chain(peer_runs).collect();
        let m = Model::train(&all);
        let (learned, n) = m.job_terms(&key).beside_offline.expect("learned");
        assert!((learned - 0.6).abs() < 0.03, "{learned}");
        assert_eq!(n, 6);
        // Used as 6 runs against one of the prior (what a job with no such
        // run gets).
        let mut unknown = m.job_terms(&key);
        unknown.beside_offline = None;
        let prior = m.beside_offline(&unknown, 0.5);
        let want = ((6.0 * learned.ln() + prior.ln()) / 7.0).exp();
        assert!((m.beside_offline(&m.job_terms(&key), 0.5) - want).abs() < 1e-12);
        assert!(
            (prior - learned).abs() > 0.05,
            "the check can tell them apart"
        );
        // A job with no run beside other offline jobs keeps the prior.
        let terms = m.job_terms(&other);
        assert_eq!(terms.beside_offline, None);
        assert!(m.beside_offline(&terms, 0.5) > 0.0);
        // Without peer runs nothing is learned for job 0 either.
        assert_eq!(Model::train(&runs).job_terms(&key).beside_offline, None);
        // Failing for memory beside other offline jobs lowers what the
        // round expects of it there: 6 runs and 1 failure, 1/8.
        let mut failed = all.iter().find(|r| r.key == key).unwrap().clone();
        failed.job_id = 90_000;
        failed.report.launches = None;
        failed.report.oom = Some(1);
        failed.report.peers = vec![3];
        let m = Model::train(&all.iter().cloned().chain([failed]).collect::<Vec<_>>());
        let terms = m.job_terms(&key);
        assert!((terms.beside_offline_fail - 1.0 / 8.0).abs() < 1e-12);
        let mut no_failures = terms;
        no_failures.beside_offline_fail = 0.0;
        assert!(
            (m.beside_offline(&terms, 0.5) - m.beside_offline(&no_failures, 0.5) * 7.0 / 8.0).abs()
                < 1e-12
        );
    }

    #[test]
    fn solo_speed_is_recovered_from_shared_runs_at_varying_partner_load() {
        let (runs, solo, truth) = synthetic(20, 12, 3);
        assert!(
            runs.iter().all(|r| r.report.partner.is_some()),
            "no run alone"
        );
        let e = estimate(&runs);
        for (j, sigma) in solo.iter().enumerate() {
            let p = &e.profiles[&(format!("user{}", j % 7), format!("train-{j}"))];
            assert_eq!(p.signal, Some(Signal::LaunchesPerS));
            let got = p.solo.unwrap();
            assert!(
                (got / sigma - 1.0).abs() < 0.05,
                "job {j}: {got} vs {sigma}"
            );
        }
        let err: f64 = e
            .pairs
            .iter()
            .map(|p| {
                let j: usize = p.job.1["train-".len()..].parse().unwrap();
                let k: usize = p.partner.1["online-".len()..].parse().unwrap();
                (p.x - truth[j][k]).abs()
            })
            .sum::<f64>()
            / e.pairs.len() as f64;
        assert!(err < 0.05, "pair estimates off by {err}");
    }

    #[test]
    fn cold_start_falls_back_to_side_features_then_the_default_and_widens() {
        let (runs, _, _) = synthetic(30, 10, 5);
        let m = Model::train(&runs);
        let seen = m.seen[0];
        let job = m
            .job_index
            .iter()
            .find(|(_, &i)| i == seen.0)
            .unwrap()
            .0
            .clone();
        let partner = m
            .partner_index
            .iter()
            .find(|(_, &i)| i == seen.1)
            .unwrap()
            .0
            .clone();
        let unseen_partner = m
            .partner_index
            .iter()
            .map(|(k, &i)| (k, i))
            .find(|&(_, i)| {
                !m.seen[m.seen_range[seen.0 as usize].0 as usize
                    ..m.seen_range[seen.0 as usize].1 as usize]
                    .iter()
                    .any(|s| s.1 == i)
            })
            .expect("a service job 0 never met")
            .0
            .clone();
        let new_job = key("someone", "never-ran");
        let new_svc = key("svc", "never-hosted");
        let at = |j: &JobKey, p: &JobKey| m.predict_pair(j, p, 0.5, 0.3).unwrap();
        let levels = [
            ("pair seen", at(&job, &partner)),
            ("both seen, pair not", at(&job, &unseen_partner)),
            ("job new", at(&new_job, &partner)),
            ("both new", at(&new_job, &new_svc)),
        ];
        for w in levels.windows(2) {
            assert!(w[0].1.sd < w[1].1.sd, "{levels:?}");
        }
        // Both new: the side features alone, the same for any new pair.
        assert_eq!(at(&new_job, &new_svc), at(&key("b", "c"), &key("d", "e")));
        let none = Model::train(&[]);
        let d = none.predict_pair(&new_job, &new_svc, 0.25, 0.3).unwrap();
        assert_eq!((d.mean, d.sd), (0.5, DEFAULT_SD));
        assert!(levels[3].1.sd < DEFAULT_SD, "{levels:?}");
        // Exploration is bounded.
        assert!(levels[3].1.weight() - levels[3].1.mean <= EXPLORE_MAX + 1e-12);
    }

    #[test]
    fn records_round_trip_through_the_admincomment_codec() {
        use crate::reader::{SacctComment, SacctJob};
        let (runs, _, _) = synthetic(10, 6, 9);
        let mut listing: Vec<SacctJob> = runs
            .iter()
            .map(|r| SacctJob {
                job_id: r.job_id,
                name: r.key.1.clone(),
                user: r.key.0.clone(),
                comment: SacctComment {
                    administrator: Some(r.report.encode()),
                },
                ..SacctJob::default()
            })
            .collect();
        // The online services, running: their names resolve the partners.
        for k in 0..8u32 {
            listing.push(SacctJob {
                job_id: k + 1,
                name: format!("online-{k}"),
                user: "svc".into(),
                ..SacctJob::default()
            });
        }
        let back = runs_from_sacct(&listing);
        assert_eq!(back, runs);
        assert_eq!(estimate(&back), estimate(&runs));
    }

    #[test]
    fn a_pair_that_failed_for_memory_is_excluded_not_predicted_slow() {
        let (mut runs, _, _) = synthetic(12, 10, 2);
        let job = runs[0].key.clone();
        runs.push(Run {
            job_id: 1,
            key: job.clone(),
            report: JobReport {
                mode: Some(Mode::Offline),
                partner: Some(99),
                oom: Some(1),
                run_s: Some(3),
                ..JobReport::default()
            },
            end_s: 0,
            partner_key: Some(key("svc", "big-model")),
        });
        let m = Model::train(&runs);
        assert_eq!(
            m.predict_pair(&job, &key("svc", "big-model"), 0.5, 0.3),
            None
        );
        assert!(m
            .predict_pair(&job, &key("svc", "online-0"), 0.5, 0.3)
            .is_some());
        let gpu = gpu_with(10, vec![99]);
        let p = Policy::default();
        assert_eq!(
            m.predict(&job, &gpu, &p),
            None,
            "by the online job's id too"
        );
        assert!(
            m.predict(&runs[15].key, &gpu, &p).is_some(),
            "another job may go there"
        );
        // Its untried pairs carry the risk into what the matcher maximizes.
        let risky = m
            .predict_pair(&job, &key("svc", "never-hosted"), 0.5, 0.3)
            .unwrap();
        let clean = m
            .predict_pair(&runs[15].key, &key("svc", "never-hosted"), 0.5, 0.3)
            .unwrap();
        assert!(risky.p_fail > clean.p_fail, "{risky:?} {clean:?}");
    }

    #[test]
    fn the_predictor_learns_from_what_the_node_measured() {
        use crate::reader::{SacctComment, SacctJob};
        let job = |id: u32, comment: &str| SacctJob {
            job_id: id,
            name: "train".into(),
            user: "u".into(),
            comment: SacctComment {
                administrator: Some(comment.into()),
            },
            ..SacctJob::default()
        };
        let jobs = [
            job(
                1,
                "muxflow:v1 mode=offline mem_cap_mib=1000 measured_peak_mib=300 claim.peak_mib=5",
            ),
            job(
                2,
                "muxflow:v1 mode=offline mem_cap_mib=1000 peak_mib=900000",
            ),
            job(
                3,
                "muxflow:v1 mode=offline policed=no_xcuda claim.steps_per_s=1000",
            ),
            job(4, "muxflow:v1 mode=online"),
        ];
        let runs = runs_from_sacct(&jobs);
        let ids: Vec<u32> = runs.iter().map(|r| r.job_id).collect();
        assert_eq!(ids, [1, 2], "policed and online runs are not learned from");
        let peaks: Vec<Option<u64>> = runs.iter().map(|r| trusted_peak_mib(&r.report)).collect();
        assert_eq!(
            peaks,
            [Some(300), Some(1000)],
            "the node's measurement over the claim; an old claim never above the cap"
        );
    }

    #[test]
    fn steps_are_preferred_and_launches_need_the_nodes_run_time() {
        let r = JobReport {
            steps_per_s: Some(2.0),
            launches: Some(600),
            run_s: Some(60),
            ..JobReport::default()
        };
        assert_eq!(progress(&r, Signal::StepsPerS), Some(2.0));
        assert_eq!(progress(&r, Signal::LaunchesPerS), Some(10.0));
        let no_time = JobReport {
            launches: Some(600),
            ..JobReport::default()
        };
        assert_eq!(progress(&no_time, Signal::LaunchesPerS), None);
    }

    fn gpu_with(solo: u8, online: Vec<u32>) -> GpuState {
        GpuState {
            node: "n".into(),
            index: 0,
            published: GpuPublished {
                index: 0,
                state: HealthState::Healthy,
                solo_sm_pct: Some(solo),
                online_mem_mib: Some(10_000),
                mem_mib: 80_000,
                offline: 0,
                multiuser: true,
            },
            online_jobs: online,
            offline_jobs: 0,
            owners: Vec::new(),
            slots_used: 0,
        }
    }

    #[test]
    fn share_and_room_are_the_policys() {
        let p = Policy::default();
        assert_eq!(sm_share(Some(35), &p), 0.55);
        assert_eq!(sm_share(Some(95), &p), 0.10);
        assert_eq!(sm_share(Some(0), &p), 0.80);
        assert_eq!(sm_share(None, &p), 0.30);
        assert_eq!(
            memory_room_mib(&gpu_with(10, vec![1]), &p),
            80_000 - 10_000 - 2048
        );
    }

    #[test]
    fn two_jobs_with_different_histories_get_different_predictions_and_pairings() {
        // Job a ran slow next to service 1 and fast next to 2; b the other
        // way round: each is predicted (and placed) where it ran fast.
        let mut runs = Vec::new();
        let mut id = 100;
        for (job, slow, fast, rate) in [("a", 1u32, 2u32, 900.0), ("b", 2, 1, 40.0)] {
            for (partner, x) in [(slow, 0.4), (fast, 0.9)] {
                for load in [30u8, 60, 90] {
                    id += 1;
                    let l = f64::from(load) / 100.0;
                    runs.push(Run {
                        job_id: id,
                        key: key("u", job),
                        report: JobReport {
                            mode: Some(Mode::Offline),
                            partner: Some(partner),
                            partner_load_pct: Some(load),
                            run_s: Some(100),
                            launches: Some((rate * (1.0 - l * (1.0 - x)) * 100.0) as u64),
                            ..JobReport::default()
                        },
                        end_s: 0,
                        partner_key: Some(key("svc", &format!("s{partner}"))),
                    });
                }
            }
        }
        let m = Model::train(&runs);
        let p = Policy::default();
        let at = |job: &str, svc: u32| {
            m.predict(&key("u", job), &gpu_with(20, vec![svc]), &p)
                .unwrap()
                .mean
        };
        assert!(
            at("a", 2) > at("a", 1) + 0.3,
            "{} {}",
            at("a", 2),
            at("a", 1)
        );
        assert!(at("b", 1) > at("b", 2) + 0.3);
    }

    #[test]
    fn a_cold_job_is_predicted_from_its_launch_rate_when_rates_explain_the_pairs() {
        // Jobs that launch more suffer more next to every partner; a job
        // never seen is told apart only by its launch rate.
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut pairs = Vec::new();
        for i in 0..24 {
            let rate = rng.gen_range(0.1..0.9);
            for k in 0..4 {
                pairs.push(PairObs {
                    job: key("u", &format!("j{i}")),
                    partner: key("s", &format!("k{k}")),
                    x: 1.0 - 0.8 * rate + rng.gen_range(-0.02..0.02),
                    runs: 2,
                    share: 0.5,
                    mem: 0.5,
                    rate,
                });
            }
        }
        let m = Model::from_estimates(&Estimates {
            pairs,
            run_sd: 0.02,
            ..Estimates::default()
        });
        let gpu = GpuTerms {
            share: 0.5,
            room_mib: u64::MAX,
            partner: None,
            others: 0,
            budget: 0.5,
        };
        let cold = |rate: f64| {
            let job = JobTerms {
                index: None,
                peak_mib: None,
                rate,
                beside_offline: None,
                beside_offline_fail: 0.0,
            };
            m.predict_terms(&job, &gpu).unwrap().mean
        };
        assert!((cold(0.2) - 0.84).abs() < 0.05, "{}", cold(0.2));
        assert!((cold(0.8) - 0.36).abs() < 0.05, "{}", cold(0.8));
    }

    #[test]
    fn the_launch_rate_is_left_out_where_it_explains_nothing() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let pairs: Vec<PairObs> = (0..40)
            .map(|i| PairObs {
                job: key("u", &format!("j{i}")),
                partner: key("s", "k"),
                x: rng.gen_range(0.3..0.9),
                runs: 2,
                share: rng.gen_range(0.3..0.9),
                mem: 0.5,
                rate: rng.gen_range(0.0..1.0),
            })
            .collect();
        assert_eq!(choose_features(&pairs), BASE_FEATURES);
    }

    #[test]
    fn side_features_are_not_extrapolated_beyond_the_history() {
        // The history saw small jobs only (memory feature up to 0.1), where
        // more memory cost speed steeply; a job filling the room is not
        // predicted from that slope's extension (which says 0).
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let pairs: Vec<PairObs> = (0..30)
            .map(|i| {
                let mem = rng.gen_range(0.0..0.1);
                PairObs {
                    job: key("u", &format!("j{i}")),
                    partner: key("s", &format!("k{}", i % 3)),
                    x: 1.0 - 3.0 * mem,
                    runs: 2,
                    share: 0.5,
                    mem,
                    rate: DEFAULT_RATE,
                }
            })
            .collect();
        let m = Model::from_estimates(&Estimates {
            pairs,
            run_sd: 0.02,
            ..Estimates::default()
        });
        let gpu = GpuTerms {
            share: 0.5,
            room_mib: 10_000,
            partner: None,
            others: 0,
            budget: 0.5,
        };
        let big = JobTerms {
            index: None,
            peak_mib: Some(9_000),
            rate: DEFAULT_RATE,
            beside_offline: None,
            beside_offline_fail: 0.0,
        };
        let e = m.predict_terms(&big, &gpu).unwrap();
        // Within what the history saw (0.7 to 1), not the slope's 0.01.
        assert!(e.mean > 0.65 && e.mean <= 1.0, "{e:?}");
    }

    #[test]
    fn a_partner_sacct_did_not_list_is_found_by_its_job_id() {
        // The online job was running and not in the listing: its runs name
        // it by id, and a GPU whose online job has that id finds the pair.
        let runs: Vec<Run> = [(0.3, 500u64), (0.9, 380)]
            .iter()
            .enumerate()
            .map(|(i, &(load, launches))| Run {
                job_id: 100 + i as u32,
                key: key("u", "train"),
                report: JobReport {
                    mode: Some(Mode::Offline),
                    partner: Some(76),
                    partner_load_pct: Some((load * 100.0) as u8),
                    run_s: Some(1),
                    launches: Some(launches),
                    ..JobReport::default()
                },
                end_s: 1,
                partner_key: None,
            })
            .collect();
        let m = Model::train(&runs);
        let gpu = GpuTerms {
            share: 0.5,
            room_mib: u64::MAX,
            partner: m.partner_by_id.get(&76).copied(),
            others: 0,
            budget: 0.5,
        };
        assert!(gpu.partner.is_some());
        let e = m
            .predict_terms(&m.job_terms(&key("u", "train")), &gpu)
            .unwrap();
        // progress = σ(1 − load·d): 500 at 0.3, 380 at 0.9 → σ = 560, x = 0.64.
        assert!((e.mean - 0.64).abs() < 0.08, "{e:?}");
    }
}
