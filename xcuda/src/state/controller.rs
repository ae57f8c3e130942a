//! The launch-gate controller: turns GPU samples into a per-launch delay.
//!
//! Law (AIMD with a dead band), evaluated once per sample:
//!
//! * **contended** = another process holds a context on the GPU (not one of
//!   the GPU's offline processes root lists: [`muxflow::node::offline_procs`])
//!   **and**
//!   (SM clock < `clock_brake_fraction` x max SM clock, **or** utilization >=
//!   `utilization_brake`, **or** SM activity >= `utilization_brake` where the
//!   GPU reports it). Then `delay += delay_step` (additive increase), capped
//!   at `max_delay`.
//! * **room** = no other process, or clock >= brake fraction + 0.05 and
//!   utilization and SM activity <= brake - 5 points. Then
//!   `delay *= release_factor` (multiplicative decrease); below half a step
//!   it snaps to zero, which opens the gate.
//! * in between (the dead band), the delay holds: metrics hovering at a
//!   threshold do not make the delay oscillate.
//!
//! Why "another process": the offline job alone saturating the GPU drops the
//! clock too (power capping), but braking then only costs throughput with no
//! one to protect. The MPS server process does not count as another process,
//! nor do the GPU's other offline jobs (`[policy] offline_per_gpu` > 1): all
//! offline processes of a GPU read the same GPU-wide figures and brake
//! together, for the online job alone.
//!
//! Reaction: the first contended sample already delays launches; the delay
//! grows by one step per sample, so the full brake takes
//! `max_delay / delay_step` samples; each sample with room multiplies it by
//! `release_factor`. Both are gentle on purpose: the readings average over
//! a telemetry window, so they lag the gate by up to that window, and a
//! controller that moves fast against a lagging reading oscillates (brakes
//! far too hard, then lets go entirely). A delay shorter than the offline
//! job's kernels does not slow it (launches queue up behind the running
//! kernel); the brake bites once the delay exceeds them.

use std::time::Duration;

use muxflow::records::xcuda_env::XcudaEnv;

/// One reading of the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    /// Percent of the sampling window with any kernel running.
    pub utilization_pct: u32,
    /// Percent of SMs busy, where the GPU reports it (GPM, Hopper+).
    pub sm_activity_pct: Option<f64>,
    /// Does another process (not the MPS server, not a listed offline
    /// process of this GPU) hold a context on this GPU?
    pub others_active: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub clock_brake_fraction: f64,
    pub utilization_brake: u32,
    pub max_delay: Duration,
    pub delay_step: Duration,
    pub release_factor: f64,
}

impl Params {
    pub fn from_env(e: &XcudaEnv) -> Params {
        Params {
            clock_brake_fraction: e.clock_brake_fraction,
            utilization_brake: e.utilization_brake as u32,
            max_delay: Duration::from_micros(e.max_delay_us),
            delay_step: Duration::from_micros(e.delay_step_us),
            release_factor: e.release_factor,
        }
    }
}

/// Width of the dead band around the thresholds.
const CLOCK_BAND: f64 = 0.05;
const UTIL_BAND: f64 = 5.0;

#[derive(Debug, Clone)]
pub struct Controller {
    p: Params,
    delay_ns: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Contended,
    Room,
    Hold,
}

impl Controller {
    pub fn new(p: Params) -> Controller {
        Controller { p, delay_ns: 0.0 }
    }

    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns as u64)
    }

    fn verdict(&self, s: &Sample) -> Verdict {
        if !s.others_active {
            return Verdict::Room;
        }
        let clock = if s.max_sm_clock_mhz == 0 {
            1.0
        } else {
            s.sm_clock_mhz as f64 / s.max_sm_clock_mhz as f64
        };
        let brake = self.p.utilization_brake as f64;
        let busy = (s.utilization_pct as f64).max(s.sm_activity_pct.unwrap_or(0.0));
        if clock < self.p.clock_brake_fraction || busy >= brake {
            Verdict::Contended
        } else if clock >= self.p.clock_brake_fraction + CLOCK_BAND && busy <= brake - UTIL_BAND {
            Verdict::Room
        } else {
            Verdict::Hold
        }
    }

    /// Feeds one sample; returns the delay to put in front of each launch.
    pub fn step(&mut self, s: &Sample) -> Duration {
        let step = self.p.delay_step.as_nanos() as f64;
        match self.verdict(s) {
            Verdict::Contended => {
                self.delay_ns = (self.delay_ns + step).min(self.p.max_delay.as_nanos() as f64)
            }
            Verdict::Room => {
                self.delay_ns *= self.p.release_factor;
                if self.delay_ns < step / 2.0 {
                    self.delay_ns = 0.0;
                }
            }
            Verdict::Hold => {}
        }
        self.delay()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow::config::Xcuda;

    fn params() -> Params {
        Params::from_env(&XcudaEnv::from_config(&Xcuda::default(), 0))
    }

    fn sample(clock: u32, util: u32, others: bool) -> Sample {
        Sample {
            sm_clock_mhz: clock,
            max_sm_clock_mhz: 1980,
            utilization_pct: util,
            sm_activity_pct: None,
            others_active: others,
        }
    }

    /// A synthetic trace: online alone, then an offline burst drives the
    /// clock down and utilization up for 200 samples, then the burst ends.
    fn contention_trace() -> Vec<Sample> {
        let mut t = vec![sample(1980, 20, true); 10];
        t.extend(std::iter::repeat_n(sample(1490, 100, true), 200));
        t.extend(std::iter::repeat_n(sample(1980, 30, true), 100));
        t
    }

    /// Samples until a full brake is open again: `max * r^n < step / 2`.
    fn release_bound(p: &Params) -> usize {
        let ratio = 2.0 * p.max_delay.as_nanos() as f64 / p.delay_step.as_nanos() as f64;
        (ratio.ln() / (1.0 / p.release_factor).ln()).ceil() as usize + 1
    }

    #[test]
    fn brakes_on_the_first_contended_sample_and_grows_to_the_cap() {
        let p = params();
        let mut c = Controller::new(p);
        let delays: Vec<Duration> = contention_trace().iter().map(|s| c.step(s)).collect();
        assert!(delays[..10].iter().all(|d| d.is_zero()));
        // Reaction time: one sample.
        assert_eq!(delays[10], p.delay_step);
        // Progressive: never shrinks while contended, reaches the cap.
        assert!(delays[10..210].windows(2).all(|w| w[1] >= w[0]));
        let full = (p.max_delay.as_nanos() / p.delay_step.as_nanos()) as usize;
        assert!(full <= 200, "the trace is too short for the defaults");
        assert_eq!(delays[10 + full - 1], p.max_delay);
        assert_eq!(delays[209], p.max_delay);
        // Release: shrinks every sample with room, open again within the bound.
        assert!(delays[210..]
            .windows(2)
            .all(|w| w[1] < w[0] || w[1].is_zero()));
        let open_after = delays[210..].iter().position(|d| d.is_zero()).unwrap();
        assert!(
            open_after <= release_bound(&p),
            "opened after {open_after} samples"
        );
        assert!(delays[210] < p.max_delay);
    }

    /// Recorded on the simulated GPU with scripts/closed-loop's settings (200 ms
    /// window, one reading per ~25 ms): `clock_mhz util_pct sm_activity_pct`.
    /// The online service alone, an offline trainer without xCUDA joining at
    /// sample 23 and leaving at sample 94, the service alone again.
    const RECORDED: &str = "\
    1980 0 0, 1980 6 3, 1980 13 6, 1980 24 12, 1980 33 16, 1980 46 22, 1980 60 29,\
    1980 71 34, 1980 79 38, 1980 76 37, 1980 76 37, 1980 76 37, 1980 74 36, 1980 69 34,\
    1980 63 31, 1980 56 27, 1980 60 29, 1980 59 29, 1980 56 27, 1980 50 24, 1980 54 26,\
    1980 57 27, 1980 54 26, 1980 59 35, 1980 62 42, 1980 69 49, 1980 80 61, 1980 87 67,\
    1971 87 71, 1866 91 77, 1718 99 86, 1754 99 84, 1752 99 84, 1751 99 84, 1720 99 86,\
    1663 99 89, 1603 100 93, 1573 100 95, 1579 100 94, 1549 100 96, 1486 100 100,\
    1485 100 100, 1485 100 100, 1485 100 100, 1485 100 100, 1485 100 100, 1485 100 100,\
    1485 100 100, 1485 100 100, 1485 100 100, 1489 100 100, 1510 100 99, 1510 100 99,\
    1523 100 98, 1526 100 98, 1526 100 98, 1515 100 98, 1485 100 100, 1485 100 100,\
    1485 100 100, 1485 100 100, 1485 99 100, 1485 99 100, 1485 99 100, 1485 99 100,\
    1498 99 99, 1517 99 98, 1517 99 98, 1516 99 98, 1545 100 96, 1587 100 94, 1563 100 95,\
    1581 100 94, 1559 99 96, 1569 98 95, 1577 98 94, 1577 98 94, 1575 98 95, 1582 98 94,\
    1620 98 92, 1623 98 92, 1612 100 92, 1648 100 90, 1672 100 89, 1672 100 89,\
    1606 100 93, 1537 100 97, 1485 100 100, 1485 100 100, 1485 100 100, 1485 100 100,\
    1485 100 100, 1485 100 100, 1532 100 97, 1659 99 89, 1784 99 82, 1915 98 74,\
    1980 92 64, 1980 87 53, 1980 85 45, 1980 78 38, 1980 71 35, 1980 64 31, 1980 62 30,\
    1980 59 28, 1980 60 29, 1980 64 31, 1980 59 29, 1980 61 30, 1980 61 30, 1980 63 31,\
    1980 64 31, 1980 59 28, 1980 60 29, 1980 55 27, 1980 56 27, 1980 56 27, 1980 60 29,\
    1980 55 27, 1980 61 30, 1980 65 31, 1980 65 31, 1980 68 33, 1980 69 34, 1980 72 35,\
    1980 68 33, 1980 72 35, 1980 66 32, 1980 59 28, 1980 56 27, 1980 51 25, 1980 48 23,\
    1980 52 25, 1980 59 28, 1980 60 29, 1980 57 28, 1980 54 26, 1980 50 24, 1980 39 19,\
    1980 33 16\
    ";

    fn recorded() -> Vec<Sample> {
        RECORDED
            .split(',')
            .map(|x| {
                let v: Vec<u32> = x.split_whitespace().map(|n| n.parse().unwrap()).collect();
                Sample {
                    sm_clock_mhz: v[0],
                    max_sm_clock_mhz: 1980,
                    utilization_pct: v[1],
                    sm_activity_pct: Some(v[2] as f64),
                    others_active: true,
                }
            })
            .collect()
    }

    #[test]
    fn recorded_trace_brakes_when_the_clock_falls_and_releases_after() {
        let p = params();
        let t = recorded();
        assert_eq!(t.len(), 140);
        let mut c = Controller::new(p);
        let d: Vec<Duration> = t.iter().map(|s| c.step(s)).collect();
        let brake_at = (p.clock_brake_fraction * 1980.0) as u32;
        let first = t.iter().position(|s| s.sm_clock_mhz < brake_at).unwrap();
        // The online service alone never brakes (its utilization and SM
        // activity stay below the brake); the first sample with the clock
        // below the brake does.
        assert!(d[..first].iter().all(|x| x.is_zero()), "{:?}", &d[..first]);
        assert_eq!(d[first], p.delay_step);
        // While the trainer runs the clock stays low (or the GPU saturated):
        // the delay only grows.
        let busy =
            |s: &Sample| s.sm_clock_mhz < brake_at || s.utilization_pct >= p.utilization_brake;
        let last = t.iter().rposition(busy).unwrap();
        assert!(last > first + 50);
        assert!(d[first..=last].windows(2).all(|w| w[1] >= w[0]));
        // Gone: the delay shrinks with every reading with room, never grows again.
        assert!(d[last..].windows(2).all(|w| w[1] <= w[0]));
        assert!(d[139] < d[last] / 2, "{:?} vs {:?}", d[139], d[last]);
    }

    #[test]
    fn utilization_and_sm_activity_saturation_brake_too() {
        let mut c = Controller::new(params());
        assert!(!c.step(&sample(1980, 96, true)).is_zero());
        let mut c = Controller::new(params());
        let mut s = sample(1980, 50, true);
        s.sm_activity_pct = Some(97.0);
        assert!(!c.step(&s).is_zero());
    }

    #[test]
    fn never_brakes_when_alone_on_the_gpu() {
        let mut c = Controller::new(params());
        for _ in 0..100 {
            assert!(c.step(&sample(1490, 100, false)).is_zero());
        }
    }

    #[test]
    fn steady_trace_at_the_threshold_does_not_oscillate() {
        let p = params();
        // Clock hovering just above the brake fraction (inside the dead band),
        // with sampling noise: after one brake the delay must hold still.
        let brake_clock = (1980.0 * p.clock_brake_fraction) as u32;
        let mut c = Controller::new(p);
        c.step(&sample(brake_clock - 10, 90, true));
        let held = c.delay();
        assert!(!held.is_zero());
        let noisy = [5u32, 30, 12, 60, 25, 1, 45];
        let mut changes = 0;
        let mut last = held;
        for i in 0..500 {
            let d = c.step(&sample(brake_clock + noisy[i % noisy.len()], 88, true));
            if d != last {
                changes += 1;
            }
            last = d;
        }
        assert_eq!(changes, 0);
        assert_eq!(last, held);
    }

    #[test]
    fn steady_contention_settles_at_the_cap_without_oscillation() {
        let p = params();
        let mut c = Controller::new(p);
        let d: Vec<Duration> = (0..400).map(|_| c.step(&sample(1500, 100, true))).collect();
        assert!(d[300..].iter().all(|x| *x == p.max_delay));
    }
}
