//! Simulated GPU at the driver ABI — a *model*, not a measurement of a real GPU.
//!
//! This rlib holds everything the fake driver libraries (`fakecuda/`,
//! `fakenvml/`), `simgpu-ctl`, the fake `nvidia-cuda-mps-control` and
//! `muxflow-workload` share: the state-directory layout and how it is found,
//! the per-GPU shared table (mmap + flock), the contention model, telemetry
//! and fault injection. It exports no `cu*`/`nvml*` symbols: those live in the
//! cdylibs so that binaries linking this crate never pose as a driver.
//! See `simgpu/README.md` for the model's formulas.

/// The CUDA driver ABI, declared once (entry points, their function types,
/// structures, result codes), as the shim declares it.
pub use cuda_abi as abi;
pub mod codes;
pub mod config;
/// The frameworks' way of loading the driver (dlopen + cuGetProcAddress).
pub use cuda_abi::load as cudaload;
pub mod dmem;
pub mod faults;
pub mod model;
pub mod mps;
pub mod shared;
pub mod state;
pub mod telemetry;
pub mod testing;
pub mod visible;

pub use config::GpuConfig;
pub use shared::{now_ns, SharedGpu};
pub use state::{SimDir, StateError};
