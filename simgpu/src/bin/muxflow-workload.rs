//! Workload program: loads libcuda like frameworks do (dlopen, then
//! cuGetProcAddress for every entry point) and runs an online service or an
//! offline trainer. Prints one `key=value` report line; exits 0 on SIGTERM/SIGINT.
//!
//! The trainer can checkpoint as Slurm training recipes do (`--checkpoint`):
//! on a signal named by `--checkpoint-on` it copies its weights to the host
//! (`cuMemcpyDtoH`, which needs its GPU) and only then writes its step
//! counter; on SIGUSR1 (Slurm's `--signal` warning) it then stops stepping
//! and waits to be stopped, on SIGTERM/SIGINT it exits. `--progress` records
//! every completed step, so a test can tell whether a completed step was
//! lost: after a stop, the checkpoint must hold the last completed step.

use clap::{Args, Parser, Subcommand, ValueEnum};
use muxflow_simgpu::abi::fnty;
use muxflow_simgpu::cudaload::{self, Driver, ProcAddress};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

type Res = u32;
type H = *mut c_void;

#[derive(Parser)]
#[command(
    name = "muxflow-workload",
    about = "Simulated DL workload over the CUDA driver API"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Latency-critical service: requests at a fixed rate, each a few kernels.
    Online(Online),
    /// Best-effort trainer: back-to-back steps of many kernels plus allocations.
    Offline(Offline),
}

// The service's options (its help text is `Mode::Online`'s).
#[derive(Args)]
struct Online {
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Request arrivals: every 1/rate s, or a Poisson process (exponential
    /// gaps of mean 1/rate, from --seed: the same sequence every run).
    #[arg(long, value_enum, default_value_t = Arrivals::Fixed)]
    arrivals: Arrivals,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds; runs until signalled when absent.
    #[arg(long)]
    duration: Option<f64>,
    #[arg(long, default_value_t = 3)]
    kernels: u32,
    #[arg(long, default_value_t = 300)]
    kernel_us: u64,
    #[arg(long, default_value_t = 64)]
    blocks: u32,
    /// Memory held for the whole run (model weights, KV cache), MiB.
    #[arg(long, default_value_t = 0)]
    alloc_mib: u64,
    /// Wait for each request with cuCtxSynchronize (what PyTorch's
    /// torch.cuda.synchronize() calls) instead of cuStreamSynchronize.
    #[arg(long)]
    ctx_sync: bool,
    #[arg(long, default_value_t = 0)]
    device: c_int,
    /// Appends `<due, Unix s> <latency ms>` for every request served, so
    /// that a caller can cut the run into measuring windows.
    #[arg(long)]
    latency_log: Option<std::path::PathBuf>,
    /// While this file exists, requests falling due are dropped (neither
    /// served nor logged): the service is paused without a backlog.
    #[arg(long)]
    pause_file: Option<std::path::PathBuf>,
}

// The trainer's options (its help text is `Mode::Offline`'s).
#[derive(Args)]
struct Offline {
    #[arg(long)]
    duration: Option<f64>,
    #[arg(long, default_value_t = 20)]
    kernels_per_step: u32,
    #[arg(long, default_value_t = 500)]
    kernel_us: u64,
    #[arg(long, default_value_t = 132)]
    blocks: u32,
    /// Persistent allocation (weights), MiB; each step also allocates and frees a quarter of it.
    #[arg(long, default_value_t = 256)]
    alloc_mib: u64,
    /// Replay each step as a captured CUDA graph (cuGraphLaunch).
    #[arg(long)]
    graph: bool,
    /// Host time after each step (data loading, the framework), us: a
    /// trainer that leaves the GPU idle part of the time, as the real
    /// one of real-gpu/README.md (40 % busy alone).
    #[arg(long, default_value_t = 0)]
    host_us: u64,
    #[arg(long, default_value_t = 0)]
    device: c_int,
    /// Checkpoint file: resumed from at start (`step=N`), written on a
    /// `--checkpoint-on` signal after the weights' device-to-host copy.
    #[arg(long)]
    checkpoint: Option<std::path::PathBuf>,
    /// Signals that make the trainer checkpoint (repeatable).
    #[arg(long, value_enum)]
    checkpoint_on: Vec<CheckpointSignal>,
    /// Rewritten with `step=N` after every completed step.
    #[arg(long)]
    progress: Option<std::path::PathBuf>,
    /// Ignore SIGTERM (SIG_IGN), as some launchers do.
    #[arg(long)]
    ignore_sigterm: bool,
    /// While this file exists, no step starts (checked between steps): the
    /// trainer is paused without stopping the process, which could hold
    /// the simulated GPU's lock.
    #[arg(long)]
    pause_file: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CheckpointSignal {
    /// SIGTERM (and SIGINT): checkpoint, then exit.
    Term,
    /// SIGUSR1: checkpoint, then stop stepping until stopped.
    Usr1,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Arrivals {
    Fixed,
    Poisson,
}

/// Arrival times (s after start) of an open-loop request stream.
struct Schedule {
    arrivals: Arrivals,
    period: f64,
    rng: u64,
    next: f64,
}

impl Schedule {
    fn new(arrivals: Arrivals, rate: f64, seed: u64) -> Schedule {
        Schedule {
            arrivals,
            period: 1.0 / rate.max(0.001),
            // xorshift64* must not start at zero.
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            next: 0.0,
        }
    }

    /// When the next request is due.
    fn due(&self) -> f64 {
        self.next
    }

    /// Moves on to the request after.
    fn advance(&mut self) {
        self.next += match self.arrivals {
            Arrivals::Fixed => self.period,
            Arrivals::Poisson => {
                self.rng ^= self.rng >> 12;
                self.rng ^= self.rng << 25;
                self.rng ^= self.rng >> 27;
                let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
                // Uniform in (0, 1]: never ln(0).
                let u = ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                -u.ln() * self.period
            }
        };
    }
}

static STOP: AtomicBool = AtomicBool::new(false);
/// SIGUSR1 came (the warning before a stop).
static WARNED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_warning(_: c_int) {
    WARNED.store(true, Ordering::SeqCst);
}

/// Writes `step=N` to `path` atomically (a temp file renamed over it).
fn write_step(path: &std::path::Path, step: u64) {
    // Appended, not with_extension: `progress-0.3-a` and `progress-0.3-b`
    // would share one temporary file.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    if let Err(e) =
        std::fs::write(&tmp, format!("step={step}\n")).and_then(|()| std::fs::rename(&tmp, path))
    {
        eprintln!("muxflow-workload: cannot write {}: {e}", path.display());
        std::process::exit(4);
    }
}

/// The step a checkpoint file holds (0 without one).
fn read_step(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().strip_prefix("step=")?.parse().ok())
        .unwrap_or(0)
}

struct Api {
    get: ProcAddress,
    flags: u64,
}

impl Api {
    /// Resolves through cuGetProcAddress; a missing entry point is fatal.
    fn sym<T: Copy>(&self, name: &str) -> T {
        let c = CString::new(name).expect("name");
        match self.get.resolve(&c, cudaload::CUDA_VERSION, self.flags) {
            0 => {
                eprintln!("muxflow-workload: cuGetProcAddress({name}) failed");
                std::process::exit(2);
            }
            // SAFETY: the driver's entry point for `name`, whose C signature T is.
            p => unsafe { cudaload::as_fn(p) },
        }
    }
}

/// The entry points used, typed from the one list (`abi::fnty`): what
/// cuGetProcAddress returns for each base name at CUDA 12.4.
struct Cuda {
    err_name: fnty::cuGetErrorName,
    retain: fnty::cuDevicePrimaryCtxRetain,
    release: fnty::cuDevicePrimaryCtxRelease_v2,
    set_current: fnty::cuCtxSetCurrent,
    module_load_data: fnty::cuModuleLoadData,
    get_function: fnty::cuModuleGetFunction,
    launch: fnty::cuLaunchKernel,
    stream_sync: fnty::cuStreamSynchronize,
    dtoh: fnty::cuMemcpyDtoH_v2,
    ctx_sync: fnty::cuCtxSynchronize,
    alloc: fnty::cuMemAlloc_v2,
    free: fnty::cuMemFree_v2,
    alloc_async: fnty::cuMemAllocAsync,
    free_async: fnty::cuMemFreeAsync,
    begin_capture: fnty::cuStreamBeginCapture_v2,
    end_capture: fnty::cuStreamEndCapture,
    instantiate: fnty::cuGraphInstantiateWithFlags,
    graph_launch: fnty::cuGraphLaunch,
}

struct Failed(Res, &'static str);

fn ok(rc: Res, what: &'static str) -> Result<(), Failed> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Failed(rc, what))
    }
}

fn load(flags: u64) -> Cuda {
    let get = Driver::open()
        .and_then(|d| d.proc_address(false))
        .unwrap_or_else(|e| {
            eprintln!("muxflow-workload: {e}");
            std::process::exit(2);
        });
    let api = Api { get, flags };
    // SAFETY: resolved by the driver for this exact name.
    let init: fnty::cuInit = api.sym("cuInit");
    // SAFETY: cuInit(0).
    let rc = unsafe { init(0) };
    if rc != 0 {
        eprintln!("muxflow-workload: cuInit failed: {rc}");
        println!("error={rc}");
        std::process::exit(3);
    }
    Cuda {
        err_name: api.sym("cuGetErrorName"),
        retain: api.sym("cuDevicePrimaryCtxRetain"),
        release: api.sym("cuDevicePrimaryCtxRelease"),
        set_current: api.sym("cuCtxSetCurrent"),
        module_load_data: api.sym("cuModuleLoadData"),
        get_function: api.sym("cuModuleGetFunction"),
        launch: api.sym("cuLaunchKernel"),
        stream_sync: api.sym("cuStreamSynchronize"),
        dtoh: api.sym("cuMemcpyDtoH"),
        ctx_sync: api.sym("cuCtxSynchronize"),
        alloc: api.sym("cuMemAlloc"),
        free: api.sym("cuMemFree"),
        alloc_async: api.sym("cuMemAllocAsync"),
        free_async: api.sym("cuMemFreeAsync"),
        begin_capture: api.sym("cuStreamBeginCapture"),
        end_capture: api.sym("cuStreamEndCapture"),
        instantiate: api.sym("cuGraphInstantiateWithFlags"),
        graph_launch: api.sym("cuGraphLaunch"),
    }
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let cli = Cli::parse();
    install_handlers(&cli.mode);
    let (flags, device) = match &cli.mode {
        Mode::Online(o) => (0, o.device),
        // The trainer exercises the per-thread-default-stream (_ptsz) variants.
        Mode::Offline(o) => (cudaload::PER_THREAD_DEFAULT_STREAM, o.device),
    };
    let mut run = Run {
        cu: load(flags),
        ctx: std::ptr::null_mut(),
        start: Instant::now(),
        report: String::new(),
        allocs: Vec::new(),
    };
    let result = run.context(device).and_then(|module| match &cli.mode {
        Mode::Online(o) => run.online(module, o),
        Mode::Offline(o) => run.offline(module, o),
    });
    std::process::exit(run.finish(result, device));
}

/// SIGTERM and SIGINT stop the run; SIGUSR1 warns a trainer that
/// checkpoints on it; `--ignore-sigterm` ignores SIGTERM.
fn install_handlers(mode: &Mode) {
    // SAFETY: installing handlers that only store to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        if let Mode::Offline(o) = mode {
            if o.checkpoint_on.contains(&CheckpointSignal::Usr1) {
                libc::signal(libc::SIGUSR1, on_warning as *const () as libc::sighandler_t);
            }
            if o.ignore_sigterm {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
            }
        }
    }
}

/// One run: the driver, the context, what it holds, and its report line.
struct Run {
    cu: Cuda,
    ctx: H,
    start: Instant,
    /// The `key=value` report (empty until a mode's loop ended).
    report: String,
    /// Held for the whole run; freed at the graceful exit.
    allocs: Vec<u64>,
}

// SAFETY (for the `unsafe` blocks below): every call goes to entry points
// resolved for their exact signatures.
impl Run {
    /// The device's primary context, made current; the module loaded.
    fn context(&mut self, device: c_int) -> Result<H, Failed> {
        let cu = &self.cu;
        let mut module: H = std::ptr::null_mut();
        // SAFETY: see the impl; valid out-pointers.
        unsafe {
            ok(
                (cu.retain)(&mut self.ctx, device),
                "cuDevicePrimaryCtxRetain",
            )?;
            ok((cu.set_current)(self.ctx), "cuCtxSetCurrent")?;
            ok(
                (cu.module_load_data)(&mut module, c"simgpu".as_ptr() as *const c_void),
                "cuModuleLoadData",
            )?;
        }
        Ok(module)
    }

    /// Signalled, or `duration` seconds gone since the start.
    fn done(&self, duration: Option<f64>) -> bool {
        STOP.load(Ordering::SeqCst)
            || duration.is_some_and(|d| self.start.elapsed().as_secs_f64() >= d)
    }

    /// The kernel of `kernel_us` microseconds.
    fn kernel(&self, module: H, kernel_us: u64) -> Result<H, Failed> {
        let name = CString::new(format!("sim_kernel_{kernel_us}us")).unwrap();
        let mut f: H = std::ptr::null_mut();
        // SAFETY: see the impl; a valid out-pointer and name.
        unsafe {
            ok(
                (self.cu.get_function)(&mut f, module, name.as_ptr()),
                "cuModuleGetFunction",
            )?;
        }
        Ok(f)
    }

    /// `n` launches of `f` (`blocks` blocks of `threads`) on the default stream.
    fn launch(&self, f: H, n: u32, blocks: u32, threads: u32) -> Result<(), Failed> {
        let null = std::ptr::null_mut();
        for _ in 0..n {
            // SAFETY: see the impl; valid arguments.
            let rc = unsafe {
                (self.cu.launch)(
                    f,
                    blocks,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    null,
                    null.cast(),
                    null.cast(),
                )
            };
            ok(rc, "cuLaunchKernel")?;
        }
        Ok(())
    }

    /// Takes `bytes` for the whole run.
    fn hold(&mut self, bytes: u64) -> Result<u64, Failed> {
        let mut p = 0u64;
        // SAFETY: see the impl; a valid out-pointer.
        ok(
            unsafe { (self.cu.alloc)(&mut p, bytes as usize) },
            "cuMemAlloc",
        )?;
        self.allocs.push(p);
        Ok(p)
    }

    /// The service: requests on `o`'s schedule, each `kernels` launches and
    /// a synchronize; the latency counts from when the request was due.
    fn online(&mut self, module: H, o: &Online) -> Result<(), Failed> {
        let f = self.kernel(module, o.kernel_us)?;
        if o.alloc_mib > 0 {
            self.hold(o.alloc_mib << 20)?;
        }
        let mut lat = Vec::new();
        let mut schedule = Schedule::new(o.arrivals, o.rate, o.seed);
        let mut res = Ok(());
        let mut log = o.latency_log.as_ref().map(|path| {
            std::io::LineWriter::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .unwrap_or_else(|e| {
                        eprintln!("muxflow-workload: --latency-log {}: {e}", path.display());
                        std::process::exit(2)
                    }),
            )
        });
        // Instants have no epoch: the log's times are Unix times of the start plus the offset.
        let start_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
            - self.start.elapsed().as_secs_f64();
        while !self.done(o.duration) {
            let due = self.start + Duration::from_secs_f64(schedule.due());
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(50)));
                continue;
            }
            if o.pause_file.as_ref().is_some_and(|p| p.exists()) {
                schedule.advance();
                continue;
            }
            let r = self.launch(f, o.kernels, o.blocks, 128).and_then(|()| {
                // SAFETY: see the impl; the default stream.
                unsafe {
                    if o.ctx_sync {
                        ok((self.cu.ctx_sync)(), "cuCtxSynchronize")
                    } else {
                        ok(
                            (self.cu.stream_sync)(std::ptr::null_mut()),
                            "cuStreamSynchronize",
                        )
                    }
                }
            });
            if r.is_err() {
                res = r;
                break;
            }
            let ms = due.elapsed().as_secs_f64() * 1e3;
            lat.push(ms);
            if let Some(w) = log.as_mut() {
                use std::io::Write;
                let _ = writeln!(w, "{:.6} {ms:.3}", start_unix + schedule.due());
            }
            schedule.advance();
        }
        let el = self.start.elapsed().as_secs_f64();
        let n = lat.len();
        lat.sort_by(|a, b| a.total_cmp(b));
        self.report = format!(
            "mode=online requests={n} rps={:.1} p50_ms={:.3} p99_ms={:.3} elapsed_s={el:.2}",
            n as f64 / el,
            pct(&lat, 0.5),
            pct(&lat, 0.99)
        );
        res
    }

    /// The trainer: weights held, then steps (each an activation allocated
    /// and freed around the step's kernels) until done; checkpoints as
    /// `--checkpoint-on` says.
    fn offline(&mut self, module: H, o: &Offline) -> Result<(), Failed> {
        let f = self.kernel(module, o.kernel_us)?;
        let mib = 1u64 << 20;
        let weights = self.hold(o.alloc_mib * mib)?;
        let step_bytes = (o.alloc_mib * mib / 4).max(mib);
        // One training step's kernels, captured once with --graph.
        let exec = if o.graph {
            Some(self.capture_step(f, o)?)
        } else {
            None
        };
        let resumed = o.checkpoint.as_deref().map_or(0, read_step);
        let mut steps = resumed;
        let mut res = Ok(());
        let mut saved_on_warning = false;
        while !self.done(o.duration) {
            if WARNED.load(Ordering::SeqCst) {
                if !saved_on_warning {
                    res = self.save(o, weights, steps);
                    if res.is_err() {
                        break;
                    }
                    saved_on_warning = true;
                }
                // Checkpointed: no step from now on is saved, so none is taken.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if o.pause_file.as_ref().is_some_and(|p| p.exists()) {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let r = self.step(f, o, exec, step_bytes);
            if r.is_err() {
                res = r;
                break;
            }
            steps += 1;
            if let Some(p) = &o.progress {
                write_step(p, steps);
            }
            if o.host_us > 0 {
                std::thread::sleep(Duration::from_micros(o.host_us));
            }
        }
        if res.is_ok()
            && STOP.load(Ordering::SeqCst)
            && o.checkpoint_on.contains(&CheckpointSignal::Term)
        {
            res = self.save(o, weights, steps);
        }
        let el = self.start.elapsed().as_secs_f64();
        self.report = format!(
            "mode=offline steps={steps} resumed={resumed} steps_per_s={:.2} peak_mib={} elapsed_s={el:.2}",
            (steps - resumed) as f64 / el,
            o.alloc_mib + step_bytes / mib
        );
        res
    }

    /// One step's kernels captured into a graph and instantiated.
    fn capture_step(&self, f: H, o: &Offline) -> Result<H, Failed> {
        let cu = &self.cu;
        let null = std::ptr::null_mut();
        let (mut g, mut exec): (H, H) = (null, null);
        // SAFETY: see the impl; valid out-pointers.
        unsafe {
            ok((cu.begin_capture)(null, 0), "cuStreamBeginCapture")?;
            self.launch(f, o.kernels_per_step, o.blocks, 256)?;
            ok((cu.end_capture)(null, &mut g), "cuStreamEndCapture")?;
            ok(
                (cu.instantiate)(&mut exec, g, 0),
                "cuGraphInstantiateWithFlags",
            )?;
        }
        Ok(exec)
    }

    /// One training step: the activation allocated, the step's kernels (or
    /// its graph), the activation freed, the stream synchronized.
    fn step(&self, f: H, o: &Offline, exec: Option<H>, step_bytes: u64) -> Result<(), Failed> {
        let cu = &self.cu;
        let null = std::ptr::null_mut();
        let mut act = 0u64;
        // SAFETY: see the impl; valid arguments.
        unsafe {
            ok(
                (cu.alloc_async)(&mut act, step_bytes as usize, null),
                "cuMemAllocAsync",
            )?;
            match exec {
                Some(exec) => ok((cu.graph_launch)(exec, null), "cuGraphLaunch")?,
                None => self.launch(f, o.kernels_per_step, o.blocks, 256)?,
            }
            ok((cu.free_async)(act, null), "cuMemFreeAsync")?;
            ok((cu.stream_sync)(null), "cuStreamSynchronize")
        }
    }

    /// The weights to the host, then the step counter: a checkpoint exists
    /// only if the copy succeeded. Nothing without `--checkpoint`.
    fn save(&self, o: &Offline, weights: u64, steps: u64) -> Result<(), Failed> {
        let Some(path) = &o.checkpoint else {
            return Ok(());
        };
        let mut host = vec![0u8; 4096];
        // SAFETY: see the impl; a host buffer of the length given.
        let rc = unsafe { (self.cu.dtoh)(host.as_mut_ptr() as *mut c_void, weights, host.len()) };
        ok(rc, "cuMemcpyDtoH (checkpoint)")?;
        write_step(path, steps);
        Ok(())
    }

    /// Graceful exit: synchronize, free, release the context, print the
    /// report (and write it where muxflow's plugin says); or report the
    /// failed call. The exit code.
    fn finish(self, result: Result<(), Failed>, device: c_int) -> i32 {
        let cu = &self.cu;
        let report = &self.report;
        // SAFETY: see the impl; failures here are reported, not fatal.
        unsafe {
            match result {
                Ok(()) => {
                    let _ = (cu.ctx_sync)();
                    for &a in &self.allocs {
                        let _ = (cu.free)(a);
                    }
                    if !self.ctx.is_null() {
                        let _ = (cu.release)(device);
                    }
                    println!("{report}");
                    // muxflow's plugin names this file: the figures reach the
                    // job's AdminComment.
                    if let Some(path) = std::env::var_os("MUXFLOW_JOB_REPORT") {
                        if let Err(e) = std::fs::write(&path, format!("{report}\n")) {
                            eprintln!(
                                "muxflow-workload: cannot write {}: {e}",
                                path.to_string_lossy()
                            );
                        }
                    }
                    0
                }
                Err(Failed(rc, what)) => {
                    let mut n: *const c_char = std::ptr::null();
                    (cu.err_name)(rc, &mut n);
                    let name = if n.is_null() {
                        "?".into()
                    } else {
                        CStr::from_ptr(n).to_string_lossy().into_owned()
                    };
                    eprintln!("muxflow-workload: {what} failed: {name} ({rc})");
                    println!(
                        "{report}{}error={name} code={rc} call={what}",
                        if report.is_empty() { "" } else { " " }
                    );
                    1
                }
            }
        }
    }
}
