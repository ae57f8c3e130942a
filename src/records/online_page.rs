//! The online page: what the online job on a GPU experiences, published for
//! the offline jobs' launch gates on that GPU.
//!
//! The one fact that shapes it: on big GPUs sharing slows the online job
//! with the SM clock flat (real-gpu/README.md), so only the online job can
//! say it is being slowed. xCUDA in counting mode, inside the online job,
//! times its **busy periods** (from the first kernel launched after an idle
//! stream to the stream synchronize that waits for it: one request of a
//! service, with its queueing before the launch left out) and publishes,
//! every window of at least [`MIN_PERIODS`] periods, the GPU time per
//! launch of that window beside the lowest it has seen (its baseline,
//! which drifts up by [`BASELINE_DRIFT_PER_S`] so a lasting change of the
//! service's work is taken in). The offline gates read the deviation
//! `window / baseline - 1` ([`Page::reading`]) and brake on it.
//!
//! **Trust boundary.** The page of GPU `g` is `<state_dir>/online/<g>/page`,
//! in a directory of root not writable by others. The plugin (root, at the
//! online step's start) creates it anew, owned by the online job's user,
//! mode 0644: that user (and root) may write it, nobody else. The
//! directory is a tmpfs of [`PAGE_FS_MIB`] the online job's Prolog mounts
//! and its Epilog detaches: the page cannot grow past it, and it dies with
//! the job (a process of the job left behind writes into a filesystem no
//! reader sees). Where the Prolog may not mount, it is a plain directory
//! (unbounded), still removed with the job. Beside the page root writes a
//! note of the job it speaks for (`page.job`: job id and uid). A reader
//! trusts a page only there: the directory checked as root's, the file a
//! regular one (no symlink followed), not writable by group or others,
//! owned by the user of the job root's note names (a note that is missing
//! — the job ended — or not root's makes the page say nothing), its
//! record whole (magic, checksum). So an offline job of another user cannot
//! forge "online idle" (it cannot write the page) nor point its gate at
//! another page (the path comes from its root-written limits file). What the
//! page's owner may do: write anything, which only moves the brake on its
//! own online job's behalf (an online job owns its GPU anyway) — a user who
//! runs both jobs can release the brake their own service needs, and hurts
//! no one else. A page whose writer stopped (heartbeat older than
//! [`STALE_NS`]) says nothing, and the gate falls back to its clock and
//! utilization triggers.
//!
//! The record is 64 bytes, written whole with one `pwrite` and read with
//! one `pread` (no shared memory, no locks, no `unsafe`); a torn read fails
//! the checksum and is skipped.

use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Record size, bytes.
pub const RECORD_BYTES: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"MXFONL01");

/// A window closes once it holds this many busy periods...
pub const MIN_PERIODS: u64 = 8;
/// ...or once it is this old with at least one period in it.
pub const MAX_WINDOW_NS: u64 = 250_000_000;
/// How fast the baseline forgets a low: +1 % per second of windows.
pub const BASELINE_DRIFT_PER_S: f64 = 0.01;
/// A page not rewritten for this long says nothing (its writer is gone).
pub const STALE_NS: u64 = 1_000_000_000;
/// No window closed for this long while the heartbeat is fresh: the online
/// job is idle (launches nothing), unless its launch count moved.
pub const IDLE_NS: u64 = 500_000_000;

/// CLOCK_MONOTONIC in ns: the clock every process on the node shares.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// The page of GPU `gpu` under the node's state directory, in the GPU's
/// own page directory ([`gpu_dir`]).
pub fn path(state_dir: &Path, gpu: u32) -> PathBuf {
    gpu_dir(state_dir, gpu).join("page")
}

/// The directory of GPU `gpu`'s page (root, 0755): a small filesystem of
/// its own for the GPU's online job, made by its Prolog and removed when
/// it ends ([`PAGE_FS_MIB`]).
pub fn gpu_dir(state_dir: &Path, gpu: u32) -> PathBuf {
    dir(state_dir).join(gpu.to_string())
}

/// What a GPU's page directory holds at most (a tmpfs): the page is one
/// 64-byte record, so its owner can grow it this far and no further, and
/// only on its own GPU's.
pub const PAGE_FS_MIB: u64 = 1;
/// Inodes of a page directory: the page and the one it is renamed from.
pub const PAGE_FS_INODES: u64 = 8;

/// Where the plugin writes an online job's xCUDA settings (the limits-file
/// form of [`crate::records::limits`], role `online`): beside, not inside, the
/// offline jobs' limits directory, whose files the node polices as offline.
pub fn limits_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("online-limits")
}

/// The directory of the pages (root, 0755).
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("online")
}

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not trusted: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error("{path}: no whole record (being written, or not a page)")]
    Torn { path: PathBuf },
}

/// One published record.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Record {
    /// Incremented by every write.
    pub seq: u64,
    /// CLOCK_MONOTONIC (ns) of the last write.
    pub heartbeat_ns: u64,
    /// CLOCK_MONOTONIC (ns) when the last window closed (0: none yet).
    pub window_at_ns: u64,
    /// GPU time per launch in the last window, ns.
    pub window_ns_per_launch: f64,
    /// The lowest window seen, drifting up ([`BASELINE_DRIFT_PER_S`]).
    pub baseline_ns_per_launch: f64,
    /// Launches of the writer so far.
    pub launches: u64,
}

fn checksum(words: &[u64; 7]) -> u64 {
    // FNV-1a over the words: enough to tell a torn read from a whole one.
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        w.to_le_bytes()
            .iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
    })
}

impl Record {
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let words = [
            MAGIC,
            self.seq,
            self.heartbeat_ns,
            self.window_at_ns,
            self.window_ns_per_launch.to_bits(),
            self.baseline_ns_per_launch.to_bits(),
            self.launches,
        ];
        let mut out = [0u8; RECORD_BYTES];
        for (i, w) in words.iter().chain([checksum(&words)].iter()).enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// None: not a whole record.
    pub fn decode(b: &[u8; RECORD_BYTES]) -> Option<Record> {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let words = [w(0), w(1), w(2), w(3), w(4), w(5), w(6)];
        if words[0] != MAGIC || checksum(&words) != w(7) {
            return None;
        }
        Some(Record {
            seq: words[1],
            heartbeat_ns: words[2],
            window_at_ns: words[3],
            window_ns_per_launch: f64::from_bits(words[4]),
            baseline_ns_per_launch: f64::from_bits(words[5]),
            launches: words[6],
        })
    }
}

/// What a gate makes of a page at `now_ns`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    /// No page, a stale or untrusted one, or an online job that launches
    /// but whose busy periods cannot be timed: the page says nothing.
    Absent,
    /// The online job launched nothing lately: nothing to protect.
    Idle,
    /// The last window's GPU time per launch over the baseline, minus one.
    Deviation(f64),
}

impl Record {
    /// `prev_launches`: the launch count the gate saw at its last read (to
    /// tell an idle online job from one whose periods are not timed).
    pub fn reading(&self, now_ns: u64, prev_launches: Option<u64>) -> Reading {
        if now_ns.saturating_sub(self.heartbeat_ns) > STALE_NS {
            return Reading::Absent;
        }
        let fresh = self.window_at_ns != 0 && now_ns.saturating_sub(self.window_at_ns) <= IDLE_NS;
        if fresh && self.baseline_ns_per_launch > 0.0 && self.window_ns_per_launch.is_finite() {
            return Reading::Deviation(
                self.window_ns_per_launch / self.baseline_ns_per_launch - 1.0,
            );
        }
        match prev_launches {
            Some(p) if p == self.launches => Reading::Idle,
            _ => Reading::Absent,
        }
    }
}

/// Where the busy line sits: right after the record.
pub const BUSY_OFFSET: u64 = RECORD_BYTES as u64;
/// The busy line: the start of the online job's current busy period
/// (CLOCK_MONOTONIC ns; 0: idle) and its complement with a magic, so a
/// torn read is told apart from a whole one. Written by the online job at
/// each busy transition, one `pwrite` (the record's writer runs only every
/// sample interval, far slower than a request).
pub const BUSY_BYTES: usize = 16;
const BUSY_MAGIC: u64 = u64::from_le_bytes(*b"MXFBUSY1");
/// A busy period older than this is not a request being served: a writer
/// stopped mid-period (or two threads' transitions crossed). It says idle.
pub const BUSY_MAX_NS: u64 = 1_000_000_000;

pub fn encode_busy(since_ns: u64) -> [u8; BUSY_BYTES] {
    let mut out = [0u8; BUSY_BYTES];
    out[..8].copy_from_slice(&since_ns.to_le_bytes());
    out[8..].copy_from_slice(&(since_ns ^ BUSY_MAGIC).to_le_bytes());
    out
}

/// The busy line's start of the current period (0: idle); None: torn or absent.
pub fn decode_busy(b: &[u8; BUSY_BYTES]) -> Option<u64> {
    let since = u64::from_le_bytes(b[..8].try_into().ok()?);
    let check = u64::from_le_bytes(b[8..].try_into().ok()?);
    (check == since ^ BUSY_MAGIC).then_some(since)
}

/// Is the online job busy at `now_ns`, by its record and busy line? A
/// stale record (writer gone), a torn or missing line, or a period older
/// than [`BUSY_MAX_NS`] all say no.
pub fn busy_at(rec: &Record, line: Option<u64>, now_ns: u64) -> bool {
    let fresh = now_ns.saturating_sub(rec.heartbeat_ns) <= STALE_NS;
    match line {
        Some(since) if fresh && since != 0 => now_ns.saturating_sub(since) <= BUSY_MAX_NS,
        _ => false,
    }
}

/// Opens the page at `path` for reading if it is trusted (see the module
/// doc); `root` is the uid that must own its directory (0; tests pass
/// their own). The file stays what was checked: the reader keeps it open.
pub fn open_trusted(path: &Path, root: u32) -> Result<std::fs::File, PageError> {
    let untrusted = |why: String| PageError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    let io = |source| PageError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let d = std::fs::symlink_metadata(dir).map_err(io)?;
    if !d.is_dir() || d.uid() != root || d.mode() & 0o022 != 0 {
        return Err(untrusted(format!(
            "its directory {} must be root's and not writable by others",
            dir.display()
        )));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let m = f.metadata().map_err(io)?;
    if !m.is_file() || m.mode() & 0o022 != 0 {
        return Err(untrusted(
            "must be a regular file not writable by group or others".into(),
        ));
    }
    // The page speaks for the job root named beside it, and only if that
    // job's user owns it: a page whose job is gone (its Epilog removes the
    // note) or whose owner is not that job's user says nothing.
    let note = job_note_path(path);
    let job = read_job_note(&note, root).map_err(&untrusted)?;
    if m.uid() != job.uid {
        return Err(untrusted(format!(
            "owned by uid {}, not by the user of job {} (uid {})",
            m.uid(),
            job.job_id,
            job.uid
        )));
    }
    Ok(f)
}

/// The job a page speaks for, as root noted it beside the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageJob {
    pub job_id: u32,
    pub uid: u32,
}

/// Root's note of the page's job: `<page>.job`, in the same root directory.
pub fn job_note_path(page: &Path) -> PathBuf {
    let mut name = page.file_name().unwrap_or_default().to_os_string();
    name.push(".job");
    page.with_file_name(name)
}

/// Reads root's note (`job=<id> uid=<uid>`): owned by `root`, a regular
/// file not writable by others, at most 128 bytes. Err: why not.
pub fn read_job_note(note: &Path, root: u32) -> Result<PageJob, String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(note)
        .map_err(|e| format!("no note of its job ({}: {e})", note.display()))?;
    let m = f
        .metadata()
        .map_err(|e| format!("{}: {e}", note.display()))?;
    if !m.is_file() || m.uid() != root || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} must be root's regular file, not writable by others",
            note.display()
        ));
    }
    let mut b = [0u8; 128];
    let n = f
        .read_at(&mut b, 0)
        .map_err(|e| format!("{}: {e}", note.display()))?;
    let text = std::str::from_utf8(&b[..n]).unwrap_or("");
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.parse::<u32>().ok())
    };
    match (field("job"), field("uid")) {
        (Some(job_id), Some(uid)) => Ok(PageJob { job_id, uid }),
        _ => Err(format!("{}: not a note of a job", note.display())),
    }
}

/// The record and the busy line of an open page (one `pread`); the line is
/// None when torn or not written yet.
pub fn read_open(f: &std::fs::File, path: &Path) -> Result<(Record, Option<u64>), PageError> {
    let torn = || PageError::Torn {
        path: path.to_path_buf(),
    };
    let mut b = [0u8; RECORD_BYTES + BUSY_BYTES];
    let n = f.read_at(&mut b, 0).map_err(|_| torn())?;
    if n < RECORD_BYTES {
        return Err(torn());
    }
    let rec = Record::decode(b[..RECORD_BYTES].try_into().map_err(|_| torn())?).ok_or_else(torn)?;
    let line = match n {
        n if n >= RECORD_BYTES + BUSY_BYTES => {
            decode_busy(b[RECORD_BYTES..].try_into().map_err(|_| torn())?)
        }
        _ => None,
    };
    Ok((rec, line))
}

/// Reads the page at `path` if it is trusted ([`open_trusted`]).
pub fn read_trusted(path: &Path, root: u32) -> Result<Record, PageError> {
    let f = open_trusted(path, root)?;
    read_open(&f, path).map(|(rec, _)| rec)
}

/// Creates the page of online job `job_id` anew (as root): a fresh file
/// owned by `uid:gid`, mode 0644, renamed over the old one, in the pages'
/// directory (made root's 0755 if missing; refused if it is anyone
/// else's), with root's note of the job beside it ([`job_note_path`]).
pub fn create(path: &Path, job_id: u32, uid: u32, gid: u32) -> Result<(), PageError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| PageError::Io { path: p, source }
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(io(dir))?;
    let d = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if !d.is_dir() || d.uid() != me || d.mode() & 0o022 != 0 {
        return Err(PageError::Untrusted {
            path: dir.to_path_buf(),
            why: "must be a directory of root not writable by others".into(),
        });
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("page");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all_at(&[0u8; RECORD_BYTES], 0).map_err(io(&tmp))?;
    f.write_all_at(&encode_busy(0), BUSY_OFFSET)
        .map_err(io(&tmp))?;
    std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(io(&tmp))?;
    // The note first: a reader never finds the new page without its job.
    let note = job_note_path(path);
    let note_tmp = dir.join(format!(".{name}.job.tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&note_tmp);
    let n = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&note_tmp)
        .map_err(io(&note_tmp))?;
    n.write_all_at(format!("job={job_id} uid={uid}\n").as_bytes(), 0)
        .map_err(io(&note_tmp))?;
    std::fs::rename(&note_tmp, &note).map_err(io(&note))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// The online side's bookkeeping: fed, at every publish, the GPU time per
/// launch of each busy period that ended since the last one.
///
/// A window's figure is the **median** of its periods, not their mean: a
/// period also holds the host's wake-up after the GPU finished, and one
/// late wake-up (a loaded host) would otherwise move a whole window.
#[derive(Debug, Clone, Default)]
pub struct Estimator {
    baseline: Option<f64>,
    acc: Vec<f64>,
    window_start_ns: Option<u64>,
    last: Option<(u64, f64)>,
}

impl Estimator {
    /// Adds the periods that ended since the last call (ns per launch
    /// each); closes a window when it is full. Returns the record's window
    /// fields: (closed at, ns per launch, baseline), the last closed
    /// window's when none closed now.
    pub fn feed(&mut self, now_ns: u64, periods: &[f64]) -> Option<(u64, f64, f64)> {
        let start = *self.window_start_ns.get_or_insert(now_ns);
        self.acc.extend(
            periods
                .iter()
                .copied()
                .filter(|v| v.is_finite() && *v > 0.0),
        );
        let age = now_ns.saturating_sub(start);
        let n = self.acc.len() as u64;
        if n >= MIN_PERIODS || (age >= MAX_WINDOW_NS && n > 0) {
            self.acc.sort_by(f64::total_cmp);
            let w = self.acc[self.acc.len() / 2];
            let b = match self.baseline {
                None => w,
                Some(b) => (b * (1.0 + BASELINE_DRIFT_PER_S * age as f64 / 1e9)).min(w),
            };
            self.baseline = Some(b);
            self.last = Some((now_ns, w));
            self.acc.clear();
            self.window_start_ns = Some(now_ns);
        } else if age >= MAX_WINDOW_NS {
            // Nothing timed in a whole window: start the next one afresh.
            self.window_start_ns = Some(now_ns);
        }
        match (self.last, self.baseline) {
            (Some((at, w)), Some(b)) => Some((at, w, b)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_busy_line_says_busy_only_for_a_fresh_writer_and_a_recent_period() {
        let now = 10_000 * MS;
        let rec = Record {
            heartbeat_ns: now - 10 * MS,
            ..Record::default()
        };
        let line = |since| decode_busy(&encode_busy(since));
        assert_eq!(line(now - 3 * MS), Some(now - 3 * MS));
        let mut torn = encode_busy(now);
        torn[3] ^= 1;
        assert_eq!(decode_busy(&torn), None);
        let cases: &[(&str, Record, Option<u64>, bool)] = &[
            ("a period begun 3 ms ago", rec, line(now - 3 * MS), true),
            ("idle", rec, line(0), false),
            ("torn or missing line", rec, None, false),
            (
                "a period of 2 s is no request: a writer stopped mid-period",
                rec,
                line(now - 2000 * MS),
                false,
            ),
            (
                "the writer is gone",
                Record {
                    heartbeat_ns: now - 2000 * MS,
                    ..rec
                },
                line(now - 3 * MS),
                false,
            ),
        ];
        for (name, r, l, want) in cases {
            assert_eq!(busy_at(r, *l, now), *want, "{name}");
        }
    }

    #[test]
    fn a_record_round_trips_and_a_torn_one_is_refused() {
        let r = Record {
            seq: 3,
            heartbeat_ns: 10,
            window_at_ns: 9,
            window_ns_per_launch: 1.5e6,
            baseline_ns_per_launch: 1.0e6,
            launches: 42,
        };
        let b = r.encode();
        assert_eq!(Record::decode(&b), Some(r));
        for i in [0, 12, 40, 63] {
            let mut t = b;
            t[i] ^= 1;
            assert_eq!(Record::decode(&t), None, "byte {i} flipped");
        }
        assert_eq!(Record::decode(&[0; RECORD_BYTES]), None);
    }

    #[test]
    fn readings_table() {
        let now = 10_000 * MS;
        let base = Record {
            seq: 1,
            heartbeat_ns: now - 10 * MS,
            window_at_ns: now - 50 * MS,
            window_ns_per_launch: 1.2e6,
            baseline_ns_per_launch: 1.0e6,
            launches: 100,
        };
        let cases: &[(&str, Record, Option<u64>, Reading)] = &[
            (
                "fresh window: its deviation",
                base,
                Some(90),
                Reading::Deviation(0.2),
            ),
            (
                "writer gone: says nothing",
                Record {
                    heartbeat_ns: now - 2000 * MS,
                    ..base
                },
                Some(100),
                Reading::Absent,
            ),
            (
                "no window lately, no launches since the last read: idle",
                Record {
                    window_at_ns: now - 900 * MS,
                    ..base
                },
                Some(100),
                Reading::Idle,
            ),
            (
                "no window lately but launches go on (periods not timed): says nothing",
                Record {
                    window_at_ns: now - 900 * MS,
                    ..base
                },
                Some(80),
                Reading::Absent,
            ),
            (
                "first read, no window yet: says nothing",
                Record {
                    window_at_ns: 0,
                    ..base
                },
                None,
                Reading::Absent,
            ),
        ];
        for (name, r, prev, want) in cases {
            match (r.reading(now, *prev), want) {
                (Reading::Deviation(a), Reading::Deviation(b)) => {
                    assert!((a - b).abs() < 1e-9, "{name}: {a} vs {b}")
                }
                (got, want) => assert_eq!(got, *want, "{name}"),
            }
        }
    }

    #[test]
    fn the_estimator_keeps_the_low_and_drifts_up_slowly() {
        let mut e = Estimator::default();
        // (ms since start, periods' ms per launch) -> (window ms per launch, baseline).
        type Row<'a> = (&'a str, u64, &'a [f64], Option<(f64, f64)>);
        let rows: &[Row] = &[
            (
                "too few periods: no window yet",
                20,
                &[1.0, 1.0, 1.0, 1.0],
                None,
            ),
            (
                "eight periods: the first window's median is the baseline",
                40,
                &[1.0, 1.0, 1.0, 9.0],
                Some((1.0, 1.0)),
            ),
            (
                "slower window: the baseline barely moves",
                80,
                &[1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5],
                Some((1.5, 1.0004)),
            ),
            (
                "late wake-ups in a few periods do not move the median",
                120,
                &[0.875, 0.875, 0.875, 0.875, 0.875, 5.0, 6.0, 7.0],
                Some((0.875, 0.875)),
            ),
        ];
        for (name, t, periods, want) in rows {
            let periods: Vec<f64> = periods.iter().map(|v| v * 1e6).collect();
            let got = e.feed(t * MS, &periods).map(|(_, w, b)| (w / 1e6, b / 1e6));
            match (got, want) {
                (Some((w, b)), Some((ww, wb))) => {
                    assert!(
                        (w - ww).abs() < 1e-6 && (b - wb).abs() < 1e-4,
                        "{name}: {w} {b}"
                    )
                }
                (g, w) => assert_eq!(g, *w, "{name}"),
            }
        }
    }

    #[test]
    fn only_a_page_in_a_directory_of_the_owner_not_writable_by_others_is_read() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid cannot fail and touches no memory.
        let me = unsafe { libc::geteuid() };
        let t = tempfile::tempdir().unwrap();
        let p = path(t.path(), 0);
        std::fs::create_dir(dir(t.path())).unwrap();
        std::fs::set_permissions(dir(t.path()), std::fs::Permissions::from_mode(0o755)).unwrap();
        create(&p, 12, me, me).unwrap();
        assert_eq!(
            read_job_note(&job_note_path(&p), me),
            Ok(PageJob {
                job_id: 12,
                uid: me
            })
        );
        // Created empty: no record yet.
        assert!(matches!(read_trusted(&p, me), Err(PageError::Torn { .. })));
        let r = Record {
            seq: 1,
            heartbeat_ns: 5,
            launches: 1,
            ..Record::default()
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .write_all_at(&r.encode(), 0)
            .unwrap();
        assert_eq!(read_trusted(&p, me).unwrap(), r);
        // The page speaks only for the job root noted beside it, and only
        // when that job's user owns it.
        let note = job_note_path(&p);
        for (case, text, mode) in [
            (
                "another user's job",
                format!("job=12 uid={}", me + 1),
                0o644,
            ),
            ("a note others may write", format!("job=12 uid={me}"), 0o666),
            ("not a note", "hello".to_string(), 0o644),
        ] {
            std::fs::write(&note, text).unwrap();
            std::fs::set_permissions(&note, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(
                matches!(read_trusted(&p, me), Err(PageError::Untrusted { .. })),
                "{case}"
            );
        }
        std::fs::remove_file(&note).unwrap();
        let e = read_trusted(&p, me).unwrap_err().to_string();
        assert!(e.contains("no note of its job"), "{e}");
        std::fs::write(&note, format!("job=12 uid={me}\n")).unwrap();
        std::fs::set_permissions(&note, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_trusted(&p, me).unwrap(), r);
        // Another uid's directory: refused.
        assert!(matches!(
            read_trusted(&p, me + 1),
            Err(PageError::Untrusted { .. })
        ));
        // A page others may write: refused.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            read_trusted(&p, me),
            Err(PageError::Untrusted { .. })
        ));
        // A symlink in its place: not followed.
        std::fs::remove_file(&p).unwrap();
        let elsewhere = t.path().join("forged");
        std::fs::write(&elsewhere, r.encode()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &p).unwrap();
        assert!(read_trusted(&p, me).is_err());
    }
}
