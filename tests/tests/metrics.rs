//! Metrics on the dev cluster (issue 18): an online and an offline job on
//! one simulated GPU; the node's textfile (node_exporter's textfile
//! collector format) holds the expected series with the right labels,
//! `promtool check metrics` accepts it, xCUDA's delay counters grow while
//! the GPU is Overloaded, and dcgm-exporter's job-mapping file for the GPU
//! lists both jobs and is cleared when they end.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use muxflow::policy::health::HealthState;
use muxflow_tests::{CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(60);

fn textfile(c: &Cluster, node: &str) -> PathBuf {
    c.node_path("var/lib/prometheus/{node}/muxflow.prom", node)
}

/// The value of the sample of `name` whose labels include every `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (lbl, v) = rest.split_once("} ")?;
        labels
            .iter()
            .all(|(k, want)| lbl.split(',').any(|kv| kv == format!("{k}=\"{want}\"")))
            .then(|| v.trim().parse().ok())?
    })
}

fn promtool_accepts(path: &Path) {
    let file = std::fs::File::open(path).unwrap();
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::from(file))
        .output()
        .expect("promtool (Debian package prometheus; scripts/devcluster installs it)");
    assert!(
        out.status.success(),
        "promtool check metrics {}:\n{}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn step_until(c: &Cluster, config: &Path, node: &str, gpu: u32, want: HealthState) {
    let ns = c.node_state(config, node);
    c.step_until(config, node, &format!("{node} gpu{gpu} {want:?}"), || {
        ns.health(gpu).unwrap() == Some(want)
    });
}

#[test]
fn the_node_textfile_and_job_mapping_follow_the_jobs_on_a_shared_gpu() {
    let c = Cluster::get();
    c.cancel_named("mfx-");
    let _cancel = CancelNamed(&c, "mfx-");
    let cfg = c.health_config("metrics", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let node = "node2";
    let (online, gpu) = c.online_workload("mfx-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let offline = c.offline_running("mfx-offline", node, gpu, WAIT);
    let (g, o) = (gpu.to_string(), offline.to_string());
    let job_labels = [("node", node), ("gpu", g.as_str()), ("job", o.as_str())];

    // Running, Healthy: the series are there with their labels.
    let path = textfile(&c, node);
    let mut text = String::new();
    c.step_until(&cfg, node, "launches in the textfile", || {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        value(&text, "muxflow_xcuda_launches_total", &job_labels).is_some_and(|v| v > 0.0)
    });
    promtool_accepts(&path);
    // One state of the GPU is current (which depends on the load: Busy
    // while the offline job fills the GPU).
    let current: f64 = HealthState::ALL
        .iter()
        .filter_map(|st| {
            let s = st.to_string();
            let l = [("node", node), ("gpu", g.as_str()), ("state", s.as_str())];
            value(&text, "muxflow_gpu_health_state", &l)
        })
        .sum();
    assert_eq!(current, 1.0, "{text}");
    let share = value(&text, "muxflow_offline_sm_share_ratio", &job_labels).unwrap();
    assert!(share > 0.0 && share <= 1.0, "{text}");
    assert!(value(&text, "muxflow_offline_memory_cap_bytes", &job_labels).unwrap() > 0.0);
    let gpu_labels = [("node", node), ("gpu", g.as_str()), ("mode", "offline")];
    assert_eq!(
        value(&text, "muxflow_gpu_jobs", &gpu_labels),
        Some(1.0),
        "{text}"
    );
    assert!(
        text.contains("# TYPE muxflow_mps_restarts_total counter"),
        "{text}"
    );
    let delayed = |t: &str| value(t, "muxflow_xcuda_delay_seconds_total", &job_labels);
    let before = delayed(&text).unwrap_or(0.0);

    // dcgm-exporter's mapping: both jobs on the GPU.
    let mapping = c.node_path(&format!("var/run/dcgm-job-mapping/{{node}}/{gpu}"), node);
    let listed = std::fs::read_to_string(&mapping).unwrap();
    let mut ids: Vec<u32> = listed.lines().map(|l| l.parse().unwrap()).collect();
    ids.sort();
    let mut want = vec![online, offline];
    want.sort();
    assert_eq!(ids, want, "{listed}");

    // Overloaded: xCUDA holds the offline job's launches; its delay grows.
    c.sim_load(node, gpu, 0.99);
    step_until(&c, &cfg, node, gpu, HealthState::Overloaded);
    std::thread::sleep(Duration::from_secs(3));
    c.sim_load(node, gpu, 0.0);
    // Calmed: Busy or below. Which one is the offline job's own load (it
    // fills the GPU alone now), not what this test is about.
    let ns = c.node_state(&cfg, node);
    c.step_until(&cfg, node, &format!("{node} gpu{gpu} calmed"), || {
        ns.health(gpu)
            .unwrap()
            .is_some_and(|s| s != HealthState::Overloaded)
    });
    c.step_until(&cfg, node, "delay seconds grow", || {
        let t = std::fs::read_to_string(&path).unwrap_or_default();
        delayed(&t).is_some_and(|d| d > before)
    });
    promtool_accepts(&path);

    // Both jobs end: the mapping file goes, the job's series too.
    c.scancel(&[offline, online]);
    for id in [offline, online] {
        c.wait(id, WAIT);
    }
    c.step_until(&cfg, node, "mapping cleared", || !mapping.exists());
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        value(&text, "muxflow_xcuda_launches_total", &job_labels),
        None,
        "{text}"
    );
    promtool_accepts(&path);
    c.assert_no_drain();
}

#[test]
fn the_matcher_serves_its_round_figures_and_writes_its_textfile() {
    let c = Cluster::get();
    let base = std::fs::read_to_string(c.dir.join("etc/muxflow.toml")).unwrap();
    assert!(
        base.contains("[metrics]\n"),
        "the dev cluster config has [metrics]"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let textdir = c.scratch("matcher-metrics");
    let config = base.replace(
        "[metrics]\n",
        &format!(
            "[metrics]\nlisten = \"127.0.0.1:{port}\"\n\
             # the matcher's own textfile, apart from the nodes'\n"
        ),
    );
    let config = config.replacen(
        "textfile_dir = ",
        &format!("textfile_dir = \"{}\"\n#", textdir.display()),
        1,
    );
    let path = c.scratch("matcher-metrics-config").join("muxflow.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = c.cmd(
        muxflow_tests::target()
            .join("muxflow-matcher")
            .to_str()
            .unwrap(),
    );
    cmd.arg("--config")
        .arg(&path)
        .args(["--interval", "1", "--dry-run"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let fetch = || -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let start = std::time::Instant::now();
    let body = loop {
        if let Some(r) = fetch().filter(|r| r.contains("muxflow_matcher_rounds_total 2")) {
            break r;
        }
        assert!(
            start.elapsed() < WAIT,
            "no second round on :{port}: {:?}",
            fetch()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.contains("version=0.0.4"), "{body}");
    assert!(
        body.contains("muxflow_matcher_round_duration_seconds "),
        "{body}"
    );
    assert!(
        body.contains("muxflow_matcher_gpus{state=\"online\"}"),
        "{body}"
    );
    // A cluster this size is priced out well within the default budget.
    assert!(
        body.contains("muxflow_matcher_round_exact_over_every_pair 1\n"),
        "{body}"
    );
    let file = textdir.join("muxflow-matcher.prom");
    promtool_accepts(&file);
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .contains("# TYPE muxflow_matcher_rounds_total counter"));
}
