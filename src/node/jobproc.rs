//! Which Slurm job a process belongs to, decided from what the kernel and
//! root-owned processes say, never from the process's own environment
//! (`SLURM_JOB_ID` is the user's to set).
//!
//! Two sources, the first that answers wins:
//! * the job cgroup (`proctrack/cgroup`, `task/cgroup`): Slurm creates it
//!   root-owned and a user process cannot move itself out of it. Its name
//!   is not the job id on every release (below), so the job is the one of
//!   the root `slurmstepd` living in the same job cgroup, whose title names
//!   it. A process left in the cgroup of a job whose steps have all ended
//!   (no slurmstepd there any more) belongs to no job.
//! * the process tree (`proctrack/linuxproc`, or no cgroup v2): the nearest
//!   ancestor whose comm is `slurmstepd` and whose real uid is 0, whose
//!   title is `slurmstepd: [<N>.<step>]`. comm comes from the executed
//!   file's name and a real uid of 0 excludes a user's setuid programs, so
//!   a user cannot fake that ancestor. A process that escaped the tree
//!   (double fork, reparented to init) belongs to no job here, as it does
//!   for linuxproc itself: it gets no job's settings, and the node treats it
//!   as a process of no job.
//!
//! How Slurm names the cgroups (its sources, `src/plugins/cgroup/v2/cgroup_v2.c`,
//! `cgroup_p_step_create`): under slurmd's scope (by default
//! `system.slice/slurmstepd.scope`) a job directory, in it `step_<step>`
//! (`step_batch`, `step_extern`, `step_interactive`, `step_0`, …; before
//! 26.05 a het component adds `+<n>`), in that `slurm` (slurmstepd itself)
//! and `user/task_<i>` (the tasks).
//!
//! | release | job directory |
//! |---|---|
//! | 22.05, 24.11, 25.05, 25.11 | `job_<id>` |
//! | 26.05, `CgroupJobIdPaths=yes` in cgroup.conf | `job_<id>` |
//! | 26.05, default | the job's SLUID as `print_sluid` writes it (`src/common/sluid.c`): `s` and 13 Crockford base-32 characters, e.g. `s0KQ4ZD3BV2N1M` |
//!
//! cgroup v1 (`src/plugins/cgroup/v1/xcgroup.c`) names `job_<id>` under
//! `slurm/uid_<uid>` on every one of these releases; its hierarchies are
//! read by that name.
//!
//! slurmstepd's title did not change: `_set_job_log_prefix`
//! (`src/slurmd/slurmstepd/slurmstepd.c`) writes `[<id>.<step>]` from
//! `log_build_step_id_str`, which prints the numeric job id whenever the
//! step has one (the SLUID only where it has none), on 22.05 through
//! 26.05; from 24.05 a step manager appends ` stepmgr` inside the brackets.

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
        if let Some(cgroup) = self.read(pid, "cgroup") {
            let job = match job_dir_in_cgroup(&cgroup) {
                Some(dir) => self.job_in_dir(&dir.path),
                None => job_in_v1_cgroup(&cgroup),
            };
            if job.is_some() {
                return job;
            }
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
        self.root_stepds().any(|(_, j)| j == job)
    }

    /// The job of the root `slurmstepd` in job cgroup `dir` (a cgroup v2
    /// path as `/proc/<pid>/cgroup` writes it).
    fn job_in_dir(&self, dir: &str) -> Option<u32> {
        self.root_stepds().find_map(|(pid, job)| {
            let text = self.read(pid, "cgroup")?;
            let own = job_dir_in_cgroup(&text)?;
            (own.path == dir).then_some(job)
        })
    }

    /// Every process whose comm is `slurmstepd`, of real uid 0, with the job
    /// its title names: (pid, job).
    fn root_stepds(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                // comm first: one small read per process, the rest only for
                // slurmstepd.
                if self.read(pid, "comm")?.trim() != "slurmstepd"
                    || real_uid(&self.read(pid, "status")?) != Some(0)
                {
                    return None;
                }
                Some((pid, job_in_stepd_title(&self.read(pid, "cmdline")?)?))
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

/// What a Slurm job cgroup is named by: its job id or its SLUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobDirName {
    /// `job_<id>`.
    Id(u32),
    /// `s` and 13 base-32 characters (Slurm 26.05's default).
    Sluid(String),
}

/// A Slurm job cgroup found in a cgroup v2 path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDir {
    /// From the cgroup root to the job directory, as `/proc/<pid>/cgroup`
    /// writes it (`/system.slice/slurmstepd.scope/job_7`).
    pub path: String,
    pub name: JobDirName,
}

/// The characters of a SLUID after its `s` (`cb32map` in Slurm's
/// `src/common/sluid.c`: Crockford's base 32, upper case).
const SLUID_DIGITS: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A job directory's name as Slurm writes it: `job_<id>` or a SLUID.
pub fn job_dir_name(name: &str) -> Option<JobDirName> {
    if let Some(id) = name.strip_prefix("job_") {
        // Digits only: `parse` would take a leading '+'.
        return (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .then(|| id.parse().ok().map(JobDirName::Id))?;
    }
    let digits = name.strip_prefix('s')?;
    (digits.len() == 13 && digits.chars().all(|c| SLUID_DIGITS.contains(c)))
        .then(|| JobDirName::Sluid(name.to_string()))
}

/// The Slurm job cgroup of a cgroup v2 path (the `0::` line of
/// `/proc/<pid>/cgroup`): the component named as [`job_dir_name`] says
/// that is followed by a `step_<step>` component, as Slurm's cgroup/v2
/// plugin lays them out on every release.
pub fn job_dir_in_cgroup(cgroup: &str) -> Option<JobDir> {
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    parts.windows(2).enumerate().find_map(|(at, pair)| {
        let name = job_dir_name(pair[0])?;
        pair[1].starts_with("step_").then(|| JobDir {
            path: format!("/{}", parts[..=at].join("/")),
            name,
        })
    })
}

/// A `job_<N>` component of a cgroup v1 hierarchy in `/proc/<pid>/cgroup`
/// (Slurm's cgroup/v1 plugin: `/slurm/uid_<uid>/job_<N>/step_<step>`).
pub fn job_in_v1_cgroup(cgroup: &str) -> Option<u32> {
    cgroup
        .lines()
        .filter(|l| !l.starts_with("0::"))
        .find_map(|l| {
            let path = l.splitn(3, ':').nth(2)?;
            Path::new(path).components().find_map(|c| {
                match job_dir_name(c.as_os_str().to_str()?)? {
                    JobDirName::Id(n) => Some(n),
                    JobDirName::Sluid(_) => None,
                }
            })
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
            job_in_stepd_title("slurmstepd: [12.batch stepmgr]\0"),
            Some(12)
        );
        assert_eq!(
            job_in_v1_cgroup("4:memory:/slurm/uid_1000/job_8/step_batch\n1:cpu:/\n"),
            Some(8)
        );
        assert_eq!(
            job_in_v1_cgroup("0::/system.slice/slurmstepd.scope/job_31/step_0\n"),
            None,
            "cgroup v2 is read by its slurmstepd"
        );
        assert_eq!(
            job_in_v1_cgroup("0::/user.slice\n4:memory:/process_api/ab\n"),
            None
        );
    }

    #[test]
    fn job_directories_read_as_each_release_names_them() {
        use JobDirName::{Id, Sluid};
        // (what, the 0:: line, the job directory found)
        for (what, cgroup, want) in [
            (
                "22.05-25.11, 26.05 with CgroupJobIdPaths=yes",
                "0::/system.slice/slurmstepd.scope/job_31/step_0/user/task_0",
                Some(("/system.slice/slurmstepd.scope/job_31", Id(31))),
            ),
            (
                "26.05: the SLUID",
                "0::/system.slice/slurmstepd.scope/s0KQ4ZD3BV2N1M/step_batch/slurm",
                Some((
                    "/system.slice/slurmstepd.scope/s0KQ4ZD3BV2N1M",
                    Sluid("s0KQ4ZD3BV2N1M".into()),
                )),
            ),
            (
                "a multiple-slurmd scope",
                "0::/system.slice/node1_slurmstepd.scope/job_7/step_extern/user",
                Some(("/system.slice/node1_slurmstepd.scope/job_7", Id(7))),
            ),
            (
                "not followed by a step",
                "0::/system.slice/slurmstepd.scope/s0KQ4ZD3BV2N1M",
                None,
            ),
            (
                "SLUID digits exclude I, L, O, U",
                "0::/x/s0KQ4ZD3BV2NIM/step_0",
                None,
            ),
            (
                "lower case is not print_sluid's",
                "0::/x/s0kq4zd3bv2n1m/step_0",
                None,
            ),
            ("12 digits", "0::/x/s0KQ4ZD3BV2N1/step_0", None),
            ("a sign is no job id", "0::/x/job_+7/step_0", None),
            (
                "a user slice",
                "0::/user.slice/user-1000.slice/session-3.scope",
                None,
            ),
            ("cgroup v1 only", "4:memory:/slurm/uid_0/job_8/step_0", None),
        ] {
            let got = job_dir_in_cgroup(&format!("{cgroup}\n"));
            let want = want.map(|(path, name)| JobDir {
                path: path.to_string(),
                name,
            });
            assert_eq!(got, want, "{what}");
        }
    }

    /// A fake /proc: (pid, comm, ppid, real uid, cmdline), every process
    /// in the root cgroup.
    fn procfs(procs: &[(u32, &str, u32, u32, &str)]) -> (tempfile::TempDir, Procfs) {
        let procs: Vec<_> = procs
            .iter()
            .map(|&(pid, comm, ppid, uid, cmdline)| (pid, comm, ppid, uid, cmdline, "/"))
            .collect();
        procfs_in_cgroups(&procs)
    }

    /// A fake /proc: (pid, comm, ppid, real uid, cmdline, cgroup v2 path).
    fn procfs_in_cgroups(
        procs: &[(u32, &str, u32, u32, &str, &str)],
    ) -> (tempfile::TempDir, Procfs) {
        let tmp = tempfile::tempdir().unwrap();
        for (pid, comm, ppid, uid, cmdline, cgroup) in procs {
            let d = tmp.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), format!("{pid} ({comm}) S {ppid} 0 0")).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            )
            .unwrap();
            std::fs::write(d.join("cmdline"), cmdline).unwrap();
            std::fs::write(d.join("cgroup"), format!("1:name=systemd:/\n0::{cgroup}\n")).unwrap();
            std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
        }
        let p = Procfs::at(tmp.path());
        (tmp, p)
    }

    /// Each release's cgroup v2 layout (the job directory's name):
    /// processes of a running job, in its cgroup but out of its process
    /// tree, belong to it; those left in the cgroup of a job whose
    /// slurmstepd is gone, and a user's forgeries, belong to none.
    #[test]
    fn a_process_in_a_job_cgroup_is_the_job_of_the_slurmstepd_there() {
        for (release, running, finished) in [
            ("22.05", "job_41", "job_40"),
            ("24.11", "job_41", "job_40"),
            ("25.11", "job_41", "job_40"),
            ("26.05 CgroupJobIdPaths=yes", "job_41", "job_40"),
            ("26.05", "s0KQ4ZD3BV2N1M", "s0KQ4ZD3BV2N0Z"),
        ] {
            let scope = "/system.slice/slurmstepd.scope";
            let cg = |job: &str, rest: &str| format!("{scope}/{job}/{rest}");
            let batch = cg(running, "step_batch/slurm");
            let task = cg(running, "step_batch/user/task_0");
            let extern_ = cg(running, "step_extern/slurm");
            let gone = cg(finished, "step_batch/user/task_0");
            let forged = format!("{scope}/s1111111111111/step_0/slurm");
            let (_tmp, p) = procfs_in_cgroups(&[
                (10, "slurmstepd", 1, 0, "slurmstepd: [41.batch]\0", &batch),
                (
                    11,
                    "slurmstepd",
                    1,
                    0,
                    "slurmstepd: [41.extern]\0",
                    &extern_,
                ),
                (12, "slurm_script", 10, 1000, "/bin/sh\0", &task),
                // Daemonized (setsid, double fork): reparented to init,
                // still in the job's cgroup.
                (13, "python", 1, 1000, "python\0serve.py\0", &task),
                // Left behind by job 40, whose steps all ended.
                (20, "python", 1, 1000, "python\0train.py\0", &gone),
                // A user's process titled as a slurmstepd of job 40 in job
                // 40's cgroup: not root's.
                (21, "slurmstepd", 1, 1000, "slurmstepd: [40.0]\0", &gone),
                // In no job cgroup and out of every tree.
                (30, "python", 1, 1000, "python\0", "/user.slice"),
                (31, "python", 1, 1000, "python\0", &forged),
            ]);
            for (pid, want, what) in [
                (12, Some(41), "the batch script"),
                (13, Some(41), "a daemonized child of the running job"),
                (20, None, "a straggler of the finished job"),
                (21, None, "a user's forged slurmstepd"),
                (30, None, "a process of no job"),
                (
                    31,
                    None,
                    "a directory named like a SLUID with no slurmstepd",
                ),
            ] {
                assert_eq!(p.job_of(pid), want, "{release}: {what}");
            }
            assert!(p.stepd_of_job_runs(41), "{release}");
            assert!(!p.stepd_of_job_runs(40), "{release}");
        }
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
