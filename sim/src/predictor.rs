//! `muxflow-sim predictor`: how well the production predictor learns a
//! measured pair table from the history a cluster would record.
//!
//! Per seed: the table's job types are split at random into an online and
//! an offline half; a random `observed` fraction of the offline × online
//! pairs ran, [`RUNS_PER_PAIR`] times each, at partner loads drawn from the
//! replay's daily curve ([`crate::model::diurnal_load`] at a random hour).
//! Each run becomes the AdminComment the plugin writes (production codec),
//! read back by the matcher's sacct parser: progress in launches/s
//! (`claim.launches` over the node's `run_s`), no run alone, the partner's
//! load as the node records it (`partner_load_pct`), and a run of a pair
//! that cannot co-locate (0/0 in the table) as a failure for memory at
//! start (`claim.oom=1`, no progress).
//!
//! **Assumption**: a run's progress is `solo × (1 − load × (1 − x))` with
//! 3% noise — the measured slowdown `x` at full partner load, none with an
//! idle partner, linear between. The table measured both jobs busy; how
//! interference scales with load is not in the data.
//!
//! The production [`Model`] is trained on those runs; the hidden pairs are
//! scored: MAE of the normalized throughput (pairs that fit; a pair that
//! cannot co-locate is a memory fact the node measures, excluded from every
//! predictor's choices), and the pairing quality
//! ([`muxflow_matcher::predict::pairing_quality`]: offline types to online
//! types maximizing the predicted sum, true sum over the best true sum),
//! for the default, row-col means (of the same pair estimates) and the
//! model.

use muxflow::records::report::JobReport;
use muxflow::Mode;
use muxflow_matcher::predict::{
    default_prediction, estimate, pairing_quality, runs_from_sacct, Model, RowColMeans, Run,
    DEFAULT_MEM,
};
use muxflow_matcher::reader::{SacctComment, SacctJob};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::input::Pairs;

/// Runs of each observed pair.
pub const RUNS_PER_PAIR: usize = 4;
/// The SM share every run had (the table has no share: a constant).
const SHARE_PCT: u8 = 50;
const RUN_S: u64 = 3600;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub name: &'static str,
    pub mae: f64,
    pub pairing: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub observed: f64,
    pub seeds: u64,
    pub offline_types: usize,
    pub online_types: usize,
    pub runs_per_pair: usize,
    /// Mean over seeds, in the order default, row-col means, model.
    pub predictors: Vec<Figures>,
    /// The model's mean predicted standard deviation on hidden pairs.
    pub model_sd: f64,
    /// What a description of each job type by `rank` numbers can reach at
    /// best: models fitted on *every* pair of the split (true values, no
    /// noise), scored like the predictors. Not predictors: ceilings.
    pub ceilings: Vec<Figures>,
}

impl Report {
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} offline x {} online job types, {:.0}% of pairs observed ({} runs each, launches/s, no run alone), {} seeds\n",
            self.offline_types,
            self.online_types,
            self.observed * 100.0,
            self.runs_per_pair,
            self.seeds
        );
        s += &format!("{:<16} {:>8} {:>8}\n", "predictor", "MAE", "pairing");
        for f in &self.predictors {
            s += &format!("{:<16} {:>8.3} {:>8.3}\n", f.name, f.mae, f.pairing);
        }
        s += &format!(
            "model's mean predicted sd on hidden pairs: {:.3}\n",
            self.model_sd
        );
        s += "ceilings: fitted on every pair of the split (all true, no noise), not predictors:\n";
        for f in &self.ceilings {
            s += &format!("{:<16} {:>8.3} {:>8.3}\n", f.name, f.mae, f.pairing);
        }
        s += &format!(
            "mae={:.3} pairing={:.3} default_pairing={:.3}\n",
            self.predictors[2].mae, self.predictors[2].pairing, self.predictors[0].pairing
        );
        s
    }
}

/// Evaluates the predictor on `pairs` (module docs).
pub fn run(pairs: &Pairs, observed: f64, seeds: u64) -> Result<Report, String> {
    if !(observed > 0.0 && observed < 1.0) {
        return Err("--observed must be in (0, 1)".into());
    }
    if seeds == 0 {
        return Err("--seeds must be at least 1".into());
    }
    let n = pairs.types.len();
    if n < 4 {
        return Err(format!(
            "the pair table has {n} job types; at least 4 are needed to split them into online and offline halves"
        ));
    }
    let mut sums = [(0.0, 0.0); 3];
    let mut sd = 0.0;
    let mut ceil = [(0.0, 0.0); CEILING_RANKS.len()];
    let (mut n_off, mut n_on) = (0, 0);
    for seed in 1..=seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let split = Split::draw(n, observed, &mut rng);
        (n_off, n_on) = (split.offline.len(), split.online.len());
        let listing = split.history(pairs, &mut rng);
        sd += split.score_predictors(pairs, &runs_from_sacct(&listing), &mut sums);
        split.score_ceilings(pairs, &mut ceil);
    }
    let s = seeds as f64;
    let names = ["default", "row-col means", "model"];
    Ok(Report {
        observed,
        seeds,
        offline_types: n_off,
        online_types: n_on,
        runs_per_pair: RUNS_PER_PAIR,
        predictors: names
            .iter()
            .zip(sums)
            .map(|(&name, (mae, pairing))| Figures {
                name,
                mae: mae / s,
                pairing: pairing / s,
            })
            .collect(),
        model_sd: sd / s,
        ceilings: CEILING_RANKS
            .iter()
            .zip(ceil)
            .map(|(&rank, (mae, pairing))| Figures {
                name: CEILING_NAMES[rank],
                mae: mae / s,
                pairing: pairing / s,
            })
            .collect(),
    })
}

/// One seed's split of the job types into an online and an offline half,
/// and its offline × online pairs (indices into the halves) in random
/// order: the first `take` observed, the others hidden.
struct Split {
    online: Vec<u16>,
    offline: Vec<u16>,
    all: Vec<(usize, usize)>,
    take: usize,
}

impl Split {
    fn draw(n: usize, observed: f64, rng: &mut ChaCha8Rng) -> Split {
        let mut types: Vec<u16> = (0..n as u16).collect();
        types.shuffle(rng);
        let (online, offline) = types.split_at(n / 2);
        // More offline than online types when odd: assign the other way.
        let (online, offline) = if offline.len() > online.len() {
            (offline, online)
        } else {
            (online, offline)
        };
        let mut all: Vec<(usize, usize)> = (0..offline.len())
            .flat_map(|i| (0..online.len()).map(move |k| (i, k)))
            .collect();
        all.shuffle(rng);
        let take = ((observed * all.len() as f64).round() as usize).clamp(1, all.len());
        Split {
            online: online.to_vec(),
            offline: offline.to_vec(),
            all,
            take,
        }
    }

    fn name(&self, pairs: &Pairs, t: u16) -> String {
        pairs.types[t as usize].clone()
    }

    /// The true throughput of offline type `i` beside online type `k`.
    fn x(&self, pairs: &Pairs, i: usize, k: usize) -> Option<f64> {
        pairs.speed(self.offline[i], self.online[k])
    }

    /// The history: online services (running) and the offline runs of the
    /// observed pairs, as sacct lists them.
    fn history(&self, pairs: &Pairs, rng: &mut ChaCha8Rng) -> Vec<SacctJob> {
        let mut listing: Vec<SacctJob> = self
            .online
            .iter()
            .enumerate()
            .map(|(k, &t)| SacctJob {
                job_id: k as u32 + 1,
                name: self.name(pairs, t),
                user: "svc".into(),
                ..SacctJob::default()
            })
            .collect();
        let mut id = 1000;
        let launches_per_step: Vec<f64> = self
            .offline
            .iter()
            .map(|_| rng.gen_range(10.0..200.0))
            .collect();
        for &(i, k) in &self.all[..self.take] {
            for _ in 0..RUNS_PER_PAIR {
                let load = crate::model::diurnal_load(rng.gen_range(0..24));
                let noise: f64 = rng.gen_range(0.97..1.03);
                let report = match self.x(pairs, i, k) {
                    Some(xv) => {
                        let rate = pairs.solo[self.offline[i] as usize]
                            * launches_per_step[i]
                            * (1.0 - load * (1.0 - xv))
                            * noise;
                        JobReport {
                            mode: Some(Mode::Offline),
                            sm_pct: Some(SHARE_PCT),
                            partner: Some(k as u32 + 1),
                            partner_load_pct: Some((load * 100.0).round() as u8),
                            run_s: Some(RUN_S),
                            launches: Some((rate * RUN_S as f64).round() as u64),
                            ..JobReport::default()
                        }
                    }
                    None => JobReport {
                        mode: Some(Mode::Offline),
                        sm_pct: Some(SHARE_PCT),
                        partner: Some(k as u32 + 1),
                        run_s: Some(5),
                        oom: Some(1),
                        ..JobReport::default()
                    },
                };
                id += 1;
                listing.push(SacctJob {
                    job_id: id,
                    name: self.name(pairs, self.offline[i]),
                    user: "train".into(),
                    comment: SacctComment {
                        administrator: Some(report.encode()),
                    },
                    ..SacctJob::default()
                });
            }
        }
        listing
    }

    /// Scores the default, row-col means and the model trained on `runs`
    /// on the hidden pairs, adding each one's (MAE, pairing) to `sums`;
    /// returns the model's mean predicted sd on them.
    fn score_predictors(&self, pairs: &Pairs, runs: &[Run], sums: &mut [(f64, f64); 3]) -> f64 {
        let model = Model::train(runs);
        let rc = RowColMeans::fit(&estimate(runs).pairs);
        let job = |i: usize| ("train".to_string(), self.name(pairs, self.offline[i]));
        let svc = |k: usize| ("svc".to_string(), self.name(pairs, self.online[k]));
        let x = |i: usize, k: usize| self.x(pairs, i, k);
        let share = f64::from(SHARE_PCT) / 100.0;
        let model_at = |i: usize, k: usize| {
            model
                .predict_pair(&job(i), &svc(k), share, DEFAULT_MEM)
                .map_or((0.01, 0.0), |e| (e.mean, e.sd))
        };
        type Pred<'a> = Box<dyn Fn(usize, usize) -> f64 + 'a>;
        let predictors: [Pred; 3] = [
            Box::new(|_, _| default_prediction(share)),
            Box::new(|i, k| rc.predict(&job(i), &svc(k))),
            Box::new(|i, k| model_at(i, k).0),
        ];
        let hidden: Vec<(usize, usize, f64)> = self.all[self.take..]
            .iter()
            .filter_map(|&(i, k)| Some((i, k, x(i, k)?)))
            .collect();
        let h = hidden.len().max(1) as f64;
        for (acc, f) in sums.iter_mut().zip(&predictors) {
            acc.0 += hidden
                .iter()
                .map(|&(i, k, t)| (f(i, k) - t).abs())
                .sum::<f64>()
                / h;
            acc.1 += pairing_quality(
                self.offline.len(),
                self.online.len(),
                &|i, k| x(i, k).map(|_| f(i, k)),
                &|i, k| x(i, k),
            );
        }
        hidden
            .iter()
            .map(|&(i, k, _)| model_at(i, k).1)
            .sum::<f64>()
            / h
    }

    /// Scores the ceiling fits (every pair of the split, true values),
    /// adding each one's (MAE, pairing) to `ceil`.
    fn score_ceilings(&self, pairs: &Pairs, ceil: &mut [(f64, f64); CEILING_RANKS.len()]) {
        let x = |i: usize, k: usize| self.x(pairs, i, k);
        let truth: Vec<Vec<Option<f64>>> = (0..self.offline.len())
            .map(|i| (0..self.online.len()).map(|k| x(i, k)).collect())
            .collect();
        for (acc, &rank) in ceil.iter_mut().zip(&CEILING_RANKS) {
            let fit = low_rank_fit(&truth, rank);
            let (mut err, mut cnt) = (0.0, 0usize);
            for (i, row) in truth.iter().enumerate() {
                for (k, t) in row.iter().enumerate() {
                    if let Some(t) = t {
                        err += (fit[i][k] - t).abs();
                        cnt += 1;
                    }
                }
            }
            acc.0 += err / cnt.max(1) as f64;
            acc.1 += pairing_quality(
                self.offline.len(),
                self.online.len(),
                &|i, k| x(i, k).map(|_| fit[i][k]),
                &|i, k| x(i, k),
            );
        }
    }
}

/// Ranks of the ceiling fits: 0 is job mean + partner mean (additive).
const CEILING_RANKS: [usize; 4] = [0, 1, 2, 3];
const CEILING_NAMES: [&str; 4] = ["additive, all", "rank-1, all", "rank-2, all", "rank-3, all"];

/// `x ≈ μ + b_i + c_k + u_i·v_k` (`rank` factors) by alternating ridge
/// least squares on the known entries of `m`; the fitted values everywhere.
fn low_rank_fit(m: &[Vec<Option<f64>>], rank: usize) -> Vec<Vec<f64>> {
    use nalgebra::{DMatrix, DVector};
    const LAMBDA: f64 = 1e-3;
    let (rows, cols) = (m.len(), m.first().map_or(0, Vec::len));
    let known: Vec<(usize, usize, f64)> = m
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.iter()
                .enumerate()
                .filter_map(move |(k, v)| Some((i, k, (*v)?)))
        })
        .collect();
    if known.is_empty() {
        return vec![vec![0.0; cols]; rows];
    }
    let mu = known.iter().map(|e| e.2).sum::<f64>() / known.len() as f64;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut u: Vec<Vec<f64>> = (0..rows)
        .map(|_| (0..rank).map(|_| rng.gen_range(-0.1..0.1)).collect())
        .collect();
    let mut v: Vec<Vec<f64>> = (0..cols)
        .map(|_| (0..rank).map(|_| rng.gen_range(-0.1..0.1)).collect())
        .collect();
    let (mut b, mut c) = (vec![0.0; rows], vec![0.0; cols]);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    // One side's bias and factors given the other's: ridge least squares on
    // [1, other's factors].
    let solve = |entries: &[(f64, &[f64])]| -> (f64, Vec<f64>) {
        let n = rank + 1;
        let mut a = DMatrix::<f64>::identity(n, n) * LAMBDA;
        let mut y = DVector::<f64>::zeros(n);
        for (t, f) in entries {
            let x = DVector::from_iterator(n, std::iter::once(1.0).chain(f.iter().copied()));
            a += &x * x.transpose();
            y += &x * *t;
        }
        let sol = a
            .cholesky()
            .map_or_else(|| DVector::zeros(n), |ch| ch.solve(&y));
        (sol[0], sol.iter().skip(1).copied().collect())
    };
    for _ in 0..200 {
        for i in 0..rows {
            let e: Vec<(f64, &[f64])> = known
                .iter()
                .filter(|e| e.0 == i)
                .map(|&(_, k, t)| (t - mu - c[k], v[k].as_slice()))
                .collect();
            (b[i], u[i]) = solve(&e);
        }
        for k in 0..cols {
            let e: Vec<(f64, &[f64])> = known
                .iter()
                .filter(|e| e.1 == k)
                .map(|&(i, _, t)| (t - mu - b[i], u[i].as_slice()))
                .collect();
            (c[k], v[k]) = solve(&e);
        }
    }
    (0..rows)
        .map(|i| {
            (0..cols)
                .map(|k| mu + b[i] + c[k] + dot(&u[i], &v[k]))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_beats_the_default_on_the_shipped_table() {
        let pairs = crate::input::read_pairs(&crate::Inputs::shipped().pairs).unwrap();
        let r = run(&pairs, 0.2, 3).unwrap();
        assert_eq!((r.offline_types, r.online_types), (13, 13));
        let (d, m) = (&r.predictors[0], &r.predictors[2]);
        assert!(m.mae < d.mae, "{}", r.table());
        assert!(r.table().lines().last().unwrap().starts_with("mae="));
    }

    #[test]
    fn bad_settings_are_named() {
        let pairs = crate::input::read_pairs(&crate::Inputs::shipped().pairs).unwrap();
        assert!(run(&pairs, 1.5, 1).unwrap_err().contains("--observed"));
        assert!(run(&pairs, 0.2, 0).unwrap_err().contains("--seeds"));
    }
}
