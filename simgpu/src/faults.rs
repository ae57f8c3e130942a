//! Fault injection (driven by `simgpu-ctl fault`, read by the fakes).
//!
//! * sticky: the client's calls return CUDA_ERROR_ILLEGAL_ADDRESS from then on.
//! * xid N: an NVML XidCriticalError event; a fatal Xid (see [`is_fatal_xid`])
//!   also makes every current client of the GPU fail with
//!   CUDA_ERROR_LAUNCH_FAILED, stickily.
//! * lost: NVML returns NVML_ERROR_GPU_IS_LOST, CUDA CUDA_ERROR_DEVICE_UNAVAILABLE.
//! * clear: undo lost and every sticky error (the Xid history stays).

use crate::codes::cu;
use crate::shared::{now_ns, SharedGpu};
use crate::state::SimDir;
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
    match fault {
        Fault::Sticky => mark(cu::ILLEGAL_ADDRESS, &mut t),
        Fault::Xid(x) => {
            t.push_xid(x, now_ns());
            if is_fatal_xid(x) {
                mark(cu::LAUNCH_FAILED, &mut t);
            }
        }
        Fault::Lost => {
            t.lost.store(1, Ordering::Relaxed);
            t.push_xid(79, now_ns());
        }
        Fault::Clear => {
            t.lost.store(0, Ordering::Relaxed);
            mark(0, &mut t);
        }
    }
    drop(t);
    dir.event(index, &format!("fault={fault:?} pids={touched:?}"));
    touched
}
