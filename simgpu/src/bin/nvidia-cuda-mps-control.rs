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

/// The simulation's state directory: `<directory of this program>/../state`,
/// as the fake libraries find theirs; the program's path as it was run
/// (argv[0], absolute from the node programs), not the link's target.
fn sim_state() -> Option<PathBuf> {
    let exe = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::current_exe().ok())?;
    let dir = exe.parent()?.parent()?.join("state");
    dir.is_dir().then_some(dir)
}

/// The devices this daemon may partition: the simulated GPUs whose index is
/// in CUDA_VISIBLE_DEVICES, on every simulated node (the daemon cannot tell
/// which node it serves; clients name a device by UUID, which is unique).
fn visible_devices() -> Vec<mps::Device> {
    let visible: Vec<u32> = std::env::var("CUDA_VISIBLE_DEVICES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let Some(state) = sim_state() else {
        return Vec::new();
    };
    let nodes = muxflow_simgpu::state::all_nodes(&state).unwrap_or_default();
    nodes
        .iter()
        .flat_map(|(_, d)| d.gpus.iter())
        .filter(|g| visible.contains(&g.index))
        .map(|g| mps::Device {
            uuid: g.uuid.clone(),
            sm_count: g.sm_count,
            sm_per_chunk: g.sm_per_chunk,
        })
        .collect()
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
    let static_partitioning = args.iter().any(|a| mps::STATIC_FLAGS.contains(&a.as_str()));
    // `-v` exists only where the simulation was given a version
    // (`simgpu-ctl mps-version`): older daemons printed none off Tegra.
    let version = sim_state().and_then(|s| std::fs::read_to_string(s.join("mps_version")).ok());
    if args.iter().any(|a| a == "-v") {
        if let Some(v) = &version {
            println!("{}", v.trim());
            std::process::exit(0);
        }
    }
    if let Some(bad) = args.iter().find(|a| {
        !matches!(a.as_str(), "-d" | "-f")
            && *a != mps::MULTIUSER_FLAG
            && !(version.is_some() && mps::STATIC_FLAGS.contains(&a.as_str()))
    }) {
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
        let mut d = Daemon::new(pipe, log, multiuser);
        if static_partitioning {
            d = d.with_static_partitions(visible_devices());
        }
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
