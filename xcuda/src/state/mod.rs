//! The state layer: what xCUDA knows and counts, with no I/O beyond the
//! stats file and no knowledge of how calls reach it. Settings, the launch
//! gate and its controller, the memory cap, the context book, the counters
//! and their file; the process-wide instances of each.

pub mod contexts;
pub mod controller;
pub mod gate;
pub mod graphmem;
pub mod memcap;
pub mod online;
pub mod queue;
pub mod settings;
pub mod stats;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

pub use contexts::Contexts;
use gate::Gate;
use graphmem::GraphMem;
use memcap::MemCap;
pub use settings::{settings, Settings, Source};
use stats::Counters;

static GATE: Gate = Gate::with_thread_slots();

pub fn gate() -> &'static Gate {
    &GATE
}

pub fn memcap() -> &'static MemCap {
    static M: OnceLock<MemCap> = OnceLock::new();
    // Counting mode caps nothing (its allocations are still counted).
    M.get_or_init(|| match settings().env.role {
        muxflow::records::xcuda_env::Role::Online => MemCap::new(None),
        muxflow::records::xcuda_env::Role::Offline => MemCap::new(settings().env.mem_limit_bytes),
    })
}

/// Graph memory, held against [`memcap`].
pub fn graphmem() -> &'static GraphMem {
    static G: OnceLock<GraphMem> = OnceLock::new();
    G.get_or_init(GraphMem::default)
}

pub fn contexts() -> &'static Contexts {
    static C: OnceLock<Contexts> = OnceLock::new();
    C.get_or_init(Contexts::default)
}

static RELEASES: AtomicU64 = AtomicU64::new(0);

/// Counts a graceful release of the process's contexts (the stats file's
/// `released`, the node's `muxflow_xcuda_graceful_releases_total`).
pub fn count_release() {
    RELEASES.fetch_add(1, Relaxed);
}

pub fn counters() -> Counters {
    let g = gate().counts();
    let (held, held_us) = queue::held();
    let m = memcap();
    Counters {
        launches: g.launches,
        delayed: g.delayed + held,
        delay_us: g.delay_us + held_us,
        oom: m.refused(),
        peak_bytes: m.peak(),
        released: RELEASES.load(Relaxed),
    }
}

/// Writes the stats file if the plugin asked for one; logs the first failure.
pub fn write_stats() {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    // One writer at a time (watcher, exit thread, atexit share the temp name);
    // counters read inside, so the last file written is the newest.
    static WRITING: Mutex<()> = Mutex::new(());
    if let Some(dir) = &settings().env.stats_dir {
        let _w = WRITING.lock().unwrap_or_else(|e| e.into_inner());
        let started = stats::own_start_ticks();
        if let Err(e) = stats::write(dir, std::process::id(), &counters(), started) {
            if !LOGGED.swap(true, Relaxed) {
                crate::log(format_args!("{e}"));
            }
        }
    }
}
