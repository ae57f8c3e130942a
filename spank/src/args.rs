//! plugstack.conf arguments: `key=value` words after the plugin path.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default).

use std::path::PathBuf;

use muxflow::config::DEFAULT_PATH;
use muxflow::text::shorten;

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

    /// The plugin's man page, as text: fonts and roff escapes removed,
    /// whitespace collapsed.
    fn man_page_text() -> String {
        let page = include_str!("../../etc/man/spank-muxflow.8");
        let text: String = page
            .lines()
            .filter(|l| !l.starts_with(".\\\"") && !l.starts_with(".TH"))
            .map(|l| {
                let l = l.strip_prefix(".B ").or(l.strip_prefix(".I ")).unwrap_or(l);
                if l.starts_with('.') {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let text = ["\\fB", "\\fI", "\\fR", "\\fP", "\\&"]
            .iter()
            .fold(text, |t, f| t.replace(f, ""))
            .replace("\\-", "-")
            .replace("\\(aq", "'");
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_man_page_names_every_key_and_the_options_help() {
        let page = man_page_text();
        for (key, what) in ARGS {
            assert!(
                page.contains(&format!("{key}=")),
                "etc/man/spank-muxflow.8 does not document the plugstack key '{key}': add it"
            );
            assert!(
                page.contains(what),
                "etc/man/spank-muxflow.8 does not say what '{key}' does as args.rs does: '{what}'"
            );
        }
        assert!(
            page.contains(&format!("--{}=", crate::OPTION)),
            "the man page does not name --{}",
            crate::OPTION
        );
        assert!(
            page.contains(crate::OPTION_USAGE),
            "etc/man/spank-muxflow.8 does not carry the option's help text '{}'",
            crate::OPTION_USAGE
        );
    }

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
