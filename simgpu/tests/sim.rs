//! End-to-end tests of the simulated GPU: real processes, the built fake
//! libraries (found next to this test binary; `cargo test -p muxflow-simgpu`
//! builds them through dev-dependencies), nvml-wrapper pointed at the fake.
//! No tight timing assertions: orderings and generous ratios only.

use muxflow_simgpu::testing::SimRoot;
use nvml_wrapper::Nvml;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

struct Sim {
    root: SimRoot,
}

impl Sim {
    fn new(gpus: u32) -> Sim {
        Sim {
            root: SimRoot::new(gpus),
        }
    }
    fn state(&self) -> PathBuf {
        self.root.state()
    }
    fn nvml_path(&self) -> PathBuf {
        self.root.join("lib/libnvidia-ml.so.1")
    }
    /// Workload command; the state dir is found from the library's location
    /// (<root>/lib/../state), exercising the dladdr rule.
    fn workload(&self, args: &[&str]) -> Command {
        let mut c = self
            .root
            .command(Path::new(env!("CARGO_BIN_EXE_muxflow-workload")));
        c.args(args);
        c
    }
    fn events(&self, gpu: u32) -> String {
        std::fs::read_to_string(self.state().join(format!("gpus/{gpu}/events.log"))).unwrap()
    }
    fn ctl(&self, args: &[&str]) -> String {
        let o = Command::new(env!("CARGO_BIN_EXE_simgpu-ctl"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

fn report(o: &Output) -> std::collections::HashMap<String, String> {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn num(r: &std::collections::HashMap<String, String>, k: &str) -> f64 {
    r.get(k)
        .unwrap_or_else(|| panic!("no {k} in {r:?}"))
        .parse()
        .unwrap()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

fn attached(sim: &Sim, gpu: u32, pid: u32) -> bool {
    sim.events(gpu).contains(&format!("pid={pid} event=attach"))
}

#[test]
fn overlapping_trainers_slow_each_other_down() {
    let sim = Sim::new(1);
    let args = [
        "offline",
        "--duration",
        "2",
        "--kernels-per-step",
        "10",
        "--kernel-us",
        "1000",
    ];
    let alone = sim.workload(&args).output().unwrap();
    assert!(alone.status.success(), "{alone:?}");
    let alone = num(&report(&alone), "steps_per_s");
    let a = sim.workload(&args).spawn().unwrap();
    let b = sim.workload(&args).spawn().unwrap();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (sa, sb) = (
        num(&report(&a), "steps_per_s"),
        num(&report(&b), "steps_per_s"),
    );
    assert!(
        sa < alone * 0.85 && sb < alone * 0.85,
        "alone {alone}, shared {sa} {sb}"
    );
}

#[test]
fn nvml_wrapper_reads_the_model_while_a_workload_runs() {
    let sim = Sim::new(2);
    let path = sim.nvml_path();
    let nvml = Nvml::builder()
        .lib_path(path.as_os_str())
        .init()
        .expect("init fake NVML");
    assert_eq!(nvml.device_count().unwrap(), 2);
    let dev = nvml.device_by_index(0).unwrap();
    assert!(dev.name().unwrap().contains("simulated"));
    assert!(dev.uuid().unwrap().starts_with("GPU-"));
    assert_eq!(dev.index().unwrap(), 0);
    let max = dev
        .max_clock_info(nvml_wrapper::enum_wrappers::device::Clock::SM)
        .unwrap();
    assert_eq!(max, 1980);
    let idle_clock = dev
        .clock_info(nvml_wrapper::enum_wrappers::device::Clock::SM)
        .unwrap();
    assert_eq!(idle_clock, max);
    assert_eq!(dev.utilization_rates().unwrap().gpu, 0);
    assert!(dev.gpm_support().unwrap());

    let child = sim
        .workload(&[
            "offline",
            "--duration",
            "4",
            "--blocks",
            "132",
            "--alloc-mib",
            "512",
        ])
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for("attach", || attached(&sim, 0, pid));
    let s1 = dev.gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let s2 = dev.gpm_sample().unwrap();
    let util = dev.utilization_rates().unwrap().gpu;
    let clock = dev
        .clock_info(nvml_wrapper::enum_wrappers::device::Clock::SM)
        .unwrap();
    let mem = dev.memory_info().unwrap();
    let procs = dev.running_compute_processes().unwrap();
    let gpm = nvml_wrapper::gpm::gpm_metrics_get(
        &nvml,
        &s1,
        &s2,
        &[nvml_wrapper::enums::gpm::GpmMetricId::SmUtil],
    )
    .unwrap();
    let sm_util = gpm[0].as_ref().unwrap().value;
    assert!(util >= 80, "utilization {util}");
    assert!(clock < max, "SM clock {clock} should fall under full load");
    assert!(mem.used >= 512 << 20, "{mem:?}");
    assert!(procs.iter().any(|p| p.pid == pid), "{procs:?}");
    let mps = dev.mps_running_compute_processes().unwrap();
    assert!(mps.is_empty(), "not under MPS: {mps:?}");
    assert!(sm_util > 70.0, "GPM SM util {sm_util}");
    // The other GPU stays idle.
    assert_eq!(
        nvml.device_by_index(1)
            .unwrap()
            .utilization_rates()
            .unwrap()
            .gpu,
        0
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(sim.events(0).contains(&format!("pid={pid} event=released")));
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(dev.utilization_rates().unwrap().gpu, 0);
    assert_eq!(
        dev.clock_info(nvml_wrapper::enum_wrappers::device::Clock::SM)
            .unwrap(),
        max
    );
    assert_eq!(dev.memory_info().unwrap().used, 0);
    let table = sim.ctl(&["table", sim.state().to_str().unwrap()]);
    assert!(table.contains("1980/1980"), "{table}");
}

#[test]
fn sigterm_exits_cleanly_and_releases_the_context() {
    let sim = Sim::new(1);
    let child = sim.workload(&["online", "--rate", "100"]).spawn().unwrap();
    let pid = child.id();
    wait_for("attach", || attached(&sim, 0, pid));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = report(&out);
    assert_eq!(r["mode"], "online");
    assert!(num(&r, "requests") > 0.0 && num(&r, "p99_ms") >= num(&r, "p50_ms"));
    assert!(sim.events(0).contains(&format!("pid={pid} event=released")));
}

#[test]
fn cuda_visible_devices_and_out_of_memory() {
    let sim = Sim::new(2);
    let out = sim
        .workload(&["offline", "--duration", "0.2", "--alloc-mib", "90000"])
        .env("CUDA_VISIBLE_DEVICES", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report(&out)["error"], "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(sim.events(1).contains("event=attach"));
    assert!(!sim.events(0).contains("event=attach"));
}

#[test]
fn faults_sticky_xid_and_lost() {
    let sim = Sim::new(1);
    let st = sim.state();
    let st = st.to_str().unwrap();
    // Sticky error on a running client.
    let child = sim.workload(&["online", "--rate", "100"]).spawn().unwrap();
    let pid = child.id();
    wait_for("attach", || attached(&sim, 0, pid));
    sim.ctl(&[
        "fault",
        st,
        "--gpu",
        "0",
        "sticky",
        "--pid",
        &pid.to_string(),
    ]);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report(&out)["error"], "CUDA_ERROR_ILLEGAL_ADDRESS");

    // Xid event through nvml-wrapper's event API.
    let path = sim.nvml_path();
    let nvml = Nvml::builder().lib_path(path.as_os_str()).init().unwrap();
    let dev = nvml.device_by_index(0).unwrap();
    let set = dev
        .register_events(
            nvml_wrapper::bitmasks::event::EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();
    sim.ctl(&["fault", st, "--gpu", "0", "xid", "48"]);
    let ev = set.wait(5000).unwrap();
    assert!(
        matches!(
            ev.event_data,
            Some(nvml_wrapper::enums::event::XidError::Value(48))
        ),
        "{:?}",
        ev.event_data
    );

    // Lost device: NVML and CUDA both report it.
    sim.ctl(&["fault", st, "--gpu", "0", "lost"]);
    assert!(matches!(
        dev.utilization_rates(),
        Err(nvml_wrapper::error::NvmlError::GpuLost)
    ));
    let out = sim
        .workload(&["online", "--duration", "0.2"])
        .output()
        .unwrap();
    assert_eq!(report(&out)["error"], "CUDA_ERROR_DEVICE_UNAVAILABLE");
    sim.ctl(&["fault", st, "--gpu", "0", "clear"]);
    assert!(dev.utilization_rates().is_ok());
}

struct Mps {
    pipe: PathBuf,
    log: PathBuf,
}

impl Mps {
    fn start(dir: &Path, multiuser: bool) -> Mps {
        let m = Mps {
            pipe: dir.join("pipe"),
            log: dir.join("log"),
        };
        let mut c = Command::new(env!("CARGO_BIN_EXE_nvidia-cuda-mps-control"));
        c.arg("-d")
            .env("CUDA_MPS_PIPE_DIRECTORY", &m.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &m.log);
        if multiuser {
            c.arg("-multiuser-server");
        }
        assert!(c.status().unwrap().success());
        m
    }
    fn cmd(&self, line: &str) -> String {
        use std::io::Write;
        let mut c = Command::new(env!("CARGO_BIN_EXE_nvidia-cuda-mps-control"))
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(c.stdin.take().unwrap(), "{line}").unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log.join(name)).unwrap_or_default()
    }
}

fn mps_client(sim: &Sim, m: &Mps, args: &[&str]) -> Command {
    let mut c = sim.workload(args);
    c.env("CUDA_MPS_PIPE_DIRECTORY", &m.pipe);
    c
}

#[test]
fn mps_fake_limits_terminate_and_logs() {
    let sim = Sim::new(1);
    let m = Mps::start(&sim.root, true);
    assert!(m.log("control.log").contains("multiuser=true"));
    assert_eq!(
        m.cmd("set_default_active_thread_percentage 50").trim(),
        "50.0"
    );
    m.cmd("set_default_device_pinned_mem_limit 0 1G");

    // Pinned memory limit: the server's 1G, tightened by the client to 100M.
    let out = mps_client(
        &sim,
        &m,
        &["offline", "--duration", "0.2", "--alloc-mib", "256"],
    )
    .env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=100M")
    .output()
    .unwrap();
    assert_eq!(report(&out)["error"], "CUDA_ERROR_OUT_OF_MEMORY");

    // A running low-priority client: thread percentage and priority recorded.
    let child = mps_client(&sim, &m, &["offline", "--alloc-mib", "64"])
        .env("CUDA_MPS_CLIENT_PRIORITY", "1")
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for("attach", || attached(&sim, 0, pid));
    assert!(sim.events(0).contains(&format!(
        "pid={pid} event=attach priority=1 thread_pct=50 sm_cap=66"
    )));
    // NVML lists it among the processes with an MPS compute context.
    let nvml = Nvml::builder()
        .lib_path(sim.nvml_path().as_os_str())
        .init()
        .expect("init fake NVML");
    let mps = nvml
        .device_by_index(0)
        .unwrap()
        .mps_running_compute_processes()
        .unwrap();
    assert!(mps.iter().any(|p| p.pid == pid), "{mps:?}");
    let servers = m.cmd("get_server_list");
    let server = servers.lines().next().expect("a server").trim().to_string();
    assert!(m
        .cmd(&format!("get_client_list {server}"))
        .lines()
        .any(|l| l.trim() == pid.to_string()));
    m.cmd(&format!("terminate_client {server} {pid}"));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report(&out)["error"], "CUDA_ERROR_MPS_CLIENT_TERMINATED");
    // Logged like NVIDIA's daemon: the command as typed, its reply.
    let control = m.log("control.log");
    for line in [
        "NEW UI",
        "Cmd:get_server_list",
        &format!("Cmd:terminate_client {server} {pid}"),
        "UI closed",
    ] {
        assert!(control.contains(line), "{line}: {control}");
    }
    let cmds = m.log("commands.log");
    for c in [
        "set_default_active_thread_percentage 50",
        "get_server_list",
        "terminate_client",
    ] {
        assert!(cmds.contains(c), "{cmds}");
    }

    // Fatal fault: the server logs it for every client of the GPU.
    let a = mps_client(&sim, &m, &["online", "--rate", "50"])
        .spawn()
        .unwrap();
    let apid = a.id();
    wait_for("attach", || attached(&sim, 0, apid));
    sim.ctl(&[
        "fault",
        sim.state().to_str().unwrap(),
        "--gpu",
        "0",
        "xid",
        "48",
    ]);
    let out = a.wait_with_output().unwrap();
    assert_eq!(report(&out)["error"], "CUDA_ERROR_LAUNCH_FAILED");
    wait_for("server log", || {
        m.log("server.log")
            .contains("The following clients have a sticky error set")
    });
    assert!(m
        .log("server.log")
        .contains("Server is handling a fatal GPU error."));
    wait_for("recovery", || {
        m.cmd("get_server_list");
        m.log("server.log").contains("recovered")
    });

    m.cmd("quit");
    wait_for("socket removed", || !m.pipe.join("control").exists());
}

#[test]
fn mps_without_multiuser_records_and_serves() {
    let sim = Sim::new(1);
    let m = Mps::start(&sim.root, false);
    assert!(m.log("control.log").contains("multiuser=false"));
    let out = mps_client(&sim, &m, &["online", "--duration", "0.3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(m.log("server.log").contains("New client"));
    assert!(m.log("control.log").contains("Starting new server"));
    m.cmd("quit");
}
