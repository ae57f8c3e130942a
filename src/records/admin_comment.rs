//! The AdminComment protocol: muxflow's record of a job inside Slurm, which
//! only root, SlurmUser and Slurm admins can write (slurmctld refuses a
//! user's `scontrol update AdminComment=`), so nothing in it is the user's.
//!
//! This module owns the protocol: the tag, every key, the one parse of a
//! job's text ([`AdminComment::parse`]) and the start every offline writer
//! shares ([`offline_record`]). Each writer has one encoder:
//!
//! | writer (context) | when | encoder | text |
//! |---|---|---|---|
//! | `etc/job_submit.lua` (slurmctld) | submit | Lua, keys checked against [`LUA_CONSTANTS`] by a test | `muxflow:v1 mode=offline [gpus=k] [placed=any]`, `muxflow:v1 mode=online` |
//! | muxflow-matcher | a placement | [`Placement::admin_comment`] | `… placed=node3:g1` (a gang: `gpus=2 placed=node3:g0,g1`) [`runs_before=1 run1.…`] |
//! | muxflow-matcher | a parked job | [`Waiting::admin_comment`] | `… waiting=free_gpu since=… rounds_every=60s` |
//! | Prolog (root) | a refusal | [`crate::records::placement::refused_admin_comment`] | `… refused=gpu_faulty refusals=1` |
//! | slurmstepd (root, the plugin) | the batch step's end | [`JobReport::encode`] | the job's figures ([`crate::records::report`]) |
//! | slurmstepd (root, the plugin) | a node whose config is unreadable | [`node_config_failed`] | the text so far plus `failed=node_config` |
//!
//! Every text of an offline job keeps its `gpus=` and `refusals=`, and
//! after a requeue its earlier runs (`runs_before=`, `run<n>.*`:
//! [`crate::records::runs`], written last); readers
//! ignore keys they do not know, so newer writers stay readable. Readers:
//! the Prolog (the placement), the matcher's cluster reader (mode, GPU
//! count, why it waits, refusals: one parse per job), the plugin (refusals),
//! the predictor and `muxflow-report` (the report).
//!
//! [`Placement::admin_comment`]: crate::records::placement::Placement::admin_comment
//! [`Waiting::admin_comment`]: crate::records::placement::Waiting::admin_comment
//! [`JobReport::encode`]: crate::records::report::JobReport::encode

use std::collections::BTreeMap;

use crate::records::kv;
use crate::records::placement::{Placement, Waiting};
use crate::records::report::{JobReport, ReportError};
use crate::records::runs::EarlierRuns;
use crate::Mode;

/// The tag every muxflow text starts with.
pub const TAG: &str = "muxflow:v1";
/// The tag of a report with per-GPU figures of a k-GPU job (`gpus=` a
/// list, `g<i>.*`); every other text stays [`TAG`], which every reader takes.
pub const TAG_V2: &str = "muxflow:v2";

/// The keys muxflow's texts share (the report's own figures are
/// [`crate::records::report`]'s).
pub mod key {
    /// `online` or `offline` ([`crate::Mode`]): every text has it.
    pub const MODE: &str = "mode";
    /// Where the matcher placed an offline job ([`crate::records::placement::Placement`]).
    pub const PLACED: &str = "placed";
    /// The code of a Prolog's refusal.
    pub const REFUSED: &str = "refused";
    /// An offline job's GPU count on its node when more than 1 (a report of
    /// a k-GPU job: its GPUs, a list).
    pub const GPUS: &str = "gpus";
    /// Why a parked job waits ([`crate::records::placement::Waiting`]).
    pub const WAITING: &str = "waiting";
    /// Since when it waits (local time).
    pub const SINCE: &str = "since";
    /// How often the matcher's rounds look again.
    pub const ROUNDS_EVERY: &str = "rounds_every";
    /// How often Prologs refused the job so far; absent means never.
    pub const REFUSALS: &str = "refusals";
    /// Why slurmstepd failed the job ([`super::NODE_CONFIG`]).
    pub const FAILED: &str = "failed";
}

/// `placed=` of a job Slurm may put on any slot (no matcher).
pub const PLACED_ANY: &str = "any";
/// `failed=` of a job whose node could not read its muxflow config.
pub const NODE_CONFIG: &str = "node_config";

/// What `etc/job_submit.lua` must define, name and value, for the texts it
/// writes and reads; a test reads the script and compares.
pub const LUA_CONSTANTS: [(&str, &str); 8] = [
    ("TAG", TAG),
    ("KEY_MODE", key::MODE),
    ("KEY_GPUS", key::GPUS),
    ("KEY_PLACED", key::PLACED),
    ("PLACED_ANY", PLACED_ANY),
    ("MODE_OFFLINE", "offline"),
    ("MODE_ONLINE", "online"),
    ("COMMENT_PREFIX", crate::records::job_comment::PREFIX),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdminCommentError {
    #[error("AdminComment does not start with '{TAG}'")]
    NotMuxflow,
    #[error("AdminComment: {0}")]
    Kv(#[from] kv::KvError),
}

/// A job's AdminComment, parsed once: the tag and its `key=value` words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminComment {
    v2: bool,
    fields: BTreeMap<String, String>,
}

impl AdminComment {
    /// Parses muxflow's text; an error for anything else (another tool's
    /// comment, an empty field, a malformed word).
    pub fn parse(text: &str) -> Result<AdminComment, AdminCommentError> {
        let text = text.trim();
        let (v2, rest) = match (text.strip_prefix(TAG), text.strip_prefix(TAG_V2)) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Err(AdminCommentError::NotMuxflow),
        };
        // The tag is a word of its own.
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            return Err(AdminCommentError::NotMuxflow);
        }
        Ok(AdminComment {
            v2,
            fields: kv::parse(rest)?,
        })
    }

    /// The text's words.
    pub fn fields(&self) -> &BTreeMap<String, String> {
        &self.fields
    }

    /// A report with per-GPU figures ([`TAG_V2`]).
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    pub fn mode(&self) -> Option<Mode> {
        self.fields.get(key::MODE)?.parse().ok()
    }

    fn offline(&self) -> bool {
        self.mode() == Some(Mode::Offline)
    }

    /// An offline job's GPU count: `gpus=k`, or the length of a report's
    /// GPU list; 1 when absent or unreadable.
    pub fn gpus(&self) -> u32 {
        let Some(v) = self.fields.get(key::GPUS) else {
            return 1;
        };
        match v.parse::<u32>() {
            Ok(k) if !self.v2 => k.max(1),
            _ if self.v2 => v.split(',').count() as u32,
            _ => 1,
        }
    }

    /// How often Prologs refused the offline job (0 when it says nothing).
    pub fn refusals(&self) -> u32 {
        if !self.offline() {
            return 0;
        }
        self.fields
            .get(key::REFUSALS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Where the matcher placed the offline job; None when it has not.
    pub fn placement(&self) -> Option<Placement> {
        self.offline()
            .then(|| Placement::parse(self.fields.get(key::PLACED)?))
            .flatten()
    }

    /// Why the parked offline job waits, if the matcher said.
    pub fn waiting(&self) -> Option<Waiting> {
        self.offline()
            .then(|| Waiting::from_code(self.fields.get(key::WAITING)?))
            .flatten()
    }

    /// The job's figures ([`crate::records::report`]).
    pub fn report(&self) -> Result<JobReport, ReportError> {
        JobReport::from_fields(&self.fields)
    }

    /// The runs before the job's next one, which its next text carries
    /// ([`EarlierRuns::carried`]); none where the text does not read as
    /// a report (its writer then writes its own text without them).
    pub fn runs_before(&self) -> EarlierRuns {
        self.report()
            .map(|r| EarlierRuns::carried(&r))
            .unwrap_or_default()
    }
}

/// The start of every offline job's text the matcher and the Prolog write:
/// the tag, the mode, the GPU count when more than 1 and the refusals when
/// any (what job_submit.lua wrote, carried on).
pub fn offline_record(gpus: usize, refusals: u32) -> kv::Writer {
    let mut w = kv::Writer::new().tag(TAG);
    w.push(key::MODE, Mode::Offline);
    if gpus > 1 {
        w.push(key::GPUS, gpus);
    }
    if refusals > 0 {
        w.push(key::REFUSALS, refusals);
    }
    w
}

/// The text of a job failed because its node could not read its muxflow
/// config: its muxflow text so far (`prior`, when it is one) with
/// `failed=node_config`; None when the text says so already (each step of
/// the job fails, the first one writes).
pub fn node_config_failed(prior: Option<&str>) -> Option<String> {
    let prior = prior
        .filter(|c| AdminComment::parse(c).is_ok())
        .map(str::trim)
        .map_or_else(
            || format!("{TAG} {}={}", key::MODE, Mode::Offline),
            str::to_string,
        );
    let word = format!("{}={NODE_CONFIG}", key::FAILED);
    (!prior.split_whitespace().any(|w| w == word)).then(|| format!("{prior} {word}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_parse_gives_every_readers_view() {
        struct Case {
            text: &'static str,
            mode: Option<Mode>,
            gpus: u32,
            refusals: u32,
            placed: Option<Placement>,
            waiting: Option<Waiting>,
        }
        let on = |node: &str, gpus: &[u32]| Some(Placement::on(node, gpus));
        let cases = [
            Case {
                text: "muxflow:v1 mode=offline",
                mode: Some(Mode::Offline),
                gpus: 1,
                refusals: 0,
                placed: None,
                waiting: None,
            },
            Case {
                text: "muxflow:v1 mode=offline gpus=2 refusals=1 placed=n1:g0,g1",
                mode: Some(Mode::Offline),
                gpus: 2,
                refusals: 1,
                placed: on("n1", &[0, 1]),
                waiting: None,
            },
            Case {
                text: "muxflow:v1 mode=offline waiting=free_gpu since=2026-11-23T12:14:05 rounds_every=60s",
                mode: Some(Mode::Offline),
                gpus: 1,
                refusals: 0,
                placed: None,
                waiting: Some(Waiting::FreeGpu),
            },
            Case {
                text: "muxflow:v1 mode=offline placed=any",
                mode: Some(Mode::Offline),
                gpus: 1,
                refusals: 0,
                placed: Some(Placement::AnySlot),
                waiting: None,
            },
            Case {
                // An online job's text places nothing and counts no refusal.
                text: "muxflow:v1 mode=online placed=n1:g0 refusals=3",
                mode: Some(Mode::Online),
                gpus: 1,
                refusals: 0,
                placed: None,
                waiting: None,
            },
            Case {
                // A k-GPU job's report lists its GPUs.
                text: "muxflow:v2 mode=offline node=n1 gpu=0 gpus=0,1,3",
                mode: Some(Mode::Offline),
                gpus: 3,
                refusals: 0,
                placed: None,
                waiting: None,
            },
            Case {
                text: "muxflow:v1 mode=offline gpus=x waiting=nonsense",
                mode: Some(Mode::Offline),
                gpus: 1,
                refusals: 0,
                placed: None,
                waiting: None,
            },
        ];
        for c in cases {
            let a = AdminComment::parse(c.text).unwrap_or_else(|e| panic!("{}: {e}", c.text));
            assert_eq!(a.mode(), c.mode, "{}", c.text);
            assert_eq!(a.gpus(), c.gpus, "{}", c.text);
            assert_eq!(a.refusals(), c.refusals, "{}", c.text);
            assert_eq!(a.placement(), c.placed, "{}", c.text);
            assert_eq!(a.waiting(), c.waiting, "{}", c.text);
        }
    }

    #[test]
    fn what_is_not_muxflows_text_is_refused() {
        for text in [
            "",
            "mode=offline",
            "muxflow:v1x mode=offline",
            "muxflow:v3 mode=offline",
            "muxflow:v1 mode=offline mode=online",
            "muxflow:v1 mode=offline placed",
            "site note: muxflow:v1 mode=offline",
        ] {
            assert!(AdminComment::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn the_node_config_failure_is_written_once_onto_muxflows_text() {
        assert_eq!(
            node_config_failed(Some("muxflow:v1 mode=offline placed=n1:g0")).as_deref(),
            Some("muxflow:v1 mode=offline placed=n1:g0 failed=node_config")
        );
        assert_eq!(
            node_config_failed(Some("muxflow:v1 mode=offline failed=node_config")),
            None
        );
        // Not muxflow's (or unreadable): a fresh offline text.
        for prior in [None, Some("someone else's note")] {
            assert_eq!(
                node_config_failed(prior).as_deref(),
                Some("muxflow:v1 mode=offline failed=node_config")
            );
        }
    }

    /// job_submit.lua writes the first text of every muxflow job and reads
    /// it back in job_modify: its constants are the protocol's, and no
    /// other line of it spells a protocol word out.
    #[test]
    fn job_submit_lua_speaks_the_protocol_as_defined_here() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/etc/job_submit.lua");
        let lua = std::fs::read_to_string(path).expect("read etc/job_submit.lua");
        let (defined, stray) = lua_protocol(&lua);
        let want: BTreeMap<String, String> = LUA_CONSTANTS
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(defined, want, "{path}: the protocol constants");
        for mode in [Mode::Offline, Mode::Online] {
            let name = format!("MODE_{}", mode.as_str().to_uppercase());
            assert_eq!(defined.get(&name).map(String::as_str), Some(mode.as_str()));
        }
        assert!(
            stray.is_empty(),
            "{path}: protocol words spelled out: {stray:?}"
        );

        // The check itself: a drifted value, a missing constant and a
        // spelled-out key are each caught.
        let drifted = lua.replace("local KEY_GPUS = \"gpus\"", "local KEY_GPUS = \"ngpus\"");
        assert_ne!(lua_protocol(&drifted).0, want);
        let missing = lua.replace("local PLACED_ANY = \"any\"\n", "");
        assert_ne!(lua_protocol(&missing).0, want);
        let spelled = format!("{lua}\nlocal x = TAG .. \" mode=online\"\n");
        assert!(!lua_protocol(&spelled).1.is_empty());
    }

    /// The Lua's protocol constants (`local NAME = "value"` for the names
    /// of [`LUA_CONSTANTS`]) and its code lines that spell a protocol word
    /// (`mode=`, `placed=`, the tag) in a string.
    fn lua_protocol(lua: &str) -> (BTreeMap<String, String>, Vec<String>) {
        let mut defined = BTreeMap::new();
        let mut stray = Vec::new();
        let mut in_block_comment = false;
        for line in lua.lines().map(str::trim) {
            if in_block_comment || line.starts_with("--[[") {
                in_block_comment = !line.contains("]]");
                continue;
            }
            if line.starts_with("--") {
                continue;
            }
            let constant = line
                .strip_prefix("local ")
                .and_then(|l| l.split_once(" = \""))
                .and_then(|(name, rest)| Some((name, rest.strip_suffix('"')?)))
                .filter(|(name, _)| LUA_CONSTANTS.iter().any(|(n, _)| n == name));
            if let Some((name, value)) = constant {
                defined.insert(name.to_string(), value.to_string());
            } else if ["muxflow:v", " mode=", "placed=", "refusals="]
                .iter()
                .any(|w| line.contains(w))
            {
                stray.push(line.to_string());
            }
        }
        (defined, stray)
    }
}
