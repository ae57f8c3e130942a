//! The watcher thread (started at cuInit): every sample interval it reads
//! the GPU's health state, samples the GPU through NVML (SM activity: the
//! node sampler's page beside the health file, [`muxflow::records::sm_page`]),
//! feeds the [`Controller`] and sets the gate (another process on the GPU is
//! contention unless root lists it as one of the GPU's offline processes:
//! [`muxflow::node::offline_procs`]); every second it rewrites the stats file
//! and re-asserts the signal handlers. It does all that holding [`BUSY`],
//! which a fork takes first: a forked child never inherits NVML (or the
//! fake's locks behind it) in the middle of one of the watcher's calls.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use muxflow::node::jobproc::Procfs;
use muxflow::node::offline_procs::ProcId;
use muxflow::policy::health::HealthState;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::{Device, Nvml};

use crate::state::controller::{Controller, Params, Sample};
use crate::state::gate::Mode;
use crate::state::{self, Settings};

const HOUSEKEEPING: Duration = Duration::from_secs(1);

/// Held by the watcher while it is not sleeping (and by a fork in progress).
pub static BUSY: Mutex<()> = Mutex::new(());

fn busy() -> std::sync::MutexGuard<'static, ()> {
    BUSY.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn spawn(s: &'static Settings) {
    if let Err(e) = std::thread::Builder::new()
        .name("xcuda-watch".into())
        .spawn(move || run(s))
    {
        crate::log(format_args!(
            "cannot start the watcher ({e}); launch gate open"
        ));
    }
}

fn open_nvml(s: &Settings) -> Option<Nvml> {
    let r = match &s.env.nvml_library {
        Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
        None => Nvml::builder()
            .lib_path(OsStr::new("libnvidia-ml.so.1"))
            .init(),
    };
    r.map_err(|e| {
        crate::log(format_args!(
            "NVML unavailable ({e}); launches are not braked"
        ))
    })
    .ok()
}

/// Health pause from the node's health file; unreadable or unknown: no pause.
fn health_pauses(path: &Path, logged: &mut bool) -> bool {
    match std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.parse::<HealthState>().ok())
    {
        Some(h) => h.pauses_offline(),
        None => {
            if !std::mem::replace(logged, true) {
                crate::log(format_args!(
                    "health file {} unreadable; not pausing on it",
                    path.display()
                ));
            }
            false
        }
    }
}

/// Pauses the gate if the health file says so; returns whether it did.
pub fn apply_health(s: &Settings, logged: &mut bool) -> bool {
    let paused = s
        .env
        .health_file
        .as_deref()
        .is_some_and(|p| health_pauses(p, logged));
    if paused {
        state::gate().set(Mode::Paused);
    }
    paused
}

fn is_mps_server(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.trim() == "nvidia-cuda-mps-server")
}

struct Sampler<'n> {
    dev: Device<'n>,
    max_clock: u32,
    /// The GPU's SM activity page, written by the node's sampler (root):
    /// GPM needs samples 120 ms apart, longer than the watcher's interval,
    /// so one sampler per node takes them for every reader. None (no
    /// health file): no SM activity.
    sm_page: Option<PathBuf>,
    me: u32,
    /// The GPU's offline processes as root lists them (beside the health
    /// file), which are no contention; None: every other process is.
    offline_file: Option<PathBuf>,
    offline_logged: bool,
}

/// The offline processes of the GPU that root listed in `path`: the other
/// offline jobs of the GPU, which must not brake this one ([policy]
/// offline_per_gpu > 1). Only a file root owns, in a directory root owns,
/// neither writable by others, counts; anything else (missing, another
/// owner, corrupt) lists nothing, so every other process is contention:
/// a user cannot release the brake for others. Logged once.
fn listed_offline(path: &Path, logged: &mut bool) -> BTreeSet<ProcId> {
    match muxflow::node::offline_procs::read_trusted(path, 0) {
        Ok(set) => set,
        Err(e) => {
            let absent = matches!(&e, muxflow::records::limits::LimitsError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound);
            if !absent && !std::mem::replace(logged, true) {
                crate::log(format_args!(
                    "{e}; every other process on the GPU counts as contention"
                ));
            }
            BTreeSet::new()
        }
    }
}

impl<'n> Sampler<'n> {
    fn new(nvml: &'n Nvml, index: u32) -> Option<Sampler<'n>> {
        let dev = nvml
            .device_by_index(index)
            .map_err(|e| {
                crate::log(format_args!(
                    "NVML device {index}: {e}; launches are not braked"
                ))
            })
            .ok()?;
        let max_clock = dev.max_clock_info(Clock::SM).unwrap_or(0);
        Some(Sampler {
            dev,
            max_clock,
            sm_page: None,
            me: std::process::id(),
            offline_file: None,
            offline_logged: false,
        })
    }

    fn sample(&mut self) -> Option<Sample> {
        let clock = self.dev.clock_info(Clock::SM).ok()?;
        let util = self.dev.utilization_rates().ok()?.gpu;
        let offline = match &self.offline_file {
            Some(path) => listed_offline(path, &mut self.offline_logged),
            None => BTreeSet::new(),
        };
        let procfs = Procfs::default();
        let is_listed = |pid: u32| {
            !offline.is_empty() && ProcId::of(&procfs, pid).is_some_and(|p| offline.contains(&p))
        };
        let others = self
            .dev
            .running_compute_processes()
            .map(|ps| {
                ps.iter()
                    .any(|p| p.pid != self.me && !is_mps_server(p.pid) && !is_listed(p.pid))
            })
            .unwrap_or(false);
        // Missing, stale, torn or not root's: no reading, never a wrong one
        // (the controller then brakes on the clock and utilization).
        let sm_activity = self.sm_page.as_deref().and_then(|p| {
            muxflow::records::sm_page::read(p, 0, muxflow::records::sm_page::now_ms()).ok()
        });
        Some(Sample {
            sm_clock_mhz: clock,
            max_sm_clock_mhz: self.max_clock,
            utilization_pct: util,
            sm_activity_pct: sm_activity,
            others_active: others,
        })
    }
}

fn run(s: &'static Settings) {
    // SIGINT/SIGTERM are the exit thread's and the application's: never
    // delivered here, so xCUDA's threads change nothing about which of the
    // application's threads takes them (or that they stay pending).
    super::shutdown::block_signals_in_this_thread();
    let gate = state::gate();
    let interval = Duration::from_millis(s.env.sample_interval_ms);
    let b = busy();
    let nvml = open_nvml(s);
    let mut sampler = nvml.as_ref().and_then(|n| Sampler::new(n, s.env.gpu_index));
    if let Some(sampler) = sampler.as_mut() {
        let health_file = s.env.health_file.as_deref();
        sampler.offline_file = health_file.map(muxflow::node::offline_procs::beside);
        sampler.sm_page = health_file.map(muxflow::records::sm_page::beside);
    }
    drop(b);
    let mut controller = Controller::new(Params::from_env(&s.env));
    let mut online = super::online_gate::OnlineGate::new(s);
    let mut health_logged = false;
    let mut last_housekeeping = Instant::now();
    while !gate.shutting_down() {
        std::thread::sleep(interval);
        let _b = busy();
        let paused = apply_health(s, &mut health_logged);
        let delay = match sampler.as_mut().and_then(Sampler::sample) {
            Some(x) => controller.step(&x),
            None => controller.delay(),
        };
        let delay = online.combine(delay);
        if !paused {
            gate.set(Mode::Delay(delay));
        }
        if last_housekeeping.elapsed() >= HOUSEKEEPING {
            last_housekeeping = Instant::now();
            state::write_stats();
            super::shutdown::reassert();
        }
    }
}
