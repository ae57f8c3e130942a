//! Modules, kernels, streams and graphs: what a launch queues on a
//! stream and how long it takes on the shared GPU.

use super::*;

/// Kernel names encode their solo duration: `sim_kernel_<N>us` (also `ms`/`ns`).
pub fn parse_kernel_name(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("sim_kernel_")?;
    let (num, mult) = if let Some(n) = rest.strip_suffix("us") {
        (n, 1_000)
    } else if let Some(n) = rest.strip_suffix("ms") {
        (n, 1_000_000)
    } else {
        (rest.strip_suffix("ns")?, 1)
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

pub fn function(name: &str) -> R<Handle> {
    current()?;
    kernel(name)
}

/// A kernel by name (`sim_kernel_<N>us`), context-independent like CUDA 12's
/// `CUkernel` (cuLibraryGetKernel); usable wherever a `CUfunction` is.
pub fn kernel(name: &str) -> R<Handle> {
    let p = proc_()?;
    let solo_ns = parse_kernel_name(name).ok_or(cu::NOT_FOUND)?;
    let mut l = p.local();
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Func(Kernel { solo_ns }));
    Ok(h as Handle)
}

/// Stream key: explicit streams by handle; the legacy default stream per
/// device; the per-thread default stream per (thread, device).
pub(super) fn stream_key(l: &Local, s: Handle, pt: bool, dev: usize) -> R<u64> {
    let h = s as usize;
    match h {
        0 if pt => Ok(THREAD_ID.with(|t| (1u64 << 62) | (*t << 8) | dev as u64)),
        0 | 1 => Ok((1u64 << 61) | dev as u64),
        2 => Ok(THREAD_ID.with(|t| (1u64 << 62) | (*t << 8) | dev as u64)),
        _ => match l.objs.get(&h) {
            Some(Obj::Stream) => Ok(h as u64),
            _ => Err(cu::INVALID_HANDLE),
        },
    }
}

/// How many times per window a process recomputes the SM activity its
/// launches' clock follows.
pub(super) const POWER_REFRESH: u64 = 50;

pub(super) fn enqueue(p: &Proc, dev: usize, key: u64, kernels: &[(Kernel, u64)]) -> R<()> {
    let (cap, _) = {
        let l = p.local();
        let c = l.clients[dev].as_ref().ok_or(cu::INVALID_CONTEXT)?;
        (c.sm_cap, c.thread_pct)
    };
    let d = &p.devs[dev];
    let params = d.cfg.model();
    let (mut tail, cached) = {
        let l = p.local();
        (l.tails.get(&key).map_or(0, |x| x.1), l.power[dev])
    };
    let mut t = d.gpu.lock();
    let prio = t.slot_of(p.pid).map_or(0, |s| t.clients[s].priority);
    let now = now_ns();
    let mut recent = t.kernels_since(now);
    // The clock of this launch: the SM activity of the window before it. It
    // moves slowly (a window average), so a reading a fiftieth of a window
    // old serves; a scan of the whole kernel ring per launch would not.
    let (power, fresh) = match cached {
        Some((at, a)) if now.saturating_sub(at) < params.window_ns / POWER_REFRESH => (a, None),
        _ => {
            let from = now.saturating_sub(params.window_ns);
            let a = model::sm_activity(&params, t.spans(), t.external(), from, now);
            (a, Some((now, a)))
        }
    };
    for (k, blocks) in kernels {
        let span = model::plan(
            &params,
            &Launch {
                now_ns: now,
                stream_tail_ns: tail,
                solo_ns: k.solo_ns,
                blocks: *blocks,
                cap_sms: cap,
                priority: prio,
                pid: p.pid,
            },
            &recent,
            t.external(),
            power,
        );
        t.push_kernel(&span);
        recent.push(span);
        tail = span.end_ns;
    }
    drop(t);
    let mut l = p.local();
    l.tails.insert(key, (dev, tail));
    if fresh.is_some() {
        l.power[dev] = fresh;
    }
    Ok(())
}

pub fn launch(f: Handle, blocks: u64, s: Handle, pt: bool) -> R<()> {
    let (p, dev) = current()?;
    let mut l = p.local();
    let k = match l.objs.get(&(f as usize)) {
        Some(Obj::Func(k)) => *k,
        _ => return Err(cu::INVALID_HANDLE),
    };
    let key = stream_key(&l, s, pt, dev)?;
    if let Some(cap) = l.captures.get_mut(&key) {
        cap.push((k, blocks));
        return Ok(());
    }
    drop(l);
    enqueue(p, dev, key, &[(k, blocks)])
}

pub fn stream_create() -> R<Handle> {
    let (p, _) = current()?;
    let mut l = p.local();
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Stream);
    Ok(h as Handle)
}

pub fn stream_destroy(s: Handle) -> R<()> {
    let p = proc_()?;
    let mut l = p.local();
    match l.objs.remove(&(s as usize)) {
        Some(Obj::Stream) => {
            l.tails.remove(&(s as u64));
            Ok(())
        }
        _ => Err(cu::INVALID_HANDLE),
    }
}

pub(super) fn stream_tail(s: Handle, pt: bool) -> R<(&'static Proc, usize, u64)> {
    let (p, dev) = current()?;
    let l = p.local();
    let key = stream_key(&l, s, pt, dev)?;
    Ok((p, dev, l.tails.get(&key).map_or(0, |x| x.1)))
}

pub fn stream_synchronize(s: Handle, pt: bool) -> R<()> {
    let (p, dev, tail) = stream_tail(s, pt)?;
    sleep_until(tail);
    check(p, dev)
}

pub fn stream_query(s: Handle, pt: bool) -> R<()> {
    let (_, _, tail) = stream_tail(s, pt)?;
    if now_ns() < tail {
        Err(cu::NOT_READY)
    } else {
        Ok(())
    }
}

/// Begins a capture on stream `s`; `into`: the graph of
/// cuStreamBeginCaptureToGraph (the capture's nodes are added to it).
pub fn begin_capture(s: Handle, pt: bool, into: Option<Handle>) -> R<()> {
    let (p, dev) = current()?;
    let mut l = p.local();
    let key = stream_key(&l, s, pt, dev)?;
    if let Some(g) = into {
        if !matches!(l.objs.get(&(g as usize)), Some(Obj::Graph(_))) {
            return Err(cu::INVALID_VALUE);
        }
        l.capture_into.insert(key, g as usize);
    }
    l.captures.insert(key, Vec::new());
    Ok(())
}

/// cuStreamIsCapturing: 1 (ACTIVE) while stream `s` captures, else 0 (NONE).
pub fn is_capturing(s: Handle, pt: bool) -> R<c_int> {
    let (p, dev) = current()?;
    let l = p.local();
    let key = stream_key(&l, s, pt, dev)?;
    Ok(c_int::from(l.captures.contains_key(&key)))
}

pub fn end_capture(s: Handle, pt: bool) -> R<Handle> {
    let p = proc_()?;
    let dev = current_dev()?;
    let mut l = p.local();
    let key = stream_key(&l, s, pt, dev)?;
    let ks = l
        .captures
        .remove(&key)
        .ok_or(cu::STREAM_CAPTURE_INVALIDATED)?;
    if let Some(g) = l.capture_into.remove(&key) {
        if let Some(Obj::Graph(all)) = l.objs.get_mut(&g) {
            all.extend(ks);
            graphmem::capture_ended(&mut l, key, g);
            return Ok(g as Handle);
        }
        return Err(cu::STREAM_CAPTURE_INVALIDATED);
    }
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Graph(ks));
    graphmem::capture_ended(&mut l, key, h);
    Ok(h as Handle)
}

pub fn graph_instantiate(g: Handle) -> R<Handle> {
    let p = proc_()?;
    let mut l = p.local();
    let ks = match l.objs.get(&(g as usize)) {
        Some(Obj::Graph(ks)) => ks.clone(),
        _ => return Err(cu::INVALID_HANDLE),
    };
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Graph(ks));
    graphmem::copy_nodes(&mut l, g as usize, h);
    Ok(h as Handle)
}

/// cuGraphExecUpdate: the executable graph takes the graph's kernels when
/// the two have as many (the fake's "topologically identical"), else
/// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, as the driver answers a changed
/// topology; its memory nodes become the graph's.
pub fn graph_exec_update(e: Handle, g: Handle) -> R<()> {
    let p = proc_()?;
    let mut l = p.local();
    let ks = match l.objs.get(&(g as usize)) {
        Some(Obj::Graph(ks)) => ks.clone(),
        _ => return Err(cu::INVALID_HANDLE),
    };
    match l.objs.get_mut(&(e as usize)) {
        Some(Obj::Graph(old)) if old.len() == ks.len() => {
            *old = ks;
            graphmem::copy_nodes(&mut l, g as usize, e as usize);
            Ok(())
        }
        Some(Obj::Graph(_)) => Err(cu::GRAPH_EXEC_UPDATE_FAILURE),
        _ => Err(cu::INVALID_HANDLE),
    }
}

pub fn graph_launch(e: Handle, s: Handle, pt: bool) -> R<()> {
    let (p, dev) = current()?;
    let l = p.local();
    let ks = match l.objs.get(&(e as usize)) {
        Some(Obj::Graph(ks)) => ks.clone(),
        _ => return Err(cu::INVALID_HANDLE),
    };
    let key = stream_key(&l, s, pt, dev)?;
    drop(l);
    graphmem::launch(p, dev, e as usize)?;
    enqueue(p, dev, key, &ks)
}

pub fn graph_destroy(g: Handle) -> R<()> {
    let p = proc_()?;
    let mut l = p.local();
    match l.objs.remove(&(g as usize)) {
        Some(Obj::Graph(_)) => {
            graphmem::destroyed(&mut l, g as usize);
            Ok(())
        }
        _ => Err(cu::INVALID_HANDLE),
    }
}

pub fn graph_create() -> R<Handle> {
    let p = proc_()?;
    let mut l = p.local();
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Graph(Vec::new()));
    Ok(h as Handle)
}

/// A node of graph `g` (nodes are not modelled beyond their handle).
pub fn graph_node(g: Handle) -> R<Handle> {
    let p = proc_()?;
    let mut l = p.local();
    if !matches!(l.objs.get(&(g as usize)), Some(Obj::Graph(_))) {
        return Err(cu::INVALID_VALUE);
    }
    Ok(alloc_id(&mut l) as Handle)
}

/// A loaded library (cuLibraryLoadData / FromFile): needs no context.
pub fn new_library() -> Handle {
    match proc_() {
        Ok(p) => {
            let mut l = p.local();
            let h = alloc_id(&mut l);
            l.objs.insert(h, Obj::Library);
            h as Handle
        }
        Err(_) => std::ptr::null_mut(),
    }
}

pub fn library_check(lib: Handle) -> R<()> {
    let p = proc_()?;
    match p.local().objs.get(&(lib as usize)) {
        Some(Obj::Library) => Ok(()),
        _ => Err(cu::INVALID_HANDLE),
    }
}

pub fn library_unload(lib: Handle) -> R<()> {
    library_check(lib)?;
    proc_()?.local().objs.remove(&(lib as usize));
    Ok(())
}
