//! muxflow: MuxFlow-style GPU sharing for Slurm.
//!
//! This crate is the logic that two or more of muxflow's process contexts
//! share: the SPANK plugin (`spank/`), the xCUDA shim (`xcuda/`), the node
//! programs (`prolog/`) and the matcher daemon (`matcher/`). It exports no FFI.

pub mod config;
pub mod dmem;
pub mod health;
pub mod jobproc;
pub mod kv;
pub mod limits;
pub mod metrics;
pub mod mode;
pub mod mps;
pub mod node_state;
pub mod offline_procs;
pub mod online_page;
pub mod placement;
pub mod policy;
pub mod preempt;
pub mod process;
pub mod published;
pub mod report;
pub mod slurm_cli;
pub mod slurm_conf;
pub mod slurm_version;
pub mod sm_page;
pub mod sm_partition;
#[doc(hidden)]
pub mod test_support;
pub mod text;
pub mod user_tree;
pub mod xcuda_env;

pub use config::Config;
pub use mode::Mode;
