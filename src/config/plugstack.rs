//! plugstack.conf arguments: `key=value` words after the plugin path.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default).
//! The SPANK plugin's (`spank/src/settings.rs`); here, in the core, so that
//! the fuzz target and the man page's test read the same parser.

use std::path::PathBuf;

use crate::config::DEFAULT_PATH;
use crate::text::shorten;

/// Every key the plugin accepts, with what it sets: the one list parsing,
/// error messages and the man page (`etc/man/spank-muxflow.8`, checked by
/// a test below) follow. A key missing here is rejected whatever `parse`
/// would do with it.
pub const ARGS: &[(&str, &str)] = &[(
    "config",
    "The muxflow config file, an absolute path (default /etc/slurm/muxflow.toml).",
)];

/// Keys the plugin accepts, for messages.
pub const KEYS: &str = "config";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginArgs {
    /// The muxflow config file.
    pub config: PathBuf,
}

impl Default for PluginArgs {
    fn default() -> Self {
        PluginArgs {
            config: PathBuf::from(DEFAULT_PATH),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("plugstack.conf: muxflow argument '{0}' is not key=value (accepted keys: {KEYS}; e.g. config=/etc/slurm/muxflow.toml)")]
    NotKeyValue(String),
    #[error("plugstack.conf: unknown muxflow argument key '{0}' (accepted keys: {KEYS}); fix the muxflow line in plugstack.conf")]
    UnknownKey(String),
    #[error("plugstack.conf: muxflow argument '{key}' given twice; keep one")]
    Duplicate { key: String },
    #[error("plugstack.conf: muxflow argument config='{0}' must be an absolute path")]
    RelativeConfig(String),
}

impl PluginArgs {
    pub fn parse<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<Self, ArgsError> {
        let mut args = PluginArgs::default();
        let mut seen_config = false;
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| ArgsError::NotKeyValue(shorten(word)))?;
            if !ARGS.iter().any(|(k, _)| *k == key) {
                return Err(ArgsError::UnknownKey(shorten(key)));
            }
            match key {
                "config" => {
                    if seen_config {
                        return Err(ArgsError::Duplicate { key: key.into() });
                    }
                    seen_config = true;
                    if !value.starts_with('/') {
                        return Err(ArgsError::RelativeConfig(shorten(value)));
                    }
                    args.config = PathBuf::from(value);
                }
                other => return Err(ArgsError::UnknownKey(shorten(other))),
            }
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_messages_follow_the_table() {
        let listed: Vec<&str> = ARGS.iter().map(|(k, _)| *k).collect();
        assert_eq!(KEYS, listed.join(", "));
        for (key, _) in ARGS {
            assert!(PluginArgs::parse([format!("{key}=/x").as_str()]).is_ok());
        }
    }

    #[test]
    fn defaults_without_args() {
        assert_eq!(
            PluginArgs::parse([]).unwrap().config,
            PathBuf::from(DEFAULT_PATH)
        );
    }

    #[test]
    fn config_key() {
        let a = PluginArgs::parse(["config=/opt/mf.toml"]).unwrap();
        assert_eq!(a.config, PathBuf::from("/opt/mf.toml"));
    }

    #[test]
    fn errors_name_the_input() {
        assert_eq!(
            PluginArgs::parse(["confg=/x"]),
            Err(ArgsError::UnknownKey("confg".into()))
        );
        assert!(PluginArgs::parse(["confg=/x"])
            .unwrap_err()
            .to_string()
            .contains("'confg'"));
        assert_eq!(
            PluginArgs::parse(["config"]),
            Err(ArgsError::NotKeyValue("config".into()))
        );
        assert_eq!(
            PluginArgs::parse(["config=rel.toml"]),
            Err(ArgsError::RelativeConfig("rel.toml".into()))
        );
        assert!(matches!(
            PluginArgs::parse(["config=/a", "config=/b"]),
            Err(ArgsError::Duplicate { .. })
        ));
    }
}
