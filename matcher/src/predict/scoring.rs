//! What the round hands the model for one (job, GPU) pair: the job's and the
//! GPU's terms, the SM share and memory room the policy gives there, and
//! where the job would sit ([`Seat`]).

use super::*;

/// Where a job sits on a GPU: it holds `slots` of the GPU's
/// `[policy] offline_per_gpu` offline slots — its part of the GPU's
/// offline SMs and memory, [`muxflow::policy::share::offline_part`] — and is one of
/// `offline_jobs` offline jobs there (those running and it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat {
    pub slots: u32,
    pub offline_jobs: u32,
}

/// Per-job inputs of [`Model::predict_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobTerms {
    pub(super) index: Option<u32>,
    pub peak_mib: Option<u64>,
    /// [`rate_feature`] of the job's launch rate.
    pub rate: f64,
    /// [`Profile::beside_offline`], [`Profile::beside_offline_fail`].
    pub beside_offline: Option<(f64, u32)>,
    pub beside_offline_fail: f64,
}

/// Per-GPU inputs of [`Model::predict_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTerms {
    /// The job's SM share there (its part of the budget).
    pub share: f64,
    pub room_mib: u64,
    pub(super) partner: Option<u32>,
    /// Offline jobs already there (it would be one of `others + 1`).
    pub others: u32,
    /// The GPU's whole offline SM share.
    pub budget: f64,
}

impl GpuTerms {
    /// Appends every field ([`crate::round::Predictor::column_key`]):
    /// [`Model::predict_terms`] reads nothing else of the GPU.
    pub fn key_words(&self, key: &mut Vec<u64>) {
        key.extend([
            self.share.to_bits(),
            self.room_mib,
            self.partner.map_or(u64::MAX, u64::from),
            u64::from(self.others),
            self.budget.to_bits(),
        ]);
    }
}

/// The SM budget muxflow's policy gives the offline jobs of this GPU
/// (fraction): [`offline_sm_budget`] of what the node published.
pub fn sm_share(gpu: &GpuPublished, p: &Policy) -> f64 {
    f64::from(offline_sm_budget(p, &gpu.facts())) / 100.0
}

/// The SM share of a job holding `slots` of the GPU's offline slots: its part
/// ([`offline_part`]) of [`offline_sm_budget`], `slots` of `[policy]
/// offline_per_gpu`.
pub fn sm_share_of(gpu: &GpuPublished, p: &Policy, slots: u32) -> f64 {
    let budget = u64::from(offline_sm_budget(p, &gpu.facts()));
    offline_part(budget, slots, u32::from(p.offline_per_gpu)) as f64 / 100.0
}

/// GPU memory the offline jobs may use there together: [`offline_mem_cap_mib`].
pub fn memory_room_mib(gpu: &GpuState, p: &Policy) -> u64 {
    offline_mem_cap_mib(p, &gpu.published.facts()).unwrap_or(0)
}
