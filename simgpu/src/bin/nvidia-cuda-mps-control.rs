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

/// The devices this daemon may partition: those its CUDA_VISIBLE_DEVICES
/// names (index or UUID), on every simulated node (the daemon cannot tell
/// which node it serves; clients name a device by UUID, which is unique).
fn visible_devices() -> Vec<mps::Device> {
    let spec = std::env::var(mps::ENV_VISIBLE).ok();
    let Some(state) = sim_state() else {
        return Vec::new();
    };
    let nodes = muxflow_simgpu::state::all_nodes(&state).unwrap_or_default();
    nodes
        .iter()
        .flat_map(|(_, d)| {
            let uuids: Vec<&str> = d.gpus.iter().map(|g| g.uuid.as_str()).collect();
            muxflow_simgpu::visible::resolve(spec.as_deref(), &uuids)
                .into_iter()
                .map(|i| &d.gpus[i])
                .collect::<Vec<_>>()
        })
        .map(|g| mps::Device {
            uuid: g.uuid.clone(),
            sm_count: g.sm_count,
            sm_per_chunk: g.sm_per_chunk,
        })
        .collect()
}

/// The daemon's help, as the 13000 binary lists its options (`-h`, `-d`,
/// `-f`, `-M, --multiuser-server`, `-q`), with the options a newer version
/// of the model has. The wording is the model's.
fn help(has_static: bool, has_v3: bool) -> String {
    let mut h = String::from(
        "Usage: nvidia-cuda-mps-control [OPTION]\n\
         \x20 -h, --help               Display this help\n\
         \x20 -d, --daemon             Start the MPS control daemon in the background\n\
         \x20 -f, --foreground         Start the MPS control daemon in the foreground\n\
         \x20 -M, --multiuser-server   Enable multi-user mode\n\
         \x20 -q, --quiet              Print less\n",
    );
    if has_static {
        h += "  -S, --static-partitioning  Static SM partitioning mode\n";
    }
    if has_v3 {
        h += "  -p <2|3>                 MPS protocol version\n";
    }
    h
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pipe = dir(mps::ENV_PIPE, "/tmp/nvidia-mps");
    let log = dir(mps::ENV_LOG, "/var/log/nvidia-mps");
    let daemon = args.iter().any(|a| a == "-d");
    let foreground = args.iter().any(|a| a == "-f");
    // `-v` and the flags below exist only where the simulation was given a
    // version (`simgpu-ctl mps-version`): older daemons printed none off Tegra.
    let version = sim_state().and_then(|s| std::fs::read_to_string(s.join("mps_version")).ok());
    let version_n: Option<u32> = version.as_deref().and_then(|v| v.trim().parse().ok());
    // `-p 3` (MPS v3) from 13040 on; then `-m` is its multi-user flag.
    let has_v3 = version_n.is_some_and(|v| v >= mps::V3_MIN_VERSION);
    let has_static = version_n.is_some_and(|v| v >= mps::STATIC_MIN_VERSION);
    let v3 = has_v3 && args.windows(2).any(|w| w[0] == "-p" && w[1] == "3");
    let mut rest = args.iter().peekable();
    while let Some(a) = rest.next() {
        let known = matches!(a.as_str(), "-d" | "-f")
            || (version.is_some() && a == "-v")
            || mps::MULTIUSER_FLAGS.contains(&a.as_str())
            || (has_static && mps::STATIC_FLAGS.contains(&a.as_str()))
            || (v3 && mps::V3_MULTIUSER_FLAGS.contains(&a.as_str()))
            || (has_v3 && a == "-p" && rest.next_if(|p| *p == "2" || *p == "3").is_some());
        if !known {
            // As the 13000 binary does (seen on an H200, driver 580): a
            // message and the help on stdout, and exit status 0. Whoever
            // probes a flag must judge by what the daemon then does.
            println!("Unrecognized option: {a}\n{}", help(has_static, has_v3));
            std::process::exit(0);
        }
    }
    if args.iter().any(|a| a == "-v") {
        if let Some(v) = &version {
            println!(
                "CUDA MPS Control for Linux/Unix/QNX. Binary version: {}",
                v.trim()
            );
            std::process::exit(0);
        }
    }
    let multiuser = args
        .iter()
        .any(|a| mps::MULTIUSER_FLAGS.contains(&a.as_str()))
        || (v3
            && args
                .iter()
                .any(|a| mps::V3_MULTIUSER_FLAGS.contains(&a.as_str())));
    let static_partitioning = args.iter().any(|a| mps::STATIC_FLAGS.contains(&a.as_str()));
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
        if v3 {
            d = d.with_v3(version_n.is_some_and(|v| v >= mps::V3_CGROUP_ROUTING_MIN_VERSION));
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
