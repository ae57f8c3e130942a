//! The per-GPU SM activity page: the last reading of the node's one sampler
//! (`muxflow-sampler`, `node/src/sampler.rs`), for every reader on the
//! node — the health step (Prolog, Epilog, health check) and xCUDA's launch
//! gate in offline jobs.
//!
//! The fact that shapes it: NVML's GPM SM activity is a rate between two
//! samples at least [`GPM_MIN_GAP`] apart (the GPU refreshes the counters
//! behind it about every 100 ms; closer samples read 0 %). A reader that
//! sampled for itself would wait that long — inside every Prolog and Epilog.
//! One sampler per node takes the samples back to back instead and
//! publishes each reading here; readers take the last one at once.
//!
//! `<state_dir>/gpu<i>/sm_activity`, one line, written by root (0644, in
//! the root-owned GPU directory) and replaced atomically (temporary file +
//! rename, so a reader sees a whole old page or a whole new one; no fsync:
//! a page is worth nothing after [`MAX_AGE_MS`], so a crash may lose it):
//!
//! ```text
//! v=1 t_ms=<Unix ms of the second sample> window_ms=<ms between the two> sm_pct=<percent | ->
//! ```
//!
//! `sm_pct=-`: the sampler runs but the GPU gave no reading (no GPM, a
//! failed sample). A reader gets a reading or why there is none
//! ([`NoReading`]): no page (no sampler yet: a cold node), one that does
//! not parse in full (torn, truncated, another version), one older than
//! [`MAX_AGE_MS`] (the sampler is gone or stuck) or from the future (the
//! clock was set back), a window shorter than the GPU's refresh (it would
//! read 0), or a file that someone other than root could have written
//! (a user must not be able to release the brake for everyone). Never a
//! wrong reading: the health step then decides without SM activity and
//! xCUDA brakes on the clock and utilization alone.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use crate::policy::health::GPM_MIN_GAP;

/// The page's name in a GPU's state directory.
pub const FILE_NAME: &str = "sm_activity";
/// The page format this build writes and reads.
pub const VERSION: u32 = 1;
/// A page older than this is no reading: the sampler publishes every
/// [`GPM_MIN_GAP`] (120 ms), so this is several missed periods.
pub const MAX_AGE_MS: u64 = 1000;
/// The GPU's own refresh period of the GPM counters (`real-gpu/README.md`):
/// a reading over a shorter window is 0 whatever the load.
pub const MIN_WINDOW_MS: u64 = 100;
/// The longest page a reader accepts (a valid one is under 80 bytes).
const MAX_BYTES: u64 = 256;

/// One reading of one GPU, as the sampler publishes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Page {
    /// When the second of the two samples was taken, Unix milliseconds.
    pub t_ms: u64,
    /// Time between the two samples, milliseconds.
    pub window_ms: u64,
    /// SM activity over the window, percent; None when the GPU gave none.
    pub sm_pct: Option<f64>,
}

/// Why a reader has no SM activity reading.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NoReading {
    #[error("no SM activity page yet (no sampler has published on this node)")]
    Missing,
    #[error("SM activity page unreadable (torn or another format): {0}")]
    Corrupt(String),
    #[error("SM activity page is {age_ms} ms old (the sampler is gone or stuck)")]
    Stale { age_ms: u64 },
    #[error("SM activity page is {ahead_ms} ms in the future (the clock was set back)")]
    Future { ahead_ms: u64 },
    #[error("SM activity over {0} ms, shorter than the GPU's {MIN_WINDOW_MS} ms refresh")]
    ShortWindow(u64),
    #[error("the GPU gives no SM activity (no GPM reading)")]
    Unsupported,
    #[error("SM activity page not trusted: {0}")]
    Untrusted(String),
    #[error("SM activity page: {0}")]
    Io(String),
}

/// The page of the GPU whose health word is `health_file` (xCUDA knows
/// that path from its root-owned limits).
pub fn beside(health_file: &Path) -> PathBuf {
    health_file.with_file_name(FILE_NAME)
}

/// Now, Unix milliseconds (the clock every process on the node shares).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Page {
    pub fn encode(&self) -> String {
        let sm = self.sm_pct.map_or("-".to_string(), |v| format!("{v:.1}"));
        format!(
            "v={VERSION} t_ms={} window_ms={} sm_pct={sm}\n",
            self.t_ms, self.window_ms
        )
    }

    /// A whole page or an error: every key of this version exactly once, in
    /// order, and the closing newline (a page cut anywhere lacks it, so a
    /// truncated `sm_pct=47.3` never reads as 4).
    pub fn decode(text: &str) -> Result<Page, NoReading> {
        let bad = |why: &str| NoReading::Corrupt(why.to_string());
        let line = text
            .strip_suffix('\n')
            .ok_or_else(|| bad("no closing newline"))?;
        if line.contains('\n') {
            return Err(bad("more than one line"));
        }
        let words: Vec<&str> = line.split(' ').collect();
        let [v, t, w, sm] = words[..] else {
            return Err(bad("not the four fields of version 1"));
        };
        fn field<'a>(word: &'a str, key: &str) -> Result<&'a str, NoReading> {
            word.strip_prefix(key)
                .and_then(|r| r.strip_prefix('='))
                .ok_or_else(|| NoReading::Corrupt(format!("expected {key}= in '{word}'")))
        }
        fn int(word: &str, key: &str) -> Result<u64, NoReading> {
            let v = field(word, key)?;
            v.parse()
                .map_err(|_| NoReading::Corrupt(format!("{key}='{v}' is not a whole number")))
        }
        if field(v, "v")? != VERSION.to_string() {
            return Err(bad("another version"));
        }
        let sm_pct = match field(sm, "sm_pct")? {
            "-" => None,
            s => match s.parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => Some(p),
                _ => return Err(NoReading::Corrupt(format!("sm_pct='{s}' is not a percent"))),
            },
        };
        Ok(Page {
            t_ms: int(t, "t_ms")?,
            window_ms: int(w, "window_ms")?,
            sm_pct,
        })
    }

    /// The SM activity this page gives a reader at `now_ms`, or why none.
    pub fn reading(&self, now_ms: u64) -> Result<f64, NoReading> {
        if self.t_ms > now_ms {
            return Err(NoReading::Future {
                ahead_ms: self.t_ms - now_ms,
            });
        }
        let age_ms = now_ms - self.t_ms;
        if age_ms > MAX_AGE_MS {
            return Err(NoReading::Stale { age_ms });
        }
        if self.window_ms < MIN_WINDOW_MS {
            return Err(NoReading::ShortWindow(self.window_ms));
        }
        self.sm_pct.ok_or(NoReading::Unsupported)
    }
}

/// The SM activity the page at `path` gives at `now_ms`, if only `owner`
/// (root in production) can have written it ([`crate::records::limits::read_trusted_text`]).
pub fn read(path: &Path, owner: u32, now_ms: u64) -> Result<f64, NoReading> {
    use crate::records::limits::LimitsError;
    let text =
        crate::records::limits::read_trusted_text(path, owner, MAX_BYTES).map_err(|e| match e {
            LimitsError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                NoReading::Missing
            }
            LimitsError::Untrusted { why, .. } => NoReading::Untrusted(why),
            e => NoReading::Io(e.to_string()),
        })?;
    Page::decode(&text)?.reading(now_ms)
}

/// Replaces the page at `path` (0644, never through a symlink). The
/// sampler's write, every [`GPM_MIN_GAP`]: no fsync (see the module doc).
pub fn write(path: &Path, page: &Page) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let tmp = dir.join(format!(".{FILE_NAME}.tmp.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    // Whatever root's umask: every job's xCUDA must read it.
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    f.write_all(page.encode().as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const NOW: u64 = 1_800_000_000_000;

    fn page(t_ms: u64, window_ms: u64, sm_pct: Option<f64>) -> Page {
        Page {
            t_ms,
            window_ms,
            sm_pct,
        }
    }

    #[test]
    fn pages_give_a_reading_or_say_why_not() {
        let cases: [(&str, &str, Result<f64, NoReading>); 14] = [
            (
                "a fresh page",
                "v=1 t_ms=1800000000000 window_ms=120 sm_pct=47.3\n",
                Ok(47.3),
            ),
            (
                "idle GPU: 0 is a reading",
                "v=1 t_ms=1800000000000 window_ms=120 sm_pct=0.0\n",
                Ok(0.0),
            ),
            (
                "just within the age limit",
                "v=1 t_ms=1799999999000 window_ms=130 sm_pct=100.0\n",
                Ok(100.0),
            ),
            (
                "stale: the sampler is gone",
                "v=1 t_ms=1799999998999 window_ms=120 sm_pct=47.3\n",
                Err(NoReading::Stale { age_ms: 1001 }),
            ),
            (
                "from the future: the clock was set back",
                "v=1 t_ms=1800000000500 window_ms=120 sm_pct=47.3\n",
                Err(NoReading::Future { ahead_ms: 500 }),
            ),
            (
                "a window under the GPU's refresh would read 0",
                "v=1 t_ms=1800000000000 window_ms=50 sm_pct=0.0\n",
                Err(NoReading::ShortWindow(50)),
            ),
            (
                "the GPU gives none (no GPM)",
                "v=1 t_ms=1800000000000 window_ms=120 sm_pct=-\n",
                Err(NoReading::Unsupported),
            ),
            (
                "torn: cut inside the figure",
                "v=1 t_ms=1800000000000 window_ms=120 sm_pct=4",
                Err(NoReading::Corrupt("no closing newline".into())),
            ),
            (
                "empty file",
                "",
                Err(NoReading::Corrupt("no closing newline".into())),
            ),
            (
                "another version",
                "v=2 t_ms=1800000000000 window_ms=120 sm_pct=47.3\n",
                Err(NoReading::Corrupt("another version".into())),
            ),
            (
                "a field missing",
                "v=1 t_ms=1800000000000 sm_pct=47.3\n",
                Err(NoReading::Corrupt(
                    "not the four fields of version 1".into(),
                )),
            ),
            (
                "fields out of order",
                "v=1 window_ms=120 t_ms=1800000000000 sm_pct=47.3\n",
                Err(NoReading::Corrupt(
                    "expected t_ms= in 'window_ms=120'".into(),
                )),
            ),
            (
                "not a percent",
                "v=1 t_ms=1800000000000 window_ms=120 sm_pct=130.0\n",
                Err(NoReading::Corrupt("sm_pct='130.0' is not a percent".into())),
            ),
            (
                "two pages run together",
                "v=1 t_ms=1800000000000 window_ms=120 sm_pct=47.3\nv=1\n",
                Err(NoReading::Corrupt("more than one line".into())),
            ),
        ];
        for (what, text, want) in cases {
            let got = Page::decode(text).and_then(|p| p.reading(NOW));
            assert_eq!(got, want, "{what}: {text:?}");
        }
    }

    #[test]
    fn a_page_cut_anywhere_is_never_a_reading() {
        for p in [
            page(NOW, 120, Some(47.3)),
            page(NOW, 120, Some(100.0)),
            page(NOW, 120, None),
        ] {
            let text = p.encode();
            assert_eq!(Page::decode(&text), Ok(p), "round trip of {text:?}");
            for cut in 0..text.len() {
                assert!(
                    Page::decode(&text[..cut]).is_err(),
                    "{:?} read as a page",
                    &text[..cut]
                );
            }
        }
    }

    #[test]
    fn files_are_read_only_from_the_owner_and_written_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("gpu0");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let me = std::fs::metadata(&dir).unwrap().uid();
        let path = beside(&dir.join("state"));
        assert_eq!(path, dir.join(FILE_NAME));

        assert_eq!(read(&path, me, NOW), Err(NoReading::Missing), "no page");
        write(&path, &page(NOW - 10, 120, Some(55.0))).unwrap();
        assert_eq!(read(&path, me, NOW), Ok(55.0), "the owner's page");
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o644, "readable by jobs, writable by root alone");
        assert!(
            matches!(read(&path, me + 1, NOW), Err(NoReading::Untrusted(_))),
            "a page of another owner"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            matches!(read(&path, me, NOW), Err(NoReading::Untrusted(_))),
            "a page others may write"
        );
        write(&path, &page(NOW - 5000, 120, Some(55.0))).unwrap();
        assert_eq!(
            read(&path, me, NOW),
            Err(NoReading::Stale { age_ms: 5000 }),
            "the replaced page is the writer's (0644 again) and stale"
        );
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != FILE_NAME)
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }
}
