//! Process-local driver state of the fake libcuda and the behaviour behind
//! the exports. Shared (cross-process) state lives in the model crate's table.
//!
//! This module holds the process's state (devices, handles, per-client
//! records); the behaviour is split by concern: [`client`] (faults, MPS,
//! attaching to a GPU), [`context`], [`memory`] and [`launch`] (modules,
//! kernels, streams, graphs).

mod client;
mod context;
mod graphmem;
mod launch;
mod memory;

use client::*;
pub use context::*;
pub use graphmem::{graph_alloc_node, graph_free_node, graph_mem_trim, stream_alloc, stream_free};
pub use launch::*;
pub use memory::*;

use super::Handle;
use muxflow_simgpu::codes::cu;
use muxflow_simgpu::model::{self, Launch};
use muxflow_simgpu::mps::{self, ConnectReply, Grant, MemLimits};
use muxflow_simgpu::shared::{now_ns, SharedGpu};
use muxflow_simgpu::{state, visible, GpuConfig, SimDir};
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
    /// The daemon's termination marker for this client, opened at connect
    /// (mps::terminated_marker).
    terminated: Option<std::fs::File>,
    /// Graph memory: nodes, live graph allocations, graph pools.
    graphs: graphmem::GraphBooks,
}

pub struct Proc {
    pub dir: SimDir,
    pub devs: Vec<Dev>,
    pid: i32,
    local: Mutex<Local>,
    /// Per device: the most memory this client held at once (test hook
    /// `simgpu_mem_books`).
    mem_peak: Vec<std::sync::atomic::AtomicU64>,
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
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut devs = Vec::new();
    for i in visible_devices(&dir, pid) {
        let cfg = dir.gpus[i].clone();
        let gpu = dir.open_gpu(cfg.index).map_err(|e| {
            eprintln!("{e}");
            cu::NO_DEVICE
        })?;
        devs.push(Dev {
            sim_index: cfg.index,
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
        pid,
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
            terminated: None,
            graphs: Default::default(),
        }),
        mem_peak: (0..n).map(|_| Default::default()).collect(),
    })
}

/// The node's GPUs (positions in `dir.gpus`) this process sees, in its
/// ordinal order: through its MPS daemon's renumbering where its pipe
/// directory has a daemon, else its own `CUDA_VISIBLE_DEVICES`
/// (`muxflow_simgpu::visible`).
fn visible_devices(dir: &SimDir, pid: i32) -> Vec<usize> {
    let uuids: Vec<&str> = dir.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let client = std::env::var(mps::ENV_VISIBLE).ok();
    let daemon = std::env::var_os(mps::ENV_PIPE)
        .map(PathBuf::from)
        .filter(|p| mps::socket_path(p).exists())
        .and_then(|p| mps::daemon_devices(&p, pid).ok());
    match daemon {
        Some(d) => visible::through_mps(d.as_deref(), client.as_deref(), &uuids),
        None => visible::resolve(client.as_deref(), &uuids),
    }
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
