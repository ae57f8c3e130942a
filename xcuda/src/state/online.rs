//! The online side of the brake: what xCUDA counts inside an online job
//! (counting mode), and the law by which an offline job's gate brakes on
//! what the online job publishes ([`muxflow::records::online_page`]).
//!
//! **Counting mode** (settings role `online`): no gate, no cap, no signal
//! handling; launches are counted by the gate's counters as in any process
//! (the gate is never moved, so it stays open), and busy periods are timed:
//! the first launch that finds the process idle stamps the time (one
//! relaxed load on every launch, a clock read only on that transition), a
//! stream synchronize that returns ends the period. Nothing here can block
//! or fail the online job: no lock, no allocation, the driver's result
//! passed through. In an offline process the same hooks cost one relaxed
//! load of [`ONLINE`]. A process whose threads sync streams independently
//! gets periods that end at any one thread's synchronize: an approximation
//! (it still measures GPU time per launch, only over shorter periods).
//!
//! **The offline gate's law** ([`OnlineBrake`]), per new window the page
//! shows, with `dev` = the window's GPU time per launch over the online
//! job's baseline, minus one, and `b` = `online_brake_deviation` (default
//! 4 %; TGS uses 3 %: xcuda/README.md has the comparison):
//!
//! | reading | delay per offline launch |
//! |---|---|
//! | first reading of an online job (slow start) | `max_delay`, then `x 2/3` per window while `dev <= b/3` (or idle), until the first window above `b/3` ends the slow start or the delay reaches 0 |
//! | `dev >= 3b` (hurt) | `min(max, 2 delay + 4 step)` |
//! | `b < dev < 3b` (slowed) | `min(max, 1.1 delay + step)` |
//! | `b/3 < dev <= b` (dead band) | held |
//! | `dev <= b/3`, or the online job idle | `delay x release_factor` (0 below step/2) |
//! | page says nothing (absent, stale, untimed) | no say: the clock/utilization law alone |
//! | slowed (`dev > b`) while the clock law brakes | held ([`OnlineBrake::admit`]) |
//!
//! TGS (NSDI'23) cuts the opportunistic job's rate by 8 % past 3 % and by
//! 10x past 9 %, grows it additively below, and starts with a slow start
//! that raises it x1.5 per step: here in delay terms (a delay that grows is
//! a rate that falls; x2/3 on the delay is about x1.5 on the rate once the
//! delay dominates a launch). The slow start — begin braked,
//! let go while the online job stays at its baseline — means the online
//! job sees its solo speed when an offline job arrives, so its baseline is
//! a solo one even if it started beside offline work.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Duration;

use muxflow::records::online_page::{self, Reading};
use muxflow::records::xcuda_env::XcudaEnv;

/// Set once at start-up in the online role.
static ONLINE: AtomicBool = AtomicBool::new(false);
/// CLOCK_MONOTONIC ns when the current busy period began (0: idle).
static BUSY_SINCE: AtomicU64 = AtomicU64::new(0);
/// The launch count when it began.
static BUSY_LAUNCHES: AtomicU64 = AtomicU64::new(0);
/// The last [`RING`] periods' GPU time per launch (ns, as f64 bits), and
/// how many periods ended so far (the next slot is `ENDED % RING`).
const RING: usize = 256;
static PERIOD_NS: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];
static ENDED: AtomicU64 = AtomicU64::new(0);

/// The online page, once the publisher opened it: the busy transitions
/// are written to its busy line from the launch and synchronize paths.
static PAGE: OnceLock<std::fs::File> = OnceLock::new();

/// Hands the opened page to the busy transitions (the publisher, once).
pub fn set_page(f: std::fs::File) -> &'static std::fs::File {
    PAGE.get_or_init(|| f)
}

/// Writes the busy line (0: idle); a failure only leaves it as it was (the
/// readers then see a stale line, which says idle after
/// [`online_page::BUSY_MAX_NS`]).
fn publish_busy(since_ns: u64) {
    if let Some(f) = PAGE.get() {
        let _ = f.write_at(
            &online_page::encode_busy(since_ns),
            online_page::BUSY_OFFSET,
        );
    }
}

/// Switches the process to counting mode (start-up, online role).
pub fn set_online() {
    ONLINE.store(true, Relaxed);
}

pub fn is_online() -> bool {
    ONLINE.load(Relaxed)
}

/// In front of every gated launch.
#[inline(always)]
pub fn on_launch() {
    if ONLINE.load(Relaxed) && BUSY_SINCE.load(Relaxed) == 0 {
        begin_busy();
    }
}

#[cold]
#[inline(never)]
fn begin_busy() {
    let launches = super::gate().counts().launches;
    let now = online_page::now_ns().max(1);
    if BUSY_SINCE
        .compare_exchange(0, now, Relaxed, Relaxed)
        .is_ok()
    {
        BUSY_LAUNCHES.store(launches, Relaxed);
        publish_busy(now);
    }
}

/// After a stream synchronize returned `rc`.
#[inline(always)]
pub fn on_sync(rc: u32) -> u32 {
    if ONLINE.load(Relaxed) && BUSY_SINCE.load(Relaxed) != 0 {
        end_busy();
    }
    rc
}

#[cold]
#[inline(never)]
fn end_busy() {
    let since = BUSY_SINCE.swap(0, Relaxed);
    if since != 0 {
        publish_busy(0);
        let ns = online_page::now_ns().saturating_sub(since);
        let launches = super::gate()
            .counts()
            .launches
            .saturating_sub(BUSY_LAUNCHES.load(Relaxed))
            .max(1);
        let slot = ENDED.load(Relaxed) as usize % RING;
        PERIOD_NS[slot].store((ns as f64 / launches as f64).to_bits(), Relaxed);
        ENDED.fetch_add(1, Relaxed);
    }
}

/// The GPU time per launch (ns) of the periods that ended since `*seen`
/// (at most the last [`RING`]); moves `*seen` on. Read by the publisher.
pub fn periods_since(seen: &mut u64, out: &mut Vec<f64>) {
    let ended = ENDED.load(Relaxed);
    let from = (*seen).max(ended.saturating_sub(RING as u64));
    out.clear();
    out.extend((from..ended).map(|i| f64::from_bits(PERIOD_NS[i as usize % RING].load(Relaxed))));
    *seen = ended;
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnlineParams {
    pub brake_deviation: f64,
    pub max_delay: Duration,
    pub delay_step: Duration,
    pub release_factor: f64,
}

impl OnlineParams {
    pub fn from_env(e: &XcudaEnv) -> OnlineParams {
        OnlineParams {
            brake_deviation: e.online_brake_deviation,
            max_delay: Duration::from_micros(e.max_delay_us),
            delay_step: Duration::from_micros(e.delay_step_us),
            release_factor: e.release_factor,
        }
    }
}

#[derive(Debug, Clone)]
pub struct OnlineBrake {
    p: OnlineParams,
    delay_ns: f64,
    engaged: bool,
    slow_start: bool,
}

impl OnlineBrake {
    pub fn new(p: OnlineParams) -> OnlineBrake {
        OnlineBrake {
            p,
            delay_ns: 0.0,
            engaged: false,
            slow_start: false,
        }
    }

    /// Which readings the law is fed, given whether the page's window is
    /// `new` and whether the clock/utilization law is braking now: a window
    /// already acted on brings nothing (hold: None); while the clock law
    /// brakes, a slowdown does not grow the online delay too (hold): the
    /// clock law acts on the cause it sees (power capping), and both laws
    /// growing on one slowdown brake the trainer twice (on the t4-like
    /// simulated GPU: 0.52-0.59 of its speed instead of about 0.74, for
    /// the same p99). Room, idle and absence always pass.
    pub fn admit(&self, r: Reading, new: bool, clock_braking: bool) -> Option<Reading> {
        match r {
            Reading::Deviation(_) if !new => None,
            Reading::Deviation(d) if clock_braking && d > self.p.brake_deviation => None,
            r => Some(r),
        }
    }

    /// Feeds one new reading of the page; None: the page has no say.
    pub fn step(&mut self, r: Reading) -> Option<Duration> {
        let step = self.p.delay_step.as_nanos() as f64;
        let max = self.p.max_delay.as_nanos() as f64;
        if r == Reading::Absent {
            self.engaged = false;
            self.delay_ns = 0.0;
            return None;
        }
        if !std::mem::replace(&mut self.engaged, true) {
            self.delay_ns = max;
            self.slow_start = true;
            return Some(self.delay());
        }
        let b = self.p.brake_deviation;
        if self.slow_start {
            match r {
                Reading::Deviation(dev) if dev > b / 3.0 => self.slow_start = false,
                _ => {
                    self.delay_ns *= 2.0 / 3.0;
                    if self.delay_ns < step / 2.0 {
                        self.delay_ns = 0.0;
                        self.slow_start = false;
                    }
                    return Some(self.delay());
                }
            }
        }
        let release = |d: f64| {
            let d = d * self.p.release_factor;
            if d < step / 2.0 {
                0.0
            } else {
                d
            }
        };
        self.delay_ns = match r {
            Reading::Deviation(dev) if dev >= 3.0 * b => {
                (2.0 * self.delay_ns + 4.0 * step).min(max)
            }
            Reading::Deviation(dev) if dev > b => (1.1 * self.delay_ns + step).min(max),
            Reading::Deviation(dev) if dev > b / 3.0 => self.delay_ns,
            _ => release(self.delay_ns),
        };
        Some(self.delay())
    }

    /// The delay now, for samples that bring no new window; None when the
    /// page has no say.
    pub fn current(&self) -> Option<Duration> {
        self.engaged.then(|| self.delay())
    }

    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;

    fn brake() -> OnlineBrake {
        OnlineBrake::new(OnlineParams {
            brake_deviation: 0.03,
            max_delay: Duration::from_millis(20),
            delay_step: Duration::from_micros(100),
            release_factor: 0.9,
        })
    }

    /// A row: its name, the readings fed in order, the delay (us) after
    /// each (None: no say).
    type Row<'a> = (&'a str, &'a [Reading], &'a [Option<u64>]);

    #[test]
    fn the_law_as_a_table() {
        use Reading::*;
        let rows: &[Row] = &[
            ("no page: no say", &[Absent, Absent], &[None, None]),
            (
                "slow start: the first reading brakes fully, the baseline held lets go x2/3",
                &[Deviation(0.0), Deviation(0.0), Deviation(0.005)],
                &[Some(20_000), Some(13_333), Some(8_888)],
            ),
            (
                "an idle online job lets go too",
                &[Idle, Idle],
                &[Some(20_000), Some(13_333)],
            ),
            (
                "slowed past 3 % ends the slow start: grows by 10 % and a step",
                &[Deviation(0.0), Deviation(0.0), Deviation(0.05)],
                &[Some(20_000), Some(13_333), Some(14_766)],
            ),
            (
                "past 1 % ends the slow start; between 1 % and 3 %: held",
                &[
                    Deviation(0.0),
                    Deviation(0.0),
                    Deviation(0.02),
                    Deviation(0.03),
                ],
                &[Some(20_000), Some(13_333), Some(13_333), Some(13_333)],
            ),
            (
                "after the slow start, room lets go x0.9",
                &[Deviation(0.0), Deviation(0.02), Deviation(0.0)],
                &[Some(20_000), Some(20_000), Some(18_000)],
            ),
            (
                "the online job goes away: no say, and the next one starts slow again",
                &[Deviation(0.0), Absent, Deviation(0.5)],
                &[Some(20_000), None, Some(20_000)],
            ),
        ];
        for (name, readings, want) in rows {
            let mut b = brake();
            let got: Vec<Option<u64>> = readings
                .iter()
                .map(|r| b.step(*r).map(|d| d.as_nanos() as u64 / US))
                .collect();
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn what_the_law_is_fed_as_a_table() {
        use Reading::*;
        let b = brake();
        // (name, reading, new window, clock law braking, fed)
        let rows: &[(&str, Reading, bool, bool, Option<Reading>)] = &[
            (
                "a new window: fed",
                Deviation(0.1),
                true,
                false,
                Some(Deviation(0.1)),
            ),
            (
                "the same window again: held",
                Deviation(0.1),
                false,
                false,
                None,
            ),
            (
                "slowed while the clock law brakes: held",
                Deviation(0.1),
                true,
                true,
                None,
            ),
            (
                "room while the clock law brakes: fed (it lets go)",
                Deviation(0.0),
                true,
                true,
                Some(Deviation(0.0)),
            ),
            ("idle: fed", Idle, false, true, Some(Idle)),
            ("absent: fed (no say)", Absent, false, false, Some(Absent)),
        ];
        for (name, r, new, clock, want) in rows {
            assert_eq!(b.admit(*r, *new, *clock), *want, "{name}");
        }
    }

    #[test]
    fn hurt_doubles_from_open_and_release_snaps_to_zero() {
        use Reading::*;
        let mut b = brake();
        b.step(Idle);
        // Released to zero: 20 ms x 0.9^n falls under 50 us.
        let mut n = 0;
        while b.step(Idle) != Some(Duration::ZERO) {
            n += 1;
            assert!(n < 100, "never opened");
        }
        assert_eq!(b.current(), Some(Duration::ZERO));
        // 9 % and more: 2 x 0 + 4 steps, then doubling, up to the max.
        let want = [400, 1200, 2800, 6000, 12400, 20000, 20000];
        for w in want {
            assert_eq!(b.step(Deviation(0.09)), Some(Duration::from_micros(w)));
        }
        // 4 % from 400 us: 540 us (x1.1 + a step).
        let mut b = brake();
        b.step(Idle);
        while b.step(Idle) != Some(Duration::ZERO) {}
        b.step(Deviation(0.1));
        assert_eq!(b.step(Deviation(0.04)), Some(Duration::from_micros(540)));
    }
}
