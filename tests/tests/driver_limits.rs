//! The kernel's and the driver's own limits on an offline job, where a node
//! has them, and today's path where it does not (issue 27, part 4).
//!
//! * cgroup v2 `dmem`: with the controller (the simulated kernel's,
//!   `simgpu-ctl dmem on`), the job's GPU memory cap is in its cgroup's
//!   `dmem.max`: a job run as `nobody` that unsets `LD_PRELOAD` and the MPS
//!   variables still cannot allocate past it. Without it nothing is
//!   written, the cap is xCUDA's and the police evict the same attack.
//!
//! Each test says on its node what muxflow-doctor says of the mechanism.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use muxflow_tests::{kv, target, Cluster};

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

/// The doctor's `dmem` line for `node`.
fn doctor_dmem(c: &Cluster, node: &str) -> String {
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
        .find(|l| l.contains(" dmem: "))
        .unwrap_or_else(|| panic!("no dmem line:\n{text}"))
        .to_string()
}

/// Submits `script` as `nobody` in offline mode, placed on `node`'s `gpu`.
fn offline_as_nobody(c: &Cluster, name: &str, node: &str, gpu: u32, script: &str) -> u32 {
    let id = c
        .sbatch(
            &[
                "--muxflow=offline",
                muxflow_tests::AS_NOBODY,
                "--job-name",
                name,
            ],
            script,
        )
        .unwrap_or_else(|e| panic!("sbatch {name}: {e}"));
    c.place(id, node, gpu);
    id
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

fn admin_comment(c: &Cluster, id: u32, done: &str) -> muxflow::report::JobReport {
    let line = c.sacct_until(id, "AdminComment", |l| l.contains(done));
    let text = line.split('|').nth(1).unwrap();
    muxflow::report::JobReport::decode(text).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn with_dmem_the_kernel_refuses_an_allocation_past_the_cap_of_a_job_without_xcuda() {
    let c = Cluster::get();
    let node = "node2";
    let _dmem = Dmem::on(&c, node);
    let doctor = doctor_dmem(&c, node);
    assert!(
        doctor.starts_with("ok   dmem: used: ") && doctor.contains("on 2 of the node's 2 GPUs"),
        "{doctor}"
    );
    let cfg = c.health_config("dmem-on", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload("mfd-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);

    // A job that keeps its limits runs as before, under the kernel's cap.
    let good = offline_as_nobody(
        &c,
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
    let cap = admin_comment(&c, good, "mem_cap_mib=").mem_cap_mib.unwrap();
    assert!(cap < PAST_CAP_MIB, "cap {cap} MiB");
    let pid = kv(&out.replace('\n', " "), "pid").unwrap();
    let attach = attach_event(&c, node, gpu, &pid);
    assert_eq!(
        kv(&attach, "dmem_max"),
        Some((cap << 20).to_string()),
        "{attach}"
    );

    // The attack: xCUDA and MPS's client limit gone; the kernel's stays.
    let bad = offline_as_nobody(
        &c,
        "mfd-attack",
        node,
        gpu,
        &script(
            &c,
            ATTACK,
            &format!("online --rate 20 --duration 30 --alloc-mib {PAST_CAP_MIB}"),
        ),
    );
    let out = c.wait_output(bad, "workload-exit=", WAIT);
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
    let c = Cluster::get();
    let node = "node2";
    // Off, as a node without the controller is (and as the other test leaves it).
    Dmem::set(&c, node, false);
    let doctor = doctor_dmem(&c, node);
    assert!(
        doctor.starts_with("ok   dmem: absent: no cgroup v2 dmem controller"),
        "{doctor}"
    );
    let cfg = c.health_config("dmem-off", "min_dwell_s = 1\nrecovery_quiet_s = 1");
    let (online, gpu) = c.online_workload("mfn-online", node, 0.05, 1000);
    c.settle_healthy(&cfg, node, gpu, 1000);
    let bad = offline_as_nobody(
        &c,
        "mfn-attack",
        node,
        gpu,
        &script(
            &c,
            ATTACK,
            &format!("online --rate 20 --duration 30 --alloc-mib {PAST_CAP_MIB}"),
        ),
    );
    let out = c.wait_output(bad, "workload-exit=", WAIT);
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
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.assert_no_drain();
}
