//! The per-process counter file `<stats dir>/xcuda.<pid>`: one line of
//! `key=value`, replaced atomically (temp file in the same directory, then
//! rename), so the plugin never reads half a file.

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
    pub fn line(&self) -> String {
        format!(
            "launches={} delayed={} delay_us={} oom={} peak_bytes={} released={}\n",
            self.launches, self.delayed, self.delay_us, self.oom, self.peak_bytes, self.released
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot write xCUDA stats {path}: {source}")]
pub struct StatsError {
    path: PathBuf,
    source: std::io::Error,
}

pub fn path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("xcuda.{pid}"))
}

/// Replaces `<dir>/xcuda.<pid>` with `c`.
pub fn write(dir: &Path, pid: u32, c: &Counters) -> Result<(), StatsError> {
    // Dot-prefixed: never matches the plugin's `xcuda.*`.
    let tmp = dir.join(format!(".xcuda.{pid}.tmp"));
    let dst = path(dir, pid);
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StatsError { path: p, source }
    };
    let mut f = std::fs::File::create(&tmp).map_err(err(&tmp))?;
    f.write_all(c.line().as_bytes()).map_err(err(&tmp))?;
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
        write(d.path(), 42, &c).unwrap();
        c.launches = 6;
        write(d.path(), 42, &c).unwrap();
        let s = std::fs::read_to_string(path(d.path(), 42)).unwrap();
        assert_eq!(
            s,
            "launches=6 delayed=2 delay_us=300 oom=1 peak_bytes=1048576 released=0\n"
        );
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["xcuda.42".to_string()]);
        assert!(write(Path::new("/nonexistent/dir"), 1, &c).is_err());
    }
}
