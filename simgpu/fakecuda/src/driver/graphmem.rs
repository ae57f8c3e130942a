//! Graph memory as the real driver keeps it (CUDA programming guide,
//! "Graph memory nodes"), so that a test can hold xCUDA's books against
//! the driver's own:
//!
//! - An allocation node (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync`
//!   recorded by stream capture) reserves an address and nothing else.
//! - A launch maps physical memory for every allocation node of its
//!   executable graph into the device's graph pool (charged to the client);
//!   what the graph does not free stays allocated after the launch.
//! - A free (a free node of any graph when it runs, `cuMemFree*`,
//!   `cuMemFreeAsync`) gives the memory back to the pool, not to the GPU;
//!   freeing what is not allocated is `CUDA_ERROR_INVALID_VALUE`.
//! - The pool keeps what it mapped, past the executable graph's and the
//!   graph's destruction, until `cuDeviceGraphMemTrim` unmaps what no live
//!   allocation holds.
//!
//! The model maps the whole of a launch's allocation nodes at once (no
//! reuse between nodes whose lifetimes do not meet): the most a real
//! driver may hold, which is what a cap has to cover.

use super::*;
use std::collections::HashSet;

/// A graph's (or executable graph's) memory nodes.
#[derive(Default, Clone)]
pub(super) struct Nodes {
    allocs: Vec<u64>,
    frees: Vec<u64>,
}

#[derive(Default)]
pub(super) struct GraphBooks {
    /// Addresses allocation nodes reserved: address -> (device, bytes).
    addrs: HashMap<u64, (usize, u64)>,
    /// Memory nodes by graph or executable graph handle.
    nodes: HashMap<usize, Nodes>,
    /// Open captures' memory nodes, by stream key.
    capturing: HashMap<u64, Nodes>,
    /// Graph allocations a launch made that nothing has freed yet.
    live: HashSet<u64>,
    /// Bytes mapped into each device's graph pool.
    pool: HashMap<usize, u64>,
}

impl GraphBooks {
    fn live_bytes(&self, dev: usize) -> u64 {
        self.live
            .iter()
            .filter_map(|a| self.addrs.get(a))
            .filter(|x| x.0 == dev)
            .map(|x| x.1)
            .sum()
    }

    /// A context's device gone: its graph memory with it.
    pub(super) fn forget_device(&mut self, dev: usize) {
        let addrs = &self.addrs;
        self.live
            .retain(|a| addrs.get(a).is_some_and(|x| x.0 != dev));
        self.pool.remove(&dev);
    }
}

/// A new address for an allocation node of `size` bytes on the current
/// device (apart from ordinary allocations' addresses).
fn reserve(l: &mut Local, dev: usize, size: u64) -> R<u64> {
    if size == 0 {
        return Err(cu::INVALID_VALUE);
    }
    let addr = 0x7e00_0000_0000u64 + alloc_id(l) as u64 * 0x1_0000_0000;
    l.graphs.addrs.insert(addr, (dev, size));
    Ok(addr)
}

/// `cuGraphAddMemAllocNode`: reserves an address in graph `g`.
pub fn graph_alloc_node(g: Handle, size: u64) -> R<u64> {
    let (p, dev) = current()?;
    let mut l = p.local();
    if !matches!(l.objs.get(&(g as usize)), Some(Obj::Graph(_))) {
        return Err(cu::INVALID_VALUE);
    }
    let addr = reserve(&mut l, dev, size)?;
    l.graphs
        .nodes
        .entry(g as usize)
        .or_default()
        .allocs
        .push(addr);
    Ok(addr)
}

/// `cuGraphAddMemFreeNode`: graph `g` frees `dptr` when it runs; only a
/// graph allocation can be freed so (the driver's rule).
pub fn graph_free_node(g: Handle, dptr: u64) -> R<()> {
    let p = proc_()?;
    let mut l = p.local();
    if !matches!(l.objs.get(&(g as usize)), Some(Obj::Graph(_)))
        || !l.graphs.addrs.contains_key(&dptr)
    {
        return Err(cu::INVALID_VALUE);
    }
    l.graphs
        .nodes
        .entry(g as usize)
        .or_default()
        .frees
        .push(dptr);
    Ok(())
}

/// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` on stream `s`: on a
/// capturing stream an allocation node of the capture, else a real
/// allocation.
pub fn stream_alloc(size: u64, s: Handle, pt: bool) -> R<u64> {
    let (p, dev) = current()?;
    let mut l = p.local();
    let key = stream_key(&l, s, pt, dev)?;
    if !l.captures.contains_key(&key) {
        drop(l);
        return mem_alloc(size, Mem::Linear);
    }
    let addr = reserve(&mut l, dev, size)?;
    l.graphs.capturing.entry(key).or_default().allocs.push(addr);
    Ok(addr)
}

/// `cuMemFreeAsync` on stream `s`: on a capturing stream a free node of
/// the capture ("must therefore be passed the address of a graph
/// allocation"), else a free now.
pub fn stream_free(dptr: u64, s: Handle, pt: bool) -> R<()> {
    let (p, dev) = current()?;
    let mut l = p.local();
    let key = stream_key(&l, s, pt, dev)?;
    if !l.captures.contains_key(&key) {
        drop(l);
        return mem_free(dptr, Mem::Linear);
    }
    if !l.graphs.addrs.contains_key(&dptr) {
        return Err(cu::INVALID_VALUE);
    }
    l.graphs.capturing.entry(key).or_default().frees.push(dptr);
    Ok(())
}

/// The capture on `key` ended into graph `g` (a new one, or the graph it
/// captured into): its memory nodes join the graph's.
pub(super) fn capture_ended(l: &mut Local, key: u64, g: usize) {
    if let Some(n) = l.graphs.capturing.remove(&key) {
        let to = l.graphs.nodes.entry(g).or_default();
        to.allocs.extend(n.allocs);
        to.frees.extend(n.frees);
    }
}

/// Executable graph `e` takes graph `g`'s memory nodes (instantiation, update).
pub(super) fn copy_nodes(l: &mut Local, g: usize, e: usize) {
    match l.graphs.nodes.get(&g).cloned() {
        Some(n) => l.graphs.nodes.insert(e, n),
        None => l.graphs.nodes.remove(&e),
    };
}

/// A graph or executable graph destroyed: its nodes go; what it allocated
/// stays allocated, and the pool keeps its memory.
pub(super) fn destroyed(l: &mut Local, h: usize) {
    l.graphs.nodes.remove(&h);
}

/// A graph allocation freed outside a graph (`cuMemFree*`, a
/// `cuMemFreeAsync` not captured): None when `dptr` is no graph address.
pub(super) fn free_outside(l: &mut Local, dptr: u64) -> Option<R<()>> {
    l.graphs.addrs.contains_key(&dptr).then(|| {
        if l.graphs.live.remove(&dptr) {
            Ok(())
        } else {
            Err(cu::INVALID_VALUE)
        }
    })
}

/// The memory side of launching executable graph `e` on device `dev`:
/// its allocations mapped (the pool grown and charged to the client where
/// it holds less than they need beside what is live), then its frees done.
/// An allocation of `e` still live (launched, never freed), or a free of
/// something not allocated, fails the launch before anything changes.
pub(super) fn launch(p: &Proc, dev: usize, e: usize) -> R<()> {
    let mut l = p.local();
    let Some(n) = l.graphs.nodes.get(&e).cloned() else {
        return Ok(());
    };
    let b = &l.graphs;
    let relaunch = n.allocs.iter().any(|a| b.live.contains(a));
    let bad_free = n
        .frees
        .iter()
        .any(|f| !b.live.contains(f) && !n.allocs.contains(f));
    if relaunch || bad_free {
        return Err(cu::INVALID_VALUE);
    }
    let mine: u64 = n
        .allocs
        .iter()
        .filter_map(|a| b.addrs.get(a))
        .map(|x| x.1)
        .sum();
    let need = b.live_bytes(dev) + mine;
    let pool = b.pool.get(&dev).copied().unwrap_or(0);
    if need > pool {
        charge(p, dev, need - pool)?;
        l.graphs.pool.insert(dev, need);
    }
    l.graphs.live.extend(n.allocs.iter().copied());
    for f in &n.frees {
        l.graphs.live.remove(f);
    }
    Ok(())
}

/// `cuDeviceGraphMemTrim(dev)`: the pool gives back what no live graph
/// allocation holds.
pub fn graph_mem_trim(d: c_int) -> R<()> {
    let p = proc_()?;
    p.dev(d)?;
    let dev = d as usize;
    let mut l = p.local();
    let live = l.graphs.live_bytes(dev);
    let Some(pool) = l.graphs.pool.get_mut(&dev) else {
        return Ok(());
    };
    let back = pool.saturating_sub(live);
    *pool -= back;
    drop(l);
    give_back(p, dev, back);
    Ok(())
}
