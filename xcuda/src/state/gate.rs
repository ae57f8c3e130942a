//! The launch gate: one atomic word that every gated launch reads.
//!
//! Fast path (gate open): one `fetch_add` on `entered`, one load of `state`,
//! the driver call, one `fetch_add` on `left`. No lock, no allocation. The two
//! counters let the graceful exit wait until no launch is inside the driver
//! (`entered == left`) after it closed the gate; they also count launches.
//!
//! In a child forked after start-up no watcher runs to move the gate: the
//! fork handler puts it in the restart state, and the child's first gated
//! launch (off the fast path, since the state is not open) calls the
//! gate's restart function, which starts the child's own watcher.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use crate::abi::cu;

/// `state` values: 0 = open; 1..=MAX_DELAY_NS = delay each launch by that
/// many ns; the top four values are the closed states.
const OPEN: u64 = 0;
const PAUSED: u64 = u64::MAX;
const SHUTTING_DOWN: u64 = u64::MAX - 1;
const DEAD: u64 = u64::MAX - 2;
/// Forked: the next launch restarts the watcher first.
const RESTART: u64 = u64::MAX - 3;
const MAX_DELAY_NS: u64 = u64::MAX - 4;

/// How often a launch held at a closed gate looks again.
const POLL: Duration = Duration::from_millis(1);

/// What the watcher asks of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Delay each launch by this much (zero: open).
    Delay(Duration),
    /// Hold every launch until the mode changes (health pause).
    Paused,
}

pub struct Gate {
    state: AtomicU64,
    entered: AtomicU64,
    left: AtomicU64,
    /// Gate passes that did not reach the driver (retries after a wait, refusals).
    not_launched: AtomicU64,
    delayed: AtomicU64,
    delay_ns: AtomicU64,
    /// Called by a launch that finds the gate in the restart state; must
    /// leave it in another state. A `fn()` as an address (0: none), set by
    /// the lifecycle layer at start-up ([`Gate::set_restart`]), so this
    /// layer does not know that one.
    restart: AtomicUsize,
}

/// Counters for the stats file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateCounts {
    pub launches: u64,
    pub delayed: u64,
    pub delay_us: u64,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    pub const fn new() -> Gate {
        Gate {
            state: AtomicU64::new(OPEN),
            entered: AtomicU64::new(0),
            left: AtomicU64::new(0),
            not_launched: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            delay_ns: AtomicU64::new(0),
            restart: AtomicUsize::new(0),
        }
    }

    /// What a launch in the restart state (a forked child's first) calls.
    pub fn set_restart(&self, restart: fn()) {
        self.restart.store(restart as usize, SeqCst);
    }

    /// In a forked child (single-threaded, async-signal-safe stores only):
    /// the next launch restarts the watcher; the counters start at zero,
    /// since the child's stats file is its own.
    pub fn after_fork(&self) {
        for c in [
            &self.entered,
            &self.left,
            &self.not_launched,
            &self.delayed,
            &self.delay_ns,
        ] {
            c.store(0, SeqCst);
        }
        self.state.store(RESTART, SeqCst);
    }

    /// Runs `launch` once the gate lets it through. After the graceful exit
    /// released the contexts, refuses with `CUDA_ERROR_DEINITIALIZED`.
    #[inline]
    pub fn pass(&self, launch: impl FnOnce() -> u32) -> u32 {
        self.entered.fetch_add(1, SeqCst);
        let s = self.state.load(SeqCst);
        if s == OPEN {
            let rc = launch();
            self.left.fetch_add(1, SeqCst);
            return rc;
        }
        self.slow(s, launch)
    }

    #[cold]
    fn slow(&self, mut s: u64, launch: impl FnOnce() -> u32) -> u32 {
        if s == RESTART {
            let f = self.restart.load(SeqCst);
            if f != 0 {
                // SAFETY: only ever set from a `fn()` by set_restart.
                let f = unsafe { std::mem::transmute::<usize, fn()>(f) };
                f();
            }
            // Forget the restart state if the restart left it (it must not).
            let _ = self.state.compare_exchange(RESTART, OPEN, SeqCst, SeqCst);
            s = self.state.load(SeqCst);
            if s == OPEN {
                let rc = launch();
                self.left.fetch_add(1, SeqCst);
                return rc;
            }
        }
        let start = Instant::now();
        let mut waited = false;
        loop {
            // Out of the driver while waiting, so the graceful exit does not wait for us.
            self.left.fetch_add(1, SeqCst);
            self.not_launched.fetch_add(1, SeqCst);
            match s {
                DEAD => return cu::DEINITIALIZED,
                PAUSED | SHUTTING_DOWN => std::thread::sleep(POLL),
                d if !waited => std::thread::sleep(Duration::from_nanos(d)),
                _ => {}
            }
            if !waited {
                waited = true;
                self.delayed.fetch_add(1, SeqCst);
            }
            self.entered.fetch_add(1, SeqCst);
            s = self.state.load(SeqCst);
            // One delay per launch: after it, a delaying gate counts as open.
            if s == OPEN || s <= MAX_DELAY_NS {
                self.delay_ns
                    .fetch_add(start.elapsed().as_nanos() as u64, SeqCst);
                let rc = launch();
                self.left.fetch_add(1, SeqCst);
                return rc;
            }
        }
    }

    /// Sets the watcher's mode; ignored once the graceful exit began.
    pub fn set(&self, mode: Mode) {
        let v = match mode {
            Mode::Paused => PAUSED,
            Mode::Delay(d) => (d.as_nanos().min(MAX_DELAY_NS as u128)) as u64,
        };
        let _ = self.state.fetch_update(SeqCst, SeqCst, |cur| {
            (cur != SHUTTING_DOWN && cur != DEAD && cur != v).then_some(v)
        });
    }

    /// Closes the gate for good. Async-signal-safe (one atomic store).
    pub fn begin_shutdown(&self) {
        self.state.store(SHUTTING_DOWN, SeqCst);
    }

    pub fn shutting_down(&self) -> bool {
        matches!(self.state.load(SeqCst), SHUTTING_DOWN | DEAD)
    }

    /// Waits until no launch is inside the driver; false if `deadline` passed first.
    pub fn drain(&self, deadline: Instant) -> bool {
        loop {
            // `left` first: if the two then agree, nothing was in flight at that moment.
            let l = self.left.load(SeqCst);
            let e = self.entered.load(SeqCst);
            if e == l {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// After the contexts are gone: held and later launches are refused.
    pub fn finish_shutdown(&self) {
        self.state.store(DEAD, SeqCst);
    }

    pub fn counts(&self) -> GateCounts {
        let left = self.left.load(SeqCst);
        GateCounts {
            launches: left.saturating_sub(self.not_launched.load(SeqCst)),
            delayed: self.delayed.load(SeqCst),
            delay_us: self.delay_ns.load(SeqCst) / 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn open_gate_launches_and_counts() {
        let g = Gate::new();
        assert_eq!(g.pass(|| 7), 7);
        assert_eq!(g.pass(|| 0), 0);
        assert_eq!(
            g.counts(),
            GateCounts {
                launches: 2,
                delayed: 0,
                delay_us: 0
            }
        );
    }

    #[test]
    fn delay_is_applied_once_per_launch_and_counted() {
        let g = Gate::new();
        g.set(Mode::Delay(Duration::from_millis(2)));
        let t = Instant::now();
        assert_eq!(g.pass(|| 0), 0);
        assert!(t.elapsed() >= Duration::from_millis(2));
        let c = g.counts();
        assert_eq!((c.launches, c.delayed), (1, 1));
        assert!(c.delay_us >= 2000, "{c:?}");
    }

    #[test]
    fn paused_gate_holds_until_reopened() {
        let g = Arc::new(Gate::new());
        g.set(Mode::Paused);
        let done = Arc::new(AtomicBool::new(false));
        let (g2, d2) = (g.clone(), done.clone());
        let h = std::thread::spawn(move || {
            let rc = g2.pass(|| 0);
            d2.store(true, SeqCst);
            rc
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(SeqCst), "launch passed a paused gate");
        assert_eq!(g.counts().launches, 0);
        g.set(Mode::Delay(Duration::ZERO));
        assert_eq!(h.join().unwrap(), 0);
        assert_eq!(g.counts().launches, 1);
    }

    static RESTARTED: AtomicBool = AtomicBool::new(false);
    static FORKED: Gate = Gate::new();
    fn restart() {
        RESTARTED.store(true, SeqCst);
        FORKED.set(Mode::Delay(Duration::ZERO));
    }

    #[test]
    fn a_forked_child_restarts_on_its_first_launch() {
        let g = &FORKED;
        g.set_restart(restart);
        g.set(Mode::Delay(Duration::from_millis(500)));
        g.after_fork();
        assert_eq!(g.counts(), GateCounts::default());
        assert!(!RESTARTED.load(SeqCst));
        // The launch restarts, finds the gate open (no inherited delay), launches.
        assert_eq!(g.pass(|| 3), 3);
        assert!(RESTARTED.load(SeqCst));
        assert_eq!(
            g.counts(),
            GateCounts {
                launches: 1,
                delayed: 0,
                delay_us: 0
            }
        );
    }

    #[test]
    fn shutdown_waits_for_in_flight_then_refuses() {
        let g = Arc::new(Gate::new());
        let inside = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (g2, i2, r2) = (g.clone(), inside.clone(), release.clone());
        let h = std::thread::spawn(move || {
            g2.pass(|| {
                i2.store(true, SeqCst);
                while !r2.load(SeqCst) {
                    std::thread::yield_now();
                }
                0
            })
        });
        while !inside.load(SeqCst) {
            std::thread::yield_now();
        }
        g.begin_shutdown();
        // The watcher cannot reopen a closing gate.
        g.set(Mode::Delay(Duration::ZERO));
        assert!(g.shutting_down());
        assert!(!g.drain(Instant::now() + Duration::from_millis(20)));
        release.store(true, SeqCst);
        assert!(g.drain(Instant::now() + Duration::from_secs(10)));
        assert_eq!(h.join().unwrap(), 0);
        // A launch arriving now is held until the exit finished, then refused.
        let g3 = g.clone();
        let held = std::thread::spawn(move || g3.pass(|| panic!("must not reach the driver")));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!held.is_finished());
        assert!(g.drain(Instant::now() + Duration::from_secs(10)));
        g.finish_shutdown();
        assert_eq!(held.join().unwrap(), cu::DEINITIALIZED);
        assert_eq!(g.counts().launches, 1);
    }
}
