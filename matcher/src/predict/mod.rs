//! Predicts an offline job's normalized throughput next to an online job
//! (its speed there ÷ its speed with an idle partner), with a confidence,
//! from what the cluster records: the AdminComment of earlier shared runs.
//!
//! The fact that shapes it: under muxflow an offline job never runs alone
//! and nothing profiles it, so its solo speed is never observed. It is
//! estimated, per job, from its shared runs across partners and across the
//! online load's swings; what two jobs cost each other depends on the pair,
//! so the pair (offline job × online service) is what is modelled.
//!
//! # What a run gives ([`estimate`])
//!
//! * Progress: the job's own `claim.steps_per_s` where its workload reports
//!   it, else xCUDA's `claim.launches` over the node's `run_s` (launches/s,
//!   which every CUDA process has). One signal per job (steps when any of
//!   its runs has them), so a job is only compared with itself: the units
//!   cancel in the ratio.
//! * The partner: the online job (`partner`, a job id) resolved to its
//!   (user, name) from the same sacct listing ([`runs_from_sacct`]).
//! * The partner's load: `partner_load_pct` when the record has it (a node
//!   measurement), else taken as 1 (the pair at whatever load it ran).
//! * A k-GPU job's run counts only when all its GPUs had the same partner
//!   (or none): beside different online jobs it ran at its slowest GPU's
//!   pace, and the record cannot say which partner set it.
//! * Memory: the node-measured `measured_peak_mib` ([`trusted_peak_mib`]);
//!   a run that failed at once for memory (`claim.oom` > 0 and no progress)
//!   marks the pair as one that cannot co-locate: it is excluded from the
//!   candidates, not predicted slow.
//!
//! Solo speed `σ` and pair slowdowns `d` fit `progress = σ · (1 − load · d)`
//! by alternating least squares over the job's runs (a run next to a
//! near-idle partner is close to solo); runs with no partner (an idle GPU)
//! give `σ` directly. The pair's normalized throughput is `x = 1 − d`: its
//! speed next to that partner at full load. Without load figures `σ` is
//! the job's best run (the envelope) and `x` the pair's mean ratio to it.
//!
//! # Model ([`Model::train`])
//!
//! Gavel's estimator completes a job × job throughput matrix from a fraction
//! of profiled pairs; here the rows are offline jobs (user, name) and the
//! columns online jobs, and the matrix is completed with side features:
//! `x ≈ base(share, mem) + b_job + c_partner + u_job · v_partner`, where
//! `base` is a ridge regression on `[1, share, share², mem, share·mem]`
//! (`share`: the SM share the policy gives next to that online job; `mem`:
//! the job's peak over the room the online job leaves), and the biases and
//! the rank-1 factors are fitted by alternating ridge on the residuals.
//! A pair seen `n` times is predicted as `(n·x + completion) / (n + 1)`.
//!
//! # Confidence and exploration
//!
//! Each prediction carries a standard deviation that widens with what is
//! unknown: a pair seen (shrinks with its runs) < both sides seen, pair not
//! < one side seen < neither (side features only) < no history at all (the
//! default, [`DEFAULT_SD`]). The matcher maximizes `mean + min(EXPLORE_SD ×
//! sd, EXPLORE_MAX)`: an untried pair gets at most [`EXPLORE_MAX`] of
//! optimism, so a well-known pair at 0.70 still beats a new one predicted
//! 0.62 ± 0.20 (0.67), and loses to one predicted 0.68 ± 0.20 (0.73).
//!
//! # Trust
//!
//! Peaks and failures for memory use what the node measured or decided.
//! Progress is the job's own claim, bounded by the report codec: a user who
//! writes false steps or launches skews the predictions of their own job
//! only (its σ and its pairs), never another job's row; partners' columns
//! pool many jobs, each weighted by its runs.
//!
//! # Default
//!
//! With no usable history: a job needs half of the SMs and runs at
//! `min(1, share / 0.5)` of its speed alone ([`default_prediction`]).

mod estimation;
mod evaluation;
mod model;
mod runs;
mod scoring;
#[cfg(test)]
mod tests;

pub use estimation::*;
pub use evaluation::*;
pub use model::*;
pub use runs::*;
pub use scoring::*;

use std::collections::{BTreeMap, BTreeSet};

use muxflow::config::Policy;
use muxflow::policy::share::{offline_mem_cap_mib, offline_part, offline_sm_budget};
use muxflow::records::published::GpuPublished;
use muxflow::records::report::JobReport;
use muxflow::Mode;
use nalgebra::{SMatrix, SVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::reader::{GpuState, SacctJob};

/// SM demand assumed when nothing is known.
pub const DEFAULT_DEMAND: f64 = 0.5;
/// Memory feature when the job has no recorded peak.
pub const DEFAULT_MEM: f64 = 0.5;
/// Fewer pair estimates than this: the side-feature regression is a
/// constant (their mean).
pub const MIN_PAIRS: usize = 8;
/// Standard deviation of the default prediction.
pub const DEFAULT_SD: f64 = 0.30;
/// Exploration: the matcher adds `EXPLORE_SD × sd`, at most `EXPLORE_MAX`.
pub const EXPLORE_SD: f64 = 0.25;
pub const EXPLORE_MAX: f64 = 0.05;
const RIDGE: f64 = 1e-3;
const FEATURES: usize = 7;
/// The first `BASE_FEATURES` features are share and memory; the rest use
/// the job's launch rate, kept only where it lowers the cross-validated
/// error ([`choose_features`]).
const BASE_FEATURES: usize = 5;
/// Launch-rate feature when the job's is unknown: the middle of its scale.
pub const DEFAULT_RATE: f64 = 0.5;
/// Regularization of the biases and factors (in run-weights) tried; the
/// one with the least cross-validated error on the training pairs wins, so
/// no table's scale is built in.
const LAMBDAS: [f64; 6] = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0];
const FOLDS: usize = 4;
const ALS_ROUNDS: usize = 60;
/// A pair's own estimate weighs as this many completions less than its runs.
const PAIR_PRIOR: f64 = 1.0;

/// Identifies "the same job" across runs: (user, job name).
pub type JobKey = (String, String);
