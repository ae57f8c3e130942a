//! The kernel's and the driver's own limits on an offline job, where a node
//! has them, and today's path where it does not (issue 27, part 4).
//!
//! * cgroup v2 `dmem`: with the controller (the simulated kernel's,
//!   `simgpu-ctl dmem on`), the job's GPU memory cap is in its cgroup's
//!   `dmem.max`: a job run as `nobody` that unsets `LD_PRELOAD` and the MPS
//!   variables still cannot allocate past it. Without it nothing is
//!   written, the cap is xCUDA's and the police evict the same attack.
//!
//! * static SM partitions (`[mps] sm_partitions = true`, a control daemon
//!   13010+: the simulated one once `simgpu-ctl mps-version 13010`): the
//!   daemon runs with `-S`, every job gets a partition, and a job as
//!   `nobody` that drops xCUDA and asks for every SM gets only its
//!   partition's; without its partition it gets no GPU at all. With an
//!   older daemon the setting is ignored, the share is MPS's percentage
//!   and xCUDA's, as before.
//!
//! * MPS v3 namespaces (a control daemon that routes clients by cgroup:
//!   the simulated one once `simgpu-ctl mps-version 13050`): the daemon
//!   runs `-p 3`, each offline job gets a namespace routed by its cgroup,
//!   and a job as `nobody` that drops xCUDA and its MPS limits, asks for
//!   every SM and reaches the daemon by another path still gets its
//!   namespace's memory limit and thread percentage; its Epilog deletes
//!   the namespace; a daemon the health check restarts gets the recorded
//!   jobs' namespaces again. With r615's socket routing only (13040)
//!   namespaces are not used, and the police evict the same attack.
//!
//! Each test says on its node what muxflow-doctor says of the mechanism.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use muxflow_tests::{kv, target, CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// The attack: xCUDA and the MPS limits gone, then one allocation
/// past the cap (GPU 81559 MiB less the online job's 1000 MiB and the 2048
/// MiB reserve: 78511 MiB) that the GPU itself could still hold (the
/// workload's `online` mode allocates once; `offline` adds a quarter per
/// step, which the GPU could not).
const ATTACK: &str = "unset LD_PRELOAD CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_PINNED_DEVICE_MEM_LIMIT CUDA_MPS_CLIENT_PRIORITY";
const PAST_CAP_MIB: u64 = 80000;

/// Turns a node's simulated dmem controller on; off again when dropped.
struct Dmem<'a>(&'a Cluster, &'static str);

impl<'a> Dmem<'a> {
    fn set(c: &Cluster, node: &str, on: bool) {
        let dir = c.dir.join("sim/state");
        let state = if on { "on" } else { "off" };
        c.simgpu(&["dmem", dir.to_str().unwrap(), "--node", node, state]);
    }

    fn on(c: &'a Cluster, node: &'static str) -> Self {
        Self::set(c, node, true);
        Dmem(c, node)
    }
}

impl Drop for Dmem<'_> {
    fn drop(&mut self) {
        Self::set(self.0, self.1, false);
    }
}

/// The doctor's line `name` for `node`.
fn doctor_line(c: &Cluster, node: &str, name: &str) -> String {
    let out = Command::new(target().join("muxflow-doctor"))
        .args(["--node", node, "--slurm-conf"])
        .arg(&c.slurm_conf)
        .arg("--config")
        .arg(c.dir.join("etc/muxflow.toml"))
        .env("SLURMD_NODENAME", node)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.contains(&format!(" {name}: ")))
        .unwrap_or_else(|| panic!("no {name} line:\n{text}"))
        .to_string()
}

/// `node`'s doctor line `name`, which must begin with `start`.
fn doctor_says(c: &Cluster, node: &str, name: &str, start: &str) -> String {
    let line = doctor_line(c, node, name);
    assert!(line.starts_with(start), "{line}");
    line
}

/// Every GPU of `node` without its MPS daemon, so that the control daemon
/// version a test sets next is what the daemons of its jobs report.
fn quiet(c: &Cluster, node: &str) {
    for g in 0..2 {
        c.wait_mps_daemon_gone(node, g, WAIT);
    }
}

/// `{prefix}online` on one of `node`'s GPUs (5 % of the SMs, 1000 MiB),
/// settled healthy by the health check under a quick config: the online job,
/// its GPU and that config.
fn settled_online(c: &Cluster, node: &str, prefix: &str) -> (u32, u32, PathBuf) {
    let cfg = c.health_config(
        &format!("{prefix}health"),
        "min_dwell_s = 1\nrecovery_quiet_s = 1",
    );
    let (online, gpu) = c.online_workload(&format!("{prefix}online"), node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    (online, gpu, cfg)
}

/// Ends the test's online job and waits for its GPU's MPS daemon to go
/// (the next test sets the version its daemon reports); no node drained.
fn end_online(c: &Cluster, node: &str, gpu: u32, online: u32) {
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.wait_mps_daemon_gone(node, gpu, WAIT);
    c.assert_no_drain();
}

/// A job script: prints who enforces its limits (its limits file, which
/// the job's group may read), runs `shell`, then the workload.
fn script(c: &Cluster, shell: &str, workload: &str) -> String {
    format!(
        "#!/bin/sh\n\
         grep enforced_by \"$MUXFLOW_XCUDA_LIMITS_DIR/$SLURM_JOB_ID\" | tr '\\n' ' '; echo\n\
         {shell}\n{}\necho workload-exit=$?\n",
        c.workload(workload)
    )
}

/// The simulated GPU's attach line of process `pid`.
fn attach_event(c: &Cluster, node: &str, gpu: u32, pid: &str) -> String {
    let log: PathBuf = c
        .dir
        .join(format!("sim/state/nodes/{node}/gpus/{gpu}/events.log"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    text.lines()
        .find(|l| l.contains(&format!("pid={pid} event=attach")))
        .unwrap_or_else(|| panic!("no attach of {pid} in {}:\n{text}", log.display()))
        .to_string()
}

fn admin_comment(c: &Cluster, id: u32, done: &str) -> muxflow::records::report::JobReport {
    let line = c.sacct_until(id, "AdminComment", |l| l.contains(done));
    let text = line.split('|').nth(1).unwrap();
    muxflow::records::report::JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// The attack as `nobody` beside the online job on `node`'s GPU `gpu`
/// (xCUDA and the MPS client limits dropped, an allocation past the cap):
/// the job and its output once its workload ended.
fn attack_past_the_cap(c: &Cluster, name: &str, node: &str, gpu: u32) -> (u32, String) {
    let workload = format!("online --rate 20 --duration 30 --alloc-mib {PAST_CAP_MIB}");
    let bad = c.offline_as_nobody(name, node, gpu, &script(c, ATTACK, &workload));
    (bad, c.wait_output(bad, "workload-exit=", WAIT))
}

#[test]
fn with_dmem_the_kernel_refuses_an_allocation_past_the_cap_of_a_job_without_xcuda() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfd-");
    let node = "node2";
    let _dmem = Dmem::on(&c, node);
    let doctor = doctor_says(&c, node, "dmem", "ok   dmem: used: ");
    assert!(doctor.contains("on 2 of the node's 2 GPUs"), "{doctor}");
    let (online, gpu, _) = settled_online(&c, node, "mfd-");

    // A job that keeps its limits runs as before, under the kernel's cap.
    let good = c.offline_as_nobody(
        "mfd-good",
        node,
        gpu,
        &script(&c, "", "offline --duration 3 --alloc-mib 512"),
    );
    let end = c.wait(good, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}");
    let out = c.output(good);
    assert!(
        out.contains("enforced_by_mem=kernel enforced_by_sm=xcuda"),
        "{out}"
    );
    assert!(out.contains("workload-exit=0"), "{out}");
    let report = admin_comment(&c, good, "mem_cap_mib=");
    assert_eq!(
        report.enforced_by.as_deref(),
        Some("mem:kernel,sm:xcuda"),
        "{report:?}"
    );
    let cap = report.mem_cap_mib.unwrap();
    assert!(cap < PAST_CAP_MIB, "cap {cap} MiB");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "dmem_max"),
        Some((cap << 20).to_string()),
        "{attach}"
    );

    // The attack: xCUDA and MPS's client limit gone; the kernel's stays.
    let (bad, out) = attack_past_the_cap(&c, "mfd-attack", node, gpu);
    assert!(
        out.contains("enforced_by_mem=kernel"),
        "the limits file says so:\n{out}"
    );
    assert!(
        out.contains("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"),
        "the kernel refused the allocation:\n{out}"
    );
    assert!(!out.contains("workload-exit=0"), "{out}");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "mem_limit"),
        Some((cap << 20).to_string()),
        "{attach}"
    );
    c.wait(bad, WAIT);
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.assert_no_drain();
}

#[test]
fn without_dmem_nothing_is_written_the_cap_is_xcudas_and_the_police_evict_the_attack() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfn-");
    let node = "node2";
    // Off, as a node without the controller is (and as the other test leaves it).
    Dmem::set(&c, node, false);
    doctor_says(
        &c,
        node,
        "dmem",
        "ok   dmem: absent: no cgroup v2 dmem controller",
    );
    let (online, gpu, _) = settled_online(&c, node, "mfn-");
    let (bad, out) = attack_past_the_cap(&c, "mfn-attack", node, gpu);
    assert!(
        out.contains("enforced_by_mem=xcuda enforced_by_sm=xcuda"),
        "{out}"
    );
    // Nothing refused the allocation (the GPU holds it): the police did
    // the rest, as before the kernel's cap existed.
    assert!(!out.contains("OUT_OF_MEMORY"), "{out}");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(kv(&attach, "dmem_max").as_deref(), Some("none"), "{attach}");
    assert!(
        out.contains(&format!(
            "muxflow: process {pid} of offline job {bad} is evicted from the GPU"
        )),
        "{out}"
    );
    c.wait(bad, WAIT);
    let report = admin_comment(&c, bad, "policed=");
    assert_eq!(report.policed.as_deref(), Some("no_xcuda"), "{report:?}");
    assert_eq!(
        report.enforced_by.as_deref(),
        Some("mem:xcuda,sm:xcuda"),
        "{report:?}"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.assert_no_drain();
}

/// For the test's life: the simulated control daemon reports `version`
/// (`-v`; 13010+ has `-S`) and the cluster's muxflow.toml sets `[mps]
/// sm_partitions = true`; both undone when dropped.
struct Partitions<'a> {
    _version: MpsVersion<'a>,
    toml: PathBuf,
    before: String,
}

impl<'a> Partitions<'a> {
    fn on(c: &'a Cluster, version: &str) -> Self {
        let _version = MpsVersion::set(c, version);
        let toml = c.dir.join("etc/muxflow.toml");
        let before = std::fs::read_to_string(&toml).unwrap();
        assert!(!before.contains("[mps]"), "cluster config has [mps]");
        std::fs::write(&toml, format!("{before}\n[mps]\nsm_partitions = true\n")).unwrap();
        Partitions {
            _version,
            toml,
            before,
        }
    }
}

impl Drop for Partitions<'_> {
    fn drop(&mut self) {
        std::fs::write(&self.toml, &self.before).unwrap();
    }
}

/// For the test's life: the simulated control daemon reports `version`
/// (`-v`); none again when dropped.
struct MpsVersion<'a>(&'a Cluster);

impl<'a> MpsVersion<'a> {
    fn set(c: &'a Cluster, version: &str) -> Self {
        let state = c.dir.join("sim/state");
        c.simgpu(&["mps-version", state.to_str().unwrap(), version]);
        MpsVersion(c)
    }
}

impl Drop for MpsVersion<'_> {
    fn drop(&mut self) {
        let state = self.0.dir.join("sim/state");
        self.0
            .simgpu(&["mps-version", state.to_str().unwrap(), "none"]);
    }
}

/// Waits until the GPU's daemon was told `sm_partition rm` `n` times.
fn wait_removed(c: &Cluster, node: &str, gpu: u32, n: usize) {
    let start = Instant::now();
    loop {
        let log = c.mps_log(node, gpu, "commands.log");
        if log.matches("sm_partition rm").count() >= n {
            return;
        }
        assert!(start.elapsed() < WAIT, "{n} partitions not removed:\n{log}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The attack on the SM share: no xCUDA, every SM asked for.
const SM_ATTACK: &str = "unset LD_PRELOAD CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\nexport CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_CLIENT_PRIORITY=0";

#[test]
fn with_static_partitions_the_driver_holds_a_job_without_xcuda_to_its_sms() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfp-");
    let node = "node3";
    quiet(&c, node);
    let _on = Partitions::on(&c, "13010");
    let start = "ok   sm partitions: used (control daemon 13010, by its -v)";
    doctor_says(&c, node, "sm partitions", start);
    let (online, gpu, _) = settled_online(&c, node, "mfp-");
    let control = c.mps_log(node, gpu, "control.log");
    assert!(control.contains("static_partitioning=true"), "{control}");
    // The simulated H100: 132 SMs in 33 chunks of 4. The online job keeps
    // all but the policy's default offline share (30 %: 9 chunks).
    let online_pid = kv(&c.output_or_empty(online).replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &online_pid);
    assert_eq!(
        kv(&attach, "partition_sms").as_deref(),
        Some("96"),
        "{attach}"
    );

    // As nobody, without xCUDA, asking for 100 % of the SMs: the driver
    // gives it its partition's 36 SMs (9 chunks), not the GPU's 132.
    let bad = c.offline_as_nobody(
        "mfp-attack",
        node,
        gpu,
        &script(&c, SM_ATTACK, "offline --duration 30 --alloc-mib 256"),
    );
    let out = c.wait_output(bad, "workload-exit=", WAIT);
    assert!(out.contains("enforced_by_sm=driver"), "{out}");
    let report = admin_comment(&c, bad, "enforced_by=");
    assert_eq!(
        report.enforced_by.as_deref(),
        Some("mem:xcuda,sm:driver"),
        "{report:?}"
    );
    assert_eq!(report.sm_pct, Some(27), "9 of 33 chunks: {report:?}");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "thread_pct").as_deref(),
        Some("100"),
        "{attach}"
    );
    assert_eq!(
        kv(&attach, "partition_sms").as_deref(),
        Some("36"),
        "{attach}"
    );
    assert_eq!(kv(&attach, "sm_cap").as_deref(), Some("36"), "{attach}");
    c.wait(bad, WAIT);
    // Its partition goes back to the GPU with its Epilog.
    wait_removed(&c, node, gpu, 1);

    // Without its partition (or with another's) a client gets no GPU at
    // all on a daemon in static mode.
    let none = c.offline_as_nobody(
        "mfp-nopart",
        node,
        gpu,
        &script(
            &c,
            &format!("{SM_ATTACK}\nunset CUDA_MPS_SM_PARTITION"),
            "offline --duration 30 --alloc-mib 256",
        ),
    );
    let out = c.wait_output(none, "workload-exit=", WAIT);
    assert!(
        out.contains("CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
        "{out}"
    );
    assert!(!out.contains("workload-exit=0"), "{out}");
    c.wait(none, WAIT);
    wait_removed(&c, node, gpu, 2);
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    end_online(&c, node, gpu, online);
}

#[test]
fn with_an_older_daemon_sm_partitions_are_ignored_and_the_share_is_xcudas() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfq-");
    let node = "node3";
    quiet(&c, node);
    let _on = Partitions::on(&c, "none");
    let start = "ok   sm partitions: absent (a control daemon whose -v names no version";
    let doctor = doctor_says(&c, node, "sm partitions", start);
    assert!(doctor.contains("is set and ignored here"), "{doctor}");
    // The GPU's MPS logs outlive its daemons: count only this test's commands.
    let partition_commands = |g| {
        c.mps_log(node, g, "commands.log")
            .matches("sm_partition")
            .count()
    };
    let before = [partition_commands(0), partition_commands(1)];
    let (online, gpu, _) = settled_online(&c, node, "mfq-");
    let control = c.mps_log(node, gpu, "control.log");
    assert!(control.contains("static_partitioning=false"), "{control}");
    let good = c.offline_as_nobody(
        "mfq-good",
        node,
        gpu,
        &script(&c, "", "offline --duration 3 --alloc-mib 256"),
    );
    let end = c.wait(good, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}");
    let out = c.output(good);
    assert!(out.contains("enforced_by_sm=xcuda"), "{out}");
    assert!(out.contains("workload-exit=0"), "{out}");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "partition_sms").as_deref(),
        Some("none"),
        "{attach}"
    );
    assert_eq!(
        partition_commands(gpu),
        before[gpu as usize],
        "no partition made"
    );
    end_online(&c, node, gpu, online);
}

/// The attack on a v3 node: xCUDA and the MPS client limits gone, every SM
/// asked for, and another path to the daemon's socket (a link of the
/// job's own): a namespace chosen by socket would be left this way.
const NS_ATTACK: &str =
    "unset LD_PRELOAD CUDA_MPS_PINNED_DEVICE_MEM_LIMIT CUDA_MPS_CLIENT_PRIORITY\n\
     export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\n\
     ln -sfn \"$CUDA_MPS_PIPE_DIRECTORY\" /tmp/mfv-pipe-$SLURM_JOB_ID\n\
     export CUDA_MPS_PIPE_DIRECTORY=/tmp/mfv-pipe-$SLURM_JOB_ID";

/// `namespace list` of `node`'s GPU `gpu`'s running daemon.
fn namespaces(c: &Cluster, node: &str, gpu: u32) -> String {
    use std::io::Write;
    let pipe = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string());
    let mut child = Command::new(c.dir.join("sim/bin/nvidia-cuda-mps-control"))
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"namespace list\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn with_mps_v3_routing_by_cgroup_the_daemon_holds_a_job_without_xcuda_to_its_namespace() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfv-");
    let node = "node3";
    quiet(&c, node);
    let _v = MpsVersion::set(&c, "13050");
    doctor_says(
        &c,
        node,
        "mps v3",
        "ok   mps v3: used (control daemon 13050, by its -v)",
    );
    let (online, gpu, cfg) = settled_online(&c, node, "mfv-");
    let control = c.mps_log(node, gpu, "control.log");
    assert!(
        control.contains("protocol=3, cgroup_routing=true"),
        "{control}"
    );
    // The online job is in no namespace (its server's default one).
    let online_pid = kv(&c.output_or_empty(online).replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &online_pid);
    assert_eq!(
        kv(&attach, "namespace").as_deref(),
        Some("none"),
        "{attach}"
    );

    // A job that keeps its limits runs as before, in its namespace, and
    // the node's metrics say who holds its limits.
    let good = c.offline_as_nobody(
        "mfv-good",
        node,
        gpu,
        &script(&c, "", "offline --duration 8 --alloc-mib 512"),
    );
    let out = c.wait_output(good, "enforced_by", WAIT);
    assert!(
        out.contains("enforced_by_mem=driver enforced_by_sm=driver"),
        "{out}"
    );
    let textfile = c.node_path("var/lib/prometheus/{node}/muxflow.prom", node);
    let metric = |limit: &str| {
        format!("muxflow_offline_limit_enforced_by{{node=\"{node}\",gpu=\"{gpu}\",job=\"{good}\",limit=\"{limit}\",by=\"driver\"}} 1")
    };
    c.step_until(&cfg, node, "the metric names the driver", || {
        let text = std::fs::read_to_string(&textfile).unwrap_or_default();
        text.contains(&metric("memory")) && text.contains(&metric("sm"))
    });
    let end = c.wait(good, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}");
    let out = c.output(good);
    assert!(out.contains("workload-exit=0"), "{out}");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "namespace"),
        Some(format!("job_{good}")),
        "{attach}"
    );

    // As nobody: xCUDA and the MPS client limits gone, 100 % of the SMs
    // asked for, the daemon reached by another path, an allocation past
    // the cap. The daemon routes it by its cgroup to its namespace anyway.
    let workload = format!("online --rate 20 --duration 30 --alloc-mib {PAST_CAP_MIB}");
    let bad = c.offline_as_nobody("mfv-attack", node, gpu, &script(&c, NS_ATTACK, &workload));
    let out = c.wait_output(bad, "workload-exit=", WAIT);
    assert!(
        out.contains("enforced_by_mem=driver enforced_by_sm=driver"),
        "the limits file says so:\n{out}"
    );
    assert!(
        out.contains("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"),
        "the namespace's pinned limit refused the allocation:\n{out}"
    );
    assert!(!out.contains("workload-exit=0"), "{out}");
    let report = admin_comment(&c, bad, "enforced_by=");
    assert_eq!(
        report.enforced_by.as_deref(),
        Some("mem:driver,sm:driver"),
        "{report:?}"
    );
    let (cap, sm_pct) = (report.mem_cap_mib.unwrap(), report.sm_pct.unwrap());
    assert!(cap < PAST_CAP_MIB, "cap {cap} MiB");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    let name = format!("job_{bad}");
    assert_eq!(kv(&attach, "namespace"), Some(name.clone()), "{attach}");
    assert_eq!(
        kv(&attach, "mem_limit"),
        Some((cap << 20).to_string()),
        "{attach}"
    );
    // The namespace's percentage overrides the client's 100; its priority
    // is the client's default, the client having unset its own.
    assert_eq!(
        kv(&attach, "thread_pct"),
        Some(sm_pct.to_string()),
        "{attach}"
    );
    assert!(sm_pct < 100, "{report:?}");
    assert_eq!(kv(&attach, "priority").as_deref(), Some("1"), "{attach}");
    // Bound to the job's cgroup as the release names it.
    let commands = c.mps_log(node, gpu, "commands.log");
    let bound = commands
        .lines()
        .find_map(|l| {
            let marker = format!(
                "namespace set {name} --server=muxflow --cgroup=/system.slice/slurmstepd.scope/"
            );
            l.split_once(&marker).map(|(_, dir)| dir)
        })
        .unwrap_or_else(|| panic!("no cgroup binding of {name}:\n{commands}"));
    match muxflow::node::jobproc::job_dir_name(bound.trim()) {
        Some(muxflow::node::jobproc::JobDirName::Sluid(_)) if c.names_job_cgroups_by_sluid() => {}
        Some(muxflow::node::jobproc::JobDirName::Id(id)) if !c.names_job_cgroups_by_sluid() => {
            assert_eq!(id, bad, "{commands}")
        }
        other => panic!("{bound}: {other:?}\n{commands}"),
    }
    c.wait(bad, WAIT);
    // Its Epilog deleted it; the daemon (kept by the online job) has none.
    let start = Instant::now();
    while namespaces(&c, node, gpu).contains(&name) {
        assert!(start.elapsed() < WAIT, "{name} outlived its job");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        c.mps_log(node, gpu, "commands.log")
            .contains(&format!("namespace delete {name} --server=muxflow --force")),
        "deleted by muxflow"
    );
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    end_online(&c, node, gpu, online);
}

#[test]
fn with_mps_v3_routing_by_socket_only_namespaces_are_not_used_and_the_police_evict_the_attack() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfw-");
    let node = "node3";
    quiet(&c, node);
    // r615: v3 whose namespaces a job could leave by its pipe directory.
    let _v = MpsVersion::set(&c, "13040");
    let start = "ok   mps v3: present (control daemon 13040, by its -v), not used";
    doctor_says(&c, node, "mps v3", start);
    let before = [0, 1].map(|g| {
        c.mps_log(node, g, "commands.log")
            .matches("namespace")
            .count()
    });
    let (online, gpu, _) = settled_online(&c, node, "mfw-");
    let control = c.mps_log(node, gpu, "control.log");
    assert!(control.contains("protocol=2"), "{control}");
    let workload = format!("online --rate 20 --duration 30 --alloc-mib {PAST_CAP_MIB}");
    let bad = c.offline_as_nobody("mfw-attack", node, gpu, &script(&c, NS_ATTACK, &workload));
    let out = c.wait_output(bad, "workload-exit=", WAIT);
    assert!(
        out.contains("enforced_by_mem=xcuda enforced_by_sm=xcuda"),
        "{out}"
    );
    // Nothing refused the allocation: the police did the rest, as today.
    assert!(!out.contains("OUT_OF_MEMORY"), "{out}");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "namespace").as_deref(),
        Some("none"),
        "{attach}"
    );
    assert_eq!(
        kv(&attach, "thread_pct").as_deref(),
        Some("100"),
        "{attach}"
    );
    assert!(
        out.contains(&format!(
            "muxflow: process {pid} of offline job {bad} is evicted from the GPU"
        )),
        "{out}"
    );
    c.wait(bad, WAIT);
    let report = admin_comment(&c, bad, "policed=");
    assert_eq!(report.policed.as_deref(), Some("no_xcuda"), "{report:?}");
    assert_eq!(
        c.mps_log(node, gpu, "commands.log")
            .matches("namespace")
            .count(),
        before[gpu as usize],
        "no namespace made"
    );
    end_online(&c, node, gpu, online);
}

/// A daemon the health check starts again has no namespaces: it makes
/// those of the offline jobs still recorded on the GPU again, so a job's
/// next process (its first one died with the old server) is held as its
/// limits file says.
#[test]
fn a_v3_daemon_the_health_check_restarts_gets_the_offline_jobs_namespaces_again() {
    let _turn = muxflow_tests::one_at_a_time();
    let c = Cluster::get();
    let _cancel = CancelNamed(&c, "mfr-");
    let node = "node3";
    quiet(&c, node);
    let _v = MpsVersion::set(&c, "13050");
    let (online, gpu, cfg) = settled_online(&c, node, "mfr-");
    // The job's first process runs until the daemon dies; its second waits
    // for the test's word that the daemon is back.
    let go = c.scratch("mfr-go").join("go");
    let _ = std::fs::remove_file(&go);
    let first = format!(
        "{} ; echo first-exit=$?\nwhile [ ! -e {} ]; do sleep 0.2; done",
        c.workload("offline --duration 120 --alloc-mib 256"),
        go.display()
    );
    let offline = c.offline_as_nobody(
        "mfr-offline",
        node,
        gpu,
        &script(&c, &first, "offline --duration 3 --alloc-mib 256"),
    );
    c.wait_output(offline, "enforced_by_mem=driver", WAIT);
    let name = format!("job_{offline}");
    let start = Instant::now();
    while !namespaces(&c, node, gpu).contains(&name) {
        assert!(start.elapsed() < WAIT, "no {name}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let pid_file = c
        .node_path("var/run/muxflow/{node}/mps", node)
        .join(gpu.to_string())
        .join("nvidia-cuda-mps-control.pid");
    let old = std::fs::read_to_string(&pid_file).unwrap();
    let killed = Command::new("kill")
        .args(["-KILL", old.trim()])
        .status()
        .unwrap();
    assert!(killed.success());
    c.wait_output(offline, "first-exit=", WAIT);
    // The health check (this one, or the node's own in the background)
    // starts it again as the Prolog would (MPS v3), and makes the recorded
    // job's namespace again.
    c.step_until(&cfg, node, "the daemon restarted", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p != old)
    });
    let listed = namespaces(&c, node, gpu);
    assert!(listed.contains(&name), "{listed}");
    let control = c.mps_log(node, gpu, "control.log");
    let starts: Vec<&str> = control
        .lines()
        .filter(|l| l.contains("Starting control daemon"))
        .collect();
    assert!(
        starts.last().is_some_and(|l| l.contains("protocol=3")),
        "{starts:?}"
    );
    std::fs::write(&go, "").unwrap();
    let out = c.wait_output(offline, "workload-exit=", WAIT);
    assert!(out.contains("workload-exit=0"), "{out}");
    let pids: Vec<String> = out.lines().filter_map(|l| kv(l, "pid")).collect();
    let second = pids.last().unwrap();
    let attach = attach_event(&c, node, gpu, second);
    assert_eq!(kv(&attach, "namespace"), Some(name.clone()), "{attach}");
    c.wait(offline, WAIT);
    let start = Instant::now();
    while namespaces(&c, node, gpu).contains(&name) {
        assert!(start.elapsed() < WAIT, "{name} outlived its job");
        std::thread::sleep(Duration::from_millis(200));
    }
    end_online(&c, node, gpu, online);
}
