//! `muxflow-sampler`'s loop on the simulated GPU beside a trainer on every
//! SM: readers get the GPM SM activity from its page at once. Its own test
//! binary: the fake NVML is loaded once per process (one simulation root)
//! and its shutdown is not counted, so another test's NVML session in the
//! same process would end the sampler's.

use std::time::{Duration, Instant};

use muxflow_node::nvml::{self, GpuRead, Reading};
use muxflow_simgpu::testing::{built, SimRoot};

fn read(lib: &std::path::Path) -> Reading {
    let t = nvml::read(Some(lib), Duration::ZERO).expect("NVML read");
    match &t.gpus[0].1 {
        GpuRead::Ok(r) => r.clone(),
        other => panic!("GPU 0: {other:?}"),
    }
}

/// `muxflow-sampler`'s loop (in a thread here) beside a trainer:
/// its page gives readers the SM activity at once, with no wait of their
/// own, and it leaves no page behind when it goes.
#[test]
fn the_sampler_publishes_sm_activity_for_readers_and_leaves_nothing_behind() {
    use std::os::unix::fs::MetadataExt;

    use muxflow::config::AbsPath;
    use muxflow::node::state::NodeState;
    use muxflow_node::sampler;

    let sim = SimRoot::new(1);
    let lib = sim.lib().join("libnvidia-ml.so.1");
    let state = tempfile::tempdir().unwrap();
    let mut config = muxflow::Config::default();
    config.paths.state_dir = AbsPath::new(state.path()).unwrap();
    config.paths.nvml_library = AbsPath::new(&lib);
    // No job is recorded in this state directory: it goes after its linger.
    config.health.sampler_linger_s = 10;
    let mut trainer = sim
        .command(&built("muxflow-workload"))
        .args(["offline", "--duration", "40", "--blocks", "132"])
        .spawn()
        .expect("start muxflow-workload");
    let pid = trainer.id();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !read(&lib).processes.iter().any(|p| p.pid == pid) {
        assert!(Instant::now() < deadline, "the trainer never showed");
        std::thread::sleep(Duration::from_millis(50));
    }

    let run = std::thread::spawn(move || sampler::run(&config).map_err(|e| format!("{e:#}")));
    let ns = NodeState::new(state.path());
    let page = sampler::page_path(&ns, 0);
    let me = std::fs::metadata(state.path()).unwrap().uid();
    let deadline = Instant::now() + Duration::from_secs(8);
    let sm = loop {
        match muxflow::records::sm_page::read(&page, me, muxflow::records::sm_page::now_ms()) {
            Ok(sm) => break sm,
            Err(why) => assert!(Instant::now() < deadline, "no reading: {why}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(sm > 50.0, "SM activity {sm} beside a trainer on every SM");
    assert_eq!(sampler::running(&ns), Some(std::process::id()));

    run.join().unwrap().expect("the sampler's run");
    assert_eq!(sampler::running(&ns), None, "the lock outlived it");
    assert!(!page.exists(), "its page outlived it");
    let _ = trainer.kill();
    let _ = trainer.wait();
}
