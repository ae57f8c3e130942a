//! The per-GPU sharing model: what a GPU's online service and offline job
//! get, and what the GPU's counters read, under each policy. Every number
//! here is stated with its source in `sim/README.md` ("The model"); none
//! is fitted to MuxFlow's published results.

/// Online service at its daily peak, a whole-GPU share: the closed loop's
/// service (`scripts/closed-loop`, xcuda/README.md): 205 requests/s × 3 ms
/// of kernels = 0.615 of the time busy, on 64 of 132 SMs → SM activity
/// 0.615 × 64/132 = 0.298. Measured on the simulated GPU, not a real one.
pub const ONLINE_PEAK_UTIL: f64 = 0.615;
pub const ONLINE_PEAK_SM: f64 = 0.298;
/// An offline training job alone on a whole GPU: busy 0.9 of the time
/// (input pipeline gaps), SM activity 0.5 (the predictor's own default
/// assumption, `DEFAULT_DEMAND`). No data: assumptions.
pub const OFFLINE_UTIL: f64 = 0.90;
pub const OFFLINE_SM: f64 = 0.50;
/// GPU memory a task uses, as a fraction of its share of the GPU's memory.
/// The trace records no GPU memory; MuxFlow reports 42% memory used before
/// sharing, rounded to 0.4.
pub const MEM_PER_SHARE: f64 = 0.40;
/// Memory of the GPU an offline job's size refers to (its peak does not
/// depend on where it runs), MiB.
pub const OFFLINE_REFERENCE_GPU_MIB: f64 = 16_384.0;

/// xCUDA's protection as the replay applies it to one GPU under muxflow,
/// read from the closed loop's measurements per simulated GPU mode
/// (`sim/data/protection.toml`, [`crate::protection`]), never set here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Protection {
    /// The part of the unprotected online latency excess left:
    /// `(p99 with xCUDA − 1) / (p99 unprotected − 1)`, both as ratios to
    /// the service alone in the same run.
    pub latency_excess_left: f64,
    /// The offline job's speed with xCUDA over its unprotected speed.
    pub offline_speed: f64,
}

impl Protection {
    /// No protection: the unprotected pair as measured.
    pub const NONE: Protection = Protection {
        latency_excess_left: 1.0,
        offline_speed: 1.0,
    };

    /// The protection beside a service at `load` of its daily peak: the
    /// brake's cost to the offline job ([`at_load`]; measured at the
    /// closed loop's service, the replay's peak), its part of the latency
    /// excess as measured.
    pub fn at_load(self, load: f64) -> Protection {
        Protection {
            offline_speed: at_load(self.offline_speed, load),
            ..self
        }
    }
}

/// An offline speed factor measured beside a service at its daily peak
/// (`x`: the pair table's `x_off`, measured with both jobs busy, or the
/// brake's `offline_speed`), beside that service at `load` of its peak:
/// `1 − load × (1 − x)`, the slowdown in proportion to the load (none
/// beside an idle service). The production predictor's own form
/// (`matcher/src/predict`); on the simulated GPU the closed loop at a
/// quarter, a half and the whole of the service's rate follows it within
/// the figures of sim/README.md ("The model"). The online side's latency
/// excess is not scaled: a request meets the offline job's kernels
/// whatever the hour.
pub fn at_load(x: f64, load: f64) -> f64 {
    1.0 - load.clamp(0.0, 1.0) * (1.0 - x)
}

/// `priority`: MPS client priority 1 for the offline job moves this part
/// of the online side's measured throughput loss to the offline side (the
/// pair's total is kept). A model choice: no measurement separates the two.
pub const PRIORITY_ONLINE_LOSS_RECOVERED: f64 = 0.5;

/// SimGPU's clock curve (simgpu/README.md): the SM clock is at its maximum
/// up to SM activity 0.7, then falls linearly to 0.75 of it at 1.0.
pub fn clock_fraction(sm_activity: f64) -> f64 {
    const KNEE: f64 = 0.7;
    const MIN: f64 = 0.75;
    if sm_activity <= KNEE {
        1.0
    } else {
        1.0 - (1.0 - MIN) * ((sm_activity.min(1.0) - KNEE) / (1.0 - KNEE))
    }
}

/// Online load over the day, as a fraction of the daily peak, for hour
/// 0..23 (local time of the whole cluster): `0.55 − 0.45·cos(2π(h − 4)/24)`,
/// trough 0.10 at 04:00, peak 1.0 at 16:00. One daily peak and a night
/// trough is the shape of user-facing inference load; the curve itself is
/// an assumption (see README), held constant within each hour.
pub fn diurnal_load(hour_of_day: u32) -> f64 {
    let h = f64::from(hour_of_day % 24);
    0.55 - 0.45 * (2.0 * std::f64::consts::PI * (h - 4.0) / 24.0).cos()
}

/// What one GPU does between two events.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuRates {
    /// The offline jobs' normalized speeds, summed (1 = one job alone on a
    /// whole GPU).
    pub offline_speed: f64,
    /// Online latency factor (1 = alone); 0 when no online service.
    pub latency: f64,
    pub util: f64,
    pub sm: f64,
    /// Memory in use, fraction of the GPU's.
    pub mem: f64,
}

/// The online side of a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnlineSide {
    /// Its share of the GPU (gpu_milli / 1000).
    pub share: f64,
    /// Current load, fraction of its daily peak.
    pub load: f64,
    pub mem: f64,
}

/// The offline side of a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OfflineSide {
    pub share: f64,
    pub mem: f64,
    /// Normalized speed it gets under the policy (0 while paused).
    pub speed: f64,
}

/// The counters and factors of a GPU with these sides (its offline jobs:
/// none, one, or several under `muxflow-nK`); `online_slowdown` is the
/// online latency factor the policy leaves (1 alone).
pub fn gpu_rates(
    online: Option<OnlineSide>,
    offline: &[OfflineSide],
    online_slowdown: f64,
) -> GpuRates {
    let (mut util, mut sm, mut mem) = (0.0, 0.0, 0.0);
    if let Some(on) = online {
        util += on.share * on.load * ONLINE_PEAK_UTIL;
        sm += on.share * on.load * ONLINE_PEAK_SM;
        mem += on.mem;
    }
    for off in offline {
        util += OFFLINE_UTIL * off.speed;
        sm += OFFLINE_SM * off.share * off.speed;
        mem += off.mem;
    }
    GpuRates {
        offline_speed: offline.iter().map(|o| o.speed).sum(),
        latency: if online.is_some() {
            online_slowdown
        } else {
            0.0
        },
        util: util.min(1.0),
        sm: sm.min(1.0),
        mem: mem.min(1.0),
    }
}

/// Offline speed and online latency factor of a co-located pair, from the
/// measured normalized throughputs (`x_off` of the offline job next to the
/// online one, `x_on` the other way).
pub fn time_sharing(x_off: f64, x_on: f64) -> (f64, f64) {
    (x_off, 1.0 / x_on)
}

pub fn priority(x_off: f64, x_on: f64) -> (f64, f64) {
    let gain = (1.0 - x_on) * PRIORITY_ONLINE_LOSS_RECOVERED;
    ((x_off - gain).max(0.0), 1.0 / (x_on + gain))
}

/// muxflow, running (not paused): the unprotected pair scaled by xCUDA's
/// measured effect, and limited by the SM share the policy gave
/// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`): a job that needs `demand` of the
/// SMs runs at `min(1, share / demand)` of that.
pub fn muxflow(x_off: f64, x_on: f64, sm_share: f64, demand: f64, p: Protection) -> (f64, f64) {
    let limit = if demand > 0.0 {
        (sm_share / demand).min(1.0)
    } else {
        1.0
    };
    (
        x_off * p.offline_speed * limit,
        1.0 + (1.0 / x_on - 1.0) * p.latency_excess_left,
    )
}

/// One of the offline jobs on a GPU under `muxflow` and `muxflow-nK`
/// (issue 15).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotJob {
    /// The measured pair (x_off, x_on) with the GPU's online service;
    /// `None`: the GPU has none.
    pub with_online: Option<(f64, f64)>,
    /// The SM share it was given at its start, and the GPU's whole offline
    /// budget then (fractions): with K jobs its share is its part of the
    /// budget (`muxflow::policy::share::offline_share`).
    pub share: f64,
    pub budget: f64,
    /// Its SM demand (0.5 × its task's share).
    pub demand: f64,
}

/// Speeds of the offline jobs on one GPU and the online latency factor
/// under muxflow with `offline_per_gpu` ≥ 1 (sim/README.md, "The model").
/// One job with the whole budget: exactly [`fn@muxflow`] (alone on an idle
/// GPU: 1). A job's share is its slot's fixed part of the budget
/// (`budget / K`). Several jobs, or one on a slot's part:
/// * each job runs at its pair speed with the online service (× xCUDA's
///   cost), limited by its part of the SM budget (`min(1, share /
///   demand)`, as for one job), and × `between(i, k)` — the measured pair
///   throughput of job i next to job k — for every other offline job k on
///   the GPU (the table was measured with both jobs busy on a whole GPU,
///   so this also charges them for SMs the split already divides: a
///   pessimistic choice, not fitted);
/// * the online latency excess is the pair curve's, summed over the
///   offline jobs, each weighted by its SM use relative to what it would
///   use alone with the whole budget: `u = min(share, demand) /
///   min(budget, demand)` (1 for a single job, so 1:1 is unchanged; K jobs
///   that each fill their part add up to about one job's load; K light jobs
///   that fit their parts add up to K jobs' load), × xCUDA's factor.
///
/// `paused` (the health state pauses offline work): every job at 0, the
/// online service alone.
pub fn muxflow_slots(
    jobs: &[SlotJob],
    between: impl Fn(usize, usize) -> f64,
    paused: bool,
    p: Protection,
) -> (Vec<f64>, f64) {
    if paused {
        return (vec![0.0; jobs.len()], 1.0);
    }
    if let [one] = jobs {
        if one.share >= one.budget {
            return match one.with_online {
                None => (vec![1.0], 1.0),
                Some((x_off, x_on)) => {
                    let (speed, latency) = muxflow(x_off, x_on, one.share, one.demand, p);
                    (vec![speed], latency)
                }
            };
        }
    }
    let mut excess = 0.0;
    let speeds = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            if let Some((_, x_on)) = job.with_online {
                let used = job.share.min(job.demand);
                let alone = job.budget.min(job.demand);
                let u = if alone > 0.0 {
                    (used / alone).min(1.0)
                } else {
                    0.0
                };
                excess += u * (1.0 / x_on - 1.0);
            }
            slot_speed(
                job,
                (0..jobs.len()).filter(|&k| k != i).map(|k| between(i, k)),
                p,
            )
        })
        .collect();
    (speeds, 1.0 + excess * p.latency_excess_left)
}

/// One job's speed in [`muxflow_slots`] (several jobs, or one on its
/// slot's part): its pair with the online service × xCUDA's cost, its
/// part's limit, and `partners` (its pair throughput next to each other
/// offline job there).
pub fn slot_speed(job: &SlotJob, partners: impl Iterator<Item = f64>, p: Protection) -> f64 {
    let beside = job
        .with_online
        .map_or(1.0, |(x_off, _)| x_off * p.offline_speed);
    let limit = if job.demand > 0.0 {
        (job.share / job.demand).min(1.0)
    } else {
        1.0
    };
    beside * limit * partners.product::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protection to check the arithmetic with (not a measurement).
    const P: Protection = Protection {
        latency_excess_left: 0.1,
        offline_speed: 0.825,
    };

    #[test]
    fn curves_have_their_documented_points() {
        assert!((diurnal_load(4) - 0.10).abs() < 1e-12);
        assert!((diurnal_load(16) - 1.0).abs() < 1e-12);
        assert_eq!(diurnal_load(28), diurnal_load(4));
        assert_eq!(clock_fraction(0.5), 1.0);
        assert!((clock_fraction(1.0) - 0.75).abs() < 1e-12);
        assert!((clock_fraction(0.85) - 0.875).abs() < 1e-12);
    }

    #[test]
    fn policies_order_online_protection_and_offline_speed() {
        let (x_off, x_on) = (0.6, 0.5);
        let ts = time_sharing(x_off, x_on);
        let pr = priority(x_off, x_on);
        let mf = muxflow(x_off, x_on, 0.6, 0.5, P);
        assert_eq!(ts, (0.6, 2.0));
        // Priority: online gets back half its loss (0.5 -> 0.75), offline pays it.
        assert!((pr.0 - 0.35).abs() < 1e-12 && (pr.1 - 1.0 / 0.75).abs() < 1e-12);
        assert!((mf.0 - 0.6 * 0.825).abs() < 1e-12);
        assert!(mf.1 < pr.1 && pr.1 < ts.1);
        // The latency factor applies to the latency excess: 0.1 of it.
        assert!((mf.1 - (1.0 + 0.1 * (2.0 - 1.0))).abs() < 1e-12);
        // No protection: the pair as measured (limited by its share only).
        assert_eq!(muxflow(x_off, x_on, 0.6, 0.5, Protection::NONE), (0.6, 2.0));
        // A share below the job's demand slows it in proportion.
        assert!((muxflow(x_off, x_on, 0.25, 0.5, P).0 - 0.6 * 0.825 * 0.5).abs() < 1e-12);
    }

    #[test]
    fn offline_slowdowns_follow_the_online_load() {
        assert_eq!(at_load(0.6, 1.0), 0.6);
        assert_eq!(at_load(0.6, 0.0), 1.0);
        assert!((at_load(0.6, 0.25) - 0.9).abs() < 1e-12);
        // Out of range loads are clamped, never a speed above 1 or below x.
        assert_eq!(at_load(0.6, 1.5), 0.6);
        assert_eq!(at_load(0.6, -1.0), 1.0);
        let p = P.at_load(0.5);
        assert!((p.offline_speed - (1.0 - 0.5 * 0.175)).abs() < 1e-12);
        assert_eq!(p.latency_excess_left, P.latency_excess_left);
    }

    #[test]
    fn several_offline_jobs_split_the_budget_and_add_their_load() {
        let job = |share: f64, demand: f64| SlotJob {
            with_online: Some((0.6, 0.5)),
            share,
            budget: 0.6,
            demand,
        };
        let between = |_: usize, _: usize| 0.7;
        // One job: the pair model itself.
        let (s1, l1) = muxflow_slots(&[job(0.6, 0.5)], between, false, P);
        assert_eq!((s1[0], l1), muxflow(0.6, 0.5, 0.6, 0.5, P));
        // Two heavy jobs (demand 0.5 each) on 0.3 each: each at its part
        // (0.3/0.5) × its partner (0.7); together they load the service
        // as 0.3/0.5 each = 1.2 single jobs.
        let (s2, l2) = muxflow_slots(&[job(0.3, 0.5), job(0.3, 0.5)], between, false, P);
        assert!((s2[0] - 0.6 * 0.825 * 0.6 * 0.7).abs() < 1e-12);
        let excess_one = l1 - 1.0;
        assert!((l2 - 1.0 - 1.2 * excess_one).abs() < 1e-12, "{l2}");
        // Two light jobs (demand 0.2) that fit their parts: two loads.
        let (_, l3) = muxflow_slots(&[job(0.3, 0.2), job(0.3, 0.2)], between, false, P);
        assert!((l3 - 1.0 - 2.0 * excess_one).abs() < 1e-12, "{l3}");
        // An idle GPU: no online factor, the parts and the partners only.
        let idle = SlotJob {
            with_online: None,
            ..job(0.4, 0.5)
        };
        let (s4, l4) = muxflow_slots(&[idle, idle], between, false, P);
        assert!((s4[1] - 0.8 * 0.7).abs() < 1e-12 && l4 == 1.0);
        // Alone with the whole budget: 1, as with one slot; alone on a
        // slot's part: that part's limit.
        let whole = SlotJob { share: 0.6, ..idle };
        assert_eq!(muxflow_slots(&[whole], between, false, P).0, [1.0]);
        assert_eq!(muxflow_slots(&[idle], between, false, P).0, [0.8]);
        // One job on its slot's part (K = 2: 0.3 of 0.6), no partner: its
        // part limits it, the service's excess scaled by its SM use.
        let (s5, l5) = muxflow_slots(&[job(0.3, 0.5)], between, false, P);
        assert!((s5[0] - 0.6 * 0.825 * 0.6).abs() < 1e-12);
        assert!((l5 - 1.0 - 0.6 * excess_one).abs() < 1e-12, "{l5}");
        // Paused: nothing runs, the service is alone.
        assert_eq!(
            muxflow_slots(&[job(0.3, 0.5)], between, true, P),
            (vec![0.0], 1.0)
        );
    }
}
