//! The offline processes of one GPU as root sees them, for xCUDA's
//! contention brake: `<state_dir>/gpu<i>/offline_procs` (root, 0644, in the
//! root-owned GPU directory), one line `procs=<pid>:<start>,…`.
//!
//! Why it exists: with several offline jobs on a GPU (`[policy]
//! offline_per_gpu` > 1), xCUDA in each must brake when the *online* job
//! needs the GPU, never because of the GPU's other offline jobs. xCUDA runs
//! as the user and cannot tell another user's process's job (its cgroup and
//! environment are not for it to trust or read); root can
//! ([`crate::node::jobproc`]). So `muxflow-police` (root, one per offline job,
//! every `health.police_interval_ms`) writes the GPU's offline processes
//! here, and every xCUDA of the GPU counts every other process on the GPU
//! as contention unless it is listed: the offline processes of a GPU brake
//! together, on the same readings, for the online side alone.
//!
//! The one fact that shapes it: a user must not be able to release the
//! brake for others. Only root writes the file; xCUDA reads it only when
//! root owns it and its directory and neither is writable by group or
//! others ([`crate::records::limits::read_trusted_text`]), and otherwise counts every
//! other process (the brake as it was with one offline job per GPU: it may
//! brake more, never less). Each process is named with its start time
//! (`/proc/<pid>/stat` field 22, clock ticks since boot), so a pid reused
//! by an online process after an offline one exited is not taken for it.
//! A process that started since the last write counts as contention until
//! root lists it (at most one police interval).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::node::jobproc::Procfs;
use crate::records::limits::LimitsError;

/// The file's name in the GPU's state directory (beside the health word).
pub const FILE_NAME: &str = "offline_procs";

/// Largest file read: 4 jobs' worth of processes, with room.
pub const MAX_BYTES: u64 = 64 * 1024;

/// One process: its pid and start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcId {
    pub pid: u32,
    pub start_ticks: u64,
}

impl ProcId {
    /// The process `pid` now; None when it is gone.
    pub fn of(procfs: &Procfs, pid: u32) -> Option<ProcId> {
        let stat = std::fs::read_to_string(procfs.path(pid, "stat")).ok()?;
        Some(ProcId {
            pid,
            start_ticks: start_ticks(&stat)?,
        })
    }
}

/// Field 22 of `/proc/<pid>/stat` (`pid (comm) S ppid …`; comm may hold
/// spaces and ')').
pub fn start_ticks(stat: &str) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    // Fields 3.. follow comm: field 22 is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The file beside a GPU's health word (xCUDA knows the health file's path
/// from its root-owned limits).
pub fn beside(health_file: &Path) -> PathBuf {
    health_file.with_file_name(FILE_NAME)
}

pub fn encode(procs: &BTreeSet<ProcId>) -> String {
    let list: Vec<String> = procs
        .iter()
        .map(|p| format!("{}:{}", p.pid, p.start_ticks))
        .collect();
    format!("procs={}\n", list.join(","))
}

pub fn decode(text: &str) -> Result<BTreeSet<ProcId>, String> {
    let list = text
        .trim()
        .strip_prefix("procs=")
        .ok_or_else(|| format!("expected one line `procs=<pid>:<start>,…`, got {text:?}"))?;
    list.split(',')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (pid, start) = e
                .split_once(':')
                .ok_or_else(|| format!("`{e}` is not <pid>:<start>"))?;
            Ok(ProcId {
                pid: pid.parse().map_err(|_| format!("bad pid in `{e}`"))?,
                start_ticks: start
                    .parse()
                    .map_err(|_| format!("bad start time in `{e}`"))?,
            })
        })
        .collect()
}

/// The offline processes listed in `path`, if only `owner` (root) can have
/// written it.
pub fn read_trusted(path: &Path, owner: u32) -> Result<BTreeSet<ProcId>, LimitsError> {
    let text = crate::records::limits::read_trusted_text(path, owner, MAX_BYTES)?;
    decode(&text).map_err(|why| LimitsError::Corrupt {
        path: path.to_path_buf(),
        why,
    })
}

/// Of the processes `pids` on a GPU, those of the GPU's offline jobs
/// (`offline_jobs`), by `job_of` (root's [`Procfs::job_of`]).
pub fn offline_of(
    pids: impl IntoIterator<Item = u32>,
    offline_jobs: &BTreeSet<u32>,
    job_of: impl Fn(u32) -> Option<u32>,
) -> BTreeSet<u32> {
    pids.into_iter()
        .filter(|&pid| job_of(pid).is_some_and(|j| offline_jobs.contains(&j)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let procs: BTreeSet<ProcId> = [(12, 345), (7, 9)]
            .map(|(pid, start_ticks)| ProcId { pid, start_ticks })
            .into();
        let text = encode(&procs);
        assert_eq!(text, "procs=7:9,12:345\n");
        assert_eq!(decode(&text).unwrap(), procs);
        assert_eq!(decode("procs=\n").unwrap(), BTreeSet::new());
        for bad in ["", "pids=1:2", "procs=1", "procs=x:2", "procs=1:-2"] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn start_time_is_field_22_whatever_the_command_name() {
        let stat =
            "4242 (a) b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(start_ticks(stat), Some(987654));
        assert_eq!(start_ticks("1 (x) S 0"), None);
        let me = ProcId::of(&Procfs::default(), std::process::id()).unwrap();
        assert!(me.start_ticks > 0);
    }

    #[test]
    fn only_the_gpus_offline_jobs_processes_are_listed() {
        let jobs: BTreeSet<u32> = [5, 6].into();
        // 100, 101: offline jobs 5 and 6; 200: the online job 9; 300: no job.
        let job_of = |pid| match pid {
            100 => Some(5),
            101 => Some(6),
            200 => Some(9),
            _ => None,
        };
        assert_eq!(
            offline_of([100, 101, 200, 300], &jobs, job_of),
            [100, 101].into()
        );
    }

    /// A user cannot write the list that would release the brake: only a
    /// file root owns, in a directory root owns, neither writable by others.
    #[test]
    fn a_file_a_user_could_write_is_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("gpu0");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.join(FILE_NAME);
        std::fs::write(&file, "procs=1:2\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        // SAFETY: geteuid cannot fail and touches no memory.
        let me = unsafe { libc::geteuid() };
        assert_eq!(read_trusted(&file, me).unwrap().len(), 1);
        let e = read_trusted(&file, me + 1).unwrap_err().to_string();
        assert!(e.contains("owned by uid"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_trusted(&file, me).unwrap_err().to_string();
        assert!(e.contains("writable"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = read_trusted(&file, me).unwrap_err().to_string();
        assert!(e.contains("its directory"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&file, dir.join("real")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), &file).unwrap();
        assert!(
            read_trusted(&file, me).is_err(),
            "a symlink is not followed"
        );
    }
}
