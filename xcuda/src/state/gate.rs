//! The launch gate: one atomic word that every gated launch reads.
//!
//! Fast path (gate open), for a thread that holds one of the [`SLOTS`]: a
//! plain store of its slot's "inside the driver" flag, a load of `state`,
//! the driver call, a plain increment of its slot's launch count and a
//! plain store clearing the flag. No locked instruction, no lock, no
//! allocation: the graceful exit pays instead, with a process-wide barrier
//! (`membarrier`, [`Gate::drain`]) before it reads the flags — the
//! asymmetric fence user-space RCU uses. Where the kernel refuses that
//! barrier, the fast path carries a full fence itself.
//!
//! Every other launch — a thread without a slot (more threads than slots),
//! a delayed, held or closing gate — takes the counted path: one
//! `fetch_add` on `entered` before the driver, one on `left` after. The
//! exit waits until no slot is inside and `entered == left`, so no launch
//! is inside the driver after it closed the gate; the counters and the
//! slots' counts are the launch counts.
//!
//! In a child forked after start-up no watcher runs to move the gate: the
//! fork handler puts it in the restart state, and the child's first gated
//! launch (off the fast path, since the state is not open) calls the
//! gate's restart function, which starts the child's own watcher.

use std::cell::Cell;
use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{Relaxed, Release, SeqCst},
};
use std::time::{Duration, Instant};

use crate::abi::cu;

/// Threads that launch through a slot of their own (more take the counted
/// path, as every thread did before).
const SLOT_COUNT: usize = 256;

/// One launching thread's: whether it is inside the driver on the fast
/// path, and its fast-path launches (written only by its owner, so plain
/// load-and-store, never a locked increment). A cache line each.
#[repr(align(64))]
struct Slot {
    /// 0: free; else taken by a thread (until it exits).
    taken: AtomicBool,
    inside: AtomicBool,
    launched: AtomicU64,
}

static SLOTS: [Slot; SLOT_COUNT] = [const {
    Slot {
        taken: AtomicBool::new(false),
        inside: AtomicBool::new(false),
        launched: AtomicU64::new(0),
    }
}; SLOT_COUNT];

/// The process-wide barrier: 0 not yet asked for, 1 registered (the fast
/// path needs only a compiler fence), 2 refused (the fast path fences).
static BARRIER: AtomicU8 = AtomicU8::new(0);
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier takes (cmd, flags, cpu_id) by value and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        ) == 0
    }
}

/// Registers this process for the expedited barrier, once (start-up).
pub fn register_barrier() {
    if BARRIER.load(SeqCst) == 0 {
        let ok = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
        BARRIER.store(if ok { 1 } else { 2 }, SeqCst);
    }
}

/// Releases the thread's slot when it exits (its counts stay: they are
/// the process's).
struct SlotRelease(usize);
impl Drop for SlotRelease {
    fn drop(&mut self) {
        SLOTS[self.0].inside.store(false, Release);
        SLOTS[self.0].taken.store(false, Release);
        MY_SLOT.with(|m| m.set(NO_SLOT));
    }
}

const NO_SLOT: usize = usize::MAX;
/// Not yet tried.
const UNTRIED: usize = usize::MAX - 1;

thread_local! {
    static MY_SLOT: Cell<usize> = const { Cell::new(UNTRIED) };
    static RELEASE: Cell<Option<SlotRelease>> = const { Cell::new(None) };
}

/// This thread's slot, taken at its first launch; None: none free (or the
/// thread is exiting).
#[inline(always)]
fn my_slot() -> Option<&'static Slot> {
    let i = MY_SLOT.try_with(Cell::get).unwrap_or(NO_SLOT);
    match i {
        UNTRIED => take_slot(),
        NO_SLOT => None,
        i => Some(&SLOTS[i]),
    }
}

#[cold]
#[inline(never)]
fn take_slot() -> Option<&'static Slot> {
    let found = SLOTS.iter().position(|s| {
        s.taken
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_ok()
    });
    let i = found.unwrap_or(NO_SLOT);
    let _ = MY_SLOT.try_with(|m| m.set(i));
    if i != NO_SLOT {
        // The destructor gives the slot back at thread exit; a thread whose
        // TLS is gone already keeps it (it launches no more).
        if RELEASE.try_with(|r| r.set(Some(SlotRelease(i)))).is_err() {
            return None;
        }
    }
    SLOTS.get(i)
}

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
    /// Launches through the threads' [`SLOTS`] (the process's one gate;
    /// a gate of a unit test counts on its own).
    slots: bool,
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
    /// A gate whose every launch is counted (no thread slots).
    pub const fn new() -> Gate {
        Gate {
            state: AtomicU64::new(OPEN),
            entered: AtomicU64::new(0),
            left: AtomicU64::new(0),
            not_launched: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            delay_ns: AtomicU64::new(0),
            restart: AtomicUsize::new(0),
            slots: false,
        }
    }

    /// The process's gate: open launches through the threads' slots. One
    /// per process (the slots are process-wide).
    pub const fn with_thread_slots() -> Gate {
        Gate {
            slots: true,
            ..Gate::new()
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
        // Only the forking thread lives on: the other threads' slots are
        // free, and no slot is inside the driver. The child is a process of
        // its own: its barrier is asked for again at its start-up.
        if !self.slots {
            self.state.store(RESTART, SeqCst);
            return;
        }
        BARRIER.store(0, SeqCst);
        let mine = MY_SLOT.try_with(Cell::get).unwrap_or(NO_SLOT);
        for (i, slot) in SLOTS.iter().enumerate() {
            slot.launched.store(0, SeqCst);
            slot.inside.store(false, SeqCst);
            if i != mine {
                slot.taken.store(false, SeqCst);
            }
        }
        self.state.store(RESTART, SeqCst);
    }

    /// Runs `launch` once the gate lets it through. After the graceful exit
    /// released the contexts, refuses with `CUDA_ERROR_DEINITIALIZED`.
    #[inline]
    pub fn pass(&self, launch: impl FnOnce() -> u32) -> u32 {
        if let Some(slot) = self.slots.then(my_slot).flatten() {
            slot.inside.store(true, Relaxed);
            // The store above must be seen before the load below, by the
            // exit's drain (the Dekker pattern): the drain's membarrier
            // orders it when registered, else a full fence here.
            if BARRIER.load(Relaxed) == 1 {
                compiler_fence(SeqCst);
            } else {
                fence(SeqCst);
            }
            if self.state.load(Relaxed) == OPEN {
                let rc = launch();
                slot.launched
                    .store(slot.launched.load(Relaxed).wrapping_add(1), Relaxed);
                slot.inside.store(false, Release);
                return rc;
            }
            slot.inside.store(false, Release);
        }
        self.counted(launch)
    }

    /// The counted path: a thread without a slot, or a gate not open.
    fn counted(&self, launch: impl FnOnce() -> u32) -> u32 {
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
        // Every thread passes a full barrier after the gate closed: a
        // fast-path launch either saw it closed or its slot shows inside.
        if self.slots && BARRIER.load(SeqCst) == 1 && !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
        {
            // Refused now (it never should be once registered): later
            // launches fence themselves, and a store a launch made before
            // is out of its CPU's store buffer long before 10 ms.
            BARRIER.store(2, SeqCst);
            std::thread::sleep(Duration::from_millis(10));
        }
        fence(SeqCst);
        loop {
            // `left` first: if the two then agree, nothing was in flight at that moment.
            let l = self.left.load(SeqCst);
            let e = self.entered.load(SeqCst);
            let slots_out = !self.slots || SLOTS.iter().all(|s| !s.inside.load(SeqCst));
            if e == l && slots_out {
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
        let fast: u64 = match self.slots {
            true => SLOTS
                .iter()
                .map(|s| s.launched.load(Relaxed))
                .fold(0, u64::wrapping_add),
            false => 0,
        };
        GateCounts {
            launches: left
                .saturating_sub(self.not_launched.load(SeqCst))
                .wrapping_add(fast),
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

    /// The process's gate (thread slots, the barrier): the one test that
    /// uses the slots, so no other test's launches are counted in them.
    static SLOTTED: Gate = Gate::with_thread_slots();

    #[test]
    fn the_fast_path_counts_per_thread_and_the_drain_waits_for_it() {
        let g = &SLOTTED;
        register_barrier();
        assert_ne!(BARRIER.load(SeqCst), 0);
        assert_eq!(g.pass(|| 5), 5);
        let t = std::thread::spawn(|| SLOTTED.pass(|| 0));
        assert_eq!(t.join().unwrap(), 0);
        // Two fast-path launches, two slots (the second thread's given back).
        assert_eq!(g.counts().launches, 2);
        assert!(!SLOTS.iter().any(|s| s.inside.load(SeqCst)));
        let inside = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (i2, r2) = (inside.clone(), release.clone());
        let h = std::thread::spawn(move || {
            SLOTTED.pass(|| {
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
        // A launch inside the driver on the fast path holds the drain.
        assert!(!g.drain(Instant::now() + Duration::from_millis(20)));
        release.store(true, SeqCst);
        assert!(g.drain(Instant::now() + Duration::from_secs(10)));
        assert_eq!(h.join().unwrap(), 0);
        assert_eq!(g.counts().launches, 3);
        // Closed: a launch takes the counted path and waits, then is refused.
        let held = std::thread::spawn(|| SLOTTED.pass(|| panic!("must not reach the driver")));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!held.is_finished());
        g.finish_shutdown();
        assert_eq!(held.join().unwrap(), cu::DEINITIALIZED);
        assert_eq!(g.counts().launches, 3);
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
