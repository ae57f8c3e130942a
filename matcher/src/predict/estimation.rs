//! Per job, from its runs: the solo speed and each pair's slowdown
//! ([`estimate`], the fit the parent module describes).

use super::*;

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

pub(super) struct Obs {
    pub(super) partner: Option<usize>,
    pub(super) load: f64,
    pub(super) p: f64,
    pub(super) share: f64,
    pub(super) mem: f64,
}

/// Estimates solo speeds and pair throughputs from `runs` (module docs).
pub fn estimate(runs: &[Run]) -> Estimates {
    let mut out = Estimates::default();
    let by_job = group_runs(runs, &mut out.partner_ids);
    // One name per partner: the resolved one wherever any run resolved it
    // (read by reference: the map goes back into `out` at the end).
    let names = std::mem::take(&mut out.partner_ids);
    let peaks = partner_peaks(runs, &names);
    // Jobs are independent: contiguous blocks of them on the workers (the
    // retraining holds up the daemon's round and the replay's), merged in
    // job order, so the estimates are those of one pass over the jobs.
    let threads = crate::solver::SolveOptions::default().threads.max(1);
    let parts = crate::workers::blocks(by_job.len(), threads, |r| {
        let (mut part, mut spread) = (Estimates::default(), Spread::default());
        for (key, job_runs) in &by_job[r] {
            estimate_job(key, job_runs, &names, &peaks, &mut part, &mut spread);
        }
        (part, spread)
    });
    let mut spread = Spread::default();
    for (mut part, s) in parts {
        out.profiles.append(&mut part.profiles);
        out.pairs.append(&mut part.pairs);
        out.infeasible.append(&mut part.infeasible);
        spread.terms.extend(s.terms);
        spread.dof += s.dof;
    }
    // Summed in job order from zero: the same sum as one pass's.
    let sq = spread.terms.iter().fold(0.0, |sq, t| sq + t);
    out.run_sd = if spread.dof > 0 {
        (sq / spread.dof as f64).sqrt()
    } else {
        0.05
    };
    out.partner_ids = names;
    out
}

/// Single runs around their pair's curve: the squares, in the order of
/// the jobs and their pairs, and the degrees of freedom.
#[derive(Default)]
struct Spread {
    terms: Vec<f64>,
    dof: usize,
}

/// Runs grouped by job, in key order (hashed, then the groups sorted: a
/// tree compared both strings of every run's key at each level); each
/// partner's job id into `partner_ids`.
fn group_runs<'r>(
    runs: &'r [Run],
    partner_ids: &mut BTreeMap<u32, JobKey>,
) -> Vec<(&'r JobKey, Vec<&'r Run>)> {
    let mut group_of: std::collections::HashMap<&JobKey, usize> = Default::default();
    let mut by_job: Vec<(&JobKey, Vec<&Run>)> = Vec::new();
    for r in runs {
        let g = *group_of.entry(&r.key).or_insert_with(|| {
            by_job.push((&r.key, Vec::new()));
            by_job.len() - 1
        });
        by_job[g].1.push(r);
        if let (Some(id), Some(k)) = (r.report.partner, &r.partner_key) {
            partner_ids.insert(id, k.clone());
        }
    }
    // A partner the listing did not resolve (sacct may not list a running
    // job yet) is known by its job id, so a GPU whose online job has that
    // id still finds the pair.
    for r in runs {
        if let Some(id) = r.report.partner {
            partner_ids
                .entry(id)
                .or_insert_with(|| unresolved_partner(id));
        }
    }
    drop(group_of);
    by_job.sort_unstable_by(|a, b| a.0.cmp(b.0));
    by_job
}

/// One job's profile and pairs from its runs, into `out`.
fn estimate_job(
    key: &JobKey,
    job_runs: &[&Run],
    names: &BTreeMap<u32, JobKey>,
    peaks: &BTreeMap<JobKey, u8>,
    out: &mut Estimates,
    spread: &mut Spread,
) {
    let canonical = |r: &Run| canonical_partner(names, r);
    let mut prof = Profile {
        runs: job_runs.len(),
        ..Profile::default()
    };
    for r in job_runs {
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
    let (partners, obs) = observations(job_runs, signal, names, peaks);
    if obs.is_empty() {
        out.profiles.insert(key.clone(), prof);
        return;
    }
    prof.signal = Some(signal);
    // Other offline jobs on its GPU slow its launches too.
    let rates: Vec<f64> = job_runs
        .iter()
        .filter(|r| r.report.peers.is_empty())
        .filter_map(|r| progress(&r.report, Signal::LaunchesPerS))
        .collect();
    prof.launch_rate = (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64);
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
        beside_offline_factor(job_runs, signal, sigma, &partners, &d, names, peaks);
    for (k, partner) in partners.into_iter().enumerate() {
        let mine: Vec<&Obs> = obs.iter().filter(|o| o.partner == Some(k)).collect();
        let n = mine.len() as f64;
        for o in &mine {
            spread
                .terms
                .push((o.p / sigma - (1.0 - o.load * d[k])).powi(2));
        }
        spread.dof += mine.len().saturating_sub(1);
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

/// The job's runs beside its partner only (or alone) with a progress
/// reading in `signal`: its partners, numbered in order of first run, and
/// one observation per run.
fn observations(
    job_runs: &[&Run],
    signal: Signal,
    names: &BTreeMap<u32, JobKey>,
    peaks: &BTreeMap<JobKey, u8>,
) -> (Vec<JobKey>, Vec<Obs>) {
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
            let k = canonical_partner(names, r).expect("has a partner");
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
            load: partner_load(&r.report, peak_of(names, peaks, r)),
            p,
            share: r
                .report
                .sm_pct
                .map_or(1.0, |s| f64::from(s.min(100)) / 100.0),
            mem,
        });
    }
    (partners, obs)
}

/// The busiest `partner_sm_pct` seen beside run `r`'s partner.
fn peak_of(names: &BTreeMap<u32, JobKey>, peaks: &BTreeMap<JobKey, u8>, r: &Run) -> Option<u8> {
    canonical_partner(names, r).and_then(|k| peaks.get(k).copied())
}

/// The one name of run `r`'s partner ([`estimate`]'s `names`).
pub(super) fn canonical_partner<'n>(
    names: &'n BTreeMap<u32, JobKey>,
    r: &Run,
) -> Option<&'n JobKey> {
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
pub(super) fn beside_offline_factor(
    runs: &[&Run],
    signal: Signal,
    sigma: f64,
    partners: &[JobKey],
    d: &[f64],
    names: &BTreeMap<u32, JobKey>,
    peaks: &BTreeMap<JobKey, u8>,
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
                    sigma * (1.0 - partner_load(&r.report, peak_of(names, peaks, r)) * d[i])
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
pub(super) fn fit_solo(obs: &[Obs], partners: usize, alone: Vec<f64>) -> (f64, Vec<f64>) {
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
