//! The compact `key=value key=value` text form muxflow writes into Slurm
//! fields (AdminComment, node Extra) and small state files.
//!
//! Keys are `[a-z0-9_.]+`; values are non-empty and contain no whitespace,
//! `=` or `;` (Slurm fields are single-line and `;`-sensitive in places).

use std::collections::BTreeMap;
use std::fmt::Display;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("'{0}' is not key=value")]
    NotKeyValue(String),
    #[error("bad key '{0}': keys are lower-case letters, digits, '_' and '.'")]
    BadKey(String),
    #[error("key '{0}' appears twice")]
    Duplicate(String),
    #[error("value of '{key}' is not valid: '{value}' ({why})")]
    BadValue {
        key: String,
        value: String,
        why: String,
    },
    #[error("missing key '{0}'")]
    Missing(String),
    #[error("expected the prefix '{0}'")]
    Prefix(String),
}

pub fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.')
}

pub fn valid_value(v: &str) -> bool {
    !v.is_empty()
        && !v
            .chars()
            .any(|c| c.is_whitespace() || c == '=' || c == ';' || c.is_control())
}

/// Parses `key=value` words into an ordered map.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, KvError> {
    let mut map = BTreeMap::new();
    for word in text.split_whitespace() {
        let (k, v) = word
            .split_once('=')
            .ok_or_else(|| KvError::NotKeyValue(word.into()))?;
        if !valid_key(k) {
            return Err(KvError::BadKey(k.into()));
        }
        if !valid_value(v) {
            return Err(KvError::BadValue {
                key: k.into(),
                value: v.into(),
                why: "empty or forbidden character".into(),
            });
        }
        if map.insert(k.to_string(), v.to_string()).is_some() {
            return Err(KvError::Duplicate(k.into()));
        }
    }
    Ok(map)
}

/// Builds `key=value` text; keys and values are checked by `push`.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    out: String,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts with a bare word (e.g. a version tag like `muxflow:v1`).
    pub fn tag(mut self, tag: &str) -> Self {
        self.sep();
        self.out.push_str(tag);
        self
    }

    pub fn push(&mut self, key: &str, value: impl Display) -> &mut Self {
        let value = value.to_string();
        debug_assert!(valid_key(key), "{key}");
        if valid_value(&value) {
            self.sep();
            self.out.push_str(key);
            self.out.push('=');
            self.out.push_str(&value);
        }
        self
    }

    pub fn push_opt(&mut self, key: &str, value: Option<impl Display>) -> &mut Self {
        if let Some(v) = value {
            self.push(key, v);
        }
        self
    }

    fn sep(&mut self) {
        if !self.out.is_empty() {
            self.out.push(' ');
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Typed access to a parsed map, with errors naming the key.
pub struct Fields<'a>(pub &'a BTreeMap<String, String>);

impl Fields<'_> {
    pub fn get<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, KvError>
    where
        T::Err: Display,
    {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|e: T::Err| KvError::BadValue {
                key: key.into(),
                value: v.clone(),
                why: e.to_string(),
            }),
        }
    }

    pub fn require<T: std::str::FromStr>(&self, key: &str) -> Result<T, KvError>
    where
        T::Err: Display,
    {
        self.get(key)?.ok_or_else(|| KvError::Missing(key.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut w = Writer::new().tag("muxflow:v1");
        w.push("a", 1)
            .push("b.c", "x")
            .push_opt("d", None::<u8>)
            .push("bad", "two words");
        let text = w.finish();
        assert_eq!(text, "muxflow:v1 a=1 b.c=x");
        let m = parse(text.strip_prefix("muxflow:v1").unwrap()).unwrap();
        assert_eq!(Fields(&m).require::<u32>("a").unwrap(), 1);
        assert_eq!(Fields(&m).get::<u32>("zz").unwrap(), None);
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(parse("a=1 a=2"), Err(KvError::Duplicate("a".into())));
        assert_eq!(parse("A=1"), Err(KvError::BadKey("A".into())));
        assert_eq!(parse("x"), Err(KvError::NotKeyValue("x".into())));
        assert!(matches!(parse("a="), Err(KvError::BadValue { .. })));
        let m = parse("n=abc").unwrap();
        let e = Fields(&m).require::<u32>("n").unwrap_err().to_string();
        assert!(e.contains("'n'") && e.contains("abc"), "{e}");
        assert_eq!(
            Fields(&m).require::<u32>("q"),
            Err(KvError::Missing("q".into()))
        );
    }
}
