//! Graph memory: what CUDA graphs may commit, held against the quota
//! ([`MemCap`]) for as long as the driver may hold it (xcuda/README.md,
//! "Graph memory", states the rule and why):
//!
//! - A graph (the template) holds nothing: adding an allocation node, or
//!   recording one by stream capture (`cuMemAllocAsync` on a capturing
//!   stream), only reserves an address. Its recipe is remembered: each
//!   allocation node (address, bytes), which of them the graph frees itself,
//!   which other addresses it frees when it runs.
//! - An executable graph may commit every allocation node of its graph at
//!   each launch, and what a launch allocates and the graph does not free
//!   outlives the launch. From instantiation to destruction it needs the sum
//!   of its allocation nodes (an upper bound: the driver may overlap
//!   lifetimes that do not meet).
//! - The driver keeps that memory in its graph pool after a launch, even
//!   after the executable graph is destroyed, until `cuDeviceGraphMemTrim`.
//!   xCUDA charges the pool's high water: the demand (every live executable
//!   graph's need, plus allocations a launch left alive whose executable
//!   graph is gone) grows it at instantiation, refused with
//!   `CUDA_ERROR_OUT_OF_MEMORY` when the growth does not fit; a trim
//!   shrinks it back to the demand.
//!
//! Nothing here is counted twice: recorded allocations never enter the
//! [`MemCap`] table of handles, and a free of a graph's address outside
//! the graph gives nothing back (the pool keeps it).

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

use super::memcap::{Kind, MemCap};
use crate::abi::cu;

/// What a graph allocates and frees.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Recipe {
    /// Allocation nodes: address -> bytes.
    allocs: HashMap<u64, u64>,
    /// Of those, the ones the graph frees itself.
    freed_inside: HashSet<u64>,
    /// Addresses allocated elsewhere that the graph frees when it runs.
    frees_elsewhere: HashSet<u64>,
}

impl Recipe {
    fn need(&self) -> u64 {
        self.allocs.values().fold(0, |a, &b| a.saturating_add(b))
    }
    fn is_empty(&self) -> bool {
        self.allocs.is_empty() && self.frees_elsewhere.is_empty()
    }
    fn alloc(&mut self, dptr: u64, size: u64) {
        self.allocs.insert(dptr, size);
    }
    fn free(&mut self, dptr: u64) {
        if self.allocs.contains_key(&dptr) {
            self.freed_inside.insert(dptr);
        } else {
            self.frees_elsewhere.insert(dptr);
        }
    }
    fn merge(&mut self, other: Recipe) {
        self.allocs.extend(other.allocs);
        self.freed_inside.extend(other.freed_inside);
        self.frees_elsewhere.extend(other.frees_elsewhere);
    }
    /// Allocations a launch leaves alive (not freed by the graph).
    fn escaping(&self) -> impl Iterator<Item = u64> + '_ {
        self.allocs
            .keys()
            .copied()
            .filter(|d| !self.freed_inside.contains(d))
    }
}

#[derive(Debug)]
struct Exec {
    /// The device it was instantiated on (its pool's).
    dev: i32,
    recipe: Recipe,
    /// Escaping allocations a launch made that are not freed since.
    alive: HashSet<u64>,
}

#[derive(Debug)]
struct Capture {
    /// `cuStreamBeginCaptureToGraph`: the graph it records into.
    into: Option<u64>,
    recipe: Recipe,
}

/// The books (private; [`GraphMem::hold`] hands out the guard).
#[derive(Debug, Default)]
pub struct Books {
    graphs: HashMap<u64, Recipe>,
    /// Open captures by origin stream key ([`stream_key`]).
    captures: HashMap<u64, Capture>,
    execs: HashMap<u64, Exec>,
    /// Allocations a launch left alive whose executable graph is gone:
    /// address -> (device, bytes).
    orphans: HashMap<u64, (i32, u64)>,
    /// Bytes charged to the quota for each device's graph pool.
    pool: HashMap<i32, u64>,
}

impl Books {
    /// What device `dev`'s pool must hold now.
    fn demand(&self, dev: i32) -> u64 {
        let execs = self.execs.values().filter(|e| e.dev == dev);
        let orphans = self.orphans.values().filter(|o| o.0 == dev);
        execs
            .map(|e| e.recipe.need())
            .chain(orphans.map(|o| o.1))
            .fold(0, u64::saturating_add)
    }
    /// An executable graph (`key`, read after the call) that needed
    /// `before` on device `dev` is to need `recipe`: the pool's charge grows
    /// to the demand that makes before the driver's `call`, refused
    /// (`CUDA_ERROR_OUT_OF_MEMORY`) when the growth does not fit; a failed
    /// call changes nothing.
    fn set_exec(
        &mut self,
        cap: &MemCap,
        dev: i32,
        before: u64,
        recipe: Recipe,
        call: impl FnOnce() -> u32,
        key: impl FnOnce() -> u64,
    ) -> u32 {
        let pool = self.pool.get(&dev).copied().unwrap_or(0);
        let grow = self
            .demand(dev)
            .saturating_sub(before)
            .saturating_add(recipe.need())
            .saturating_sub(pool);
        if grow > 0 && !cap.take(grow) {
            return cu::OUT_OF_MEMORY;
        }
        let rc = call();
        if rc != cu::SUCCESS {
            cap.give(grow);
            return rc;
        }
        *self.pool.entry(dev).or_default() += grow;
        let key = key();
        let alive = self.execs.remove(&key).map(|x| x.alive).unwrap_or_default();
        if !recipe.is_empty() {
            self.execs.insert(key, Exec { dev, recipe, alive });
        }
        rc
    }

    /// `dptr` was freed (outside its graph, or by another graph's launch).
    fn freed(&mut self, dptr: u64) {
        for e in self.execs.values_mut() {
            e.alive.remove(&dptr);
        }
        self.orphans.remove(&dptr);
    }
}

/// Where a stream-ordered allocation or free goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// Not capturing: a real allocation or free, now.
    Real,
    /// Recorded into these captures (origin stream keys); nothing happens now.
    Recorded(Vec<u64>),
    /// Unknown (the driver cannot say): both, which over-counts only.
    Both(Vec<u64>),
}

#[derive(Debug, Default)]
pub struct GraphMem {
    books: Mutex<Books>,
    /// Open captures (the fast path of every stream-ordered call).
    open: AtomicUsize,
    /// Any graph allocation recorded yet (the fast path of every free).
    seen: AtomicBool,
}

thread_local! {
    static THREAD_KEY: Cell<u64> = const { Cell::new(0) };
}

/// The key of stream handle `s` as called (`pt`: a per-thread-default-stream
/// variant): the handle, or for the per-thread default stream (0 through a
/// `_ptsz` variant, or `CU_STREAM_PER_THREAD`, 2) one key per thread.
pub fn stream_key(s: u64, pt: bool) -> u64 {
    if (s == 0 && pt) || s == 2 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let t = THREAD_KEY.with(|k| {
            if k.get() == 0 {
                k.set(NEXT.fetch_add(1, SeqCst));
            }
            k.get()
        });
        (1 << 63) | t
    } else {
        s
    }
}

impl GraphMem {
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the books (while a fork copies the process).
    pub fn hold(&self) -> MutexGuard<'_, Books> {
        self.books()
    }

    /// In a forked child: no graph of the parent's is the child's.
    pub fn after_fork(&self) {
        *self.books() = Books::default();
        self.open.store(0, SeqCst);
    }

    /// Is any stream capture open? (A `cuStreamQuery` then is refused and,
    /// in the global capture mode, invalidates the capture.)
    pub fn capturing(&self) -> bool {
        self.open.load(SeqCst) != 0
    }

    /// Bytes charged for the graph pools.
    pub fn pool(&self) -> u64 {
        self.books()
            .pool
            .values()
            .fold(0, |a, &b| a.saturating_add(b))
    }

    /// Where a stream-ordered call on stream `key` goes. A stream that began
    /// a capture is known; any other stream, while some capture is open,
    /// may have been joined into one by an event: `is_capturing` asks the
    /// driver (None: it cannot say), and a joined stream's calls are
    /// recorded into every open capture (xCUDA does not follow events).
    pub fn target(&self, key: u64, is_capturing: impl FnOnce() -> Option<bool>) -> Target {
        if self.open.load(SeqCst) == 0 {
            return Target::Real;
        }
        let all: Vec<u64> = {
            let b = self.books();
            if b.captures.contains_key(&key) {
                return Target::Recorded(vec![key]);
            }
            b.captures.keys().copied().collect()
        };
        match is_capturing() {
            _ if all.is_empty() => Target::Real,
            Some(true) => Target::Recorded(all),
            Some(false) => Target::Real,
            None => Target::Both(all),
        }
    }

    /// An allocation recorded by the captures `keys`.
    pub fn recorded_alloc(&self, keys: &[u64], dptr: u64, size: u64) {
        self.seen.store(true, SeqCst);
        let mut b = self.books();
        for k in keys {
            if let Some(c) = b.captures.get_mut(k) {
                c.recipe.alloc(dptr, size);
            }
        }
    }

    /// A free recorded by the captures `keys`.
    pub fn recorded_free(&self, keys: &[u64], dptr: u64) {
        let mut b = self.books();
        for k in keys {
            if let Some(c) = b.captures.get_mut(k) {
                c.recipe.free(dptr);
            }
        }
    }

    /// After `cuStreamBeginCapture*` on stream `key` (`into`: the graph of
    /// `cuStreamBeginCaptureToGraph`).
    pub fn capture_began(&self, key: u64, into: Option<u64>, rc: u32) -> u32 {
        if rc == cu::SUCCESS {
            let fresh = Capture {
                into,
                recipe: Recipe::default(),
            };
            if self.books().captures.insert(key, fresh).is_none() {
                self.open.fetch_add(1, SeqCst);
            }
        }
        rc
    }

    /// After `cuStreamEndCapture` on stream `key`: the recipe goes to the
    /// graph `graph()` reads. On a failure the capture stays open only if
    /// the driver says it still is (`still_capturing`); otherwise calls on
    /// that stream count as real again (safe: counted now).
    pub fn capture_ended(
        &self,
        key: u64,
        rc: u32,
        graph: impl FnOnce() -> u64,
        still_capturing: impl FnOnce() -> Option<bool>,
    ) -> u32 {
        if rc != cu::SUCCESS && still_capturing() == Some(true) {
            return rc;
        }
        let mut b = self.books();
        let Some(c) = b.captures.remove(&key) else {
            return rc;
        };
        self.open.fetch_sub(1, SeqCst);
        if rc == cu::SUCCESS && !c.recipe.is_empty() {
            let g = c.into.unwrap_or_else(graph);
            b.graphs.entry(g).or_default().merge(c.recipe);
        }
        rc
    }

    /// `cuGraphAddMemAllocNode` succeeded.
    pub fn alloc_node(&self, g: u64, dptr: u64, size: u64) {
        self.seen.store(true, SeqCst);
        self.books().graphs.entry(g).or_default().alloc(dptr, size);
    }

    /// `cuGraphAddMemFreeNode` succeeded.
    pub fn free_node(&self, g: u64, dptr: u64) {
        self.books().graphs.entry(g).or_default().free(dptr);
    }

    /// `cuGraphInstantiate*` on device `dev` (the current context's): grows
    /// that pool's charge to the demand with this executable graph before
    /// the driver's `call` (refused when that does not fit, as the driver
    /// itself may); `exec` reads the handle.
    pub fn instantiate(
        &self,
        cap: &MemCap,
        g: u64,
        dev: i32,
        call: impl FnOnce() -> u32,
        exec: impl FnOnce() -> u64,
    ) -> u32 {
        let mut b = self.books();
        let recipe = b.graphs.get(&g).cloned().unwrap_or_default();
        b.set_exec(cap, dev, 0, recipe, call, exec)
    }

    /// `cuGraphExecUpdate*`: executable graph `e` takes graph `g`'s nodes,
    /// so its need becomes `g`'s. What a launch before the update left
    /// alive and `g` does not allocate is no longer `e`'s: it stays counted
    /// as an orphan until it is freed. The pool's charge grows to the new
    /// demand before the driver's `call`, refused when it does not fit; a
    /// failed update changes nothing. `dev`: the current context's device,
    /// where `e` is not known yet. (Keeping both graphs' needs, as before,
    /// refused allocations the driver had room for.)
    pub fn exec_updated(
        &self,
        cap: &MemCap,
        e: u64,
        g: u64,
        dev: i32,
        call: impl FnOnce() -> u32,
    ) -> u32 {
        let mut b = self.books();
        let recipe = b.graphs.get(&g).cloned().unwrap_or_default();
        let (before, dev, left) = match b.execs.get(&e) {
            Some(x) => {
                let left: Vec<(u64, u64)> = x
                    .alive
                    .iter()
                    .filter(|d| !recipe.allocs.contains_key(d))
                    .map(|&d| (d, x.recipe.allocs.get(&d).copied().unwrap_or(0)))
                    .collect();
                let kept = left.iter().fold(0u64, |a, l| a.saturating_add(l.1));
                (x.recipe.need().saturating_sub(kept), x.dev, left)
            }
            None => (0, dev, Vec::new()),
        };
        let rc = b.set_exec(cap, dev, before, recipe, call, || e);
        if rc == cu::SUCCESS {
            for (d, size) in left {
                if let Some(x) = b.execs.get_mut(&e) {
                    x.alive.remove(&d);
                }
                b.orphans.insert(d, (dev, size));
            }
        }
        rc
    }

    /// After `cuGraphLaunch`: what the graph frees of others' is freed
    /// (a plain allocation's quota comes back), what it leaves alive is.
    pub fn launched(&self, cap: &MemCap, e: u64, rc: u32) -> u32 {
        if rc != cu::SUCCESS || !self.seen.load(SeqCst) {
            return rc;
        }
        let mut b = self.books();
        let Some(x) = b.execs.get_mut(&e) else {
            return rc;
        };
        x.alive = x.recipe.escaping().collect();
        let frees: Vec<u64> = x.recipe.frees_elsewhere.iter().copied().collect();
        for d in frees {
            cap.forget(Kind::Device, d);
            b.freed(d);
        }
        rc
    }

    /// A device address freed outside any graph (`cuMemFree*`,
    /// `cuMemFreeAsync` on a stream not capturing).
    pub fn freed(&self, dptr: u64) {
        if self.seen.load(SeqCst) {
            self.books().freed(dptr);
        }
    }

    /// After `cuGraphExecDestroy`: its need leaves the demand, except what
    /// its last launch left alive; the pool keeps its charge until a trim.
    pub fn exec_destroyed(&self, e: u64, rc: u32) -> u32 {
        if rc == cu::SUCCESS {
            let mut b = self.books();
            if let Some(x) = b.execs.remove(&e) {
                for d in x.alive {
                    let size = x.recipe.allocs.get(&d).copied().unwrap_or(0);
                    b.orphans.insert(d, (x.dev, size));
                }
            }
        }
        rc
    }

    /// After `cuGraphDestroy`: the template is gone (its executable graphs stay).
    pub fn graph_destroyed(&self, g: u64, rc: u32) -> u32 {
        if rc == cu::SUCCESS {
            self.books().graphs.remove(&g);
        }
        rc
    }

    /// After `cuDeviceGraphMemTrim(dev)`: that pool's charge comes back to
    /// its demand.
    pub fn trimmed(&self, cap: &MemCap, dev: i32, rc: u32) -> u32 {
        if rc == cu::SUCCESS {
            let mut b = self.books();
            let d = b.demand(dev);
            if let Some(pool) = b.pool.get_mut(&dev) {
                if *pool > d {
                    cap.give(*pool - d);
                    *pool = d;
                }
            }
        }
        rc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: u64 = 1 << 30;
    const G: u64 = 0x100;
    const S: u64 = 0x200;

    fn instantiate(m: &GraphMem, cap: &MemCap, g: u64, e: u64) -> u32 {
        m.instantiate(cap, g, 0, || cu::SUCCESS, || e)
    }

    fn plain_alloc(cap: &MemCap, h: u64, n: u64) -> u32 {
        cap.alloc(Kind::Device, n, || cu::SUCCESS, || h, || n)
    }

    /// An executable graph updated with a graph that allocates more holds
    /// that graph's need from the update on, refused when it does not fit;
    /// a failed update leaves the books as they were; what a launch before
    /// the update left alive stays counted until it is freed.
    #[test]
    fn an_update_takes_the_new_graphs_need_charged_before_the_driver_runs_it() {
        const G2: u64 = 0x101;
        const G3: u64 = 0x102;
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        m.alloc_node(G, 0xa000, Q / 4); // escapes: alive after a launch
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        assert_eq!(m.launched(&cap, 0xe, cu::SUCCESS), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 4);
        m.alloc_node(G2, 0xb000, Q / 2);
        m.free_node(G2, 0xb000);
        let update = |g: u64, rc: u32| m.exec_updated(&cap, 0xe, g, 0, || rc);
        assert_eq!(
            update(G2, cu::GRAPH_EXEC_UPDATE_FAILURE),
            cu::GRAPH_EXEC_UPDATE_FAILURE
        );
        assert_eq!(cap.used(), Q / 4, "a failed update charges nothing");
        assert_eq!(update(G2, cu::SUCCESS), cu::SUCCESS);
        assert_eq!(
            cap.used(),
            3 * Q / 4,
            "G2's need beside G's allocation, still alive"
        );
        m.alloc_node(G3, 0xc000, Q); // beside the orphan: 5Q/4
        assert_eq!(update(G3, cu::SUCCESS), cu::OUT_OF_MEMORY);
        assert_eq!(cap.used(), 3 * Q / 4);
        // G's allocation freed, the pool trimmed: G2's need alone.
        m.freed(0xa000);
        assert_eq!(m.trimmed(&cap, 0, cu::SUCCESS), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2, "the update left only G2's need");
        // Updated with a graph of no memory nodes: nothing is needed.
        assert_eq!(update(0x999, cu::SUCCESS), cu::SUCCESS);
        m.trimmed(&cap, 0, cu::SUCCESS);
        assert_eq!(cap.used(), 0);
        assert_eq!(m.exec_destroyed(0xe, cu::SUCCESS), cu::SUCCESS);
    }

    /// The case: a graph that allocates Q/2 and frees it itself
    /// commits Q/2 at every launch: with 3Q/4 held, it does not fit.
    #[test]
    fn in_graph_alloc_and_free_is_held_from_instantiation() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        m.alloc_node(G, 0xa000, Q / 2);
        m.free_node(G, 0xa000);
        assert_eq!(cap.used(), 0, "a template holds nothing");
        assert_eq!(plain_alloc(&cap, 1, 3 * Q / 4), cu::SUCCESS);
        let mut called = false;
        let rc = m.instantiate(
            &cap,
            G,
            0,
            || {
                called = true;
                cu::SUCCESS
            },
            || 0xe,
        );
        assert_eq!((rc, called), (cu::OUT_OF_MEMORY, false));
        assert_eq!(cap.used(), 3 * Q / 4);
        // The other order: the executable graph first, then the plain allocation.
        assert_eq!(cap.free(Kind::Device, 1, || cu::SUCCESS), cu::SUCCESS);
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        assert_eq!(m.launched(&cap, 0xe, cu::SUCCESS), cu::SUCCESS);
        assert_eq!(m.launched(&cap, 0xe, cu::SUCCESS), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2, "every launch within the one charge");
        assert_eq!(plain_alloc(&cap, 2, 3 * Q / 4), cu::OUT_OF_MEMORY);
        assert!(cap.peak() <= Q);
    }

    #[test]
    fn the_pool_is_held_past_exec_destroy_until_a_trim() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        m.alloc_node(G, 0xa000, Q / 2);
        m.free_node(G, 0xa000);
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        m.launched(&cap, 0xe, cu::SUCCESS);
        assert_eq!(m.exec_destroyed(0xe, cu::SUCCESS), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2, "the driver's pool keeps it");
        // A new executable graph reuses the pool: nothing more is charged.
        assert_eq!(instantiate(&m, &cap, G, 0xf), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2);
        m.exec_destroyed(0xf, cu::SUCCESS);
        // A failed trim gives nothing back; a trim does.
        m.trimmed(&cap, 0, cu::INVALID_VALUE);
        assert_eq!(cap.used(), Q / 2);
        m.trimmed(&cap, 0, cu::SUCCESS);
        assert_eq!((cap.used(), m.pool()), (0, 0));
        // A failed instantiation gives its growth back.
        assert_eq!(
            m.instantiate(&cap, G, 0, || cu::INVALID_VALUE, || 0x10),
            cu::INVALID_VALUE
        );
        assert_eq!(cap.used(), 0);
    }

    #[test]
    fn a_trim_gives_back_only_its_own_devices_pool() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        m.alloc_node(G, 0xa000, Q / 4);
        m.free_node(G, 0xa000);
        m.alloc_node(G + 1, 0xb000, Q / 2);
        m.free_node(G + 1, 0xb000);
        assert_eq!(m.instantiate(&cap, G, 0, || 0, || 0xe), cu::SUCCESS);
        assert_eq!(m.instantiate(&cap, G + 1, 1, || 0, || 0xf), cu::SUCCESS);
        m.exec_destroyed(0xe, cu::SUCCESS);
        m.exec_destroyed(0xf, cu::SUCCESS);
        m.trimmed(&cap, 1, cu::SUCCESS);
        assert_eq!(cap.used(), Q / 4, "device 0's pool is untouched");
        m.trimmed(&cap, 0, cu::SUCCESS);
        assert_eq!((cap.used(), m.pool()), (0, 0));
    }

    #[test]
    fn capture_records_instead_of_counting_and_nothing_twice() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        let never = || -> Option<bool> { panic!("a known stream needs no driver call") };
        assert_eq!(m.target(S, never), Target::Real);
        m.capture_began(S, None, cu::SUCCESS);
        assert_eq!(m.target(S, never), Target::Recorded(vec![S]));
        // Another stream while a capture is open: the driver says.
        assert_eq!(m.target(0x300, || Some(false)), Target::Real);
        assert_eq!(m.target(0x300, || Some(true)), Target::Recorded(vec![S]));
        assert_eq!(m.target(0x300, || None), Target::Both(vec![S]));
        m.recorded_alloc(&[S], 0xb000, Q / 2);
        m.recorded_free(&[S], 0xb000);
        assert_eq!(cap.used(), 0);
        m.capture_ended(S, cu::SUCCESS, || G, || None);
        assert_eq!(m.target(S, never), Target::Real);
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2);
        assert_eq!(plain_alloc(&cap, 1, 3 * Q / 4), cu::OUT_OF_MEMORY);
    }

    #[test]
    fn a_graph_allocation_freed_outside_is_counted_once_and_outlives_its_exec() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        m.alloc_node(G, 0xa000, Q / 2); // no free node: it escapes
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        m.launched(&cap, 0xe, cu::SUCCESS);
        // cuMemFree of it: not in the plain books, so the cap is untouched...
        assert_eq!(cap.free(Kind::Device, 0xa000, || cu::SUCCESS), cu::SUCCESS);
        m.freed(0xa000);
        assert_eq!(cap.used(), Q / 2);
        // ...and once the pool is trimmed with the exec gone, all of it is back.
        m.exec_destroyed(0xe, cu::SUCCESS);
        m.trimmed(&cap, 0, cu::SUCCESS);
        assert_eq!(cap.used(), 0);
        // Launched, not freed, exec destroyed: still alive, a trim keeps it.
        assert_eq!(instantiate(&m, &cap, G, 0xf), cu::SUCCESS);
        m.launched(&cap, 0xf, cu::SUCCESS);
        m.exec_destroyed(0xf, cu::SUCCESS);
        m.trimmed(&cap, 0, cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2);
        m.freed(0xa000);
        m.trimmed(&cap, 0, cu::SUCCESS);
        assert_eq!(cap.used(), 0);
    }

    #[test]
    fn a_captured_free_of_a_plain_allocation_gives_back_at_launch() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        assert_eq!(plain_alloc(&cap, 0xc000, Q / 4), cu::SUCCESS);
        m.capture_began(S, None, cu::SUCCESS);
        m.recorded_free(&[S], 0xc000);
        m.capture_ended(S, cu::SUCCESS, || G, || None);
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 4, "still allocated until the graph runs");
        m.seen.store(true, SeqCst);
        m.launched(&cap, 0xe, cu::SUCCESS);
        assert_eq!(cap.used(), 0);
    }

    #[test]
    fn a_failed_end_keeps_the_capture_only_while_the_driver_says_so() {
        let m = GraphMem::default();
        m.capture_began(S, None, cu::SUCCESS);
        m.capture_ended(S, 908, || G, || Some(true));
        assert_eq!(m.target(S, || None), Target::Recorded(vec![S]));
        m.capture_ended(S, cu::STREAM_CAPTURE_INVALIDATED, || G, || Some(false));
        assert_eq!(m.target(S, || None), Target::Real);
        assert_eq!(m.open.load(SeqCst), 0);
    }

    #[test]
    fn capture_to_graph_adds_to_that_graph() {
        let cap = MemCap::new(Some(Q));
        let m = GraphMem::default();
        m.alloc_node(G, 0xa000, Q / 4);
        m.capture_began(S, Some(G), cu::SUCCESS);
        m.recorded_alloc(&[S], 0xb000, Q / 4);
        m.capture_ended(S, cu::SUCCESS, || 0xdead, || None);
        assert_eq!(instantiate(&m, &cap, G, 0xe), cu::SUCCESS);
        assert_eq!(cap.used(), Q / 2);
    }

    #[test]
    fn per_thread_default_streams_are_keyed_per_thread() {
        let here = stream_key(0, true);
        assert_eq!(here, stream_key(2, false));
        let there = std::thread::spawn(|| stream_key(0, true)).join().unwrap();
        assert_ne!(here, there);
        assert_eq!(stream_key(0x4000, true), 0x4000);
    }
}
