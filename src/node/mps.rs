//! One MPS control daemon per GPU: start, query, evict, stop.
//!
//! Each GPU's daemon has its own pipe and log directory
//! (`<mps_pipe_root>/<gpu>`, `<mps_log_root>/<gpu>`) and sees only its GPU
//! (CUDA_VISIBLE_DEVICES). Commands go to the daemon through
//! `nvidia-cuda-mps-control` on stdin, with a timeout so a hung daemon cannot
//! hang a Prolog.
//!
//! The fact that shapes this module: an MPS daemon serves one Linux user at
//! a time unless it runs as root with NVIDIA's `-multiuser-server` (MPS docs,
//! "Provisioning sequence": Volta and newer, not Tegra). Without that mode a
//! second user's client waits inside `cuInit` until every client of the first
//! user has gone. So the daemon is started in that mode where the config
//! asks for it and the GPU supports it ([`ServerMode::plan`]); where it
//! cannot be, the node says so ([`MpsDaemon::serves_all_users`], published
//! to the matcher), and the matcher pairs only jobs of one user there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::node::mps_v3::{self, Protocol};
use crate::node::process::{self, RunError};
use crate::Config;

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("{0} (check paths.mps_control in muxflow.toml)")]
    Run(#[from] RunError),
    #[error("{dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("MPS control for GPU {gpu}: '{command}' timed out after {timeout:?}")]
    Timeout {
        gpu: u32,
        command: String,
        timeout: Duration,
    },
    #[error("MPS control for GPU {gpu}: '{command}' failed: {output}")]
    Failed {
        gpu: u32,
        command: String,
        output: String,
    },
    #[error(
        "MPS control daemon for GPU {gpu} did not come up within {timeout:?} (log: {log_dir})"
    )]
    NotStarted {
        gpu: u32,
        timeout: Duration,
        log_dir: PathBuf,
    },
    #[error("MPS control for GPU {gpu}: unexpected reply to '{command}': {output}")]
    Parse {
        gpu: u32,
        command: String,
        output: String,
    },
    #[error("MPS control for GPU {gpu}: {source}")]
    Unspoken {
        gpu: u32,
        #[source]
        source: mps_v3::Unspoken,
    },
}

/// The MPS control daemon of one GPU.
#[derive(Debug, Clone)]
pub struct MpsDaemon {
    gpu: u32,
    control: PathBuf,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    multiuser: bool,
    static_partitions: bool,
    /// The grammar a daemon this starts speaks (a running one's own is
    /// read from its command line: [`Self::protocol`]).
    start_protocol: Protocol,
    timeout: Duration,
}

/// NVIDIA's documented flag of `nvidia-cuda-mps-control -d` for multi-user
/// server mode (MPS docs, Architecture › Provisioning sequence › Server).
pub const MULTIUSER_FLAG: &str = "-multiuser-server";

/// The lowest compute capability NVIDIA documents multi-user mode for (Volta).
pub const MULTIUSER_MIN_CC: ComputeCapability = ComputeCapability { major: 7, minor: 0 };

/// Compute capabilities of NVIDIA's integrated (Tegra/Jetson) GPUs, where
/// multi-user mode is not supported: TX1 5.3, TX2 6.2, Xavier 7.2, Orin 8.7,
/// Thor 10.1 (11.0 from CUDA 13). From CUDA's published capability table;
/// a GPU NVML cannot describe is not taken for one.
pub const TEGRA_CCS: [ComputeCapability; 6] = [
    ComputeCapability { major: 5, minor: 3 },
    ComputeCapability { major: 6, minor: 2 },
    ComputeCapability { major: 7, minor: 2 },
    ComputeCapability { major: 8, minor: 7 },
    ComputeCapability {
        major: 10,
        minor: 1,
    },
    ComputeCapability {
        major: 11,
        minor: 0,
    },
];

/// A GPU's CUDA compute capability, as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a GPU's daemon serves one user at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SingleUser {
    /// `[mps] multiuser = false`.
    Config,
    /// Older than Volta.
    GpuTooOld(ComputeCapability),
    /// An integrated (Tegra) GPU.
    Tegra(ComputeCapability),
    /// The daemon did not start with the flag; what it said.
    Refused(String),
    /// A daemon already running was started without the flag (by an older
    /// muxflow, or by hand).
    RunningWithout,
}

impl std::fmt::Display for SingleUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SingleUser::Config => write!(f, "[mps] multiuser = false in muxflow.toml"),
            SingleUser::GpuTooOld(cc) => write!(
                f,
                "compute capability {cc} is below {MULTIUSER_MIN_CC} (Volta), the oldest NVIDIA supports {MULTIUSER_FLAG} on"
            ),
            SingleUser::Tegra(cc) => write!(
                f,
                "compute capability {cc} is an integrated (Tegra) GPU, where NVIDIA does not support {MULTIUSER_FLAG}"
            ),
            SingleUser::Refused(said) => write!(
                f,
                "nvidia-cuda-mps-control -d {MULTIUSER_FLAG} failed ({said}); started without it"
            ),
            SingleUser::RunningWithout => write!(
                f,
                "the running control daemon was started without {MULTIUSER_FLAG} (stop it with `echo quit | nvidia-cuda-mps-control` while the GPU has no job; the next job's Prolog starts it in multi-user mode)"
            ),
        }
    }
}

/// How a GPU's daemon serves users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMode {
    /// One server for every user's clients.
    MultiUser,
    /// One user at a time; why.
    SingleUser(SingleUser),
}

impl ServerMode {
    /// The mode to start a daemon in: multi-user where the config asks for
    /// it and the GPU is not known to lack it. `cc` None (NVML could not
    /// say): the flag is passed and the daemon's exit status decides.
    pub fn plan(config_multiuser: bool, cc: Option<ComputeCapability>) -> ServerMode {
        match cc {
            _ if !config_multiuser => ServerMode::SingleUser(SingleUser::Config),
            Some(cc) if TEGRA_CCS.contains(&cc) => ServerMode::SingleUser(SingleUser::Tegra(cc)),
            Some(cc) if cc < MULTIUSER_MIN_CC => ServerMode::SingleUser(SingleUser::GpuTooOld(cc)),
            _ => ServerMode::MultiUser,
        }
    }

    pub fn is_multiuser(&self) -> bool {
        *self == ServerMode::MultiUser
    }
}

/// What NVML says of a GPU, as far as starting its daemon needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The compute capability (None: NVML could not say).
    pub cc: Option<ComputeCapability>,
    /// The UUID (`GPU-…`), which the daemon and its clients name the GPU
    /// by (None: NVML could not say; the index is used).
    pub uuid: Option<String>,
}

/// A `CUDA_VISIBLE_DEVICES` entry that is a GPU or MIG UUID.
pub fn is_uuid(device: &str) -> bool {
    device.starts_with("GPU-") || device.starts_with("MIG-")
}

/// Does a control daemon's output say it does not know an option? (The
/// 13000 binary: `Unrecognized option`, then its help, exit status 0.)
pub fn says_unrecognized(output: &str) -> bool {
    let lower = output.to_ascii_lowercase();
    lower.contains("unrecognized option") || lower.contains("unknown option")
}

/// What [`MpsDaemon::ensure_running`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// It started the daemon (false: one already answered).
    pub started: bool,
    /// How the daemon serves users (for a daemon found running: as far as
    /// its command line tells, see [`MpsDaemon::serves_all_users`]).
    pub mode: ServerMode,
}

impl MpsDaemon {
    pub fn for_gpu(config: &Config, gpu: u32) -> Self {
        MpsDaemon {
            gpu,
            control: config.paths.mps_control.as_path().to_path_buf(),
            pipe_dir: pipe_dir(config, gpu),
            log_dir: config.paths.mps_log_root.as_path().join(gpu.to_string()),
            multiuser: config.mps.multiuser,
            static_partitions: false,
            start_protocol: Protocol::V2,
            timeout: Duration::from_millis(config.mps.command_timeout_ms),
        }
    }

    /// A daemon this starts runs in static SM partitioning mode (`-S`):
    /// the caller decides from the config, the daemon's version and the GPU
    /// ([`crate::node::sm_partition`]).
    pub fn with_static_partitions(mut self, on: bool) -> Self {
        self.static_partitions = on;
        self
    }

    /// A daemon this starts speaks `protocol` (`-p 3` for v3, with its
    /// server [`mps_v3::SERVER`]): the caller decides from the daemon's
    /// version ([`crate::node::mps_v3::Support`]).
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.start_protocol = protocol;
        self
    }

    /// The grammar this GPU's daemon speaks: a running daemon's by its
    /// command line (NVIDIA: every invocation follows the running daemon's
    /// protocol), else the one it would start with.
    pub fn protocol(&self) -> Protocol {
        match self.running_args() {
            Some(args) if mps_v3::args_say_v3(&args) => Protocol::V3,
            Some(_) => Protocol::V2,
            None => self.start_protocol,
        }
    }

    pub fn gpu(&self) -> u32 {
        self.gpu
    }

    pub fn pipe_dir(&self) -> &Path {
        &self.pipe_dir
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    fn command(&self) -> Command {
        // Nothing from the caller's environment reaches the daemon.
        let mut c = process::command(&self.control);
        c.env_remove("SLURM_CONF")
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log_dir);
        c
    }

    /// Starts the daemon unless it already runs, in multi-user mode where
    /// [`ServerMode::plan`] allows (`facts`: asked only when a daemon is to
    /// be started, what NVML says of the GPU). A daemon that refuses the
    /// multi-user flag is started again without it, so jobs of one user
    /// still get MPS; the mode it runs in is returned and remembered for
    /// [`Self::serves_all_users`]. Callers serialise this per GPU (the GPU
    /// lock of `node_state`).
    pub fn ensure_running(&self, facts: impl FnOnce() -> DeviceFacts) -> Result<Running, MpsError> {
        if self.is_running() {
            let mode = match self.serves_all_users() {
                Some(true) => ServerMode::MultiUser,
                _ => ServerMode::SingleUser(SingleUser::RunningWithout),
            };
            return Ok(Running {
                started: false,
                mode,
            });
        }
        self.start_daemon(&facts())
    }

    /// Starts the daemon (none runs) for the GPU `facts` describes.
    fn start_daemon(&self, facts: &DeviceFacts) -> Result<Running, MpsError> {
        for dir in [&self.pipe_dir, &self.log_dir] {
            create_private_dir(dir)?;
        }
        self.remember_device(facts);
        let mut mode = ServerMode::plan(self.multiuser, facts.cc);
        if self.start_protocol == Protocol::V3 {
            // Anything a v3 start refuses: today's v2 daemon instead.
            if let Err(said) = self.start(mode.is_multiuser())? {
                tracing::error!(
                    gpu = self.gpu,
                    "the MPS control daemon refused to start as MPS v3 ({said}); starting it as MPS v2, so offline jobs get no namespace"
                );
                return self.clone().with_protocol(Protocol::V2).start_daemon(facts);
            }
        } else if mode.is_multiuser() {
            if let Err(said) = self.start(true)? {
                tracing::error!(
                    gpu = self.gpu,
                    "the MPS control daemon refused {MULTIUSER_FLAG} ({said}); starting it without: jobs of different users will not share GPU {} (check the driver supports multi-user MPS on this GPU, or set [mps] multiuser = false)",
                    self.gpu
                );
                mode = ServerMode::SingleUser(SingleUser::Refused(said));
            }
        }
        if !mode.is_multiuser() && self.start_protocol == Protocol::V2 {
            if let Err(said) = self.start(false)? {
                return Err(MpsError::Failed {
                    gpu: self.gpu,
                    command: "-d".into(),
                    output: said,
                });
            }
        }
        self.remember_mode(&mode);
        if self.start_protocol == Protocol::V3 {
            if let Err(e) = self.send_text(&mps_v3::server_create()) {
                // Today's path rather than none: the jobs keep MPS v2.
                tracing::error!(
                    gpu = self.gpu,
                    "the MPS v3 daemon refused '{}' ({e}); restarting it as MPS v2, so offline jobs get no namespace",
                    mps_v3::server_create()
                );
                self.quit()?;
                return self.clone().with_protocol(Protocol::V2).start_daemon(facts);
            }
        }
        Ok(Running {
            started: true,
            mode,
        })
    }

    /// `nvidia-cuda-mps-control -d [flags]`, the GPU named as the daemon
    /// is to see it ([`Self::remember_device`]): Ok(Err(what it said)) when
    /// no daemon came up. Judged by what the daemon does — its control
    /// socket answering — not by the exit status: the 13000 binary prints
    /// `Unrecognized option` and its help for a flag it lacks, and exits 0.
    fn start(&self, multiuser: bool) -> Result<Result<(), String>, MpsError> {
        let mut c = self.command();
        c.arg("-d")
            .env("CUDA_VISIBLE_DEVICES", self.daemon_device());
        match (self.start_protocol, multiuser) {
            (Protocol::V3, true) => {
                c.args(mps_v3::PROTOCOL_ARGS).arg(mps_v3::MULTIUSER_FLAG);
            }
            (Protocol::V3, false) => {
                c.args(mps_v3::PROTOCOL_ARGS);
            }
            (Protocol::V2, true) => {
                c.arg(MULTIUSER_FLAG);
            }
            (Protocol::V2, false) => {}
        }
        if self.static_partitions {
            c.arg(crate::node::sm_partition::STATIC_FLAG);
        }
        let said_file = self.log_dir.join("muxflow-start.out");
        let out = std::fs::File::create(&said_file).map_err(|source| MpsError::Dir {
            dir: self.log_dir.clone(),
            source,
        })?;
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let out = process::run(c, None, self.timeout, process::Output::Detached(out))?;
        let said = std::fs::read_to_string(&said_file).unwrap_or_default();
        let first = |text: &str| {
            crate::text::shorten(
                text.lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim(),
            )
        };
        if says_unrecognized(&said) {
            return Ok(Err(format!(
                "'{}' printed '{}' (an option this daemon does not have)",
                args.join(" "),
                first(&said)
            )));
        }
        if out.success {
            let start = Instant::now();
            while start.elapsed() <= self.timeout {
                if self.is_running() {
                    return Ok(Ok(()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // The daemon says why in its control log, not on a terminal.
        let log = std::fs::read_to_string(self.log_dir.join("control.log")).unwrap_or_default();
        let last = log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        Ok(Err(format!(
            "{}, no control daemon answered within {:?}; it printed '{}'; last line of {}: '{}'",
            if out.success {
                "exit status 0"
            } else {
                "exit status non-zero"
            },
            self.timeout,
            first(&said),
            self.log_dir.join("control.log").display(),
            crate::text::shorten(last.trim())
        )))
    }

    /// Where muxflow notes the device it gave the daemon (root-owned log
    /// directory): the GPU's UUID, or its index where NVML gave no UUID.
    fn device_file(&self) -> PathBuf {
        self.log_dir.join("muxflow-device")
    }

    fn remember_device(&self, facts: &DeviceFacts) {
        let device = match &facts.uuid {
            Some(uuid) => uuid.clone(),
            None => {
                tracing::warn!(
                    gpu = self.gpu,
                    "NVML gives no UUID for the GPU: its MPS control daemon is started with CUDA_VISIBLE_DEVICES={} and its clients are given device 0",
                    self.gpu
                );
                self.gpu.to_string()
            }
        };
        if let Err(e) = std::fs::write(self.device_file(), format!("{device}\n")) {
            tracing::warn!(gpu = self.gpu, "cannot note the MPS daemon's device: {e}");
        }
    }

    /// The device muxflow last gave this GPU's daemon (`CUDA_VISIBLE_DEVICES`:
    /// a UUID, or the index where NVML gave none); None when it never
    /// started one (or an older muxflow did, which gave the index).
    pub fn noted_device(&self) -> Option<String> {
        std::fs::read_to_string(self.device_file())
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    }

    /// What the daemon's `CUDA_VISIBLE_DEVICES` is: the noted device, else
    /// the GPU's index.
    fn daemon_device(&self) -> String {
        self.noted_device().unwrap_or_else(|| self.gpu.to_string())
    }

    /// The `CUDA_VISIBLE_DEVICES` a client of this daemon gets: the GPU's
    /// UUID where the daemon was given it, else `0`. The daemon shows its
    /// clients only its own device, renumbered to 0, so the node's index
    /// (1..7 on an 8-GPU node) would name a device the server lacks
    /// (NVIDIA, MPS docs, Appendix: Environment Variables). The UUID names
    /// the same device through the server and, were the daemon down,
    /// without it; `0` is right only through the server.
    pub fn client_device(&self) -> String {
        let device = self.daemon_device();
        if is_uuid(&device) {
            device
        } else {
            "0".into()
        }
    }

    /// Where muxflow notes the mode it started the daemon in (root-owned
    /// log directory): "multiuser", or "single_user: <why>".
    fn mode_file(&self) -> PathBuf {
        self.log_dir.join("muxflow-mode")
    }

    fn remember_mode(&self, mode: &ServerMode) {
        let text = match mode {
            ServerMode::MultiUser => "multiuser\n".to_string(),
            ServerMode::SingleUser(why) => format!("single_user: {why}\n"),
        };
        if let Err(e) = std::fs::write(self.mode_file(), text) {
            tracing::warn!(gpu = self.gpu, "cannot note the MPS daemon's mode: {e}");
        }
    }

    /// How muxflow last started this GPU's daemon, as noted ("multiuser",
    /// or "single_user: <why>"); None when it never did.
    pub fn mode_note(&self) -> Option<String> {
        std::fs::read_to_string(self.mode_file()).ok()
    }

    /// Does this GPU's daemon serve clients of every user (None: no daemon
    /// was ever started here by muxflow, and none runs)? A running daemon
    /// answers by its command line (`/proc/<pid>/cmdline` of the pid in its
    /// pipe directory: the truth, whoever started it); a stopped one by the
    /// mode muxflow last started it in. No command is sent: the health step
    /// publishes this every time and must stay quick.
    pub fn serves_all_users(&self) -> Option<bool> {
        if let Some(args) = self.running_args() {
            return Some(
                args.iter().any(|a| a == MULTIUSER_FLAG)
                    || (mps_v3::args_say_v3(&args) && mps_v3::args_say_multiuser(&args)),
            );
        }
        std::fs::read_to_string(self.mode_file())
            .ok()
            .map(|t| t.trim() == "multiuser")
    }

    /// The running daemon's arguments (`/proc/<pid>/cmdline` of the pid in
    /// its pipe directory); None when none runs.
    fn running_args(&self) -> Option<Vec<String>> {
        let pid = std::fs::read_to_string(self.pipe_dir.join("nvidia-cuda-mps-control.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (!cmdline.is_empty()).then(|| {
            cmdline
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
    }

    /// Does the running daemon run in static SM partitioning mode (its
    /// command line has `-S`)? Every client of such a daemon needs a
    /// partition.
    pub fn runs_static_partitions(&self) -> bool {
        self.running_args().is_some_and(|args| {
            args.iter().any(|a| {
                a == crate::node::sm_partition::STATIC_FLAG
                    || a == crate::node::sm_partition::STATIC_FLAG_LONG
            })
        })
    }

    /// `lspart`: the chunks of the GPU `uuid`.
    pub fn chunks(&self, uuid: &str) -> Result<crate::node::sm_partition::Chunks, MpsError> {
        let out = self.send("lspart")?;
        crate::node::sm_partition::parse_lspart(&out, uuid).ok_or_else(|| MpsError::Parse {
            gpu: self.gpu,
            command: "lspart".into(),
            output: out,
        })
    }

    /// `sm_partition add <uuid> <chunks>`: the new partition's id.
    pub fn add_partition(&self, uuid: &str, chunks: u32) -> Result<String, MpsError> {
        let command = format!("sm_partition add {uuid} {chunks}");
        let out = self.send(&command)?;
        crate::node::sm_partition::parse_created(&out).ok_or(MpsError::Failed {
            gpu: self.gpu,
            command,
            output: out,
        })
    }

    /// `sm_partition rm <uuid> <id>`, checked with `lspart` (NVIDIA does
    /// not document the reply): done when the id is listed no more.
    pub fn remove_partition(&self, uuid: &str, id: &str) -> Result<(), MpsError> {
        let command = format!("sm_partition rm {uuid} {id}");
        let out = self.send(&command)?;
        if !self.send("lspart")?.contains(id) {
            Ok(())
        } else {
            Err(MpsError::Failed {
                gpu: self.gpu,
                command,
                output: out,
            })
        }
    }

    /// The mode a daemon of this GPU runs in or would start in, as
    /// published: a daemon's own answer first ([`Self::serves_all_users`]),
    /// else the plan from the config and `cc`.
    pub fn published_mode(&self, cc: Option<ComputeCapability>) -> bool {
        self.serves_all_users()
            .unwrap_or_else(|| ServerMode::plan(self.multiuser, cc).is_multiuser())
    }

    /// Does a daemon answer in this GPU's pipe directory?
    pub fn is_running(&self) -> bool {
        self.pipe_dir.join("control").exists() && self.send("get_server_list").is_ok()
    }

    /// Sends one command, written as for a v2 daemon, in the grammar the
    /// daemon speaks ([`mps_v3::spell`]), and returns the daemon's reply.
    pub fn send(&self, command: &str) -> Result<String, MpsError> {
        let text =
            mps_v3::spell(self.protocol(), command).map_err(|source| MpsError::Unspoken {
                gpu: self.gpu,
                source,
            })?;
        self.send_text(&text)
    }

    /// Sends `command` as it is (v3's own commands, [`crate::node::mps_v3`]).
    fn send_text(&self, command: &str) -> Result<String, MpsError> {
        if is_changing(command) {
            self.note_own_command(command);
        }
        let out = process::run(
            self.command(),
            Some(command),
            self.timeout,
            process::Output::Collect,
        )?;
        if out.success {
            Ok(out.stdout.trim().to_string())
        } else {
            Err(MpsError::Failed {
                gpu: self.gpu,
                command: command.into(),
                output: format!("{}{}", out.stdout, out.stderr).trim().to_string(),
            })
        }
    }

    fn pids(&self, command: &str) -> Result<Vec<u32>, MpsError> {
        let out = self.send(command)?;
        out.split_whitespace()
            .map(|w| {
                w.parse().map_err(|_| MpsError::Parse {
                    gpu: self.gpu,
                    command: command.into(),
                    output: out.clone(),
                })
            })
            .collect()
    }

    pub fn server_pids(&self) -> Result<Vec<u32>, MpsError> {
        self.pids("get_server_list")
    }

    pub fn client_pids(&self, server: u32) -> Result<Vec<u32>, MpsError> {
        self.pids(&format!("get_client_list {server}"))
    }

    /// Tears down one client's contexts without hurting the server or the
    /// other clients (the client then sees CUDA_ERROR_MPS_CLIENT_TERMINATED).
    pub fn terminate_client(&self, server: u32, client: u32) -> Result<(), MpsError> {
        self.send(&format!("terminate_client {server} {client}"))
            .map(drop)
    }

    /// muxflow's own state-changing commands ([`CHANGING_COMMANDS`]), one a
    /// line as sent, in the root-owned log directory: the daemon logs every
    /// command but not who sent it, so this tells muxflow's from a user's.
    fn own_commands(&self) -> PathBuf {
        self.log_dir.join("muxflow-commands")
    }

    fn note_own_command(&self, command: &str) {
        use std::io::Write;
        let noted = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.own_commands())
            .and_then(|mut f| writeln!(f, "{command}"));
        if let Err(e) = noted {
            // Only the later notice suffers: muxflow's command reads as a user's.
            tracing::warn!(gpu = self.gpu, "cannot note MPS command '{command}': {e}");
        }
    }

    /// Whether a note of muxflow's own answers for `command` (as
    /// [`Self::take_own_command`], without using it up: for readers other
    /// than the health step).
    pub fn is_own_command(&self, command: &str) -> bool {
        std::fs::read_to_string(self.own_commands()).is_ok_and(|t| t.lines().any(|l| l == command))
    }

    /// Did muxflow send this state-changing command (exactly this text),
    /// one not yet matched to the daemon's log? Each note of muxflow's
    /// answers for one `Cmd:` line only, and is used up by it: a user's
    /// `quit` after muxflow's own is still a user's. Callers hold the GPU's
    /// lock (the health step does).
    pub fn take_own_command(&self, command: &str) -> bool {
        let path = self.own_commands();
        let Ok(text) = std::fs::read_to_string(&path) else {
            return false;
        };
        let mut lines: Vec<&str> = text.lines().collect();
        let Some(at) = lines.iter().position(|l| *l == command) else {
            return false;
        };
        lines.remove(at);
        let rest: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if let Err(e) = std::fs::write(&path, rest) {
            tracing::warn!(gpu = self.gpu, "cannot update {}: {e}", path.display());
        }
        true
    }

    /// Makes job's namespace `ns` on the daemon's server (v3): created,
    /// its limits set, routed by the job's cgroup. Anything refused: what
    /// was made is deleted again and the error returned (the job then
    /// keeps today's limits).
    pub fn create_namespace(&self, ns: &mps_v3::Namespace) -> Result<(), MpsError> {
        self.send_text(&mps_v3::create(ns))?;
        let rest = self
            .send_text(&mps_v3::set_limits(ns))
            .and_then(|_| self.send_text(&mps_v3::route(ns)));
        if let Err(e) = rest {
            if let Err(e2) = self.delete_namespace(&ns.name) {
                tracing::warn!(gpu = self.gpu, "{e2}");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Deletes namespace `name` (its clients with it), checked with
    /// `namespace list`: done when it is listed no more.
    pub fn delete_namespace(&self, name: &str) -> Result<(), MpsError> {
        let command = mps_v3::delete(name);
        let out = self.send_text(&command)?;
        if mps_v3::listed(&self.send_text(mps_v3::LIST)?, name) {
            return Err(MpsError::Failed {
                gpu: self.gpu,
                command,
                output: out,
            });
        }
        Ok(())
    }

    /// Stops the daemon (and its server) and removes the pipe directory.
    pub fn quit(&self) -> Result<(), MpsError> {
        if self.pipe_dir.join("control").exists() {
            self.send("quit")?;
        }
        match std::fs::remove_dir_all(&self.pipe_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(MpsError::Dir {
                dir: self.pipe_dir.clone(),
                source: e,
            }),
        }
    }
}

/// Control commands that change what the daemon does to clients (NVIDIA's
/// `nvidia-cuda-mps-control` commands); the queries are left out.
pub const CHANGING_COMMANDS: &[&str] = &[
    "quit",
    "start_server",
    "terminate_client",
    "set_default_active_thread_percentage",
    "set_active_thread_percentage",
    "set_default_device_pinned_mem_limit",
    "set_device_pinned_mem_limit",
    "sm_partition",
];

/// Is `command` one of [`CHANGING_COMMANDS`], or a state-changing v3
/// command ([`mps_v3::is_changing`])?
pub fn is_changing(command: &str) -> bool {
    command
        .split_whitespace()
        .next()
        .is_some_and(|verb| CHANGING_COMMANDS.contains(&verb))
        || mps_v3::is_changing(command)
}

/// The pipe directory of GPU `gpu`'s daemon (what clients get as
/// CUDA_MPS_PIPE_DIRECTORY).
pub fn pipe_dir(config: &Config, gpu: u32) -> PathBuf {
    config.paths.mps_pipe_root.as_path().join(gpu.to_string())
}

/// Creates `dir` (and parents) root-owned, mode 0755, refusing a symlink.
fn create_private_dir(dir: &Path) -> Result<(), MpsError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let err = |source| MpsError::Dir {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(err)?;
    let meta = std::fs::symlink_metadata(dir).map_err(err)?;
    if !meta.is_dir() || meta.uid() != euid() {
        return Err(err(std::io::Error::other(
            "not a directory owned by this user",
        )));
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn cc(major: u32, minor: u32) -> ComputeCapability {
        ComputeCapability { major, minor }
    }

    const UUID: &str = "GPU-51a0c0de-0000-4000-8000-000001000003";

    fn facts(major: u32, minor: u32) -> DeviceFacts {
        DeviceFacts {
            cc: Some(cc(major, minor)),
            uuid: Some(UUID.into()),
        }
    }

    /// The control daemon of driver 580 (binary 13000), as seen on an
    /// H200: a flag it lacks gets `Unrecognized option`, its help and exit
    /// status 0, and no daemon. muxflow must see that nothing started and
    /// fall back; the daemon and its clients name the GPU by UUID.
    #[test]
    fn a_flag_the_daemon_prints_help_for_is_refused_though_it_exits_0() {
        for (uuid, want_daemon, want_client) in [
            (Some(UUID), UUID, UUID),
            // No UUID from NVML: the index for the daemon, 0 for its clients.
            (None, "3", "0"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = fake_control(dir.path(), false);
            let control = dir.path().join("nvidia-cuda-mps-control");
            let script = r#"#!/bin/sh
if [ "$1" = -d ]; then
  for a in "$@"; do
    case "$a" in -d|-multiuser-server) ;; *)
      echo "Unrecognized option: $a"; echo "Usage: nvidia-cuda-mps-control [OPTION]"; exit 0;;
    esac
  done
  echo "$* cvd=$CUDA_VISIBLE_DEVICES" >> "$CUDA_MPS_LOG_DIRECTORY/started-with"
  : > "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read line
exit 0
"#;
            crate::test_support::write_executable(&control, script);
            config.paths.mps_control = crate::config::AbsPath::new(&control).unwrap();
            let mps = MpsDaemon::for_gpu(&config, 3).with_protocol(Protocol::V3);
            let r = mps
                .ensure_running(|| DeviceFacts {
                    cc: Some(cc(9, 0)),
                    uuid: uuid.map(String::from),
                })
                .unwrap();
            assert!(r.started && r.mode.is_multiuser(), "{r:?}");
            let started = std::fs::read_to_string(mps.log_dir().join("started-with")).unwrap();
            // `-p 3` printed help: started again as v2, with the flag.
            assert_eq!(started, format!("-d -multiuser-server cvd={want_daemon}\n"));
            assert_eq!(mps.client_device(), want_client);
        }
        // A daemon that never comes up is an error that says what it printed.
        let dir = tempfile::tempdir().unwrap();
        let mut config = fake_control(dir.path(), false);
        let control = dir.path().join("nvidia-cuda-mps-control");
        crate::test_support::write_executable(&control, "#!/bin/sh\necho starting\nexit 0\n");
        config.paths.mps_control = crate::config::AbsPath::new(&control).unwrap();
        config.mps.command_timeout_ms = 200;
        let e = MpsDaemon::for_gpu(&config, 0)
            .ensure_running(|| facts(9, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no control daemon answered") && e.contains("starting"),
            "{e}"
        );
    }

    #[test]
    fn the_daemon_runs_multi_user_only_where_asked_and_supported() {
        let cases = [
            ("H100 asked", true, Some(cc(9, 0)), ServerMode::MultiUser),
            ("V100 asked", true, Some(cc(7, 0)), ServerMode::MultiUser),
            (
                "NVML silent: the daemon's exit decides",
                true,
                None,
                ServerMode::MultiUser,
            ),
            (
                "P100 is pre-Volta",
                true,
                Some(cc(6, 0)),
                ServerMode::SingleUser(SingleUser::GpuTooOld(cc(6, 0))),
            ),
            (
                "Orin is Tegra",
                true,
                Some(cc(8, 7)),
                ServerMode::SingleUser(SingleUser::Tegra(cc(8, 7))),
            ),
            (
                "the admin said no",
                false,
                Some(cc(9, 0)),
                ServerMode::SingleUser(SingleUser::Config),
            ),
        ];
        for (name, asked, gpu, want) in cases {
            assert_eq!(ServerMode::plan(asked, gpu), want, "{name}");
        }
    }

    /// A control program that answers like NVIDIA's (`get_server_list`
    /// from stdin) and, started with `-d`, "runs" (its socket appears) —
    /// except with the multi-user flag when `refuse` is set, where it
    /// writes a control-log line and exits 1.
    fn fake_control(dir: &Path, refuse: bool) -> Config {
        let control = dir.join("nvidia-cuda-mps-control");
        let script = format!(
            r#"#!/bin/sh
if [ "$1" = -d ]; then
  if [ "$2" = {MULTIUSER_FLAG} ] && [ {refuse} = true ]; then
    echo "[fake] multi-user server mode not supported on this device" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
    exit 1
  fi
  echo "$*" >> "$CUDA_MPS_LOG_DIRECTORY/started-with"
  : > "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read line
exit 0
"#
        );
        crate::test_support::write_executable(&control, &script);
        let mut config = Config::default();
        config.paths.mps_control = crate::config::AbsPath::new(&control).unwrap();
        config.paths.mps_pipe_root = crate::config::AbsPath::new(dir.join("pipe")).unwrap();
        config.paths.mps_log_root = crate::config::AbsPath::new(dir.join("log")).unwrap();
        config
    }

    #[test]
    fn a_daemon_that_refuses_the_flag_runs_without_it_and_says_so() {
        for (refuse, want_args, want_multi) in
            [(false, "-d -multiuser-server", true), (true, "-d", false)]
        {
            let dir = tempfile::tempdir().unwrap();
            let config = fake_control(dir.path(), refuse);
            let mps = MpsDaemon::for_gpu(&config, 0);
            assert_eq!(mps.serves_all_users(), None, "nothing started yet");
            let r = mps.ensure_running(|| facts(9, 0)).unwrap();
            assert!(r.started);
            assert_eq!(r.mode.is_multiuser(), want_multi, "refuse={refuse}");
            if let ServerMode::SingleUser(SingleUser::Refused(said)) = &r.mode {
                assert!(said.contains("not supported on this device"), "{said}");
            }
            let started = std::fs::read_to_string(mps.log_dir().join("started-with")).unwrap();
            assert_eq!(started.trim(), want_args);
            // Remembered for what the node publishes.
            assert_eq!(mps.serves_all_users(), Some(want_multi));
            assert_eq!(mps.published_mode(None), want_multi);
            // Found running next time: nothing started again.
            assert!(!mps.ensure_running(DeviceFacts::default).unwrap().started);
        }
    }

    /// A v3 daemon as the Prolog starts it: `-d -p 3 -m`, then muxflow's
    /// server; one that refuses the server is started again as v2. Every
    /// command it is sent is logged (`sent`).
    #[test]
    fn a_v3_daemon_gets_muxflows_server_or_falls_back_to_v2() {
        for (refuse_server, refuse_v3) in [(false, false), (true, false), (false, true)] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = fake_control(dir.path(), false);
            let control = dir.path().join("nvidia-cuda-mps-control");
            let script = format!(
                r#"#!/bin/sh
if [ "$1" = -d ]; then
  [ "$2" = -p ] && [ {refuse_v3} = true ] && exit 2
  echo "$*" >> "$CUDA_MPS_LOG_DIRECTORY/started-with"
  : > "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read line
echo "$line" >> "$CUDA_MPS_LOG_DIRECTORY/sent"
case "$line" in "server create"*) [ {refuse_server} = true ] && exit 1;; esac
exit 0
"#
            );
            crate::test_support::write_executable(&control, &script);
            config.paths.mps_control = crate::config::AbsPath::new(&control).unwrap();
            let mps = MpsDaemon::for_gpu(&config, 0).with_protocol(Protocol::V3);
            let r = mps.ensure_running(|| facts(9, 0)).unwrap();
            assert!(r.started && r.mode.is_multiuser());
            let started = std::fs::read_to_string(mps.log_dir().join("started-with")).unwrap();
            let sent = std::fs::read_to_string(mps.log_dir().join("sent")).unwrap();
            if refuse_v3 {
                assert_eq!(started, "-d -multiuser-server\n");
                assert!(!sent.contains("server create"), "{sent}");
                continue;
            }
            assert!(sent.contains("server create muxflow"), "{sent}");
            if refuse_server {
                assert_eq!(started, "-d -p 3 -m\n-d -multiuser-server\n");
                assert!(sent.contains("quit"), "{sent}");
            } else {
                assert_eq!(started, "-d -p 3 -m\n");
                // Commands written for v2 go out in v3's grammar.
                mps.terminate_client(4, 7).unwrap();
                let sent = std::fs::read_to_string(mps.log_dir().join("sent")).unwrap();
                assert!(
                    sent.ends_with("client terminate 7 --server-pid=4\n"),
                    "{sent}"
                );
                assert!(mps.take_own_command("client terminate 7 --server-pid=4"));
                assert!(matches!(
                    mps.chunks("GPU-1"),
                    Err(MpsError::Unspoken { .. })
                ));
            }
        }
    }

    /// A namespace command the daemon refuses (here the cgroup binding):
    /// what was made is deleted again and the caller told, so the job
    /// keeps today's limits and nothing is left on the daemon.
    #[test]
    fn a_namespace_the_daemon_refuses_part_of_is_deleted_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = fake_control(dir.path(), false);
        let control = dir.path().join("nvidia-cuda-mps-control");
        let script = r#"#!/bin/sh
read line
echo "$line" >> "$CUDA_MPS_LOG_DIRECTORY/sent"
case "$line" in *--cgroup=*) echo "Unknown option --cgroup"; exit 1;; esac
exit 0
"#;
        crate::test_support::write_executable(&control, script);
        config.paths.mps_control = crate::config::AbsPath::new(&control).unwrap();
        let mps = MpsDaemon::for_gpu(&config, 0).with_protocol(Protocol::V3);
        std::fs::create_dir_all(mps.log_dir()).unwrap();
        let ns =
            mps_v3::Namespace::for_job(9, "/system.slice/slurmstepd.scope/job_9", Some(1024), 30);
        let e = mps.create_namespace(&ns).unwrap_err().to_string();
        assert!(e.contains("Unknown option --cgroup"), "{e}");
        let sent = std::fs::read_to_string(mps.log_dir().join("sent")).unwrap();
        let sent: Vec<&str> = sent.lines().collect();
        assert_eq!(
            sent,
            [
                "namespace create job_9 --server=muxflow",
                "namespace set job_9 --server=muxflow --pinned-memory-limit=1024M --active-thread-percentage=30 --client-priority=1",
                "namespace set job_9 --server=muxflow --cgroup=/system.slice/slurmstepd.scope/job_9",
                "namespace delete job_9 --server=muxflow --force",
                "namespace list",
            ]
        );
    }

    #[test]
    fn a_gpu_too_old_is_never_offered_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let config = fake_control(dir.path(), false);
        let mps = MpsDaemon::for_gpu(&config, 0);
        // Nothing started: published from the plan (the config alone).
        assert!(mps.published_mode(None));
        assert!(!mps.published_mode(Some(cc(6, 1))));
        let r = mps.ensure_running(|| facts(6, 1)).unwrap();
        assert_eq!(
            r.mode,
            ServerMode::SingleUser(SingleUser::GpuTooOld(cc(6, 1)))
        );
        let started = std::fs::read_to_string(mps.log_dir().join("started-with")).unwrap();
        assert_eq!(started.trim(), "-d");
        assert_eq!(mps.serves_all_users(), Some(false));
    }

    #[test]
    fn each_command_muxflow_sent_answers_for_one_log_line_only() {
        let dir = tempfile::tempdir().unwrap();
        let config = fake_control(dir.path(), false);
        let mps = MpsDaemon::for_gpu(&config, 0);
        std::fs::create_dir_all(mps.log_dir()).unwrap();
        mps.send("set_default_active_thread_percentage 100")
            .unwrap();
        mps.send("get_server_list").unwrap();
        // muxflow's own, once; then a user's with the same text is not.
        assert!(mps.take_own_command("set_default_active_thread_percentage 100"));
        assert!(!mps.take_own_command("set_default_active_thread_percentage 100"));
        // Queries are not noted (not state-changing).
        assert!(!mps.take_own_command("get_server_list"));
        assert!(!mps.take_own_command("quit"));
    }

    #[test]
    fn an_old_flag_in_the_config_names_the_fix() {
        let e = Config::parse(
            "[mps]\nmultiuser_flag = \"-M\"\n",
            Path::new("/etc/muxflow.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("mps.multiuser_flag"), "{e}");
        assert!(
            e.contains("-multiuser-server") && e.contains("multiuser = false"),
            "{e}"
        );
    }
}
