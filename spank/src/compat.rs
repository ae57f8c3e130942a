//! The plugin's one module of Slurm-release shims: what differs between the
//! releases muxflow builds for (22.05, 24.11, 26.05), chosen by the `cfg`s
//! the build script derives from the headers' version (`build.rs`'s
//! `FEATURES`). Nothing else in the plugin names a release.

/// Slurm 25.05 and later read this symbol once per plugin: a failure of the
/// plugin's callbacks in slurmstepd then fails the job (ESPANK_JOB_FAILURE)
/// instead of draining the node (the default, ESPANK_NODE_FAILURE). muxflow's
/// rule is never to drain a node for its own failure.
#[cfg(slurm_init_failure_mode)]
#[no_mangle]
#[used]
pub static slurm_spank_init_failure_mode: libc::c_int = muxflow_slurm::version::ESPANK_JOB_FAILURE;

/// Whether `init` in slurmstepd may fail back to Slurm: only where the
/// symbol above makes that fail the job. Before 25.05 a failure there drains
/// the node, so that path logs and carries on, and an offline step that
/// cannot be protected is refused in `task_init` instead. (`init_post_opt`
/// failing drains the node on every release, checked on 26.05: it never
/// fails.)
pub const REMOTE_FAILS_JOB: bool = muxflow_slurm::version::INIT_FAILURE_MODE;
