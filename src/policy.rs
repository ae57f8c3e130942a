//! Dynamic SM allocation and the memory cap of an offline job: pure functions
//! of what the health checks recorded about its online partner.

use crate::config::Policy;

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
        }
    }
}

/// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the offline job: the SMs the online
/// job leaves idle, less a headroom, within [floor, ceiling]; the default
/// when the online job's solo activity was never measured.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Percent;

    fn policy() -> Policy {
        Policy::default() // floor 10, ceiling 80, headroom 10, default 30, reserve 2048
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
    fn an_idle_gpu_ignores_the_figures_of_an_online_job_that_left() {
        let p = policy();
        let left_behind = GpuFacts {
            online_solo_sm_pct: Some(70),
            online_mem_mib: Some(40_000),
            mem_total_mib: Some(81_559),
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
}
