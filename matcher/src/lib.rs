//! muxflow's matcher core: pairs pending offline jobs with GPUs that run
//! online jobs, maximizing predicted offline throughput.
//!
//! * [`weights`]: predicted throughputs → integer weights (exactness is on
//!   integers).
//! * [`prune`]: each job's best `k` candidate GPUs (`matcher.candidates_per_job`).
//! * [`solver`]: exact sparse maximum-weight matching with an LP-dual
//!   certificate.
//! * [`reference`]: dense Kuhn–Munkres, brute force and greedy, for checks.
//! * [`synth`]: deterministic synthetic clusters; [`bench`]: the `bench`
//!   subcommand.
//!
//! Nothing here knows about Slurm: callers give job and GPU indices and
//! weights.
//!
//! ```text
//! let edges = prune_scored(jobs, gpus, k, threads, |j, g| predictor(j, g).and_then(weights::quantize));
//! let matching = solve(jobs, gpus, &edges)?;   // exact on the integer weights
//! ```
//!
//! Bench: `muxflow-matcher bench --gpus 18000 --jobs 10000 [--seed S]
//! [--weights structured|uniform] [--dense auto|always|never]
//! [--candidates-per-job K] [--threads T]`.
//!
//! Known limit of the pruning rule (not of the solver): when every job ranks
//! GPUs alike (weights shaped job factor × GPU factor), each job's best `k`
//! are the same few GPUs, so the exact optimum of the pruned graph places few
//! jobs. The bench prints an upper bound for the unpruned graph to show what
//! pruning costs.

pub mod bench;
pub mod prune;
pub mod reference;
pub mod solver;
pub mod synth;
pub mod weights;

pub use prune::{prune_candidates, prune_scored};
pub use solver::{
    solve, solve_with, verify_certificate, Duals, Edge, InputError, Matching, Solution,
    SolveOptions, SolveStats,
};
