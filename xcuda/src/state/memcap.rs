//! The memory cap: every capped allocation reserves its size against the
//! quota before it reaches the driver (so concurrent allocations can never
//! overshoot together) and is remembered by handle; frees give it back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;

use crate::abi::cu;

/// Namespaces of handles: device pointers, VMM handles and arrays may share values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Device,
    Vmm,
    Array,
    Mipmapped,
}

#[derive(Debug, Default)]
pub struct MemCap {
    limit: Option<u64>,
    used: AtomicU64,
    peak: AtomicU64,
    refused: AtomicU64,
    live: Mutex<HashMap<(Kind, u64), u64>>,
}

impl MemCap {
    pub fn new(limit: Option<u64>) -> MemCap {
        MemCap {
            limit,
            ..Default::default()
        }
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    pub fn used(&self) -> u64 {
        self.used.load(SeqCst)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(SeqCst)
    }

    /// Allocations refused for the quota.
    pub fn refused(&self) -> u64 {
        self.refused.load(SeqCst)
    }

    fn reserve(&self, n: u64) -> bool {
        let limit = self.limit.unwrap_or(u64::MAX);
        let ok = self
            .used
            .fetch_update(SeqCst, SeqCst, |u| u.checked_add(n).filter(|&t| t <= limit))
            .map(|prev| self.peak.fetch_max(prev + n, SeqCst));
        if ok.is_err() {
            self.refused.fetch_add(1, SeqCst);
        }
        ok.is_ok()
    }

    /// Takes `n` bytes not tied to one handle (the graph pool,
    /// [`super::graphmem`]); false, counted as a refusal, when they do not fit.
    pub fn take(&self, n: u64) -> bool {
        self.reserve(n)
    }

    /// Gives back bytes [`MemCap::take`] took.
    pub fn give(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(SeqCst, SeqCst, |u| Some(u.saturating_sub(n)));
    }

    /// Gives back the handle's size without a driver call (the driver frees
    /// it later by itself: a graph's free node, at the graph's launch).
    /// False when the handle is not in the books.
    pub fn forget(&self, kind: Kind, h: u64) -> bool {
        let size = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(kind, h));
        if let Some(s) = size {
            self.give(s);
        }
        size.is_some()
    }

    /// Reserves `size`, runs the driver's allocation, and on success records
    /// the handle `handle()` reads back from the caller's out-pointer.
    /// `actual` may correct the size after the driver decided it (pitch).
    pub fn alloc(
        &self,
        kind: Kind,
        size: u64,
        call: impl FnOnce() -> u32,
        handle: impl FnOnce() -> u64,
        actual: impl FnOnce() -> u64,
    ) -> u32 {
        if !self.reserve(size) {
            return cu::OUT_OF_MEMORY;
        }
        let rc = call();
        if rc != cu::SUCCESS {
            self.used.fetch_sub(size, SeqCst);
            return rc;
        }
        let real = actual();
        if real > size {
            // Padding the driver added (pitch): counted, never refused after the fact.
            let prev = self.used.fetch_add(real - size, SeqCst);
            self.peak.fetch_max(prev + real - size, SeqCst);
        } else if real < size {
            self.used.fetch_sub(size - real, SeqCst);
        }
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((kind, handle()), real);
        rc
    }

    /// Runs the driver's free and gives the handle's size back on success.
    /// The record leaves the table before the call: once the driver freed an
    /// address, another thread may get it back from its next allocation.
    pub fn free(&self, kind: Kind, h: u64, call: impl FnOnce() -> u32) -> u32 {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let size = live.remove(&(kind, h));
        drop(live);
        let rc = call();
        match size {
            Some(s) if rc == cu::SUCCESS => {
                self.used.fetch_sub(s, SeqCst);
            }
            Some(s) => {
                self.live
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((kind, h), s);
            }
            None => {}
        }
        rc
    }

    /// Holds the allocation table (while a fork copies the process).
    pub fn hold(&self) -> std::sync::MutexGuard<'_, HashMap<(Kind, u64), u64>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In a child forked after start-up: its books start empty. The parent's
    /// allocations are not the child's (a CUDA context does not survive a
    /// fork), and its stats file must count only what the child does, so
    /// that a job's summed figures count nothing twice.
    pub fn after_fork(&self) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).clear();
        for c in [&self.used, &self.peak, &self.refused] {
            c.store(0, SeqCst);
        }
    }

    /// Clamps the driver's (free, total) to the cap.
    pub fn info(&self, free: u64, total: u64) -> (u64, u64) {
        match self.limit {
            None => (free, total),
            Some(l) => (free.min(l.saturating_sub(self.used())), total.min(l)),
        }
    }
}

/// Bytes of an array of `elements` elements with `channels` channels of
/// CUarray_format `format`. Unknown (newer) formats count 16 bytes per
/// channel: the widest known element, so the cap errs on the safe side.
pub fn array_bytes(elements: u64, format: u32, channels: u32) -> u64 {
    let per = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 16,
    };
    elements
        .saturating_mul(per)
        .saturating_mul(channels.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    #[test]
    fn refuses_beyond_the_quota_and_frees_give_back() {
        let m = MemCap::new(Some(100 * MIB));
        let mut next = 0x1000u64;
        let mut alloc = |m: &MemCap, n: u64| {
            next += 0x1000;
            let h = next;
            (m.alloc(Kind::Device, n, || 0, || h, || n), h)
        };
        let (rc, a) = alloc(&m, 60 * MIB);
        assert_eq!(rc, cu::SUCCESS);
        assert_eq!(alloc(&m, 41 * MIB).0, cu::OUT_OF_MEMORY);
        assert_eq!(m.refused(), 1);
        let (rc, _b) = alloc(&m, 40 * MIB);
        assert_eq!(rc, cu::SUCCESS);
        assert_eq!(m.info(80_000 * MIB, 81_559 * MIB), (0, 100 * MIB));
        assert_eq!(m.free(Kind::Device, a, || 0), cu::SUCCESS);
        assert_eq!(m.used(), 40 * MIB);
        assert_eq!(m.peak(), 100 * MIB);
        assert_eq!(m.info(80_000 * MIB, 81_559 * MIB), (60 * MIB, 100 * MIB));
    }

    #[test]
    fn driver_failures_keep_the_books_straight() {
        let m = MemCap::new(Some(10 * MIB));
        assert_eq!(m.alloc(Kind::Vmm, MIB, || 2, || 1, || MIB), 2);
        assert_eq!(m.used(), 0);
        assert_eq!(m.alloc(Kind::Vmm, MIB, || 0, || 7, || MIB), 0);
        // A failed free keeps the record; the same value in another namespace is not it.
        assert_eq!(m.free(Kind::Vmm, 7, || 1), 1);
        assert_eq!(m.free(Kind::Device, 7, || 0), 0);
        assert_eq!(m.used(), MIB);
        assert_eq!(m.free(Kind::Vmm, 7, || 0), 0);
        assert_eq!(m.used(), 0);
    }

    #[test]
    fn padding_the_driver_adds_is_counted() {
        let m = MemCap::new(None);
        m.alloc(Kind::Device, 1000, || 0, || 1, || 1024);
        assert_eq!((m.used(), m.peak()), (1024, 1024));
        assert_eq!(m.info(5, 6), (5, 6));
    }

    #[test]
    fn concurrent_storm_ends_at_zero_and_never_overshoots() {
        let m = Arc::new(MemCap::new(Some(64 * MIB)));
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let mut ok = 0;
                    for i in 0..2000u64 {
                        let h = (t << 32) | i;
                        if m.alloc(Kind::Device, 3 * MIB, || 0, || h, || 3 * MIB) == 0 {
                            ok += 1;
                            assert!(m.used() <= 64 * MIB);
                            assert_eq!(m.free(Kind::Device, h, || 0), 0);
                        }
                    }
                    ok
                })
            })
            .collect();
        let ok: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(ok > 0);
        assert_eq!(m.used(), 0);
        assert!(m.peak() <= 64 * MIB);
    }

    #[test]
    fn a_forked_child_starts_from_zero() {
        let m = MemCap::new(Some(10 * MIB));
        m.alloc(Kind::Device, 8 * MIB, || 0, || 1, || 8 * MIB);
        assert_eq!(
            m.alloc(Kind::Device, 8 * MIB, || 0, || 2, || 8 * MIB),
            cu::OUT_OF_MEMORY
        );
        m.after_fork();
        assert_eq!((m.used(), m.peak(), m.refused()), (0, 0, 0));
        // The parent's handle is not the child's to free.
        assert_eq!(m.free(Kind::Device, 1, || 0), 0);
        assert_eq!(m.used(), 0);
        assert_eq!(m.alloc(Kind::Device, 8 * MIB, || 0, || 3, || 8 * MIB), 0);
    }

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(1024 * 768, 0x20, 4), 1024 * 768 * 16);
        assert_eq!(array_bytes(10, 0x01, 0), 10);
        assert_eq!(array_bytes(10, 0xb0, 2), 320);
    }
}
