//! The kernel's own cap on an offline job's GPU memory: the cgroup v2 `dmem`
//! controller (Linux 6.14+), where the kernel and the GPU driver have it.
//!
//! The kernel documents it (Documentation/admin-guide/cgroup-v2.rst, "DMEM"):
//! `dmem.capacity` (root cgroup only) lists the regions drivers registered,
//! one `<name> <bytes>` line each, e.g. `drm/0000:03:00.0/vram0 12550144`;
//! `dmem.max` (every cgroup but the root) takes `<name> <bytes>` lines with
//! the memory controller's semantics: an allocation that would take the
//! cgroup past it fails. A controller appears in a cgroup's
//! `dmem.max` only once its parent lists `dmem` in `cgroup.subtree_control`
//! ("echo +dmem to cgroup.subtree_control", the controller's commit).
//!
//! Root writes the job's cap for its GPU's region into the job's own cgroup
//! (Slurm's, root-owned), so it holds whatever the job does with its
//! environment: unsetting `LD_PRELOAD` and the `CUDA_MPS_*` variables drops
//! xCUDA and MPS's client limit, not the cgroup. Without the controller, or
//! without a region for the GPU, nothing is written and the cap stays
//! xCUDA's, with the police behind it (docs/security.md, "Limits of an offline job").

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where Slurm's cgroup/v2 plugin puts the job cgroups under the cgroup
/// root when slurmstepd's own `/proc/self/cgroup` does not say (Slurm's
/// cgroup_v2 documentation: `system.slice/slurmstepd.scope`).
pub const SLURM_JOBS_PARENT: &str = "system.slice/slurmstepd.scope";

/// The regions `dmem.capacity` lists: (name, bytes); lines that do not
/// read as `<name> <bytes>` are skipped.
pub fn parse_capacity(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (name, bytes) = l.trim().rsplit_once(char::is_whitespace)?;
            Some((name.trim().to_string(), bytes.parse().ok()?))
        })
        .collect()
}

/// Whether `cgroup.controllers` text names `dmem`.
pub fn lists_dmem(controllers: &str) -> bool {
    controllers.split_whitespace().any(|c| c == "dmem")
}

/// The cgroup v2 `dmem` controller under `cgroup_root`: None when the kernel
/// does not offer it there; else the regions its `dmem.capacity` lists.
pub fn regions(cgroup_root: &Path) -> Option<Vec<(String, u64)>> {
    let controllers = std::fs::read_to_string(cgroup_root.join("cgroup.controllers")).ok()?;
    if !lists_dmem(&controllers) {
        return None;
    }
    let capacity = std::fs::read_to_string(cgroup_root.join("dmem.capacity")).unwrap_or_default();
    Some(parse_capacity(&capacity))
}

/// A PCI bus id as the kernel's region names spell it (`0000:18:00.0`),
/// from NVML's form (`00000000:18:00.0`) or the kernel's own; None when it
/// does not read as `<domain>:<bus>:<device>.<function>`.
pub fn kernel_bus_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let n = |s: &str| u8::from_str_radix(s, 16).ok();
    Some(format!(
        "{domain:04x}:{:02x}:{:02x}.{:x}",
        n(bus)?,
        n(device)?,
        n(function)?
    ))
}

/// The GPU's device-memory region among `regions`: the one whose name has
/// the GPU's bus id as a path component and ends in a `vram` part
/// (`drm/0000:18:00.0/vram0`); else the only one naming the bus id. None
/// when the driver registered none for this GPU. The `vram` preference is
/// the kernel's DRM naming; which name NVIDIA's driver registers is not
/// documented yet (muxflow-doctor shows the regions a node has).
pub fn region_of(regions: &[(String, u64)], bus_id: &str) -> Option<String> {
    let bus = kernel_bus_id(bus_id)?;
    let named: Vec<&str> = regions
        .iter()
        .map(|(r, _)| r.as_str())
        .filter(|r| r.split('/').any(|c| c.eq_ignore_ascii_case(&bus)))
        .collect();
    let vram = named
        .iter()
        .find(|r| r.rsplit('/').next().is_some_and(|l| l.starts_with("vram")));
    match (vram, &named[..]) {
        (Some(r), _) | (None, [r]) => Some(r.to_string()),
        _ => None,
    }
}

/// Job `job_id`'s cgroup under `cgroup_root`: the part of slurmstepd's own
/// cgroup (`self_cgroup`, the text of the job's slurmstepd's
/// `/proc/self/cgroup`) up to its job directory, whichever name the Slurm
/// release gives it ([`crate::node::jobproc`]: `job_<id>`, or the SLUID on
/// 26.05); else `job_<id>` in Slurm's default place ([`SLURM_JOBS_PARENT`]),
/// which holds where cgroup.conf has `CgroupJobIdPaths=yes` or the release
/// is older than 26.05. A SLUID does not name the job: it is taken as this
/// job's only because the text is the job's own slurmstepd's.
/// Pure; the caller checks the directory is there and root's.
pub fn job_cgroup(cgroup_root: &Path, self_cgroup: &str, job_id: u32) -> PathBuf {
    use crate::node::jobproc::{job_dir_in_cgroup, JobDirName};
    let rel = match job_dir_in_cgroup(self_cgroup) {
        Some(dir) if dir.name == JobDirName::Id(job_id) => dir.path,
        Some(dir) if matches!(dir.name, JobDirName::Sluid(_)) => dir.path,
        _ => format!("{SLURM_JOBS_PARENT}/job_{job_id}"),
    };
    cgroup_root.join(rel.trim_start_matches('/'))
}

/// Job `job_id`'s cgroup directory (from the cgroup root) as its Prolog
/// must name it, before the job's slurmstepd may exist: a directory
/// already there under `cgroup_root` (the job's or its extern step's),
/// else what the release writes — the SLUID slurmd gave the Prolog (26.05:
/// `SLURM_JOB_SLUID`, checked to be one) unless cgroup.conf sets
/// `CgroupJobIdPaths=yes` (`job_id_paths`), else `job_<id>`.
pub fn job_cgroup_for_prolog(
    cgroup_root: &Path,
    job_id: u32,
    sluid: Option<&str>,
    job_id_paths: bool,
) -> String {
    use crate::node::jobproc::{job_dir_name, JobDirName};
    let by_id = format!("job_{job_id}");
    let sluid = sluid.filter(|s| matches!(job_dir_name(s), Some(JobDirName::Sluid(_))));
    let parent = cgroup_root.join(SLURM_JOBS_PARENT);
    let name = match sluid {
        Some(s) if parent.join(s).is_dir() => s.to_string(),
        _ if parent.join(&by_id).is_dir() => by_id,
        Some(s) if !job_id_paths => s.to_string(),
        _ => by_id,
    };
    format!("/{SLURM_JOBS_PARENT}/{name}")
}

/// Does cgroup.conf's text set `CgroupJobIdPaths=yes` (Slurm 26.05: job
/// cgroups named `job_<id>` rather than by SLUID)? Keys are
/// case-insensitive, as Slurm reads them.
pub fn job_id_paths(cgroup_conf: &str) -> bool {
    cgroup_conf.lines().any(|l| {
        let l = l.split('#').next().unwrap_or("").trim();
        l.split_once('=').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("CgroupJobIdPaths")
                && v.trim().eq_ignore_ascii_case("yes")
        })
    })
}

/// The `dmem.max` line for `bytes` of `region`.
pub fn max_line(region: &str, bytes: u64) -> String {
    format!("{region} {bytes}\n")
}

/// The limit `dmem.max` text sets for `region`: Some(bytes), None for
/// `max` or no line.
pub fn limit_in(max_text: &str, region: &str) -> Option<u64> {
    max_text.lines().find_map(|l| {
        let (name, v) = l.trim().rsplit_once(char::is_whitespace)?;
        (name.trim() == region).then(|| v.trim().parse().ok())?
    })
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DmemError {
    #[error("no cgroup of job {job} at {path} (Slurm's cgroup/v2 plugin makes it; with proctrack/linuxproc there is none)")]
    NoJobCgroup { job: u32, path: PathBuf },
    #[error("{path}: not root's or not a directory, so root does not write there")]
    Untrusted { path: PathBuf },
    #[error("{path}: the dmem controller is not offered to the job cgroups (enable it above: echo +dmem > cgroup.subtree_control of each ancestor)")]
    NotOffered { path: PathBuf },
    #[error("{path}: {why}")]
    Io { path: PathBuf, why: String },
    #[error("{path} reads {got:?} for {region} after writing {want} bytes")]
    NotTaken {
        path: PathBuf,
        region: String,
        want: u64,
        got: Option<u64>,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> DmemError + '_ {
    move |e| DmemError::Io {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

/// Root, at an offline step's start: caps job `job_id`'s cgroup (found as
/// [`job_cgroup`] says from `self_cgroup`) at `bytes` of `region`. Enables
/// the controller for the job cgroups first where their parent offers it
/// but has not enabled it. Returns the `dmem.max` written, read back.
pub fn cap_job(
    cgroup_root: &Path,
    self_cgroup: &str,
    job_id: u32,
    region: &str,
    bytes: u64,
) -> Result<PathBuf, DmemError> {
    let dir = job_cgroup(cgroup_root, self_cgroup, job_id);
    let meta = std::fs::symlink_metadata(&dir).map_err(|_| DmemError::NoJobCgroup {
        job: job_id,
        path: dir.clone(),
    })?;
    if !meta.is_dir() || meta.uid() != 0 {
        return Err(DmemError::Untrusted { path: dir });
    }
    let parent = dir.parent().unwrap_or(cgroup_root);
    let max = dir.join("dmem.max");
    if !max.exists() {
        let offered = parent.join("cgroup.controllers");
        let text = std::fs::read_to_string(&offered).unwrap_or_default();
        if !lists_dmem(&text) {
            return Err(DmemError::NotOffered { path: offered });
        }
        let subtree = parent.join("cgroup.subtree_control");
        write_once(&subtree, "+dmem\n")?;
    }
    write_once(&max, &max_line(region, bytes))?;
    let back = std::fs::read_to_string(&max).map_err(io(&max))?;
    match limit_in(&back, region) {
        Some(b) if b <= bytes => Ok(max),
        got => Err(DmemError::NotTaken {
            path: max,
            region: region.to_string(),
            want: bytes,
            got,
        }),
    }
}

/// One write(2) of `text` (cgroup files take one setting per write).
fn write_once(path: &Path, text: &str) -> Result<(), DmemError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io(path))?;
    f.write_all(text.as_bytes()).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prolog_names_the_job_cgroup_as_the_release_will() {
        let root = tempfile::tempdir().unwrap();
        let sluid = "s43DM8HQPPH900";
        let at = |name: &str| format!("/{SLURM_JOBS_PARENT}/{name}");
        // Nothing there yet: 26.05's SLUID, unless CgroupJobIdPaths=yes.
        assert_eq!(
            job_cgroup_for_prolog(root.path(), 7, Some(sluid), false),
            at(sluid)
        );
        assert_eq!(
            job_cgroup_for_prolog(root.path(), 7, Some(sluid), true),
            at("job_7")
        );
        // Older releases give no SLUID; text that is none is not taken.
        assert_eq!(
            job_cgroup_for_prolog(root.path(), 7, None, false),
            at("job_7")
        );
        assert_eq!(
            job_cgroup_for_prolog(root.path(), 7, Some("../x"), false),
            at("job_7")
        );
        // A directory already there wins.
        std::fs::create_dir_all(root.path().join(SLURM_JOBS_PARENT).join("job_7")).unwrap();
        assert_eq!(
            job_cgroup_for_prolog(root.path(), 7, Some(sluid), false),
            at("job_7")
        );
        std::fs::create_dir_all(root.path().join(SLURM_JOBS_PARENT).join(sluid)).unwrap();
        assert_eq!(
            job_cgroup_for_prolog(root.path(), 7, Some(sluid), true),
            at(sluid)
        );
    }

    #[test]
    fn cgroup_conf_says_job_id_paths() {
        assert!(job_id_paths(
            "CgroupPlugin=cgroup/v2\ncgroupjobidpaths = Yes\n"
        ));
        assert!(!job_id_paths("CgroupJobIdPaths=no\n"));
        assert!(!job_id_paths("#CgroupJobIdPaths=yes\n"));
        assert!(!job_id_paths(""));
    }

    #[test]
    fn capacity_and_max_read_as_the_kernel_writes_them() {
        let cap = parse_capacity(
            "drm/0000:18:00.0/vram0 85899345920\ndrm/0000:18:00.0/stolen 8650752\nbroken\n",
        );
        assert_eq!(cap.len(), 2);
        assert_eq!(cap[1], ("drm/0000:18:00.0/stolen".to_string(), 8_650_752));
        let max = "drm/0000:18:00.0/vram0 1073741824\ndrm/0000:18:00.0/stolen max\n";
        for (region, want) in [
            ("drm/0000:18:00.0/vram0", Some(1 << 30)),
            ("drm/0000:18:00.0/stolen", None),
            ("drm/0000:28:00.0/vram0", None),
        ] {
            assert_eq!(limit_in(max, region), want, "{region}");
        }
        assert!(lists_dmem("cpu memory dmem\n"));
        assert!(!lists_dmem("cpu memory dmemx\n"));
    }

    #[test]
    fn the_controller_is_read_from_the_cgroup_root() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(regions(d.path()), None, "no cgroup v2 here");
        std::fs::write(d.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        assert_eq!(regions(d.path()), None, "no dmem controller");
        std::fs::write(d.path().join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
        assert_eq!(regions(d.path()), Some(vec![]), "no region registered");
        std::fs::write(
            d.path().join("dmem.capacity"),
            "drm/0000:18:00.0/vram0 85899345920\n",
        )
        .unwrap();
        assert_eq!(regions(d.path()).unwrap().len(), 1);
    }

    #[test]
    fn a_gpu_finds_its_own_region_by_bus_id() {
        let regions: Vec<(String, u64)> = [
            "drm/0000:18:00.0/stolen",
            "drm/0000:18:00.0/vram0",
            "drm/0000:28:00.0/vram0",
            "nvidia/0000:38:00.0",
            "drm/0000:48:00.0/vram0",
            "drm/0000:48:00.0/vram1",
        ]
        .iter()
        .map(|r| (r.to_string(), 1 << 30))
        .collect();
        // (bus id as NVML or the kernel writes it, region)
        for (bus, want) in [
            ("00000000:18:00.0", Some("drm/0000:18:00.0/vram0")),
            ("0000:28:00.0", Some("drm/0000:28:00.0/vram0")),
            ("00000000:38:00.0", Some("nvidia/0000:38:00.0")),
            ("00000000:48:00.0", Some("drm/0000:48:00.0/vram0")),
            ("00000000:58:00.0", None),
            ("not a bus id", None),
        ] {
            assert_eq!(region_of(&regions, bus).as_deref(), want, "{bus}");
        }
        assert_eq!(kernel_bus_id("00000000:1A:00.0").unwrap(), "0000:1a:00.0");
    }

    #[test]
    fn the_job_cgroup_is_slurmstepds_up_to_the_job() {
        let root = Path::new("/sys/fs/cgroup");
        // (slurmstepd's /proc/self/cgroup, job, cgroup)
        for (text, job, want) in [
            (
                "0::/system.slice/slurmstepd.scope/job_31/step_0/slurm\n",
                31,
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_31",
            ),
            (
                "0::/slurm.slice/node1/job_7/step_batch/user/task_0\n",
                7,
                "/sys/fs/cgroup/slurm.slice/node1/job_7",
            ),
            // Another job's component, or cgroup v1 only: Slurm's default place.
            (
                "0::/system.slice/slurmstepd.scope/job_30/step_0\n",
                31,
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_31",
            ),
            (
                "0::/system.slice/slurmstepd.scope/s0KQ4ZD3BV2N1M/step_batch/slurm\n",
                31,
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/s0KQ4ZD3BV2N1M",
            ),
            (
                "4:memory:/slurm/uid_0/job_31/step_0\n1:name=systemd:/\n",
                31,
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_31",
            ),
        ] {
            assert_eq!(job_cgroup(root, text, job), PathBuf::from(want), "{text}");
        }
    }

    #[test]
    fn root_caps_the_job_cgroup_it_finds_and_reads_the_cap_back() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let parent = root.join(SLURM_JOBS_PARENT);
        let region = "drm/0000:18:00.0/vram0";
        let err = cap_job(root, "", 9, region, 1 << 30).unwrap_err();
        assert!(matches!(err, DmemError::NoJobCgroup { .. }), "{err}");
        std::fs::create_dir_all(parent.join("job_9")).unwrap();
        if nix_uid() != 0 {
            // Not root: the directory is not root's, and root writes only there.
            let err = cap_job(root, "", 9, region, 1 << 30).unwrap_err();
            assert!(matches!(err, DmemError::Untrusted { .. }), "{err}");
            return;
        }
        let err = cap_job(root, "", 9, region, 1 << 30).unwrap_err();
        assert!(matches!(err, DmemError::NotOffered { .. }), "{err}");
        std::fs::write(parent.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
        let max = cap_job(root, "", 9, region, 1 << 30).unwrap();
        assert_eq!(
            std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(),
            "+dmem\n"
        );
        assert_eq!(
            limit_in(&std::fs::read_to_string(max).unwrap(), region),
            Some(1 << 30)
        );
    }

    /// Slurm 26.05's default layout: the job directory is the SLUID that
    /// slurmstepd's own cgroup names; the cap lands there, not in a
    /// `job_<id>` directory.
    #[test]
    fn root_caps_a_sluid_named_job_cgroup_and_reads_the_cap_back() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let parent = root.join(SLURM_JOBS_PARENT);
        let region = "drm/0000:18:00.0/vram0";
        let own = format!("0::/{SLURM_JOBS_PARENT}/s0KQ4ZD3BV2N1M/step_batch/slurm\n");
        let err = cap_job(root, &own, 9, region, 1 << 30).unwrap_err();
        assert!(
            matches!(&err, DmemError::NoJobCgroup { path, .. } if path.ends_with("s0KQ4ZD3BV2N1M")),
            "{err}"
        );
        std::fs::create_dir_all(parent.join("s0KQ4ZD3BV2N1M")).unwrap();
        std::fs::write(parent.join("cgroup.controllers"), "cpu memory dmem\n").unwrap();
        if nix_uid() != 0 {
            let err = cap_job(root, &own, 9, region, 1 << 30).unwrap_err();
            assert!(matches!(err, DmemError::Untrusted { .. }), "{err}");
            return;
        }
        let max = cap_job(root, &own, 9, region, 1 << 30).unwrap();
        assert_eq!(max, parent.join("s0KQ4ZD3BV2N1M/dmem.max"));
        assert_eq!(
            limit_in(&std::fs::read_to_string(max).unwrap(), region),
            Some(1 << 30)
        );
        assert!(!parent.join("job_9").exists());
    }

    fn nix_uid() -> u32 {
        std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
    }
}
