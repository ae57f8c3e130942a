//! Which Slurm job a process belongs to, decided from what the kernel and
//! root-owned processes say, never from the process's own environment
//! (`SLURM_JOB_ID` is the user's to set).
//!
//! Two sources, the first that answers wins:
//! * the job cgroup (`proctrack/cgroup`, `task/cgroup`): a path component
//!   `job_<N>` in `/proc/<pid>/cgroup`. Slurm creates these root-owned; a
//!   user process cannot move itself out of them.
//! * the process tree (`proctrack/linuxproc`, the dev cluster): the nearest
//!   ancestor whose comm is `slurmstepd` and whose real uid is 0, whose
//!   title is `slurmstepd: [<N>.<step>]`. comm comes from the executed
//!   file's name and a real uid of 0 excludes a user's setuid programs, so
//!   a user cannot fake that ancestor. A process that escaped the tree
//!   (double fork, reparented to init) belongs to no job here, as it does
//!   for linuxproc itself: it gets no job's settings, and the node treats it
//!   as a process of no job.

use std::path::{Path, PathBuf};

/// Ancestors walked at most (a loop in a corrupt /proc must end).
const MAX_DEPTH: usize = 64;

/// Reads /proc (a test can point it elsewhere).
#[derive(Debug, Clone)]
pub struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Procfs {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Procfs {
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Procfs { root: root.into() }
    }

    pub fn path(&self, pid: u32, file: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(file)
    }

    fn read(&self, pid: u32, file: &str) -> Option<String> {
        let bytes = std::fs::read(self.path(pid, file)).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The job process `pid` belongs to, or None.
    pub fn job_of(&self, pid: u32) -> Option<u32> {
        if let Some(job) = self.read(pid, "cgroup").and_then(|t| job_in_cgroup(&t)) {
            return Some(job);
        }
        let mut pid = pid;
        for _ in 0..MAX_DEPTH {
            let (comm, ppid) = parse_stat(&self.read(pid, "stat")?)?;
            if comm == "slurmstepd"
                && self.read(pid, "status").and_then(|s| real_uid(&s)) == Some(0)
            {
                return job_in_stepd_title(&self.read(pid, "cmdline")?);
            }
            if ppid <= 1 {
                return None;
            }
            pid = ppid;
        }
        None
    }
}

impl Procfs {
    /// Whether a root `slurmstepd` of job `job` runs on this host.
    pub fn stepd_of_job_runs(&self, job: u32) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return false;
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .any(|pid| {
                self.read(pid, "comm")
                    .is_some_and(|c| c.trim() == "slurmstepd")
                    && self.read(pid, "status").and_then(|s| real_uid(&s)) == Some(0)
                    && self
                        .read(pid, "cmdline")
                        .and_then(|c| job_in_stepd_title(&c))
                        == Some(job)
            })
    }
}

/// `pid (comm) S ppid …` → (comm, ppid). comm may hold spaces and ')'.
pub fn parse_stat(stat: &str) -> Option<(String, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    Some((comm, rest.next()?.parse().ok()?))
}

/// The real uid of a `/proc/<pid>/status`.
pub fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `slurmstepd: [12.batch]` (NUL-separated cmdline) → 12.
pub fn job_in_stepd_title(cmdline: &str) -> Option<u32> {
    let title = cmdline.split('\0').next()?;
    let inner = title.strip_prefix("slurmstepd: [")?.strip_suffix(']')?;
    inner.split('.').next()?.parse().ok()
}

/// A `job_<N>` component of any hierarchy in `/proc/<pid>/cgroup`.
pub fn job_in_cgroup(cgroup: &str) -> Option<u32> {
    cgroup.lines().find_map(|l| {
        let path = l.splitn(3, ':').nth(2)?;
        Path::new(path)
            .components()
            .find_map(|c| c.as_os_str().to_str()?.strip_prefix("job_")?.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_read_what_the_kernel_and_slurm_write() {
        assert_eq!(
            parse_stat("42 (slurm_script) S 41 42 42 0 -1"),
            Some(("slurm_script".into(), 41))
        );
        assert_eq!(
            parse_stat("42 (a) b) (c) R 7 1"),
            Some(("a) b) (c".into(), 7)),
            "comm is the user's to choose: read up to the last ')'"
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(real_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(1000));
        assert_eq!(job_in_stepd_title("slurmstepd: [12.batch]\0"), Some(12));
        assert_eq!(job_in_stepd_title("slurmstepd: [7.0]"), Some(7));
        assert_eq!(job_in_stepd_title("slurmstepd"), None);
        assert_eq!(
            job_in_cgroup("0::/system.slice/slurmstepd.scope/job_31/step_0/user/task_0\n"),
            Some(31)
        );
        assert_eq!(
            job_in_cgroup("4:memory:/slurm/uid_1000/job_8/step_batch\n1:cpu:/\n"),
            Some(8)
        );
        assert_eq!(
            job_in_cgroup("0::/user.slice\n4:memory:/process_api/ab\n"),
            None
        );
    }

    /// A fake /proc: (pid, comm, ppid, real uid, cmdline).
    fn procfs(procs: &[(u32, &str, u32, u32, &str)]) -> (tempfile::TempDir, Procfs) {
        let tmp = tempfile::tempdir().unwrap();
        for (pid, comm, ppid, uid, cmdline) in procs {
            let d = tmp.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), format!("{pid} ({comm}) S {ppid} 0 0")).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            )
            .unwrap();
            std::fs::write(d.join("cmdline"), cmdline).unwrap();
            std::fs::write(d.join("cgroup"), "0::/\n").unwrap();
            std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
        }
        let p = Procfs::at(tmp.path());
        (tmp, p)
    }

    #[test]
    fn the_job_is_the_nearest_root_slurmstepd_and_never_a_users_forgery() {
        let (_tmp, p) = procfs(&[
            (10, "slurmstepd", 1, 0, "slurmstepd: [5.batch]\0"),
            (11, "slurm_script", 10, 1000, "/bin/sh\0script\0"),
            (12, "python", 11, 1000, "python\0train.py\0"),
            // A user's process renamed to look like a slurmstepd of job 9.
            (13, "slurmstepd", 12, 1000, "slurmstepd: [9.0]\0"),
            (14, "python", 13, 1000, "python\0"),
            // Escaped the tree: reparented to init.
            (20, "python", 1, 1000, "python\0"),
        ]);
        struct Case {
            name: &'static str,
            pid: u32,
            job: Option<u32>,
        }
        for c in [
            Case {
                name: "the batch script",
                pid: 11,
                job: Some(5),
            },
            Case {
                name: "its child",
                pid: 12,
                job: Some(5),
            },
            Case {
                name: "below a forged slurmstepd",
                pid: 14,
                job: Some(5),
            },
            Case {
                name: "escaped to init",
                pid: 20,
                job: None,
            },
            Case {
                name: "no such process",
                pid: 99,
                job: None,
            },
        ] {
            assert_eq!(p.job_of(c.pid), c.job, "{}", c.name);
        }
        assert!(p.stepd_of_job_runs(5));
        assert!(
            !p.stepd_of_job_runs(9),
            "a user's forged slurmstepd is no job's"
        );
    }
}
