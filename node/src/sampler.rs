//! `muxflow-sampler`: the node's one SM activity sampler. Every
//! [`GPM_MIN_GAP`] it takes a GPM sample of each GPU and publishes the SM
//! activity since the previous one on the GPU's page
//! ([`muxflow::records::sm_page`]), which the health step and xCUDA's gate read at
//! once instead of sampling twice themselves (120 ms in every Prolog and
//! Epilog before).
//!
//! **Lifecycle.** The node programs that run as root anyway start it:
//! every health step (Prolog, Epilog, HealthCheckProgram) and
//! `muxflow-police` call [`ensure`], which is idempotent — one sampler per
//! state directory, held by a flock on `<state_dir>/locks/sampler` (which
//! also names its pid) — and marks the sampler wanted (the lock file's
//! mtime). It exits once no muxflow job has been recorded on the node and
//! nothing has asked for it for `health.sampler_linger_s`; killed (also
//! with slurmd's cgroup when slurmd restarts), it is back at the next step
//! or police check, and it leaves when its state directory is torn down. Chosen over a systemd unit: it
//! runs only while sharing needs it (nothing left running on nodes that
//! share nothing, nothing an admin must enable on each node), it follows
//! whatever binary the node programs are (an upgrade takes effect at the
//! next start), and several `slurmd -N` on one host (the dev cluster) get
//! one each. The price: the first step on a cold node has no SM activity;
//! it decides on utilization, clock and memory and says so.
//!
//! **Security.** It runs as root. What it executes is the program beside
//! the running root program (never a path from the environment or the
//! job), started with a cleared environment (the Prolog's holds `SPANK_*`
//! values a user's plugin could have set) and the config file root found.
//! It writes only under `paths.state_dir` (root's), never through a
//! symlink; its pages are 0644, so jobs read them and only root writes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use muxflow::node::state::{same_file, try_flock, NodeState};
use muxflow::policy::health::GPM_MIN_GAP;
use muxflow::records::sm_page::{self, Page};
use muxflow::Config;
use nvml_wrapper::gpm::GpmSample;
use nvml_wrapper::{Device, Nvml};

/// The sampler's lock (and pid) file, in the state directory's root-only
/// lock directory.
pub const LOCK_FILE: &str = "sampler";
/// How often the sampler checks whether it is still needed.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The variables a sampler inherits from the program that starts it: the
/// log level, and where the simulated GPU's library finds its state (test
/// clusters; the real libnvidia-ml reads neither). Each is root's: the
/// Prolog's environment is slurmd's plus `SPANK_*` and `SLURM_*`.
const KEPT_ENV: [&str; 3] = ["MUXFLOW_LOG", "MUXFLOW_SIM_DIR", "MUXFLOW_SIM_NODE"];

pub fn lock_path(ns: &NodeState) -> PathBuf {
    ns.lock_path(LOCK_FILE)
}

/// The GPU's page, where the sampler writes and the steps read.
pub fn page_path(ns: &NodeState, gpu: u32) -> PathBuf {
    ns.gpu_dir(gpu).join(sm_page::FILE_NAME)
}

/// The pid of the node's running sampler; None when none runs.
pub fn running(ns: &NodeState) -> Option<u32> {
    if !lock_path(ns).exists() {
        return None;
    }
    if ns
        .try_lock(LOCK_FILE, libc::LOCK_SH, Duration::ZERO)
        .ok()?
        .is_some()
    {
        return None; // free: nobody holds it (released when dropped)
    }
    std::fs::read_to_string(lock_path(ns))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Makes sure the node's sampler runs and marks it wanted now. Starts
/// `muxflow-sampler` (beside this program) when none holds the lock and
/// returns it (a long-lived caller reaps it; a short one leaves it to
/// init). Every failure is logged: the steps then go without SM activity.
pub fn ensure(config: &Config, node: &str) -> Option<Child> {
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let path = lock_path(&ns);
    let held = ns
        .open_lock(LOCK_FILE)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            // Wanted now: the sampler counts its idle time from here.
            f.set_modified(SystemTime::now())
                .and_then(|()| try_flock(&f, libc::LOCK_EX))
                .map(|free| !free)
                .map_err(|e| format!("{}: {e}", path.display()))
        });
    match held {
        Ok(true) => return None,
        Ok(false) => {} // free (and released again when the file closed)
        Err(e) => {
            tracing::error!("SM activity sampler: {e}; steps go without SM activity");
            return None;
        }
    }
    let Some(config_path) = crate::config_path() else {
        tracing::error!("SM activity sampler not started: no config path");
        return None;
    };
    let program = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("muxflow-sampler"),
        Err(e) => {
            tracing::error!("SM activity sampler not started: cannot find it: {e}");
            return None;
        }
    };
    let mut cmd = Command::new(&program);
    cmd.arg("--config")
        .arg(config_path)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("SLURMD_NODENAME", node)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for var in KEPT_ENV {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    // Its own process group: a signal to the Prolog's group (a timeout)
    // does not take it down.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    match cmd.spawn() {
        Ok(child) => {
            tracing::info!(pid = child.id(), "started the SM activity sampler");
            Some(child)
        }
        Err(e) => {
            tracing::error!(
                "cannot start {}: {e}; steps go without SM activity",
                program.display()
            );
            None
        }
    }
}

/// One GPU as the sampler keeps it.
struct Gpu<'n> {
    index: u32,
    dev: Option<Device<'n>>,
    /// The sample the next reading starts from, and when it was taken.
    prev: Option<(GpmSample<'n>, Instant)>,
    page: PathBuf,
    write_failed: bool,
}

impl<'n> Gpu<'n> {
    /// Takes a sample; publishes the SM activity since the previous one.
    fn sample(&mut self, nvml: &'n Nvml) {
        let Some(dev) = &self.dev else {
            return self.publish(GPM_MIN_GAP, None);
        };
        match dev.gpm_sample() {
            Ok(cur) => {
                let at = Instant::now();
                if let Some((prev, prev_at)) = self.prev.take() {
                    let sm = crate::nvml::gpm_sm_activity(nvml, &prev, &cur).unwrap_or_else(|e| {
                        tracing::debug!(gpu = self.index, "GPM metrics: {e}");
                        None
                    });
                    self.publish(at - prev_at, sm);
                }
                self.prev = Some((cur, at));
            }
            Err(e) => {
                // No reading rather than one over a gap with a hole in it.
                tracing::debug!(gpu = self.index, "GPM sample: {e}");
                self.prev = None;
                self.publish(GPM_MIN_GAP, None);
            }
        }
    }

    fn publish(&mut self, window: Duration, sm_pct: Option<f64>) {
        let page = Page {
            t_ms: sm_page::now_ms(),
            window_ms: window.as_millis() as u64,
            sm_pct,
        };
        match sm_page::write(&self.page, &page) {
            Ok(()) => self.write_failed = false,
            Err(e) => {
                if !std::mem::replace(&mut self.write_failed, true) {
                    tracing::error!(
                        gpu = self.index,
                        "cannot write {}: {e}",
                        self.page.display()
                    );
                }
            }
        }
    }
}

/// Whether any muxflow job is recorded on the node; an unreadable registry
/// counts as one (the sampler stays rather than leave a job without it).
fn jobs_on_node(ns: &NodeState) -> bool {
    match ns.gpus() {
        Ok(gpus) => gpus
            .into_iter()
            .any(|g| ns.jobs(g).map_or(true, |j| !j.is_empty())),
        Err(_) => true,
    }
}

/// The sampler's body: runs until the node has not needed it for
/// `health.sampler_linger_s`; returns at once when another one runs.
pub fn run(config: &Config) -> anyhow::Result<()> {
    let ns = NodeState::new(config.paths.state_dir.as_path());
    let path = lock_path(&ns);
    let Some(mut lock) = ns.try_lock(LOCK_FILE, libc::LOCK_EX, Duration::ZERO)? else {
        tracing::debug!("another SM activity sampler runs; exiting");
        return Ok(());
    };
    lock.set_len(0)?;
    writeln!(lock, "{}", std::process::id())?;

    let nvml = crate::nvml::open(config.paths.nvml_library.as_ref().map(|p| p.as_path()))?;
    let count = nvml.device_count().context("NVML device count")?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let dev = nvml
            .device_by_index(index)
            .map_err(|e| tracing::warn!(gpu = index, "NVML device: {e}; no SM activity"))
            .ok()
            .filter(|d| match d.gpm_support() {
                Ok(true) => true,
                other => {
                    tracing::info!(gpu = index, ?other, "no GPM: no SM activity to publish");
                    false
                }
            });
        let dir = ns.gpu_dir(index);
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        gpus.push(Gpu {
            index,
            dev,
            prev: None,
            page: page_path(&ns, index),
            write_failed: false,
        });
    }
    let linger = Duration::from_secs(config.health.sampler_linger_s);
    tracing::info!(gpus = count, ?linger, "SM activity sampler running");

    let mut last_job = Instant::now();
    let mut last_check = Instant::now();
    loop {
        let t0 = Instant::now();
        for g in &mut gpus {
            g.sample(&nvml);
        }
        if last_check.elapsed() >= CHECK_EVERY {
            last_check = Instant::now();
            if jobs_on_node(&ns) {
                last_job = Instant::now();
            }
            // The last ask: an `ensure` (or this sampler's start).
            let asked_ago = lock
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .unwrap_or(Duration::ZERO);
            if last_job.elapsed() >= linger && asked_ago >= linger {
                break;
            }
            // A state directory removed or made anew (a cluster torn down
            // and set up again) has a sampler of its own to come.
            if !same_file(&lock, &path) {
                tracing::info!("{} is no longer this sampler's lock", path.display());
                return Ok(());
            }
        }
        std::thread::sleep(GPM_MIN_GAP.saturating_sub(t0.elapsed()));
    }
    // Readers say "no sampler" at once rather than "stale" in a second.
    for g in &gpus {
        let _ = std::fs::remove_file(&g.page);
    }
    tracing::info!(
        ?linger,
        "SM activity sampler exiting: no muxflow job on the node and no step asked for it"
    );
    Ok(())
}
