//! Faults and MPS: the per-call check of a client's device, the first
//! sighting of a sticky error, the control daemon's grant, and a process
//! attaching to and detaching from a GPU.

use super::*;

/// Per-call check of the client's device: terminated by MPS, lost, sticky.
pub(super) fn check(p: &Proc, dev: usize) -> R<()> {
    let mps = p.local().mps.clone().flatten();
    if p.local()
        .terminated
        .as_ref()
        .is_some_and(mps::is_terminated)
    {
        return Err(cu::MPS_CLIENT_TERMINATED);
    }
    let d = &p.devs[dev];
    if d.gpu.is_lost() {
        return Err(cu::DEVICE_UNAVAILABLE);
    }
    let t = d.gpu.table();
    let Some(slot) = t.slot_of(p.pid) else {
        return Ok(());
    };
    let code = t.clients[slot].sticky.load(Ordering::Relaxed);
    if code == 0 {
        return Ok(());
    }
    report_fault(p, dev, code, mps.as_ref());
    Err(code)
}

/// First sighting of a sticky error: under MPS a fatal fault reaches every
/// client of the server on this GPU (Volta+ MPS), and the server logs it.
pub(super) fn report_fault(p: &Proc, dev: usize, code: u32, mps: Option<&(PathBuf, Grant)>) {
    {
        let mut l = p.local();
        let Some(c) = l.clients[dev].as_mut() else {
            return;
        };
        if c.fault_reported {
            return;
        }
        c.fault_reported = true;
    }
    let d = &p.devs[dev];
    p.dir.event(
        d.sim_index,
        &format!("pid={} event=sticky code={code}", p.pid),
    );
    if let Some((pipe, g)) = mps {
        let t = d.gpu.lock();
        for c in t.clients.iter() {
            if c.mps_server == g.server as u32 && c.pid.load(Ordering::Relaxed) != 0 {
                let _ = c
                    .sticky
                    .compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        drop(t);
        let _ = mps::request(
            pipe,
            &format!("@fault {} {code} device={}", p.pid, d.sim_index),
        );
    }
}

pub(super) fn mps_connect(p: &Proc) -> R<Option<(PathBuf, Grant)>> {
    if let Some(m) = p.local().mps.clone() {
        return Ok(m);
    }
    let res = match std::env::var_os(mps::ENV_PIPE) {
        Some(dir) if mps::socket_path(dir.as_ref()).exists() => {
            let dir = PathBuf::from(dir);
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            let wait_ms: u64 = std::env::var("MUXFLOW_SIM_MPS_WAIT_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30_000);
            let start = now_ns();
            let partition = std::env::var(mps::ENV_PARTITION).ok();
            loop {
                match mps::connect(&dir, p.pid, uid, partition.as_deref()) {
                    Ok(ConnectReply::Ok(g)) => {
                        p.local().terminated =
                            std::fs::File::open(mps::terminated_marker(&dir, p.pid)).ok();
                        break Some((dir, g));
                    }
                    Ok(ConnectReply::NoPartition) => {
                        return Err(cu::INVALID_RESOURCE_CONFIGURATION)
                    }
                    Ok(ConnectReply::Wait) if now_ns() - start < wait_ms * 1_000_000 => {
                        std::thread::sleep(std::time::Duration::from_millis(100))
                    }
                    _ => return Err(cu::MPS_CONNECTION_FAILED),
                }
            }
        }
        _ => None,
    };
    p.local().mps = Some(res.clone());
    Ok(res)
}

/// Registers this process as a client of `dev` (first context on it).
pub(super) fn attach(p: &Proc, dev: usize) -> R<()> {
    if p.local().clients[dev].is_some() {
        return Ok(());
    }
    let mps = mps_connect(p)?;
    let d = &p.devs[dev];
    let env_pct = std::env::var(mps::ENV_PCT)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok());
    let env_mem = std::env::var(mps::ENV_MEM)
        .ok()
        .and_then(|v| MemLimits::parse(&v))
        .unwrap_or_default();
    let (pct, mem_limit, prio, server) = match &mps {
        Some((_, g)) => {
            // A client's own settings can only tighten the server's; an
            // MPS v3 namespace's percentage "overrides the
            // client-process-level setting ... rather than only further
            // constraining it", its pinned limit is further constrained
            // by the client's, its priority is the client's only if the
            // client sets none (NVIDIA, Appendix: Environment Variables).
            let pct = match (g.thread_pct, env_pct) {
                (Some(a), _) if g.namespace.is_some() => a as f64,
                (Some(a), Some(b)) => (a as f64).min(b),
                (a, b) => a.map(|x| x as f64).or(b).unwrap_or(100.0),
            };
            let mem = g.mem.tighten(&env_mem, dev as u32).unwrap_or(u64::MAX);
            let prio = std::env::var(mps::ENV_PRIO)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .or(g.default_priority)
                .unwrap_or(0u32)
                .min(1);
            (
                pct.clamp(1.0, 100.0).round() as u32,
                mem,
                prio,
                g.server as u32,
            )
        }
        // Without an MPS server the real driver ignores the MPS variables.
        None => (100, u64::MAX, 0, 0),
    };
    // The kernel's cap (cgroup dmem.max of the process's job), whatever
    // the process's environment says: simgpu/src/dmem.rs.
    let dmem = muxflow_simgpu::dmem::limit_for(&p.dir.root, &d.cfg, p.pid as u32);
    let mem_limit = dmem.map_or(mem_limit, |k| k.min(mem_limit));
    // A static partition holds the client to its SMs, whatever its own
    // thread percentage says.
    let partition_sms = mps.as_ref().and_then(|(_, g)| g.sms);
    let cap = model::sm_cap(d.cfg.sm_count, pct).min(partition_sms.unwrap_or(u32::MAX));
    let mut t = d.gpu.lock();
    for dead in t.prune_dead() {
        p.dir
            .event(d.sim_index, &format!("pid={dead} event=pruned"));
    }
    let slot = t
        .clients
        .iter()
        .position(|c| c.pid.load(Ordering::Relaxed) == 0)
        .ok_or(if mps.is_some() {
            808
        } else {
            cu::OUT_OF_MEMORY
        })?; // MPS_MAX_CLIENTS_REACHED
    let c = &mut t.clients[slot];
    c.pid.store(p.pid, Ordering::Relaxed);
    c.priority = prio;
    c.sm_cap = cap;
    c.thread_pct = pct;
    c.mem_used = 0;
    c.mem_limit = mem_limit;
    c.sticky.store(0, Ordering::Relaxed);
    c.contexts = 1;
    c.mps_server = server;
    drop(t);
    let lim = if mem_limit == u64::MAX {
        "none".to_string()
    } else {
        mem_limit.to_string()
    };
    let dmem = dmem.map_or("none".to_string(), |b| b.to_string());
    let part = partition_sms.map_or("none".to_string(), |n| n.to_string());
    let namespace = mps
        .as_ref()
        .and_then(|(_, g)| g.namespace.clone())
        .unwrap_or_else(|| "none".to_string());
    p.dir.event(
        d.sim_index,
        &format!("pid={} event=attach priority={prio} thread_pct={pct} sm_cap={cap} mem_limit={lim} dmem_max={dmem} partition_sms={part} namespace={namespace} mps_server={server}", p.pid),
    );
    p.local().clients[dev] = Some(ClientState {
        thread_pct: pct,
        sm_cap: cap,
        ..Default::default()
    });
    Ok(())
}

/// Last context on `dev` gone: free the slot and its memory, tell MPS.
pub(super) fn detach(p: &Proc, dev: usize) {
    let mut l = p.local();
    if l.clients[dev].take().is_none() {
        return;
    }
    l.allocs.retain(|_, (d, _, _)| *d != dev);
    l.graphs.forget_device(dev);
    l.tails.retain(|_, (d, _)| *d != dev);
    let others = l.clients.iter().any(Option::is_some);
    let mps = l.mps.clone().flatten();
    drop(l);
    // A driver tearing a context down takes a while; tests stretch it to
    // widen races with the process's other threads.
    if let Some(ms) = std::env::var("MUXFLOW_SIM_SLOW_RELEASE_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let d = &p.devs[dev];
    let mut t = d.gpu.lock();
    if let Some(s) = t.slot_of(p.pid) {
        let c = &mut t.clients[s];
        c.mem_used = 0;
        c.contexts = 0;
        c.sticky.store(0, Ordering::Relaxed);
        c.pid.store(0, Ordering::Relaxed);
    }
    drop(t);
    p.dir
        .event(d.sim_index, &format!("pid={} event=released", p.pid));
    if let (Some((pipe, _)), false) = (mps, others) {
        let _ = mps::request(&pipe, &format!("@disconnect {}", p.pid));
        p.local().mps = None;
    }
}
