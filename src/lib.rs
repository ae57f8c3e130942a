//! muxflow: MuxFlow-style GPU sharing for Slurm.
//!
//! This crate is the logic that two or more of muxflow's process contexts
//! share: the SPANK plugin (`spank/`), the xCUDA shim (`xcuda/`), the node
//! programs (`prolog/`) and the matcher daemon (`matcher/`). It exports no FFI.

pub mod config;
pub mod mode;
pub mod slurm_version;

pub use config::Config;
pub use mode::Mode;
