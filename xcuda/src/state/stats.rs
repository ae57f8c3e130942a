//! The per-process counter file `<stats dir>/xcuda.<pid>`: one line of
//! `key=value`, replaced atomically (temp file in the same directory, then
//! rename), so the plugin never reads half a file. It also names the
//! process by its start ([`muxflow::records::report::XCUDA_STARTED_KEY`]):
//! written from xCUDA's start-up on, it is how the node tells a process
//! that runs xCUDA from one that only maps the library.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub launches: u64,
    pub delayed: u64,
    pub delay_us: u64,
    pub oom: u64,
    pub peak_bytes: u64,
    /// Graceful releases of the process's contexts on SIGTERM/SIGINT (0 or 1).
    pub released: u64,
}

impl Counters {
    /// The file's line; `started`: the process's start, where known.
    pub fn line(&self, started: Option<u64>) -> String {
        let started = started.map_or(String::new(), |t| {
            format!(" {}={t}", muxflow::records::report::XCUDA_STARTED_KEY)
        });
        format!(
            "launches={} delayed={} delay_us={} oom={} peak_bytes={} released={}{started}\n",
            self.launches, self.delayed, self.delay_us, self.oom, self.peak_bytes, self.released
        )
    }
}

/// This process's start (`/proc/self/stat`'s starttime): read at each
/// write, so a forked child's file names the child.
pub fn own_start_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    muxflow::node::offline_procs::start_ticks(&stat)
}

#[derive(Debug, thiserror::Error)]
#[error("cannot write xCUDA stats {path}: {source}")]
pub struct StatsError {
    path: PathBuf,
    source: std::io::Error,
}

pub fn path(dir: &Path, pid: u32) -> PathBuf {
    muxflow::records::report::xcuda_stats_file(dir, pid)
}

/// Replaces `<dir>/xcuda.<pid>` with `c` and the process's start.
pub fn write(dir: &Path, pid: u32, c: &Counters, started: Option<u64>) -> Result<(), StatsError> {
    // Dot-prefixed: never matches the plugin's `xcuda.*`.
    let tmp = dir.join(format!(".xcuda.{pid}.tmp"));
    let dst = path(dir, pid);
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StatsError { path: p, source }
    };
    let mut f = std::fs::File::create(&tmp).map_err(err(&tmp))?;
    f.write_all(c.line(started).as_bytes()).map_err(err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &dst).map_err(err(&dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_one_line_and_replaces_it() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Counters {
            launches: 5,
            delayed: 2,
            delay_us: 300,
            oom: 1,
            peak_bytes: 1 << 20,
            released: 0,
        };
        write(d.path(), 42, &c, None).unwrap();
        c.launches = 6;
        write(d.path(), 42, &c, Some(777)).unwrap();
        let s = std::fs::read_to_string(path(d.path(), 42)).unwrap();
        assert_eq!(
            s,
            "launches=6 delayed=2 delay_us=300 oom=1 peak_bytes=1048576 released=0 started=777\n"
        );
        // What the node reads it as: this process, started then.
        assert!(muxflow::records::report::xcuda_started(d.path(), 42, 777));
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["xcuda.42".to_string()]);
        assert!(write(Path::new("/nonexistent/dir"), 1, &c, None).is_err());
        assert!(own_start_ticks().is_some());
    }
}
