//! Devices as MPS numbers them, on GPU 1 of a node (the dev cluster's
//! simulated driver and control daemon renumber as NVIDIA documents: a
//! daemon shows its clients only its own devices, from 0; a client naming
//! the node's index 1 finds no device there).
//!
//! An online job of one user and an offline job of another share GPU 1 of
//! a node: both are clients of that GPU's daemon, and each is given the
//! GPU's UUID, the one name that means the same device through the daemon
//! and without it. (A 2-GPU gang, one task per GPU: `gang.rs`.)

use std::time::Duration;

use muxflow_tests::{kv, CancelNamed, Cluster};

const PREFIX: &str = "mfd-";
const NODE: &str = "node3";
const ONLINE_USER: &str = "daemon";
const OFFLINE_USER: &str = "nobody";
const WAIT: Duration = Duration::from_secs(90);

#[test]
fn an_online_and_another_users_offline_job_share_gpu_1_named_by_its_uuid() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    c.wait_all_gpus_healthy();

    // GPU 0 taken by a plain job, so Slurm gives the online job GPU 1.
    let hold = c
        .sbatch(
            &[
                "--gres=gpu:1",
                "-w",
                NODE,
                "--job-name",
                &format!("{PREFIX}hold"),
            ],
            "#!/bin/sh\nexec sleep 600\n",
        )
        .unwrap();
    c.wait_running(hold, WAIT);
    assert_eq!(c.gres_detail(hold), "gpu:1(IDX:0)");

    let online_script = format!(
        "#!/bin/sh\necho cvd=$CUDA_VISIBLE_DEVICES\n{}\n",
        c.workload("online --rate 20")
    );
    let online = c
        .sbatch_as(
            ONLINE_USER,
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                "-w",
                NODE,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            &online_script,
        )
        .unwrap_or_else(|e| panic!("sbatch as {ONLINE_USER}: {e}"));
    c.wait_running(online, WAIT);
    assert_eq!(c.gres_detail(online), "gpu:1(IDX:1)");
    c.wait_output(online, "pid=", WAIT);
    let uuid = c.gpu_uuid(NODE, 1);

    let offline_script = format!(
        "#!/bin/sh\necho cvd=$CUDA_VISIBLE_DEVICES mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\n{}\n",
        c.workload("offline --duration 3 --kernels-per-step 4 --kernel-us 200")
    );
    let offline = c
        .sbatch_as(
            OFFLINE_USER,
            &[
                "--muxflow=offline",
                "--job-name",
                &format!("{PREFIX}offline"),
            ],
            &offline_script,
        )
        .unwrap_or_else(|e| panic!("sbatch as {OFFLINE_USER}: {e}"));
    c.place(offline, NODE, 1);
    let end = c.wait(offline, WAIT);
    let out = c.output_or_empty(offline);
    assert_eq!(end.state, "COMPLETED", "{end:?}\n{out}");
    let line = |out: &str, key: &str| -> String {
        out.lines()
            .find_map(|l| kv(l, key))
            .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
    };
    assert_eq!(line(&out, "cvd"), uuid, "{out}");
    assert!(
        line(&out, "mem").starts_with("0="),
        "the cap names device 0: {out}"
    );
    assert!(
        out.contains("mode=offline steps=") && !out.contains("error="),
        "{out}"
    );
    let offline_pid = line(&out, "pid");
    let control = c.mps_log(NODE, 1, "control.log");
    assert!(
        control.contains(&format!(
            "NEW CLIENT {offline_pid} from user 65534: Server already exists"
        )),
        "the offline client did not join the online job's server:\n{control}"
    );

    // The online job served on beside it, as a client of the same daemon.
    let online_out = c.output_or_empty(online);
    assert_eq!(line(&online_out, "cvd"), uuid, "{online_out}");
    let online_pid = line(&online_out, "pid");
    let server = c.mps_log(NODE, 1, "server.log");
    assert!(
        server.contains(&format!("New client {online_pid} connected")),
        "the online job is no client of GPU 1's server:\n{server}"
    );
    c.scancel(&[online]);
    let end = c.wait(online, WAIT);
    let online_out = c.output_or_empty(online);
    assert!(
        online_out.contains("mode=online") && !online_out.contains("error="),
        "{end:?}\n{online_out}"
    );
    c.scancel(&[hold]);
    c.assert_no_drain();
}

/// `real-gpu/device-names` on the simulated GPU: its cases, its parsing and
/// its verdict, tested here so that the run on a lent GPU can be believed.
#[test]
fn the_device_names_check_runs_on_the_simulated_gpu() {
    let c = Cluster::get();
    let (out, stdout, stderr) = real_gpu_script(&c, "device-names", &[]);
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(
        last, "device_names=done gpus=2 gpu1_checked=yes as_documented=yes",
        "{stdout}{stderr}"
    );
    let cases = std::fs::read_to_string(out.join("device-names.txt")).unwrap();
    for (case, reached) in [
        ("gpu1-uuid", "yes"),
        ("gpu1-zero", "yes"),
        ("gpu1-unset", "yes"),
        ("gpu1-index", "no"),
        ("gpu0-other", "no"),
    ] {
        let line = cases
            .lines()
            .find(|l| l.starts_with(&format!("case={case} ")))
            .unwrap_or_else(|| panic!("no case {case}:\n{cases}"));
        assert_eq!(kv(line, "reached").as_deref(), Some(reached), "{line}");
    }
}

/// `real-gpu/two-users` on the simulated GPU: "shared" and "serialized"
/// come from the control log's own lines (a client that joined the
/// running server, one pushed to the pending list), not from timings, and
/// a flag the daemon prints its help for is not taken as present.
#[test]
fn the_two_users_check_judges_by_the_control_log() {
    let c = Cluster::get();
    let (_, stdout, stderr) = real_gpu_script(&c, "two-users", &["--duration", "3"]);
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(
        (
            kv(last, "multiuser_shared"),
            kv(last, "single_user_serialized")
        ),
        (Some("yes".into()), Some("yes".into())),
        "{stdout}{stderr}"
    );
    // The pipe directory as muxflow leaves it: the ACL's user served, the
    // other kept out of both the control program and the daemon.
    assert_eq!(
        (kv(last, "acl_shared"), kv(last, "acl_kept_out")),
        (Some("yes".into()), Some("yes".into())),
        "{stdout}{stderr}"
    );
    let versions = stdout
        .lines()
        .find(|l| l.starts_with("case=versions "))
        .unwrap_or_else(|| panic!("{stdout}"));
    // Whatever version the simulation has, a flag is present only where
    // the daemon came up with it.
    assert_eq!(
        kv(versions, "multiuser_flag").as_deref(),
        Some("yes"),
        "{versions}"
    );
}

/// Runs `real-gpu/<name> --out <scratch> --sim <the dev cluster> <args>`,
/// which must succeed: (its output directory, stdout, stderr).
fn real_gpu_script(c: &Cluster, name: &str, args: &[&str]) -> (std::path::PathBuf, String, String) {
    let out = c.scratch(name);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../real-gpu")
        .join(name);
    let mut cmd = std::process::Command::new(script);
    cmd.arg("--out")
        .arg(&out)
        .arg("--sim")
        .arg(&c.dir)
        .args(args);
    let (ok, stdout, stderr) = c.run(cmd);
    assert!(ok, "{name}: {stdout}{stderr}");
    (out, stdout, stderr)
}
