//! An offline job inside a container (issue 18): enroot's hook
//! (etc/enroot/hooks.d/90-muxflow.sh) brings the MPS pipe directory, xCUDA
//! and the job's state into the container. enroot itself is not installed
//! here: the job runs the hook the way enroot does (ENROOT_MOUNTS and
//! ENROOT_ENVIRON files, the step's environment), then starts the workload
//! in a bubblewrap root that has only the system directories, the
//! simulated GPU's driver and device files (what NVIDIA's enroot hook
//! brings for a real GPU), and the hook's mounts and environment — none of
//! the host's muxflow paths otherwise. The checks are the node's: xCUDA
//! mapped in the process (/proc/PID/maps) and the process a client of the
//! GPU's MPS server (the fake server's log), and xCUDA's counters reaching
//! the job's AdminComment through the mounted stats directory.

use std::path::PathBuf;
use std::time::Duration;

use muxflow::records::report::JobReport;
use muxflow_tests::{xcuda_library, CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(60);

fn hook() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../etc/enroot/hooks.d/90-muxflow.sh")
}

/// The job script: the hook as enroot runs it, its fstab lines and
/// environment turned into bubblewrap's arguments, the workload inside.
fn container_script(c: &Cluster, workload_args: &str) -> String {
    let sim = c.dir.join("sim");
    format!(
        r#"#!/bin/bash
set -euo pipefail
m=$(mktemp) e=$(mktemp)
ENROOT_MOUNTS=$m ENROOT_ENVIRON=$e ENROOT_ROOTFS=/nonexistent bash {hook}
echo "hook mounts:"; cat "$m"
args=(--die-with-parent --proc /proc --dev /dev --tmpfs /tmp)
for d in /usr /bin /sbin /lib /lib64 /etc; do [[ -e $d ]] && args+=(--ro-bind "$d" "$d"); done
# The simulated GPU: its state (the device) and its driver and workload
# (links to the build tree: each target file alone, not the tree).
args+=(--bind {sim} {sim})
for f in {sim}/bin/* {sim}/lib/*; do t=$(readlink -f "$f"); args+=(--ro-bind "$t" "$t"); done
while read -r src dst _ opts; do
  case ,$opts, in
    *,ro,*) args+=(--ro-bind "$src" "$dst") ;;
    *) args+=(--bind "$src" "$dst") ;;
  esac
done <"$m"
while IFS= read -r kv; do args+=(--setenv "${{kv%%=*}}" "${{kv#*=}}"); done <"$e"
rm -f "$m" "$e"
# The host side of the container does not carry the job's preload: xCUDA
# comes in only through the hook.
exec env -u LD_PRELOAD bwrap "${{args[@]}}" -- \
  sh -c '[ -e {repo}/Cargo.toml ] && echo host-tree-visible; echo pid=$$; LD_LIBRARY_PATH={sim}/lib exec {sim}/bin/muxflow-workload {workload_args}'
"#,
        hook = hook().display(),
        repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .display(),
        sim = sim.display(),
    )
}

#[test]
fn an_offline_job_in_a_container_runs_under_xcuda_and_mps() {
    // The Slurm 24.11 dev cluster runs slurmd chrooted in a Debian root,
    // where bubblewrap cannot make its mounts ("Failed to make / slave": the
    // chroot's / is no mount point). The hook does not depend on Slurm's
    // release; this runs on the 22.05 cluster of the same CI run.
    if std::env::var_os("MUXFLOW_SLURM_ROOT").is_some() {
        eprintln!(
            "skipped on a chrooted Slurm root (bubblewrap cannot nest there); runs on Slurm 22.05"
        );
        return;
    }
    let c = Cluster::get();
    c.cancel_named("mfc-");
    let _cancel = CancelNamed(&c, "mfc-");
    let node = "node4";
    let (online, gpu) = c.online_workload("mfc-serve", node, 0.2, 512);
    let offline = c
        .sbatch(
            &["--muxflow=offline", "--job-name", "mfc-train"],
            &container_script(&c, "offline --duration 6"),
        )
        .unwrap();
    c.place(offline, node, gpu);
    let out = c.wait_output(offline, "pid=", WAIT);
    let pid: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in\n{out}"));
    let xcuda = xcuda_library();
    // The node's check: xCUDA is mapped in the process, at its host path.
    let mut maps = String::new();
    for _ in 0..50 {
        maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if maps.contains("libmuxflow_xcuda.so") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        maps.contains(xcuda.to_str().unwrap()),
        "xCUDA not mapped in the containerized process {pid}:\n{maps}\njob output:\n{}",
        c.output_or_empty(offline)
    );
    // Inside the container the host's tree is absent but for the mounts.
    assert!(!out.contains("host-tree-visible"), "{out}");

    let end = c.wait(offline, WAIT);
    assert_eq!(end.state, "COMPLETED", "{end:?}\n{}", c.output(offline));
    let log_dir = c.node_path(&format!("var/log/muxflow/{{node}}/mps/{gpu}"), node);
    let server_log = std::fs::read_to_string(log_dir.join("server.log")).unwrap();
    assert!(
        server_log.contains(&format!("New client {pid} connected")),
        "the containerized process never attached to the GPU's MPS server:\n{server_log}"
    );
    let line = c.sacct_until(offline, "AdminComment", |l| l.contains("launches="));
    let report = JobReport::decode(line.split('|').nth(1).unwrap()).unwrap();
    assert!(report.launches.unwrap_or(0) > 0, "{line}");
    assert_eq!(
        report.policed, None,
        "the node found nothing to police: {line}"
    );
    c.cancel_named("mfc-");
    let _ = c.wait(online, WAIT);
    c.assert_no_drain();
}

#[test]
fn the_hook_does_nothing_for_other_jobs_and_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (m, e) = (dir.path().join("mounts"), dir.path().join("environ"));
    let run = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(hook())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("ENROOT_MOUNTS", &m)
            .env("ENROOT_ENVIRON", &e);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // Not an offline step: nothing added.
    std::fs::write(&m, "").unwrap();
    let out = run(&[("MUXFLOW_MODE", "online")]);
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&m).unwrap(), "");
    // An offline step without xCUDA first in LD_PRELOAD: refused, named.
    let out = run(&[
        ("MUXFLOW_MODE", "offline"),
        ("LD_PRELOAD", "/usr/lib/libfoo.so"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("LD_PRELOAD") && err.contains("administrator"),
        "{err}"
    );
}
