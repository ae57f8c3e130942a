//! muxflow: MuxFlow-style GPU sharing for Slurm.
//!
//! This crate is the logic that two or more of muxflow's process contexts
//! share: the SPANK plugin (`spank/`), the xCUDA shim (`xcuda/`), the node
//! programs (`node/`), the matcher daemon (`matcher/`) and the replay
//! (`sim/`). It exports no FFI and needs no Slurm headers: what reads them
//! is `muxflow-slurm` (`slurm/`).

pub mod config;
pub mod man;
pub mod mode;
pub mod node;
pub mod policy;
pub mod records;
#[doc(hidden)]
pub mod test_support;
pub mod text;

pub use config::Config;
pub use mode::Mode;
