//! A stderr that does not drain does not stall evictions (issue 31, M2),
//! tried as the unprivileged user `nobody`: the job points its processes'
//! stderr at a pipe it filled and never reads, then starts two processes
//! without xCUDA (two: `[health] police_cancel_after`, 3, would cancel the
//! job at the third). The police tells each process why before evicting it,
//! by writing to its stderr; that write blocks. It used to be waited for
//! under the GPU's lock, process after process, each up to `[mps]
//! command_timeout_ms`: with that set to 10 minutes here, the evictions
//! would take twenty minutes. Now a pass waits for its writers together,
//! briefly, then evicts: both are gone within the test's usual wait.

use std::time::{Duration, Instant};

use muxflow_tests::{CancelNamed, Cluster};

const WAIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "mfs-";

/// Appends settings to the cluster's muxflow.toml until dropped.
struct ClusterConfig {
    path: std::path::PathBuf,
    before: String,
}

impl ClusterConfig {
    fn with(c: &Cluster, extra: &str) -> ClusterConfig {
        let path = c.dir.join("etc/muxflow.toml");
        let before = std::fs::read_to_string(&path).unwrap();
        for section in extra.lines().filter(|l| l.starts_with('[')) {
            assert!(!before.contains(section), "{section} already in {before}");
        }
        std::fs::write(&path, format!("{before}\n{extra}\n")).unwrap();
        ClusterConfig { path, before }
    }
}

impl Drop for ClusterConfig {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.before);
    }
}

#[test]
fn processes_with_a_full_stderr_are_all_evicted_without_waiting_on_it() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let node = "node1";
    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), node, 0.05, 1000);
    // Writers may block 10 minutes.
    let _config = ClusterConfig::with(&c, "[mps]\ncommand_timeout_ms = 600000");
    let workload = c.workload("offline --duration 120 --alloc-mib 256");
    let script = format!(
        "#!/bin/sh\n\
         F=/tmp/{PREFIX}$$; rm -f $F; mkfifo $F\n\
         # A reader that never reads, and 64 KiB: the pipe is full.\n\
         sleep 600 <$F &\n\
         exec 2>$F\n\
         head -c 65536 /dev/zero >&2\n\
         P=\n\
         for i in 1 2; do\n\
         (unset LD_PRELOAD; exec {workload}) &\n\
         P=\"$P $!\"\n\
         done\n\
         wait $P\n"
    );
    let offline = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &script);
    c.wait_running(offline, WAIT);
    let start = Instant::now();
    let pids: Vec<String> = loop {
        let out = c.output_or_empty(offline);
        let pids: Vec<String> = out
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("pid="))
            .map(str::to_string)
            .collect();
        if pids.len() >= 2 || start.elapsed() > WAIT {
            break pids;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(pids.len(), 2, "{}", c.output_or_empty(offline));
    let log_path = c.node_path(
        &format!("var/log/muxflow/{{node}}/mps/{gpu}/server.log"),
        node,
    );
    let start = Instant::now();
    let evicted = |log: &str| {
        pids.iter()
            .filter(|p| log.contains(&format!("Terminating client {p}")))
            .count()
    };
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if evicted(&log) == 2 || start.elapsed() > WAIT {
            break log;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(evicted(&log), 2, "pids {pids:?}:\n{log}");
    // (The evicted processes then block on their own full stderr: the job
    // is cancelled below.)
    assert_eq!(c.job_field(online, "JobState"), "RUNNING");
    c.scancel(&[offline, online]);
    c.wait(offline, WAIT);
    c.wait(online, WAIT);
    c.sim_load(node, gpu, 0.0);
    c.assert_no_drain();
}
