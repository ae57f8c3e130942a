//! The launch-gate controller: turns GPU samples into a per-launch delay.
//!
//! Law (AIMD with a dead band), evaluated once per sample:
//!
//! * **contended** = another process holds a context on the GPU **and**
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
//! one to protect. The MPS server process does not count as another process.
//!
//! Reaction: the first contended sample already delays launches; the delay
//! grows by one step per sample, so the full brake takes
//! `max_delay / delay_step` samples; the release halves it per sample.

use std::time::Duration;

use muxflow::xcuda_env::XcudaEnv;

/// One reading of the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    /// Percent of the sampling window with any kernel running.
    pub utilization_pct: u32,
    /// Percent of SMs busy, where the GPU reports it (GPM, Hopper+).
    pub sm_activity_pct: Option<f64>,
    /// Does another process (not the MPS server) hold a context on this GPU?
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

    /// A recorded-shape trace: online alone, then an offline burst drives the
    /// clock down and utilization up, then the burst ends.
    fn contention_trace() -> Vec<Sample> {
        let mut t = vec![sample(1980, 20, true); 10];
        t.extend(std::iter::repeat_n(sample(1490, 100, true), 200));
        t.extend(std::iter::repeat_n(sample(1980, 30, true), 20));
        t
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
        assert_eq!(delays[10 + full - 1], p.max_delay);
        assert_eq!(delays[209], p.max_delay);
        // Release: halves per sample, open again within log2(cap/step)+2 samples.
        let open_after = delays[210..].iter().position(|d| d.is_zero()).unwrap();
        assert!(open_after <= 9, "opened after {open_after} samples");
        assert!(delays[210] < p.max_delay);
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
