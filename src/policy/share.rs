//! Dynamic SM allocation and the memory cap of an offline job: pure functions
//! of what the health checks recorded about its online partner.

use crate::config::{OfflineGuard, Policy};

/// What the node knows about a GPU and its online job when an offline job
/// starts there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuFacts {
    /// The online job's SM activity (percent) measured while it ran alone.
    pub online_solo_sm_pct: Option<u8>,
    /// GPU memory the online job uses, MiB.
    pub online_mem_mib: Option<u64>,
    /// The GPU's memory, MiB.
    pub mem_total_mib: Option<u64>,
    /// The board's enforced power limit, W (NVML); None where NVML gives
    /// none. Decides whether a wider share costs the online job its clock
    /// ([`offline_sm_budget`]).
    pub power_limit_w: Option<u32>,
}

impl GpuFacts {
    /// The facts for an offline job on a GPU that runs no online job now
    /// (an idle GPU, or its online job has ended): an idle partner. The
    /// solo figures a GPU keeps belong to an online job that has left, so
    /// they size nothing: the SM share is the ceiling, the memory cap the
    /// GPU's memory less the reserve. Safe because an online job that
    /// lands there later requeues the offline jobs it finds (the Prolog):
    /// MPS fixes a client's limits when it starts, so they cannot shrink.
    pub fn without_online(self) -> GpuFacts {
        GpuFacts {
            online_solo_sm_pct: Some(0),
            online_mem_mib: None,
            mem_total_mib: self.mem_total_mib,
            power_limit_w: self.power_limit_w,
        }
    }
}

/// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the offline jobs of a GPU together
/// (their budget). Under the bounded queue ([`OfflineGuard::Queue`]) on a
/// board whose power limit is at least `[policy] queue_ceiling_min_power_w`,
/// the ceiling: the queue keeps the offline job off the online job's
/// requests in time, and a share sized for them only slows it in the gaps
/// (h200-like closed loop: the trainer at 0.39–0.40 of its solo speed at
/// 44 %, 0.54–0.56 at 80 %, the service as close to alone). Below that
/// limit, or where NVML gives none, and without the queue: sized in space
/// ([`offline_sm_percent`]), since on a power-capped board (T4 70 W, A10
/// 150 W) a wider share pulls the service's SM clock down (t4-like: 80 %
/// gave the service ×1.08 at p50 and the trainer fewer steps than 60 %,
/// ×1.05; xcuda/README.md).
pub fn offline_sm_budget(policy: &Policy, facts: &GpuFacts) -> u8 {
    let full_power = facts
        .power_limit_w
        .is_some_and(|w| w >= policy.queue_ceiling_min_power_w);
    if policy.guard == OfflineGuard::Queue && full_power {
        return policy.sm_ceiling.get();
    }
    offline_sm_percent(policy, facts.online_solo_sm_pct)
}

/// The share sized in space: the SMs the online job leaves idle, less a
/// headroom, within [floor, ceiling]; the default when the online job's
/// solo activity was never measured.
pub fn offline_sm_percent(policy: &Policy, online_solo_sm_pct: Option<u8>) -> u8 {
    let floor = policy.sm_floor.get();
    let ceiling = policy.sm_ceiling.get();
    match online_solo_sm_pct {
        None => policy.sm_default.get(),
        Some(active) => {
            let idle = 100u8.saturating_sub(active.min(100));
            idle.saturating_sub(policy.sm_headroom.get())
                .clamp(floor, ceiling)
        }
    }
}

/// The offline job's GPU memory cap, MiB: the GPU's memory less the online
/// job's use and the reserve. None when the GPU's memory is unknown (then
/// no cap can be derived and the caller decides).
pub fn offline_mem_cap_mib(policy: &Policy, facts: &GpuFacts) -> Option<u64> {
    let total = facts.mem_total_mib?;
    Some(
        total
            .saturating_sub(facts.online_mem_mib.unwrap_or(0))
            .saturating_sub(policy.memory_reserve_mib),
    )
}

/// What one offline job on a GPU gets: its MPS SM share and memory cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotShare {
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
    pub sm_pct: u8,
    /// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, MiB; None when the GPU's memory is
    /// unknown ([`offline_mem_cap_mib`]).
    pub mem_cap_mib: Option<u64>,
}

/// What an offline job holding `slots` of its GPU's offline slots
/// (`policy.offline_per_gpu` = N of them) gets: that many parts of the
/// GPU's offline SM budget ([`offline_sm_percent`]: what the online job
/// leaves, less headroom, within floor and ceiling) and of its memory room
/// ([`offline_mem_cap_mib`]), by [`offline_part`]. N slots (or N = 1) give
/// the whole budget.
///
/// Why parts of the configured N, not of the jobs there now: MPS fixes a
/// client's SM share and memory limit when it starts, so a job that
/// started alone cannot give half back when a second one arrives. Slurm
/// holds each job's slots (its `mfslot:g<i>:<s>` request against the GPU's
/// N records) and the Prolog records which ones under the GPU's lock, so
/// the parts of whatever jobs run at once never add up to more than the
/// budget, and a late arrival never waits for anyone to shrink. The
/// matcher chooses how many slots a job takes (all N on a GPU it holds
/// alone, fewer when it puts jobs side by side).
pub fn offline_slot_share(policy: &Policy, facts: &GpuFacts, slots: u32) -> SlotShare {
    let n = u32::from(policy.offline_per_gpu.max(1));
    let budget = offline_sm_budget(policy, facts);
    SlotShare {
        sm_pct: offline_part(u64::from(budget), slots, n) as u8,
        mem_cap_mib: offline_mem_cap_mib(policy, facts).map(|room| offline_part(room, slots, n)),
    }
}

/// One of `jobs` equal parts of a GPU's offline `budget`:
/// [`offline_part`]`(budget, 1, jobs)`.
pub fn offline_share(budget: u64, jobs: u32) -> u64 {
    offline_part(budget, 1, jobs)
}

/// `slots` of `per_gpu` equal parts of a GPU's offline `budget` (`[policy]
/// offline_per_gpu` > 1): `budget × slots / per_gpu`, rounded
/// down, so jobs holding different slots never exceed the budget together.
/// The one split of both budgets — the SM percentage
/// ([`offline_sm_percent`]) and the memory cap, MiB
/// ([`offline_mem_cap_mib`]) — used by the node (the limits it gives each
/// job) and by the matcher and the replay (what they predict for it). A
/// non-zero budget gives at least 1 (MPS takes no 0% share); `per_gpu` 0
/// is read as 1, `slots` is taken within 1..=per_gpu.
pub fn offline_part(budget: u64, slots: u32, per_gpu: u32) -> u64 {
    let n = u64::from(per_gpu.max(1));
    let s = u64::from(slots.clamp(1, per_gpu.max(1)));
    let part = budget * s / n;
    if budget > 0 {
        part.max(1)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Percent;

    /// The share sized in space (the queue off): floor 10, ceiling 80,
    /// headroom 10, default 30, reserve 2048.
    fn policy() -> Policy {
        Policy {
            guard: OfflineGuard::Share,
            ..Policy::default()
        }
    }

    #[test]
    fn under_the_queue_a_full_power_board_gives_the_ceiling() {
        let mut p = Policy::default();
        assert_eq!(p.guard, OfflineGuard::Queue, "the shipped default");
        let at = |solo: Option<u8>, watts: Option<u32>| GpuFacts {
            online_solo_sm_pct: solo,
            power_limit_w: watts,
            ..GpuFacts::default()
        };
        // (solo SM %, power limit W, budget, why)
        let cases: &[(Option<u8>, Option<u32>, u8, &str)] = &[
            (
                Some(46),
                Some(700),
                80,
                "an H200 beside its service: the ceiling",
            ),
            (
                None,
                Some(700),
                80,
                "never measured: the ceiling all the same",
            ),
            (Some(100), Some(200), 80, "at the limit exactly: full power"),
            (Some(30), Some(70), 60, "a T4: power-capped, sized in space"),
            (Some(30), Some(199), 60, "just below the limit"),
            (Some(30), None, 60, "no power reading: sized in space"),
            (
                None,
                Some(70),
                30,
                "power-capped, never measured: the default",
            ),
        ];
        for (solo, watts, want, why) in cases {
            assert_eq!(offline_sm_budget(&p, &at(*solo, *watts)), *want, "{why}");
        }
        // Without the queue every board is sized in space.
        p.guard = OfflineGuard::Share;
        assert_eq!(offline_sm_budget(&p, &at(Some(46), Some(700))), 44);
        p.guard = OfflineGuard::Queue;
        p.sm_ceiling = Percent::new(60).unwrap();
        assert_eq!(offline_sm_budget(&p, &at(Some(46), Some(700))), 60);
        p.queue_ceiling_min_power_w = 0;
        assert_eq!(
            offline_sm_budget(&p, &at(Some(30), None)),
            60,
            "0: every board"
        );
        // Two slots of a GPU split the ceiling as they split any budget.
        p.offline_per_gpu = 2;
        assert_eq!(
            offline_slot_share(&p, &at(Some(46), Some(700)), 1).sm_pct,
            30
        );
    }

    #[test]
    fn sm_percent_table() {
        let p = policy();
        let cases: &[(Option<u8>, u8, &str)] = &[
            (None, 30, "no record: the default"),
            (Some(0), 80, "idle online: capped by the ceiling"),
            (Some(5), 80, "100-5-10=85 above the ceiling"),
            (Some(20), 70, "100-20-10"),
            (Some(50), 40, "100-50-10"),
            (Some(80), 10, "100-80-10=10: the floor exactly"),
            (Some(85), 10, "below the floor: the floor"),
            (Some(100), 10, "saturated online: the floor"),
            (Some(200), 10, "out-of-range reading: treated as 100"),
        ];
        for (solo, want, why) in cases {
            assert_eq!(offline_sm_percent(&p, *solo), *want, "{why}");
        }
    }

    #[test]
    fn sm_percent_respects_configured_bounds() {
        let mut p = policy();
        p.sm_floor = Percent::new(25).unwrap();
        p.sm_ceiling = Percent::new(50).unwrap();
        p.sm_headroom = Percent::new(0).unwrap();
        assert_eq!(offline_sm_percent(&p, Some(10)), 50);
        assert_eq!(offline_sm_percent(&p, Some(60)), 40);
        assert_eq!(offline_sm_percent(&p, Some(90)), 25);
    }

    #[test]
    fn memory_cap_table() {
        let p = policy();
        let f = |total, online| GpuFacts {
            online_solo_sm_pct: None,
            online_mem_mib: online,
            mem_total_mib: total,
            power_limit_w: None,
        };
        let cases: &[(GpuFacts, Option<u64>, &str)] = &[
            (
                f(Some(81559), Some(12000)),
                Some(81559 - 12000 - 2048),
                "total - online - reserve",
            ),
            (
                f(Some(81559), None),
                Some(81559 - 2048),
                "online use unknown: counted as 0",
            ),
            (
                f(Some(16384), Some(15000)),
                Some(0),
                "no room: 0, never negative",
            ),
            (
                f(None, Some(1000)),
                None,
                "GPU memory unknown: no cap derivable",
            ),
        ];
        for (facts, want, why) in cases {
            assert_eq!(offline_mem_cap_mib(&p, facts), *want, "{why}");
        }
    }

    #[test]
    fn slot_share_table() {
        struct Row {
            name: &'static str,
            per_gpu: u8,
            solo_sm_pct: Option<u8>,
            mem_total_mib: Option<u64>,
            online_mem_mib: Option<u64>,
            /// (SM %, memory cap MiB) of each slot.
            want: (u8, Option<u64>),
        }
        let rows = [
            Row {
                name: "N=1: the whole budget (100-30-10) and room (40000-10000-2048)",
                per_gpu: 1,
                solo_sm_pct: Some(30),
                mem_total_mib: Some(40_000),
                online_mem_mib: Some(10_000),
                want: (60, Some(27_952)),
            },
            Row {
                name: "N=2: halves",
                per_gpu: 2,
                solo_sm_pct: Some(30),
                mem_total_mib: Some(40_000),
                online_mem_mib: Some(10_000),
                want: (30, Some(13_976)),
            },
            Row {
                name: "N=3: rounded down, the sum within the budget",
                per_gpu: 3,
                solo_sm_pct: Some(30),
                mem_total_mib: Some(40_000),
                online_mem_mib: Some(10_000),
                want: (20, Some(9_317)),
            },
            Row {
                name: "N=4, budget 70 (solo 20): 17 each; room 67511: 16877 each",
                per_gpu: 4,
                solo_sm_pct: Some(20),
                mem_total_mib: Some(81_559),
                online_mem_mib: Some(12_000),
                want: (17, Some(16_877)),
            },
            Row {
                name: "N=2, idle GPU: the ceiling (80) split, no online memory",
                per_gpu: 2,
                solo_sm_pct: Some(0),
                mem_total_mib: Some(81_559),
                online_mem_mib: None,
                want: (40, Some(39_755)),
            },
            Row {
                name: "N=4, saturated online: the floor (10) split, 2 each; no room",
                per_gpu: 4,
                solo_sm_pct: Some(100),
                mem_total_mib: Some(16_384),
                online_mem_mib: Some(15_000),
                want: (2, Some(0)),
            },
            Row {
                name: "N=2, nothing recorded: the default (30) split, no cap",
                per_gpu: 2,
                solo_sm_pct: None,
                mem_total_mib: None,
                online_mem_mib: None,
                want: (15, None),
            },
        ];
        for r in rows {
            let mut p = policy();
            p.offline_per_gpu = r.per_gpu;
            let facts = GpuFacts {
                online_solo_sm_pct: r.solo_sm_pct,
                online_mem_mib: r.online_mem_mib,
                mem_total_mib: r.mem_total_mib,
                power_limit_w: None,
            };
            let s = offline_slot_share(&p, &facts, 1);
            assert_eq!((s.sm_pct, s.mem_cap_mib), r.want, "{}", r.name);
            // N parts never add up to more than the whole.
            let n = u64::from(r.per_gpu);
            assert!(
                u64::from(s.sm_pct) * n <= u64::from(offline_sm_percent(&p, r.solo_sm_pct)),
                "{}",
                r.name
            );
            if let Some(room) = offline_mem_cap_mib(&p, &facts) {
                assert!(s.mem_cap_mib.unwrap() * n <= room, "{}", r.name);
            }
        }
    }

    #[test]
    fn a_share_is_never_zero() {
        let mut p = policy();
        p.sm_floor = Percent::new(1).unwrap();
        p.offline_per_gpu = 4;
        let facts = GpuFacts {
            online_solo_sm_pct: Some(100),
            ..GpuFacts::default()
        };
        // Budget 1 %: MPS takes no 0 %, so every slot gets 1 %.
        assert_eq!(offline_slot_share(&p, &facts, 1).sm_pct, 1);
    }

    #[test]
    fn an_idle_gpu_ignores_the_figures_of_an_online_job_that_left() {
        let p = policy();
        let left_behind = GpuFacts {
            online_solo_sm_pct: Some(70),
            online_mem_mib: Some(40_000),
            mem_total_mib: Some(81_559),
            power_limit_w: None,
        };
        let idle = left_behind.without_online();
        assert_eq!(
            offline_sm_percent(&p, idle.online_solo_sm_pct),
            80,
            "the ceiling"
        );
        assert_eq!(offline_mem_cap_mib(&p, &idle), Some(81_559 - 2048));
        let unknown = GpuFacts::default().without_online();
        assert_eq!(
            offline_mem_cap_mib(&p, &unknown),
            None,
            "memory still unknown"
        );
    }

    #[test]
    fn offline_share_table() {
        struct Case {
            why: &'static str,
            budget: u64,
            jobs: u32,
            want: u64,
        }
        let cases = [
            Case {
                why: "one job: the whole budget",
                budget: 70,
                jobs: 1,
                want: 70,
            },
            Case {
                why: "two jobs: half each",
                budget: 70,
                jobs: 2,
                want: 35,
            },
            Case {
                why: "three jobs: rounded down (69 of 70 used)",
                budget: 70,
                jobs: 3,
                want: 23,
            },
            Case {
                why: "four jobs at the SM floor: 10/4 rounded down",
                budget: 10,
                jobs: 4,
                want: 2,
            },
            Case {
                why: "a budget smaller than the jobs: 1 each (MPS takes no 0%)",
                budget: 3,
                jobs: 4,
                want: 1,
            },
            Case {
                why: "no budget: 0",
                budget: 0,
                jobs: 2,
                want: 0,
            },
            Case {
                why: "0 jobs read as 1",
                budget: 70,
                jobs: 0,
                want: 70,
            },
            Case {
                why: "memory, MiB: 79511 between 2",
                budget: 79_511,
                jobs: 2,
                want: 39_755,
            },
        ];
        for c in cases {
            assert_eq!(offline_share(c.budget, c.jobs), c.want, "{}", c.why);
            assert!(
                c.budget == 0
                    || c.want * u64::from(c.jobs.max(1)) <= c.budget.max(u64::from(c.jobs)),
                "{}: over the budget",
                c.why
            );
        }
    }

    #[test]
    fn parts_of_several_slots_table() {
        // (budget, slots, per_gpu, want, why)
        let cases: &[(u64, u32, u32, u64, &str)] = &[
            (70, 2, 2, 70, "both slots of N = 2: the whole budget"),
            (70, 1, 2, 35, "one of two: half"),
            (70, 4, 4, 70, "all four of N = 4: the whole budget"),
            (70, 2, 4, 35, "two of four: half"),
            (70, 3, 4, 52, "three of four: 210/4 rounded down"),
            (70, 2, 3, 46, "two of three: 140/3 rounded down"),
            (3, 1, 4, 1, "a budget below the parts: 1 (MPS takes no 0%)"),
            (0, 2, 2, 0, "no budget: 0"),
            (70, 5, 4, 70, "more slots than the GPU has: read as all"),
            (70, 0, 4, 17, "0 slots read as 1"),
            (79_511, 1, 2, 39_755, "memory, MiB: one of two"),
        ];
        for &(budget, slots, per_gpu, want, why) in cases {
            assert_eq!(offline_part(budget, slots, per_gpu), want, "{why}");
        }
        // Jobs that hold different slots never exceed the budget together.
        for n in 1..=4u32 {
            for budget in [10u64, 37, 70, 80, 79_511] {
                for split in [vec![n], vec![1; n as usize], vec![n - n / 2, n / 2]] {
                    let total: u64 = split
                        .iter()
                        .filter(|&&s| s > 0)
                        .map(|&s| offline_part(budget, s, n))
                        .sum();
                    assert!(total <= budget, "{split:?} of {n} slots, budget {budget}");
                }
            }
        }
    }
}
