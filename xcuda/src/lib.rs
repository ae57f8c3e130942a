//! xCUDA: the LD_PRELOAD shim loaded into every offline process. It protects
//! the online job on the same GPU at the workload level:
//!
//! * **memory cap** ([`mod@state::memcap`]): allocations beyond the job's quota fail with
//!   `CUDA_ERROR_OUT_OF_MEMORY`; frees give quota back; `cuMemGetInfo` shows the cap;
//! * **launch gate** ([`mod@state::gate`], [`state::controller`], [`lifecycle::watcher`]): kernel and graph
//!   launches are delayed while the GPU is contended and blocked while the
//!   GPU's health state pauses offline work;
//! * **graceful exit** ([`lifecycle::shutdown`]): on SIGINT/SIGTERM the
//!   application's own handler runs at once, with its GPU (to checkpoint);
//!   the contexts are synchronized and released at the earliest of the
//!   process exiting, a default-action exit and a deadline safely before
//!   Slurm's SIGKILL;
//! * **stats** ([`state::stats`]): counters in `<stats dir>/xcuda.<pid>`.
//!
//! Programs reach the driver three ways and all three land on the same
//! wrappers ([`interpose::hooks`]): the exported `cu*` symbols, `dlsym` and `dlvsym`
//! (hooked, see [`interpose::dlsym`]) and `cuGetProcAddress(_v2)` (answered with the wrapper of the
//! exact variant the driver picked). Nothing runs before `main`: settings are
//! read and threads started at the first `cuInit`.

#![deny(clippy::undocumented_unsafe_blocks)]

// Layers, each using only those above it in this list: the ABI (the one
// entry-point list), sys (the real driver and C library), state (counters,
// quota, gate), lifecycle (start-up, watcher, fork, signals, exit),
// interpose (what the application's calls land on).
/// The driver ABI, declared once in its own crate.
pub use cuda_abi as abi;
pub mod interpose;
pub mod lifecycle;
pub mod state;
pub mod sys;

pub use abi::cu;

/// CUresult as it crosses the ABI: a raw code, so codes a newer driver adds
/// pass through untouched.
pub type CUresult = u32;

/// One line on stderr, prefixed so users know who speaks.
pub(crate) fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("muxflow-xcuda: {msg}");
}
