//! The brake that sees the online job, on the dev cluster: an h100-like
//! simulated GPU (its SM clock never falls; what runs beside a kernel slows
//! it), an online service and a trainer that leaves the GPU idle most of the
//! time (as the real H100 pair did: the clock and utilization triggers have
//! nothing to see), both jobs a non-root user's. The plugin preloads xCUDA
//! in counting mode into the online job, which publishes its GPU's online
//! page; the offline job's gate reads it and brakes. Before this, nothing
//! braked there (`delayed=0` on the real H100). No timing assertions: the
//! test waits for the page to show the slowdown and for the offline job's
//! delayed launches to keep growing after its slow start.

use std::time::{Duration, Instant};

use muxflow::records::online_page::{self, Reading};
use muxflow_tests::{CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(90);
const USER: &str = "nobody";
const NODE: &str = "node4";

/// Sets the contention mode of every simulated GPU of `node`; returns the
/// config files' old texts (restored on drop).
struct GpuModel {
    files: Vec<(std::path::PathBuf, String)>,
}

impl GpuModel {
    fn set(c: &Cluster, node: &str, model: &str) -> GpuModel {
        let gpus = c.node_path(&format!("sim/state/nodes/{node}/gpus"), node);
        let mut files = Vec::new();
        for e in std::fs::read_dir(&gpus).unwrap().flatten() {
            let p = e.path().join("config.toml");
            let old = std::fs::read_to_string(&p).unwrap();
            let kept: String = old
                .lines()
                .filter(|l| !l.starts_with("model"))
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(&p, format!("model = \"{model}\"\n{kept}")).unwrap();
            files.push((p, old));
        }
        assert!(
            !files.is_empty(),
            "no simulated GPUs under {}",
            gpus.display()
        );
        GpuModel { files }
    }
}

impl Drop for GpuModel {
    fn drop(&mut self) {
        for (p, old) in &self.files {
            let _ = std::fs::write(p, old);
        }
    }
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn the_brake_reacts_to_the_online_jobs_slowdown_with_the_clock_flat() {
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfob-");
    let _model = GpuModel::set(&c, NODE, "h100-like");
    let config = c.health_config("online-brake", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    for g in 0..2 {
        c.sim_load(NODE, g, 0.0);
    }

    // The service: 3 ms of kernels on 64 of 132 SMs per request, 200/s.
    let online_script = format!(
        "#!/bin/sh\n{}\n",
        c.workload("online --duration 120 --rate 200 --kernels 3 --kernel-us 1000 --blocks 64")
    );
    let online = c
        .sbatch_as(
            USER,
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                "-w",
                NODE,
                "--job-name",
                "mfob-online",
            ],
            &online_script,
        )
        .unwrap_or_else(|e| panic!("sbatch online: {e}"));
    c.wait_running(online, WAIT);
    c.wait_output(online, "pid=", WAIT);
    let gres = c.gres_detail(online);
    let gpu: u32 = gres
        .strip_prefix("gpu:1(IDX:")
        .and_then(|s| s.strip_suffix(')'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("job {online}: GRES '{gres}'"));
    c.settle_healthy(&config, NODE, gpu, 0);

    // Counting mode publishes: a page of the job's user with windows.
    let state_dir = c.node_state(&config, NODE).dir().to_path_buf();
    // As the node sees it: the Prolog mounts the page's filesystem there.
    let page = c.node_view(NODE, &online_page::path(&state_dir, gpu));
    wait_until("the online job's first window on its page", || {
        online_page::read_trusted(&page, 0)
            .ok()
            .filter(|r| r.window_at_ns != 0)
    });
    // The page is the job's user's (not root's): only that user may write it.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&page).unwrap();
    assert!(
        meta.uid() != 0 && meta.mode() & 0o022 == 0,
        "page {}: uid {} mode {:o}",
        page.display(),
        meta.uid(),
        meta.mode()
    );

    // The trainer, 20 kernels a step then 25 ms on the host: the shared
    // GPU stays far from 95 % busy, and an h100-like clock never falls.
    let offline_script = format!(
        "#!/bin/sh\n{}\n",
        c.workload(
            "offline --duration 120 --kernels-per-step 20 --kernel-us 500 --blocks 132 --host-us 25000"
        )
    );
    let offline = c
        .sbatch_as(
            USER,
            &["--muxflow=offline", "--job-name", "mfob-offline"],
            &offline_script,
        )
        .unwrap_or_else(|e| panic!("sbatch offline: {e}"));
    c.place(offline, NODE, gpu);
    c.wait_running(offline, WAIT);

    // The online job sees its slowdown: a window well past the brake
    // threshold (0.04 by default).
    let mut prev = None;
    let seen = wait_until("the online page to show the slowdown", || {
        let r = online_page::read_trusted(&page, 0).ok()?;
        let reading = r.reading(online_page::now_ns(), prev);
        prev = Some(r.launches);
        match reading {
            Reading::Deviation(d) if d > 0.06 => Some(d),
            _ => None,
        }
    });
    // The slow start is over within a few seconds; the brake then acts on
    // the slowdown: delayed launches keep growing.
    std::thread::sleep(Duration::from_secs(5));
    let (l0, d0) = c.xcuda_counters(&config, NODE, offline);
    let grown = wait_until("the offline job's delayed launches to grow", || {
        let (l, d) = c.xcuda_counters(&config, NODE, offline);
        (d > d0 && l > l0).then_some(d - d0)
    });
    // With the clock at its maximum the whole time.
    let table = {
        let mut cmd = std::process::Command::new(muxflow_tests::target().join("simgpu-ctl"));
        cmd.arg("table").arg(c.node_path("sim/state", NODE));
        c.run(cmd).1
    };
    let row = table
        .lines()
        .find(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&NODE) && w.get(1) == Some(&gpu.to_string().as_str())
        })
        .unwrap_or_else(|| panic!("{NODE} gpu{gpu} not in\n{table}"));
    assert!(row.contains("1980/1980"), "clock not flat: {row}");
    eprintln!("online deviation seen {seen:.3}; {grown} more delayed launches");
    c.scancel(&[offline, online]);
}
