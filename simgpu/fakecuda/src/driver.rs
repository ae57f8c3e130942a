//! Process-local driver state of the fake libcuda and the behaviour behind
//! the exports. Shared (cross-process) state lives in the model crate's table.

use super::Handle;
use muxflow_simgpu::codes::cu;
use muxflow_simgpu::model::{self, Launch};
use muxflow_simgpu::mps::{self, ConnectReply, Grant, MemLimits};
use muxflow_simgpu::shared::{now_ns, SharedGpu};
use muxflow_simgpu::{state, GpuConfig, SimDir};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

pub const DRIVER_VERSION: c_int = 12040;
type R<T> = Result<T, u32>;

pub struct Dev {
    pub sim_index: u32,
    pub cfg: GpuConfig,
    gpu: SharedGpu,
}

impl Dev {
    pub fn uuid_bytes(&self) -> [u8; 16] {
        let hex: String = self
            .cfg
            .uuid
            .chars()
            .filter(|c| c.is_ascii_hexdigit())
            .collect();
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = hex
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
        }
        out
    }
}

#[derive(Clone, Copy)]
struct Kernel {
    solo_ns: u64,
}

enum Obj {
    Ctx {
        dev: usize,
    },
    Stream,
    Func(Kernel),
    Graph(Vec<(Kernel, u64)>),
    Module,
    /// cuMemPoolCreate.
    Pool,
    /// cuLibraryLoadData / cuLibraryLoadFromFile.
    Library,
}

#[derive(Default)]
struct ClientState {
    contexts: u32,
    primary: Option<(usize, u32)>, // (handle id, refcount)
    thread_pct: u32,
    sm_cap: u32,
    fault_reported: bool,
}

struct Local {
    next: usize,
    objs: HashMap<usize, Obj>,
    /// Stream key -> time its last queued kernel ends.
    tails: HashMap<u64, (usize, u64)>,
    captures: HashMap<u64, Vec<(Kernel, u64)>>,
    /// Captures begun with cuStreamBeginCaptureToGraph: stream key -> graph.
    capture_into: HashMap<u64, usize>,
    /// Per device: (when, SM activity of the window before it), the input of
    /// the clock launches run at; recomputed every `POWER_REFRESH` of a window.
    power: Vec<Option<(u64, f64)>>,
    /// Handle -> (device, bytes, kind).
    allocs: HashMap<u64, (usize, u64, Mem)>,
    /// VMM: reserved address ranges (base -> size) and mappings (base -> handle).
    reserved: HashMap<u64, u64>,
    mapped: HashMap<u64, u64>,
    /// Pinned host allocations (cuMemAllocHost, cuMemHostAlloc): not GPU memory.
    host: std::collections::HashSet<usize>,
    clients: Vec<Option<ClientState>>,
    mps: Option<Option<(PathBuf, Grant)>>,
}

pub struct Proc {
    pub dir: SimDir,
    pub devs: Vec<Dev>,
    pid: i32,
    local: Mutex<Local>,
}

static PROC: OnceLock<Result<Proc, u32>> = OnceLock::new();

thread_local! {
    static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    static THREAD_ID: u64 = {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        N.fetch_add(1, Ordering::Relaxed)
    };
}

fn load() -> Result<Proc, u32> {
    let lib = state::object_path_of(load as *const () as usize);
    let root = state::resolve(lib.as_deref()).map_err(|e| {
        eprintln!("{e}");
        cu::NO_DEVICE
    })?;
    let dir = SimDir::open(&root).map_err(|e| {
        eprintln!("{e}");
        cu::NO_DEVICE
    })?;
    let order: Vec<u32> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().parse::<u32>())
            .take_while(|r| r.is_ok()) // like the driver: stop at the first invalid entry
            .flatten()
            .collect(),
        Err(_) => dir.gpus.iter().map(|g| g.index).collect(),
    };
    let mut devs = Vec::new();
    for i in order {
        let Some(cfg) = dir.gpus.iter().find(|g| g.index == i).cloned() else {
            break;
        };
        let gpu = dir.open_gpu(i).map_err(|e| {
            eprintln!("{e}");
            cu::NO_DEVICE
        })?;
        devs.push(Dev {
            sim_index: i,
            cfg,
            gpu,
        });
    }
    if devs.is_empty() {
        return Err(cu::NO_DEVICE);
    }
    let n = devs.len();
    Ok(Proc {
        dir,
        devs,
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        local: Mutex::new(Local {
            next: 0x1000,
            objs: HashMap::new(),
            tails: HashMap::new(),
            captures: HashMap::new(),
            capture_into: HashMap::new(),
            power: vec![None; n],
            allocs: HashMap::new(),
            reserved: HashMap::new(),
            mapped: HashMap::new(),
            host: Default::default(),
            clients: (0..n).map(|_| None).collect(),
            mps: None,
        }),
    })
}

pub fn init() -> R<()> {
    PROC.get_or_init(load).as_ref().map(|_| ()).map_err(|e| *e)
}

fn proc_() -> R<&'static Proc> {
    match PROC.get() {
        Some(Ok(p)) => Ok(p),
        Some(Err(e)) => Err(*e),
        None => Err(cu::NOT_INITIALIZED),
    }
}

pub fn with_proc<T>(f: impl FnOnce(&Proc) -> R<T>) -> R<T> {
    f(proc_()?)
}

impl Proc {
    pub fn dev(&self, ordinal: c_int) -> R<&Dev> {
        let d = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devs.get(i))
            .ok_or(cu::INVALID_DEVICE)?;
        if d.gpu.is_lost() {
            return Err(cu::DEVICE_UNAVAILABLE);
        }
        Ok(d)
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn attribute(&self, d: c_int, attr: c_int) -> R<c_int> {
        let dev = self.dev(d)?;
        let cap = self.local().clients[d as usize].as_ref().map(|c| c.sm_cap);
        Ok(match attr {
            1 => 1024,                                      // MAX_THREADS_PER_BLOCK
            2 | 3 => 1024,                                  // MAX_BLOCK_DIM_X/Y
            4 => 64,                                        // MAX_BLOCK_DIM_Z
            5..=7 => i32::MAX,                              // MAX_GRID_DIM
            10 => 32,                                       // WARP_SIZE
            13 => dev.cfg.max_sm_clock_mhz as c_int * 1000, // CLOCK_RATE (kHz)
            16 => cap.unwrap_or(dev.cfg.sm_count) as c_int, // MULTIPROCESSOR_COUNT (MPS-limited)
            75 => 9,                                        // COMPUTE_CAPABILITY_MAJOR
            76 => 0,                                        // COMPUTE_CAPABILITY_MINOR
            _ => 0,
        })
    }
}

pub fn copy_str(dst: *mut c_char, len: c_int, s: &str) -> R<()> {
    if dst.is_null() || len <= 0 {
        return Err(cu::INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: caller's buffer holds `len` bytes; we write n+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, dst, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

pub fn error_strings(code: u32) -> Option<(*const c_char, *const c_char)> {
    static T: OnceLock<Mutex<HashMap<u32, (CString, CString)>>> = OnceLock::new();
    let (n, d) = cu::describe(code)?;
    let mut m = T
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let e = m.entry(code).or_insert_with(|| {
        (
            CString::new(n).unwrap_or_default(),
            CString::new(d).unwrap_or_default(),
        )
    });
    // The CStrings live in a static map and are never removed.
    Some((e.0.as_ptr(), e.1.as_ptr()))
}

pub fn new_handle() -> Handle {
    match proc_() {
        Ok(p) => {
            let mut l = p.local();
            let h = alloc_id(&mut l);
            l.objs.insert(h, Obj::Module);
            h as Handle
        }
        Err(_) => std::ptr::null_mut(),
    }
}

fn alloc_id(l: &mut Local) -> usize {
    l.next += 16;
    l.next
}

// ---- faults, MPS ---------------------------------------------------------

/// Per-call check of the client's device: terminated by MPS, lost, sticky.
fn check(p: &Proc, dev: usize) -> R<()> {
    let mps = p.local().mps.clone().flatten();
    if let Some((pipe, _)) = &mps {
        if mps::terminated_marker(pipe, p.pid).exists() {
            return Err(cu::MPS_CLIENT_TERMINATED);
        }
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
fn report_fault(p: &Proc, dev: usize, code: u32, mps: Option<&(PathBuf, Grant)>) {
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

fn mps_connect(p: &Proc) -> R<Option<(PathBuf, Grant)>> {
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
                    Ok(ConnectReply::Ok(g)) => break Some((dir, g)),
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
fn attach(p: &Proc, dev: usize) -> R<()> {
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
            // A client's own settings can only tighten the server's.
            let pct = match (g.thread_pct, env_pct) {
                (Some(a), Some(b)) => (a as f64).min(b),
                (a, b) => a.map(|x| x as f64).or(b).unwrap_or(100.0),
            };
            let mem = g.mem.tighten(&env_mem, dev as u32).unwrap_or(u64::MAX);
            let prio = std::env::var(mps::ENV_PRIO)
                .ok()
                .and_then(|v| v.trim().parse().ok())
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
    p.dir.event(
        d.sim_index,
        &format!("pid={} event=attach priority={prio} thread_pct={pct} sm_cap={cap} mem_limit={lim} dmem_max={dmem} partition_sms={part} mps_server={server}", p.pid),
    );
    p.local().clients[dev] = Some(ClientState {
        thread_pct: pct,
        sm_cap: cap,
        ..Default::default()
    });
    Ok(())
}

/// Last context on `dev` gone: free the slot and its memory, tell MPS.
fn detach(p: &Proc, dev: usize) {
    let mut l = p.local();
    if l.clients[dev].take().is_none() {
        return;
    }
    l.allocs.retain(|_, (d, _, _)| *d != dev);
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

// ---- contexts ------------------------------------------------------------

fn ctx_dev(l: &Local, h: usize) -> R<usize> {
    match l.objs.get(&h) {
        Some(Obj::Ctx { dev }) => Ok(*dev),
        _ => Err(cu::INVALID_CONTEXT),
    }
}

pub fn primary_retain(d: c_int) -> R<Handle> {
    let p = proc_()?;
    p.dev(d)?;
    let dev = d as usize;
    attach(p, dev)?;
    check(p, dev)?;
    let mut l = p.local();
    let existing = l.clients[dev].as_ref().and_then(|c| c.primary);
    let h = match existing {
        Some((h, _)) => h,
        None => {
            let h = alloc_id(&mut l);
            l.objs.insert(h, Obj::Ctx { dev });
            h
        }
    };
    if let Some(c) = l.clients[dev].as_mut() {
        let n = c.primary.map_or(0, |x| x.1);
        if n == 0 {
            c.contexts += 1;
        }
        c.primary = Some((h, n + 1));
    }
    Ok(h as Handle)
}

pub fn primary_release(d: c_int) -> R<()> {
    let p = proc_()?;
    let dev = usize::try_from(d)
        .ok()
        .filter(|&i| i < p.devs.len())
        .ok_or(cu::INVALID_DEVICE)?;
    let mut l = p.local();
    let Some(c) = l.clients[dev].as_mut() else {
        return Err(cu::INVALID_CONTEXT);
    };
    let Some((h, n)) = c.primary else {
        return Err(cu::INVALID_CONTEXT);
    };
    if n > 1 {
        c.primary = Some((h, n - 1));
        return Ok(());
    }
    c.primary = None;
    end_context(p, l, dev, h);
    Ok(())
}

/// Forgets context `h` of device `dev` (its object, its count, this
/// thread's stack); the process detaches from the GPU with its last one.
fn end_context(p: &Proc, mut l: std::sync::MutexGuard<'_, Local>, dev: usize, h: usize) {
    l.objs.remove(&h);
    let last = match l.clients[dev].as_mut() {
        Some(c) => {
            c.contexts = c.contexts.saturating_sub(1);
            c.contexts == 0
        }
        None => false,
    };
    drop(l);
    CTX_STACK.with(|s| s.borrow_mut().retain(|&x| x != h));
    if last {
        detach(p, dev);
    }
}

pub fn primary_reset(d: c_int) -> R<()> {
    while primary_release(d).is_ok() {}
    Ok(())
}

pub fn primary_state(d: c_int) -> R<bool> {
    let p = proc_()?;
    p.dev(d)?;
    Ok(p.local().clients[d as usize]
        .as_ref()
        .and_then(|c| c.primary)
        .is_some())
}

pub fn ctx_create(d: c_int) -> R<Handle> {
    let p = proc_()?;
    p.dev(d)?;
    let dev = d as usize;
    attach(p, dev)?;
    check(p, dev)?;
    let mut l = p.local();
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Ctx { dev });
    if let Some(c) = l.clients[dev].as_mut() {
        c.contexts += 1;
    }
    drop(l);
    CTX_STACK.with(|s| s.borrow_mut().push(h));
    Ok(h as Handle)
}

pub fn ctx_destroy(ctx: Handle) -> R<()> {
    let p = proc_()?;
    let h = ctx as usize;
    let l = p.local();
    let dev = ctx_dev(&l, h)?;
    if l.clients[dev].as_ref().and_then(|c| c.primary).map(|x| x.0) == Some(h) {
        return Err(cu::INVALID_CONTEXT);
    }
    end_context(p, l, dev, h);
    Ok(())
}

pub fn ctx_set_current(ctx: Handle) -> R<()> {
    let p = proc_()?;
    let h = ctx as usize;
    if h != 0 {
        ctx_dev(&p.local(), h)?;
    }
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if h != 0 {
            s.push(h);
        }
    });
    Ok(())
}

pub fn current_ctx() -> Handle {
    CTX_STACK.with(|s| s.borrow().last().copied().unwrap_or(0)) as Handle
}

pub fn ctx_push(ctx: Handle) -> R<()> {
    let p = proc_()?;
    ctx_dev(&p.local(), ctx as usize)?;
    CTX_STACK.with(|s| s.borrow_mut().push(ctx as usize));
    Ok(())
}

pub fn ctx_pop() -> R<Handle> {
    proc_()?;
    CTX_STACK
        .with(|s| s.borrow_mut().pop())
        .map(|h| h as Handle)
        .ok_or(cu::INVALID_CONTEXT)
}

pub fn current_dev() -> R<usize> {
    let p = proc_()?;
    let h = CTX_STACK
        .with(|s| s.borrow().last().copied())
        .ok_or(cu::INVALID_CONTEXT)?;
    let dev = ctx_dev(&p.local(), h)?;
    Ok(dev)
}

/// The process and the calling thread's current device, checked (context
/// current, client not terminated, device not lost, no sticky error).
fn current() -> R<(&'static Proc, usize)> {
    let p = proc_()?;
    let dev = current_dev()?;
    check(p, dev)?;
    Ok((p, dev))
}

pub fn check_current() -> R<()> {
    current().map(|_| ())
}

fn sleep_until(t: u64) {
    loop {
        let now = now_ns();
        if now >= t {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos((t - now).min(50_000_000)));
    }
}

pub fn ctx_synchronize() -> R<()> {
    let (p, dev) = current()?;
    let tail = p
        .local()
        .tails
        .values()
        .filter(|(d, _)| *d == dev)
        .map(|(_, t)| *t)
        .max()
        .unwrap_or(0);
    sleep_until(tail);
    check(p, dev)
}

// ---- memory --------------------------------------------------------------

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
    let d = &p.devs[dev];
    let mut t = d.gpu.lock();
    let used = t.mem_used();
    let s = t.slot_of(p.pid).ok_or(cu::INVALID_CONTEXT)?;
    let c = &mut t.clients[s];
    if c.mem_used + size > c.mem_limit || used + size > d.cfg.memory_bytes() {
        return Err(cu::OUT_OF_MEMORY);
    }
    c.mem_used += size;
    drop(t);
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

/// Gives a `kind` allocation's memory back.
pub fn mem_free(addr: u64, kind: Mem) -> R<()> {
    let p = proc_()?;
    let (dev, size) = {
        let mut l = p.local();
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

fn give_back(p: &Proc, dev: usize, size: u64) {
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

// ---- modules, kernels, streams, graphs -------------------------------------

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
fn stream_key(l: &Local, s: Handle, pt: bool, dev: usize) -> R<u64> {
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
const POWER_REFRESH: u64 = 50;

fn enqueue(p: &Proc, dev: usize, key: u64, kernels: &[(Kernel, u64)]) -> R<()> {
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

fn stream_tail(s: Handle, pt: bool) -> R<(&'static Proc, usize, u64)> {
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
            return Ok(g as Handle);
        }
        return Err(cu::STREAM_CAPTURE_INVALIDATED);
    }
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Graph(ks));
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
    Ok(h as Handle)
}

/// cuGraphExecUpdate: the executable graph takes the graph's kernels when
/// the two have as many (the fake's "topologically identical"), else
/// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, as the driver answers a changed
/// topology.
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
    enqueue(p, dev, key, &ks)
}

pub fn graph_destroy(g: Handle) -> R<()> {
    let p = proc_()?;
    match p.local().objs.remove(&(g as usize)) {
        Some(Obj::Graph(_)) => Ok(()),
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
