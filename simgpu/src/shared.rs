//! The per-GPU table shared by every process using one simulated GPU: a
//! fixed-size `#[repr(C)]` struct in an mmap'd file, guarded by `flock` (the
//! kernel drops it when a holder is SIGKILLed) plus a process-local mutex
//! (flock does not exclude threads sharing one open file description).

use crate::model::{ExternalLoad, KernelSpan};
use std::fs::OpenOptions;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

pub const MAGIC: u64 = 0x6d75_7866_7369_6d31; // "muxfsim1"
pub const LAYOUT_VERSION: u64 = 1;
pub const MAX_CLIENTS: usize = 64;
pub const KERNEL_RING: usize = 16384;
pub const XID_RING: usize = 64;

/// One client process (one slot per process per GPU).
#[repr(C)]
pub struct ClientSlot {
    /// 0 = free.
    pub pid: AtomicI32,
    pub priority: u32,
    pub sm_cap: u32,
    pub thread_pct: u32,
    pub mem_used: u64,
    pub mem_limit: u64,
    /// Non-zero: every call of this client returns this CUresult.
    pub sticky: AtomicU32,
    pub contexts: u32,
    /// MPS server id the client is attached to (0 = no MPS).
    pub mps_server: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelRec {
    pub start_ns: u64,
    pub end_ns: u64,
    pub sms: u32,
    pub priority: u32,
    pub pid: i32,
    pub _pad: u32,
}

impl KernelRec {
    fn span(&self) -> KernelSpan {
        KernelSpan {
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            sms: self.sms,
            priority: self.priority,
            pid: self.pid,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct XidRec {
    pub seq: u64,
    pub time_ns: u64,
    pub xid: u64,
}

#[repr(C)]
pub struct Table {
    pub magic: u64,
    pub layout_version: u64,
    /// Non-zero: the device fell off the bus.
    pub lost: AtomicU32,
    /// External load, parts per million of the SMs.
    pub external_ppm: u32,
    pub xid_next: AtomicU64,
    pub kernel_next: u64,
    pub clients: [ClientSlot; MAX_CLIENTS],
    pub kernels: [KernelRec; KERNEL_RING],
    pub xids: [XidRec; XID_RING],
}

/// CLOCK_MONOTONIC in ns: system-wide, so comparable across processes.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A mapped per-GPU table.
pub struct SharedGpu {
    ptr: *mut Table,
    fd: std::fs::File,
    mutex: Mutex<()>,
}

// SAFETY: all access to the mapping goes through `lock()` (mutex + flock) or
// through atomics; the pointer stays valid for the object's lifetime.
unsafe impl Send for SharedGpu {}
// SAFETY: see above.
unsafe impl Sync for SharedGpu {}

/// Exclusive access to the table.
pub struct Locked<'a> {
    gpu: &'a SharedGpu,
    _guard: MutexGuard<'a, ()>,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking our own flock on a valid fd.
        unsafe { libc::flock(self.gpu.fd.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        // SAFETY: mapping valid; we hold the lock.
        unsafe { &*self.gpu.ptr }
    }
}
impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        // SAFETY: mapping valid; we hold the lock exclusively.
        unsafe { &mut *self.gpu.ptr }
    }
}

impl SharedGpu {
    pub fn size() -> usize {
        std::mem::size_of::<Table>()
    }

    /// Creates (zeroed, with header) or re-initializes the file.
    pub fn create(path: &Path) -> std::io::Result<()> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(Self::size() as u64)?;
        drop(f);
        let g = Self::open(path)?;
        let mut t = g.lock();
        t.magic = MAGIC;
        t.layout_version = LAYOUT_VERSION;
        Ok(())
    }

    pub fn open(path: &Path) -> std::io::Result<Self> {
        let fd = OpenOptions::new().read(true).write(true).open(path)?;
        if fd.metadata()?.len() != Self::size() as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: wrong size (re-run simgpu-ctl init)", path.display()),
            ));
        }
        // SAFETY: mapping a file we opened read-write with exactly the table's size.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let g = SharedGpu {
            ptr: ptr as *mut Table,
            fd,
            mutex: Mutex::new(()),
        };
        // SAFETY: mapping valid; magic is written once at creation.
        let magic = unsafe { std::ptr::read_volatile(&(*g.ptr).magic) };
        if magic != 0 && magic != MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a simgpu table", path.display()),
            ));
        }
        Ok(g)
    }

    pub fn lock(&self) -> Locked<'_> {
        let guard = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            // SAFETY: flock on our own valid fd.
            let r = unsafe { libc::flock(self.fd.as_raw_fd(), libc::LOCK_EX) };
            if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        Locked {
            gpu: self,
            _guard: guard,
        }
    }

    /// Lock-free view for cheap per-call checks (atomics only).
    pub fn table(&self) -> &Table {
        // SAFETY: mapping valid; callers only touch atomic fields.
        unsafe { &*self.ptr }
    }

    pub fn is_lost(&self) -> bool {
        self.table().lost.load(Ordering::Relaxed) != 0
    }
}

impl Drop for SharedGpu {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping created in open().
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, Self::size()) };
    }
}

impl Table {
    pub fn external(&self) -> ExternalLoad {
        ExternalLoad {
            fraction: self.external_ppm as f64 / 1e6,
        }
    }

    /// Kernels that may still matter at or after `since` (ring contents).
    pub fn kernels_since(&self, since: u64) -> Vec<KernelSpan> {
        let mut out = Vec::with_capacity(64);
        out.extend(
            self.records()
                .filter(|k| k.end_ns > since)
                .map(KernelRec::span),
        );
        out
    }

    /// Every kernel the ring still holds, in no particular order.
    pub fn spans(&self) -> impl Iterator<Item = KernelSpan> + '_ {
        self.records().map(KernelRec::span)
    }

    fn records(&self) -> impl Iterator<Item = &KernelRec> {
        let n = (self.kernel_next as usize).min(KERNEL_RING);
        self.kernels[..n].iter()
    }

    pub fn push_kernel(&mut self, k: &KernelSpan) {
        let i = (self.kernel_next as usize) % KERNEL_RING;
        self.kernels[i] = KernelRec {
            start_ns: k.start_ns,
            end_ns: k.end_ns,
            sms: k.sms,
            priority: k.priority,
            pid: k.pid,
            _pad: 0,
        };
        self.kernel_next += 1;
    }

    pub fn slot_of(&self, pid: i32) -> Option<usize> {
        self.clients
            .iter()
            .position(|c| c.pid.load(Ordering::Relaxed) == pid)
    }

    /// Frees slots of dead processes; returns their pids.
    pub fn prune_dead(&mut self) -> Vec<i32> {
        let mut dead = Vec::new();
        for c in self.clients.iter_mut() {
            let pid = c.pid.load(Ordering::Relaxed);
            if pid != 0 && !pid_alive(pid) {
                dead.push(pid);
                c.pid.store(0, Ordering::Relaxed);
                c.mem_used = 0;
                c.contexts = 0;
                c.sticky.store(0, Ordering::Relaxed);
            }
        }
        dead
    }

    pub fn mem_used(&self) -> u64 {
        self.clients
            .iter()
            .filter(|c| c.pid.load(Ordering::Relaxed) != 0)
            .map(|c| c.mem_used)
            .sum()
    }

    pub fn push_xid(&mut self, xid: u64, now: u64) -> u64 {
        let seq = self.xid_next.load(Ordering::Relaxed) + 1;
        self.xids[(seq as usize) % XID_RING] = XidRec {
            seq,
            time_ns: now,
            xid,
        };
        self.xid_next.store(seq, Ordering::Release);
        seq
    }

    /// Xid records with seq > `after`, oldest first.
    pub fn xids_after(&self, after: u64) -> Vec<XidRec> {
        let last = self.xid_next.load(Ordering::Acquire);
        let first = after.max(last.saturating_sub(XID_RING as u64 - 1)) + 1;
        (first..=last)
            .map(|s| self.xids[(s as usize) % XID_RING])
            .filter(|r| r.seq > after)
            .collect()
    }
}
