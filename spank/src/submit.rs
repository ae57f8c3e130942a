//! Allocator (sbatch, salloc) and local (srun) contexts, run as the user.
//!
//! This is where bad input is caught: a failure here stops the submission
//! with a message and nothing reaches a node.

use muxflow::Mode;
use slurm_spank::SpankHandle;

use crate::settings::{self, SettingsError};
use crate::OPTION;

/// Variable exported to job_submit.lua (`job_desc.spank_job_env`), the
/// Prolog/Epilog (`SPANK_MUXFLOW_MODE`) and the job (`SLURM_SPANK_MUXFLOW_MODE`);
/// the remote context sets it again in each step for the step's tasks.
pub const MODE_VAR: &str = muxflow::mode::ENV_VAR;

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("muxflow: {0}")]
    Mode(#[from] muxflow::mode::ParseModeError),
    #[error("muxflow is misconfigured on this cluster, so --muxflow cannot be used until an administrator fixes it: {0}")]
    Settings(#[from] SettingsError),
    #[error("muxflow: cannot export {MODE_VAR} to the job: {0}")]
    Export(String),
}

pub fn init_post_opt(spank: &mut SpankHandle) -> Result<(), SubmitError> {
    let value = match spank.get_option_value(OPTION) {
        Ok(Some(v)) => v.into_owned(),
        // Not a muxflow job: the plugin stays out of the way.
        Ok(None) => return Ok(()),
        Err(e) => return Err(SubmitError::Export(e.to_string())),
    };
    let mode: Mode = value.parse()?;
    settings::load(spank)?;
    spank
        .job_control_setenv(MODE_VAR, mode.as_str(), true)
        .map_err(|e| SubmitError::Export(e.to_string()))?;
    Ok(())
}
