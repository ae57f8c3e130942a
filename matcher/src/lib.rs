//! muxflow's matcher: pairs pending offline jobs with GPUs that run online
//! jobs, maximizing predicted offline throughput, and steers Slurm there.
//!
//! One round: [`slurm`] reads the cluster ([`reader`]: typed Slurm 22.05
//! JSON → [`reader::ClusterState`]) and the offline history; [`predict`]
//! scores each (job, GPU) candidate; [`round::plan`] prunes, solves and
//! diffs the hints ([`hints`]); [`slurm::SlurmCli::scontrol`] applies them.
//! The decision table and `--json` formats are documented in [`round`].
//!
//! * [`weights`]: predicted throughputs → integer weights (exactness is on
//!   integers).
//! * [`prune`]: the candidate graph (`matcher.candidates_per_job`): each
//!   job's best `k` GPUs ∪ capacity-spread lists.
//! * [`solver`]: exact sparse maximum-weight matching with an LP-dual
//!   certificate, cold or from a warm start.
//! * [`exact`]: pricing out the pairs pruning left out, exact on every
//!   feasible pair; incremental rounds from a cache. The round
//!   ([`round::plan`]) prices its 1-GPU matching out within
//!   `matcher.pricing_budget_ms` and says whether it got there (issue 19:
//!   9–12 s wall, about 11 CPU s, at 18,000 × 10,000 on a shared 2-core
//!   machine; the goal is 1 s); the bench times it alone.
//! * [`round_cache`]: what a round keeps for the next (the daemon's loop
//!   and the replay: [`round::plan_cached`]): incremental rounds after a
//!   small change, cold after a large one, the last plan when nothing
//!   changed, with the cold round's certificate rule.
//! * [`gang`]: k-GPU offline jobs on one node (issue 15), placed by a
//!   documented greedy before the exact matching of the 1-GPU jobs.
//! * [`mod@reference`]: dense Kuhn–Munkres, brute force and greedy, for checks.
//! * [`synth`]: deterministic synthetic clusters; [`mod@bench`]: the `bench`
//!   subcommand.
//!
//! The matching core (weights, prune, solver) knows nothing about Slurm:
//! callers give job and GPU indices and weights.
//!
//! ```text
//! let edges = spread_scored(jobs, gpus, k, threads, |j, g| predictor(j, g).and_then(weights::quantize));
//! let exact = solve_exact(&FnScores { jobs, gpus, score }, &edges, &opts)?;  // exact on every pair
//! ```
//!
//! Bench: `muxflow-matcher-bench --gpus 18000 --jobs 10000 [--seed S]
//! [--weights structured|uniform] [--dense auto|always|never]
//! [--candidates-per-job K] [--threads T] [--export FILE]`.
//!
//! Pruning to each job's best `k` alone placed few jobs when every job ranks
//! GPUs alike (weights shaped job factor × GPU factor); the capacity-spread
//! lists fix that (see [`prune`]). Pricing ([`exact`]) closes the rest of
//! the gap to the unpruned optimum (about 0.6% on the bench).

#[cfg(feature = "bench")]
pub mod bench;
pub mod exact;
pub mod failed;
pub mod gang;
pub mod hints;
pub mod history;
pub mod metrics;
pub mod predict;
pub mod prune;
pub mod reader;
#[cfg(any(test, feature = "bench"))]
pub mod reference;
pub mod round;
pub mod round_cache;
pub mod service;
pub mod shape;
pub mod slots;
#[cfg(feature = "slurm")]
pub mod slurm;
pub mod solver;
#[cfg(any(test, feature = "bench"))]
pub mod synth;
pub mod weights;
pub(crate) mod workers;

pub use prune::{prune_candidates, prune_scored, spread_scored};
pub use solver::{
    solve, solve_warm_sorted, solve_with, verify_certificate, Duals, Edge, InputError, Matching,
    Solution, SolveOptions, SolveStats, Start,
};
