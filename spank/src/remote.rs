//! Remote context: slurmstepd, once per job step.
//!
//! Nothing here may fail back to Slurm from `init`/`init_post_opt`: a failure
//! there drains the node. Problems are logged to the slurmd log instead.

use muxflow::slurm_version::{SLURM_EXTERN_CONT, SLURM_INTERACTIVE_STEP};
use muxflow::Mode;
use slurm_spank::SpankHandle;

use crate::OPTION;

/// The step's mode, exported to its tasks as `MUXFLOW_MODE`.
pub const MODE_VAR: &str = "MUXFLOW_MODE";

#[derive(Default)]
pub struct RemoteState {
    pub mode: Option<Mode>,
}

impl RemoteState {
    pub fn init_post_opt(&mut self, spank: &mut SpankHandle) {
        match spank.job_stepid() {
            Ok(SLURM_EXTERN_CONT) | Ok(SLURM_INTERACTIVE_STEP) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::error!("muxflow: cannot read the step id, leaving the step alone: {e}");
                return;
            }
        }
        let value = match spank.get_option_value(OPTION) {
            Ok(Some(v)) => v.into_owned(),
            Ok(None) => return,
            Err(e) => {
                tracing::error!("muxflow: cannot read --{OPTION}: {e}");
                return;
            }
        };
        // Validated at submit; a value that still fails here was forged in
        // the environment, and the step runs without muxflow.
        let mode = match value.parse::<Mode>() {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("{e}; step runs without muxflow");
                return;
            }
        };
        self.mode = Some(mode);
        if let Err(e) = spank.setenv(MODE_VAR, mode.as_str(), true) {
            tracing::error!("muxflow: cannot set {MODE_VAR}: {e}");
        }
    }
}
