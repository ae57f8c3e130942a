//! The job's own directory (issue 31, M3): where xCUDA's statistics and
//! the job's report files go, the user's to write. Tried as `nobody`: a
//! job that writes far more there than those files need, and a tree
//! thousands of levels deep. What it writes is bounded (a small tmpfs of
//! its own, not the state filesystem the node's records live on), and the
//! Epilog removes it all.

use std::time::Duration;

use muxflow_tests::Cluster;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn what_a_job_writes_in_its_own_directory_is_bounded_and_removed() {
    let c = Cluster::get();
    let node = "node1";
    let cfg = c.dir.join("etc/muxflow.toml");
    let ns = c.node_state(&cfg, node);
    // 64 MiB of data, then 3000 nested directories, in the directory of
    // $MUXFLOW_JOB_REPORT; says how far each got.
    let script = "#!/bin/sh\n\
        d=$(dirname \"$MUXFLOW_JOB_REPORT\")\n\
        dd if=/dev/zero of=\"$d/fill\" bs=1M count=64 2>/dev/null; echo fill-exit=$?\n\
        echo fill-mib=$(( $(stat -c %s \"$d/fill\") / 1048576 ))\n\
        rm -f \"$d/fill\"\n\
        ( cd \"$d\" && i=0 && while [ $i -lt 3000 ]; do mkdir a 2>/dev/null && cd a || break; i=$((i+1)); done; echo depth=$i )\n\
        echo dir=$d fs=$(stat -f -c %T \"$d\")\n";
    let id = c
        .sbatch(
            &[
                "--muxflow=online",
                muxflow_tests::AS_NOBODY,
                "--gres=gpu:1",
                "-w",
                node,
            ],
            script,
        )
        .unwrap();
    let end = c.wait(id, WAIT);
    let out = c.output_or_empty(id);
    assert_eq!(end.state, "COMPLETED", "{end:?}: {out}");
    let field = |k: &str| muxflow_tests::kv(&out.replace('\n', " "), k).unwrap_or_default();
    assert_ne!(field("fill-exit"), "0", "64 MiB fit: {out}");
    let mib: u64 = field("fill-mib").parse().unwrap();
    assert!(mib <= 16, "{out}");
    // The inodes are bounded too: the tree stopped before 3000 levels or
    // got there within them; either way it is gone below.
    assert!(!field("depth").is_empty(), "{out}");
    let dir = std::path::PathBuf::from(field("dir"));
    assert!(dir.starts_with(ns.dir()), "{dir:?}");
    // Its own filesystem, not the state filesystem (which shares its disk
    // with everything else here, so its use is no measure).
    assert_eq!(field("fs"), "tmpfs", "{out}");
    // The Epilog removed the directory and its mount.
    let start = std::time::Instant::now();
    while dir.exists() && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!dir.exists(), "{dir:?} left behind");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(&dir.to_string_lossy().to_string()),
        "{mounts}"
    );
    c.assert_no_drain();
}
