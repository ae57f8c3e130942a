//! End-to-end: real processes with the built libmuxflow_xcuda.so preloaded
//! over the simulated GPU (fake libcuda.so.1 / libnvidia-ml.so.1 in a temp
//! sim root). Liveness deadlines are generous; no timing assertions.

use muxflow_simgpu::testing::{built, SimRoot};
use std::collections::{BTreeSet, HashMap};
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
        for v in muxflow::records::xcuda_env::ALL {
            c.env_remove(v);
        }
        if preload {
            c.env("LD_PRELOAD", built("libmuxflow_xcuda.so"))
                .env(muxflow::records::xcuda_env::STATS_DIR, self.stats())
                .env(
                    muxflow::records::xcuda_env::NVML_LIBRARY,
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
    /// nothing: the gate closes at the watcher's next read of the file,
    /// which a loaded machine can delay past a stats rewrite (every second),
    /// so the count must first hold across a rewrite (within 20 s), then
    /// show the same 2.5 s later. Returns that count.
    fn assert_paused_by(&self, state: &str, pid: u32) -> u64 {
        std::fs::write(self.health(), format!("{state}\n")).unwrap();
        let launches = || self.stats_of(pid).unwrap()["launches"];
        let end = Instant::now() + Duration::from_secs(20);
        let mut a = launches();
        loop {
            std::thread::sleep(Duration::from_millis(1200));
            let now = launches();
            if now == a {
                break;
            }
            assert!(
                Instant::now() < end,
                "{pid} still launching 20 s after {state}"
            );
            a = now;
        }
        std::thread::sleep(Duration::from_millis(2500));
        let b = launches();
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

/// The README's entry-point table: (symbol, action, test that shows it).
fn readme_rows() -> Vec<(String, String, String)> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = text
        .find("<!-- entry-points -->")
        .expect("README table start");
    let end = text
        .find("<!-- /entry-points -->")
        .expect("README table end");
    text[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (
                cells[0].trim_matches('`').to_string(),
                cells[1].to_string(),
                cells[2].to_string(),
            )
        })
        .collect()
}

fn list(r: &HashMap<String, String>, key: &str) -> BTreeSet<String> {
    r.get(key)
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `xcuda-probe HOW [--pt] api` with xCUDA preloaded (64 MiB cap) and
/// returns everything that is not as it must be: an entry point not handed
/// out as the wrapper of its exact variant, a launch not reaching its own
/// variant, a quota not enforced or not given back, launches not counted.
/// Empty: every lookup path landed on the right wrappers.
fn lookup_failures(sim: &Sim, how: &str, pt: bool, env: &[(&str, &str)]) -> Vec<String> {
    let mut args = vec![how];
    if pt {
        args.push("--pt");
    }
    args.push("api");
    let mut c = sim.probe(&args, true);
    c.env(
        muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
        (64 * MIB).to_string(),
    );
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c.spawn().unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let r = kv(&String::from_utf8_lossy(&o.stdout));
    let mut bad = Vec::new();
    if !o.status.success() {
        bad.push(format!(
            "exit {:?}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ));
        return bad;
    }
    let rows = readme_rows();
    let hooked = list(&r, "hooked");
    for s in &hooked {
        match rows.iter().find(|x| &x.0 == s) {
            Some((_, action, _)) if action != "pass" => {}
            _ => bad.push(format!(
                "{s}: handed out as xCUDA's wrapper, but not a hooked row of the README"
            )),
        }
    }
    for s in list(&r, "passed") {
        match rows.iter().find(|x| x.0 == s) {
            Some((_, action, _)) if action != "pass" => bad.push(format!(
                "{s}: the driver's own function came back, not xCUDA's wrapper"
            )),
            _ => {}
        }
    }
    for key in ["wrong_variants", "launch_variant_misses"] {
        if !list(&r, key).is_empty() {
            bad.push(format!("{key}={}", r[key]));
        }
    }
    if list(&r, "launch_rcs").iter().any(|x| x != "0") {
        bad.push(format!("launch_rcs={}", r["launch_rcs"]));
    }
    for (k, v) in &r {
        if let Some(api) = k.strip_prefix("quota_") {
            if v != "0,2,0,0,0" {
                bad.push(format!("{api}: quota results {v} (want 0,2,0,0,0)"));
            }
            if r[&format!("driver_calls_{api}")] != "2" {
                bad.push(format!(
                    "{api}: {} calls reached the driver (want 2)",
                    r[&format!("driver_calls_{api}")]
                ));
            }
        }
    }
    // Every gated call was counted (the stats file is written at exit).
    let launches = sim.stats_of(pid).map(|s| s["launches"]);
    if launches != r.get("gated_calls").and_then(|n| n.parse().ok()) {
        bad.push(format!(
            "launches counted {launches:?}, gated calls {:?}",
            r.get("gated_calls")
        ));
    }
    bad
}

const HOWS: [&str; 7] = [
    "direct",
    "dlsym",
    "dlsym-deepbind",
    "dlsym-default",
    "dlvsym",
    "getproc",
    "getproc2",
];

#[test]
fn every_way_to_reach_the_driver_lands_on_the_wrappers() {
    let sim = Sim::new();
    for how in HOWS {
        for pt in [false, true] {
            let bad = lookup_failures(&sim, how, pt, &[]);
            assert!(bad.is_empty(), "{how} pt={pt}: {bad:#?}");
        }
    }
    // Names xCUDA does not hook still resolve through dlvsym, relative to the caller.
    let (o, r) = run(sim.probe(&["dlvsym", "api"], true));
    assert!(o.status.success(), "{o:?}");
    assert_eq!(r["dlvsym_passthrough"], "1");
}

#[test]
fn a_deliberately_broken_hook_is_caught() {
    // xCUDA's test-only switch hands out the driver's own function for one
    // variant: the self-bound fake returns its own address, so every lookup
    // path but the exported symbol must notice, by name and by effect.
    let sim = Sim::new();
    for (how, pt, broken) in [
        ("getproc2", true, "cuMemAllocAsync_ptsz"),
        ("getproc", true, "cuLaunchKernel_ptsz"),
        ("getproc2", false, "cuMemAlloc"),
        ("dlsym-deepbind", true, "cuGraphLaunch_ptsz"),
        ("dlvsym", false, "cuMemCreate"),
    ] {
        let bad = lookup_failures(&sim, how, pt, &[("MUXFLOW_XCUDA_TEST_UNHOOK", broken)]);
        assert!(
            bad.iter()
                .any(|b| b.starts_with(&format!("{broken}: the driver's own function"))),
            "{how} {broken} not caught: {bad:#?}"
        );
        assert!(
            bad.len() >= 2,
            "{how} {broken}: the effect must show too: {bad:#?}"
        );
    }
    // The switch is ignored where the environment is not trusted (a user
    // outside a job): covered by runtime's Source; here, an unknown name
    // changes nothing.
    let bad = lookup_failures(
        &sim,
        "getproc2",
        true,
        &[("MUXFLOW_XCUDA_TEST_UNHOOK", "cuNoSuchThing")],
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn every_entry_point_row_is_documented_and_tested() {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload.rs"))
            .unwrap();
    let rows = readme_rows();
    assert!(rows.len() > 60, "{rows:?}");
    let names: Vec<&String> = rows.iter().map(|r| &r.0).collect();
    for (sym, action, test) in &rows {
        assert!(
            [
                "init", "lookup", "count", "free", "cap", "gate", "context", "sync", "graph",
                "pass",
            ]
            .contains(&action.as_str()),
            "{sym}: unknown action {action}"
        );
        assert!(
            src.contains(&format!("fn {test}()")),
            "{sym}: no test {test}"
        );
        assert_eq!(
            names.iter().filter(|n| **n == sym).count(),
            1,
            "{sym} listed twice"
        );
    }
    // The README agrees with the one entry-point list: every hooked entry
    // point has its row with its action, and every row is in the list.
    let class = |a: &str| match a {
        "count" | "pitch" | "array" | "stream_alloc" => "count".to_string(),
        "stream_free" => "free".to_string(),
        "graph_launch" => "gate".to_string(),
        "graph_alloc" | "graph_free" | "capture_begin" | "capture_begin_to" | "capture_end"
        | "instantiate" | "exec_update" | "exec_destroyed" | "graph_destroyed" | "trim" => {
            "graph".to_string()
        }
        "retained" | "released" | "reset" | "created" | "destroyed" => "context".to_string(),
        x => x.to_string(),
    };
    for e in muxflow_xcuda::abi::ENTRY_POINTS {
        match rows.iter().find(|r| r.0 == e.symbol) {
            Some(r) => assert_eq!(r.1, class(e.action), "{}: README vs abi.rs", e.symbol),
            None => assert_eq!(
                e.action, "pass",
                "{} is hooked but has no README row",
                e.symbol
            ),
        }
    }
    for (sym, ..) in &rows {
        assert!(
            muxflow_xcuda::abi::ENTRY_POINTS
                .iter()
                .any(|e| e.symbol == sym),
            "{sym}: a README row not in the list"
        );
    }
    // Every hook xCUDA exports has a hooked row, and no pass row is exported.
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(built("libmuxflow_xcuda.so"))
        .output()
        .unwrap();
    // Columns: Num Value Size Type Bind Vis Ndx Name; defined = Ndx not UND.
    let exported: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.len() >= 8 && c[3] == "FUNC" && c[6] != "UND" && c[7].starts_with("cu"))
        .map(|c| c[7].split('@').next().unwrap_or(c[7]).to_string())
        .collect();
    let hooked: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.1 != "pass")
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(
        exported, hooked,
        "xCUDA's exports vs the README's hooked rows"
    );
}

#[test]
fn without_the_shim_nothing_is_intercepted_or_capped() {
    let sim = Sim::new();
    for how in ["getproc2", "dlvsym"] {
        let (o, r) = run(sim.probe(&[how, "--pt", "api"], false));
        assert!(o.status.success(), "{how}: {o:?}");
        assert_eq!(r["in_xcuda"], "0", "{how}");
        assert_eq!(r["quota_cuMemAlloc_v2"], "0,0,0,0,0", "{how}");
        assert_eq!(r["driver_calls_cuMemAlloc_v2"], "3", "{how}");
        // The fake driver has arrays: without the cap both fit, both go.
        assert_eq!(r["quota_cuMipmappedArrayCreate"], "0,0,0,0,0", "{how}");
    }
}

#[test]
fn memory_rows_count_refuse_and_give_back() {
    let sim = Sim::new();
    for (how, pt) in [
        ("direct", false),
        ("getproc", true),
        ("dlsym", false),
        ("getproc2", false),
    ] {
        let mut args = vec![how];
        if pt {
            args.push("--pt");
        }
        args.push("api");
        let mut c = sim.probe(&args, true);
        c.env(
            muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
            (64 * MIB).to_string(),
        );
        let (o, r) = run(c);
        assert!(o.status.success(), "{o:?}");
        for (row, result) in [
            // 48 MiB fits, 48 more is refused (2), the free succeeds, 48 fits again, freed.
            ("quota_cuMemAlloc", "0,2,0,0,0"),
            ("quota_cuMemAlloc_v2", "0,2,0,0,0"),
            ("quota_cuMemAllocPitch", "0,2,0,0,0"),
            ("quota_cuMemAllocPitch_v2", "0,2,0,0,0"),
            ("quota_cuMemAllocManaged", "0,2,0,0,0"),
            ("quota_cuMemAllocAsync", "0,2,0,0,0"),
            ("quota_cuMemAllocFromPoolAsync", "0,2,0,0,0"),
            ("quota_cuMemCreate", "0,2,0,0,0"),
            // Graph memory: a graph allocating 48 MiB and freeing it itself
            // is charged at instantiation (each entry point, and each way
            // to record it by stream capture); destroy + trim gives it back.
            ("quota_cuGraphInstantiate", "0,2,0,0,0"),
            ("quota_cuGraphInstantiate_v2", "0,2,0,0,0"),
            ("quota_cuGraphInstantiateWithFlags", "0,2,0,0,0"),
            ("quota_cuGraphInstantiateWithParams", "0,2,0,0,0"),
            // CUDA 12's cuGraphInstantiate: answered with ...WithFlags.
            ("quota_cuGraphInstantiate_12", "0,2,0,0,0"),
            ("quota_capture_cuStreamBeginCapture", "0,2,0,0,0"),
            ("quota_capture_cuStreamBeginCapture_v2", "0,2,0,0,0"),
            ("quota_capture_cuStreamBeginCaptureToGraph", "0,2,0,0,0"),
            ("quota_cuArrayCreate", "0,2,0,0,0"),
            ("quota_cuArrayCreate_v2", "0,2,0,0,0"),
            ("quota_cuArray3DCreate", "0,2,0,0,0"),
            ("quota_cuArray3DCreate_v2", "0,2,0,0,0"),
            ("quota_cuMipmappedArrayCreate", "0,2,0,0,0"),
            // VMM: create, reserve, map, set access pass; a second create is
            // refused; unmap, release, free the range; a create fits again.
            ("vmm", "0,0,0,0,2,0,0,0,0,0"),
            // Pinned host memory is not the GPU's: 3 x 48 MiB over a 64 MiB cap, all fine.
            ("host_cuMemAllocHost", "0,0,0,0,0,0"),
            ("host_cuMemAllocHost_v2", "0,0,0,0,0,0"),
            ("host_cuMemHostAlloc", "0,0,0,0,0,0"),
            // Contexts made with v1..v4 and destroyed with v1 and v2.
            ("ctx_rcs", "0,0,0,0,0,0,0,0"),
            // The cap is the total, and all of it is free again at the end.
            ("meminfo_total", "67108864"),
            ("meminfo_free", "67108864"),
            ("meminfo_v1_total", "67108864"),
            ("meminfo_v1_free", "67108864"),
        ] {
            assert_eq!(
                r.get(row).map(String::as_str),
                Some(result),
                "{how} pt={pt} {row}: {r:?}"
            );
        }
        for (k, v) in &r {
            if k.starts_with("driver_calls_") {
                // The refused allocation never reached the driver.
                assert_eq!(v, "2", "{how} {k}");
            }
        }
    }
}

#[test]
fn gate_rows_are_held_while_overloaded() {
    let sim = Sim::new();
    std::fs::write(sim.health(), "healthy\n").unwrap();
    let mut names = BTreeSet::new();
    for pt in [false, true] {
        let mut args = vec!["getproc2"];
        if pt {
            args.push("--pt");
        }
        args.push("api");
        let (o, r) = run(sim.probe(&args, false));
        assert!(o.status.success(), "{o:?}");
        names.extend(list(&r, "gated").into_iter().map(|n| (pt, n)));
    }
    assert_eq!(names.len(), 18, "{names:?}");
    // One process per gated call, set up on a healthy GPU; the GPU turns
    // overloaded, then each makes its call.
    let mut running: Vec<(String, Child, std::sync::mpsc::Receiver<String>)> = names
        .iter()
        .map(|(pt, name)| {
            let mut args = vec!["getproc2"];
            if *pt {
                args.push("--pt");
            }
            args.extend(["gate", name.as_str()]);
            let mut c = sim.probe(&args, true);
            c.env(muxflow::records::xcuda_env::HEALTH_FILE, sim.health())
                .stdin(std::process::Stdio::piped());
            let mut child = c.spawn().unwrap();
            let out = child.stdout.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for l in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok)
                {
                    let _ = tx.send(l);
                }
            });
            (name.clone(), child, rx)
        })
        .collect();
    for (name, _, rx) in &running {
        let l = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(l, "ready", "{name}");
    }
    std::fs::write(sim.health(), "overloaded\n").unwrap();
    // The watchers read the health file every sample (20 ms): 50 samples.
    std::thread::sleep(Duration::from_millis(1000));
    for (_, child, _) in &mut running {
        use std::io::Write;
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    for (name, _, rx) in &running {
        assert!(
            rx.try_recv().is_err(),
            "{name} launched while the GPU was overloaded"
        );
    }
    std::fs::write(sim.health(), "healthy\n").unwrap();
    for (name, child, rx) in &mut running {
        let l = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(l, "launched rc=0", "{name}");
        assert!(
            wait_exit(child, Duration::from_secs(10)).success(),
            "{name}"
        );
    }
}

#[test]
fn context_rows_are_released_on_sigterm() {
    use std::os::unix::process::ExitStatusExt;
    let sim = Sim::new();
    for symbol in [
        "cuDevicePrimaryCtxRetain",
        "cuCtxCreate",
        "cuCtxCreate_v2",
        "cuCtxCreate_v3",
        "cuCtxCreate_v4",
        "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxReset",
        "cuDevicePrimaryCtxReset_v2",
    ] {
        let child = sim
            .probe(&["getproc2", "ctx", symbol], true)
            .spawn()
            .unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        let r = kv(&String::from_utf8_lossy(&o.stdout));
        assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{symbol}: {o:?}");
        assert!(list(&r, "hooked").contains(symbol), "{symbol}: {r:?}");
        assert_eq!(
            r["driver_calls"], "1",
            "{symbol}: reached its own variant once"
        );
        // The graceful exit released the context this variant made (xCUDA
        // recorded it): the driver logged the process's release.
        let ev = sim.events();
        let last = ev
            .lines()
            .rev()
            .find(|l| l.contains(&format!("pid={pid} ")))
            .unwrap_or("");
        assert!(last.ends_with("event=released"), "{symbol}: {ev}");
    }
}

#[test]
fn concurrent_allocate_free_storm_ends_at_zero() {
    let sim = Sim::new();
    let mut c = sim.probe(&["getproc2", "storm", "300"], true);
    c.env(
        muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
        (64 * MIB).to_string(),
    );
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
    c.env(
        muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
        (64 * MIB).to_string(),
    );
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
    c.env(
        muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
        (64 * MIB).to_string(),
    );
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
    c.env(muxflow::records::xcuda_env::HEALTH_FILE, sim.health());
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
    c.env(muxflow::records::xcuda_env::HEALTH_FILE, sim.health());
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
    c.env(muxflow::records::xcuda_env::STATS_DIR, sim.stats());
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
    c.env(
        muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
        (64 * MIB).to_string(),
    )
    .env(muxflow::records::xcuda_env::UTILIZATION_BRAKE, "lots");
    let (o, r) = run(c);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches(muxflow::records::xcuda_env::UTILIZATION_BRAKE)
            .count(),
        1,
        "{err}"
    );
    assert_eq!(r["quota_cuMemAlloc_v2"], "0,2,0,0,0");
}

#[test]
fn sigterm_right_after_the_application_installs_its_handler_releases_first() {
    // The application installs its SIGTERM handler right after cuInit and
    // the signal comes at once, 100 times: the context is released every
    // time before the application's handler runs (its allocation finds the
    // context gone: CUDA_ERROR_INVALID_CONTEXT), and the handler gets the
    // sender's siginfo.
    let sim = Sim::new();
    let runs: Vec<usize> = (0..100).collect();
    for batch in runs.chunks(4) {
        let children: Vec<(usize, Child)> = batch
            .iter()
            .map(|&i| {
                let mode = match i % 10 {
                    9 => "signal",
                    8 => "sysv",
                    _ => "handler",
                };
                (
                    i,
                    sim.probe(&["getproc2", "signals", mode], true)
                        .spawn()
                        .unwrap(),
                )
            })
            .collect();
        for (i, child) in children {
            let pid = child.id();
            let o = child.wait_with_output().unwrap();
            let r = kv(&String::from_utf8_lossy(&o.stdout));
            assert_eq!(
                o.status.code(),
                Some(7),
                "run {i}: the application's handler did not end it: {o:?}"
            );
            assert_eq!(
                r["alloc_rc"], "201",
                "run {i}: the context was not released first: {r:?}"
            );
            if i % 10 < 8 {
                assert_eq!(
                    r["si_pid"],
                    pid.to_string(),
                    "run {i}: siginfo not the sender's"
                );
            }
            let ev = sim.events();
            assert!(
                ev.contains(&format!("pid={pid} event=released")),
                "run {i}: {ev}"
            );
        }
    }
}

#[test]
fn the_application_handler_gets_the_real_senders_siginfo() {
    let sim = Sim::new();
    let mut child = sim
        .probe(&["getproc2", "signals", "external"], true)
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let r = kv(&line);
    assert_eq!(r["alloc_rc"], "201", "{line}");
    assert_eq!(r["si_pid"], std::process::id().to_string(), "{line}");
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)).code(),
        Some(7)
    );
}

#[test]
fn sig_ign_sa_resethand_and_blocked_signals_are_respected() {
    use std::os::unix::process::ExitStatusExt;
    let sim = Sim::new();
    for (mode, want, exit_signal, released) in [
        // SIGTERM ignored: released all the same (Slurm's SIGKILL follows),
        // the process goes on, its launches refused (4), SIGTERM still ignored.
        ("ignore", "ignored launch_rc=4 still_ignored=1", None, true),
        // SA_RESETHAND: the handler ran once and the disposition is the
        // default again: the second SIGTERM kills the process.
        ("resethand", "handled=1 reset=1", Some(libc::SIGTERM), true),
        // SIGINT ignored: nothing happens, launches go on.
        ("sigint-ignored", "sigint_ignored launch_rc=0", None, false),
        // SIGTERM blocked by the application: released, and the signal is
        // left pending for the application.
        ("blocked", "blocked launch_rc=4 pending=1", None, true),
    ] {
        let child = sim
            .probe(&["getproc2", "signals", mode], true)
            .spawn()
            .unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            want,
            "{mode}: {o:?}"
        );
        match exit_signal {
            Some(s) => assert_eq!(o.status.signal(), Some(s), "{mode}: {o:?}"),
            None => assert!(o.status.success(), "{mode}: {o:?}"),
        }
        let ev = sim.events();
        assert_eq!(
            ev.contains(&format!("pid={pid} event=released")),
            released,
            "{mode}: {ev}"
        );
    }
}

#[test]
fn a_forked_child_counts_from_zero_and_the_sums_are_what_happened() {
    // Parent and child each allocate 48 MiB, are refused 48 more, and
    // launch (3 + 2 in the parent, 5 in the child): summed over their stats
    // files, as the plugin sums a job's, the figures are exactly that.
    let sim = Sim::new();
    let mut c = sim.probe(&["getproc2", "fork-quota"], true);
    c.env(
        muxflow::records::xcuda_env::MEM_LIMIT_BYTES,
        (64 * MIB).to_string(),
    );
    let child = c.spawn().unwrap();
    let parent = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    let r = kv(&out.replace('\n', " "));
    assert_eq!(r["child_status"], "0", "{out}");
    assert_eq!(r["parent_allocs"], "0,2", "{out}");
    assert_eq!(
        r["child_allocs"], "0,2",
        "the child's quota is its own: {out}"
    );
    let kid: u32 = r["child"].parse().unwrap();
    let (p, k) = (sim.stats_of(parent).unwrap(), sim.stats_of(kid).unwrap());
    assert_eq!(p["launches"] + k["launches"], 10, "{p:?} {k:?}");
    assert_eq!(k["launches"], 5, "{k:?}");
    assert_eq!(p["oom"] + k["oom"], 2, "{p:?} {k:?}");
    assert_eq!((p["peak_bytes"], k["peak_bytes"]), (48 * MIB, 48 * MIB));
}

/// Two offline jobs on one GPU ([policy] offline_per_gpu = 2) under one
/// brake: root lists both as the GPU's offline processes (the file
/// muxflow-police writes beside the health word), so they do not brake for
/// each other; an online process on the GPU brakes both, and both resume
/// when it leaves. A list a user could have written (not root's) counts
/// for nothing: they brake for each other again. The health pause holds
/// both.
#[test]
fn two_offline_jobs_brake_together_for_the_online_job_and_never_for_each_other() {
    use muxflow::node::offline_procs::{self, ProcId};
    let sim = Sim::new();
    std::fs::write(sim.health(), "healthy\n").unwrap();
    let listed = offline_procs::beside(&sim.health());
    let offline: Vec<Child> = (0..2)
        .map(|_| {
            let mut c = sim.workload(
                &[
                    "offline",
                    "--duration",
                    "60",
                    "--kernels-per-step",
                    "20",
                    "--kernel-us",
                    "500",
                ],
                true,
            );
            c.env(muxflow::records::xcuda_env::HEALTH_FILE, sim.health());
            c.spawn().unwrap()
        })
        .collect();
    let pids: Vec<u32> = offline.iter().map(Child::id).collect();
    let procfs = muxflow::node::jobproc::Procfs::default();
    let list: std::collections::BTreeSet<ProcId> = pids
        .iter()
        .map(|&p| ProcId::of(&procfs, p).unwrap())
        .collect();
    muxflow::node::state::write_atomic(&listed, offline_procs::encode(&list).as_bytes()).unwrap();
    for &pid in &pids {
        wait_for("offline launches", || {
            sim.stats_of(pid).is_some_and(|s| s["launches"] > 50)
        });
    }
    // Delayed launches of both over a window of `secs` (stats files are
    // rewritten every second), after `settle` seconds for the brake to move.
    let delayed_in = |settle: u64, secs: u64| -> Vec<u64> {
        std::thread::sleep(Duration::from_secs(settle));
        let before: Vec<u64> = pids
            .iter()
            .map(|&p| sim.stats_of(p).unwrap()["delayed"])
            .collect();
        std::thread::sleep(Duration::from_secs(secs));
        pids.iter()
            .zip(before)
            .map(|(&p, b)| sim.stats_of(p).unwrap()["delayed"] - b)
            .collect()
    };
    let launches = |p: u32| sim.stats_of(p).unwrap()["launches"];

    // 1. Both listed, no online job: the saturated GPU is theirs, no brake.
    assert_eq!(delayed_in(2, 2), [0, 0], "braked for each other");

    // 2. The list owned by a user (as if a user wrote it): not trusted, so
    // each counts the other as contention on the saturated GPU.
    std::os::unix::fs::chown(&listed, Some(65534), Some(65534)).unwrap();
    let d = delayed_in(1, 2);
    assert!(
        d.iter().all(|&n| n > 0),
        "a user's list released the brake: {d:?}"
    );
    std::os::unix::fs::chown(&listed, Some(0), Some(0)).unwrap();
    assert_eq!(delayed_in(3, 2), [0, 0], "root's list again: no brake");

    // 3. An online service joins: both brake.
    let mut online = sim
        .workload(&["online", "--rate", "300", "--duration", "60"], false)
        .spawn()
        .unwrap();
    let d = delayed_in(1, 2);
    assert!(
        d.iter().all(|&n| n > 0),
        "not both braked for the online job: {d:?}"
    );

    // 4. It leaves: both resume (no delayed launch, launches go on).
    // SAFETY: signalling our own child.
    unsafe { libc::kill(online.id() as i32, libc::SIGTERM) };
    wait_exit(&mut online, Duration::from_secs(10));
    let before: Vec<u64> = pids.iter().map(|&p| launches(p)).collect();
    assert_eq!(
        delayed_in(3, 2),
        [0, 0],
        "still braked after the online job left"
    );
    for (&p, b) in pids.iter().zip(before) {
        assert!(launches(p) > b, "{p} stopped launching");
    }

    // 5. The health pause holds every offline client of the GPU, and
    // Healthy releases them all.
    std::fs::write(sim.health(), "overloaded\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let held: Vec<u64> = pids.iter().map(|&p| launches(p)).collect();
    std::thread::sleep(Duration::from_millis(2500));
    let still: Vec<u64> = pids.iter().map(|&p| launches(p)).collect();
    assert_eq!(held, still, "an offline client launched while overloaded");
    std::fs::write(sim.health(), "healthy\n").unwrap();
    for (&p, h) in pids.iter().zip(held) {
        wait_for("launches after the pause", || launches(p) > h + 20);
    }
    for mut c in offline {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        wait_exit(&mut c, Duration::from_secs(10));
    }
}

#[test]
fn with_a_stop_deadline_the_handler_runs_with_the_gpu_and_the_release_comes_at_exit() {
    use std::os::unix::process::ExitStatusExt;
    let sim = Sim::new();
    struct Case {
        mode: &'static str,
        /// What the application prints (its "checkpoint" used the GPU).
        want: &'static str,
        exit_code: Option<i32>,
        exit_signal: Option<i32>,
    }
    let cases = [
        Case {
            mode: "checkpoint",
            want: "checkpoint alloc_rc=0",
            exit_code: Some(7),
            exit_signal: None,
        },
        // _exit skips atexit: the interposed _exit releases first.
        Case {
            mode: "checkpoint-_exit",
            want: "checkpoint alloc_rc=0",
            exit_code: Some(7),
            exit_signal: None,
        },
        // The handler resets the default action and raises again: released
        // before the default action ends the process.
        Case {
            mode: "reraise",
            want: "checkpoint alloc_rc=0",
            exit_code: None,
            exit_signal: Some(libc::SIGTERM),
        },
        // A handler that never returns (on xCUDA's exit thread) does not
        // hold the release up: the deadline's own thread releases.
        Case {
            mode: "stuck-handler",
            want: "stuck launch_rc=4 handled=1",
            exit_code: Some(0),
            exit_signal: None,
        },
        // SIG_IGN is respected until the deadline (launches pass after the
        // signal), then the GPU is released and launches are refused.
        Case {
            mode: "ignore-deadline",
            want: "ignored launch_rc=4",
            exit_code: Some(0),
            exit_signal: None,
        },
    ];
    for c in cases {
        let mut cmd = sim.probe(&["getproc2", "signals", c.mode], true);
        cmd.env(muxflow::records::limits::STOP_GRACE_ENV, "2000");
        let child = cmd.spawn().unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.starts_with(c.want), "{}: {o:?}", c.mode);
        assert_eq!(o.status.code(), c.exit_code, "{}: {o:?}", c.mode);
        assert_eq!(o.status.signal(), c.exit_signal, "{}: {o:?}", c.mode);
        if c.mode == "ignore-deadline" {
            let r = kv(&out);
            assert!(
                r["passed_after_signal"].parse::<u64>().unwrap() >= 3,
                "launches passed after the ignored SIGTERM: {r:?}"
            );
            assert_eq!(r["still_ignored"], "1", "{r:?}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("at the stop deadline"), "{err}");
        }
        let ev = sim.events();
        assert!(
            ev.contains(&format!("pid={pid} event=released")),
            "{}: not released: {ev}",
            c.mode
        );
        assert!(
            !ev.contains(&format!("pid={pid} event=pruned")),
            "{}: {ev}",
            c.mode
        );
    }
}

#[test]
fn a_trainer_ignoring_sigterm_is_released_before_a_sigkill_exactly_at_killwait() {
    // Slurm's stop: SIGTERM, then SIGKILL KillWait later whatever the
    // process does. xCUDA's deadline comes from the same KillWait (the
    // plugin writes muxflow::records::limits::stop_grace of it): the trainer,
    // ignoring SIGTERM, trains on until the deadline, is released, and the
    // SIGKILL at exactly KillWait finds no context: the server (here, its
    // other client) is unharmed.
    let sim = Sim::new();
    let kill_wait = Duration::from_secs(4);
    let grace = muxflow::records::limits::stop_grace(kill_wait);
    assert!(grace > Duration::ZERO && grace < kill_wait);
    let online = sim
        .workload(&["online", "--rate", "100", "--duration", "8"], false)
        .spawn()
        .unwrap();
    let progress = sim.root.join("progress");
    let mut c = sim.workload(
        &[
            "offline",
            "--kernels-per-step",
            "50",
            "--kernel-us",
            "200",
            "--ignore-sigterm",
            "--progress",
            progress.to_str().unwrap(),
        ],
        true,
    );
    c.env(
        muxflow::records::limits::STOP_GRACE_ENV,
        grace.as_millis().to_string(),
    )
    .stderr(std::process::Stdio::piped());
    let offline = c.spawn().unwrap();
    let pid = offline.id();
    let step = || {
        std::fs::read_to_string(&progress)
            .ok()
            .and_then(|t| t.trim().strip_prefix("step=")?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_for("training steps", || step() > 10);
    let at_sigterm = step();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    std::thread::sleep(kill_wait);
    let at_sigkill = step();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let o = offline.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // It trained on after the SIGTERM it ignores (the GPU was still its)...
    assert!(
        at_sigkill >= at_sigterm + 10,
        "steps {at_sigterm} at SIGTERM, {at_sigkill} at SIGKILL: {err}"
    );
    // ... was released at the deadline, before the SIGKILL ...
    assert!(err.contains("at the stop deadline"), "{err}");
    let ev = sim.events();
    assert!(ev.contains(&format!("pid={pid} event=released")), "{ev}");
    assert!(!ev.contains(&format!("pid={pid} event=pruned")), "{ev}");
    // ... and the other client of the GPU never saw an error.
    let out = online.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = kv(&String::from_utf8_lossy(&out.stdout));
    assert!(!r.contains_key("error"), "{r:?}");
}
/// Counting mode (online jobs): each stream-synchronize row ends the busy
/// period its launches began, so the online page gets windows; the cap is
/// not applied (1 byte here) and nothing is refused.
#[test]
fn graph_memory_is_held_while_the_driver_may_commit_it() {
    // Quota Q = 64 MiB. A graph that allocates Q/2 and frees it itself
    // commits Q/2 at every launch: xCUDA holds it from instantiation until
    // the executable graph is destroyed and the pool trimmed, so 3Q/4 more
    // never fits beside it (the issue: the process held 5Q/4).
    let sim = Sim::new();
    let (q, half) = ((64 * MIB).to_string(), (32 * MIB).to_string());
    for (how, pt) in [
        ("getproc2", false),
        ("getproc", true),
        ("direct", false),
        ("dlsym", true),
    ] {
        let mut args = vec![how];
        if pt {
            args.push("--pt");
        }
        args.push("graph");
        let mut c = sim.probe(&args, true);
        c.env(muxflow::records::xcuda_env::MEM_LIMIT_BYTES, &q);
        let child = c.spawn().unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        let r = kv(&String::from_utf8_lossy(&o.stdout));
        assert!(o.status.success(), "{how} pt={pt}: {o:?}");
        for (row, want) in [
            // Explicit nodes: instantiated, launched; 3Q/4 refused; launched again.
            ("issue_explicit", "0,0,2,0".to_string()),
            // Exec destroyed: the pool still holds Q/2 (3Q/4 refused); trimmed: fits.
            ("destroy_then_trim", "0,2,0,0".to_string()),
            // With 3Q/4 held, the instantiation itself is refused.
            ("instantiate_over_quota", "2,0".to_string()),
            // Stream capture: nothing counted while recording (all Q free),
            // then the same as explicit nodes.
            ("issue_capture", format!("{q},0,0,2")),
            // Beside an open capture, a stream the driver says is not
            // capturing allocates for real: 3Q/4 counted, Q/2 more refused.
            ("beside_capture", format!("0,{},2,0", 16 * MIB)),
            // Allocated by the graph, freed outside: Q/2 free before and
            // after the free (held once, by the pool), and Q/2 more fits.
            ("freed_outside", format!("0,0,{half},0,{half},0,0")),
            // Updated with a graph of Q: fits (its need replaces Q/4's);
            // then of Q/2: the pool's charge stays at its high water Q until
            // a trim, so Q/2 more is refused.
            ("exec_update", "0,0,0,2".to_string()),
            ("meminfo_free", q.clone()),
        ] {
            assert_eq!(
                r.get(row).map(String::as_str),
                Some(want.as_str()),
                "{how} pt={pt} {row}: {r:?}"
            );
        }
        // By xCUDA's books the process never held more than Q.
        let s = sim.stats_of(pid).expect("stats file written at exit");
        assert!(s["peak_bytes"] <= 64 * MIB, "{how} pt={pt}: {s:?}");
        assert_eq!(s["oom"], 6, "{how} pt={pt}: {s:?}");
    }
}

#[test]
fn sync_rows_end_the_online_busy_period() {
    use muxflow::records::online_page::{decode_busy, Record, BUSY_BYTES, RECORD_BYTES};
    use muxflow::records::xcuda_env::{MEM_LIMIT_BYTES, ONLINE_PAGE, ROLE};
    let sim = Sim::new();
    let cases: &[(&str, &[&str])] = &[
        (
            "cuStreamSynchronize (the service's per-request sync)",
            &[
                "online",
                "--duration",
                "1.5",
                "--rate",
                "200",
                "--kernel-us",
                "100",
            ],
        ),
        (
            "cuCtxSynchronize (what torch.cuda.synchronize() calls)",
            &[
                "online",
                "--duration",
                "1.5",
                "--rate",
                "200",
                "--kernel-us",
                "100",
                "--ctx-sync",
            ],
        ),
        (
            "cuStreamSynchronize_ptsz (per-thread default stream)",
            &[
                "offline",
                "--duration",
                "1.5",
                "--kernels-per-step",
                "2",
                "--kernel-us",
                "200",
                "--alloc-mib",
                "4",
            ],
        ),
    ];
    for (i, (name, args)) in cases.iter().enumerate() {
        let page = sim.root.join(format!("page{i}"));
        std::fs::write(&page, [0u8; RECORD_BYTES]).unwrap();
        let mut c = sim.workload(args, true);
        c.env(ROLE, "online")
            .env(ONLINE_PAGE, &page)
            .env(MEM_LIMIT_BYTES, "1");
        let (o, r) = run(c);
        assert!(o.status.success(), "{name}: {o:?}");
        assert!(!r.contains_key("error"), "{name}: {r:?}");
        let all = std::fs::read(&page).unwrap();
        let bytes: [u8; RECORD_BYTES] = all[..RECORD_BYTES].try_into().unwrap();
        let rec = Record::decode(&bytes).unwrap_or_else(|| panic!("{name}: page never written"));
        // The busy line after the record: written at each transition, idle
        // once the last period ended.
        let line: [u8; BUSY_BYTES] = all[RECORD_BYTES..]
            .try_into()
            .unwrap_or_else(|_| panic!("{name}: no busy line ({} bytes)", all.len()));
        assert_eq!(decode_busy(&line), Some(0), "{name}");
        assert!(rec.launches > 0, "{name}: {rec:?}");
        assert!(
            rec.window_at_ns > 0 && rec.baseline_ns_per_launch > 0.0,
            "{name}: no busy period timed: {rec:?}"
        );
    }
}

/// A trainer of 2 s, 4 kernels of 200 us a step: the page tests' offline job.
const SHORT_TRAINER: &[&str] = &[
    "offline",
    "--duration",
    "2",
    "--kernels-per-step",
    "4",
    "--kernel-us",
    "200",
];

/// An online page's record of a service 50 % slower than its baseline,
/// written at `now` (the `seq`-th write).
fn hurt_record(seq: u64, now: u64) -> muxflow::records::online_page::Record {
    muxflow::records::online_page::Record {
        seq,
        heartbeat_ns: now,
        window_at_ns: now,
        window_ns_per_launch: 1.5e6,
        baseline_ns_per_launch: 1.0e6,
        launches: seq * 10,
    }
}

/// Root's note of the job a page speaks for, as the plugin writes it
/// (`muxflow::records::online_page::create`): this test's own uid owns both.
fn note_page_job(page: &Path) {
    use muxflow::records::online_page::job_note_path;
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    std::fs::write(job_note_path(page), format!("job=1 uid={me}\n")).unwrap();
}

/// The offline gate brakes on the online page with the clock flat and the
/// GPU idle (the clock law sees room), and ignores a page others may write.
#[test]
fn an_offline_gate_brakes_on_a_hurt_online_page_and_not_on_a_forged_one() {
    use muxflow::records::online_page::{now_ns, Record};
    use muxflow::records::xcuda_env::{ONLINE_PAGE, QUEUE_INFLIGHT};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let sim = Sim::new();
    let dir = sim.root.join("online");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, mode, brakes) in [
        ("the online job's page (0644)", 0o644, true),
        (
            "a page anyone may write (0666): forged, ignored",
            0o666,
            false,
        ),
    ] {
        let page = dir.join("0");
        let _ = std::fs::remove_file(&page);
        std::fs::write(&page, Record::default().encode()).unwrap();
        std::fs::set_permissions(&page, std::fs::Permissions::from_mode(mode)).unwrap();
        note_page_job(&page);
        // An online job 50 % slower than its baseline, window after window.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (page, stop) = (page.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seq = 0;
                while !stop.load(Ordering::SeqCst) {
                    seq += 1;
                    let now = now_ns();
                    let r = hurt_record(seq, now);
                    let _ = std::fs::write(&page, r.encode());
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let mut c = sim.workload(SHORT_TRAINER, true);
        // The online trigger's per-launch law (the queue off: with it on,
        // the queue's busy bound replaces that delay).
        c.env(ONLINE_PAGE, &page).env(QUEUE_INFLIGHT, "0");
        let child = c.spawn().unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(o.status.success(), "{name}: {o:?}");
        let s = sim.stats_of(pid).unwrap();
        assert_eq!(s["delayed"] > 0, brakes, "{name}: {s:?}");
    }
}

/// The bounded offline queue: with `queue_inflight` set, an offline job
/// holds its launches while the online page's busy line says a request is
/// being served and the online job is hurt, and runs (bounded, not held)
/// while the line says idle. Without the setting the busy line changes
/// nothing (the queue is off).
#[test]
fn the_offline_queue_holds_launches_while_the_online_job_serves_a_request() {
    use muxflow::records::online_page::{encode_busy, now_ns, Record, BUSY_OFFSET};
    use muxflow::records::xcuda_env::{ONLINE_PAGE, QUEUE_INFLIGHT};
    use std::os::unix::fs::{FileExt, PermissionsExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let sim = Sim::new();
    let dir = sim.root.join("online");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut steps = HashMap::new();
    for (name, queue, busy) in [
        ("queue on, online busy", Some("2"), true),
        ("queue on, online idle", Some("2"), false),
        ("queue off, online busy", None, true),
    ] {
        let page = dir.join("0");
        let _ = std::fs::remove_file(&page);
        std::fs::write(&page, Record::default().encode()).unwrap();
        std::fs::set_permissions(&page, std::fs::Permissions::from_mode(0o644)).unwrap();
        note_page_job(&page);
        // An online job hurt (x1.5 its baseline), serving requests 45 ms of
        // every 50 (busy), or idle throughout.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (page, stop) = (page.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = std::fs::OpenOptions::new().write(true).open(&page).unwrap();
                let (mut seq, t0) = (0, Instant::now());
                while !stop.load(Ordering::SeqCst) {
                    seq += 1;
                    let now = now_ns();
                    let r = hurt_record(seq, now);
                    f.write_all_at(&r.encode(), 0).unwrap();
                    let serving = busy && t0.elapsed().as_millis() % 50 < 45;
                    let since = if serving {
                        now.saturating_sub(1_000_000)
                    } else {
                        0
                    };
                    f.write_all_at(&encode_busy(since), BUSY_OFFSET).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let mut c = sim.workload(SHORT_TRAINER, true);
        c.env(ONLINE_PAGE, &page);
        c.env(QUEUE_INFLIGHT, queue.unwrap_or("0"));
        let (o, r) = run(c);
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(o.status.success(), "{name}: {o:?}");
        steps.insert(name, r["steps"].parse::<u64>().unwrap());
    }
    let s = |n: &str| steps[n];
    // Held while it serves: about a tenth of the steps (its idle tenth).
    assert!(
        s("queue on, online busy") * 4 < s("queue on, online idle"),
        "{steps:?}"
    );
    // Bounded, not held: about the speed the per-launch brake leaves it
    // without the queue (that one brakes on the hurt page too).
    assert!(
        s("queue on, online idle") * 2 > s("queue off, online busy"),
        "{steps:?}"
    );
}

/// Every path graph memory takes (issue: the driver held 578 MiB under a
/// 256 MiB cap while a later allocation that fitted was refused), each in
/// a process of its own under a quota Q = 64 MiB, checked against the
/// simulated driver's own books: the most it ever held is within Q, a
/// graph allocation's frees succeed once (the driver refuses the second:
/// 1, CUDA_ERROR_INVALID_VALUE), and once every graph is destroyed and the
/// pool trimmed a 3Q/4 allocation fits (nothing left counted).
#[test]
fn graph_memory_paths_hold_the_drivers_books_within_the_cap() {
    let sim = Sim::new();
    let q = 64 * MIB;
    for (path, want) in [
        // instantiate, launch x2, 3Q/4 refused, Q/2 fits, freed
        ("free_same", "0,0,0,2,0,0"),
        // instantiate, launch, relaunch while alive (driver: 1), cuMemFree,
        // launch, cuMemFree, 3Q/4 refused (the pool holds Q/2)
        ("alloc_node", "0,0,1,0,0,0,2"),
        // both instantiated, launched in turn twice, Q/2 fits, Q/4 more refused
        ("free_other", "0,0,0,0,0,0,0,2,0"),
        // launched, freed (0) and freed again (driver: 1), Q/2 fits, 1 MiB more refused
        ("mem_free", "0,0,0,1,0,2,0"),
        ("mem_free_async", "0,0,0,1,0,2,0"),
        // launched, template destroyed, freed, launched, exec destroyed
        // while alive, trimmed: 3Q/4 refused until the allocation is freed
        ("destroy", "0,0,0,0,0,0,0,2,0"),
        // Q/4 exec launched, updated with Q/2, launched: Q/2 more fits
        // (the update replaced the need; both kept refused it), freed
        ("update", "0,0,0,0,0,0"),
        // as free_other, both graphs recorded by stream capture
        ("captured", "0,0,0,0,0,0,0,2,0"),
    ] {
        let mut c = sim.probe(&["getproc2", "graph-path", path], true);
        c.env(muxflow::records::xcuda_env::MEM_LIMIT_BYTES, q.to_string());
        let (o, r) = run(c);
        assert!(o.status.success(), "{path}: {o:?}");
        assert_eq!(r.get(path).map(String::as_str), Some(want), "{path}: {r:?}");
        assert_eq!(r.get("fit").map(String::as_str), Some("0"), "{path}: {r:?}");
        let books: Vec<u64> = r["driver"].split(',').map(|v| v.parse().unwrap()).collect();
        assert_eq!(
            books[0],
            3 * q / 4,
            "{path}: the driver holds only the last allocation: {r:?}"
        );
        assert!(
            books[1] <= q,
            "{path}: the driver held {} > Q: {r:?}",
            books[1]
        );
    }
}
