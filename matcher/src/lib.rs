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
