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
//! the failure
//! (`CUDA_ERROR_OUT_OF_MEMORY` from the allocation, as TTM's failed charge
//! would surface through a driver); and the count (this process's own
//! allocations against the limit, not the whole cgroup's).
//!
//! Which cgroup a process is in is the kernel's own answer: the `0::` path
//! of its `/proc/<pid>/cgroup`. The dev cluster puts each step's processes
//! in real cgroup v2 directories laid out and named as its Slurm release's
//! cgroup/v2 plugin does (`job_<N>`, or the SLUID on 26.05; scripts/devcluster)
//! and runs each node's slurmd in a cgroup namespace rooted at the node's
//! directory, so the path reads as on a real node; the limit is then found
//! by membership, as the kernel finds it, whatever the directory's name.

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

/// The Slurm job process `pid` runs in by its process tree: its nearest
/// ancestor whose comm is `slurmstepd`, real uid 0, titled
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

/// Process `pid`'s cgroup v2, as the kernel writes it in the `0::` line of
/// `/proc/<pid>/cgroup` (`/system.slice/slurmstepd.scope/job_7/step_0/user/task_0`).
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// The limit on `region` the cgroups from `cgroup` (a path from the root)
/// up to the root's child set in the tree under `root`: the lowest of
/// their `dmem.max` lines (the kernel charges every ancestor), None when
/// none sets one.
pub fn limit_in_tree(root: &Path, cgroup: &str, region: &str) -> Option<u64> {
    let parts: Vec<&str> = cgroup
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    (1..=parts.len())
        .filter_map(|n| {
            let max = root.join(parts[..n].join("/")).join("dmem.max");
            limit_in(&std::fs::read_to_string(max).ok()?, region)
        })
        .min()
}

/// The simulated kernel's limit on process `pid`'s allocations on `cfg`'s
/// GPU: the `dmem.max` for the GPU's region of its cgroup or an ancestor,
/// when the node's kernel has the controller. None: no limit.
pub fn limit_for(node_dir: &Path, cfg: &GpuConfig, pid: u32) -> Option<u64> {
    let root = cgroup_root(node_dir);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    if !controllers.split_whitespace().any(|c| c == "dmem") {
        return None;
    }
    limit_in_tree(&root, &cgroup_of(pid)?, &region(cfg))
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
        // A job cgroup of each release's name, with a step below it: the
        // job's cap holds in the step, the lower of two caps wins.
        let root = cgroup_root(d.path());
        let r = region(&g0);
        for job in ["job_7", "s0KQ4ZD3BV2N1M"] {
            let dir = root.join(JOBS_PARENT).join(job);
            std::fs::create_dir_all(dir.join("step_0/user")).unwrap();
            std::fs::write(dir.join("dmem.max"), format!("{r} 1073741824\n")).unwrap();
            let task = format!("/{JOBS_PARENT}/{job}/step_0/user/task_0");
            assert_eq!(limit_in_tree(&root, &task, &r), Some(1 << 30), "{job}");
            std::fs::write(dir.join("step_0/dmem.max"), format!("{r} 4096\n")).unwrap();
            assert_eq!(limit_in_tree(&root, &task, &r), Some(4096), "{job}");
            assert_eq!(limit_in_tree(&root, "/", &r), None);
            assert_eq!(limit_in_tree(&root, "/user.slice", &r), None);
        }
        disable(d.path()).unwrap();
        assert!(!cgroup_root(d.path()).join("cgroup.controllers").exists());
    }
}
