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

/// xCUDA's protection, from the closed loop on the simulated GPU
/// (xcuda/README.md, six runs; midpoints of the ranges): online p99
/// ×1.59–1.67 without xCUDA, ×1.00–1.08 with it, so xCUDA leaves
/// (1.04 − 1)/(1.63 − 1) = 0.063 of the unprotected latency excess; the
/// offline job runs at ×0.82–0.83 (0.825) of its unprotected speed.
pub const XCUDA_LATENCY_EXCESS_LEFT: f64 = (1.04 - 1.0) / (1.63 - 1.0);
pub const XCUDA_OFFLINE_SPEED: f64 = 0.825;
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
    /// The offline job's normalized speed (1 = alone on a whole GPU).
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

/// The counters and factors of a GPU with these sides; `online_slowdown`
/// is the online latency factor the policy leaves (1 alone).
pub fn gpu_rates(
    online: Option<OnlineSide>,
    offline: Option<OfflineSide>,
    online_slowdown: f64,
) -> GpuRates {
    let (mut util, mut sm, mut mem) = (0.0, 0.0, 0.0);
    if let Some(on) = online {
        util += on.share * on.load * ONLINE_PEAK_UTIL;
        sm += on.share * on.load * ONLINE_PEAK_SM;
        mem += on.mem;
    }
    if let Some(off) = offline {
        util += OFFLINE_UTIL * off.speed;
        sm += OFFLINE_SM * off.share * off.speed;
        mem += off.mem;
    }
    GpuRates {
        offline_speed: offline.map_or(0.0, |o| o.speed),
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
pub fn muxflow(x_off: f64, x_on: f64, sm_share: f64, demand: f64) -> (f64, f64) {
    let limit = if demand > 0.0 {
        (sm_share / demand).min(1.0)
    } else {
        1.0
    };
    (
        x_off * XCUDA_OFFLINE_SPEED * limit,
        1.0 + (1.0 / x_on - 1.0) * XCUDA_LATENCY_EXCESS_LEFT,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mf = muxflow(x_off, x_on, 0.6, 0.5);
        assert_eq!(ts, (0.6, 2.0));
        // Priority: online gets back half its loss (0.5 -> 0.75), offline pays it.
        assert!((pr.0 - 0.35).abs() < 1e-12 && (pr.1 - 1.0 / 0.75).abs() < 1e-12);
        assert!((mf.0 - 0.6 * 0.825).abs() < 1e-12);
        assert!(mf.1 < pr.1 && pr.1 < ts.1);
        // A share below the job's demand slows it in proportion.
        assert!((muxflow(x_off, x_on, 0.25, 0.5).0 - 0.6 * 0.825 * 0.5).abs() < 1e-12);
    }
}
