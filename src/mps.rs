//! One MPS control daemon per GPU: start, query, evict, stop.
//!
//! Each GPU's daemon has its own pipe and log directory
//! (`<mps_pipe_root>/<gpu>`, `<mps_log_root>/<gpu>`), runs in multi-user
//! server mode so online and offline jobs of different users share one
//! server, and sees only its GPU (CUDA_VISIBLE_DEVICES). Commands go to the
//! daemon through `nvidia-cuda-mps-control` on stdin, with a timeout so a hung
//! daemon cannot hang a Prolog.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{self, RunError};
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
}

/// The MPS control daemon of one GPU.
#[derive(Debug, Clone)]
pub struct MpsDaemon {
    gpu: u32,
    control: PathBuf,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    multiuser_flag: String,
    timeout: Duration,
}

impl MpsDaemon {
    pub fn for_gpu(config: &Config, gpu: u32) -> Self {
        MpsDaemon {
            gpu,
            control: config.paths.mps_control.as_path().to_path_buf(),
            pipe_dir: pipe_dir(config, gpu),
            log_dir: config.paths.mps_log_root.as_path().join(gpu.to_string()),
            multiuser_flag: config.mps.multiuser_flag.clone(),
            timeout: Duration::from_millis(config.mps.command_timeout_ms),
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
            .env("CUDA_VISIBLE_DEVICES", self.gpu.to_string())
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log_dir);
        c
    }

    /// Starts the daemon unless it already runs; returns whether it started it.
    /// Callers serialise this per GPU (the GPU lock of `node_state`).
    pub fn ensure_running(&self) -> Result<bool, MpsError> {
        if self.is_running() {
            return Ok(false);
        }
        for dir in [&self.pipe_dir, &self.log_dir] {
            create_private_dir(dir)?;
        }
        let mut c = self.command();
        c.arg("-d");
        if !self.multiuser_flag.is_empty() {
            c.arg(&self.multiuser_flag);
        }
        let out = process::run(c, None, self.timeout, true)?;
        if !out.success {
            return Err(MpsError::Failed {
                gpu: self.gpu,
                command: "-d".into(),
                output: format!("non-zero exit (log: {})", self.log_dir.display()),
            });
        }
        let start = Instant::now();
        while !self.is_running() {
            if start.elapsed() > self.timeout {
                return Err(MpsError::NotStarted {
                    gpu: self.gpu,
                    timeout: self.timeout,
                    log_dir: self.log_dir.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(true)
    }

    /// Does a daemon answer in this GPU's pipe directory?
    pub fn is_running(&self) -> bool {
        self.pipe_dir.join("control").exists() && self.send("get_server_list").is_ok()
    }

    /// Sends one command and returns the daemon's reply.
    pub fn send(&self, command: &str) -> Result<String, MpsError> {
        if is_changing(command) {
            self.note_own_command(command);
        }
        let out = process::run(self.command(), Some(command), self.timeout, false)?;
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

    /// Did muxflow send this state-changing command (exactly this text)?
    pub fn sent_by_muxflow(&self, command: &str) -> bool {
        std::fs::read_to_string(self.own_commands()).is_ok_and(|t| t.lines().any(|l| l == command))
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
];

/// Is `command` one of [`CHANGING_COMMANDS`]?
pub fn is_changing(command: &str) -> bool {
    command
        .split_whitespace()
        .next()
        .is_some_and(|verb| CHANGING_COMMANDS.contains(&verb))
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
