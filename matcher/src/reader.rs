//! Reads the cluster from Slurm's JSON, in both shapes muxflow supports
//! (the releases and their writers: [`RELEASES`]):
//!
//! | | Slurm 22.05 (openapi v0.0.38) | Slurm 24.11 (v0.0.42) and 26.05 (v0.0.45) data_parser |
//! |---|---|---|
//! | jobs | `squeue --json` | `squeue --json` |
//! | nodes | `sinfo --json` (`nodes`) | `scontrol show nodes --json` (`nodes`) |
//! | history | `sacct --json` | `sacct --json` |
//! | job / node / sacct state | a string (`"RUNNING"`, `"idle"` + `state_flags`) | an array of strings (`["RUNNING"]`, `["IDLE","DRAIN"]`) |
//! | numbers | plain | plain or `{"set", "infinite", "number"}` |
//! | requested GRES | `gres:mfslot:g0:1` | `gres/mfslot:g0:1` |
//!
//! 26.05 adds fields (`segment_size`, `step_id`, `sluid`, `topology`…) and
//! drops `power`; none the reader types moved (recorded side by side with
//! 24.11's in `matcher/tests/data/`).
//! Only the fields the matcher uses are typed; unknown fields are ignored.
//! Every release is recorded from the dev cluster in `matcher/tests/data/`.
//!
//! From 23.02 on, `sinfo --json` groups nodes that differ only in fields it
//! does not compare — node `extra` among them (24.11 showed one node's Extra
//! for two nodes with different ones) — so its `sinfo` listing is refused
//! here ([`ReadError::GroupedNodes`]): nodes are read per node from
//! `scontrol show nodes --json`.
//!
//! `squeue --json` ignores `-j`, `-t` and the other filters in 22.05: every
//! job comes back and [`ClusterState::build`] filters by itself.
//!
//! Sources of each fact:
//!
//! | fact | source |
//! |---|---|
//! | offline / online job | `admin_comment` starting `muxflow:v1 mode=offline` / `mode=online` (set by job_submit.lua) |
//! | pending offline job's hint | held (`state_reason`), `required_nodes`, the typed slot in `tres_per_node` |
//! | online job's GPU | `gres_detail` of a running job, `gpu:1(IDX:0)` |
//! | offline slots in use | node `gres_used`, `mfslot:g1:2(IDX:0-1)` (the count per type; IDX numbers gres.conf records, not GPUs), and the running offline jobs' `gres_detail`: the larger |
//! | GPU health, online solo SM and memory | node `extra`, [`muxflow::records::published`] text |
//! | a node's free CPUs and memory | node `cpus` (24.11: `effective_cpus`) − `alloc_cpus`, `real_memory` − `specialized_memory` − `alloc_memory` (MiB) |
//! | a pending job's CPUs and memory | `tres_req_str` (`cpu=2,mem=4000M,…`; `memory_per_node` is unset or 0 when the default applies) |
//! | offline history | `sacct --json` `comment.administrator`, [`muxflow::records::report::JobReport`] |

use std::collections::{BTreeMap, BTreeSet};

use muxflow::config::CoLocate;
use muxflow::policy::health::HealthState;
use muxflow::records::admin_comment::AdminComment;
use muxflow::records::placement::Waiting;
use muxflow::records::published::{self, GpuPublished};
use muxflow::records::runs::EarlierRuns;
use muxflow::Mode;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{what}: not Slurm JSON: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what}: Slurm reported errors: {errors}")]
    Slurm { what: &'static str, errors: String },
    #[error("{what}: a grouped `sinfo` listing (Slurm 23.02 and later), which merges nodes with different Extra; read nodes with `scontrol show nodes --json` instead")]
    GroupedNodes { what: &'static str },
}

/// Slurm's JSON writes `null` for fields it has no value for (a job's
/// `user` once its uid is unknown, a `name`…): read as the default, so one
/// such record does not fail the whole listing.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A state as 22.05 writes it (`"RUNNING"`) or as 24.11 does
/// (`["RUNNING"]`, `["IDLE", "DRAIN"]`); `null` is no state.
fn state_words<'de, D>(d: D) -> Result<Vec<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Words {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<Words>::deserialize(d)? {
        None => Vec::new(),
        Some(Words::One(w)) if w.is_empty() => Vec::new(),
        Some(Words::One(w)) => vec![w],
        Some(Words::Many(v)) => v,
    })
}

/// [`number`], where unset (22.05's `null`, a later release's
/// `{"set": false}`, or infinite) is `None` rather than the default.
fn optional_number<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    struct NoVal<T> {
        #[serde(default)]
        set: bool,
        #[serde(default)]
        infinite: bool,
        number: Option<T>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number<T> {
        Plain(T),
        Struct(NoVal<T>),
    }
    Ok(match Option::<Number<T>>::deserialize(d)? {
        Some(Number::Plain(v)) => Some(v),
        Some(Number::Struct(n)) if n.set && !n.infinite => n.number,
        _ => None,
    })
}

/// A number as 22.05 writes it, or 24.11's `{"set", "infinite", "number"}`
/// (not set, or infinite: the default, as for `null`).
fn number<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    #[derive(Deserialize)]
    struct NoVal<T> {
        #[serde(default)]
        set: bool,
        #[serde(default)]
        infinite: bool,
        number: Option<T>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number<T> {
        Plain(T),
        Struct(NoVal<T>),
    }
    Ok(match Option::<Number<T>>::deserialize(d)? {
        Some(Number::Plain(v)) => v,
        Some(Number::Struct(n)) if n.set && !n.infinite => n.number.unwrap_or_default(),
        _ => T::default(),
    })
}

/// Whether `words` (a job's or node's state) holds `state`, in any case.
pub fn has_state(words: &[String], state: &str) -> bool {
    words.iter().any(|w| w.eq_ignore_ascii_case(state))
}

/// One job of `squeue --json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SqueueJob {
    #[serde(deserialize_with = "number")]
    pub job_id: u32,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub user_name: String,
    /// The Slurm account the job is charged to.
    #[serde(deserialize_with = "nullable")]
    pub account: String,
    /// `RUNNING`, `PENDING`… (24.11 adds flags such as `COMPLETING`).
    #[serde(deserialize_with = "state_words")]
    pub job_state: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub nodes: String,
    #[serde(deserialize_with = "nullable")]
    pub admin_comment: String,
    /// The job's Comment: its owner's, or muxflow's words for them
    /// ([`muxflow::records::job_comment`]).
    #[serde(deserialize_with = "nullable")]
    pub comment: String,
    #[serde(deserialize_with = "nullable")]
    pub tres_per_node: String,
    /// One entry per allocated node: `gpu:1(IDX:0)`, `mfslot:g1:1(IDX:1)`.
    #[serde(deserialize_with = "nullable")]
    pub gres_detail: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub required_nodes: String,
    #[serde(deserialize_with = "nullable")]
    pub state_reason: String,
    /// What it asks for in all, `cpu=2,mem=4000M,node=1,…` (both releases;
    /// `memory_per_node` stays unset or 0 when the default applies).
    #[serde(deserialize_with = "nullable")]
    pub tres_req_str: String,
    /// 22.05's text beside `state_reason` (`job requeued in held state`).
    #[serde(deserialize_with = "nullable")]
    pub state_description: String,
    /// When it was submitted (or requeued), Unix seconds.
    #[serde(deserialize_with = "number")]
    pub submit_time: u64,
    /// The job's begin time, Unix seconds: `--begin`, or the delay Slurm
    /// gives a requeued job (0: none; a held job without one shows 0).
    #[serde(deserialize_with = "number")]
    pub eligible_time: u64,
    /// `afterok:12(unfulfilled)`; empty once satisfied (also while held).
    #[serde(deserialize_with = "nullable")]
    pub dependency: String,
    /// The leader of its heterogeneous job (0: not one).
    #[serde(deserialize_with = "number")]
    pub het_job_id: u32,
    /// The array it belongs to (0: not an array task).
    #[serde(deserialize_with = "number")]
    pub array_job_id: u32,
    /// The task this record is (unset for a record of several tasks).
    #[serde(deserialize_with = "number")]
    pub array_task_id: u32,
    /// An array's record of tasks not yet split out (`0-7`, `1,3,5-7%2`);
    /// empty for a single task.
    #[serde(deserialize_with = "nullable")]
    pub array_task_string: String,
}

impl SqueueJob {
    pub fn owner(&self) -> Owner {
        Owner {
            user: self.user_name.clone(),
            account: self.account.clone(),
        }
    }
}

/// One node of `sinfo --json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SinfoNode {
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// 22.05: the base state (`idle`), flags in `state_flags`; 24.11: both
    /// here (`["IDLE", "DRAIN"]`).
    #[serde(deserialize_with = "state_words")]
    pub state: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub state_flags: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub extra: String,
    #[serde(deserialize_with = "nullable")]
    pub gres: String,
    #[serde(deserialize_with = "nullable")]
    pub gres_used: String,
    /// CPUs (24.11: `effective_cpus` less the specialized ones, when set).
    #[serde(deserialize_with = "number")]
    pub cpus: u32,
    #[serde(deserialize_with = "number")]
    pub effective_cpus: u32,
    #[serde(deserialize_with = "number")]
    pub alloc_cpus: u32,
    /// MiB; `alloc_memory` stays 0 where memory is not a consumable
    /// resource (`SelectTypeParameters` without `_Memory`).
    #[serde(deserialize_with = "number")]
    pub real_memory: u64,
    #[serde(deserialize_with = "number")]
    pub specialized_memory: u64,
    #[serde(deserialize_with = "number")]
    pub alloc_memory: u64,
}

impl SinfoNode {
    /// CPUs and memory no job holds; `None` when the listing has no CPU
    /// count (nothing known: no limit).
    pub fn free_room(&self) -> Option<NodeRoom> {
        let cpus = if self.effective_cpus > 0 {
            self.effective_cpus
        } else {
            self.cpus
        };
        (cpus > 0).then(|| NodeRoom {
            cpus: cpus.saturating_sub(self.alloc_cpus),
            mem_mib: self
                .real_memory
                .saturating_sub(self.specialized_memory)
                .saturating_sub(self.alloc_memory),
        })
    }
}

/// CPUs and memory (MiB) on one node: what a pending job asks for there,
/// or what a node has free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeRoom {
    pub cpus: u32,
    pub mem_mib: u64,
}

impl NodeRoom {
    /// Whether `need` fits in this room (memory only where `memory` says
    /// Slurm counts it).
    pub fn holds(&self, need: &NodeRoom, memory: bool) -> bool {
        need.cpus <= self.cpus && (!memory || need.mem_mib <= self.mem_mib)
    }

    /// This room less `need` (memory only where `memory`).
    pub fn take(&mut self, need: &NodeRoom, memory: bool) {
        self.cpus = self.cpus.saturating_sub(need.cpus);
        if memory {
            self.mem_mib = self.mem_mib.saturating_sub(need.mem_mib);
        }
    }
}

/// A job's CPUs and memory from its `tres_req_str` (`cpu=2,mem=16G,…`;
/// Slurm's units K, M, G, T, MiB when none): zero for what it does not name.
pub fn tres_need(tres: &str) -> NodeRoom {
    let mut need = NodeRoom::default();
    for (key, value) in tres.split(',').filter_map(|kv| kv.split_once('=')) {
        match key.trim() {
            "cpu" => need.cpus = value.trim().parse().unwrap_or(0),
            "mem" => need.mem_mib = mem_mib(value.trim()).unwrap_or(0),
            _ => {}
        }
    }
    need
}

/// `4000M`, `16G`, `1T`, `512K` (rounded up), `4000` → MiB.
fn mem_mib(v: &str) -> Option<u64> {
    let (digits, unit) = match v
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit() && *c != '.')
    {
        Some((i, _)) => v.split_at(i),
        None => (v, "M"),
    };
    let n: f64 = digits.parse().ok()?;
    let mib = match unit.to_ascii_uppercase().as_str() {
        "K" => n / 1024.0,
        "M" => n,
        "G" => n * 1024.0,
        "T" => n * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(mib.ceil() as u64)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SacctComment {
    pub administrator: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SacctState {
    #[serde(deserialize_with = "state_words")]
    pub current: Vec<String>,
}

/// Times of a sacct record, Unix seconds (0: not yet).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SacctTime {
    #[serde(deserialize_with = "number")]
    pub end: u64,
    /// When it was submitted (a requeued job: when it was requeued).
    #[serde(deserialize_with = "number")]
    pub submission: u64,
}

/// One job of `sacct --json -X`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SacctJob {
    #[serde(deserialize_with = "number")]
    pub job_id: u32,
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    #[serde(deserialize_with = "nullable")]
    pub user: String,
    #[serde(deserialize_with = "nullable")]
    pub state: SacctState,
    #[serde(deserialize_with = "nullable")]
    pub comment: SacctComment,
    #[serde(deserialize_with = "nullable")]
    pub time: SacctTime,
    /// The array it is a task of (`job_id` 0: not an array task).
    #[serde(deserialize_with = "nullable")]
    pub array: SacctArray,
}

/// A sacct record's array: the array's ID and this record's task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct SacctArray {
    #[serde(deserialize_with = "number")]
    pub job_id: u32,
    /// Unset (22.05: null; later: `{"set": false}`) for a record that is
    /// not one task.
    #[serde(deserialize_with = "optional_number")]
    pub task_id: Option<u32>,
}

/// What one range of Slurm releases writes, as this reader takes it: the
/// per-release table (the module's first table in code). Every other
/// difference (state strings or arrays, plain or NO_VAL numbers, `gres:` or
/// `gres/`) is read in either shape by the same fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseJson {
    /// First release (major, minor) of the range.
    pub since: (u32, u32),
    /// The JSON writer the release's commands use, as their `meta` names
    /// it (22.05's sacct: slurmdbd's `openapi/dbv0.0.38`).
    pub writer: &'static str,
    /// The command (and arguments) giving one entry per node.
    pub nodes: &'static [&'static str],
}

/// Oldest first; checked against recordings of 22.05, 24.11 and 26.05
/// (`matcher/tests/data/`).
pub const RELEASES: &[ReleaseJson] = &[
    ReleaseJson {
        since: (22, 5),
        writer: "openapi/v0.0.38",
        nodes: &["sinfo", "--json"],
    },
    // 23.02: sinfo groups nodes (Extra is not compared); scontrol lists
    // each node. (Not recorded here: no Debian release ships 23.02.)
    ReleaseJson {
        since: (23, 2),
        writer: "data_parser/v0.0.39",
        nodes: &["scontrol", "show", "nodes", "--json"],
    },
    ReleaseJson {
        since: (24, 11),
        writer: "data_parser/v0.0.42",
        nodes: &["scontrol", "show", "nodes", "--json"],
    },
    ReleaseJson {
        since: (26, 5),
        writer: "data_parser/v0.0.45",
        nodes: &["scontrol", "show", "nodes", "--json"],
    },
];

/// The table's row for `release` (major, minor): the newest row not newer
/// than it (a release newer than the table reads as the newest row).
pub fn release_json(release: (u32, u32)) -> &'static ReleaseJson {
    RELEASES
        .iter()
        .rev()
        .find(|r| r.since <= release)
        .unwrap_or(&RELEASES[0])
}

/// Slurm's error number for a query that matched nothing.
const EMPTY_RESULT: u32 = 9003;

#[derive(Debug, Deserialize)]
struct Envelope<T> {
    #[serde(default)]
    errors: Vec<serde_json::Value>,
    #[serde(default = "Vec::new", alias = "nodes")]
    jobs: Vec<T>,
    /// 24.11's `sinfo --json` listing: groups of nodes, refused.
    #[serde(default)]
    sinfo: Option<serde::de::IgnoredAny>,
}

fn parse<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    text: &str,
) -> Result<Vec<T>, ReadError> {
    let env: Envelope<T> =
        serde_json::from_str(text).map_err(|source| ReadError::Json { what, source })?;
    // ESLURM_REST_EMPTY_RESULT ("Nothing found with query", e.g. sacct on
    // an empty database) is an empty listing, not a failure.
    let errors: Vec<_> = env
        .errors
        .into_iter()
        .filter(|e| e["error_number"] != EMPTY_RESULT)
        .collect();
    if !errors.is_empty() {
        return Err(ReadError::Slurm {
            what,
            errors: serde_json::Value::Array(errors).to_string(),
        });
    }
    if env.sinfo.is_some() {
        return Err(ReadError::GroupedNodes { what });
    }
    Ok(env.jobs)
}

pub fn parse_squeue(text: &str) -> Result<Vec<SqueueJob>, ReadError> {
    parse("squeue --json", text)
}

/// Nodes from 22.05's `sinfo --json` or 24.11's `scontrol show nodes --json`.
pub fn parse_sinfo(text: &str) -> Result<Vec<SinfoNode>, ReadError> {
    parse(
        "node listing (sinfo --json / scontrol show nodes --json)",
        text,
    )
}

pub fn parse_sacct(text: &str) -> Result<Vec<SacctJob>, ReadError> {
    parse("sacct --json", text)
}

/// One entry of a GRES allocation string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresAlloc {
    pub name: String,
    pub kind: Option<String>,
    pub count: u64,
    pub indices: Vec<u32>,
}

/// Parses `gpu:2(IDX:0-1),mfslot:g0:0(IDX:N/A),mfslot:g1:1(IDX:1)` (also
/// without the `(IDX:…)` part, and with the `gres:` (22.05) or `gres/`
/// (24.11) prefix of `tres_per_node`). Unparsable entries are skipped.
pub fn parse_gres(s: &str) -> Vec<GresAlloc> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = s.as_bytes();
    for i in 0..=bytes.len() {
        let c = bytes.get(i).copied();
        match c {
            Some(b'(') => depth += 1,
            Some(b')') => depth -= 1,
            Some(b',') | None if depth == 0 => {
                if let Some(a) = parse_one_gres(&s[start..i]) {
                    out.push(a);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

fn parse_one_gres(entry: &str) -> Option<GresAlloc> {
    let entry = entry.trim();
    let entry = entry
        .strip_prefix("gres:")
        .or_else(|| entry.strip_prefix("gres/"))
        .unwrap_or(entry);
    let (spec, idx) = match entry.split_once('(') {
        Some((spec, rest)) => (spec, rest.trim_end_matches(')')),
        None => (entry, ""),
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let (name, kind, count) = match parts.as_slice() {
        [name] if !name.is_empty() => (*name, None, 1),
        [name, c] => match c.parse() {
            Ok(n) => (*name, None, n),
            Err(_) => (*name, Some(c.to_string()), 1),
        },
        [name, kind, c] => (*name, Some(kind.to_string()), c.parse().ok()?),
        _ => return None,
    };
    let indices = idx
        .strip_prefix("IDX:")
        .map(parse_index_list)
        .unwrap_or_default();
    Some(GresAlloc {
        name: name.to_string(),
        kind,
        count,
        indices,
    })
}

/// `0-1,3` → [0, 1, 3]; `N/A` → [].
fn parse_index_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b.min(a.saturating_add(1024)));
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// GPU index of an offline slot type `g<index>`.
pub fn slot_index(kind: &str) -> Option<u32> {
    kind.strip_prefix('g')?.parse().ok()
}

/// Most GPUs one offline job is read as asking for: beyond any node's
/// count, and a bound on what a malformed record can make a round try.
pub const MAX_JOB_GPUS: u32 = 64;

/// The GPU count in an offline job's AdminComment
/// ([`AdminComment::gpus`]); 1 when there is none, at most [`MAX_JOB_GPUS`].
fn job_gpus(comment: Option<&AdminComment>) -> u32 {
    comment.map_or(1, |c| c.gpus().clamp(1, MAX_JOB_GPUS))
}

/// How the matcher names its Slurm objects (config `[slurm]`).
#[derive(Debug, Clone)]
pub struct Names {
    pub offline_gres: String,
}

impl Names {
    pub fn from_config(c: &muxflow::config::Slurm) -> Names {
        Names {
            offline_gres: c.offline_gres.clone(),
        }
    }
}

/// A GPU that runs an online job, or an idle one (no job holds it as
/// gres/gpu), as the matcher sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    pub node: String,
    pub index: u32,
    pub published: GpuPublished,
    /// Empty: an idle GPU (issue 15: it takes offline work at the job's
    /// solo speed).
    pub online_jobs: Vec<u32>,
    /// Offline slots its running offline jobs hold (`[policy]
    /// offline_per_gpu` of them there are, issue 15; a job holds one or
    /// more, its `mfslot:g<i>:<s>`).
    pub slots_used: u32,
    /// Offline jobs running on it.
    pub offline_jobs: u32,
    /// Who runs jobs (online and offline) on it, (user, account) sorted:
    /// where its MPS daemon serves one user at a time
    /// (`published.multiuser` false) or `[policy] co_locate` says so, only
    /// jobs of the same user (account) may join ([`GpuState::admits`]).
    pub owners: Vec<Owner>,
}

/// Who a job belongs to, as far as sharing a GPU goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    pub user: String,
    pub account: String,
}

/// The reason Slurm shows for a job an operator (root, SlurmUser: the
/// matcher) holds; its owner cannot release it.
pub const ADMIN_HOLD: &str = "JobHeldAdmin";

/// A pending offline job and its current hint.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingJob {
    pub id: u32,
    pub user: String,
    /// The Slurm account it is charged to.
    pub account: String,
    pub name: String,
    pub required_nodes: String,
    /// GPU indices of the typed offline slots it requests (ascending; empty:
    /// none yet). Slurm 22.05 keeps the first typed GRES a job was given
    /// through every later update, so once set they fix the GPU indices the
    /// job can be placed on.
    pub slot_gpus: Vec<u32>,
    /// GPUs it asked for, on one node (issue 15: more than 1 is a gang).
    pub gpus: u32,
    /// Slots of each of `slot_gpus` its placement asks for
    /// (`mfslot:g<i>:<s>`), in the same order.
    pub slots: Vec<u32>,
    /// Held (priority 0): how job_submit.lua parks offline jobs.
    pub held: bool,
    /// Why it waits, as the matcher last wrote it into the AdminComment,
    /// while it stays held by the matcher (Reason=JobHeldAdmin); `None`
    /// otherwise, e.g. fresh from job_submit.lua (JobHeldUser).
    pub waiting: Option<Waiting>,
    /// How often Prologs refused it so far (`refusals=` of its
    /// AdminComment), which the matcher's own texts keep.
    pub refusals: u32,
    /// Its runs before a requeue, which the matcher's own texts keep too
    /// (with the run a requeued job's report is about:
    /// [`AdminComment::runs_before`]).
    pub earlier: EarlierRuns,
    /// The CPUs and memory it asks for on its node (zero: not known, no
    /// limit).
    pub need: NodeRoom,
    /// The array's own record (its id the array's) stands for its first
    /// pending task: the round places that task alone (`JobId=<id>_<task>`,
    /// which Slurm splits out as a job of its own), never the whole array.
    pub array_task: Option<u32>,
    /// Why Slurm will not start it now, whatever its hints say: it gets no
    /// slot, and a slot it holds goes back to the pool.
    pub unstartable: Option<Unstartable>,
}

/// Why Slurm will not start a pending job now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstartable {
    /// Its begin time (Unix seconds) is still ahead: `--begin`, or the
    /// delay after a requeue (about two minutes).
    BeginTime(u64),
    /// Its dependency is not satisfied (yet, or ever).
    Dependency,
    /// A component of a heterogeneous job: Slurm starts the components
    /// together only, and job_submit.lua refuses such offline jobs.
    HetJob,
    /// Its owner held it (`scontrol hold` on a placed job): left alone,
    /// never released by the matcher, until its owner releases it.
    UserHold,
}

impl Unstartable {
    /// The reason a parked job shows, where it has one of its own (a
    /// user's hold keeps its owner's reason, a heterogeneous job nothing).
    pub fn waiting(self) -> Option<Waiting> {
        match self {
            Unstartable::BeginTime(_) => Some(Waiting::BeginTime),
            Unstartable::Dependency => Some(Waiting::Dependency),
            Unstartable::HetJob | Unstartable::UserHold => None,
        }
    }

    /// The decision line's reason.
    pub fn words(self) -> String {
        match self {
            Unstartable::BeginTime(at) => format!(
                "not startable: its begin time (Unix {at}) is ahead (--begin, or Slurm's delay after a requeue); no slot kept for it"
            ),
            Unstartable::Dependency => {
                "not startable: its dependency is not satisfied; no slot kept for it".to_string()
            }
            Unstartable::HetJob => {
                "not placed: a heterogeneous job's component (Slurm starts the components together only)".to_string()
            }
            Unstartable::UserHold => {
                "held by its owner: left out until its owner releases it".to_string()
            }
        }
    }
}

/// Reason Slurm shows for a job held at user level (job_submit.lua's
/// parking, `scontrol hold` by its owner, a requeue-hold).
pub const USER_HOLD: &str = "JobHeldUser";

/// Whether a dependency string (`afterok:12(unfulfilled),afterany:13(fulfilled)`,
/// `?` between alternatives) lets the job start: every entry fulfilled, or
/// one of the alternatives. Slurm empties it once satisfied.
pub fn dependency_satisfied(dep: &str) -> bool {
    let dep = dep.trim();
    if dep.is_empty() || dep == "(null)" {
        return true;
    }
    let fulfilled = |e: &str| e.trim().ends_with("(fulfilled)");
    if dep.contains('?') {
        dep.split('?').any(fulfilled)
    } else {
        dep.split(',').all(fulfilled)
    }
}

/// The first task of an array record's task string (`3-7%2`, `1,4,9-12:3`).
fn first_array_task(tasks: &str) -> Option<u32> {
    let digits: String = tasks
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Why Slurm will not start pending job `j` at `now_s`, or None.
fn unstartable(j: &SqueueJob, comment: Option<&AdminComment>, now_s: u64) -> Option<Unstartable> {
    if j.het_job_id != 0 {
        return Some(Unstartable::HetJob);
    }
    // A user-level hold on a job the matcher placed is its owner's: the
    // matcher's placement of a held job turns the hold into an operator's
    // first (hints::update_args), and muxflow's requeue-holds say so in
    // the description and leave no placement.
    if j.state_reason == USER_HOLD
        && !j.state_description.contains("requeued")
        && comment.and_then(AdminComment::placement).is_some()
    {
        return Some(Unstartable::UserHold);
    }
    if !dependency_satisfied(&j.dependency) {
        return Some(Unstartable::Dependency);
    }
    (j.eligible_time > now_s).then_some(Unstartable::BeginTime(j.eligible_time))
}

/// What the running jobs say of each (node, GPU index).
#[derive(Default)]
struct Held {
    /// Online jobs there.
    online: BTreeMap<(String, u32), Vec<u32>>,
    /// Held as gres/gpu by any running job.
    gpu_held: BTreeSet<(String, u32)>,
    /// Owners of the muxflow jobs running there.
    owners_on: BTreeMap<(String, u32), BTreeSet<Owner>>,
}

/// Offline slots per GPU index in a gres list (entries of one type added
/// up).
fn slots_by_index(gres: &str, names: &Names) -> BTreeMap<u32, u32> {
    let mut typed: BTreeMap<u32, u32> = BTreeMap::new();
    for g in parse_gres(gres)
        .into_iter()
        .filter(|g| g.name == names.offline_gres && g.count > 0)
    {
        if let Some(i) = g.kind.as_deref().and_then(slot_index) {
            let c = typed.entry(i).or_default();
            *c = c.saturating_add(u32::try_from(g.count).unwrap_or(u32::MAX));
        }
    }
    typed
}

/// A pending offline job's record at `now_s`: the typed slots Slurm keeps
/// for it, the GPUs it asked for, what its AdminComment says, whether Slurm
/// would start it now.
fn pending_job(
    j: &SqueueJob,
    comment: Option<&AdminComment>,
    names: &Names,
    now_s: u64,
) -> PendingJob {
    // Per GPU index the slots asked for.
    let typed = slots_by_index(&j.tres_per_node, names);
    let slot_gpus: Vec<u32> = typed.keys().copied().collect();
    let slots: Vec<u32> = typed.values().copied().collect();
    // The count job_submit.lua (or the matcher's placement)
    // wrote; a record that lost it (the Prolog's refusal, the
    // end-of-run report) still has the typed slots Slurm keeps.
    let asked = job_gpus(comment);
    let gpus = asked.max(slot_gpus.len() as u32).max(1);
    PendingJob {
        id: j.job_id,
        user: j.user_name.clone(),
        account: j.account.clone(),
        name: j.name.clone(),
        required_nodes: j.required_nodes.clone(),
        slot_gpus,
        gpus,
        slots,
        held: j.state_reason.starts_with("JobHeld"),
        waiting: (j.state_reason == ADMIN_HOLD)
            .then(|| comment?.waiting())
            .flatten(),
        refusals: comment.map_or(0, AdminComment::refusals),
        earlier: comment.map(AdminComment::runs_before).unwrap_or_default(),
        need: tres_need(&j.tres_req_str),
        // The array's own record (its id is the array's): all its pending
        // tasks, or its last one. Updating it by the plain id would change
        // every task of the array (Slurm refuses Gres= then); split-out
        // tasks have ids of their own.
        array_task: (j.array_job_id != 0 && j.array_job_id == j.job_id)
            .then(|| first_array_task(&j.array_task_string).unwrap_or(j.array_task_id)),
        unstartable: unstartable(j, comment, now_s),
    }
}

/// Everything one round needs, read from Slurm.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// GPUs with a running online job, and idle GPUs, by (node, index).
    pub gpus: Vec<GpuState>,
    pub pending: Vec<PendingJob>,
    /// Running offline jobs: (job, node, GPU index).
    pub running_offline: Vec<(u32, String, u32)>,
    /// Things the round should log once (node without muxflow Extra, ...).
    pub notes: Vec<String>,
    /// Each node's CPUs and memory no job holds (a node not listed: not
    /// known, no limit). Pending jobs, hinted or not, hold nothing yet.
    pub node_room: BTreeMap<String, NodeRoom>,
    /// Slurm counts memory as a consumable resource (`SelectTypeParameters`
    /// with `_Memory`): jobs placed on one node in one round must fit its
    /// free memory together, not just each alone.
    pub memory_consumable: bool,
    /// Slurm's fair-share factor of each user (`sshare`, 0–1; higher: more
    /// owed), which orders users in the round; empty where Slurm computes
    /// none (priority/basic) or it could not be read: users by their
    /// oldest job.
    pub fair_share: BTreeMap<String, f64>,
    /// Pending offline jobs whose Comment is their owner's own: muxflow
    /// writes its words only into an empty Comment or its own.
    pub user_comments: BTreeSet<u32>,
}

impl ClusterState {
    /// The cluster as the listings show it now (the wall clock decides
    /// which begin times are past).
    pub fn build(jobs: &[SqueueJob], nodes: &[SinfoNode], names: &Names) -> ClusterState {
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self::build_at(jobs, nodes, names, now_s)
    }

    /// [`ClusterState::build`] at `now_s` (Unix seconds).
    pub fn build_at(
        jobs: &[SqueueJob],
        nodes: &[SinfoNode],
        names: &Names,
        now_s: u64,
    ) -> ClusterState {
        let mut st = ClusterState::default();
        let mut held = Held::default();
        for j in jobs {
            st.read_job(j, names, &mut held, now_s);
        }
        st.pending.sort_by_key(|p| p.id);
        // Offline jobs per (node, GPU) from squeue: one entry per job and GPU.
        let mut offline_on: BTreeMap<(String, u32), u32> = BTreeMap::new();
        for (_, node, i) in &st.running_offline {
            *offline_on.entry((node.clone(), *i)).or_default() += 1;
        }
        for n in nodes {
            st.read_node(n, names, &held, &offline_on);
        }
        st.gpus
            .sort_by(|a, b| (&a.node, a.index).cmp(&(&b.node, b.index)));
        st
    }

    /// One squeue job: the GPUs it holds, and as a muxflow job its place
    /// (online or offline, running) or its pending record.
    fn read_job(&mut self, j: &SqueueJob, names: &Names, held: &mut Held, now_s: u64) {
        // The job's AdminComment, parsed once for all it says.
        let comment = AdminComment::parse(&j.admin_comment).ok();
        let mode = comment.as_ref().and_then(AdminComment::mode);
        let running = has_state(&j.job_state, "RUNNING");
        if running {
            for (node, detail) in expand_hostlist(&j.nodes).iter().zip(&j.gres_detail) {
                for g in parse_gres(detail).into_iter().filter(|g| g.name == "gpu") {
                    for i in g.indices {
                        held.gpu_held.insert((node.clone(), i));
                    }
                }
            }
        }
        match (mode, running) {
            (Some(Mode::Online), true) => {
                // One gres_detail entry per node of the allocation.
                let hosts = expand_hostlist(&j.nodes);
                for (node, detail) in hosts.iter().zip(&j.gres_detail) {
                    for g in parse_gres(detail).into_iter().filter(|g| g.name == "gpu") {
                        for i in g.indices {
                            held.online
                                .entry((node.clone(), i))
                                .or_default()
                                .push(j.job_id);
                            held.owners_on
                                .entry((node.clone(), i))
                                .or_default()
                                .insert(j.owner());
                        }
                    }
                }
            }
            (Some(Mode::Offline), true) => {
                let hosts = expand_hostlist(&j.nodes);
                for (node, detail) in hosts.iter().zip(&j.gres_detail) {
                    for g in parse_gres(detail)
                        .into_iter()
                        .filter(|g| g.name == names.offline_gres && g.count > 0)
                    {
                        if let Some(i) = g.kind.as_deref().and_then(slot_index) {
                            self.running_offline.push((j.job_id, node.clone(), i));
                            held.owners_on
                                .entry((node.clone(), i))
                                .or_default()
                                .insert(j.owner());
                        }
                    }
                }
            }
            (Some(Mode::Offline), false) if has_state(&j.job_state, "PENDING") => {
                if !muxflow::records::job_comment::is_muxflows(&j.comment) {
                    self.user_comments.insert(j.job_id);
                }
                self.pending
                    .push(pending_job(j, comment.as_ref(), names, now_s));
            }
            _ => {}
        }
    }

    /// One sinfo node: its free room, and its GPUs that are idle or run an
    /// online job muxflow manages, as its Extra publishes them.
    fn read_node(
        &mut self,
        n: &SinfoNode,
        names: &Names,
        held: &Held,
        offline_on: &BTreeMap<(String, u32), u32>,
    ) {
        // Slots held per GPU: the node counts each type's slots in use
        // (N records of one type with `offline_per_gpu` = N).
        let used = slots_by_index(&n.gres_used, names);
        // A GPU no running job holds as gres/gpu (muxflow's or not) is
        // idle. squeue's gres_detail names the indices; the node's
        // gres_used only counts them (22.05 prints `gpu:1`, no IDX):
        // when it counts more than squeue named, some job's GPUs are
        // unknown and none of the node's GPUs is taken for idle.
        let used_gpus: u64 = parse_gres(&n.gres_used)
            .into_iter()
            .filter(|g| g.name == "gpu")
            .map(|g| g.count)
            .sum();
        let named = held
            .gpu_held
            .range((n.name.clone(), 0)..=(n.name.clone(), u32::MAX))
            .count();
        let idle_known = used_gpus <= named as u64;
        let has_online = held.online.keys().any(|(node, _)| node == &n.name);
        if let Some(room) = n.free_room() {
            self.node_room.insert(n.name.clone(), room);
        }
        let published = match published::decode(&n.extra) {
            Ok(p) => p,
            Err(e) => {
                if has_online {
                    self.notes.push(format!(
                        "node {}: no usable muxflow Extra ({e}); its GPUs get no offline job",
                        n.name
                    ));
                }
                return;
            }
        };
        if node_unusable(n) {
            if has_online {
                self.notes.push(format!(
                    "node {}: state {}; skipped",
                    n.name,
                    n.state.join("+")
                ));
            }
            return;
        }
        for p in published {
            let at = (n.name.clone(), p.index);
            let jobs_there = offline_on.get(&at).copied().unwrap_or(0);
            let online_jobs = match held.online.get(&at) {
                Some(jobs) => jobs.clone(),
                // Held by a job muxflow does not manage: not ours to share.
                None if !idle_known || held.gpu_held.contains(&at) => continue,
                None => Vec::new(),
            };
            let owners = held
                .owners_on
                .get(&at)
                .map(|u| u.iter().cloned().collect())
                .unwrap_or_default();
            self.gpus.push(GpuState {
                node: n.name.clone(),
                index: p.index,
                owners,
                slots_used: used.get(&p.index).copied().unwrap_or(0).max(jobs_there),
                offline_jobs: jobs_there,
                online_jobs,
                published: p,
            });
        }
    }

    /// GPUs that may take a new offline job: Healthy, with fewer than
    /// `slots_per_gpu` (`[policy] offline_per_gpu`) offline jobs.
    pub fn open_gpus(&self, slots_per_gpu: u32) -> impl Iterator<Item = (usize, &GpuState)> {
        self.gpus.iter().enumerate().filter(move |(_, g)| {
            g.published.state == HealthState::Healthy && g.free_slots(slots_per_gpu) > 0
        })
    }
}

impl PendingJob {
    /// How scontrol names it: `<id>`, or `<id>_<task>` for an array's
    /// record of pending tasks (its first task alone).
    pub fn slurm_id(&self) -> String {
        match self.array_task {
            Some(t) => format!("{}_{t}", self.id),
            None => self.id.to_string(),
        }
    }

    pub fn owner(&self) -> Owner {
        Owner {
            user: self.user.clone(),
            account: self.account.clone(),
        }
    }
}

impl GpuState {
    /// Does this GPU's daemon serve only one user at a time, and is that
    /// what keeps `owner` off it? Only then: MPS would queue its clients
    /// behind the other user's (the rest is the site's `co_locate` rule).
    pub fn one_user_daemon_bars(&self, owner: &Owner) -> bool {
        !self.published.multiuser && self.owners.iter().any(|o| o.user != owner.user)
    }

    /// May a job of `owner` join the jobs on this GPU now: not queued by
    /// a one-user MPS daemon behind another user's clients, and within the
    /// site's `co_locate` rule? Always when nothing runs there.
    pub fn admits(&self, owner: &Owner, rule: CoLocate) -> bool {
        !self.one_user_daemon_bars(owner)
            && self.owners.iter().all(|o| match rule {
                CoLocate::Any => true,
                CoLocate::SameAccount => o.account == owner.account,
                CoLocate::SameUser => o.user == owner.user,
            })
    }

    /// Offline slots still free with `slots_per_gpu` per GPU.
    pub fn free_slots(&self, slots_per_gpu: u32) -> u32 {
        slots_per_gpu.saturating_sub(self.slots_used)
    }
}

fn node_unusable(n: &SinfoNode) -> bool {
    let bad = [
        "DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT",
    ];
    // 22.05 writes compound states such as `drained*` in one word.
    n.state.iter().any(|w| {
        let w = w.to_ascii_uppercase();
        bad.iter().any(|b| w.contains(b))
    }) || n
        .state_flags
        .iter()
        .any(|f| bad.contains(&f.to_ascii_uppercase().as_str()))
}

/// Most names one hostlist expands to: far beyond any cluster's node count,
/// and a bound on what a malformed list (many wide ranges) can cost.
pub const MAX_HOSTLIST_NAMES: usize = 100_000;

/// Expands a Slurm hostlist: `node[1-3,5],gpu7` → node1 node2 node3 node5
/// gpu7. At most [`MAX_HOSTLIST_NAMES`] names.
pub fn expand_hostlist(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let b = s.as_bytes();
    for i in 0..=b.len() {
        match b.get(i) {
            Some(b'[') => depth += 1,
            Some(b']') => depth -= 1,
            Some(b',') | None if depth == 0 => {
                let part = s[start..i].trim();
                start = i + 1;
                if part.is_empty() {
                    continue;
                }
                match part.split_once('[') {
                    Some((prefix, rest)) => {
                        let (ranges, suffix) = rest.split_once(']').unwrap_or((rest, ""));
                        for r in ranges.split(',') {
                            let (a, z) = r.split_once('-').unwrap_or((r, r));
                            let width = a.len();
                            if let (Ok(a), Ok(z)) = (a.parse::<u64>(), z.parse::<u64>()) {
                                let room = (MAX_HOSTLIST_NAMES - out.len()) as u64;
                                if room == 0 {
                                    return out;
                                }
                                for v in a..=z.min(a.saturating_add(room - 1)) {
                                    out.push(format!("{prefix}{v:0width$}{suffix}"));
                                }
                            }
                        }
                    }
                    None if out.len() < MAX_HOSTLIST_NAMES => out.push(part.to_string()),
                    None => return out,
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_requests_from_tres_req_str_in_slurms_units() {
        let need = |t: &str| {
            let n = tres_need(t);
            (n.cpus, n.mem_mib)
        };
        assert_eq!(need("cpu=1,mem=4000M,node=1,billing=1"), (1, 4000));
        assert_eq!(need("cpu=8,mem=16G,node=1,gres/gpu=2"), (8, 16_384));
        assert_eq!(need("cpu=2,mem=1T"), (2, 1_048_576));
        assert_eq!(need("cpu=2,mem=1025K"), (2, 2), "K rounds up");
        assert_eq!(need("cpu=2,mem=1.5G"), (2, 1536));
        assert_eq!(need("mem=300"), (0, 300), "no unit: MiB");
        assert_eq!(need(""), (0, 0), "nothing named: no limit");
        assert_eq!(need("cpu=x,mem=4Q"), (0, 0), "unreadable: no limit");
    }

    #[test]
    fn nothing_found_is_an_empty_listing_other_errors_fail() {
        let empty = r#"{"errors": [{"description": "Nothing found", "error": "Nothing found with query",
            "error_number": 9003, "source": "slurmdb_jobs_get"}], "jobs": []}"#;
        assert!(parse_sacct(empty).unwrap().is_empty());
        let bad = r#"{"errors": [{"error": "Unable to connect to database", "error_number": 7000}], "jobs": []}"#;
        assert!(matches!(parse_sacct(bad), Err(ReadError::Slurm { .. })));
    }

    #[test]
    fn null_fields_read_as_empty_and_keep_the_rest_of_the_listing() {
        let text = r#"{"errors": [], "jobs": [
            {"job_id": 99, "name": null, "user": null, "state": {"current": "COMPLETED"},
             "comment": {"administrator": "muxflow:v1 mode=offline steps_per_s=7"},
             "time": {"end": 1795335232}},
            {"job_id": 100, "name": "train", "user": "alice", "state": null,
             "comment": {"administrator": null}, "time": {"end": null}}
        ]}"#;
        let jobs = parse_sacct(text).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!((jobs[0].user.as_str(), jobs[0].name.as_str()), ("", ""));
        assert_eq!(jobs[0].time.end, 1795335232);
        assert!(jobs[1].state.current.is_empty());
        assert_eq!(jobs[1].time.end, 0);
    }

    /// One row per shape a field can take, in 22.05 and 24.11 output.
    #[test]
    fn states_and_numbers_in_both_slurm_shapes() {
        struct Case {
            name: &'static str,
            job: &'static str,
            state: &'static [&'static str],
            job_id: u32,
        }
        let cases = [
            Case {
                name: "22.05: state a string, id a number",
                job: r#"{"job_id": 7, "job_state": "RUNNING"}"#,
                state: &["RUNNING"],
                job_id: 7,
            },
            Case {
                name: "24.11: state an array with a flag",
                job: r#"{"job_id": 7, "job_state": ["RUNNING", "COMPLETING"]}"#,
                state: &["RUNNING", "COMPLETING"],
                job_id: 7,
            },
            Case {
                name: "24.11: a number as a set NO_VAL object",
                job: r#"{"job_id": {"set": true, "infinite": false, "number": 9}, "job_state": []}"#,
                state: &[],
                job_id: 9,
            },
            Case {
                name: "unset or infinite numbers and null states read as none",
                job: r#"{"job_id": {"set": false, "infinite": true, "number": 0}, "job_state": null}"#,
                state: &[],
                job_id: 0,
            },
            Case {
                name: "unknown fields of any shape are ignored",
                job: r#"{"job_id": 3, "job_state": "PENDING", "new": {"x": [1, {"y": null}]}, "power": {"flags": []}}"#,
                state: &["PENDING"],
                job_id: 3,
            },
        ];
        for c in cases {
            let text = format!(r#"{{"jobs": [{}], "errors": [], "warnings": []}}"#, c.job);
            let jobs = parse_squeue(&text).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert_eq!(jobs[0].job_state, c.state, "{}", c.name);
            assert_eq!(jobs[0].job_id, c.job_id, "{}", c.name);
        }
        // A field the reader types, in a shape neither version writes: an
        // error naming the listing, not a silent default.
        let e = parse_squeue(r#"{"jobs": [{"job_state": 5}]}"#).unwrap_err();
        assert!(e.to_string().starts_with("squeue --json: "), "{e}");
    }

    #[test]
    fn node_states_drained_in_either_shape_are_unusable() {
        let node = |json: &str| -> SinfoNode {
            parse_sinfo(&format!(r#"{{"nodes": [{json}]}}"#))
                .unwrap()
                .remove(0)
        };
        let cases = [
            (r#"{"state": "idle"}"#, false),
            (r#"{"state": "mixed", "state_flags": ["DRAIN"]}"#, true),
            (r#"{"state": "drained*"}"#, true),
            (r#"{"state": ["IDLE"]}"#, false),
            (r#"{"state": ["MIXED", "DRAIN"]}"#, true),
            (r#"{"state": ["DOWN", "NOT_RESPONDING"]}"#, true),
        ];
        for (json, unusable) in cases {
            assert_eq!(node_unusable(&node(json)), unusable, "{json}");
        }
    }

    #[test]
    fn a_pending_24_11_job_keeps_its_slot_hint() {
        let squeue = r#"{"jobs": [{"job_id": 12, "job_state": ["PENDING"], "state_reason": "JobHeldUser",
            "admin_comment": "muxflow:v1 mode=offline placed=n1:g1", "tres_per_node": "gres/mfslot:g1:1"}]}"#;
        let names = Names {
            offline_gres: "mfslot".into(),
        };
        let st = ClusterState::build(&parse_squeue(squeue).unwrap(), &[], &names);
        assert_eq!(st.pending[0].slot_gpus, vec![1]);
        assert!(st.pending[0].held);
    }

    #[test]
    fn dependencies_let_a_job_start_once_satisfied() {
        let cases = [
            ("", true),
            ("(null)", true),
            ("afterok:12(unfulfilled)", false),
            ("afterok:12(failed)", false),
            ("afterok:12(fulfilled),afterany:13(unfulfilled)", false),
            ("afterok:12(fulfilled),afterany:13(fulfilled)", true),
            ("afterok:12(unfulfilled)?afterok:13(fulfilled)", true),
            ("singleton(unfulfilled)", false),
        ];
        for (dep, ok) in cases {
            assert_eq!(dependency_satisfied(dep), ok, "{dep}");
        }
    }

    /// A requeued job's text is its run's report: the matcher's reason,
    /// then its placement, carry that run on (Slurm's accounting of the
    /// run keeps only where it was placed).
    #[test]
    fn the_matchers_texts_carry_a_requeued_jobs_runs_on() {
        let names = Names {
            offline_gres: "mfslot".into(),
        };
        let report =
            "muxflow:v1 mode=offline node=n4 gpu=0 sm_pct=80 run_s=7 requeued=1 partner=90 \
                      claim.launches=11180 peers=3";
        let j = SqueueJob {
            job_id: 5,
            job_state: vec!["PENDING".into()],
            state_reason: USER_HOLD.into(),
            state_description: "job requeued in held state".into(),
            admin_comment: report.into(),
            ..SqueueJob::default()
        };
        let comment = AdminComment::parse(&j.admin_comment).ok();
        let job = pending_job(&j, comment.as_ref(), &names, 0);
        assert_eq!(job.earlier.count, 1);
        let run1 =
            " runs_before=1 run1.node=n4 run1.gpu=0 run1.sm_pct=80 run1.partner=90 run1.run_s=7 \
                    run1.requeued=1 run1.claim.launches=11180";
        let note = crate::hints::note_args(&job, Waiting::BeginTime, "t", 60, false).unwrap();
        assert!(note[3].ends_with(run1), "{note:?}");
        let target = crate::hints::Target::Gpus {
            node: "n2".into(),
            gpus: vec![1],
            slots: vec![1],
        };
        let calls = crate::hints::update_args(&job, &target, &names).unwrap();
        assert!(
            calls[0].contains(&format!(
                "AdminComment=muxflow:v1 mode=offline placed=n2:g1{run1}"
            )),
            "{calls:?}"
        );
        // Read back from the note, the next text carries the same run.
        let noted = SqueueJob {
            admin_comment: note[3].strip_prefix("AdminComment=").unwrap().into(),
            ..j
        };
        let comment = AdminComment::parse(&noted.admin_comment).ok();
        assert_eq!(
            pending_job(&noted, comment.as_ref(), &names, 0).earlier,
            job.earlier
        );
    }

    /// A user-level hold is its owner's only beside a placement, and not
    /// when muxflow's own requeue-hold (the Prolog's refusal) made it.
    #[test]
    fn a_user_hold_is_told_from_parking_and_requeue_holds() {
        let job = |reason: &str, desc: &str, comment: &str| SqueueJob {
            job_id: 5,
            job_state: vec!["PENDING".into()],
            state_reason: reason.into(),
            state_description: desc.into(),
            admin_comment: comment.into(),
            ..SqueueJob::default()
        };
        let cases = [
            (
                "parked at submit",
                job(USER_HOLD, "", "muxflow:v1 mode=offline"),
                None,
            ),
            (
                "held by its owner once placed",
                job(USER_HOLD, "", "muxflow:v1 mode=offline placed=n1:g0"),
                Some(Unstartable::UserHold),
            ),
            (
                "requeued held by the Prolog",
                job(
                    USER_HOLD,
                    "job requeued in held state",
                    "muxflow:v1 mode=offline placed=n1:g0 refused=not_placed",
                ),
                None,
            ),
            (
                "parked by the matcher",
                job(ADMIN_HOLD, "", "muxflow:v1 mode=offline waiting=free_gpu"),
                None,
            ),
        ];
        let names = Names::from_config(&muxflow::config::Slurm::default());
        for (name, j, want) in cases {
            let st = ClusterState::build_at(&[j], &[], &names, 0);
            assert_eq!(st.pending[0].unstartable, want, "{name}");
        }
    }

    #[test]
    fn gres_strings() {
        let v = parse_gres("gpu:2(IDX:0-1),mfslot:g0:0(IDX:N/A),mfslot:g1:1(IDX:1)");
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].indices, vec![0, 1]);
        assert_eq!(v[1].count, 0);
        assert_eq!(v[2].kind.as_deref(), Some("g1"));
        assert_eq!(v[2].indices, vec![1]);
        let v = parse_gres("gres:mfslot:g1:1,gres:mfslot:g0:0");
        assert_eq!((v[0].kind.as_deref(), v[0].count), (Some("g1"), 1));
        let v = parse_gres("gres/mfslot:g1:1,gres/gpu:2");
        assert_eq!((v[0].kind.as_deref(), v[0].count), (Some("g1"), 1));
        assert_eq!((v[1].name.as_str(), v[1].count), ("gpu", 2));
        let v = parse_gres("gpu:4(IDX:0,2-3)");
        assert_eq!(v[0].indices, vec![0, 2, 3]);
        assert_eq!(parse_gres("gres:mfslot:1")[0].kind, None);
        assert!(parse_gres("").is_empty());
    }

    #[test]
    fn idle_gpus_are_those_no_running_job_holds() {
        let extra = "muxflow:v1 gpu0.state=healthy gpu0.mem_mib=81559 gpu1.state=healthy gpu1.mem_mib=81559";
        let node = |name: &str, used: &str| SinfoNode {
            name: name.into(),
            state: vec!["MIXED".into()],
            extra: extra.into(),
            gres_used: used.into(),
            ..SinfoNode::default()
        };
        let running = |id: u32, node: &str, comment: &str, detail: &str| SqueueJob {
            job_id: id,
            job_state: vec!["RUNNING".into()],
            nodes: node.into(),
            admin_comment: comment.into(),
            gres_detail: vec![detail.into()],
            ..SqueueJob::default()
        };
        let jobs = [
            running(1, "a", "muxflow:v1 mode=online", "gpu:1(IDX:0)"),
            // A plain GPU job (no muxflow): its GPU is not idle.
            running(2, "b", "", "gpu:1(IDX:1)"),
            // node c counts a GPU in use that no job names: nothing idle there.
        ];
        let nodes = [
            node("a", "gpu:1,mfslot:g0:0(IDX:N/A),mfslot:g1:0(IDX:N/A)"),
            node("b", "gpu:1,mfslot:g0:0(IDX:N/A),mfslot:g1:0(IDX:N/A)"),
            node("c", "gpu:1,mfslot:g0:0(IDX:N/A),mfslot:g1:0(IDX:N/A)"),
            node("d", "gpu:0,mfslot:g0:0(IDX:N/A),mfslot:g1:1(IDX:1)"),
        ];
        let names = Names::from_config(&muxflow::config::Slurm::default());
        let st = ClusterState::build(&jobs, &nodes, &names);
        let got: Vec<(&str, u32, bool, u32)> = st
            .gpus
            .iter()
            .map(|g| {
                (
                    g.node.as_str(),
                    g.index,
                    g.online_jobs.is_empty(),
                    g.slots_used,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", 0, false, 0),
                ("a", 1, true, 0),
                ("b", 0, true, 0),
                ("d", 0, true, 0),
                ("d", 1, true, 1),
            ]
        );
        let open: Vec<_> = st
            .open_gpus(1)
            .map(|(_, g)| (g.node.as_str(), g.index))
            .collect();
        assert_eq!(open, [("a", 0), ("a", 1), ("b", 0), ("d", 0)]);
    }

    #[test]
    fn two_offline_jobs_on_one_gpu_count_as_two_slots() {
        // offline_per_gpu = 2 on the dev cluster's pattern (etc/gres.conf:
        // the g0 line twice): the jobs hold records IDX 0 and 1 of type g0.
        let squeue = r#"{"jobs": [
            {"job_id": 1, "job_state": "RUNNING", "nodes": "n1", "admin_comment": "muxflow:v1 mode=online", "gres_detail": ["gpu:1(IDX:0)"]},
            {"job_id": 2, "job_state": "RUNNING", "nodes": "n1", "admin_comment": "muxflow:v1 mode=offline placed=n1:g0", "gres_detail": ["mfslot:g0:1(IDX:0)"]},
            {"job_id": 3, "job_state": "RUNNING", "nodes": "n1", "admin_comment": "muxflow:v1 mode=offline placed=n1:g0", "gres_detail": ["mfslot:g0:1(IDX:1)"]},
            {"job_id": 4, "job_state": "RUNNING", "nodes": "n1", "admin_comment": "muxflow:v1 mode=offline placed=n1:g1", "gres_detail": ["mfslot:g1:1(IDX:2)"]}
        ]}"#;
        let sinfo = r#"{"nodes": [{"name": "n1", "state": "mixed",
            "extra": "muxflow:v1 gpu0.state=healthy gpu0.mem_mib=81559 gpu1.state=healthy gpu1.mem_mib=81559",
            "gres_used": "gpu:1(IDX:0),mfslot:g0:2(IDX:0-1),mfslot:g1:1(IDX:2)"}]}"#;
        let names = Names::from_config(&muxflow::config::Slurm::default());
        let jobs = parse_squeue(squeue).unwrap();
        let st = ClusterState::build(&jobs, &parse_sinfo(sinfo).unwrap(), &names);
        let used: Vec<(u32, u32)> = st.gpus.iter().map(|g| (g.index, g.slots_used)).collect();
        assert_eq!(used, [(0, 2), (1, 1)]);
        assert_eq!(
            st.running_offline,
            [
                (2, "n1".into(), 0),
                (3, "n1".into(), 0),
                (4, "n1".into(), 1)
            ]
        );
        let open = |n| st.open_gpus(n).map(|(_, g)| g.index).collect::<Vec<_>>();
        assert_eq!(open(1), Vec::<u32>::new(), "one slot per GPU: both full");
        assert_eq!(open(2), [1], "two: GPU 1 has one free");
        assert_eq!(open(3), [0, 1]);
        // A node listing that counts fewer (an older gres_used) does not
        // hide the jobs squeue names on the GPU.
        let sinfo_short = sinfo.replace("mfslot:g0:2(IDX:0-1)", "mfslot:g0:1(IDX:0)");
        let st = ClusterState::build(&jobs, &parse_sinfo(&sinfo_short).unwrap(), &names);
        assert_eq!(st.gpus[0].slots_used, 2);
    }

    #[test]
    fn a_jobs_gpu_count_comes_from_its_record_or_its_typed_slots() {
        let gpus_of = |text: &str| job_gpus(AdminComment::parse(text).ok().as_ref());
        assert_eq!(gpus_of("muxflow:v1 mode=offline gpus=2"), 2);
        assert_eq!(gpus_of("muxflow:v1 mode=offline gpus=2 placed=n:g0,g1"), 2);
        assert_eq!(gpus_of("muxflow:v1 mode=offline"), 1, "absent: one");
        assert_eq!(
            gpus_of("muxflow:v1 mode=offline gpus=x"),
            1,
            "unreadable: one"
        );
        assert_eq!(gpus_of("gpus=4"), 1, "not muxflow's record");
        assert_eq!(gpus_of("muxflow:v1 mode=offline gpus=100000"), MAX_JOB_GPUS);
        // The Prolog's refusal dropped the count; Slurm kept both typed slots.
        let pending = SqueueJob {
            job_id: 3,
            job_state: vec!["PENDING".into()],
            admin_comment: "muxflow:v1 mode=offline refused=gpu_busy".into(),
            tres_per_node: "gres:mfslot:g1:1,gres:mfslot:g0:1".into(),
            state_reason: "JobHeldAdmin".into(),
            ..SqueueJob::default()
        };
        let names = Names::from_config(&muxflow::config::Slurm::default());
        let st = ClusterState::build(&[pending], &[], &names);
        assert_eq!(
            (st.pending[0].gpus, &st.pending[0].slot_gpus[..]),
            (2, &[0, 1][..])
        );
    }

    #[test]
    fn hostlists() {
        assert_eq!(
            expand_hostlist("node[1-3,05],gpu7"),
            ["node1", "node2", "node3", "node05", "gpu7"]
        );
        assert_eq!(expand_hostlist("node2"), ["node2"]);
        assert!(expand_hostlist("").is_empty());
        // Many wide ranges (found by fuzzing the reader): bounded, in order.
        let wide = format!("n[{}]", vec!["0-99999"; 50].join(","));
        let names = expand_hostlist(&wide);
        assert_eq!(names.len(), MAX_HOSTLIST_NAMES);
        assert_eq!(
            (names[0].as_str(), names[99_999].as_str()),
            ("n0", "n99999")
        );
    }
}
