//! End-to-end: real processes with the built libmuxflow_xcuda.so preloaded
//! over the simulated GPU (fake libcuda.so.1 / libnvidia-ml.so.1 in a temp
//! sim root). Liveness deadlines are generous; no timing assertions.

use muxflow_simgpu::testing::{built, SimRoot};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

struct Sim {
    root: SimRoot,
}

impl Sim {
    fn new() -> Sim {
        let root = SimRoot::new(1);
        std::fs::create_dir_all(root.join("stats")).unwrap();
        Sim { root }
    }
    fn stats(&self) -> PathBuf {
        self.root.join("stats")
    }
    fn health(&self) -> PathBuf {
        self.root.join("health")
    }
    fn cmd(&self, exe: &Path, args: &[&str], preload: bool) -> Command {
        let mut c = self.root.command(exe);
        c.args(args);
        for v in muxflow::xcuda_env::ALL {
            c.env_remove(v);
        }
        if preload {
            c.env("LD_PRELOAD", built("libmuxflow_xcuda.so"))
                .env(muxflow::xcuda_env::STATS_DIR, self.stats())
                .env(
                    muxflow::xcuda_env::NVML_LIBRARY,
                    self.root.lib().join("libnvidia-ml.so.1"),
                );
        }
        c
    }
    fn probe(&self, args: &[&str], preload: bool) -> Command {
        self.cmd(&built("xcuda-probe"), args, preload)
    }
    fn workload(&self, args: &[&str], preload: bool) -> Command {
        self.cmd(&built("muxflow-workload"), args, preload)
    }
    /// Writes health state `state` and checks that `pid` then launches
    /// nothing: its stats file (rewritten every second) postdates the change
    /// after 1.5 s and shows the same count 2.5 s later. Returns that count.
    fn assert_paused_by(&self, state: &str, pid: u32) -> u64 {
        std::fs::write(self.health(), format!("{state}\n")).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let a = self.stats_of(pid).unwrap()["launches"];
        std::thread::sleep(Duration::from_millis(2500));
        let b = self.stats_of(pid).unwrap()["launches"];
        assert_eq!(a, b, "{pid} launched while {state}");
        b
    }
    fn events(&self) -> String {
        std::fs::read_to_string(self.root.join("state/gpus/0/events.log")).unwrap_or_default()
    }
    fn stats_of(&self, pid: u32) -> Option<HashMap<String, u64>> {
        let s = std::fs::read_to_string(self.stats().join(format!("xcuda.{pid}"))).ok()?;
        Some(
            kv(&s)
                .into_iter()
                .map(|(k, v)| (k, v.parse().unwrap()))
                .collect(),
        )
    }
}

fn kv(s: &str) -> HashMap<String, String> {
    s.split_whitespace()
        .filter_map(|x| x.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The first line the child prints on its stdout.
fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    line
}

fn run(mut c: Command) -> (Output, HashMap<String, String>) {
    let o = c.output().unwrap();
    let r = kv(&String::from_utf8_lossy(&o.stdout));
    (o, r)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < end, "process {} did not exit", child.id());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Entry points the probe's `api` scenario resolves, and how many of them are hooked.
const RESOLVED_IN_API: &str = "29";
const HOOKED_IN_API: &str = "22";

#[test]
fn every_way_to_reach_the_driver_lands_on_the_wrappers() {
    let sim = Sim::new();
    for how in [
        "direct",
        "dlsym",
        "dlsym-default",
        "dlvsym",
        "getproc",
        "getproc2",
    ] {
        for pt in [false, true] {
            let mut args = vec![how];
            if pt {
                args.push("--pt");
            }
            args.push("api");
            let mut c = sim.probe(&args, true);
            c.env(muxflow::xcuda_env::MEM_LIMIT_BYTES, (64 * MIB).to_string());
            let (o, r) = run(c);
            let ctx = format!("{how} pt={pt}: {o:?}");
            assert!(o.status.success(), "{ctx}");
            assert_eq!(r["resolved"], RESOLVED_IN_API, "{ctx}");
            assert_eq!(r["in_xcuda"], HOOKED_IN_API, "{ctx}");
            // The exact variant asked for (_v2, _ptsz...) came back.
            assert_eq!(r["wrong_variants"], "", "{ctx}");
            assert_eq!(r["launch_rcs"], "0,0,0,0,0,0,0,0,0", "{ctx}");
            if how == "dlvsym" {
                // Names xCUDA does not hook still resolve, relative to the caller.
                assert_eq!(r["dlvsym_passthrough"], "1", "{ctx}");
            }
        }
    }
}

#[test]
fn without_the_shim_nothing_is_intercepted_or_capped() {
    let sim = Sim::new();
    for how in ["getproc2", "dlvsym"] {
        let (o, r) = run(sim.probe(&[how, "--pt", "api"], false));
        assert!(o.status.success(), "{how}: {o:?}");
        assert_eq!(r["resolved"], RESOLVED_IN_API, "{how}");
        assert_eq!(r["in_xcuda"], "0", "{how}");
        assert_eq!(r["quota_cuMemAlloc"], "0,0,0", "{how}");
        // The fake driver has arrays: without the cap both fit, both go.
        assert_eq!(r["quota_cuMipmappedArrayCreate"], "0,0,0", "{how}");
    }
}

#[test]
fn memory_cap_on_every_allocation_api_with_frees_and_mem_get_info() {
    let sim = Sim::new();
    for (how, pt) in [("direct", false), ("getproc", true), ("dlsym", false)] {
        let mut args = vec![how];
        if pt {
            args.push("--pt");
        }
        args.push("api");
        let mut c = sim.probe(&args, true);
        c.env(muxflow::xcuda_env::MEM_LIMIT_BYTES, (64 * MIB).to_string());
        let (o, r) = run(c);
        assert!(o.status.success(), "{o:?}");
        for api in [
            "cuMemAlloc",
            "cuMemAllocPitch",
            "cuMemAllocManaged",
            "cuMemAllocAsync",
            "cuMemAllocFromPoolAsync",
            "cuMemCreate",
            "cuArrayCreate",
            "cuArray3DCreate",
            "cuMipmappedArrayCreate",
        ] {
            // 48 MiB fits, 48 more is refused with CUDA_ERROR_OUT_OF_MEMORY, the free succeeds.
            assert_eq!(r[&format!("quota_{api}")], "0,2,0", "{how} {api}: {r:?}");
        }
        // Every free gave its quota back: the cap is all free again.
        assert_eq!(r["meminfo_total"], (64 * MIB).to_string());
        assert_eq!(r["meminfo_free"], (64 * MIB).to_string());
    }
}

#[test]
fn concurrent_allocate_free_storm_ends_at_zero() {
    let sim = Sim::new();
    let mut c = sim.probe(&["getproc2", "storm", "300"], true);
    c.env(muxflow::xcuda_env::MEM_LIMIT_BYTES, (64 * MIB).to_string());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let r = kv(&String::from_utf8_lossy(&o.stdout));
    assert!(o.status.success(), "{o:?}");
    // 8 threads holding up to 40 MiB each against 64 MiB: some refusals, counter back at zero.
    assert!(r["storm_ok"].parse::<u64>().unwrap() > 0, "{r:?}");
    assert!(r["storm_oom"].parse::<u64>().unwrap() > 0, "{r:?}");
    assert_eq!(r["meminfo_free"], (64 * MIB).to_string());
    let s = sim.stats_of(pid).expect("stats file written at exit");
    assert!(
        s["peak_bytes"] <= 64 * MIB && s["peak_bytes"] >= 40 * MIB,
        "{s:?}"
    );
    assert_eq!(s["oom"], r["storm_oom"].parse::<u64>().unwrap());
}

#[test]
fn stats_file_counts_launches_and_refusals() {
    let sim = Sim::new();
    let mut c = sim.workload(
        &[
            "offline",
            "--duration",
            "1",
            "--kernels-per-step",
            "5",
            "--alloc-mib",
            "16",
        ],
        true,
    );
    c.env(muxflow::xcuda_env::MEM_LIMIT_BYTES, (64 * MIB).to_string());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let steps: u64 = kv(&String::from_utf8_lossy(&o.stdout))["steps"]
        .parse()
        .unwrap();
    let s = sim.stats_of(pid).expect("stats file");
    assert_eq!(s["launches"], steps * 5, "{s:?}");
    assert_eq!(s["oom"], 0);
    assert_eq!(s["peak_bytes"], 20 * MIB); // weights + one step's activations
    assert!(s.contains_key("delayed") && s.contains_key("delay_us"));
    let names: Vec<String> = std::fs::read_dir(sim.stats())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec![format!("xcuda.{pid}")]);
    // Over the cap: the workload's own allocation is refused and counted.
    let mut c = sim.workload(&["offline", "--duration", "1", "--alloc-mib", "128"], true);
    c.env(muxflow::xcuda_env::MEM_LIMIT_BYTES, (64 * MIB).to_string());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        kv(&String::from_utf8_lossy(&o.stdout))["error"],
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert_eq!(sim.stats_of(pid).unwrap()["oom"], 1);
}

#[test]
fn health_pause_closes_the_gate_and_healthy_reopens_it() {
    let sim = Sim::new();
    std::fs::write(sim.health(), "overloaded\n").unwrap();
    let mut c = sim.workload(
        &["offline", "--duration", "30", "--kernels-per-step", "5"],
        true,
    );
    c.env(muxflow::xcuda_env::HEALTH_FILE, sim.health());
    let mut child = c.spawn().unwrap();
    let pid = child.id();
    // Paused: stats keep coming (every second) with no launch through.
    wait_for("two stats writes while paused", || {
        sim.stats_of(pid).is_some_and(|s| s["delayed"] >= 1)
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(sim.stats_of(pid).unwrap()["launches"], 0);
    std::fs::write(sim.health(), "healthy\n").unwrap();
    wait_for("launches after the pause", || {
        sim.stats_of(pid).is_some_and(|s| s["launches"] > 50)
    });
    // Faulty pauses too.
    sim.assert_paused_by("faulty", pid);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_exit(&mut child, Duration::from_secs(10));
}

#[test]
fn a_child_forked_after_cuinit_gets_its_own_watcher() {
    let sim = Sim::new();
    std::fs::write(sim.health(), "healthy\n").unwrap();
    let mut c = sim.probe(&["getproc2", "fork", "60"], true);
    c.env(muxflow::xcuda_env::HEALTH_FILE, sim.health());
    let mut parent = c.spawn().unwrap();
    let child: u32 = kv(&first_line(&mut parent))["child"].parse().unwrap();
    // Only a watcher running in the child writes the child's stats file
    // while it runs (every second; the parent's writes the parent's).
    wait_for("the child's stats", || {
        sim.stats_of(child).is_some_and(|s| s["launches"] > 50)
    });
    // And only it can pause the child's launches when the GPU turns overloaded.
    let b = sim.assert_paused_by("overloaded", child);
    std::fs::write(sim.health(), "healthy\n").unwrap();
    wait_for("the child's launches after the pause", || {
        sim.stats_of(child).is_some_and(|s| s["launches"] > b)
    });
    // SAFETY: signalling our child's child.
    unsafe { libc::kill(child as i32, libc::SIGTERM) };
    wait_exit(&mut parent, Duration::from_secs(10));
}

#[test]
fn sigterm_in_a_launch_storm_releases_contexts_while_online_keeps_running() {
    let sim = Sim::new();
    let online = sim
        .workload(&["online", "--rate", "100", "--duration", "4"], false)
        .spawn()
        .unwrap();
    let mut offline = sim
        .workload(
            &["offline", "--kernels-per-step", "50", "--kernel-us", "200"],
            true,
        )
        .spawn()
        .unwrap();
    let pid = offline.id();
    wait_for("offline launches", || {
        sim.stats_of(pid).is_some_and(|s| s["launches"] > 100)
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_exit(&mut offline, Duration::from_secs(10));
    let ev = sim.events();
    assert!(ev.contains(&format!("pid={pid} event=released")), "{ev}");
    assert!(!ev.contains(&format!("pid={pid} event=pruned")), "{ev}");
    let out = online.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = kv(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(r["mode"], "online");
    assert!(r["requests"].parse::<u64>().unwrap() > 100, "{r:?}");
    assert!(!r.contains_key("error"));
}

#[test]
fn exit_on_a_driver_error_during_the_graceful_exit_waits_for_the_release() {
    // The application's ungated calls fail once the exit thread has begun
    // releasing the context, and this one exits at its first error. The fake
    // driver's release is slowed so that exit lands mid-release every time:
    // the process must still not go before the release is done.
    let sim = Sim::new();
    let mut c = sim.probe(&["getproc2", "exit-on-error"], true);
    c.env("MUXFLOW_SIM_SLOW_RELEASE_MS", "300");
    let mut child = c.spawn().unwrap();
    let pid = child.id();
    assert_eq!(first_line(&mut child).trim(), "ready");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_exit(&mut child, Duration::from_secs(10));
    let ev = sim.events();
    assert!(ev.contains(&format!("pid={pid} event=released")), "{ev}");
}

#[test]
fn application_handler_still_runs_after_the_graceful_exit() {
    // muxflow-workload has its own SIGINT handler (stop, report, exit 0 path):
    // xCUDA chains to it after releasing the context.
    let sim = Sim::new();
    let mut c = sim.workload(&["online", "--rate", "200"], true);
    c.env(muxflow::xcuda_env::STATS_DIR, sim.stats());
    let child = c.spawn().unwrap();
    let pid = child.id();
    wait_for("attach", || {
        sim.events().contains(&format!("pid={pid} event=attach"))
    });
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    let r = kv(&String::from_utf8_lossy(&o.stdout));
    // The application's handler ran: it printed its report.
    assert_eq!(r.get("mode").map(String::as_str), Some("online"), "{o:?}");
    assert!(sim.events().contains(&format!("pid={pid} event=released")));
}

#[test]
fn bad_setting_is_logged_and_the_cap_still_holds() {
    let sim = Sim::new();
    let mut c = sim.probe(&["getproc", "api"], true);
    c.env(muxflow::xcuda_env::MEM_LIMIT_BYTES, (64 * MIB).to_string())
        .env(muxflow::xcuda_env::UTILIZATION_BRAKE, "lots");
    let (o, r) = run(c);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches(muxflow::xcuda_env::UTILIZATION_BRAKE).count(),
        1,
        "{err}"
    );
    assert_eq!(r["quota_cuMemAlloc"], "0,2,0");
}
