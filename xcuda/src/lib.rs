//! xCUDA: the LD_PRELOAD shim loaded into every offline process. It protects
//! the online job on the same GPU at the workload level:
//!
//! * **memory cap** ([`memcap`]): allocations beyond the job's quota fail with
//!   `CUDA_ERROR_OUT_OF_MEMORY`; frees give quota back; `cuMemGetInfo` shows the cap;
//! * **launch gate** ([`gate`], [`controller`], [`watcher`]): kernel and graph
//!   launches are delayed while the GPU is contended and blocked while the
//!   GPU's health state pauses offline work;
//! * **graceful exit** ([`shutdown`]): on SIGINT/SIGTERM the gate closes,
//!   in-flight work is synchronized, the contexts are released, then the
//!   application's own handler (or the default action) runs;
//! * **stats** ([`stats`]): counters in `<stats dir>/xcuda.<pid>`.
//!
//! Programs reach the driver three ways and all three land on the same
//! wrappers ([`hooks`]): the exported `cu*` symbols, `dlsym` and `dlvsym`
//! (hooked, see [`driver`]) and `cuGetProcAddress(_v2)` (answered with the wrapper of the
//! exact variant the driver picked). Nothing runs before `main`: settings are
//! read and threads started at the first `cuInit`.

pub mod abi;
pub mod controller;
pub mod driver;
pub mod elf;
pub mod gate;
pub mod hooks;
pub mod memcap;
pub mod runtime;
pub mod shutdown;
pub mod stats;
pub mod watcher;

/// CUresult as it crosses the ABI: a raw code, so codes a newer driver adds
/// pass through untouched.
pub type CUresult = u32;

/// The CUresult codes xCUDA itself produces.
pub mod cu {
    pub const SUCCESS: u32 = 0;
    pub const OUT_OF_MEMORY: u32 = 2;
    /// Returned to launches once the graceful exit has released the contexts.
    pub const DEINITIALIZED: u32 = 4;
    pub const NOT_FOUND: u32 = 500;
    pub const UNKNOWN: u32 = 999;
}

/// One line on stderr, prefixed so users know who speaks.
pub(crate) fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("muxflow-xcuda: {msg}");
}
