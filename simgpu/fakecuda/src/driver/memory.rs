//! Memory: allocations charged to the client and the GPU, pools, the VMM
//! address space, pinned host memory, and array sizes.

use super::*;

pub fn mem_info() -> R<(u64, u64)> {
    let (p, dev) = current()?;
    let d = &p.devs[dev];
    let t = d.gpu.lock();
    let total = d.cfg.memory_bytes();
    let mut free = total.saturating_sub(t.mem_used());
    let mut shown_total = total;
    if let Some(s) = t.slot_of(p.pid) {
        let c = &t.clients[s];
        if c.mem_limit < total {
            shown_total = c.mem_limit;
            free = free.min(c.mem_limit.saturating_sub(c.mem_used));
        }
    }
    Ok((free, shown_total))
}

/// What an allocation is; a handle is only freed by its own kind's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mem {
    /// cuMemAlloc*, cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync, ...
    Linear,
    /// cuMemCreate (a physical allocation handle).
    Vmm,
    /// cuArrayCreate, cuArray3DCreate.
    Array,
    /// cuMipmappedArrayCreate.
    Mipmapped,
}

impl Mem {
    /// The error for freeing something that is not one of these.
    fn bad_handle(self) -> u32 {
        match self {
            Mem::Linear | Mem::Vmm => cu::INVALID_VALUE,
            Mem::Array | Mem::Mipmapped => cu::INVALID_HANDLE,
        }
    }
}

/// Takes `size` bytes of the client's and the GPU's memory for a new `kind`
/// allocation; returns its handle (a device address for linear memory).
pub fn mem_alloc(size: u64, kind: Mem) -> R<u64> {
    mem_alloc_at(size, kind, false)
}

/// As [`mem_alloc`]; `narrow`: a 32-bit device address (the v1 entry points'
/// `CUdeviceptr_v1`).
pub fn mem_alloc_at(size: u64, kind: Mem, narrow: bool) -> R<u64> {
    let (p, dev) = current()?;
    if size == 0 {
        return Err(cu::INVALID_VALUE);
    }
    charge(p, dev, size)?;
    let mut l = p.local();
    let id = alloc_id(&mut l) as u64;
    let addr = if narrow {
        // Below 4 GiB: 64 KiB apart, from 1 GiB up (ids grow by 16).
        match 0x4000_0000u64
            .checked_add(id * 0x1000)
            .filter(|&a| a < u32::MAX as u64)
        {
            Some(a) => a,
            None => {
                drop(l);
                give_back(p, dev, size);
                return Err(cu::OUT_OF_MEMORY);
            }
        }
    } else {
        0x7f00_0000_0000u64 + id * 0x1_0000_0000
    };
    l.allocs.insert(addr, (dev, size, kind));
    Ok(addr)
}

/// Takes `size` bytes of the client's and the GPU's memory on `dev`
/// (`CUDA_ERROR_OUT_OF_MEMORY` past either), the client's peak noted.
pub(super) fn charge(p: &Proc, dev: usize, size: u64) -> R<()> {
    let d = &p.devs[dev];
    let mut t = d.gpu.lock();
    let used = t.mem_used();
    let s = t.slot_of(p.pid).ok_or(cu::INVALID_CONTEXT)?;
    let c = &mut t.clients[s];
    if c.mem_used + size > c.mem_limit || used + size > d.cfg.memory_bytes() {
        return Err(cu::OUT_OF_MEMORY);
    }
    c.mem_used += size;
    p.mem_peak[dev].fetch_max(c.mem_used, Ordering::Relaxed);
    Ok(())
}

/// What this process holds on `dev` by the driver's books, and the most
/// it held at once: (used, peak) bytes.
pub fn mem_books(dev: c_int) -> R<(u64, u64)> {
    let p = proc_()?;
    let d = p.dev(dev)?;
    let t = d.gpu.lock();
    let used = t.slot_of(p.pid).map_or(0, |s| t.clients[s].mem_used);
    Ok((used, p.mem_peak[dev as usize].load(Ordering::Relaxed)))
}

/// Gives a `kind` allocation's memory back; a graph allocation's goes back
/// to its device's graph pool ([`super::graphmem`]).
pub fn mem_free(addr: u64, kind: Mem) -> R<()> {
    let p = proc_()?;
    let (dev, size) = {
        let mut l = p.local();
        if kind == Mem::Linear {
            if let Some(r) = graphmem::free_outside(&mut l, addr) {
                return r;
            }
        }
        match l.allocs.get(&addr) {
            Some(&(dev, size, k)) if k == kind => {
                l.allocs.remove(&addr);
                (dev, size)
            }
            _ => return Err(kind.bad_handle()),
        }
    };
    give_back(p, dev, size);
    check(p, dev)
}

pub(super) fn give_back(p: &Proc, dev: usize, size: u64) {
    let d = &p.devs[dev];
    let mut t = d.gpu.lock();
    if let Some(s) = t.slot_of(p.pid) {
        t.clients[s].mem_used = t.clients[s].mem_used.saturating_sub(size);
    }
}

// ---- pools, VMM address space, pinned host memory --------------------------

pub fn pool_create() -> R<Handle> {
    let (p, _) = current()?;
    let mut l = p.local();
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Pool);
    Ok(h as Handle)
}

pub fn pool_check(pool: Handle) -> R<()> {
    let p = proc_()?;
    match p.local().objs.get(&(pool as usize)) {
        Some(Obj::Pool) => Ok(()),
        _ => Err(cu::INVALID_VALUE),
    }
}

pub fn pool_destroy(pool: Handle) -> R<()> {
    let p = proc_()?;
    let mut l = p.local();
    match l.objs.get(&(pool as usize)) {
        Some(Obj::Pool) => {
            l.objs.remove(&(pool as usize));
            Ok(())
        }
        _ => Err(cu::INVALID_VALUE),
    }
}

/// cuMemAddressReserve: virtual addresses only, no memory.
pub fn address_reserve(size: u64) -> R<u64> {
    let (p, _) = current()?;
    if size == 0 {
        return Err(cu::INVALID_VALUE);
    }
    let mut l = p.local();
    let base = 0x5f00_0000_0000u64 + (alloc_id(&mut l) as u64) * 0x1_0000_0000;
    l.reserved.insert(base, size);
    Ok(base)
}

pub fn address_free(base: u64, size: u64) -> R<()> {
    let p = proc_()?;
    let mut l = p.local();
    match l.reserved.get(&base) {
        Some(&s) if s == size && !l.mapped.contains_key(&base) => {
            l.reserved.remove(&base);
            Ok(())
        }
        _ => Err(cu::INVALID_VALUE),
    }
}

/// cuMemMap: a whole reservation onto a cuMemCreate handle of at least its size.
pub fn map(base: u64, size: u64, handle: u64) -> R<()> {
    let (p, _) = current()?;
    let mut l = p.local();
    let fits = l.reserved.get(&base).is_some_and(|&s| s >= size);
    let backed = matches!(l.allocs.get(&handle), Some(&(_, n, Mem::Vmm)) if n >= size);
    if !fits || !backed || l.mapped.contains_key(&base) {
        return Err(cu::INVALID_VALUE);
    }
    l.mapped.insert(base, handle);
    Ok(())
}

pub fn set_access(base: u64) -> R<()> {
    let (p, _) = current()?;
    if p.local().mapped.contains_key(&base) {
        Ok(())
    } else {
        Err(cu::INVALID_VALUE)
    }
}

pub fn unmap(base: u64) -> R<()> {
    let p = proc_()?;
    match p.local().mapped.remove(&base) {
        Some(_) => Ok(()),
        None => Err(cu::INVALID_VALUE),
    }
}

/// Pinned host memory: plain host memory here, never the GPU's.
pub fn host_alloc(size: u64) -> R<*mut std::ffi::c_void> {
    let p = proc_()?;
    if size == 0 {
        return Err(cu::INVALID_VALUE);
    }
    // SAFETY: malloc of a non-zero size; freed by host_free.
    let ptr = unsafe { libc::malloc(size as usize) };
    if ptr.is_null() {
        return Err(cu::OUT_OF_MEMORY);
    }
    p.local().host.insert(ptr as usize);
    Ok(ptr)
}

pub fn host_free(ptr: *mut std::ffi::c_void) -> R<()> {
    let p = proc_()?;
    if !p.local().host.remove(&(ptr as usize)) {
        return Err(cu::INVALID_VALUE);
    }
    // SAFETY: a pointer host_alloc returned, freed once (just removed from the set).
    unsafe { libc::free(ptr) };
    Ok(())
}

/// Bytes of an array of `width x height x depth` elements (0 = that
/// dimension unused) of `channels` channels of CUarray_format `format`, with
/// `levels` mipmap levels (each halving every extent, down to 1). Formats the
/// fake does not know, no width or more than 4 channels: INVALID_VALUE.
pub fn array_bytes(extent: [u64; 3], format: u32, channels: u32, levels: u32) -> R<u64> {
    let elem = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return Err(cu::INVALID_VALUE),
    };
    if extent[0] == 0 || !(1..=4).contains(&channels) || levels == 0 {
        return Err(cu::INVALID_VALUE);
    }
    let elements: u64 = (0..levels.min(64))
        .map(|l| extent.iter().map(|&e| (e >> l).max(1)).product::<u64>())
        .sum();
    Ok(elements * elem * channels as u64)
}
