//! The bounded offline queue (xcuda/README.md, "The bounded offline
//! queue"): an offline thread keeps at most `limit` launches in flight on a
//! stream, and the limit falls to the busy bound while the GPU's online job
//! is busy, so an online request waits at most behind what is already in
//! flight (XSched's "progressive command launching", at the granularity an
//! LD_PRELOAD layer has: whole kernels, a stream's emptiness).
//!
//! In flight is counted per stream: the launches since the stream was last
//! seen empty (`cuStreamQuery`), whichever thread made them (PyTorch's
//! autograd launches a step's backward pass from a thread of its own onto
//! the forward pass's stream). A per-thread default stream is its thread's
//! alone, and so is its count. At the limit the thread waits until the
//! stream drains or the limit rises (the online job went idle); a limit of
//! 0 holds every launch until it rises. Threads that launch on one stream
//! at the same instant may pass the limit by one each (the count takes no
//! lock); past [`STREAMS`] distinct streams a stream is counted per thread
//! again (each thread's own launches on it); graph launches count as one
//! launch each.
//!
//! The idle bound follows the work in flight (`queue_inflight_us`): a
//! thread at the bound times the drain it waits for, which is what a
//! request arriving then would wait behind. Longer than the target, the
//! bound falls in proportion (never below `queue_inflight`); under half of
//! it (or drained at once) it grows by one, up to [`MAX_IDLE_BOUND`]. So a
//! trainer of short kernels (a real ResNet-50 step: hundreds of kernels of
//! tens of us) keeps the GPU fed with a bound of several launches, and one
//! of long kernels stays at its floor.
//!
//! The busy bound adapts to the online job's measured slowdown
//! ([`BusyBound`], stepped per new window of the online page): halved when
//! the online job is slowed, zero when hurt, one more launch while it runs
//! at its baseline. So a service that a trickle does not hurt lets the
//! trainer run beside its requests, and one it hurts holds it off them.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use muxflow::records::online_page::Reading;

/// No bound (the queue is off).
pub const OFF: u32 = u32::MAX;
/// A held launch looks at its stream and the limit again at once (yielding
/// the CPU) for this long, then every [`POLL`]: a sleep costs its timer
/// slack (50 us by default on Linux), as long as a short kernel, so a
/// drain that ends soon is caught at once.
const SPIN: Duration = Duration::from_micros(200);
const POLL: Duration = Duration::from_micros(20);

/// The limit every launch reads: [`OFF`], or launches in flight allowed now.
static LIMIT: AtomicU32 = AtomicU32::new(OFF);
/// The bound while the online job is idle (from the setting, adapted to
/// the work in flight: [`drained_after`]) and while it is busy (adaptive).
static IDLE_BOUND: AtomicU32 = AtomicU32::new(OFF);
static BUSY_BOUND: AtomicU32 = AtomicU32::new(0);
/// The idle bound's floor (`queue_inflight`) and the work in flight it
/// aims at, ns of GPU time (`queue_inflight_us`; 0: the floor is the bound).
static FLOOR: AtomicU32 = AtomicU32::new(OFF);
static TARGET_NS: AtomicU64 = AtomicU64::new(0);
/// The most launches the idle bound grows to, however short the kernels:
/// past this a drain is rare enough that its cost is nothing.
pub const MAX_IDLE_BOUND: u32 = 64;
/// The poller's verdict, and the launches admitted while it said busy (the
/// busy bound grows only on evidence that launching beside requests is
/// harmless: [`BusyBound::step`]).
static ONLINE_BUSY: AtomicBool = AtomicBool::new(false);
static ADMITTED_WHILE_BUSY: AtomicU64 = AtomicU64::new(0);
/// Launches held while the online job was busy, and how long in all
/// (ns), for the stats file.
static HELD: AtomicU64 = AtomicU64::new(0);
static HELD_NS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (stream, per-thread flag, launches since it was seen empty): the
    /// count of a per-thread default stream, or of a stream past the table.
    static MINE: Cell<(usize, bool, u32)> = const { Cell::new((0, false, 0)) };
}

/// Streams counted process-wide: an open-addressed table, a slot claimed
/// for good by the first launch on its stream (key: the handle + 1, so the
/// legacy default stream, 0, has one; 0 marks a free slot). A training
/// process uses a handful of streams; a program that makes more than this
/// many gets per-thread counts for the rest.
const STREAMS: usize = 64;
struct Slot {
    key: AtomicUsize,
    inflight: AtomicU32,
}
static TABLE: [Slot; STREAMS] = [const {
    Slot {
        key: AtomicUsize::new(0),
        inflight: AtomicU32::new(0),
    }
}; STREAMS];

/// `stream`'s slot in [`TABLE`], claimed if new; None once the table is
/// full.
fn slot(stream: usize) -> Option<&'static Slot> {
    let key = stream.wrapping_add(1);
    // Handles are pointers: their low bits are alignment.
    let start = (stream >> 4) % STREAMS;
    // A plain load finds a known stream (no locked instruction on the
    // launch path); only a new stream's claim takes one.
    for i in 0..STREAMS {
        let s = &TABLE[(start + i) % STREAMS];
        match s.key.load(Relaxed) {
            k if k == key => return Some(s),
            0 => match s.key.compare_exchange(0, key, Relaxed, Relaxed) {
                Ok(_) => return Some(s),
                Err(k) if k == key => return Some(s),
                Err(_) => continue,
            },
            _ => continue,
        }
    }
    None
}

/// The count a launch on (stream, per-thread flag) reads and adds to.
enum Count {
    Shared(&'static Slot),
    Mine,
}

impl Count {
    fn of(stream: usize, pt: bool) -> Count {
        match pt {
            false => slot(stream).map_or(Count::Mine, Count::Shared),
            true => Count::Mine,
        }
    }

    fn get(&self, stream: usize, pt: bool) -> u32 {
        match self {
            Count::Shared(s) => s.inflight.load(Relaxed),
            Count::Mine => {
                let (s, p, n) = MINE.with(Cell::get);
                if (s, p) == (stream, pt) {
                    n
                } else {
                    0
                }
            }
        }
    }

    /// The stream was seen empty: nothing in flight.
    fn drained(&self, stream: usize, pt: bool) {
        match self {
            Count::Shared(s) => s.inflight.store(0, Relaxed),
            Count::Mine => MINE.with(|m| m.set((stream, pt, 0))),
        }
    }

    /// One launch more in flight.
    fn add(&self, stream: usize, pt: bool) {
        match self {
            // A load and a store, not a locked add: two threads adding at
            // the same instant may count one (one launch more in flight),
            // which the launch path's budget is worth.
            Count::Shared(s) => s
                .inflight
                .store(s.inflight.load(Relaxed).saturating_add(1), Relaxed),
            Count::Mine => {
                let n = self.get(stream, pt);
                MINE.with(|m| m.set((stream, pt, n.saturating_add(1))));
            }
        }
    }
}

/// Switches the queue on with `inflight` launches while the online job is
/// idle (start-up; 0 leaves it off). Until the poller first reads the page
/// the idle bound applies.
/// `inflight_us` (0: none): the work in flight the idle bound aims at.
pub fn enable(inflight: u32, inflight_us: u32) {
    if inflight == 0 {
        return;
    }
    FLOOR.store(inflight, Relaxed);
    TARGET_NS.store(u64::from(inflight_us) * 1000, Relaxed);
    IDLE_BOUND.store(inflight, Relaxed);
    BUSY_BOUND.store(0, Relaxed);
    LIMIT.store(inflight, Relaxed);
}

/// The idle bound now (launches; [`OFF`] while the queue is off).
pub fn idle_bound() -> u32 {
    IDLE_BOUND.load(Relaxed)
}

/// A thread at the idle bound `bound` waited `waited` for its stream to
/// drain: what was in flight took that long. Above the target the bound
/// falls in proportion (never below the floor); under half of it the bound
/// grows by one (up to [`MAX_IDLE_BOUND`]): kernels short enough that a
/// request arriving now would wait behind less than the target. A stream
/// found empty at once (waited 0: the GPU keeps up with the launches)
/// grows it too.
pub fn idle_bound_after(bound: u32, waited: Duration, floor: u32, target: Duration) -> u32 {
    if target.is_zero() {
        return floor;
    }
    let w = waited.as_nanos() as u64;
    let t = target.as_nanos() as u64;
    if w > t {
        let scaled = (u64::from(bound) * t / w) as u32;
        scaled.max(floor)
    } else if w < t / 2 {
        (bound + 1).min(MAX_IDLE_BOUND.max(floor))
    } else {
        bound
    }
}

/// The idle bound after a drain that took `waited` at `bound`; the limit
/// follows at once while the online job is idle (the poller keeps it
/// otherwise).
fn drained_after(bound: u32, waited: Duration) {
    let target = Duration::from_nanos(TARGET_NS.load(Relaxed));
    let floor = FLOOR.load(Relaxed);
    if floor == OFF || target.is_zero() || bound != IDLE_BOUND.load(Relaxed) {
        return;
    }
    let next = idle_bound_after(bound, waited, floor, target);
    if next != bound {
        IDLE_BOUND.store(next, Relaxed);
        if !ONLINE_BUSY.load(Relaxed) {
            LIMIT.store(next, Relaxed);
        }
    }
}

pub fn enabled() -> bool {
    IDLE_BOUND.load(Relaxed) != OFF
}

/// The poller's verdict: is the online job busy now? Sets the limit.
pub fn set_online_busy(busy: bool) {
    let idle = IDLE_BOUND.load(Relaxed);
    if idle == OFF {
        return;
    }
    let limit = match busy {
        true => BUSY_BOUND.load(Relaxed).min(idle),
        false => idle,
    };
    ONLINE_BUSY.store(busy, Relaxed);
    LIMIT.store(limit, Relaxed);
}

/// The poller's last verdict.
pub fn online_busy() -> bool {
    ONLINE_BUSY.load(Relaxed)
}

/// Launches admitted while the online job was busy since the last call.
pub fn take_admitted_while_busy() -> u64 {
    ADMITTED_WHILE_BUSY.swap(0, Relaxed)
}

/// The watcher's busy bound, from [`BusyBound`].
pub fn set_busy_bound(b: u32) {
    BUSY_BOUND.store(b, Relaxed);
}

/// (launches held by a request, us held in all): the stats file counts them
/// with the gate's delayed launches (a wait put in front of a launch).
pub fn held() -> (u64, u64) {
    (HELD.load(Relaxed), HELD_NS.load(Relaxed) / 1000)
}

/// In a forked child (no poller runs there until its start-up): its own
/// counts, and the idle bound, never an inherited hold.
pub fn after_fork() {
    HELD.store(0, Relaxed);
    HELD_NS.store(0, Relaxed);
    for s in &TABLE {
        s.inflight.store(0, Relaxed);
    }
    set_online_busy(false);
}

/// In front of a gated launch on `stream` (`pt`: the per-thread default
/// stream's variant). `empty` asks the driver whether the stream has
/// nothing in flight (None: it cannot say; then the limit alone decides,
/// and a stream it cannot query is never held for its drain). `closing`:
/// the gate began the graceful exit (stop holding; the gate refuses).
#[inline(always)]
pub fn admit(
    stream: usize,
    pt: bool,
    empty: impl Fn() -> Option<bool>,
    closing: impl Fn() -> bool,
) {
    if LIMIT.load(Relaxed) == OFF {
        return;
    }
    admit_bounded(stream, pt, &empty, &closing);
}

#[cold]
#[inline(never)]
fn admit_bounded(
    stream: usize,
    pt: bool,
    empty: &dyn Fn() -> Option<bool>,
    closing: &dyn Fn() -> bool,
) {
    let count = Count::of(stream, pt);
    let mut start: Option<Instant> = None;
    // Counted as a delay only when the online job's request held it: a
    // drain at the idle bound is the queue's pace, not a brake.
    let mut braked = false;
    loop {
        let limit = LIMIT.load(Relaxed);
        if limit == OFF || count.get(stream, pt) < limit || closing() {
            break;
        }
        if limit > 0 {
            match empty() {
                Some(false) => {}
                e => {
                    // What was in flight drained in this long (0: at
                    // once); a stream that cannot say teaches nothing.
                    if e.is_some() && !ONLINE_BUSY.load(Relaxed) {
                        drained_after(limit, start.map_or(Duration::ZERO, |t| t.elapsed()));
                    }
                    count.drained(stream, pt);
                    break;
                }
            }
        }
        braked |= ONLINE_BUSY.load(Relaxed);
        match start.get_or_insert_with(Instant::now).elapsed() < SPIN {
            true => std::thread::yield_now(),
            false => std::thread::sleep(POLL),
        }
    }
    if ONLINE_BUSY.load(Relaxed) {
        ADMITTED_WHILE_BUSY.fetch_add(1, Relaxed);
    }
    if let (Some(t), true) = (start, braked) {
        HELD.fetch_add(1, Relaxed);
        HELD_NS.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
    }
    count.add(stream, pt);
}

/// The busy bound's law, one step per new window of the online page, with
/// `b` = `online_brake_deviation`:
///
/// | reading | busy bound |
/// |---|---|
/// | first reading of an online job | 0 (hold during its requests) |
/// | `dev >= 3b` (hurt) | 0 |
/// | `b < dev < 3b` (slowed) | halved |
/// | `b/3 < dev <= b` (dead band) | held |
/// | `dev <= b/3`, or the online job idle, and the trainer launched beside its requests since the last window (or the bound is 0) | one more, up to the idle bound |
/// | the same, with no launch beside its requests | held (no evidence: a paused trainer learns nothing) |
/// | page says nothing | the idle bound (no online job to protect) |
#[derive(Debug, Clone)]
pub struct BusyBound {
    deviation: f64,
    idle: u32,
    bound: u32,
    engaged: bool,
}

impl BusyBound {
    pub fn new(deviation: f64, idle: u32) -> BusyBound {
        BusyBound {
            deviation,
            idle,
            bound: idle,
            engaged: false,
        }
    }

    /// `tried`: the trainer launched while the online job was busy since
    /// the last step (what the reading says something about).
    pub fn step(&mut self, r: Reading, tried: bool) -> u32 {
        let b = self.deviation;
        if r == Reading::Absent {
            self.engaged = false;
            self.bound = self.idle;
            return self.bound;
        }
        if !std::mem::replace(&mut self.engaged, true) {
            self.bound = 0;
            return self.bound;
        }
        self.bound = match r {
            Reading::Deviation(d) if d >= 3.0 * b => 0,
            Reading::Deviation(d) if d > b => self.bound / 2,
            Reading::Deviation(d) if d > b / 3.0 => self.bound,
            _ if tried || self.bound == 0 => (self.bound + 1).min(self.idle),
            _ => self.bound,
        };
        self.bound
    }

    pub fn current(&self) -> u32 {
        self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_bound_as_a_table() {
        let b = 0.04;
        let rows: &[(&str, &[Reading], &[u32])] = &[
            (
                "an online job appears: hold during its requests, then one more per calm window",
                &[
                    Reading::Deviation(0.0),
                    Reading::Deviation(0.0),
                    Reading::Idle,
                    Reading::Deviation(0.01),
                ],
                &[0, 1, 2, 3],
            ),
            (
                "slowed halves, hurt holds, the dead band keeps",
                &[
                    Reading::Deviation(0.0),
                    Reading::Deviation(0.0),
                    Reading::Deviation(0.0),
                    Reading::Deviation(0.0),
                    Reading::Deviation(0.0),
                    Reading::Deviation(0.06),
                    Reading::Deviation(0.03),
                    Reading::Deviation(0.2),
                ],
                &[0, 1, 2, 3, 4, 2, 2, 0],
            ),
            (
                "never past the idle bound; no page: the idle bound",
                &[
                    Reading::Idle,
                    Reading::Idle,
                    Reading::Idle,
                    Reading::Idle,
                    Reading::Idle,
                    Reading::Idle,
                    Reading::Absent,
                ],
                &[0, 1, 2, 3, 4, 4, 4],
            ),
        ];
        for (name, readings, want) in rows {
            let mut q = BusyBound::new(b, 4);
            let got: Vec<u32> = readings.iter().map(|r| q.step(*r, true)).collect();
            assert_eq!(&got, want, "{name}");
        }
        // A trainer that does not launch beside the requests (paused, or
        // between its steps) learns nothing: past 1 the bound holds.
        let mut q = BusyBound::new(b, 4);
        let got: Vec<u32> = [Reading::Idle; 5]
            .iter()
            .map(|r| q.step(*r, false))
            .collect();
        assert_eq!(got, [0, 1, 1, 1, 1]);
    }

    /// Two launches on (`stream`, `pt`) from a thread of their own, its
    /// stream never drained.
    fn two_launches_on_another_thread(stream: usize, pt: bool) {
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for _ in 0..2 {
                    admit(stream, pt, || Some(false), || false);
                }
            });
        });
    }

    /// One launch on `stream` whose stream drains 30 ms from now; how long
    /// it waited.
    fn admit_drained_after_30ms(stream: usize) -> Duration {
        use std::sync::atomic::AtomicBool;
        let drained = AtomicBool::new(false);
        let t = Instant::now();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                drained.store(true, Relaxed);
            });
            admit(stream, false, || Some(drained.load(Relaxed)), || false);
        });
        t.elapsed()
    }

    // One test touches the process-wide limit: the others in this binary
    // never enable the queue, so they see it off.
    #[test]
    fn a_thread_waits_at_the_limit_until_its_stream_drains_or_the_online_job_goes_idle() {
        // No target: the bound stays at its 2 launches.
        enable(2, 0);
        let never = || false;
        let busy_stream = || Some(false);
        // Two launches pass; the third waits for the drain.
        admit(7, false, busy_stream, never);
        admit(7, false, busy_stream, never);
        assert!(admit_drained_after_30ms(7) >= Duration::from_millis(30));
        // A drain at the idle bound is the queue's pace, not a brake.
        assert_eq!(held().0, 0);
        // The online job busy with a bound of 0: held even on an empty
        // stream, until it goes idle.
        set_busy_bound(0);
        set_online_busy(true);
        let t = Instant::now();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                set_online_busy(false);
            });
            admit(7, false, || Some(true), never);
            admit(7, false, || Some(true), never);
        });
        assert!(t.elapsed() >= Duration::from_millis(30));
        // The first waited for the request; the second passed after it.
        assert_eq!(held().0, 1);
        assert!(held().1 >= 30_000, "{:?}", held());
        // A closing gate is never held here (the gate decides).
        set_online_busy(true);
        admit(7, false, || Some(true), || true);
        set_online_busy(false);
        // A stream the driver cannot query is not waited for.
        admit(9, true, || None, never);
        admit(9, true, || None, never);
        admit(9, true, || None, never);
        assert_eq!(held().0, 1);

        // One stream, two threads (a forward pass, then autograd's thread
        // for the backward pass): one count. The other thread's two
        // launches leave this one's third waiting for the drain.
        two_launches_on_another_thread(0x7f00_1000, false);
        assert!(admit_drained_after_30ms(0x7f00_1000) >= Duration::from_millis(30));
        // A per-thread default stream is each thread's own: another
        // thread's launches on it do not count here.
        two_launches_on_another_thread(0, true);
        admit(0, true, || panic!("not at the limit: never queried"), never);
        admit(0, true, || panic!("not at the limit: never queried"), never);
        // Past the table's streams, each thread counts its own.
        for s in 1..=STREAMS {
            let _ = slot(0x5000_0000 + (s << 4));
        }
        assert!(slot(0x6000_0000).is_none());
        admit(0x6000_0000, false, busy_stream, never);
        admit(0x6000_0000, false, busy_stream, never);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                admit(
                    0x6000_0000,
                    false,
                    || panic!("another thread's count"),
                    never,
                );
            });
        });

        // With a target of work in flight (1 ms): a stream found drained
        // at once raises the bound by one launch; one that took longer
        // than the target to drain lowers it in proportion.
        enable(2, 1000);
        for _ in 0..2 {
            admit(0x7100_0000, false, busy_stream, never);
        }
        admit(0x7100_0000, false, || Some(true), never);
        assert_eq!(idle_bound(), 3);
        for _ in 0..2 {
            admit(0x7100_0000, false, busy_stream, never);
        }
        admit_drained_after_30ms(0x7100_0000);
        assert_eq!(idle_bound(), 2, "30 ms at 3 launches: far past the target");
    }

    #[test]
    fn the_idle_bound_follows_the_work_in_flight() {
        let us = Duration::from_micros;
        let t = us(250);
        // (bound, drained in, want)
        let rows = [
            (2, us(0), 3),     // drained at once: the GPU keeps up
            (2, us(100), 3),   // under half the target
            (8, us(200), 8),   // within it
            (8, us(2000), 2),  // 8 x 250/2000 = 1, never below the floor
            (40, us(500), 20), // twice the target: halved
            (64, us(10), 64),  // never past the most
        ];
        for (bound, waited, want) in rows {
            assert_eq!(
                idle_bound_after(bound, waited, 2, t),
                want,
                "bound {bound}, drained in {waited:?}"
            );
        }
        // No target: the floor.
        assert_eq!(idle_bound_after(9, us(0), 2, Duration::ZERO), 2);
        // A floor above the most is kept.
        assert_eq!(idle_bound_after(100, us(0), 100, t), 100);
    }
}
