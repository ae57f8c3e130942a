//! SysMonitor's per-GPU health states.
//!
//! The transition function lives here too (pure, table-tested); the node
//! programs in `node/` feed it NVML readings and persist the result with
//! [`crate::node::state`].

use std::fmt;
use std::str::FromStr;

use crate::config::Health;

/// Health of one GPU, as the offline side sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HealthState {
    /// Room to spare: offline work may be placed here and runs.
    Healthy,
    /// The online load is high: offline work runs throttled, nothing new is placed.
    Busy,
    /// The GPU is saturated: offline work is paused (xCUDA closes its gate).
    Overloaded,
    /// Errors were detected: offline work is evicted, nothing is placed.
    Faulty,
    /// Quiet period after Faulty/Overloaded before Healthy again: nothing new is placed.
    Recovering,
}

impl HealthState {
    pub const ALL: [HealthState; 5] = [
        HealthState::Healthy,
        HealthState::Busy,
        HealthState::Overloaded,
        HealthState::Faulty,
        HealthState::Recovering,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Busy => "busy",
            HealthState::Overloaded => "overloaded",
            HealthState::Faulty => "faulty",
            HealthState::Recovering => "recovering",
        }
    }

    /// May the matcher (or the fallback) place a new offline job here?
    pub fn accepts_offline(self) -> bool {
        self == HealthState::Healthy
    }

    /// Must running offline work stop launching kernels?
    pub fn pauses_offline(self) -> bool {
        matches!(self, HealthState::Overloaded | HealthState::Faulty)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown GPU health state '{0}' (expected healthy, busy, overloaded, faulty or recovering)"
)]
pub struct ParseHealthError(pub String);

impl FromStr for HealthState {
    type Err = ParseHealthError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HealthState::ALL
            .into_iter()
            .find(|h| h.as_str() == s.trim())
            .ok_or_else(|| ParseHealthError(s.trim().to_string()))
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The least time between the two GPM samples (`nvmlGpmSampleGet`) that
/// give one SM activity reading. NVML computes GPM metrics from the GPU's
/// own samples, refreshed about every 100 ms: two calls closer than that
/// mostly read the same one and give 0 %. Measured on an H100 (driver
/// 580.159) beside a training job at 45–48 % SM activity: 26 of 27 reads 0
/// at 2 ms apart, 19 of 20 at 50 ms, none at 100 ms or more
/// (`real-gpu/README.md`).
pub const GPM_MIN_GAP: std::time::Duration = std::time::Duration::from_millis(120);

/// One reading of a GPU, as the state machine sees it. Metrics a GPU cannot
/// report (no GPM, no clock) are None and take no part in the decision.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Metrics {
    /// GPU utilization, percent (any kernel running).
    pub utilization_pct: f64,
    /// SM activity, percent (the spatial metric; GPM on Hopper and newer).
    pub sm_activity_pct: Option<f64>,
    /// Current SM clock / maximum SM clock (falls under power capping).
    pub sm_clock_fraction: Option<f64>,
    /// Memory in use, percent of the total.
    pub memory_pct: f64,
}

/// What one step sees: the time, the reading (None when NVML could not be
/// read) and whether the error detector found a fault on this GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Input {
    /// Seconds on a clock that all node programs share (Unix time).
    pub now_s: u64,
    pub metrics: Option<Metrics>,
    pub fault: bool,
    /// Only offline jobs run on the GPU (an idle GPU took offline work):
    /// the load is their own, not contention with an online job, so it
    /// moves no state (faults still do). Otherwise an offline job that
    /// saturates the GPU alone would turn it Overloaded and pause
    /// itself. A GPU with no muxflow job at all keeps its load readings:
    /// someone else's load keeps offline work off it.
    pub offline_only: bool,
}

/// The persistent part of the machine: the state and when it was entered
/// (for Faulty: when the last fault was seen, so the quiet period restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fsm {
    pub state: HealthState,
    pub since_s: u64,
}

/// Why a step ended where it did (logged, and asserted by the table tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The detector reported a fault.
    Fault,
    /// A metric crossed an Overloaded enter threshold.
    OverloadEnter,
    /// A metric crossed a Busy enter threshold.
    BusyEnter,
    /// Every metric is below the exit thresholds of the state and the dwell elapsed.
    Calmed,
    /// No fault for the dwell time: start the quiet period.
    FaultCleared,
    /// The quiet period passed with the load below the Busy exit thresholds.
    QuietElapsed,
    /// Nothing moved it (within hysteresis or dwell, or no reading).
    Hold,
}

/// How loaded a reading is, with respect to the enter and exit thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Load {
    over_enter: bool,
    /// Not yet below every Overloaded exit threshold.
    over_stay: bool,
    busy_enter: bool,
    /// Not yet below every Busy exit threshold.
    busy_stay: bool,
}

fn classify(m: &Metrics, c: &Health) -> Load {
    let pct = |p: crate::config::Percent| f64::from(p.get());
    let util = m.utilization_pct;
    let sm = m.sm_activity_pct;
    let clock = m.sm_clock_fraction;
    let mem = m.memory_pct;
    let over_enter = util >= pct(c.overloaded_enter_utilization)
        || clock.is_some_and(|f| f < c.overloaded_enter_clock_fraction.get())
        || mem >= pct(c.overloaded_enter_memory);
    let over_stay = util >= pct(c.overloaded_exit_utilization)
        || clock.is_some_and(|f| f < c.overloaded_exit_clock_fraction.get())
        || mem >= pct(c.overloaded_exit_memory);
    let busy_enter = util >= pct(c.busy_enter_utilization)
        || sm.is_some_and(|s| s >= pct(c.busy_enter_sm_activity));
    let busy_stay = util >= pct(c.busy_exit_utilization)
        || sm.is_some_and(|s| s >= pct(c.busy_exit_sm_activity));
    Load {
        over_enter,
        over_stay: over_stay || over_enter,
        busy_enter,
        busy_stay: busy_stay || busy_enter,
    }
}

impl Fsm {
    /// A GPU seen for the first time: Healthy from `now_s` (the first step
    /// escalates at once if the reading says so).
    pub fn new(now_s: u64) -> Fsm {
        Fsm {
            state: HealthState::Healthy,
            since_s: now_s,
        }
    }

    /// The transition function. Pure: the same inputs give the same result.
    ///
    /// * A fault moves any state to Faulty at once; Faulty lasts until
    ///   `min_dwell_s` without a fault, then Recovering.
    /// * Escalation on load (Healthy -> Busy -> Overloaded) is immediate, so
    ///   the online job is protected without delay; de-escalation needs every
    ///   metric below its exit threshold (hysteresis) and `min_dwell_s` in the
    ///   state, so a noisy metric cannot flap it.
    /// * Overloaded calms to Busy (still above the Busy exit thresholds) or
    ///   to Recovering; Recovering becomes Healthy after `recovery_quiet_s`
    ///   below the Busy exit thresholds.
    /// * No reading (and no fault): the state holds.
    pub fn step(self, input: &Input, c: &Health) -> (Fsm, Why) {
        use HealthState::*;
        let now = input.now_s;
        let in_state = now.saturating_sub(self.since_s);
        let dwelt = in_state >= c.min_dwell_s;
        let go = |state: HealthState, why: Why| {
            (
                Fsm {
                    state,
                    since_s: now,
                },
                why,
            )
        };
        let hold = (self, Why::Hold);
        if input.fault {
            return go(Faulty, Why::Fault);
        }
        if self.state == Faulty {
            return if dwelt {
                go(Recovering, Why::FaultCleared)
            } else {
                hold
            };
        }
        let Some(m) = input.metrics else {
            return hold;
        };
        let load = if input.offline_only {
            Load {
                over_enter: false,
                over_stay: false,
                busy_enter: false,
                busy_stay: false,
            }
        } else {
            classify(&m, c)
        };
        match self.state {
            Healthy | Busy | Recovering if load.over_enter => go(Overloaded, Why::OverloadEnter),
            Healthy | Recovering if load.busy_enter => go(Busy, Why::BusyEnter),
            Busy if dwelt && !load.busy_stay => go(Healthy, Why::Calmed),
            Overloaded if dwelt && !load.over_stay => {
                if load.busy_stay {
                    go(Busy, Why::Calmed)
                } else {
                    go(Recovering, Why::Calmed)
                }
            }
            Recovering if in_state >= c.recovery_quiet_s && !load.busy_stay => {
                go(Healthy, Why::QuietElapsed)
            }
            _ => hold,
        }
    }
}

/// The online job's figures measured while it ran alone (no offline job on
/// the GPU): what the SM and memory policies size an offline job by. The
/// node keeps it in the GPU's record; the cluster replay keeps it the same
/// way.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Solo {
    /// The online jobs they were measured for; a new set starts afresh.
    pub online_jobs: Vec<u32>,
    pub sm_pct: Option<f64>,
    pub mem_mib: u64,
    pub samples: u32,
    pub at_s: u64,
}

impl Solo {
    /// Adds a solo sample: running mean of the SM activity, the largest
    /// memory use seen (what the online job may need again).
    pub fn next(
        prev: Option<Solo>,
        online_jobs: Vec<u32>,
        m: &Metrics,
        mem_mib: u64,
        now: u64,
    ) -> Solo {
        match prev {
            Some(s) if s.online_jobs == online_jobs => {
                let n = f64::from(s.samples);
                Solo {
                    sm_pct: match (s.sm_pct, m.sm_activity_pct) {
                        (Some(a), Some(b)) => Some((a * n + b) / (n + 1.0)),
                        (a, b) => a.or(b),
                    },
                    mem_mib: s.mem_mib.max(mem_mib),
                    samples: s.samples + 1,
                    at_s: now,
                    online_jobs,
                }
            }
            _ => Solo {
                online_jobs,
                sm_pct: m.sm_activity_pct,
                mem_mib,
                samples: 1,
                at_s: now,
            },
        }
    }

    /// The solo SM activity as the node publishes it: a whole percentage.
    pub fn published_sm_pct(&self) -> Option<u8> {
        self.sm_pct.map(|p| p.round().clamp(0.0, 100.0) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offline_job_alone_does_not_overload_its_gpu_but_a_fault_still_counts() {
        let c = Health::default();
        let full = Some(Metrics {
            utilization_pct: 100.0,
            sm_activity_pct: Some(90.0),
            sm_clock_fraction: Some(0.7),
            memory_pct: 97.0,
        });
        let at = |now_s, offline_only, fault| Input {
            now_s,
            metrics: full,
            fault,
            offline_only,
        };
        let healthy = Fsm::new(100);
        assert_eq!(
            healthy.step(&at(101, false, false), &c).0.state,
            HealthState::Overloaded
        );
        assert_eq!(
            healthy.step(&at(101, true, false), &c),
            (healthy, Why::Hold)
        );
        assert_eq!(
            healthy.step(&at(101, true, true), &c).0.state,
            HealthState::Faulty
        );
        // Overloaded before (an online job that has left) calms as if idle.
        let over = Fsm {
            state: HealthState::Overloaded,
            since_s: 100,
        };
        let later = 100 + c.min_dwell_s;
        assert_eq!(
            over.step(&at(later, true, false), &c).0.state,
            HealthState::Recovering
        );
    }

    #[test]
    fn names_round_trip() {
        for h in HealthState::ALL {
            assert_eq!(h.as_str().parse(), Ok(h));
        }
        assert!("sick"
            .parse::<HealthState>()
            .unwrap_err()
            .to_string()
            .contains("'sick'"));
    }

    #[test]
    fn only_healthy_accepts_offline() {
        let accepting: Vec<_> = HealthState::ALL
            .into_iter()
            .filter(|h| h.accepts_offline())
            .collect();
        assert_eq!(accepting, [HealthState::Healthy]);
        assert!(HealthState::Overloaded.pauses_offline() && HealthState::Faulty.pauses_offline());
        assert!(!HealthState::Busy.pauses_offline());
    }
}

#[cfg(test)]
mod fsm_tests {
    use super::HealthState::*;
    use super::*;

    /// Test thresholds: the shipped defaults with short times.
    fn cfg() -> Health {
        Health {
            min_dwell_s: 10,
            recovery_quiet_s: 20,
            ..Health::default()
        }
    }

    fn m(util: f64, sm: f64, clock: f64, mem: f64) -> Option<Metrics> {
        Some(Metrics {
            utilization_pct: util,
            sm_activity_pct: Some(sm),
            sm_clock_fraction: Some(clock),
            memory_pct: mem,
        })
    }

    const IDLE: Option<Metrics> = Some(Metrics {
        utilization_pct: 10.0,
        sm_activity_pct: Some(5.0),
        sm_clock_fraction: Some(1.0),
        memory_pct: 20.0,
    });

    /// One row: from state entered at t=100, step at `now` with `metrics`/`fault`.
    struct Row {
        from: HealthState,
        now: u64,
        metrics: Option<Metrics>,
        fault: bool,
        to: HealthState,
        why: Why,
    }

    fn row(
        from: HealthState,
        now: u64,
        metrics: Option<Metrics>,
        fault: bool,
        to: HealthState,
        why: Why,
    ) -> Row {
        Row {
            from,
            now,
            metrics,
            fault,
            to,
            why,
        }
    }

    #[test]
    fn every_edge() {
        let c = cfg();
        // Defaults: busy 70/55 util, 60/45 SM; overloaded 95/85 util,
        // clock < 0.80 / 0.90, memory 95/85. Dwell 10 s, quiet 20 s.
        let long = 100 + 30; // past dwell and quiet
        let short = 100 + 5; // within dwell
        let rows = [
            // Healthy
            row(Healthy, short, IDLE, false, Healthy, Why::Hold),
            row(
                Healthy,
                short,
                m(70.0, 5.0, 1.0, 0.0),
                false,
                Busy,
                Why::BusyEnter,
            ),
            row(
                Healthy,
                short,
                m(10.0, 60.0, 1.0, 0.0),
                false,
                Busy,
                Why::BusyEnter,
            ),
            row(
                Healthy,
                short,
                m(69.0, 59.0, 1.0, 0.0),
                false,
                Healthy,
                Why::Hold,
            ),
            row(
                Healthy,
                short,
                m(95.0, 5.0, 1.0, 0.0),
                false,
                Overloaded,
                Why::OverloadEnter,
            ),
            row(
                Healthy,
                short,
                m(10.0, 5.0, 0.79, 0.0),
                false,
                Overloaded,
                Why::OverloadEnter,
            ),
            row(
                Healthy,
                short,
                m(10.0, 5.0, 1.0, 95.0),
                false,
                Overloaded,
                Why::OverloadEnter,
            ),
            row(Healthy, short, IDLE, true, Faulty, Why::Fault),
            row(Healthy, short, None, true, Faulty, Why::Fault),
            row(Healthy, short, None, false, Healthy, Why::Hold),
            // Busy
            row(
                Busy,
                long,
                m(54.0, 44.0, 1.0, 0.0),
                false,
                Healthy,
                Why::Calmed,
            ),
            row(Busy, short, m(54.0, 44.0, 1.0, 0.0), false, Busy, Why::Hold), // dwell
            row(Busy, long, m(60.0, 10.0, 1.0, 0.0), false, Busy, Why::Hold),  // util hysteresis
            row(Busy, long, m(10.0, 50.0, 1.0, 0.0), false, Busy, Why::Hold),  // SM hysteresis
            row(
                Busy,
                short,
                m(96.0, 50.0, 1.0, 0.0),
                false,
                Overloaded,
                Why::OverloadEnter,
            ),
            row(
                Busy,
                short,
                m(60.0, 50.0, 0.7, 0.0),
                false,
                Overloaded,
                Why::OverloadEnter,
            ),
            row(Busy, short, IDLE, true, Faulty, Why::Fault),
            row(Busy, long, None, false, Busy, Why::Hold),
            // Overloaded
            row(
                Overloaded,
                long,
                m(60.0, 50.0, 0.95, 50.0),
                false,
                Busy,
                Why::Calmed,
            ),
            row(Overloaded, long, IDLE, false, Recovering, Why::Calmed),
            row(Overloaded, short, IDLE, false, Overloaded, Why::Hold), // dwell
            row(
                Overloaded,
                long,
                m(90.0, 50.0, 1.0, 0.0),
                false,
                Overloaded,
                Why::Hold,
            ), // util hysteresis
            row(
                Overloaded,
                long,
                m(10.0, 5.0, 0.85, 0.0),
                false,
                Overloaded,
                Why::Hold,
            ), // clock hysteresis
            row(
                Overloaded,
                long,
                m(10.0, 5.0, 1.0, 90.0),
                false,
                Overloaded,
                Why::Hold,
            ), // memory hysteresis
            row(Overloaded, short, IDLE, true, Faulty, Why::Fault),
            // Faulty
            row(Faulty, short, IDLE, true, Faulty, Why::Fault),
            row(Faulty, short, IDLE, false, Faulty, Why::Hold),
            row(Faulty, long, IDLE, false, Recovering, Why::FaultCleared),
            row(
                Faulty,
                long,
                m(99.0, 99.0, 0.5, 99.0),
                false,
                Recovering,
                Why::FaultCleared,
            ),
            row(Faulty, long, None, false, Recovering, Why::FaultCleared),
            // Recovering
            row(Recovering, long, IDLE, false, Healthy, Why::QuietElapsed),
            row(Recovering, short, IDLE, false, Recovering, Why::Hold), // quiet period
            row(Recovering, 100 + 15, IDLE, false, Recovering, Why::Hold), // past dwell, within quiet
            row(
                Recovering,
                long,
                m(60.0, 10.0, 1.0, 0.0),
                false,
                Recovering,
                Why::Hold,
            ), // hysteresis
            row(
                Recovering,
                short,
                m(75.0, 10.0, 1.0, 0.0),
                false,
                Busy,
                Why::BusyEnter,
            ),
            row(
                Recovering,
                short,
                m(99.0, 10.0, 1.0, 0.0),
                false,
                Overloaded,
                Why::OverloadEnter,
            ),
            row(Recovering, short, IDLE, true, Faulty, Why::Fault),
            row(Recovering, long, None, false, Recovering, Why::Hold),
        ];
        let mut covered = std::collections::BTreeSet::new();
        for (i, r) in rows.iter().enumerate() {
            let fsm = Fsm {
                state: r.from,
                since_s: 100,
            };
            let input = Input {
                now_s: r.now,
                metrics: r.metrics,
                fault: r.fault,
                offline_only: false,
            };
            let (next, why) = fsm.step(&input, &c);
            assert_eq!(
                (next.state, why),
                (r.to, r.why),
                "row {i}: {:?} at {} with {:?} fault={}",
                r.from,
                r.now,
                r.metrics,
                r.fault
            );
            let expected_since = if why == Why::Hold { 100 } else { r.now };
            assert_eq!(next.since_s, expected_since, "row {i}: since");
            covered.insert((r.from, r.to));
        }
        // Every edge of the documented machine appears in the table.
        let edges = [
            (Healthy, Busy),
            (Healthy, Overloaded),
            (Healthy, Faulty),
            (Busy, Healthy),
            (Busy, Overloaded),
            (Busy, Faulty),
            (Overloaded, Busy),
            (Overloaded, Recovering),
            (Overloaded, Faulty),
            (Faulty, Faulty),
            (Faulty, Recovering),
            (Recovering, Healthy),
            (Recovering, Busy),
            (Recovering, Overloaded),
            (Recovering, Faulty),
        ];
        for e in edges {
            assert!(covered.contains(&e), "edge {e:?} untested");
        }
        // And no edge outside that list is reachable from the rows.
        for (from, to) in &covered {
            assert!(
                from == to || edges.contains(&(*from, *to)),
                "undocumented edge {from:?} -> {to:?}"
            );
        }
    }

    #[test]
    fn noisy_metric_around_a_threshold_does_not_flap() {
        let c = cfg();
        let mut fsm = Fsm::new(0);
        let mut changes = 0;
        // Utilization oscillates 50..80 every second for five minutes.
        for t in 0..300u64 {
            let util = if t % 2 == 0 { 80.0 } else { 50.0 };
            let (next, _) = fsm.step(
                &Input {
                    now_s: t,
                    metrics: m(util, 10.0, 1.0, 10.0),
                    fault: false,
                    offline_only: false,
                },
                &c,
            );
            changes += usize::from(next.state != fsm.state);
            fsm = next;
        }
        // At most one change per dwell period (enter immediately, leave after dwell).
        assert!(changes <= 2 * 300 / c.min_dwell_s as usize, "{changes}");
        // Steady oscillation between 60 and 80 never leaves Busy (60 > exit 55).
        let mut fsm = Fsm::new(0);
        for t in 0..300u64 {
            let util = if t % 2 == 0 { 80.0 } else { 60.0 };
            fsm = fsm
                .step(
                    &Input {
                        now_s: t,
                        metrics: m(util, 10.0, 1.0, 10.0),
                        fault: false,
                        offline_only: false,
                    },
                    &c,
                )
                .0;
            assert_eq!(fsm.state, Busy, "t={t}");
        }
    }

    #[test]
    fn faults_restart_the_quiet_period_and_clock_skew_is_harmless() {
        let c = cfg();
        let f = Fsm {
            state: Faulty,
            since_s: 100,
        };
        let at = |now_s, fault| Input {
            now_s,
            metrics: IDLE,
            fault,
            offline_only: false,
        };
        let (f, _) = f.step(&at(108, true), &c);
        assert_eq!(
            f,
            Fsm {
                state: Faulty,
                since_s: 108
            }
        );
        assert_eq!(f.step(&at(115, false), &c).0.state, Faulty);
        assert_eq!(f.step(&at(118, false), &c).0.state, Recovering);
        // A clock that went backwards counts as no time in the state.
        assert_eq!(f.step(&at(50, false), &c).0.state, Faulty);
    }

    #[test]
    fn missing_optional_metrics_take_no_part() {
        let c = cfg();
        let busy = Fsm {
            state: Busy,
            since_s: 0,
        };
        let only_util = Some(Metrics {
            utilization_pct: 10.0,
            sm_activity_pct: None,
            sm_clock_fraction: None,
            memory_pct: 10.0,
        });
        let input = Input {
            now_s: 100,
            metrics: only_util,
            fault: false,
            offline_only: false,
        };
        assert_eq!(
            busy.step(&input, &c),
            (
                Fsm {
                    state: Healthy,
                    since_s: 100
                },
                Why::Calmed
            )
        );
    }
}
