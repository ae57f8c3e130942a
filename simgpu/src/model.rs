//! The contention model: pure functions over explicit times (nanoseconds on
//! CLOCK_MONOTONIC), so they are unit-testable without processes or sleeps.
//! It is a deliberately simple model, not a description of real hardware.
//!
//! * A kernel with `b` blocks from a client capped at `cap` SMs demands
//!   `d = max(1, min(b, sm_count, cap))` SMs. Its capped solo duration is
//!   `solo * min(b, sm_count) / d` (the same work on fewer SMs).
//! * SM share, at its start time `s`, from the demand of kernels running at
//!   `s`: relevant demand `R` is, for a priority-1 client, all other demand
//!   plus external load; for priority 0, other priority-0 demand plus
//!   external load plus `interference` x priority-1 demand (MPS priority
//!   only orders pending blocks; resident priority-1 blocks keep their SMs
//!   until they retire). `share = max(1, (d + R) / sm_count)`.
//! * Power: the SM clock follows the SM activity of the last window (a power
//!   controller, not the instant), whoever caused it — priority does not
//!   exempt a client from power capping. `a = max(d / sm_count, activity
//!   over [now - window, now))`, `stretch = share * clock(d / sm_count) / clock(a)`.
//! * The kernel runs `[s, s + capped_solo * stretch)` where
//!   `s = max(now, stream tail)`; everything is decided at launch.
//! * `clock(a) = max_clock` for `a <= knee`, falling linearly to
//!   `min_clock_frac * max_clock` at `a = 1` (power capping). An
//!   `h100-like` GPU has no knee: its clock stays at the maximum.
//! * Shared path (`h100-like` only): memory bandwidth, caches and the launch
//!   path are shared below SM saturation, so a kernel is further stretched by
//!   `1 + shared_path_slowdown x min(1, O / sm_count)`, `O` the SM demand of
//!   other processes' kernels running at its start plus external load,
//!   whatever their priority (MPS priority orders block dispatch, not DRAM).
//! * Dispatch queue (`h200-like` only): a kernel does not start while work
//!   another process put on the GPU ahead of it is in flight. Lower-priority
//!   work running at its start holds `resident_wait` x its remaining time
//!   when the kernel does not fit in the SMs it leaves free (MPS priority
//!   dispatches pending blocks first but never preempts the resident
//!   ones); lower-priority work not yet started holds nothing;
//!   work of the same priority holds `queue_wait` x its remaining time,
//!   queued or running (the hardware serves equal priorities in order).
//!   So what an offline job keeps in flight, not only what it launches
//!   next, decides how long an online kernel waits.
//! * Utilization over a window = fraction of the window with any kernel
//!   running, combined with external load `L` as an independent busy fraction:
//!   `u + L - u*L`. SM activity = SMs demanded by kernels, averaged over the
//!   window, / sm_count, plus `L`, capped at 1. Reported clock =
//!   `clock(SM activity)`: the clock kernels run at.

/// Parameters of one simulated GPU's model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelParams {
    pub sm_count: u32,
    pub max_clock_mhz: u32,
    pub clock_knee: f64,
    pub min_clock_frac: f64,
    pub interference: f64,
    pub window_ns: u64,
    /// Slowdown per unit of other processes' SM demand (0: none, t4-like).
    pub shared_path_slowdown: f64,
    /// Share of a running lower-priority kernel's remaining time that a
    /// kernel waits before it starts (0: no dispatch queue).
    pub resident_wait: f64,
    /// Share of the remaining time of same-priority work in flight (queued
    /// or running) that a kernel waits before it starts.
    pub queue_wait: f64,
}

/// One kernel's interval on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelSpan {
    pub start_ns: u64,
    pub end_ns: u64,
    pub sms: u32,
    pub priority: u32,
    pub pid: i32,
}

/// Background load scripted with `simgpu-ctl load`: a fraction of the SMs
/// busy, treated as priority-0 demand.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExternalLoad {
    pub fraction: f64,
}

/// SMs a client may use with an MPS active thread percentage.
pub fn sm_cap(sm_count: u32, thread_pct: u32) -> u32 {
    let pct = thread_pct.clamp(1, 100) as u64;
    ((sm_count as u64 * pct) / 100).max(1) as u32
}

/// SMs a kernel of `blocks` blocks occupies for a client capped at `cap`.
pub fn demand(p: &ModelParams, blocks: u64, cap: u32) -> u32 {
    blocks.min(p.sm_count as u64).min(cap as u64).max(1) as u32
}

/// SM clock (MHz) at a given SM activity in [0, 1].
pub fn clock_mhz(p: &ModelParams, activity: f64) -> f64 {
    let a = activity.clamp(0.0, 1.0);
    let max = p.max_clock_mhz as f64;
    if a <= p.clock_knee || p.clock_knee >= 1.0 {
        return max;
    }
    let frac = (a - p.clock_knee) / (1.0 - p.clock_knee);
    max * (1.0 - frac * (1.0 - p.min_clock_frac))
}

/// Demand of kernels running at time `t`: (priority 0, priority >= 1).
fn running_demand(kernels: &[KernelSpan], t: u64) -> (u64, u64) {
    let mut d = (0u64, 0u64);
    for k in kernels.iter().filter(|k| k.start_ns <= t && t < k.end_ns) {
        if k.priority == 0 {
            d.0 += k.sms as u64;
        } else {
            d.1 += k.sms as u64;
        }
    }
    d
}

/// Slow-down factor of a kernel of demand `d` and priority `prio` starting
/// at `t`, with `power_activity` the SM activity of the window before the
/// launch (see [`sm_activity`]).
pub fn stretch(
    p: &ModelParams,
    d: u32,
    prio: u32,
    kernels: &[KernelSpan],
    ext: ExternalLoad,
    t: u64,
    power_activity: f64,
) -> f64 {
    let sms = p.sm_count as f64;
    let (p0, p1) = running_demand(kernels, t);
    let ext_d = ext.fraction.clamp(0.0, 1.0) * sms;
    let relevant = if prio == 0 {
        p0 as f64 + ext_d + p.interference * p1 as f64
    } else {
        (p0 + p1) as f64 + ext_d
    };
    let share = ((d as f64 + relevant) / sms).max(1.0);
    // Solo durations are "as measured alone", which already includes the
    // kernel's own effect on the clock: only the extra drop stretches it.
    let alone = (d as f64 / sms).min(1.0);
    share * clock_mhz(p, alone) / clock_mhz(p, alone.max(power_activity))
}

/// The shared-path factor of a kernel of process `pid` starting at `t`:
/// `1 + shared_path_slowdown x min(1, other processes' demand / sm_count)`.
pub fn shared_path(
    p: &ModelParams,
    pid: i32,
    kernels: &[KernelSpan],
    ext: ExternalLoad,
    t: u64,
) -> f64 {
    if p.shared_path_slowdown <= 0.0 {
        return 1.0;
    }
    let sms = p.sm_count as f64;
    let others: u64 = kernels
        .iter()
        .filter(|k| k.pid != pid && k.start_ns <= t && t < k.end_ns)
        .map(|k| k.sms as u64)
        .sum();
    let o = (others as f64 / sms + ext.fraction.clamp(0.0, 1.0)).min(1.0);
    1.0 + p.shared_path_slowdown * o
}

/// When a kernel of process `pid` at priority `prio` demanding `d` SMs,
/// ready at `ready`, starts: after the part of other processes' in-flight
/// work that the dispatch queue serves first (see the module doc). The
/// latest such end counts, not their sum: what was ahead drains in parallel.
pub fn dispatch_start(
    p: &ModelParams,
    d: u32,
    prio: u32,
    pid: i32,
    kernels: &[KernelSpan],
    ready: u64,
) -> u64 {
    if p.resident_wait <= 0.0 && p.queue_wait <= 0.0 {
        return ready;
    }
    let others = |k: &&KernelSpan| k.pid != pid && k.end_ns > ready;
    let running: u64 = kernels
        .iter()
        .filter(others)
        .filter(|k| k.start_ns <= ready)
        .map(|k| k.sms as u64)
        .sum();
    // Room beside what runs: its blocks start at once, resident or not.
    let fits = d as u64 + running <= p.sm_count as u64;
    kernels
        .iter()
        .filter(others)
        .map(|k| {
            let share = match k.priority.cmp(&prio) {
                std::cmp::Ordering::Greater if k.start_ns <= ready && !fits => p.resident_wait,
                std::cmp::Ordering::Equal => p.queue_wait,
                _ => 0.0,
            };
            ready + (share.clamp(0.0, 1.0) * (k.end_ns - ready) as f64) as u64
        })
        .fold(ready, u64::max)
}

/// A launch request.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub now_ns: u64,
    pub stream_tail_ns: u64,
    pub solo_ns: u64,
    pub blocks: u64,
    pub cap_sms: u32,
    pub priority: u32,
    pub pid: i32,
}

/// Places a kernel on the timeline given the kernels running from its
/// launch on and the SM activity of the window before it.
pub fn plan(
    p: &ModelParams,
    l: &Launch,
    kernels: &[KernelSpan],
    ext: ExternalLoad,
    power_activity: f64,
) -> KernelSpan {
    let ready = l.now_ns.max(l.stream_tail_ns);
    let d = demand(p, l.blocks, l.cap_sms);
    let start = dispatch_start(p, d, l.priority, l.pid, kernels, ready);
    let full = l.blocks.clamp(1, p.sm_count as u64) as f64;
    let capped_solo = l.solo_ns as f64 * full / d as f64;
    let dur = capped_solo
        * stretch(p, d, l.priority, kernels, ext, start, power_activity)
        * shared_path(p, l.pid, kernels, ext, start);
    KernelSpan {
        start_ns: start,
        end_ns: start + dur.round().max(1.0) as u64,
        sms: d,
        priority: l.priority,
        pid: l.pid,
    }
}

/// Fraction of `[t0, t1)` during which at least one kernel ran (plus external load).
pub fn utilization(kernels: &[KernelSpan], ext: ExternalLoad, t0: u64, t1: u64) -> f64 {
    if t1 <= t0 {
        return 0.0;
    }
    let mut iv: Vec<(u64, u64)> = kernels
        .iter()
        .map(|k| (k.start_ns.max(t0), k.end_ns.min(t1)))
        .filter(|(a, b)| a < b)
        .collect();
    iv.sort_unstable();
    let mut busy = 0u64;
    let mut cur: Option<(u64, u64)> = None;
    for (a, b) in iv {
        match cur {
            Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                busy += cb - ca;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    if let Some((ca, cb)) = cur {
        busy += cb - ca;
    }
    let u = busy as f64 / (t1 - t0) as f64;
    let l = ext.fraction.clamp(0.0, 1.0);
    (u + l - u * l).clamp(0.0, 1.0)
}

/// SMs demanded by the kernels over `[t0, t1)`, time-averaged, / sm_count,
/// plus external load, in [0, 1]. Demand, not busy SMs: where kernels ask
/// for more SMs than there are (and stretch for it) the window reads busier
/// than the SMs were; one pass, no sorting, so every launch can afford it.
pub fn sm_activity(
    p: &ModelParams,
    kernels: impl IntoIterator<Item = KernelSpan>,
    ext: ExternalLoad,
    t0: u64,
    t1: u64,
) -> f64 {
    if t1 <= t0 {
        return 0.0;
    }
    let area: f64 = kernels
        .into_iter()
        .filter(|k| k.end_ns > t0 && k.start_ns < t1)
        .map(|k| (k.end_ns.min(t1) - k.start_ns.max(t0)) as f64 * k.sms as f64)
        .sum();
    let a = area / ((t1 - t0) as f64 * p.sm_count as f64);
    (a + ext.fraction.clamp(0.0, 1.0)).min(1.0)
}

/// Telemetry of one window ending at `now`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub utilization: f64,
    pub sm_activity: f64,
    pub sm_clock_mhz: f64,
}

pub fn sample(p: &ModelParams, kernels: &[KernelSpan], ext: ExternalLoad, now: u64) -> Sample {
    let t0 = now.saturating_sub(p.window_ns);
    let sm_activity = sm_activity(p, kernels.iter().copied(), ext, t0, now);
    Sample {
        utilization: utilization(kernels, ext, t0, now),
        sm_activity,
        sm_clock_mhz: clock_mhz(p, sm_activity),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The configs build the model's parameters (config -> model), so the
    // tests take theirs from there too.
    fn h100_like() -> ModelParams {
        crate::config::GpuConfig::h100_like(0, 0).model()
    }

    const MS: u64 = 1_000_000;

    /// Runs clients launching back-to-back kernels (one stream each) from
    /// t=0 to `until`, all launches interleaved in time order; returns each
    /// client's completed kernel count and the recorded spans.
    fn run(
        p: &ModelParams,
        clients: &[(u64, u32, u32)],
        until: u64,
    ) -> (Vec<u64>, Vec<KernelSpan>) {
        // (blocks, cap, priority); every kernel is 1 ms solo.
        let mut tails = vec![0u64; clients.len()];
        let mut done = vec![0u64; clients.len()];
        let mut spans = Vec::new();
        loop {
            let (i, &t) = tails.iter().enumerate().min_by_key(|(_, t)| **t).unwrap();
            if t >= until {
                break;
            }
            let (blocks, cap, priority) = clients[i];
            let l = Launch {
                now_ns: t,
                stream_tail_ns: t,
                solo_ns: MS,
                blocks,
                cap_sms: cap,
                priority,
                pid: i as i32 + 1,
            };
            let ext = ExternalLoad::default();
            let power = sm_activity(
                p,
                spans.iter().copied(),
                ext,
                t.saturating_sub(p.window_ns),
                t,
            );
            let k = plan(p, &l, &spans, ext, power);
            spans.push(k);
            tails[i] = k.end_ns;
            if k.end_ns <= until {
                done[i] += 1;
            }
        }
        (done, spans)
    }

    #[test]
    fn alone_vs_overlapping() {
        let p = h100_like();
        let full = p.sm_count;
        let (alone, s1) = run(&p, &[(full as u64, full, 0)], 1000 * MS);
        let (two, s2) = run(
            &p,
            &[(full as u64, full, 0), (full as u64, full, 0)],
            1000 * MS,
        );
        // Alone: exactly solo time per kernel, GPU saturated, clock at the floor.
        assert_eq!(alone[0], 1000);
        // Overlapping: each client's step time grows (fewer kernels done).
        assert!(
            two[0] < alone[0] * 6 / 10 && two[1] < alone[0] * 6 / 10,
            "{two:?}"
        );
        let a1 = sample(&p, &s1, ExternalLoad::default(), 1000 * MS);
        let a2 = sample(&p, &s2, ExternalLoad::default(), 1000 * MS);
        assert!(a1.utilization > 0.99 && a2.utilization > 0.99);
        assert!(a2.sm_activity > 0.99);
        assert!(a2.sm_clock_mhz < 0.8 * p.max_clock_mhz as f64);
    }

    #[test]
    fn light_load_keeps_clock_and_heavy_load_drops_it() {
        let p = h100_like();
        // 20 SMs busy all the time: ~15% activity, full clock, utilization 1.
        let (_, s) = run(&p, &[(20, 132, 0)], 1000 * MS);
        let a = sample(&p, &s, ExternalLoad::default(), 1000 * MS);
        assert!(a.utilization > 0.99);
        assert!((a.sm_activity - 20.0 / 132.0).abs() < 0.01);
        assert_eq!(a.sm_clock_mhz, p.max_clock_mhz as f64);
        // Idle window: nothing.
        let idle = sample(&p, &s, ExternalLoad::default(), 5000 * MS);
        assert_eq!(idle.utilization, 0.0);
        assert_eq!(idle.sm_clock_mhz, p.max_clock_mhz as f64);
        // Clock curve: flat to the knee, min at 100%.
        assert_eq!(clock_mhz(&p, 0.7), p.max_clock_mhz as f64);
        assert!((clock_mhz(&p, 1.0) - 0.75 * p.max_clock_mhz as f64).abs() < 1e-9);
        assert!(clock_mhz(&p, 0.85) < clock_mhz(&p, 0.75));
    }

    #[test]
    fn small_kernels_side_by_side_do_not_slow_down() {
        let p = h100_like();
        let (alone, _) = run(&p, &[(40, 132, 0)], 500 * MS);
        let (two, _) = run(&p, &[(40, 132, 0), (40, 132, 1)], 500 * MS);
        // 80 of 132 SMs: no SM sharing, activity ~61% < knee: no slowdown.
        assert_eq!(two[0], alone[0]);
        assert_eq!(two[1], alone[0]);
    }

    #[test]
    fn thread_percentage_caps_sms() {
        let p = h100_like();
        assert_eq!(sm_cap(132, 50), 66);
        assert_eq!(demand(&p, 132, sm_cap(132, 50)), 66);
        let (full, _) = run(&p, &[(132, 132, 0)], 1000 * MS);
        let (half, s) = run(&p, &[(132, sm_cap(132, 50), 0)], 1000 * MS);
        // Half the SMs: the same work takes about twice as long...
        assert!(
            half[0] * 2 <= full[0] + 2 && half[0] * 2 + 2 >= full[0],
            "{half:?} {full:?}"
        );
        // ...and leaves half the GPU idle.
        let a = sample(&p, &s, ExternalLoad::default(), 1000 * MS);
        assert!((a.sm_activity - 0.5).abs() < 0.01);
        // Capped offline next to online: the online client slows down less.
        let (shared_uncapped, _) = run(&p, &[(132, 132, 0), (132, 132, 0)], 1000 * MS);
        let (shared_capped, _) = run(&p, &[(132, 132, 0), (132, sm_cap(132, 25), 0)], 1000 * MS);
        assert!(
            shared_capped[0] > shared_uncapped[0],
            "{shared_capped:?} {shared_uncapped:?}"
        );
    }

    #[test]
    fn priority_changes_who_slows_down() {
        let p = h100_like();
        let (alone, _) = run(&p, &[(132, 132, 0)], 1000 * MS);
        let (mixed, _) = run(&p, &[(132, 132, 0), (132, 132, 1)], 1000 * MS);
        // The priority-0 client keeps most of its speed; the priority-1 one pays.
        assert!(mixed[0] > mixed[1] * 3 / 2, "{mixed:?}");
        assert!(mixed[0] * 100 > alone[0] * 60, "{mixed:?} vs {alone:?}");
        // Swap priorities: the other client now wins.
        let (swapped, _) = run(&p, &[(132, 132, 1), (132, 132, 0)], 1000 * MS);
        assert!(swapped[1] > swapped[0] * 3 / 2, "{swapped:?}");
    }

    #[test]
    fn the_clock_follows_the_window_whoever_caused_it() {
        let p = h100_like();
        let none = ExternalLoad::default();
        // A 64-SM priority-0 kernel next to a priority-1 one on 79 SMs: the
        // SMs are not oversubscribed for priority 0 (64 + 0.1 * 79 < 132).
        let other = KernelSpan {
            start_ns: 0,
            end_ns: 10 * MS,
            sms: 79,
            priority: 1,
            pid: 2,
        };
        // An idle window before the launch: full clock, no stretch.
        assert_eq!(stretch(&p, 64, 0, &[other], none, MS, 0.0), 1.0);
        // A window at 95% SM activity, priority-1 work included: the clock
        // is down (power capping) and the priority-0 kernel pays for it.
        let busy = stretch(&p, 64, 0, &[other], none, MS, 0.95);
        let clock = 1.0 - (0.95 - 0.7) / 0.3 * 0.25;
        assert!((busy - 1.0 / clock).abs() < 1e-9, "{busy}");
        // The window's activity is SM demand over time: 66 SMs for half of it,
        // then 132 SMs for a quarter, plus 10% external load.
        let spans = [
            KernelSpan {
                start_ns: 0,
                end_ns: 100 * MS,
                sms: 66,
                ..other
            },
            KernelSpan {
                start_ns: 150 * MS,
                end_ns: 300 * MS,
                sms: 132,
                ..other
            },
        ];
        let a = sm_activity(&p, spans, ExternalLoad { fraction: 0.1 }, 0, 200 * MS);
        assert!((a - (0.25 + 0.25 + 0.1)).abs() < 1e-9, "{a}");
    }

    #[test]
    fn external_load_drives_telemetry() {
        let p = h100_like();
        let s = sample(&p, &[], ExternalLoad { fraction: 0.9 }, 10 * MS);
        assert!((s.sm_activity - 0.9).abs() < 1e-9);
        assert!((s.utilization - 0.9).abs() < 1e-9);
        assert!(s.sm_clock_mhz < p.max_clock_mhz as f64);
        // External load also stretches kernels.
        assert!(stretch(&p, 132, 0, &[], ExternalLoad { fraction: 0.5 }, 0, 0.0) > 1.4);
    }

    /// The two contention modes side by side, one row per case: the online
    /// client's kernel (64 SMs, priority 0) next to an offline one (79 SMs,
    /// priority 1: the policy's 60 % share), and what it is stretched by.
    #[test]
    fn the_two_modes_table() {
        use crate::config::{GpuConfig, GpuModel};
        let mode = |m: GpuModel| {
            let mut c = GpuConfig::h100_like(0, 0);
            c.model = m;
            c.model()
        };
        let (t4, h100) = (mode(GpuModel::T4Like), mode(GpuModel::H100Like));
        let none = ExternalLoad::default();
        let offline = KernelSpan {
            start_ns: 0,
            end_ns: 10 * MS,
            sms: 79,
            priority: 1,
            pid: 2,
        };
        let own = KernelSpan {
            pid: 1,
            priority: 0,
            sms: 64,
            ..offline
        };
        let launch = Launch {
            now_ns: MS,
            stream_tail_ns: 0,
            solo_ns: MS,
            blocks: 64,
            cap_sms: 132,
            priority: 0,
            pid: 1,
        };
        let took = |p: &ModelParams, running: &[KernelSpan], power: f64| {
            let k = plan(p, &launch, running, none, power);
            (k.end_ns - k.start_ns) as f64 / MS as f64
        };
        let cases: &[(&str, &ModelParams, &[KernelSpan], f64, f64)] = &[
            ("t4-like, alone", &t4, &[], 0.3, 1.0),
            (
                "t4-like, beside offline below the knee",
                &t4,
                &[offline],
                0.65,
                1.0,
            ),
            (
                "t4-like, beside offline past the knee: the clock",
                &t4,
                &[offline],
                0.95,
                1.0 / (1.0 - (0.95 - 0.7) / 0.3 * 0.25),
            ),
            ("h100-like, alone", &h100, &[], 0.3, 1.0),
            (
                "h100-like, own kernel running is not another process",
                &h100,
                &[own],
                0.3,
                1.0,
            ),
            (
                "h100-like, beside offline: shared path, clock flat",
                &h100,
                &[offline],
                0.95,
                1.0 + SLOW * 79.0 / 132.0,
            ),
            (
                "h100-like, offline finished before the launch",
                &h100,
                &[KernelSpan {
                    end_ns: MS / 2,
                    ..offline
                }],
                0.95,
                1.0,
            ),
        ];
        const SLOW: f64 = crate::config::SHARED_PATH_SLOWDOWN;
        for (name, p, running, power, want) in cases {
            let got = took(p, running, *power);
            assert!(
                (got - want).abs() < 1e-3,
                "{name}: took {got} ms, want {want}"
            );
        }
        // The h100-like clock stays at its maximum at any activity.
        assert_eq!(clock_mhz(&h100, 1.0), h100.max_clock_mhz as f64);
        assert!(clock_mhz(&t4, 1.0) < t4.max_clock_mhz as f64);
    }

    /// The h200-like dispatch queue, one row per case: when an online
    /// kernel (priority 0, ready at 1 ms) starts beside another process's
    /// work. What is in flight decides it, not only what runs.
    #[test]
    fn the_dispatch_queue_table() {
        use crate::config::{GpuConfig, GpuModel, H200_QUEUE_WAIT, H200_RESIDENT_WAIT};
        let mut c = GpuConfig::h100_like(0, 0);
        c.model = GpuModel::H200Like;
        let p = c.model();
        let k = |start_ms: u64, end_ms: u64, priority: u32, pid: i32| KernelSpan {
            start_ns: start_ms * MS,
            end_ns: end_ms * MS,
            sms: 58,
            priority,
            pid,
        };
        let at = |ms: f64| (ms * MS as f64) as u64;
        let cases: &[(&str, Vec<KernelSpan>, u64)] = &[
            ("nothing in flight", vec![], MS),
            (
                "own kernel running: the stream tail says",
                vec![k(0, 5, 0, 1)],
                MS,
            ),
            (
                "offline (priority 1) running until 5 ms: part of its resident blocks",
                vec![k(0, 5, 1, 2)],
                at(1.0 + H200_RESIDENT_WAIT * 4.0),
            ),
            (
                "offline queued behind it (not started): priority goes first",
                vec![k(0, 5, 1, 2), k(5, 9, 1, 2)],
                at(1.0 + H200_RESIDENT_WAIT * 4.0),
            ),
            (
                "no priority: in-flight work of the same priority, queued too",
                vec![k(0, 5, 0, 2), k(5, 9, 0, 2)],
                at(1.0 + H200_QUEUE_WAIT * 8.0),
            ),
            ("finished before it was ready", vec![k(0, 1, 1, 2)], MS),
        ];
        // The online kernel wants 100 SMs; the offline one holds 58 (44 %).
        for (name, running, want) in cases {
            assert_eq!(dispatch_start(&p, 100, 0, 1, running, MS), *want, "{name}");
        }
        // Room beside the offline kernel (26 SMs at a 20 % share): no wait.
        let narrow = KernelSpan {
            sms: 26,
            ..k(0, 5, 1, 2)
        };
        assert_eq!(dispatch_start(&p, 100, 0, 1, &[narrow], MS), MS);
        // A lower-priority kernel does not wait for the online one: it fills
        // the SMs left free (the share and shared-path terms slow it).
        assert_eq!(dispatch_start(&p, 58, 1, 2, &[k(0, 5, 0, 1)], MS), MS);
        // The other modes have no dispatch queue.
        c.model = GpuModel::H100Like;
        assert_eq!(
            dispatch_start(&c.model(), 100, 0, 1, &[k(0, 5, 1, 2)], MS),
            MS
        );
    }
}
