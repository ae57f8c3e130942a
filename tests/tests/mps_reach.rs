//! Who may be a client of a GPU's MPS daemon, tried as the unprivileged
//! user `nobody`: only users with a job recorded on the GPU reach its pipe
//! directory (its ACL, set by the Prolog and the Epilog), and among their
//! processes the police judge each client by its job, not by how it got
//! there.
//!
//! * `nobody`, with no job on root's online GPU, cannot reach its daemon
//!   (not even a `get_server_list`); with an offline job placed there it
//!   can; once that job ended, not again.
//! * While it can: a plain job of `nobody` (no `--muxflow`, no GPU) and its
//!   online job of the other GPU point `CUDA_MPS_PIPE_DIRECTORY` at that
//!   GPU's pipe, priority 0 and every SM: both are evicted by the next
//!   health step and told why; the online job runs on.
//! * An offline job whose own preload maps one executable page of the real
//!   xCUDA library in place of loading it: mapped, never started, it is
//!   evicted as `no_xcuda` by its muxflow-police.
//! * `quit` sent to an online GPU's daemon by another user with a job on
//!   it: the health step starts the daemon again, and a fatal fault after
//!   that does not restart it under the online job, which its list no
//!   longer names.
//! * `terminate_client` sent by `nobody`, whose online job shares the GPU,
//!   to root's offline client: the job it ended is told in its AdminComment
//!   (`terminated_by_other`) while it runs, and the node log names that
//!   job and its user, and no sender.
//! * The same sent to root's online client, whose job ends seconds later
//!   (its Epilog runs before the next health step) while `nobody` has an
//!   offline job on that GPU: the online job's AdminComment says so, and
//!   neither its watcher nor the later health step blames `nobody`.

use std::time::Duration;

use muxflow_tests::{Cluster, AS_NOBODY};

const WAIT: Duration = Duration::from_secs(90);

/// Script lines that point a job's MPS client at `pipe`, asking for all.
fn reach(pipe: &std::path::Path) -> String {
    format!(
        "export CUDA_MPS_PIPE_DIRECTORY={}\nexport CUDA_MPS_CLIENT_PRIORITY=0\n\
         export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\nunset CUDA_VISIBLE_DEVICES\n",
        pipe.display()
    )
}

#[test]
fn clients_of_jobs_that_are_not_the_gpus_are_evicted() {
    let c = Cluster::get();
    let node = "node1";
    const PREFIX: &str = "mfr-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config("mps-reach", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    let pipe = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string());
    // No job of nobody's on the GPU: its daemon is out of reach.
    let refused = mps_answer_as_nobody(&c, &pipe, "get_server_list");
    assert!(
        refused.contains("Permission denied"),
        "nobody reached the daemon of a GPU it has no job on: {refused}"
    );
    // An offline job of nobody's placed there (it only waits): now it can.
    let waiting = nobody_waits_on(&c, &format!("{PREFIX}offline"), node, gpu);
    mps_command_as_nobody(&c, &pipe, "get_server_list");
    let attack = |what: &str| {
        format!(
            "#!/bin/sh\n{}echo {what}-start\n{}\necho {what}-exit=$?\n",
            reach(&pipe),
            c.workload("offline --duration 120 --alloc-mib 256")
        )
    };
    let plain = c
        .sbatch(
            &[
                AS_NOBODY,
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}plain"),
            ],
            &attack("plain"),
        )
        .unwrap();
    // An online job of nobody on the node's other GPU.
    let other = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                AS_NOBODY,
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}other"),
            ],
            &attack("other"),
        )
        .unwrap();
    let mut pids = Vec::new();
    for job in [plain, other] {
        let out = c.wait_output(job, "pid=", WAIT);
        let pid: u32 = muxflow_tests::kv(&out.replace('\n', " "), "pid")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        pids.push((job, pid));
    }
    let log = c.step_until(&cfg, node, "both attackers gone", || {
        pids.iter()
            .all(|(_, pid)| !muxflow_tests::process_runs(*pid))
    });
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    for (job, pid) in pids {
        let evicted = format!("process {pid} of job {job} is evicted from GPU {gpu}");
        assert!(
            node_log
                .lines()
                .any(|l| l.contains(&evicted) && l.contains("not_on_gpu")),
            "{log}\n{node_log}"
        );
        let end = c.wait(job, WAIT);
        let told = c.output_or_empty(job);
        assert!(
            told.contains(&evicted) && told.contains("only the GPU's own jobs"),
            "{end:?}: {told}"
        );
    }
    // The online job was not touched.
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    // Nobody's job gone (its Epilog ran): out of reach again.
    c.scancel(&[waiting]);
    c.wait(waiting, WAIT);
    let refused = mps_answer_as_nobody(&c, &pipe, "get_server_list");
    assert!(
        refused.contains("Permission denied"),
        "nobody still reaches the daemon after its job ended: {refused}"
    );
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

/// A preload of the user's own that maps one executable page of the file
/// `$MAP_ONLY` (the real xCUDA) and starts nothing of it.
const MAP_ONLY_C: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
__attribute__((constructor)) static void map_only(void) {
    const char *path = getenv("MAP_ONLY");
    int fd = path ? open(path, O_RDONLY) : -1;
    if (fd >= 0)
        mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
}
"#;

#[test]
fn an_offline_process_that_only_maps_xcuda_is_evicted() {
    let c = Cluster::get();
    let node = "node2";
    const PREFIX: &str = "mfm-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let dir = c.scratch("map-only");
    muxflow_tests::open_to_all(&dir);
    std::fs::write(dir.join("map_only.c"), MAP_ONLY_C).unwrap();
    let lib = dir.join("map_only.so");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(dir.join("map_only.c"))
        .status()
        .unwrap();
    assert!(built.success());
    let cfg = c.health_config("map-only", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    // The job's MPS limits stay as the plugin set them: only xCUDA goes.
    let script = format!(
        "#!/bin/sh\nexport MAP_ONLY=$(printf %s \"$LD_PRELOAD\" | tr : '\\n' | grep xcuda | head -n 1)\n\
         echo map-only=$MAP_ONLY\nexport LD_PRELOAD={}\n{}\necho workload-exit=$?\n",
        lib.display(),
        c.workload("offline --duration 120 --alloc-mib 256")
    );
    let offline = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &script);
    let out = c.wait_output(offline, "xCUDA's start-up did not run in it", WAIT);
    let pid = muxflow_tests::kv(&out.replace('\n', " "), "pid").unwrap_or_else(|| panic!("{out}"));
    assert!(
        out.contains(&format!(
            "process {pid} of offline job {offline} is evicted"
        )),
        "{out}"
    );
    // It did map the real library (the old check passed it).
    let map_only = muxflow_tests::kv(&out.replace('\n', " "), "map-only").unwrap_or_default();
    assert!(map_only.ends_with("libmuxflow_xcuda.so"), "{out}");
    c.wait(offline, WAIT);
    let line = c.sacct_until(offline, "AdminComment", |l| l.contains("policed="));
    let text = line.split('|').nth(1).unwrap();
    let report =
        muxflow::records::report::JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(report.policed.as_deref(), Some("no_xcuda"), "{line}");
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

/// An offline job of `nobody` placed on `node`'s GPU `gpu` that only
/// waits, running: nobody has a job there, so reaches its daemon.
fn nobody_waits_on(c: &Cluster, name: &str, node: &str, gpu: u32) -> u32 {
    let id = c.offline_as_nobody(name, node, gpu, "#!/bin/sh\necho pid=$$\nsleep 600\n");
    c.wait_output(id, "pid=", WAIT);
    id
}

/// Sends `command` as `nobody` to the MPS control daemon of `pipe`;
/// returns its answer (nobody must reach it).
fn mps_command_as_nobody(c: &Cluster, pipe: &std::path::Path, command: &str) -> String {
    let (ok, out) = mps_send_as_nobody(c, pipe, command);
    assert!(ok, "{command}: {out}");
    out
}

/// What the control program printed, stdout and stderr, for `command`
/// sent as `nobody`, whether or not it reached the daemon.
fn mps_answer_as_nobody(c: &Cluster, pipe: &std::path::Path, command: &str) -> String {
    mps_send_as_nobody(c, pipe, command).1
}

fn mps_send_as_nobody(c: &Cluster, pipe: &std::path::Path, command: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "env"])
        .arg(format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()))
        .arg(c.dir.join("sim/bin/nvidia-cuda-mps-control"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{command}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        (true, text)
    } else {
        (false, text + &String::from_utf8_lossy(&out.stderr))
    }
}

fn counter(c: &Cluster, cfg: &std::path::Path, node: &str, gpu: u32, key: &str) -> u64 {
    let ns = c.node_state(cfg, node);
    let text = std::fs::read_to_string(ns.gpu_dir(gpu).join("record.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    r["counters"][key].as_u64().unwrap_or(0)
}

#[test]
fn a_foreign_quit_does_not_lead_to_a_restart_under_the_online_job() {
    let c = Cluster::get();
    let node = "node3";
    const PREFIX: &str = "mfq-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config("foreign-quit", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    // The service's step outlives its process (a supervisor would start
    // it again): the job runs on whatever the quit did to its client.
    for g in 0..2 {
        c.sim_load(node, g, 0.05);
    }
    let script = format!(
        "#!/bin/sh\n{}\necho online-exit=$?\nsleep 600\n",
        c.workload("online --rate 20 --alloc-mib 1000")
    );
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            &script,
        )
        .unwrap();
    c.wait_running(online, WAIT);
    c.wait_output(online, "pid=", WAIT);
    let gres = c.gres_detail(online);
    let gpu: u32 = gres
        .strip_prefix("gpu:1(IDX:")
        .and_then(|s| s.strip_suffix(')'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("job {online}: GRES '{gres}'"));
    c.sim_load(node, 1 - gpu, 0.0);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let pipe = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string());
    // Another user with a job on the GPU (only they reach its daemon):
    // nobody's offline job, which only waits.
    let waiting = nobody_waits_on(&c, &format!("{PREFIX}offline"), node, gpu);
    // Read first: a health step slurmd runs may restart the daemon too.
    let restarted = counter(&c, &cfg, node, gpu, "action.restart_mps_daemon");
    mps_command_as_nobody(&c, &pipe, "quit");
    c.step_until(&cfg, node, "the daemon started again", || {
        counter(&c, &cfg, node, gpu, "action.restart_mps_daemon") > restarted
    });
    let before = counter(&c, &cfg, node, gpu, "action.restart_mps");
    let xids = counter(&c, &cfg, node, gpu, "rule.xid_fatal");
    // A fatal Xid: the rule asks for a restart if no online client is attached.
    c.sim_fault(node, gpu, &["xid", "48"]);
    let log = c.step_until(&cfg, node, "the fatal Xid handled", || {
        counter(&c, &cfg, node, gpu, "rule.xid_fatal") > xids
    });
    c.sim_fault(node, gpu, &["clear"]);
    assert_eq!(
        counter(&c, &cfg, node, gpu, "action.restart_mps"),
        before,
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "online job {online} is recorded on the GPU and runs"
        )),
        "{log}"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online, waiting]);
    c.wait(online, WAIT);
    c.wait(waiting, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

#[test]
fn a_terminate_client_from_anyone_is_recorded_for_the_job_it_ended() {
    let c = Cluster::get();
    let node = "node4";
    const PREFIX: &str = "mft-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config("foreign-terminate", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    // Nobody's service: nobody has a job on the GPU, so reaches its daemon.
    let (online, gpu) =
        c.online_workload_as(&format!("{PREFIX}online"), node, 0.05, 1000, &[AS_NOBODY]);
    c.settle_healthy(&cfg, node, gpu, 1000);
    // Root's offline job. Its batch step outlives its trainer by a few
    // seconds, as a trainer's own teardown would: the record is made within
    // muxflow-police's interval (1 s).
    let script = format!(
        "#!/bin/sh\n{}\necho workload-exit=$?\nsleep 3\n",
        c.workload("offline --duration 120 --alloc-mib 256")
    );
    let victim = c
        .sbatch(
            &[
                "--muxflow=offline",
                "--job-name",
                &format!("{PREFIX}offline"),
            ],
            &script,
        )
        .unwrap();
    c.place(victim, node, gpu);
    let out = c.wait_output(victim, "pid=", WAIT);
    let pid = muxflow_tests::kv(&out.replace('\n', " "), "pid").unwrap_or_else(|| panic!("{out}"));
    let pipe = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string());
    // Attached: listed by the daemon's server.
    let start = std::time::Instant::now();
    let server = loop {
        let servers = mps_command_as_nobody(&c, &pipe, "get_server_list");
        let server = servers.split_whitespace().find(|s| {
            mps_command_as_nobody(&c, &pipe, &format!("get_client_list {s}"))
                .split_whitespace()
                .any(|p| p == pid)
        });
        if let Some(s) = server {
            break s.to_string();
        }
        assert!(start.elapsed() < WAIT, "{pid} never attached: {servers}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // A trainer that has run a while (the police saw it as a client).
    std::thread::sleep(Duration::from_secs(3));
    mps_command_as_nobody(&c, &pipe, &format!("terminate_client {server} {pid}"));
    let end = c.wait(victim, WAIT);
    let out = c.output_or_empty(victim);
    assert!(out.contains("workload-exit="), "{end:?}: {out}");
    let line = c.sacct_until(victim, "AdminComment", |l| l.contains("mode="));
    let text = line.split('|').nth(1).unwrap();
    let report =
        muxflow::records::report::JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(report.terminated_by_other, Some(1), "{line}");
    // The node log names the job it ended and its user (root), no sender.
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    let said = node_log
        .lines()
        .filter(|l| l.contains("terminate_client muxflow did not send"))
        .collect::<Vec<_>>();
    assert!(
        said.iter()
            .any(|l| l.contains(&format!("client=Some({pid})"))
                && l.contains(&format!("job=Some({victim})"))
                && l.contains("uid=Some(0)")
                && l.contains("anyone who can reach")),
        "{said:?}"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}

/// The online job's client `pid` on `gpu`: the server whose client list
/// names it, asked as `nobody` (anyone who reaches the socket can ask:
/// every user with a job on the GPU).
fn server_of(c: &Cluster, pipe: &std::path::Path, pid: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let servers = mps_command_as_nobody(c, pipe, "get_server_list");
        let server = servers.split_whitespace().find(|s| {
            mps_command_as_nobody(c, pipe, &format!("get_client_list {s}"))
                .split_whitespace()
                .any(|p| p == pid)
        });
        if let Some(s) = server {
            return s.to_string();
        }
        assert!(start.elapsed() < WAIT, "{pid} never attached: {servers}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_terminate_client_of_an_online_client_is_recorded_for_it_before_its_epilog() {
    let c = Cluster::get();
    let node = "node2";
    const PREFIX: &str = "mfo-";
    c.cancel_named(PREFIX);
    let _cancel = muxflow_tests::CancelNamed(&c, PREFIX);
    let cfg = c.health_config(
        "foreign-terminate-online",
        "min_dwell_s = 1\nrecovery_quiet_s = 1",
    );
    // Root's service; its batch step ends 3 s after its client does, as a
    // service's teardown would: its Epilog comes before any health step.
    for g in 0..2 {
        c.sim_load(node, g, 0.05);
    }
    let script = format!(
        "#!/bin/sh\n{}\necho online-exit=$?\nsleep 3\n",
        c.workload("online --rate 20 --alloc-mib 1000")
    );
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            &script,
        )
        .unwrap();
    c.wait_running(online, WAIT);
    let out = c.wait_output(online, "pid=", WAIT);
    let pid = muxflow_tests::kv(&out.replace('\n', " "), "pid").unwrap_or_else(|| panic!("{out}"));
    let gres = c.gres_detail(online);
    let gpu: u32 = gres
        .strip_prefix("gpu:1(IDX:")
        .and_then(|s| s.strip_suffix(')'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("job {online}: GRES '{gres}'"));
    c.sim_load(node, 1 - gpu, 0.0);
    c.settle_healthy(&cfg, node, gpu, 1000);
    // Another user on that GPU: nobody's offline job, which an attribution
    // by the GPU's jobs at the next step would blame.
    let other = c
        .sbatch(
            &[
                AS_NOBODY,
                "--muxflow=offline",
                "--job-name",
                &format!("{PREFIX}offline"),
            ],
            &format!(
                "#!/bin/sh\n{}\n",
                c.workload("offline --duration 300 --alloc-mib 256")
            ),
        )
        .unwrap();
    c.place(other, node, gpu);
    c.wait_output(other, "pid=", WAIT);
    let pipe = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string());
    let server = server_of(&c, &pipe, &pid);
    // A service that has run a while (its watcher saw it as a client).
    std::thread::sleep(Duration::from_secs(3));
    mps_command_as_nobody(&c, &pipe, &format!("terminate_client {server} {pid}"));
    let end = c.wait(online, WAIT);
    let out = c.output_or_empty(online);
    assert!(out.contains("online-exit="), "{end:?}: {out}");
    let line = c.sacct_until(online, "AdminComment", |l| l.contains("mode="));
    let text = line.split('|').nth(1).unwrap();
    let report =
        muxflow::records::report::JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(report.terminated_by_other, Some(1), "{line}");
    // The health step after the Epilog reads the command too: it names the
    // ended client's job and user (root), never nobody's job or nobody.
    let step = c.health_step(&cfg, node);
    let node_log = std::fs::read_to_string(c.dir.join(format!("log/muxflow-{node}.log"))).unwrap();
    let said: Vec<&str> = node_log
        .lines()
        .chain(step.lines())
        .filter(|l| l.contains("terminate_client muxflow did not send"))
        .filter(|l| l.contains(&format!("client=Some({pid})")))
        .collect();
    assert!(!said.is_empty(), "{step}");
    for l in &said {
        assert!(
            l.contains(&format!("job=Some({online})"))
                && l.contains("uid=Some(0)")
                && !l.contains(&format!("job=Some({other})"))
                && !l.contains("uid=Some(65534)"),
            "{said:?}"
        );
    }
    assert_eq!(c.job_field(other, "JobState"), "RUNNING");
    c.scancel(&[other]);
    c.wait(other, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}
