//! Failures around the node programs say what they are and drain nothing
//! (issue 13, finding 5 and "failures say what they are"): a full state
//! directory and an unreachable slurmctld. The tests take turns: each
//! breaks something every job on the cluster would feel.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use muxflow::policy::health::HealthState;
use muxflow_tests::{one_at_a_time, target, Cluster};

const WAIT: Duration = Duration::from_secs(90);

fn sh(cmd: &str) -> (bool, String) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A 2 MB tmpfs over a node's state directory, filled up; unmounted on drop.
struct FullStateDir {
    dir: PathBuf,
}

impl FullStateDir {
    fn new(dir: &Path) -> FullStateDir {
        let d = dir.display();
        // slurmd's own health checks keep writing the node's files: a copy
        // can meet one created under it ("File exists"), so it is tried
        // again (a second copy overwrites what the first made).
        let (ok, out) = sh(&format!(
            "set -e; t=$(mktemp -d); cp -a {d}/. $t/; mount -t tmpfs -o size=2m muxflow-full {d}; \
             ok=; for i in 1 2 3; do if cp -a $t/. {d}/; then ok=1; break; fi; sleep 0.2; done; \
             [ -n \"$ok\" ]; rm -rf $t; dd if=/dev/zero of={d}/filler bs=64k 2>/dev/null || true"
        ));
        assert!(ok, "cannot fill {d}: {out}");
        let (_, df) = sh(&format!("df -k {d} | tail -1"));
        assert!(df.contains("muxflow-full"), "{df}");
        FullStateDir {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for FullStateDir {
    fn drop(&mut self) {
        let (ok, out) = sh(&format!("umount {0} || umount -l {0}", self.dir.display()));
        assert!(ok || std::thread::panicking(), "umount: {out}");
    }
}

#[test]
fn a_full_state_directory_is_named_publishing_goes_on_and_nothing_drains() {
    let _turn = one_at_a_time();
    let c = Cluster::get();
    let node = "node2";
    let cfg = c.health_config("full", "min_dwell_s = 1\nrecovery_quiet_s = 1\n");
    let ns = c.node_state(&cfg, node);
    let state_dir = ns.dir().to_path_buf();
    for g in 0..2 {
        c.sim_load(node, g, 0.0);
    }
    c.step_until(&cfg, node, "node2 idle and healthy", || {
        c.published(node)
            .iter()
            .all(|g| g.state == HealthState::Healthy)
    });

    let full = FullStateDir::new(&state_dir);
    // The health check: the GPU's new state still reaches slurmctld, and
    // the log says what failed, where.
    c.sim_load(node, 0, 0.99);
    let log = c.step_until(&cfg, node, "gpu0 published Overloaded", || {
        c.published_gpu(node, 0).state == HealthState::Overloaded
    });
    assert!(
        log.contains("No space left on device") && log.contains(&state_dir.display().to_string()),
        "{log}"
    );
    c.sim_load(node, 0, 0.0);

    // A job: the user reads the real reason, not "released by hand?".
    let offline = c
        .sbatch_as(
            "nobody",
            &["--muxflow=offline"],
            "#!/bin/sh\necho offline-ran\n",
        )
        .unwrap();
    c.place(offline, node, 1);
    // muxflow's own failure: the job goes back to the queue, not lost.
    let out = c.wait_requeued_held(offline, WAIT);
    assert!(
        out.contains("No space left on device")
            && out.contains(&state_dir.display().to_string())
            && out.contains("goes back to the queue"),
        "{out}"
    );
    assert!(
        !out.contains("by hand") && !out.contains("holds no GPU"),
        "{out}"
    );
    assert!(!out.contains("offline-ran"), "ran unprotected: {out}");
    // The online job runs (without MPS), as before.
    let online = c
        .sbatch(
            &["--muxflow=online", "--gres=gpu:1", "-w", node],
            "#!/bin/sh\necho online-ran\n",
        )
        .unwrap();
    assert_eq!(c.wait(online, WAIT).state, "COMPLETED");
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    assert!(
        node_log.contains(&format!("cannot record job {offline}"))
            && node_log.contains("No space left on device"),
        "{node_log}"
    );
    c.assert_no_drain();

    // Room again: steps save their records, and the job runs.
    drop(full);
    c.step_until(&cfg, node, "gpu0 healthy again and saved", || {
        ns.health(0).unwrap() == Some(HealthState::Healthy)
            && c.published_gpu(node, 0).state == HealthState::Healthy
    });
    c.place(offline, node, 1);
    c.start_now(offline);
    assert_eq!(c.wait(offline, WAIT).state, "COMPLETED");
    assert!(c.output(offline).contains("offline-ran"));
    c.assert_no_drain();
}

/// Stops slurmctld; starts it again on drop (also after a failed assert).
struct CtldDown<'a> {
    c: &'a Cluster,
}

impl<'a> CtldDown<'a> {
    fn new(c: &'a Cluster) -> CtldDown<'a> {
        let pid = std::fs::read_to_string(c.dir.join("run/slurmctld.pid")).unwrap();
        let pid = pid.trim().to_string();
        assert!(Command::new("kill").arg(&pid).status().unwrap().success());
        let start = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "slurmctld {pid} still up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        CtldDown { c }
    }
}

impl Drop for CtldDown<'_> {
    fn drop(&mut self) {
        // As scripts/devcluster starts it: job_submit.lua reads the
        // cluster's shape from the path in its environment.
        let ok = self
            .c
            .cmd("slurmctld")
            .env(
                "MUXFLOW_SHAPE_FILE",
                self.c.dir.join("var/lib/muxflow-matcher/cluster-shape"),
            )
            .status()
            .unwrap()
            .success();
        let start = Instant::now();
        loop {
            let mut ping = self.c.cmd("scontrol");
            ping.arg("ping");
            let (_, out, _) = self.c.run(ping);
            if out.contains("is UP") {
                break;
            }
            assert!(
                std::thread::panicking() || (ok && start.elapsed() < Duration::from_secs(60)),
                "slurmctld did not come back: {out}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn an_unreachable_slurmctld_is_named_and_drains_nothing() {
    let _turn = one_at_a_time();
    let c = Cluster::get();
    let node = "node3";
    let cfg = c.health_config("noctld", "min_dwell_s = 1\nrecovery_quiet_s = 1\n");
    let ns = c.node_state(&cfg, node);
    c.sim_load(node, 0, 0.0);
    c.step_until(&cfg, node, "node3 gpu0 healthy", || {
        c.published_gpu(node, 0).state == HealthState::Healthy
    });

    let down = CtldDown::new(&c);
    // The health check: the local state (what xCUDA reads) still follows
    // the GPU; publishing fails with slurmctld's own words, and the
    // program exits 0 (a failing HealthCheckProgram would be ours to blame).
    c.sim_load(node, 0, 0.99);
    let log = c.health_step(&cfg, node);
    assert_eq!(
        ns.health(0).unwrap(),
        Some(HealthState::Overloaded),
        "{log}"
    );
    // slurmctld's own words, or the command timeout naming it (26.05's
    // scontrol keeps retrying past slurm.command_timeout_ms, as any release
    // may on a loaded machine).
    assert!(
        log.contains("publishing GPU states failed (retried next step)")
            && (log.contains("Unable to contact slurm controller")
                || log.contains("slurmctld did not answer")),
        "{log}"
    );
    // The Prolog of an offline job: says why it cannot check the placement.
    let mut prolog = c.cmd(target().join("muxflow-prolog").to_str().unwrap());
    prolog
        .arg("--config")
        .arg(&cfg)
        .env("SLURMD_NODENAME", node)
        .env("SLURM_JOB_ID", "990061")
        .env("SLURM_JOB_UID", "65534")
        .env("SPANK_MUXFLOW_MODE", "offline");
    let (ok, _, err) = c.run(prolog);
    assert!(ok, "the Prolog must exit 0: {err}");
    // slurmctld's own words, or (scontrol still retrying when the command
    // timeout ends it, as on a loaded machine) the timeout naming it.
    assert!(
        err.contains("reading the job's offline slots from slurmctld")
            && (err.contains("Unable to contact slurm controller")
                || err.contains("slurmctld did not answer")),
        "{err}"
    );
    assert!(ns.find_job(990061).unwrap().is_none());
    c.sim_load(node, 0, 0.0);
    drop(down);

    // Back: the next steps publish what the node knows now (and leave
    // the GPU healthy for the tests after this one).
    c.step_until(&cfg, node, "node3 gpu0 healthy and published", || {
        ns.health(0).unwrap() == Some(HealthState::Healthy)
            && c.published_gpu(node, 0).state == HealthState::Healthy
    });
    c.assert_no_drain();
}

/// slurmctld stopped (SIGSTOP: it accepts connections and never answers);
/// continued on drop, also after a failed assert.
struct CtldStopped {
    pid: String,
}

impl CtldStopped {
    fn new(c: &Cluster) -> CtldStopped {
        let pid = std::fs::read_to_string(c.dir.join("run/slurmctld.pid")).unwrap();
        let pid = pid.trim().to_string();
        assert!(Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success());
        CtldStopped { pid }
    }
}

impl Drop for CtldStopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid]).status();
    }
}

#[test]
fn a_hung_slurmctld_costs_the_prolog_one_timeout_and_loses_no_job() {
    let _turn = one_at_a_time();
    let c = Cluster::get();
    let node = "node3";
    // A short limit per Slurm call, so the run is quick.
    let base = std::fs::read_to_string(c.dir.join("etc/muxflow.toml")).unwrap();
    let cfg = c.scratch("hung").join("muxflow.toml");
    let text = if base.contains("[slurm]\n") {
        base.replace("[slurm]\n", "[slurm]\ncommand_timeout_ms = 2000\n")
    } else {
        format!("{base}\n[slurm]\ncommand_timeout_ms = 2000\n")
    };
    std::fs::write(&cfg, text).unwrap();
    let online = c
        .sbatch(
            &["--muxflow=online", "--gres=gpu:1", "-w", node],
            "#!/bin/sh\nsleep 8\necho online-ran\n",
        )
        .unwrap();
    c.wait_running(online, WAIT);
    let ns = c.node_state(&cfg, node);
    let stopped = CtldStopped::new(&c);
    // Forget what was published, so this Prolog has something to send:
    // only now, as a health check that ran while slurmctld was still up
    // would have published it again (seen once on 24.11: the Prolog then
    // had nothing to send). Under the node lock: a health check that
    // published just before the stop would otherwise save its record after
    // this removal (seen in CI on 22.05: the Prolog then had nothing to send).
    {
        let _lock = ns.lock_node().unwrap();
        let _ = std::fs::remove_file(ns.dir().join("node.json"));
    }
    // The job's Prolog, as slurmd runs it, while slurmctld hangs.
    let mut prolog = c.cmd(target().join("muxflow-prolog").to_str().unwrap());
    prolog
        .arg("--config")
        .arg(&cfg)
        .env("SLURMD_NODENAME", node)
        .env("SLURM_JOB_ID", online.to_string())
        .env("SLURM_JOB_UID", "0")
        .env("SLURM_JOB_GPUS", "0")
        .env("SPANK_MUXFLOW_MODE", "online")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = prolog.spawn().unwrap();
    // It must end while slurmctld is still stopped; a hang is killed here
    // (after far more than the 2 s limit) and fails the test.
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the Prolog hangs with slurmctld");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "the Prolog must exit 0: {err}");
    assert!(
        err.contains("publishing GPU states failed (retried next step)")
            && err.contains("timed out after 2s")
            && err.contains("slurmctld did not answer"),
        "{err}"
    );
    // Its own work was done: the job is recorded on the GPU.
    assert!(ns.find_job(online).unwrap().is_some(), "{err}");
    drop(stopped);

    // Continued: the job is not lost, and nothing drained.
    let end = c.wait(online, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}");
    c.assert_no_drain();
}

/// A job whose Epilog never ran (slurmd restarted in it, the Epilog was
/// killed) leaves its record on the GPU, which then stays taken by a job
/// that is gone. The health check forgets such a record once Slurm no
/// longer lists the job on the node, and keeps a running job's.
#[test]
fn a_job_whose_epilog_never_ran_is_forgotten_and_a_running_one_is_kept() {
    let _one = one_at_a_time();
    let c = Cluster::get();
    let node = "node1";
    const PREFIX: &str = "mfg-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config(
        "gone-jobs",
        "min_dwell_s = 1\nrecovery_quiet_s = 1\nforget_gone_jobs_after_s = 1",
    );
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.2, 1000);
    let ns = c.node_state(&cfg, node);
    let recorded = |id: u32| ns.jobs(gpu).unwrap().iter().any(|r| r.job_id == id);
    assert!(recorded(online), "{:?}", ns.jobs(gpu));

    // An id Slurm never gave (its first ids are small): an offline job's
    // record on the online job's GPU, as its Prolog wrote it.
    const GONE: u32 = 3_999_999;
    {
        let lock = ns.lock_gpu(gpu).unwrap();
        let record = muxflow::node::state::JobRecord {
            job_id: GONE,
            mode: muxflow::Mode::Offline,
            uid: 65534,
            slots: vec![0],
        };
        ns.add_job(&lock, gpu, &record).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1200));
    let log = c.step_until(&cfg, node, "the gone job forgotten", || !recorded(GONE));
    assert!(
        log.contains("is not on this node in Slurm") && log.contains(&GONE.to_string()),
        "{log}"
    );
    assert!(recorded(online), "the running job's record was kept");
    // The GPU is its online job's alone again: Healthy, no offline job.
    c.settle_healthy(&cfg, node, gpu, 1000);
    assert_eq!(c.published_gpu(node, gpu).offline, 0);
    // Ended before the lock goes: the next test stops slurmctld, and a job
    // ending then cannot complete (slurmd drains the node for it).
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

/// The same record found by a Prolog: Slurm gave the new offline job the
/// GPU's slot a gone job's record still holds. The Prolog forgets the
/// record (Slurm no longer lists that job here) and the job runs, where it
/// was refused `no_slot` before, over and over.
#[test]
fn an_offline_job_takes_the_slot_a_gone_jobs_record_held() {
    let _one = one_at_a_time();
    let c = Cluster::get();
    let node = "node1";
    let gpu = 1;
    const PREFIX: &str = "mfh-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.dir.join("etc/muxflow.toml");
    let ns = c.node_state(&cfg, node);
    const GONE: u32 = 3_999_998;
    {
        let lock = ns.lock_gpu(gpu).unwrap();
        let slots = (0..muxflow::Config::load(&cfg).unwrap().policy.offline_per_gpu).collect();
        let record = muxflow::node::state::JobRecord {
            job_id: GONE,
            mode: muxflow::Mode::Offline,
            uid: 65534,
            slots,
        };
        ns.add_job(&lock, gpu, &record).unwrap();
    }
    let id = c.offline_running(&format!("{PREFIX}offline"), node, gpu, WAIT);
    // Slurm says RUNNING while the Prolog still runs: its record is the sign.
    let start = Instant::now();
    let recorded = loop {
        let recorded = ns.jobs(gpu).unwrap();
        if recorded.iter().any(|r| r.job_id == id) || start.elapsed() > WAIT {
            break recorded;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        recorded.iter().any(|r| r.job_id == id) && !recorded.iter().any(|r| r.job_id == GONE),
        "{recorded:?}\n{}",
        c.output_or_empty(id)
    );
    assert!(!c.output_or_empty(id).contains("refused"));
    c.scancel(&[id]);
    c.wait(id, WAIT);
    c.assert_no_drain();
}
