//! A job's sharing figures in its AdminComment, so `sacct -o JobID,AdminComment`
//! shows them and the matcher learns from them:
//!
//! ```text
//! muxflow:v1 mode=offline node=node3 gpu=0 sm_pct=40 mem_cap_mib=60000 partner=12 measured_peak_mib=2050 run_s=540 claim.launches=52000 claim.delayed=1200 claim.delay_ms=830 claim.oom=0 claim.peak_mib=2048 claim.steps=788 claim.steps_per_s=98.4
//! ```
//!
//! Two kinds of figures, told apart by their keys:
//! * what the node decided or measured itself (root, nothing the job can
//!   write): `mode node gpu sm_pct mem_cap_mib partner measured_peak_mib
//!   policed run_s partner_load_pct partner_sm_pct peers`;
//! * the job's own claims, `claim.*`: read from files in the job's stats
//!   directory, which its user can write (xCUDA runs inside the job's
//!   process; the workload writes `$MUXFLOW_JOB_REPORT`). Each is bounded
//!   ([`claim_bound`]); a value out of bounds is left out and its key listed
//!   in `claims_refused`.
//!
//! | key | meaning |
//! |---|---|
//! | mode | online or offline |
//! | node, gpu | where it ran (GPU index on the node) |
//! | sm_pct | offline: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE it got |
//! | mem_cap_mib | offline: its GPU memory cap |
//! | partner | the online job it shared the GPU with (offline), or an offline job it hosted (online) |
//! | measured_peak_mib | offline: the largest GPU memory NVML showed for its processes, at muxflow-police's checks and the health steps |
//! | policed | offline: why the node terminated a process of it (codes of `muxflow-health`'s police, comma-separated) |
//! | enforced_by | offline: who held its limits, `mem:<who>,sm:<who>` with who one of driver (an MPS static SM partition or MPS v3 namespace), kernel (cgroup `dmem.max`), xcuda (xCUDA and MPS's client variables, policed), policed (docs/security.md, "Who enforces each limit") |
//! | terminated_by_other | how many of its MPS clients a `terminate_client` muxflow did not send ended (NVIDIA's daemon takes it from any user on the node; the sender is not known) |
//! | run_s | seconds from the batch step's start to this report, by the node's clock (turns `claim.launches` into launches/s) |
//! | requeued | `1`: an online job's Prolog requeued this run (it needed the GPU) |
//! | partner_load_pct | offline: the online partner's mean SM utilization while this run ran, percent of the largest seen in the run (muxflow-police samples NVML's per-process utilization every check; [`Measured`]) |
//! | partner_sm_pct | offline: the online partner's mean SM utilization while this run ran, percent of the GPU (the same samples): read against the partner's busiest runs, it says how loaded the partner was, which the within-run figure cannot for a run at a steady load |
//! | peers | offline: the other offline jobs that shared one of its GPUs (`[policy] offline_per_gpu` > 1), job ids, comma-separated, at most [`MAX_PEERS`]: those recorded on the GPU at its start, at muxflow-police's checks and at this report |
//! | claim.launches, claim.delayed, claim.delay_ms | xCUDA: kernel launches, launches it delayed, total delay |
//! | claim.oom, claim.peak_mib | xCUDA: allocations refused by the cap, peak GPU memory |
//! | claim.steps, claim.steps_per_s | the workload's training steps, if it reports them |
//! | claim.requests, claim.rps, claim.p50_ms, claim.p99_ms | the workload's served requests and latency, if it reports them |
//! | claims_refused | claims left out for being out of bounds |
//! | gpus | a k-GPU offline job (tag `muxflow:v2`): its GPUs in order; the first one's figures are the keys above |
//! | g\<i\>.sm_pct, g\<i\>.mem_cap_mib, g\<i\>.partner | the same for each further GPU `i` of a k-GPU job |
//! | runs_before, run\<n\>.\<key\> | a requeued job's earlier runs and the figures kept of each ([`crate::records::runs`]) |
//!
//! Every key but `mode` is optional; unknown keys are ignored when reading, so
//! newer writers stay readable. Records written before the `claim.` prefix
//! (the same keys without it) are read as claims: they were.

use std::collections::BTreeMap;

use crate::records::admin_comment::{key, AdminComment, AdminCommentError, TAG, TAG_V2};
use crate::records::kv::{self, Fields, KvError};
use crate::records::runs::EarlierRuns;
use crate::Mode;

/// Most GPUs of one job a record carries figures for.
pub const MAX_GANG_GPUS: usize = 64;

/// Most offline peers a record names (4 slots per GPU at most; peers come
/// and go during a run).
pub const MAX_PEERS: usize = 16;

/// A comma-separated list of ids under `key`, at most `max` of them read.
fn id_list(key: &str, list: &str, max: usize) -> Result<Vec<u32>, KvError> {
    list.split(',')
        .take(max)
        .map(|id| {
            id.parse().map_err(|_| KvError::BadValue {
                key: key.into(),
                value: list.into(),
                why: "not a comma-separated list of numbers".into(),
            })
        })
        .collect()
}

/// A `peers` list as written (sorted, comma-separated).
pub fn format_peers(peers: &[u32]) -> String {
    let ids: Vec<String> = peers.iter().map(u32::to_string).collect();
    ids.join(",")
}

/// A `peers` list read leniently (root's own files): sorted, at most
/// [`MAX_PEERS`]; unreadable reads as none.
pub fn parse_peers(list: &str) -> Vec<u32> {
    let mut peers = id_list("peers", list, MAX_PEERS).unwrap_or_default();
    add_peers(&mut peers, None, []);
    peers
}

/// Adds `more` to `peers`, leaving out `own` (the job itself): sorted,
/// without duplicates, at most [`MAX_PEERS`] kept.
pub fn add_peers(peers: &mut Vec<u32>, own: Option<u32>, more: impl IntoIterator<Item = u32>) {
    peers.extend(more.into_iter().filter(|&p| Some(p) != own));
    peers.sort_unstable();
    peers.dedup();
    peers.truncate(MAX_PEERS);
}

/// One further GPU of a k-GPU job (the first is the record's `gpu`,
/// `sm_pct`, `mem_cap_mib`, `partner`): what the policy gave the job's
/// task there and the online job it shared that GPU with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GangGpu {
    pub gpu: u32,
    pub sm_pct: Option<u8>,
    pub mem_cap_mib: Option<u64>,
    pub partner: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobReport {
    pub mode: Option<Mode>,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub sm_pct: Option<u8>,
    pub mem_cap_mib: Option<u64>,
    pub partner: Option<u32>,
    /// Measured by the node (NVML, per process).
    pub measured_peak_mib: Option<u64>,
    /// Codes of the node's terminations, comma-separated.
    pub policed: Option<String>,
    /// Who enforced its memory cap and SM share (`mem:kernel,sm:xcuda`).
    pub enforced_by: Option<String>,
    /// Its MPS clients ended by a `terminate_client` muxflow did not send.
    pub terminated_by_other: Option<u32>,
    /// Seconds the batch step ran until the report, by the node's clock.
    pub run_s: Option<u64>,
    /// The online partner's mean load during the run, percent of its peak.
    pub partner_load_pct: Option<u8>,
    /// The online partner's mean SM utilization during the run, percent
    /// of the GPU.
    pub partner_sm_pct: Option<u8>,
    /// Other offline jobs that shared one of its GPUs, sorted.
    pub peers: Vec<u32>,
    // The job's claims (`claim.*`), bounded.
    pub launches: Option<u64>,
    pub delayed: Option<u64>,
    pub delay_ms: Option<u64>,
    pub oom: Option<u64>,
    pub peak_mib: Option<u64>,
    pub steps: Option<u64>,
    pub steps_per_s: Option<f64>,
    pub requests: Option<u64>,
    pub rps: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Claims left out for being out of bounds, comma-separated keys.
    pub claims_refused: Option<String>,
    /// A k-GPU job's GPUs after the first, in order ([`TAG_V2`] records).
    pub gang: Vec<GangGpu>,
    /// An online job's Prolog requeued this run (the node set its latest
    /// release: `requeued=1`).
    pub requeued: bool,
    /// A requeued job's runs before this one ([`crate::records::runs`]).
    pub earlier: EarlierRuns,
}

/// The key of [`JobReport::requeued`].
const REQUEUED: &str = "requeued";

/// The largest value a claim may have. Far above anything real (a GPU of
/// 1 TiB, 10^15 launches, a million steps or requests per second), far
/// below what would overflow a reader or drown the predictor.
pub fn claim_bound(key: &str) -> Option<f64> {
    Some(match key {
        "launches" | "delayed" | "oom" | "steps" | "requests" | "released" => 1e15,
        "delay_ms" => 1e15,
        "peak_mib" => (1u64 << 20) as f64,
        "steps_per_s" | "rps" => 1e6,
        "p50_ms" | "p99_ms" => 1e7,
        _ => return None,
    })
}

/// A claimed integer: Some when it is a whole number within its bound.
pub fn claim_u64(key: &str, raw: &str) -> Option<u64> {
    let v: u64 = raw.trim().parse().ok()?;
    (v as f64 <= claim_bound(key)?).then_some(v)
}

/// A claimed number: Some when finite, not negative, within its bound, and
/// written in at most 32 characters.
pub fn claim_f64(key: &str, raw: &str) -> Option<f64> {
    let raw = raw.trim();
    if raw.len() > 32 {
        return None;
    }
    let v: f64 = raw.parse().ok()?;
    (v.is_finite() && v >= 0.0 && v <= claim_bound(key)?).then_some(v)
}

/// The last complete `key=value` line of a file the job wrote (a workload
/// may append several); words without `=` are skipped. None when there is
/// no such line or it does not parse.
pub fn last_kv_line(text: &str) -> Option<BTreeMap<String, String>> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let words: Vec<&str> = line
        .split_whitespace()
        .filter(|w| w.contains('='))
        .collect();
    kv::parse(&words.join(" ")).ok()
}

/// What the node's programs measured of an offline job, from the
/// root-owned `<state_dir>/limits/<job>.measured` line that muxflow-police
/// and the health steps keep: `peak_mib`, the online partner's SM
/// utilization samples (`load_n`, `load_sum`, `load_max`, percent of the
/// GPU), and the other offline jobs seen on its GPUs (`peers`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Measured {
    pub peak_mib: Option<u64>,
    /// Mean partner utilization over the largest sample, percent; None
    /// without samples, or when the partner never used the GPU.
    pub partner_load_pct: Option<u8>,
    /// Mean partner utilization, percent of the GPU; None without samples.
    pub partner_sm_pct: Option<u8>,
    /// Sorted; an unreadable list reads as none.
    pub peers: Vec<u32>,
}

impl Measured {
    pub fn parse(text: &str) -> Measured {
        let Ok(map) = kv::parse(text.trim()) else {
            return Measured::default();
        };
        let num = |k: &str| -> Option<u64> { map.get(k)?.parse().ok() };
        let load = match (num("load_n"), num("load_sum"), num("load_max")) {
            (Some(n), Some(sum), Some(max)) if n > 0 && max > 0 => {
                let mean = sum as f64 / n as f64;
                Some((100.0 * mean / max as f64).round().min(100.0) as u8)
            }
            _ => None,
        };
        let sm = match (num("load_n"), num("load_sum")) {
            (Some(n), Some(sum)) if n > 0 => Some((sum as f64 / n as f64).round().min(100.0) as u8),
            _ => None,
        };
        Measured {
            peak_mib: num("peak_mib"),
            partner_load_pct: load,
            partner_sm_pct: sm,
            peers: map.get("peers").map_or_else(Vec::new, |l| parse_peers(l)),
        }
    }
}

/// Most entries of a job's stats directory looked at: the job's user can
/// fill it with files, and root reads it.
pub const MAX_CLAIM_FILES: usize = 1024;

/// The claim files of a job's stats directory (`xcuda.<pid>`, `job.report`)
/// as `(name, text)`, read as root from a directory the job's user can
/// write: no symlinks, no FIFOs (O_NONBLOCK and a regular-file check), at
/// most 4 KiB each, at most [`MAX_CLAIM_FILES`] entries scanned.
pub fn read_claim_files(dir: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .take(MAX_CLAIM_FILES)
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("xcuda.") && name != "job.report" {
                return None;
            }
            Some((name, read_user_file(&entry.path())?))
        })
        .collect()
}

/// xCUDA's stats file of process `pid` in a job's stats directory.
pub fn xcuda_stats_file(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    dir.join(format!("xcuda.{pid}"))
}

/// The key of xCUDA's stats line that names the process writing it by its
/// start (`/proc/<pid>/stat`'s starttime, clock ticks since boot). xCUDA
/// writes the file from its start-up on, so a process whose file names its
/// own start ran that start-up; a process that only maps the library (or a
/// later process given the same pid) has no such file.
pub const XCUDA_STARTED_KEY: &str = "started";

/// Whether `<dir>/xcuda.<pid>` says xCUDA's start-up ran in process `pid`
/// that started at `start_ticks`. The file is the job's user's to write
/// (read as [`read_claim_files`] reads them): it tells a process that runs
/// xCUDA from one that maps it, not from one that forges its file.
pub fn xcuda_started(dir: &std::path::Path, pid: u32, start_ticks: u64) -> bool {
    read_user_file(&xcuda_stats_file(dir, pid)).and_then(|t| {
        last_kv_line(&t)?
            .get(XCUDA_STARTED_KEY)?
            .parse::<u64>()
            .ok()
    }) == Some(start_ticks)
}

fn read_user_file(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(4096).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReportError {
    #[error(transparent)]
    Comment(#[from] AdminCommentError),
    #[error("AdminComment: {0}")]
    Kv(#[from] KvError),
    #[error("AdminComment: mode is missing")]
    NoMode,
}

impl JobReport {
    pub fn encode(&self) -> String {
        let tag = if self.gang.is_empty() { TAG } else { TAG_V2 };
        let mut w = kv::Writer::new().tag(tag);
        w.push_opt(key::MODE, self.mode);
        self.push_figures(&mut w, "");
        self.earlier.push(&mut w);
        w.finish()
    }

    /// Every figure but `mode` and the earlier runs, each key after
    /// `prefix` (an earlier run's `run<n>.`, [`crate::records::runs`]).
    pub(crate) fn push_figures(&self, w: &mut kv::Writer, prefix: &str) {
        let k = |key: &str| format!("{prefix}{key}");
        w.push_opt(&k("node"), self.node.as_deref())
            .push_opt(&k("gpu"), self.gpu)
            .push_opt(&k("sm_pct"), self.sm_pct)
            .push_opt(&k("mem_cap_mib"), self.mem_cap_mib)
            .push_opt(&k("partner"), self.partner)
            .push_opt(&k("measured_peak_mib"), self.measured_peak_mib)
            .push_opt(&k("policed"), self.policed.as_deref())
            .push_opt(&k("terminated_by_other"), self.terminated_by_other)
            .push_opt(&k("run_s"), self.run_s)
            .push_opt(&k(REQUEUED), self.requeued.then_some(1))
            .push_opt(&k("partner_load_pct"), self.partner_load_pct)
            .push_opt(&k("partner_sm_pct"), self.partner_sm_pct)
            .push_opt(
                &k("peers"),
                (!self.peers.is_empty()).then(|| format_peers(&self.peers)),
            )
            .push_opt(&k("claim.launches"), self.launches)
            .push_opt(&k("claim.delayed"), self.delayed)
            .push_opt(&k("claim.delay_ms"), self.delay_ms)
            .push_opt(&k("claim.oom"), self.oom)
            .push_opt(&k("claim.peak_mib"), self.peak_mib)
            .push_opt(&k("claim.steps"), self.steps)
            .push_opt(
                &k("claim.steps_per_s"),
                self.steps_per_s.filter(|v| v.is_finite()),
            )
            .push_opt(&k("claim.requests"), self.requests)
            .push_opt(&k("claim.rps"), self.rps.filter(|v| v.is_finite()))
            .push_opt(&k("claim.p50_ms"), self.p50_ms.filter(|v| v.is_finite()))
            .push_opt(&k("claim.p99_ms"), self.p99_ms.filter(|v| v.is_finite()))
            .push_opt(&k("claims_refused"), self.claims_refused.as_deref())
            .push_opt(&k("enforced_by"), self.enforced_by.as_deref());
        if !self.gang.is_empty() {
            let gpus: Vec<String> = self
                .gpu
                .into_iter()
                .chain(self.gang.iter().map(|g| g.gpu))
                .map(|g| g.to_string())
                .collect();
            w.push(&k(key::GPUS), gpus.join(","));
            for g in self.gang.iter().take(MAX_GANG_GPUS) {
                let i = g.gpu;
                w.push_opt(&k(&format!("g{i}.sm_pct")), g.sm_pct)
                    .push_opt(&k(&format!("g{i}.mem_cap_mib")), g.mem_cap_mib)
                    .push_opt(&k(&format!("g{i}.partner")), g.partner);
            }
        }
    }

    /// The report in a job's AdminComment (one parse: [`AdminComment`]).
    pub fn decode(text: &str) -> Result<JobReport, ReportError> {
        AdminComment::parse(text)?.report()
    }

    /// The report in an AdminComment's words ([`AdminComment::report`]).
    pub(crate) fn from_fields(map: &BTreeMap<String, String>) -> Result<JobReport, ReportError> {
        let mode = Fields(map).get(key::MODE)?.ok_or(ReportError::NoMode)?;
        Ok(JobReport {
            mode: Some(mode),
            earlier: EarlierRuns::read(map)?,
            ..JobReport::read_figures(map, "")?
        })
    }

    /// The figures [`JobReport::push_figures`] wrote after `prefix`
    /// (without `mode` and the earlier runs).
    pub(crate) fn read_figures(
        map: &BTreeMap<String, String>,
        prefix: &str,
    ) -> Result<JobReport, KvError> {
        let f = Fields(map);
        let k = |key: &str| format!("{prefix}{key}");
        // A claim under its `claim.` key, or under the bare key of records
        // written before the prefix.
        let claim_key = |key: &'static str| -> String {
            let prefixed = k(&format!("claim.{key}"));
            if map.contains_key(&prefixed) {
                prefixed
            } else {
                k(key)
            }
        };
        let claim = |key: &'static str| -> Result<Option<u64>, KvError> { f.get(&claim_key(key)) };
        let finite = |key: &'static str| -> Result<Option<f64>, KvError> {
            let key = claim_key(key);
            match f.get::<f64>(&key)? {
                Some(v) if !v.is_finite() => Err(KvError::BadValue {
                    key,
                    value: v.to_string(),
                    why: "not a finite number".into(),
                }),
                v => Ok(v),
            }
        };
        let mut r = JobReport {
            mode: None,
            node: f.get(&k("node"))?,
            gpu: f.get(&k("gpu"))?,
            sm_pct: f.get(&k("sm_pct"))?,
            mem_cap_mib: f.get(&k("mem_cap_mib"))?,
            partner: f.get(&k("partner"))?,
            measured_peak_mib: f.get(&k("measured_peak_mib"))?,
            policed: f.get(&k("policed"))?,
            enforced_by: f.get(&k("enforced_by"))?,
            terminated_by_other: f.get(&k("terminated_by_other"))?,
            run_s: f.get(&k("run_s"))?,
            partner_load_pct: f.get(&k("partner_load_pct"))?,
            partner_sm_pct: f.get(&k("partner_sm_pct"))?,
            launches: claim("launches")?,
            delayed: claim("delayed")?,
            delay_ms: claim("delay_ms")?,
            oom: claim("oom")?,
            peak_mib: claim("peak_mib")?,
            steps: claim("steps")?,
            steps_per_s: finite("steps_per_s")?,
            requests: claim("requests")?,
            rps: finite("rps")?,
            p50_ms: finite("p50_ms")?,
            p99_ms: finite("p99_ms")?,
            claims_refused: f.get(&k("claims_refused"))?,
            requeued: f.get::<u8>(&k(REQUEUED))? == Some(1),
            peers: match map.get(&k("peers")) {
                Some(list) => {
                    let mut p = id_list(&k("peers"), list, MAX_PEERS)?;
                    add_peers(&mut p, None, []);
                    p
                }
                None => Vec::new(),
            },
            gang: Vec::new(),
            earlier: EarlierRuns::default(),
        };
        let gpus_key = k(key::GPUS);
        if let Some(list) = map.get(&gpus_key) {
            let gpus = id_list(&gpus_key, list, MAX_GANG_GPUS + 1)?;
            let mut seen = std::collections::BTreeSet::new();
            if let Some(dup) = gpus.iter().find(|g| !seen.insert(**g)) {
                return Err(KvError::BadValue {
                    key: gpus_key,
                    value: list.clone(),
                    why: format!("names GPU {dup} twice"),
                });
            }
            // The list starts with the record's own GPU.
            match (r.gpu, gpus.first()) {
                (None, first) => r.gpu = first.copied(),
                (Some(g), Some(&first)) if g != first => {
                    return Err(KvError::BadValue {
                        key: gpus_key,
                        value: list.clone(),
                        why: format!("does not start with the record's gpu={g}"),
                    })
                }
                _ => {}
            }
            for &gpu in gpus.iter().skip(1) {
                r.gang.push(GangGpu {
                    gpu,
                    sm_pct: f.get(&k(&format!("g{gpu}.sm_pct")))?,
                    mem_cap_mib: f.get(&k(&format!("g{gpu}.mem_cap_mib")))?,
                    partner: f.get(&k(&format!("g{gpu}.partner")))?,
                });
            }
        }
        Ok(r)
    }
}

impl JobReport {
    /// Adds what the job's own files claim, each figure bounded: xCUDA's
    /// per-process counters (`xcuda.<pid>`: summed; the peak is the largest)
    /// and the workload's `job.report`. Files are `(name, text)`; other names
    /// are ignored. Out-of-bounds figures are left out and their keys listed
    /// in `claims_refused`.
    pub fn add_claims<'a>(&mut self, files: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut refused: Vec<&'static str> = Vec::new();
        let mut peak_bytes: Option<u64> = None;
        let mut delay_us: Option<u64> = None;
        for (name, text) in files {
            let is_xcuda = name.starts_with("xcuda.");
            if !is_xcuda && name != "job.report" {
                continue;
            }
            let Some(map) = last_kv_line(text) else {
                continue;
            };
            let mut int = |key: &'static str, bound_key: &'static str| -> Option<u64> {
                let raw = map.get(key)?;
                let v = claim_u64(bound_key, raw);
                if v.is_none() && !refused.contains(&bound_key) {
                    refused.push(bound_key);
                }
                v
            };
            if is_xcuda {
                let add = |acc: Option<u64>, v: Option<u64>| match (acc, v) {
                    (a, None) => a,
                    (None, Some(v)) => Some(v),
                    (Some(a), Some(v)) => Some(a.saturating_add(v)),
                };
                self.launches = add(self.launches, int("launches", "launches"));
                self.delayed = add(self.delayed, int("delayed", "delayed"));
                self.oom = add(self.oom, int("oom", "oom"));
                // Microseconds, bounded as the milliseconds they become.
                delay_us = add(delay_us, int("delay_us", "delay_ms"));
                let peak = map
                    .get("peak_bytes")
                    .and_then(|b| b.trim().parse::<u64>().ok());
                match peak.map(|b| b >> 20) {
                    Some(mib) if claim_u64("peak_mib", &mib.to_string()).is_some() => {
                        peak_bytes = peak_bytes.max(peak);
                    }
                    None if !map.contains_key("peak_bytes") => {}
                    _ => {
                        if !refused.contains(&"peak_mib") {
                            refused.push("peak_mib");
                        }
                    }
                }
            } else {
                self.steps = int("steps", "steps");
                self.requests = int("requests", "requests");
                let mut float = |key: &'static str| -> Option<f64> {
                    let raw = map.get(key)?;
                    let v = claim_f64(key, raw);
                    if v.is_none() && !refused.contains(&key) {
                        refused.push(key);
                    }
                    v
                };
                self.steps_per_s = float("steps_per_s");
                self.rps = float("rps");
                self.p50_ms = float("p50_ms");
                self.p99_ms = float("p99_ms");
            }
        }
        // (Sums over a job's processes saturate rather than wrap.)
        self.delay_ms = delay_us.map(|us| us / 1000);
        self.peak_mib = peak_bytes.map(|b| b >> 20);
        if !refused.is_empty() {
            self.claims_refused = Some(refused.join(","));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn xcuda_started_only_where_its_file_names_the_process_start() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        std::fs::write(
            super::xcuda_stats_file(dir, 42),
            "launches=0 delayed=0 started=777\n",
        )
        .unwrap();
        std::fs::write(super::xcuda_stats_file(dir, 43), "launches=5\n").unwrap();
        std::os::unix::fs::symlink(
            super::xcuda_stats_file(dir, 42),
            super::xcuda_stats_file(dir, 44),
        )
        .unwrap();
        // (what, pid, its start, started?)
        let rows = [
            ("its file names its start", 42, 777, true),
            ("a later process given the same pid", 42, 900, false),
            ("a file without the start (an older xCUDA)", 43, 777, false),
            ("no file: the library mapped, never started", 45, 777, false),
            ("a link to another process's file", 44, 777, false),
        ];
        for (what, pid, start, started) in rows {
            assert_eq!(super::xcuda_started(dir, pid, start), started, "{what}");
        }
    }

    use super::*;

    fn full() -> JobReport {
        JobReport {
            mode: Some(Mode::Offline),
            node: Some("node3".into()),
            gpu: Some(0),
            sm_pct: Some(40),
            mem_cap_mib: Some(60000),
            partner: Some(12),
            measured_peak_mib: Some(2050),
            policed: Some("priority,no_xcuda".into()),
            enforced_by: Some("mem:kernel,sm:driver".into()),
            terminated_by_other: Some(1),
            run_s: Some(600),
            partner_load_pct: Some(40),
            partner_sm_pct: Some(22),
            launches: Some(52000),
            delayed: Some(1200),
            delay_ms: Some(830),
            oom: Some(0),
            peak_mib: Some(2048),
            steps: Some(788),
            steps_per_s: Some(98.38),
            requests: None,
            rps: None,
            p50_ms: Some(1.25),
            p99_ms: Some(0.1 + 0.2),
            claims_refused: Some("steps".into()),
            peers: Vec::new(),
            gang: Vec::new(),
            requeued: true,
            earlier: EarlierRuns::default(),
        }
    }

    #[test]
    fn round_trips() {
        for r in [
            full(),
            JobReport {
                mode: Some(Mode::Online),
                ..Default::default()
            },
        ] {
            assert_eq!(JobReport::decode(&r.encode()).unwrap(), r);
        }
        assert!(full()
            .encode()
            .starts_with("muxflow:v1 mode=offline node=node3 gpu=0 sm_pct=40"));
    }

    #[test]
    fn unknown_keys_are_ignored_and_bad_ones_named() {
        let r = JobReport::decode("muxflow:v1 mode=online future_key=1").unwrap();
        assert_eq!(r.mode, Some(Mode::Online));
        assert_eq!(
            JobReport::decode("hello"),
            Err(ReportError::Comment(AdminCommentError::NotMuxflow))
        );
        assert_eq!(
            JobReport::decode("muxflow:v1 gpu=1"),
            Err(ReportError::NoMode)
        );
        let e = JobReport::decode("muxflow:v1 mode=offline gpu=x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'gpu'"), "{e}");
        assert!(JobReport::decode("muxflow:v1 mode=offline rps=inf").is_err());
        assert!(JobReport::decode("muxflow:v1 mode=offline rps=NaN").is_err());
    }

    #[test]
    fn claims_are_marked_and_records_from_before_the_prefix_still_read() {
        let text = full().encode();
        assert!(
            text.contains(
                " measured_peak_mib=2050 policed=priority,no_xcuda terminated_by_other=1 run_s=600 requeued=1 partner_load_pct=40 partner_sm_pct=22 claim.launches=52000 "
            ) && text.contains(" claim.steps_per_s=98.38 "),
            "{text}"
        );
        assert!(!text.contains(" launches="), "{text}");
        // As sacct holds records written before this change.
        let old = "muxflow:v1 mode=offline node=node1 gpu=0 sm_pct=30 mem_cap_mib=79511 partner=3 \
                   launches=2220 delayed=0 oom=0 peak_mib=320 steps=111 steps_per_s=27.52";
        let r = JobReport::decode(old).unwrap();
        assert_eq!(
            (
                r.launches,
                r.peak_mib,
                r.steps,
                r.steps_per_s,
                r.measured_peak_mib
            ),
            (Some(2220), Some(320), Some(111), Some(27.52), None)
        );
    }

    #[test]
    fn claims_out_of_bounds_are_refused() {
        struct Case {
            name: &'static str,
            key: &'static str,
            raw: String,
            ok: bool,
        }
        let cases = [
            Case {
                name: "a real count",
                key: "launches",
                raw: "52000".into(),
                ok: true,
            },
            Case {
                name: "u64::MAX launches",
                key: "launches",
                raw: u64::MAX.to_string(),
                ok: false,
            },
            Case {
                name: "a negative count",
                key: "steps",
                raw: "-1".into(),
                ok: false,
            },
            Case {
                name: "a real speed",
                key: "steps_per_s",
                raw: "98.4".into(),
                ok: true,
            },
            Case {
                name: "a 300-digit speed",
                key: "steps_per_s",
                raw: "9".repeat(300),
                ok: false,
            },
            Case {
                name: "an infinite speed",
                key: "rps",
                raw: "inf".into(),
                ok: false,
            },
            Case {
                name: "NaN latency",
                key: "p99_ms",
                raw: "NaN".into(),
                ok: false,
            },
            Case {
                name: "a negative latency",
                key: "p50_ms",
                raw: "-3".into(),
                ok: false,
            },
            Case {
                name: "a peak beyond any GPU",
                key: "peak_mib",
                raw: "2000000".into(),
                ok: false,
            },
        ];
        for c in cases {
            let got = match c.key {
                "steps_per_s" | "rps" | "p50_ms" | "p99_ms" => claim_f64(c.key, &c.raw).is_some(),
                _ => claim_u64(c.key, &c.raw).is_some(),
            };
            assert_eq!(got, c.ok, "{}", c.name);
        }
        assert_eq!(claim_bound("mode"), None, "only claims have bounds");
    }

    #[test]
    fn node_names_that_would_break_the_form_are_dropped() {
        let r = JobReport {
            mode: Some(Mode::Online),
            node: Some("a b".into()),
            ..Default::default()
        };
        assert_eq!(r.encode(), "muxflow:v1 mode=online");
    }

    #[test]
    fn decoding_arbitrary_text_never_panics() {
        // A cheap in-tree stand-in for the fuzz target (fuzz/).
        let pieces = [
            "muxflow:v1",
            "mode=offline",
            "gpu=",
            "=",
            "gpu=1",
            "gpu=1",
            "x",
            "p99_ms=1e400",
            "é",
            ";",
            "\n",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut s = String::new();
            for _ in 0..(seed % 7) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push_str(pieces[(seed % pieces.len() as u64) as usize]);
                s.push(if seed & 1 == 0 { ' ' } else { '\t' });
            }
            if let Ok(r) = JobReport::decode(&s) {
                assert_eq!(JobReport::decode(&r.encode()).unwrap(), r, "{s:?}");
            }
        }
    }

    #[test]
    fn claims_from_the_jobs_files_are_summed_bounded_and_marked() {
        let mut r = JobReport {
            mode: Some(Mode::Offline),
            ..JobReport::default()
        };
        r.add_claims([
            (
                "xcuda.10",
                "launches=5 delayed=1 delay_us=2500 oom=0 peak_bytes=2097152\n",
            ),
            (
                "xcuda.11",
                "launches=18446744073709551615 delayed=2 delay_us=500 oom=1 peak_bytes=1048576",
            ),
            // Several lines: the last complete one counts; words without '=' are skipped.
            (
                "job.report",
                "steps=1\nsteps=90 junk steps_per_s=12.5 rps=1e400\n\n",
            ),
            ("notes.txt", "launches=7"),
        ]);
        assert_eq!(r.launches, Some(5), "the out-of-bounds count is left out");
        assert_eq!((r.delayed, r.delay_ms, r.oom), (Some(3), Some(3), Some(1)));
        assert_eq!(r.peak_mib, Some(2));
        assert_eq!(
            (r.steps, r.steps_per_s, r.rps),
            (Some(90), Some(12.5), None)
        );
        assert_eq!(r.claims_refused.as_deref(), Some("launches,rps"));
        let text = r.encode();
        assert!(
            text.contains(" claim.launches=5 ") && text.ends_with(" claims_refused=launches,rps")
        );
        assert_eq!(JobReport::decode(&text).unwrap(), r);
    }

    #[test]
    fn a_gang_record_is_v2_with_each_gpus_figures_and_v1_records_still_parse() {
        let r = JobReport {
            mode: Some(Mode::Offline),
            gpu: Some(0),
            sm_pct: Some(40),
            mem_cap_mib: Some(60000),
            partner: Some(12),
            gang: vec![GangGpu {
                gpu: 1,
                sm_pct: Some(30),
                mem_cap_mib: Some(50000),
                partner: Some(13),
            }],
            ..JobReport::default()
        };
        let text = r.encode();
        assert!(text.starts_with("muxflow:v2 "), "{text}");
        assert!(
            text.contains(" gpus=0,1 g1.sm_pct=30 g1.mem_cap_mib=50000 g1.partner=13"),
            "{text}"
        );
        assert_eq!(JobReport::decode(&text).unwrap(), r);
        // A 1-GPU job keeps the v1 tag every reader takes.
        let one = JobReport {
            gang: Vec::new(),
            ..r.clone()
        };
        assert!(one.encode().starts_with("muxflow:v1 "));
        let old = "muxflow:v1 mode=offline gpu=0 sm_pct=40 partner=12 launches=5";
        let back = JobReport::decode(old).unwrap();
        assert_eq!(
            (back.gpu, back.gang.len(), back.launches),
            (Some(0), 0, Some(5))
        );
        let bad = JobReport::decode("muxflow:v2 mode=offline gpus=0,x").unwrap_err();
        assert!(bad.to_string().contains("gpus"), "{bad}");
        let bad = JobReport::decode("muxflow:v2 mode=offline gpu=1 gpus=0,1").unwrap_err();
        assert!(bad.to_string().contains("gpu=1"), "{bad}");
        let bad = JobReport::decode("muxflow:v2 mode=offline gpus=0,1,1").unwrap_err();
        assert!(bad.to_string().contains("twice"), "{bad}");
        // Found by the fuzzer: a list without gpu= names the record's GPU.
        let r = JobReport::decode("muxflow:v1 mode=offline gpus=00,5").unwrap();
        assert_eq!((r.gpu, r.gang.len()), (Some(0), 1));
        assert_eq!(JobReport::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn measured_partner_load_is_the_mean_over_the_largest_sample() {
        let m = Measured::parse("load_max=80 load_n=4 load_sum=200 peak_mib=3000\n");
        assert_eq!(m.peak_mib, Some(3000));
        assert_eq!(m.partner_load_pct, Some(63));
        assert_eq!(m.partner_sm_pct, Some(50));
        assert_eq!(Measured::parse("peak_mib=10").partner_load_pct, None);
        assert_eq!(
            Measured::parse("load_n=3 load_sum=0 load_max=0").partner_load_pct,
            None
        );
        assert_eq!(Measured::parse("garbage"), Measured::default());
    }

    #[test]
    fn peers_round_trip_sorted_and_bounded_and_old_records_have_none() {
        let r = JobReport {
            mode: Some(Mode::Offline),
            gpu: Some(1),
            partner: Some(7),
            peers: vec![12, 40],
            ..Default::default()
        };
        let text = r.encode();
        assert!(text.contains(" partner=7 peers=12,40"), "{text}");
        assert_eq!(JobReport::decode(&text).unwrap(), r);
        // As a record written before peers existed: none.
        let old = JobReport::decode("muxflow:v1 mode=offline gpu=0 partner=3").unwrap();
        assert!(old.peers.is_empty());
        // Unsorted or repeated (a hand-edited comment) reads sorted, once;
        // a long list is cut, a bad one named.
        let r = JobReport::decode("muxflow:v1 mode=offline peers=9,3,9").unwrap();
        assert_eq!(r.peers, [3, 9]);
        let long: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let r = JobReport::decode(&format!("muxflow:v1 mode=offline peers={}", long.join(",")))
            .unwrap();
        assert_eq!(r.peers.len(), MAX_PEERS);
        let e = JobReport::decode("muxflow:v1 mode=offline peers=3,x").unwrap_err();
        assert!(e.to_string().contains("'peers'"), "{e}");

        let mut peers = vec![5];
        add_peers(&mut peers, Some(8), [8, 2, 5]);
        assert_eq!(peers, [2, 5]);
        assert_eq!(Measured::parse("peers=4,2 peak_mib=1").peers, [2, 4]);
        assert!(Measured::parse("peers=oops").peers.is_empty());
    }

    #[test]
    fn a_file_with_no_key_value_line_claims_nothing() {
        let mut r = JobReport::default();
        r.add_claims([
            ("job.report", ""),
            ("xcuda.1", "\n\n"),
            ("xcuda.2", "a=b=c"),
        ]);
        assert_eq!(r, JobReport::default());
        assert_eq!(last_kv_line("x=1 \n y=2 z \n"), last_kv_line("y=2"));
    }
}
