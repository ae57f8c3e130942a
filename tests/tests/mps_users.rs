//! Two users on one GPU as NVIDIA's MPS really works, on the dev cluster:
//!
//! * a GPU whose daemon runs NVIDIA's multi-user mode (`-multiuser-server`,
//!   the simulated GPU a Hopper, compute capability 9.0) takes an offline
//!   job of another user (`nobody`) beside root's online job, and both are
//!   served;
//! * a GPU that cannot run the mode (compute capability 6.0, pre-Volta: its
//!   daemon serves one user at a time, and the simulated daemon, like
//!   NVIDIA's, would queue `nobody`'s client behind root's) is published
//!   `multiuser=0`: the matcher never places `nobody`'s job there
//!   (`waiting=same_user_only`), while root's own offline job shares it and
//!   runs to the end — nothing hangs.
//!
//! One test function: the matcher acts on every pending offline job of the
//! cluster, so the steps must not run in parallel with each other.

use std::path::PathBuf;
use std::time::Duration;

use muxflow_tests::{decision, CancelNamed, Cluster};

const PREFIX: &str = "mfu-";
const NODE: &str = "node4";
const OTHER_USER: &str = "nobody";
const WAIT: Duration = Duration::from_secs(90);

/// Sets the compute capability of `node`'s simulated GPUs; puts 9.0 back
/// when dropped, however the test ends.
struct ComputeCapability<'a> {
    configs: Vec<PathBuf>,
    _cluster: &'a Cluster,
}

impl<'a> ComputeCapability<'a> {
    fn set(c: &'a Cluster, node: &str, cc: &str) -> Self {
        let dir = c.node_path("sim/state/nodes/{node}/gpus", node);
        let configs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path().join("config.toml"))
            .collect();
        assert!(
            !configs.is_empty(),
            "no simulated GPU under {}",
            dir.display()
        );
        let guard = ComputeCapability {
            configs,
            _cluster: c,
        };
        guard.write(cc);
        guard
    }

    fn write(&self, cc: &str) {
        for path in &self.configs {
            let text = std::fs::read_to_string(path).unwrap();
            let mut kept: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("compute_capability"))
                .map(|l| format!("{l}\n"))
                .collect();
            kept.push_str(&format!("compute_capability = \"{cc}\"\n"));
            std::fs::write(path, kept).unwrap();
        }
    }
}

impl Drop for ComputeCapability<'_> {
    fn drop(&mut self) {
        self.write("9.0");
    }
}

fn offline_as(c: &Cluster, user: Option<&str>, name: &str) -> u32 {
    let script = format!(
        "#!/bin/sh\n{}\n",
        c.workload("offline --duration 2 --kernels-per-step 4 --kernel-us 200")
    );
    let args = ["--muxflow=offline", "--job-name", name];
    match user {
        Some(u) => c.sbatch_as(u, &args, &script),
        None => c.sbatch(&args, &script),
    }
    .unwrap_or_else(|e| panic!("sbatch {name}: {e}"))
}

#[test]
fn another_users_job_shares_only_a_gpu_whose_daemon_runs_multi_user() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    c.wait_all_gpus_healthy();
    let cfg = c.health_config(
        "mps-users",
        "min_dwell_s = 1\nrecovery_quiet_s = 1\nxid_watch_ms = 0",
    );

    // 1. Multi-user: root's service and nobody's training on one GPU.
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), NODE, 0.3, 1000);
    // Every other GPU of the cluster taken: this one is the only candidate.
    c.hold_free_gpus(&format!("{PREFIX}hold"));
    c.settle_healthy(&cfg, NODE, gpu, 1000);
    assert!(
        c.published_gpu(NODE, gpu).multiuser,
        "a Hopper GPU's daemon runs multi-user"
    );
    assert!(
        c.mps_log(NODE, gpu, "control.log")
            .contains("multiuser=true"),
        "the Prolog started the daemon without {}",
        muxflow::node::mps::MULTIUSER_FLAG
    );
    let theirs = offline_as(&c, Some(OTHER_USER), &format!("{PREFIX}theirs"));
    let round = c.matcher_once();
    let d = decision(&round, theirs);
    assert_eq!(
        (d["action"].as_str(), d["node"].as_str(), d["gpu"].as_u64()),
        (Some("place"), Some(NODE), Some(u64::from(gpu))),
        "{round}"
    );
    let end = c.wait(theirs, WAIT);
    assert_eq!(
        end.state,
        "COMPLETED",
        "{end:?}: {}",
        c.output_or_empty(theirs)
    );
    let pid = c
        .output(theirs)
        .lines()
        .find_map(|l| l.strip_prefix("pid=").map(str::to_string))
        .unwrap_or_else(|| panic!("no pid line: {}", c.output(theirs)));
    assert!(
        c.mps_log(NODE, gpu, "control.log").contains(&format!(
            "NEW CLIENT {pid} from user 65534: Server already exists"
        )),
        "nobody's client did not join root's server: {}",
        c.mps_log(NODE, gpu, "control.log")
    );
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.wait_mps_daemon_gone(NODE, gpu, WAIT);

    // 2. A GPU without the mode (pre-Volta): one user at a time.
    let _cc = ComputeCapability::set(&c, NODE, "6.0");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online-old"), NODE, 0.3, 1000);
    c.settle_healthy(&cfg, NODE, gpu, 1000);
    c.step_until(&cfg, NODE, "published multiuser=0", || {
        !c.published_gpu(NODE, gpu).multiuser
    });
    assert!(
        c.mps_log(NODE, gpu, "control.log")
            .contains("multiuser=false"),
        "{}",
        c.mps_log(NODE, gpu, "control.log")
    );
    assert!(
        c.mps_log(NODE, gpu, "muxflow-mode").contains("below 7.0"),
        "{}",
        c.mps_log(NODE, gpu, "muxflow-mode")
    );
    let theirs = offline_as(&c, Some(OTHER_USER), &format!("{PREFIX}theirs-old"));
    let own = offline_as(&c, None, &format!("{PREFIX}own-old"));
    let round = c.matcher_once();
    let d = decision(&round, theirs);
    assert_eq!(d["node"], serde_json::Value::Null, "{round}");
    assert_eq!(d["waiting"], "same_user_only", "{round}");
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("serves one user at a time"),
        "{round}"
    );
    let d = decision(&round, own);
    assert_eq!(
        (d["action"].as_str(), d["node"].as_str(), d["gpu"].as_u64()),
        (Some("place"), Some(NODE), Some(u64::from(gpu))),
        "{round}"
    );
    // The owner's own training shares the one-user server and ends.
    let end = c.wait(own, WAIT);
    assert_eq!(
        end.state,
        "COMPLETED",
        "{end:?}: {}",
        c.output_or_empty(own)
    );
    // The other user's job still waits, parked with the reason.
    assert_eq!(c.job_field(theirs, "JobState"), "PENDING");
    assert!(
        c.admin_comment(theirs).contains("waiting=same_user_only"),
        "{}",
        c.admin_comment(theirs)
    );
    c.scancel(&[online, theirs]);
    c.wait(online, WAIT);
    c.assert_no_drain();
}
