//! Fake `nvidia-cuda-mps-control` (see muxflow_simgpu::mps).
//! `-d` starts the daemon; otherwise commands are read from stdin and sent to
//! the daemon of CUDA_MPS_PIPE_DIRECTORY, replies printed.

use muxflow_simgpu::mps::{self, Daemon};
use std::io::BufRead;
use std::path::PathBuf;

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pipe = dir(mps::ENV_PIPE, "/tmp/nvidia-mps");
    let log = dir(mps::ENV_LOG, "/var/log/nvidia-mps");
    let daemon = args.iter().any(|a| a == "-d");
    let foreground = args.iter().any(|a| a == "-f");
    // NVIDIA's one documented spelling; `-M` (passed by some tools, in no
    // NVIDIA document) is refused like any unknown option — a guess at the
    // real daemon's behaviour, which is not documented either way.
    let multiuser = args.iter().any(|a| a == mps::MULTIUSER_FLAG);
    if let Some(bad) = args
        .iter()
        .find(|a| !matches!(a.as_str(), "-d" | "-f") && *a != mps::MULTIUSER_FLAG)
    {
        eprintln!("nvidia-cuda-mps-control: unknown option {bad}");
        std::process::exit(2);
    }
    if daemon || foreground {
        if mps::request(&pipe, "get_server_list").is_ok() {
            eprintln!("An instance of this daemon is already running");
            std::process::exit(1);
        }
        if let Err(e) = std::fs::create_dir_all(&pipe).and_then(|_| std::fs::create_dir_all(&log)) {
            eprintln!("nvidia-cuda-mps-control: {e}");
            std::process::exit(1);
        }
        if daemon {
            // SAFETY: single-threaded here; classic double fork + setsid.
            unsafe {
                match libc::fork() {
                    -1 => std::process::exit(1),
                    0 => {}
                    _ => {
                        // Parent returns once the socket is up, like the real -d.
                        for _ in 0..100 {
                            if mps::socket_path(&pipe).exists() {
                                std::process::exit(0);
                            }
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        std::process::exit(1);
                    }
                }
                libc::setsid();
                if libc::fork() != 0 {
                    libc::_exit(0);
                }
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    libc::dup2(null, 0);
                    libc::dup2(null, 1);
                    libc::dup2(null, 2);
                }
            }
        }
        let d = Daemon::new(pipe, log, multiuser);
        std::process::exit(if d.run().is_ok() { 0 } else { 1 });
    }
    let mut status = 0;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match mps::request(&pipe, line) {
            Ok(reply) => print!("{reply}"),
            Err(e) => {
                eprintln!("Cannot find MPS control daemon process ({e})");
                status = 1;
                break;
            }
        }
    }
    std::process::exit(status);
}
