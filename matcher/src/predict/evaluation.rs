//! How good the predictions are: held-out pairs, the pairing quality
//! against an oracle, and synthetic runs for the benches and tests.

use super::*;

/// Row + column means of the pair estimates: the baseline the evaluation
/// reports (job mean + partner mean − overall mean).
pub struct RowColMeans {
    pub(super) mean: f64,
    pub(super) rows: BTreeMap<JobKey, f64>,
    pub(super) cols: BTreeMap<JobKey, f64>,
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
