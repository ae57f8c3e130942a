//! A model of the kernel's cgroup v2 `dmem` controller, as far as muxflow
//! uses it: a simulated cgroup root under a node's state directory
//! (`<node dir>/cgroup/`), root-owned like the rest of the state, that the
//! node programs are pointed at by root's config (`[paths] cgroup_root`).
//!
//! What the kernel documents (cgroup-v2.rst, "DMEM") and this keeps:
//! `cgroup.controllers` names `dmem`; `dmem.capacity` (root only) lists
//! `<region> <bytes>`; a cgroup's `dmem.max` holds `<region> <bytes|max>`
//! lines and an allocation that would take the cgroup past it fails.
//!
//! Guesses (simgpu/README.md, "The dmem model"): the region name
//! (`drm/<bus id>/vram0`, the kernel's DRM form; NVIDIA's is undocumented);
//! which cgroup a process is in (here: Slurm's `job_<N>` under
//! `system.slice/slurmstepd.scope`, N from the process's nearest root
//! `slurmstepd: [N.x]` ancestor, as proctrack/linuxproc groups processes;
//! the kernel uses the real cgroup membership); the failure
//! (`CUDA_ERROR_OUT_OF_MEMORY` from the allocation, as TTM's failed charge
//! would surface through a driver); and the count (this process's own
//! allocations against the limit, not the whole cgroup's).

use std::path::{Path, PathBuf};

use crate::GpuConfig;

/// The simulated cgroup root of a node's state directory.
pub fn cgroup_root(node_dir: &Path) -> PathBuf {
    node_dir.join("cgroup")
}

/// Where the simulated Slurm job cgroups live, relative to the root (as
/// Slurm's cgroup/v2 plugin places them).
pub const JOBS_PARENT: &str = "system.slice/slurmstepd.scope";

/// The simulated GPU's region name: `drm/0000:18:00.0/vram0`.
pub fn region(cfg: &GpuConfig) -> String {
    let (domain, bus, device) = cfg.pci();
    format!("drm/{domain:04x}:{bus:02x}:{device:02x}.0/vram0")
}

/// Gives the node's kernel the controller, with one region per GPU (what
/// a test or an admin of the simulation does; the Prolog only reads it).
pub fn enable(node_dir: &Path, gpus: &[GpuConfig]) -> std::io::Result<()> {
    let root = cgroup_root(node_dir);
    let parent = root.join(JOBS_PARENT);
    std::fs::create_dir_all(&parent)?;
    std::fs::write(root.join("cgroup.controllers"), "cpu io memory pids dmem\n")?;
    let capacity: String = gpus
        .iter()
        .map(|g| format!("{} {}\n", region(g), g.memory_bytes()))
        .collect();
    std::fs::write(root.join("dmem.capacity"), capacity)?;
    std::fs::write(parent.join("cgroup.controllers"), "cpu memory pids dmem\n")
}

/// Takes the controller away again (the job cgroups stay: Slurm's).
pub fn disable(node_dir: &Path) -> std::io::Result<()> {
    let root = cgroup_root(node_dir);
    for f in [
        root.join("cgroup.controllers"),
        root.join("dmem.capacity"),
        root.join(JOBS_PARENT).join("cgroup.controllers"),
    ] {
        match std::fs::remove_file(&f) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// The `dmem.max` limit for `region` in `text`: Some(bytes); None for
/// `max` or no line.
pub fn limit_in(text: &str, region: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (name, v) = l.trim().rsplit_once(char::is_whitespace)?;
        (name.trim() == region).then(|| v.trim().parse().ok())?
    })
}

/// The Slurm job process `pid` runs in, as the simulated kernel groups it:
/// its nearest ancestor whose comm is `slurmstepd`, real uid 0, titled
/// `slurmstepd: [N.<step>]`. None outside a job.
pub fn job_of(pid: u32) -> Option<u32> {
    let read = |pid: u32, f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).ok();
    let mut pid = pid;
    for _ in 0..64 {
        let stat = read(pid, "stat")?;
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        let comm = stat.get(open + 1..close)?;
        let ppid: u32 = stat
            .get(close + 1..)?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let root = || {
            read(pid, "status")
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))?
                        .split_whitespace()
                        .next()?
                        .parse::<u32>()
                        .ok()
                })
                .is_some_and(|u| u == 0)
        };
        if comm == "slurmstepd" && root() {
            let cmd = read(pid, "cmdline")?;
            let title = cmd.split('\0').next()?;
            let inner = title.strip_prefix("slurmstepd: [")?.strip_suffix(']')?;
            return inner.split('.').next()?.parse().ok();
        }
        if ppid <= 1 {
            return None;
        }
        pid = ppid;
    }
    None
}

/// The simulated kernel's limit on process `pid`'s allocations on `cfg`'s
/// GPU: its job cgroup's `dmem.max` for the GPU's region, when the node's
/// kernel has the controller. None: no limit.
pub fn limit_for(node_dir: &Path, cfg: &GpuConfig, pid: u32) -> Option<u64> {
    let root = cgroup_root(node_dir);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    if !controllers.split_whitespace().any(|c| c == "dmem") {
        return None;
    }
    let job = job_of(pid)?;
    let max = root
        .join(JOBS_PARENT)
        .join(format!("job_{job}"))
        .join("dmem.max");
    limit_in(&std::fs::read_to_string(max).ok()?, &region(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_cgroups_limit_holds_for_its_region_only() {
        let d = tempfile::tempdir().unwrap();
        let g0 = GpuConfig::h100_like(0, 0);
        assert_eq!(region(&g0), "drm/0000:18:00.0/vram0");
        let text = format!("{} 1073741824\ndrm/0000:28:00.0/vram0 max\n", region(&g0));
        assert_eq!(limit_in(&text, &region(&g0)), Some(1 << 30));
        assert_eq!(limit_in(&text, "drm/0000:28:00.0/vram0"), None);
        // This test process is in no Slurm job: no limit, controller or not.
        assert_eq!(limit_for(d.path(), &g0, std::process::id()), None);
        enable(d.path(), std::slice::from_ref(&g0)).unwrap();
        let cap = std::fs::read_to_string(cgroup_root(d.path()).join("dmem.capacity")).unwrap();
        assert_eq!(
            cap,
            format!("drm/0000:18:00.0/vram0 {}\n", g0.memory_bytes())
        );
        assert_eq!(job_of(std::process::id()), None);
        disable(d.path()).unwrap();
        assert!(!cgroup_root(d.path()).join("cgroup.controllers").exists());
    }
}
