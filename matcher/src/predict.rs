//! Predicts an offline job's normalized throughput (steps/s shared ÷ steps/s
//! alone) on a candidate GPU.
//!
//! # Features
//!
//! * `share`: the SM share the job would get next to that GPU's online job,
//!   by muxflow's policy (`[policy]`: 100 − online solo SM − headroom,
//!   clamped to floor..ceiling; `sm_default` when the online job's solo SM
//!   activity was never measured). It carries the online workload's SM
//!   activity.
//! * `mem`: the job's peak GPU memory (its history's largest
//!   `measured_peak_mib`, the node's NVML measurement; see
//!   [`trusted_peak_mib`]) over
//!   the room the online job leaves (GPU memory − online memory − reserve).
//!   It carries the online job's memory use and the job's own.
//! * the job's profile: its history's runs, linked by (user, job name).
//!
//! # Model
//!
//! Ridge regression on `[1, share, share², mem, share·mem]`, trained on the
//! AdminComment records of earlier offline runs in sacct (each shared run
//! whose (user, name) also has a run alone gives one sample: its `sm_pct`,
//! peak / `mem_cap_mib`, and its claimed `steps_per_s` — bounded when the
//! node wrote the record, clamped to 1.5× — over the mean alone
//! `steps_per_s`; runs the node policed are left out), plus a per-job offset: the mean residual of that job's
//! training samples, shrunk by `n / (n + 2)`. Output clamped to
//! [0.01, 1.0]. Evaluated on a held-out 20% of the records (split by a hash
//! of the job id); `muxflow-matcher --evaluate` prints both errors.
//!
//! # Default
//!
//! With no usable history (fewer than [`MIN_SAMPLES`] samples overall), and
//! for the baseline `--evaluate` compares with: a job is assumed to need half
//! of the SMs, and to run at `min(1, share / 0.5)` of its speed alone.

use std::collections::BTreeMap;

use muxflow::config::Policy;
use muxflow::report::JobReport;
use muxflow::Mode;
use nalgebra::{SMatrix, SVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::reader::{GpuState, SacctJob};

/// SM demand assumed when nothing is known.
pub const DEFAULT_DEMAND: f64 = 0.5;
/// Memory feature when the job has no recorded peak.
pub const DEFAULT_MEM: f64 = 0.5;
/// Fewer training samples than this: the default is used.
pub const MIN_SAMPLES: usize = 8;
const RIDGE: f64 = 1e-3;
const FEATURES: usize = 5;

/// Identifies "the same job" across runs.
pub type JobKey = (String, String);

/// One finished offline run from sacct.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job_id: u32,
    pub key: JobKey,
    pub report: JobReport,
    /// When the run ended (Unix seconds); 0 while it runs.
    pub end_s: u64,
}

/// Offline runs in a `sacct --json` listing (other records are skipped).
pub fn runs_from_sacct(jobs: &[SacctJob]) -> Vec<Run> {
    jobs.iter()
        .filter_map(|j| {
            let report = JobReport::decode(j.comment.administrator.as_deref()?).ok()?;
            // A run the node had to police did not run within its limits:
            // its figures say nothing about a protected run.
            let learnable = report.mode == Some(Mode::Offline) && report.policed.is_none();
            learnable.then(|| Run {
                job_id: j.job_id,
                key: (j.user.clone(), j.name.clone()),
                report,
                end_s: j.time.end,
            })
        })
        .collect()
}

/// What history says about one (user, name).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    pub alone_steps_per_s: Option<f64>,
    pub peak_mib: Option<u64>,
    pub runs: usize,
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

fn ran_alone(r: &JobReport) -> bool {
    r.partner.is_none()
}

pub fn profiles(runs: &[Run]) -> BTreeMap<JobKey, Profile> {
    let mut out: BTreeMap<JobKey, (Profile, f64, usize)> = BTreeMap::new();
    for r in runs {
        // Keys repeat (one per job name): clone only a new one.
        if !out.contains_key(&r.key) {
            out.insert(r.key.clone(), Default::default());
        }
        let e = out.get_mut(&r.key).expect("inserted above");
        e.0.runs += 1;
        e.0.peak_mib = e.0.peak_mib.max(trusted_peak_mib(&r.report));
        if let (true, Some(s)) = (ran_alone(&r.report), r.report.steps_per_s) {
            if s > 0.0 {
                e.1 += s;
                e.2 += 1;
            }
        }
    }
    out.into_iter()
        .map(|(k, (mut p, sum, n))| {
            p.alone_steps_per_s = (n > 0).then(|| sum / n as f64);
            (k, p)
        })
        .collect()
}

/// One training example.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub job_id: u32,
    pub key: JobKey,
    pub share: f64,
    pub mem: f64,
    pub y: f64,
}

/// Shared runs with an alone baseline for the same (user, name).
pub fn samples(runs: &[Run]) -> Vec<Sample> {
    let prof = profiles(runs);
    runs.iter()
        .filter(|r| !ran_alone(&r.report))
        .filter_map(|r| {
            let alone = prof.get(&r.key)?.alone_steps_per_s?;
            let steps = r.report.steps_per_s?;
            let share = f64::from(r.report.sm_pct?) / 100.0;
            let mem = match (trusted_peak_mib(&r.report), r.report.mem_cap_mib) {
                (Some(p), Some(c)) if c > 0 => (p as f64 / c as f64).min(1.0),
                _ => DEFAULT_MEM,
            };
            Some(Sample {
                job_id: r.job_id,
                key: r.key.clone(),
                share,
                mem,
                y: (steps / alone).clamp(0.0, 1.5),
            })
        })
        .collect()
}

/// The baseline: half the SMs needed, speed proportional to the share up to that.
pub fn default_prediction(share: f64) -> f64 {
    (share / DEFAULT_DEMAND).clamp(0.01, 1.0)
}

fn features(share: f64, mem: f64) -> [f64; FEATURES] {
    [1.0, share, share * share, mem, share * mem]
}

/// The trained model (or the default when there was too little history).
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// `None`: the default.
    pub coef: Option<[f64; FEATURES]>,
    pub job_offset: BTreeMap<JobKey, f64>,
    pub profiles: BTreeMap<JobKey, Profile>,
    pub trained_on: usize,
}

impl Model {
    /// Trains on `train` (samples) with `runs` giving the profiles.
    pub fn train(train: &[Sample], runs: &[Run]) -> Model {
        let profiles = profiles(runs);
        if train.len() < MIN_SAMPLES {
            return Model {
                profiles,
                trained_on: train.len(),
                ..Model::default()
            };
        }
        // Normal equations with a small ridge: (XᵀX + λI) b = Xᵀy; the ridge
        // makes the matrix positive definite, so Cholesky applies.
        let mut a = SMatrix::<f64, FEATURES, FEATURES>::identity() * (RIDGE * train.len() as f64);
        let mut v = SVector::<f64, FEATURES>::zeros();
        for s in train {
            let x = SVector::<f64, FEATURES>::from(features(s.share, s.mem));
            a += x * x.transpose();
            v += x * s.y;
        }
        let coef = a
            .cholesky()
            .map(|c| c.solve(&v))
            .filter(|b| b.iter().all(|x| x.is_finite()));
        let Some(coef) = coef.map(<[f64; FEATURES]>::from) else {
            return Model {
                profiles,
                trained_on: train.len(),
                ..Model::default()
            };
        };
        let base = Model {
            coef: Some(coef),
            job_offset: BTreeMap::new(),
            profiles,
            trained_on: train.len(),
        };
        let mut resid: BTreeMap<JobKey, (f64, usize)> = BTreeMap::new();
        for s in train {
            if !resid.contains_key(&s.key) {
                resid.insert(s.key.clone(), Default::default());
            }
            let e = resid.get_mut(&s.key).expect("inserted above");
            e.0 += s.y - base.raw(s.share, s.mem);
            e.1 += 1;
        }
        let job_offset = resid
            .into_iter()
            .map(|(k, (sum, n))| (k, sum / (n as f64 + 2.0)))
            .collect();
        Model { job_offset, ..base }
    }

    fn raw(&self, share: f64, mem: f64) -> f64 {
        match &self.coef {
            Some(c) => features(share, mem).iter().zip(c).map(|(x, b)| x * b).sum(),
            None => default_prediction(share),
        }
    }

    /// Prediction from features, for job `key`.
    pub fn predict_features(&self, key: &JobKey, share: f64, mem: f64) -> f64 {
        let off = self.job_offset.get(key).copied().unwrap_or(0.0);
        (self.raw(share, mem) + off).clamp(0.01, 1.0)
    }

    /// The job's peak memory from history, MiB.
    pub fn peak_mib(&self, key: &JobKey) -> Option<u64> {
        self.profiles.get(key).and_then(|p| p.peak_mib)
    }

    /// Normalized throughput of job `key` next to GPU `gpu`'s online job.
    pub fn predict(&self, key: &JobKey, gpu: &GpuState, policy: &Policy) -> f64 {
        self.predict_terms(&self.job_terms(key), &GpuTerms::new(gpu, policy))
            .unwrap_or(0.01)
    }

    /// What the model needs of a job, looked up once per round.
    pub fn job_terms(&self, key: &JobKey) -> JobTerms {
        JobTerms {
            offset: self.job_offset.get(key).copied().unwrap_or(0.0),
            peak_mib: self.peak_mib(key),
        }
    }

    /// The prediction from precomputed terms (the per-pair hot path of a
    /// round: no lookups, no allocation); `None` when the job's recorded
    /// peak memory does not fit the room the online job leaves.
    #[inline]
    pub fn predict_terms(&self, job: &JobTerms, gpu: &GpuTerms) -> Option<f64> {
        let mem = match job.peak_mib {
            Some(p) if p > gpu.room_mib => return None,
            Some(p) if gpu.room_mib > 0 => (p as f64 / gpu.room_mib as f64).min(1.0),
            _ => DEFAULT_MEM,
        };
        Some((self.raw(gpu.share, mem) + job.offset).clamp(0.01, 1.0))
    }
}

/// Per-job inputs of [`Model::predict_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobTerms {
    pub offset: f64,
    pub peak_mib: Option<u64>,
}

/// Per-GPU inputs of [`Model::predict_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTerms {
    pub share: f64,
    pub room_mib: u64,
}

impl GpuTerms {
    pub fn new(gpu: &GpuState, policy: &Policy) -> GpuTerms {
        GpuTerms {
            share: sm_share(gpu.published.solo_sm_pct, policy),
            room_mib: memory_room_mib(gpu, policy),
        }
    }
}

/// The SM share muxflow's policy gives an offline job next to an online job
/// with this solo SM activity (fraction).
pub fn sm_share(solo_sm_pct: Option<u8>, p: &Policy) -> f64 {
    let pct = match solo_sm_pct {
        Some(solo) => (100 - i32::from(solo.min(100)) - i32::from(p.sm_headroom.get()))
            .clamp(i32::from(p.sm_floor.get()), i32::from(p.sm_ceiling.get())),
        None => i32::from(p.sm_default.get()),
    };
    f64::from(pct) / 100.0
}

/// GPU memory an offline job may use there: total − online − reserve, MiB.
pub fn memory_room_mib(gpu: &GpuState, p: &Policy) -> u64 {
    let g = &gpu.published;
    g.mem_mib
        .saturating_sub(g.online_mem_mib.unwrap_or(0))
        .saturating_sub(p.memory_reserve_mib)
}

/// Held-out split: 1 in 5 records by a hash of the job id.
pub fn is_held_out(job_id: u32) -> bool {
    let h = u64::from(job_id).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    h % 5 == 0
}

/// `--evaluate`'s figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub records: usize,
    pub train: usize,
    pub test: usize,
    pub model_mae: f64,
    pub default_mae: f64,
    pub model_rmse: f64,
    pub default_rmse: f64,
}

impl std::fmt::Display for Evaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "offline runs {} -> samples: {} train, {} held out (normalized throughput = shared/alone steps/s)",
            self.records, self.train, self.test
        )?;
        if self.test == 0 {
            writeln!(f, "no held-out sample: a sample is a shared run of a (user, job name) that also ran alone")?;
            return write!(f, "model_mae=- default_mae=- test_samples=0");
        }
        writeln!(f, "{:<28} {:>8} {:>8}", "predictor", "MAE", "RMSE")?;
        writeln!(
            f,
            "{:<28} {:>8.4} {:>8.4}",
            "model (ridge + job offset)", self.model_mae, self.model_rmse
        )?;
        writeln!(
            f,
            "{:<28} {:>8.4} {:>8.4}",
            "default (min(1, share/0.5))", self.default_mae, self.default_rmse
        )?;
        write!(
            f,
            "model_mae={:.4} default_mae={:.4} test_samples={}",
            self.model_mae, self.default_mae, self.test
        )
    }
}

/// Trains on the non-held-out runs and measures both predictors on the
/// held-out samples. Profiles (alone baselines) use all runs: the baseline
/// is the denominator of the target, not a prediction.
pub fn evaluate(runs: &[Run]) -> Evaluation {
    let all = samples(runs);
    let (test, train): (Vec<Sample>, Vec<Sample>) =
        all.into_iter().partition(|s| is_held_out(s.job_id));
    let model = Model::train(&train, runs);
    let err = |f: &dyn Fn(&Sample) -> f64| {
        let n = test.len().max(1) as f64;
        let mae = test.iter().map(|s| (f(s) - s.y).abs()).sum::<f64>() / n;
        let mse = test.iter().map(|s| (f(s) - s.y).powi(2)).sum::<f64>() / n;
        (mae, mse.sqrt())
    };
    let (model_mae, model_rmse) = err(&|s| model.predict_features(&s.key, s.share, s.mem));
    let (default_mae, default_rmse) = err(&|s| default_prediction(s.share));
    Evaluation {
        records: runs.len(),
        train: train.len(),
        test: test.len(),
        model_mae,
        default_mae,
        model_rmse,
        default_rmse,
    }
}

/// Synthetic offline history for tests and `--evaluate --synthetic N`: jobs
/// with a hidden SM demand and memory, each run alone once, then shared at
/// random SM shares; speed = min(1, share/demand) slowed by memory pressure,
/// with 5% noise. A model of contention, not a measurement.
pub fn synthetic_runs(jobs: usize, runs_per_job: usize, seed: u64) -> Vec<Run> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut id = 1000u32;
    for j in 0..jobs {
        let demand: f64 = rng.gen_range(0.2..0.9);
        let peak: u64 = rng.gen_range(2_000..40_000);
        let alone: f64 = rng.gen_range(5.0..200.0);
        let key = (format!("user{}", j % 7), format!("train-{j}"));
        let mut push = |report: JobReport| {
            id += 1;
            out.push(Run {
                job_id: id,
                key: key.clone(),
                report,
                end_s: 0,
            });
        };
        push(JobReport {
            mode: Some(Mode::Offline),
            sm_pct: Some(100),
            peak_mib: Some(peak),
            steps_per_s: Some(alone),
            ..JobReport::default()
        });
        for _ in 0..runs_per_job {
            let share: f64 = rng.gen_range(0.1..0.8);
            let cap: u64 = rng.gen_range(peak..peak * 3);
            let mem = peak as f64 / cap as f64;
            let speed = (share / demand).min(1.0) * (1.0 - 0.25 * mem * mem);
            let noise: f64 = rng.gen_range(0.95..1.05);
            push(JobReport {
                mode: Some(Mode::Offline),
                sm_pct: Some((share * 100.0).round() as u8),
                mem_cap_mib: Some(cap),
                peak_mib: Some(peak),
                partner: Some(1),
                steps_per_s: Some(alone * speed * noise),
                ..JobReport::default()
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow::health::HealthState;
    use muxflow::published::GpuPublished;

    #[test]
    fn learned_model_beats_the_default_on_held_out_runs() {
        let runs = synthetic_runs(60, 8, 7);
        let e = evaluate(&runs);
        assert!(e.test > 20 && e.train > 100, "{e:?}");
        assert!(e.model_mae < e.default_mae * 0.7, "{e}");
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
    fn too_little_history_falls_back_to_the_default() {
        let runs = synthetic_runs(1, 2, 1);
        let m = Model::train(&samples(&runs), &runs);
        assert!(m.coef.is_none());
        let k = ("u".to_string(), "j".to_string());
        assert_eq!(m.predict_features(&k, 0.25, 0.3), 0.5);
        assert_eq!(m.predict_features(&k, 0.9, 0.3), 1.0);
    }

    #[test]
    fn share_follows_policy_and_predictions_rank_quieter_gpus_higher() {
        let p = Policy::default();
        assert_eq!(sm_share(Some(35), &p), 0.55);
        assert_eq!(sm_share(Some(95), &p), 0.10);
        assert_eq!(sm_share(Some(0), &p), 0.80);
        assert_eq!(sm_share(None, &p), 0.30);
        let gpu = |solo| GpuState {
            node: "n".into(),
            index: 0,
            published: GpuPublished {
                index: 0,
                state: HealthState::Healthy,
                solo_sm_pct: Some(solo),
                online_mem_mib: Some(10_000),
                mem_mib: 80_000,
                offline: 0,
            },
            online_jobs: vec![1],
            slot_used: false,
        };
        let runs = synthetic_runs(40, 6, 3);
        let m = Model::train(&samples(&runs), &runs);
        let k = runs[0].key.clone();
        assert!(m.predict(&k, &gpu(10), &p) > m.predict(&k, &gpu(70), &p));
        assert_eq!(memory_room_mib(&gpu(10), &p), 80_000 - 10_000 - 2048);
    }

    #[test]
    fn samples_need_an_alone_baseline() {
        let mut runs = synthetic_runs(2, 3, 5);
        // Drop job 0's alone run: its shared runs give no samples.
        runs.remove(0);
        let s = samples(&runs);
        assert_eq!(s.len(), 3);
        assert!(s.iter().all(|s| s.key.1 == "train-1"));
    }
}
