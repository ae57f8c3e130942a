//! The admin's settings: plugstack arguments plus the config file they name.

use muxflow::config::{Config, ConfigError};
use slurm_spank::SpankHandle;

use muxflow::config::plugstack::{ArgsError, PluginArgs};

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read the plugstack.conf arguments of muxflow: {0}")]
    Spank(String),
}

/// Reads plugstack.conf's arguments and the config they point at.
pub fn load(spank: &SpankHandle) -> Result<(PluginArgs, Config), SettingsError> {
    let words = spank
        .plugin_argv()
        .map_err(|e| SettingsError::Spank(e.to_string()))?;
    let args = PluginArgs::parse(words)?;
    let config = Config::load(&args.config)?;
    Ok((args, config))
}
