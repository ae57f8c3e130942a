//! muxflow's side of Slurm: the release this build targets, read from the
//! installed headers by `build.rs` ([`version`]), and the one client of
//! Slurm's commands ([`cli`]).
//!
//! Only the contexts that talk to Slurm depend on it: the plugin, the node
//! programs and the matcher. The core (`muxflow`), xCUDA, the replay and the
//! fuzz targets build without Slurm's headers.

pub mod cli;
pub mod version;
