//! Fault injection (driven by `simgpu-ctl fault`, read by the fakes).
//!
//! * sticky: the client's calls return CUDA_ERROR_ILLEGAL_ADDRESS from then on.
//! * xid N: an NVML XidCriticalError event and an `NVRM: Xid` record in the
//!   node's simulated kernel log (as the real driver writes to /dev/kmsg);
//!   a fatal Xid (see [`is_fatal_xid`]) also makes every current client of
//!   the GPU fail with CUDA_ERROR_LAUNCH_FAILED, stickily.
//! * lost: NVML returns NVML_ERROR_GPU_IS_LOST, CUDA CUDA_ERROR_DEVICE_UNAVAILABLE
//!   (and Xid 79, "fallen off the bus").
//! * clear: undo lost and every sticky error (the Xid history stays).

use crate::codes::cu;
use crate::shared::{now_ns, SharedGpu};
use crate::state::SimDir;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Sticky,
    Xid(u64),
    Lost,
    Clear,
}

/// Xids after which the GPU needs a reset (double-bit ECC, fallen off the
/// bus, GSP/engine failures); others (e.g. 13, 31, 43) are reported only.
pub fn is_fatal_xid(xid: u64) -> bool {
    matches!(xid, 48 | 62 | 64 | 74 | 79 | 92 | 94 | 95 | 119 | 120 | 140)
}

/// Applies a fault; returns the pids it touched.
pub fn inject(
    dir: &SimDir,
    index: u32,
    gpu: &SharedGpu,
    fault: Fault,
    pid: Option<i32>,
) -> Vec<i32> {
    let mut t = gpu.lock();
    t.prune_dead();
    let mut touched = Vec::new();
    let mut mark = |code: u32, t: &mut crate::shared::Table| {
        for c in t.clients.iter() {
            let p = c.pid.load(Ordering::Relaxed);
            if p != 0 && pid.is_none_or(|want| want == p) {
                c.sticky.store(code, Ordering::Relaxed);
                touched.push(p);
            }
        }
    };
    let mut xid = None;
    match fault {
        Fault::Sticky => mark(cu::ILLEGAL_ADDRESS, &mut t),
        Fault::Xid(x) => {
            t.push_xid(x, now_ns());
            xid = Some(x);
            if is_fatal_xid(x) {
                mark(cu::LAUNCH_FAILED, &mut t);
            }
        }
        Fault::Lost => {
            t.lost.store(1, Ordering::Relaxed);
            t.push_xid(79, now_ns());
            xid = Some(79);
        }
        Fault::Clear => {
            t.lost.store(0, Ordering::Relaxed);
            mark(0, &mut t);
        }
    }
    drop(t);
    if let Some(x) = xid {
        if let Err(e) = log_kernel_xid(dir, index, x, pid) {
            eprintln!("simgpu: {}: {e}", dir.kernel_log().display());
        }
    }
    dir.event(index, &format!("fault={fault:?} pids={touched:?}"));
    touched
}

/// Appends an Xid record in `/dev/kmsg`'s format (`prio,seq,usec,flags;text`)
/// with the driver's wording, e.g.
/// `NVRM: Xid (PCI:0000:18:00): 31, pid=1234, name=simgpu, ...`.
fn log_kernel_xid(dir: &SimDir, index: u32, xid: u64, pid: Option<i32>) -> std::io::Result<()> {
    let Some(cfg) = dir.gpus.iter().find(|g| g.index == index) else {
        return Ok(());
    };
    let (domain, bus, device) = cfg.pci();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(dir.kernel_log())?;
    // SAFETY: flock on a descriptor we own; released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut text = String::new();
    f.rewind()?;
    f.read_to_string(&mut text)?;
    let seq = text.lines().count();
    let usec = now_ns() / 1000;
    let pid = pid.map_or("'<unknown>'".to_string(), |p| p.to_string());
    writeln!(
        f,
        "3,{seq},{usec},-;NVRM: Xid (PCI:{domain:04x}:{bus:02x}:{device:02x}): {xid}, pid={pid}, name=simgpu, simulated fault"
    )
}
