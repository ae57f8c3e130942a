//! What a replay measures: the time integrals of the counters, the
//! latency histogram and the hourly timeline, and at the end the figures a
//! policy produces ([`Outcome`]). `--json` serializes an [`Outcome`] as it
//! is and the table reads the same fields, each [`Fixed`] to the decimals
//! it is printed with, so equal runs print equal bytes.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::autoscale::Churn;
use super::{PolicyKind, Sim};

/// Bins of the online latency factor histogram: 0.001 wide from 1.0.
const LATENCY_BINS: usize = 9001;
const LATENCY_BIN: f64 = 0.001;

/// `v` to `decimals` decimals, never "-0".
pub fn round(v: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    let r = (v * f).round() / f;
    if r == 0.0 {
        0.0 // no "-0"
    } else {
        r
    }
}

/// A figure printed with `D` decimals: the replay keeps it whole (`.0`,
/// what the tests compare), `--json` and the table print [`Fixed::shown`].
#[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd)]
pub struct Fixed<const D: i32>(pub f64);

impl<const D: i32> Fixed<D> {
    /// The figure as printed: rounded to `D` decimals.
    pub fn shown(self) -> f64 {
        round(self.0, D)
    }
}

impl<const D: i32> Serialize for Fixed<D> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.shown())
    }
}

/// Quantile of sorted values (nearest rank); `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[k - 1])
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Everything a replay measured; figures that do not apply are `None`.
/// One policy's object in `--json`, in this order: the field names (or
/// their `rename`) are the stable interface; the series and the checks
/// below the figures are not printed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    #[serde(rename = "name")]
    pub policy: PolicyKind,
    pub gpu_util: Fixed<4>,
    pub sm_activity: Fixed<4>,
    pub mem_util: Fixed<4>,
    pub online_gpu_util: Fixed<4>,
    pub online_gpu_sm_activity: Fixed<4>,
    pub online_latency_p50: Fixed<4>,
    pub online_latency_p99: Fixed<4>,
    /// Of [`Outcome::jct_s`] and [`Outcome::queue_s`]; `None` when empty.
    pub offline_jct_mean_s: Option<Fixed<1>>,
    pub offline_jct_p50_s: Option<Fixed<1>>,
    pub offline_jct_p90_s: Option<Fixed<1>>,
    pub offline_queue_mean_s: Option<Fixed<1>>,
    pub offline_gpu_hours: Fixed<1>,
    pub offline_finished: u64,
    pub lent_gpu_hours: Fixed<1>,
    pub rounds: Option<u64>,
    pub round_total_s: Option<Fixed<3>>,
    pub predictor_mae: Option<Fixed<4>>,
    pub pairing_vs_oracle: Option<Fixed<4>>,
    pub offline_arrived: u64,
    pub offline_running_end: u64,
    pub offline_waiting_end: u64,
    /// muxflow: placements whose job failed at once (the pair cannot
    /// share the GPU's memory, or the job's memory exceeds its cap).
    #[serde(rename = "offline_oom_starts")]
    pub oom_starts: Option<u64>,
    /// muxflow: offline runs whose record names other offline jobs that
    /// shared one of its GPUs (`peers`; only with several slots per GPU).
    #[serde(rename = "offline_peer_runs")]
    pub peer_runs: Option<u64>,
    /// muxflow: placements Slurm would refuse (the job's gpu_spec excludes
    /// the GPU's model; the matcher does not read job constraints).
    #[serde(rename = "offline_refused_placements")]
    pub refused_placements: Option<u64>,
    /// Offline jobs that ran on fewer GPUs than they asked for (or on
    /// several nodes): counted from the GPUs each start gave; must be 0.
    pub offline_short_of_gpus: u64,
    /// muxflow: where the online GPUs' time went while offline jobs
    /// waited ([`super::WhileWaiting`]); null for the other policies.
    pub while_waiting: Option<super::WhileWaiting>,
    /// Jobs asking for more than one GPU (gangs): arrived, finished, and
    /// their part of `offline_gpu_hours`.
    pub gang_arrived: u64,
    pub gang_finished: u64,
    pub gang_gpu_hours: Fixed<1>,
    /// Services that scale (`--autoscale`); `None` without (its figures
    /// print null).
    #[serde(flatten, serialize_with = "churn_or_nulls")]
    pub churn: Option<Churn>,
    /// Finished offline jobs' completion times (arrival to finish), sorted.
    #[serde(skip)]
    pub jct_s: Vec<f64>,
    /// Waits from arrival to the first start, of every job that started.
    #[serde(skip)]
    pub queue_s: Vec<f64>,
    /// GPU-hours of capacity (all GPUs × the replayed time).
    #[serde(skip)]
    pub capacity_gpu_hours: f64,
    #[serde(skip)]
    pub busy_gpu_hours: f64,
    /// muxflow: offline placements on a GPU whose health state did not
    /// accept offline work, and health checks that found offline work
    /// progressing on a GPU whose state pauses it. Both must stay 0.
    #[serde(skip)]
    pub health_violations: u64,
    #[serde(skip)]
    pub timeline: Vec<HourRow>,
    /// Seconds of online GPU-time at each latency factor bin.
    #[serde(skip)]
    pub latency_hist: Vec<f64>,
}

/// The churn figures, or each of them null without `--autoscale`.
fn churn_or_nulls<S: Serializer>(churn: &Option<Churn>, s: S) -> Result<S::Ok, S::Error> {
    match churn {
        Some(c) => c.serialize(s),
        None => {
            let mut m = s.serialize_map(Some(Churn::FIGURES.len()))?;
            for key in Churn::FIGURES {
                m.serialize_entry(key, &None::<f64>)?;
            }
            m.end()
        }
    }
}

/// Hourly figures of one policy (`--timeline`).
#[derive(Debug, Clone, PartialEq)]
pub struct HourRow {
    pub hour: u32,
    pub gpu_util: f64,
    pub sm_activity: f64,
    pub online_gpu_util: f64,
    pub online_load: f64,
    pub offline_running: usize,
    pub offline_waiting: usize,
    pub offline_finished: u64,
    pub lent_gpus: f64,
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Integrals {
    pub(super) util: f64,
    pub(super) sm: f64,
    pub(super) mem: f64,
    pub(super) util_online: f64,
    pub(super) sm_online: f64,
    pub(super) work: f64,
    /// Of `work`, the k-GPU jobs'.
    pub(super) gang_work: f64,
    pub(super) lent: f64,
    /// GPU-seconds of GPUs holding an online replica.
    pub(super) online: f64,
}

/// The replay's view of the time integrals' integrands.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sums {
    pub(super) util: f64,
    pub(super) sm: f64,
    pub(super) mem: f64,
    pub(super) util_online: f64,
    pub(super) sm_online: f64,
    /// Work rate: each running job's speed × its GPUs.
    pub(super) speed: f64,
    pub(super) gang_speed: f64,
    pub(super) lent: usize,
    pub(super) running: usize,
    pub(super) online: usize,
}

/// What a replay counts toward its [`Outcome`] as it goes.
#[derive(Debug, Clone)]
pub(super) struct Tally {
    /// The integrands now, and their integrals up to `last_s`.
    pub(super) sums: Sums,
    pub(super) acc: Integrals,
    pub(super) last_s: f64,
    /// The integrals when the last hour ended, and the hours so far.
    pub(super) hour_acc: Integrals,
    pub(super) timeline: Vec<HourRow>,
    /// Seconds of online GPU-time at each latency factor bin.
    pub(super) latency_hist: Vec<f64>,
    /// Finished jobs' completion times, and every start's wait.
    pub(super) jct: Vec<f64>,
    pub(super) queue_s: Vec<f64>,
    pub(super) finished: u64,
    pub(super) gang_finished: u64,
    pub(super) health_violations: u64,
    /// muxflow: the rounds and their wall time, the predictor's error and
    /// pairs scored, the true worth of the learned round's placements and
    /// of the oracle's, and the placements that failed at once, ran beside
    /// other offline jobs, or Slurm would refuse.
    pub(super) rounds: u64,
    pub(super) round_s: f64,
    pub(super) pred_err: f64,
    pub(super) pred_n: u64,
    pub(super) pair_true: f64,
    pub(super) pair_oracle: f64,
    pub(super) oom: u64,
    pub(super) peer_runs: u64,
    pub(super) refused: u64,
    /// muxflow: where the online GPUs' time went while offline work waited.
    pub(super) waiting: super::waiting::WaitingSums,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            sums: Sums::default(),
            acc: Integrals::default(),
            last_s: 0.0,
            hour_acc: Integrals::default(),
            timeline: Vec::new(),
            latency_hist: vec![0.0; LATENCY_BINS],
            jct: Vec::new(),
            queue_s: Vec::new(),
            finished: 0,
            gang_finished: 0,
            health_violations: 0,
            rounds: 0,
            round_s: 0.0,
            pred_err: 0.0,
            pred_n: 0,
            pair_true: 0.0,
            pair_oracle: 0.0,
            oom: 0,
            peer_runs: 0,
            refused: 0,
            waiting: Default::default(),
        }
    }
}

impl Tally {
    /// Integrates the current rates up to `t`.
    fn integrate(&mut self, t: f64) {
        let dt = t - self.last_s;
        if dt > 0.0 {
            let s = &self.sums;
            let a = &mut self.acc;
            a.util += s.util * dt;
            a.sm += s.sm * dt;
            a.mem += s.mem * dt;
            a.util_online += s.util_online * dt;
            a.sm_online += s.sm_online * dt;
            a.work += s.speed * dt;
            a.gang_work += s.gang_speed * dt;
            a.lent += s.lent as f64 * dt;
            a.online += s.online as f64 * dt;
            self.last_s = t;
        }
    }
}

impl Sim<'_> {
    /// Integrates the current rates up to `t`.
    pub(super) fn advance(&mut self, t: f64) {
        self.tally.integrate(t);
        self.now = t;
    }

    /// The timeline's row of hour `h`, just ended.
    pub(super) fn record_hour(&mut self, h: u32) {
        let a = self.tally.acc;
        let p = self.tally.hour_acc;
        let n = self.sc.gpus.len().max(1) as f64;
        let n_on = self.online_ids.len().max(1) as f64;
        self.tally.timeline.push(HourRow {
            hour: h,
            gpu_util: (a.util - p.util) / 3600.0 / n,
            sm_activity: (a.sm - p.sm) / 3600.0 / n,
            online_gpu_util: match self.scaling {
                Some(_) => (a.util_online - p.util_online) / (a.online - p.online).max(1e-9),
                None => (a.util_online - p.util_online) / 3600.0 / n_on,
            },
            online_load: self.load,
            offline_running: self.tally.sums.running,
            offline_waiting: self.queue.len(),
            offline_finished: self.tally.finished,
            lent_gpus: (a.lent - p.lent) / 3600.0,
        });
        self.tally.hour_acc = a;
    }

    /// Sums again from the GPUs (keeps floating-point drift from piling up).
    pub(super) fn resum(&mut self) {
        let mut s = Sums {
            lent: self.tally.sums.lent,
            running: self.tally.sums.running,
            online: self.tally.sums.online,
            ..Sums::default()
        };
        for (g, rt) in self.gpus.iter().enumerate() {
            s.util += rt.rates.util;
            s.sm += rt.rates.sm;
            s.mem += rt.rates.mem;
            if self.online[g].is_some() {
                s.util_online += rt.rates.util;
                s.sm_online += rt.rates.sm;
            }
        }
        for (rt, job) in self.jobs.iter().zip(&self.sc.jobs) {
            if !rt.seats.is_empty() {
                let work = rt.speed * f64::from(job.gpus);
                s.speed += work;
                if job.gpus > 1 {
                    s.gang_speed += work;
                }
            }
        }
        self.tally.sums = s;
    }

    pub(super) fn outcome(mut self) -> Outcome {
        let end = self.sc.end_s;
        for i in 0..self.online_ids.len() {
            let g = self.online_ids[i] as usize;
            let rt = &self.gpus[g];
            if rt.rates.latency > 0.0 {
                self.tally.latency_hist[latency_bin(rt.rates.latency)] += end - rt.latency_since;
            }
        }
        let n = self.sc.gpus.len().max(1) as f64;
        let n_on = self.online_ids.len().max(1) as f64;
        let t = end.max(1e-9);
        let a = self.tally.acc;
        // Per online GPU-second: a whole replay's worth of each online GPU
        // when services hold their GPUs, the GPU-seconds replicas held
        // them when they scale.
        let scaled = self.scaling.is_some();
        let per_online = |v: f64| {
            if scaled {
                v / a.online.max(1e-9)
            } else {
                v / t / n_on
            }
        };
        self.tally.jct.sort_by(f64::total_cmp);
        let mux = self.kind.is_muxflow();
        Outcome {
            policy: self.kind,
            gpu_util: Fixed(a.util / t / n),
            sm_activity: Fixed(a.sm / t / n),
            mem_util: Fixed(a.mem / t / n),
            online_gpu_util: Fixed(per_online(a.util_online)),
            online_gpu_sm_activity: Fixed(per_online(a.sm_online)),
            online_latency_p50: Fixed(hist_quantile(&self.tally.latency_hist, 0.5)),
            online_latency_p99: Fixed(hist_quantile(&self.tally.latency_hist, 0.99)),
            offline_jct_mean_s: mean(&self.tally.jct).map(Fixed),
            offline_jct_p50_s: quantile(&self.tally.jct, 0.5).map(Fixed),
            offline_jct_p90_s: quantile(&self.tally.jct, 0.9).map(Fixed),
            offline_queue_mean_s: mean(&self.tally.queue_s).map(Fixed),
            offline_gpu_hours: Fixed(a.work / 3600.0),
            offline_finished: self.tally.finished,
            lent_gpu_hours: Fixed(a.lent / 3600.0),
            rounds: mux.then_some(self.tally.rounds),
            round_total_s: (mux && self.timing).then_some(Fixed(self.tally.round_s)),
            predictor_mae: (mux && self.tally.pred_n > 0)
                .then(|| Fixed(self.tally.pred_err / self.tally.pred_n as f64)),
            pairing_vs_oracle: (mux && self.tally.pair_oracle > 0.0)
                .then(|| Fixed(self.tally.pair_true / self.tally.pair_oracle)),
            offline_arrived: self.next_arrival as u64,
            offline_running_end: self.tally.sums.running as u64,
            offline_waiting_end: self.queue.len() as u64,
            oom_starts: mux.then_some(self.tally.oom),
            peer_runs: mux.then_some(self.tally.peer_runs),
            refused_placements: mux.then_some(self.tally.refused),
            offline_short_of_gpus: self.jobs.iter().filter(|j| j.short).count() as u64,
            while_waiting: mux.then(|| self.tally.waiting.hours()),
            gang_arrived: self.sc.jobs[..self.next_arrival]
                .iter()
                .filter(|j| j.gpus > 1)
                .count() as u64,
            gang_finished: self.tally.gang_finished,
            gang_gpu_hours: Fixed(a.gang_work / 3600.0),
            churn: self.scaling.map(|s| s.churn.ended(a.online)),
            jct_s: self.tally.jct,
            queue_s: self.tally.queue_s,
            capacity_gpu_hours: n * end / 3600.0,
            busy_gpu_hours: a.util / 3600.0,
            health_violations: self.tally.health_violations,
            timeline: self.tally.timeline,
            latency_hist: self.tally.latency_hist,
        }
    }
}

/// The latency histogram's bin of a latency factor.
pub(super) fn latency_bin(factor: f64) -> usize {
    (((factor - 1.0) / LATENCY_BIN).round().max(0.0) as usize).min(LATENCY_BINS - 1)
}

/// The time-weighted quantile of the latency histogram (1.0 when empty).
fn hist_quantile(hist: &[f64], q: f64) -> f64 {
    let total: f64 = hist.iter().sum();
    if total <= 0.0 {
        return 1.0;
    }
    let mut acc = 0.0;
    for (i, w) in hist.iter().enumerate() {
        acc += w;
        if acc >= q * total {
            return 1.0 + i as f64 * LATENCY_BIN;
        }
    }
    1.0 + (hist.len() - 1) as f64 * LATENCY_BIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), Some(2.0));
        assert_eq!(quantile(&v, 0.9), Some(4.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(round(-0.00001, 4).to_string(), "0");
    }

    #[test]
    fn a_fixed_figure_prints_rounded_and_keeps_its_value() {
        let v = Fixed::<1>(1234.56);
        assert_eq!(serde_json::to_string(&v).unwrap(), "1234.6");
        assert_eq!(v.shown(), 1234.6);
        assert_eq!(v.0, 1234.56);
        assert_eq!(serde_json::to_string(&Fixed::<4>(-0.00001)).unwrap(), "0.0");
    }

    #[test]
    fn the_latency_histogram_is_time_weighted() {
        let mut hist = vec![0.0; LATENCY_BINS];
        assert_eq!(hist_quantile(&hist, 0.99), 1.0);
        hist[latency_bin(1.0)] += 90.0;
        hist[latency_bin(1.5)] += 10.0;
        assert_eq!(latency_bin(0.5), 0);
        assert_eq!(latency_bin(100.0), LATENCY_BINS - 1);
        assert_eq!(hist_quantile(&hist, 0.5), 1.0);
        assert!((hist_quantile(&hist, 0.95) - 1.5).abs() < 1e-9);
    }

    /// The keys of a serialized flat object, in order (values are numbers
    /// or null: no commas or quotes inside).
    fn keys(json: &str) -> Vec<String> {
        json.trim_matches(['{', '}'])
            .split(',')
            .map(|kv| kv.split('"').nth(1).expect("a key").to_string())
            .collect()
    }

    #[test]
    fn without_autoscale_the_churn_figures_print_null_under_the_same_keys() {
        #[derive(Serialize)]
        struct Policy {
            #[serde(flatten, serialize_with = "churn_or_nulls")]
            churn: Option<Churn>,
        }
        let with = serde_json::to_string(&Policy {
            churn: Some(Churn::default()),
        })
        .unwrap();
        let without = serde_json::to_string(&Policy { churn: None }).unwrap();
        assert_eq!(keys(&with), Churn::FIGURES);
        assert_eq!(keys(&without), Churn::FIGURES);
        assert!(!with.contains("null"), "{with}");
        assert_eq!(without.matches("null").count(), Churn::FIGURES.len());
    }
}
