//! Helpers for the integration tests: they drive a running dev cluster
//! (`scripts/devcluster up`; `scripts/test` brings one up and runs these).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The dev cluster named by the environment `scripts/devcluster up` prints.
pub struct Cluster {
    pub dir: PathBuf,
    pub slurm_conf: PathBuf,
}

/// How a job ended, from `scontrol show job`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnd {
    pub state: String,
    pub exit_code: String,
    pub reason: String,
}

/// Job states after which a job is over.
pub const ENDED: [&str; 9] = [
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
];

/// sbatch's option submitting as user nobody, by uid: Slurm 26.05's sbatch
/// refuses `--uid=nobody` ("Invalid --uid specification") though its root
/// resolves the name (other names, and the uid, pass on every release).
pub const AS_NOBODY: &str = "--uid=65534";

/// Turns for the tests of one binary that change what every job of a node
/// or of the cluster sees (its config, a simulated driver mechanism, a
/// stopped slurmctld): the suite runs a binary's tests on several threads.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Cluster {
    /// The running dev cluster; panics with the fix when there is none.
    pub fn get() -> Cluster {
        let dir = std::env::var_os("MUXFLOW_DEV_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                panic!(
                    "no dev cluster: run scripts/test, or `scripts/devcluster up` and \
                 `source .devcluster/env` before `cargo test -p muxflow-tests`"
                )
            });
        let slurm_conf = dir.join("etc/slurm.conf");
        assert!(
            slurm_conf.is_file(),
            "{} missing: is the dev cluster up?",
            slurm_conf.display()
        );
        Cluster { dir, slurm_conf }
    }

    /// A Slurm client command pointed at this cluster.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.slurm_conf);
        c
    }

    /// Runs a command and returns (success, stdout, stderr).
    pub fn run(&self, mut cmd: Command) -> (bool, String, String) {
        let out: Output = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A fresh directory under the cluster for one test's files.
    pub fn scratch(&self, name: &str) -> PathBuf {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let d = self
            .dir
            .join("jobs")
            .join(format!("{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Submits `script` with `args`; Ok(job id) or Err(sbatch's stderr).
    /// Output goes to `<dir>/jobs/<id>.out`.
    pub fn sbatch(&self, args: &[&str], script: &str) -> Result<u32, String> {
        self.sbatch_with(self.cmd("sbatch"), args, script)
    }

    /// As [`sbatch`](Self::sbatch) with a prepared command (e.g. another SLURM_CONF).
    pub fn sbatch_with(
        &self,
        mut cmd: Command,
        args: &[&str],
        script: &str,
    ) -> Result<u32, String> {
        let dir = self.scratch("script");
        let path = dir.join("job.sh");
        std::fs::write(&path, script).unwrap();
        cmd.arg("--parsable")
            .arg(format!("--output={}/jobs/%j.out", self.dir.display()))
            .args(args)
            .arg(&path);
        let (ok, stdout, stderr) = self.run(cmd);
        if !ok {
            return Err(stderr);
        }
        let id = stdout.trim().split(';').next().unwrap_or("");
        Ok(id
            .parse()
            .unwrap_or_else(|_| panic!("sbatch printed '{stdout}'")))
    }

    /// `program` run as `user` (runuser: no shell, so accounts with a
    /// nologin shell such as `nobody` work), pointed at this cluster.
    /// On a cluster of another Slurm release (`devcluster up --slurm`),
    /// runuser runs inside its root, where that release's commands are.
    pub fn cmd_as(&self, user: &str, program: &str) -> Command {
        let mut c = match std::env::var_os("MUXFLOW_SLURM_ROOT") {
            Some(root) => {
                let mut c = Command::new(
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/in-slurm-root"),
                );
                c.arg(root).arg("runuser");
                c
            }
            None => Command::new("runuser"),
        };
        c.args(["-u", user, "--", "env"])
            .arg(format!("SLURM_CONF={}", self.slurm_conf.display()))
            .arg(program);
        c
    }

    /// Submits `script` as `user` (a real user submission: sbatch, the
    /// plugin's allocator context and job_submit.lua all see that user).
    pub fn sbatch_as(&self, user: &str, args: &[&str], script: &str) -> Result<u32, String> {
        self.sbatch_with(self.cmd_as(user, "sbatch"), args, script)
    }

    /// `scontrol <args>` as `user`: (success, stdout + stderr).
    pub fn scontrol_as(&self, user: &str, args: &[&str]) -> (bool, String) {
        let mut c = self.cmd_as(user, "scontrol");
        c.args(args);
        let (ok, out, err) = self.run(c);
        (ok, out + &err)
    }

    /// Waits until job `id` has ended.
    pub fn wait(&self, id: u32, timeout: Duration) -> JobEnd {
        let start = Instant::now();
        loop {
            let mut c = self.cmd("scontrol");
            c.args(["-o", "show", "job", &id.to_string()]);
            let (_, out, _) = self.run(c);
            let field = |k: &str| {
                out.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .unwrap_or("")
                    .to_string()
            };
            let state = field("JobState");
            if ENDED.contains(&state.as_str()) {
                return JobEnd {
                    state,
                    exit_code: field("ExitCode"),
                    reason: field("Reason"),
                };
            }
            assert!(
                start.elapsed() < timeout,
                "job {id} still {state} after {timeout:?}: {out}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The job's standard output.
    pub fn output(&self, id: u32) -> String {
        let p = self.dir.join("jobs").join(format!("{id}.out"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// `sacct` lines for job `id` (allocation only), waiting for slurmdbd to
    /// have the record with a final state.
    pub fn sacct(&self, id: u32, fields: &str) -> String {
        self.sacct_until(id, fields, |_| true)
    }

    /// As [`sacct`](Self::sacct), waiting until `done` accepts the line:
    /// slurmdbd fills a record in several messages (e.g. the job name can
    /// read "allocation" for a moment after the end state is stored).
    pub fn sacct_until(&self, id: u32, fields: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let mut c = self.cmd("sacct");
            c.args([
                "-n",
                "-X",
                "-P",
                "-j",
                &id.to_string(),
                "-o",
                &format!("State,{fields}"),
            ]);
            let (ok, out, err) = self.run(c);
            let state = out
                .split('|')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("");
            if ok && ENDED.contains(&state) && done(out.trim()) {
                return out.trim().to_string();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "sacct has no record of job {id}: {out}{err}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Nodes that are drained or draining, with their reasons.
    pub fn drained_nodes(&self) -> Vec<String> {
        let mut c = self.cmd("sinfo");
        c.args(["-h", "-N", "-o", "%N|%T|%E"]);
        let (_, out, _) = self.run(c);
        out.lines()
            .filter(|l| l.to_lowercase().contains("drain"))
            .map(str::to_string)
            .collect()
    }

    pub fn assert_no_drain(&self) {
        let d = self.drained_nodes();
        assert!(d.is_empty(), "nodes drained: {d:?}");
    }

    /// A copy of the cluster's slurm.conf in `dir` whose PlugStackConfig is
    /// `plugstack` (a client-side view: daemons keep the real one).
    pub fn client_conf_with_plugstack(&self, dir: &Path, plugstack: &str) -> PathBuf {
        std::fs::write(dir.join("plugstack.conf"), plugstack).unwrap();
        let conf = std::fs::read_to_string(&self.slurm_conf).unwrap();
        let conf: String = conf
            .lines()
            .map(|l| {
                if l.starts_with("PlugStackConfig=") {
                    format!("PlugStackConfig={}/plugstack.conf", dir.display())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let path = dir.join("slurm.conf");
        std::fs::write(&path, conf + "\n").unwrap();
        path
    }

    /// Submits with a client-side plugstack.conf of `plugstack` (see
    /// [`client_conf_with_plugstack`](Self::client_conf_with_plugstack)).
    pub fn sbatch_with_plugstack(
        &self,
        dir: &Path,
        plugstack: &str,
        args: &[&str],
        script: &str,
    ) -> Result<u32, String> {
        let conf = self.client_conf_with_plugstack(dir, plugstack);
        let mut cmd = self.cmd("sbatch");
        cmd.env("SLURM_CONF", &conf);
        self.sbatch_with(cmd, args, script)
    }

    /// Whether the cluster's Slurm names job cgroups by SLUID (26.05, whose
    /// default is not `CgroupJobIdPaths=yes`).
    pub fn names_job_cgroups_by_sluid(&self) -> bool {
        let mut cmd = self.cmd("scontrol");
        cmd.arg("--version");
        let (_, out, _) = self.run(cmd);
        let version = out
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (26, 5)
    }

    /// The plugin's path and config, as the cluster's plugstack.conf has them.
    pub fn plugstack_line(&self) -> (String, String) {
        let text = std::fs::read_to_string(self.dir.join("etc/plugstack.conf")).unwrap();
        // muxflow's line (the dev cluster's cgroup fixture may come first).
        let line = text
            .lines()
            .find(|l| l.contains("spank_muxflow"))
            .unwrap_or_else(|| panic!("no muxflow line in plugstack.conf:\n{text}"));
        let mut words = line.split_whitespace();
        let _required = words.next();
        let plugin = words.next().expect("plugin path").to_string();
        let config = words
            .find_map(|w| w.strip_prefix("config="))
            .expect("config=")
            .to_string();
        (plugin, config)
    }

    /// Where the simulated GPUs' fake driver libraries are.
    pub fn sim_lib_dir(&self) -> PathBuf {
        self.dir.join("sim/lib")
    }

    pub fn sim_bin(&self, name: &str) -> PathBuf {
        self.dir.join("sim/bin").join(name)
    }
}

impl Cluster {
    /// muxflow-matcher with this cluster's config.
    pub fn matcher(&self) -> Command {
        let mut cmd = self.cmd(target().join("muxflow-matcher").to_str().unwrap());
        cmd.arg("--config").arg(self.dir.join("etc/muxflow.toml"));
        cmd
    }

    /// One matcher round (`--once --json`): its summary and decisions.
    pub fn matcher_once(&self) -> serde_json::Value {
        let mut cmd = self.matcher();
        cmd.args(["--once", "--json"]);
        let (ok, out, err) = self.run(cmd);
        assert!(ok, "muxflow-matcher --once: {out}{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
}

/// Job `job`'s line of a matcher round ([`Cluster::matcher_once`]).
pub fn decision(round: &serde_json::Value, job: u32) -> serde_json::Value {
    round["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["job"] == job)
        .cloned()
        .unwrap_or_else(|| panic!("no decision for job {job}: {round}"))
}

impl Cluster {
    /// Places held offline job `id` on `node`'s GPU `gpu` the way
    /// muxflow-matcher does: only on a Healthy GPU (health steps with short
    /// dwell times until it is: an earlier test may have left it Faulty),
    /// then the hint and its AdminComment, then the release.
    pub fn place(&self, id: u32, node: &str, gpu: u32) {
        self.place_slots(id, node, gpu, 1);
    }

    /// [`place`](Self::place) with `slots` of the GPU's offline slots
    /// (`mfslot:g<gpu>:<slots>`, as the matcher writes for a job it puts
    /// alone on a GPU: all `[policy] offline_per_gpu` of them).
    pub fn place_slots(&self, id: u32, node: &str, gpu: u32, slots: u32) {
        self.wait_gpu_healthy(node, gpu);
        self.write_placement_slots(id, node, gpu, slots);
    }

    /// Steps `node` (test dwell times) until GPU `gpu` is Healthy.
    pub fn wait_gpu_healthy(&self, node: &str, gpu: u32) {
        let cfg = self.health_config(
            "settle",
            "min_dwell_s = 1\nrecovery_quiet_s = 1\nxid_watch_ms = 0\n",
        );
        let ns = self.node_state(&cfg, node);
        self.step_until(&cfg, node, &format!("{node} gpu{gpu} healthy"), || {
            ns.health(gpu).ok().flatten() == Some(muxflow::policy::health::HealthState::Healthy)
        });
    }

    /// A file of the MPS log directory of `node`'s GPU `gpu` (the cluster's
    /// `mps_log_root`); empty when there is none yet.
    pub fn mps_log(&self, node: &str, gpu: u32, file: &str) -> String {
        let path = self
            .node_path("var/log/muxflow/{node}/mps", node)
            .join(gpu.to_string())
            .join(file);
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Waits (up to `wait`) until `node`'s GPU `gpu` has no MPS daemon (the
    /// Epilog of its last muxflow job stops it), so the next job's Prolog
    /// starts one with the test's settings.
    pub fn wait_mps_daemon_gone(&self, node: &str, gpu: u32, wait: Duration) {
        let control = self
            .node_path("var/run/muxflow/{node}/mps", node)
            .join(gpu.to_string())
            .join("control");
        let start = Instant::now();
        while control.exists() {
            assert!(
                start.elapsed() < wait,
                "{node} gpu{gpu}: the MPS daemon outlived its last job ({})",
                control.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Submits `script` as `nobody` in offline mode, named `name`, and
    /// places it on `node`'s GPU `gpu` (beside the online job there).
    pub fn offline_as_nobody(&self, name: &str, node: &str, gpu: u32, script: &str) -> u32 {
        let id = self
            .sbatch(
                &["--muxflow=offline", AS_NOBODY, "--job-name", name],
                script,
            )
            .unwrap_or_else(|e| panic!("sbatch {name}: {e}"));
        self.place(id, node, gpu);
        id
    }

    /// [`wait_gpu_healthy`](Self::wait_gpu_healthy) for every GPU of the
    /// 4-node dev cluster (2 simulated GPUs each): an earlier test may have
    /// left one Faulty.
    pub fn wait_all_gpus_healthy(&self) {
        for node in ["node1", "node2", "node3", "node4"] {
            for g in 0..2 {
                self.wait_gpu_healthy(node, g);
            }
        }
    }

    /// The matcher's placement of job `id`, written whatever the GPU's
    /// health (as when the GPU turns unhealthy between placement and start).
    pub fn write_placement(&self, id: u32, node: &str, gpu: u32) {
        self.write_placement_slots(id, node, gpu, 1);
    }

    /// [`write_placement`](Self::write_placement) with `slots` of the GPU's
    /// offline slots.
    pub fn write_placement_slots(&self, id: u32, node: &str, gpu: u32, slots: u32) {
        // As the matcher: the job's refusals and earlier runs so far stay.
        let prior = muxflow::records::admin_comment::AdminComment::parse(&self.admin_comment(id));
        let (refusals, earlier) = prior
            .map(|c| (c.refusals(), c.runs_before()))
            .unwrap_or_default();
        let mut c = self.cmd("scontrol");
        c.args([
            "update",
            &format!("JobId={id}"),
            &format!("ReqNodeList={node}"),
            &format!("Gres=mfslot:g{gpu}:{slots}"),
            &format!(
                "AdminComment={}",
                muxflow::records::placement::Placement::Gpu {
                    node: node.to_string(),
                    gpu
                }
                .admin_comment(refusals, &earlier)
            ),
        ]);
        let (ok, out, err) = self.run(c);
        assert!(ok, "placing job {id}: {out}{err}");
        let mut c = self.cmd("scontrol");
        c.args(["release", &id.to_string()]);
        let (ok, out, err) = self.run(c);
        assert!(ok, "releasing job {id}: {out}{err}");
    }

    /// `scontrol show job` field `key` of job `id`.
    pub fn job_field(&self, id: u32, key: &str) -> String {
        let mut c = self.cmd("scontrol");
        c.args(["-o", "show", "job", &id.to_string()]);
        let (_, out, _) = self.run(c);
        kv(&out, key).unwrap_or_default()
    }

    /// Job `id`'s AdminComment (its value holds spaces, so not through
    /// [`job_field`](Self::job_field)).
    pub fn admin_comment(&self, id: u32) -> String {
        let mut c = self.cmd("scontrol");
        c.args(["show", "job", &id.to_string()]);
        let (_, out, _) = self.run(c);
        muxflow_slurm::cli::parse_admin_comment(&out).unwrap_or_default()
    }

    /// Waits until job `id` is back in the queue, held, after a refused
    /// start (what the plugin does with an offline job the node refused);
    /// returns its output of the refused start.
    pub fn wait_requeued_held(&self, id: u32, timeout: Duration) -> String {
        self.wait_requeued_held_times(id, 1, timeout)
    }

    /// [`wait_requeued_held`](Self::wait_requeued_held) for the job's
    /// `times`-th requeue.
    pub fn wait_requeued_held_times(&self, id: u32, times: u32, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let restarts: u32 = self.job_field(id, "Restarts").parse().unwrap_or(0);
            let state = self.job_field(id, "JobState");
            if restarts >= times && state == "PENDING" {
                let reason = self.job_field(id, "Reason");
                assert!(
                    reason.contains("held") || reason.contains("Held"),
                    "{reason}"
                );
                return self.output_or_empty(id);
            }
            assert!(
                !ENDED.contains(&state.as_str()),
                "job {id} ended ({state}) instead of going back to the queue: {}",
                self.output_or_empty(id)
            );
            assert!(
                start.elapsed() < timeout,
                "job {id} still {state} (restarts {restarts}) after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// An offline job as users submit it (`sleep 300`), held by
    /// job_submit.lua until the matcher places it.
    pub fn offline_parked(&self, name: &str) -> u32 {
        let id = self
            .sbatch(
                &["--muxflow=offline", "--job-name", name],
                "#!/bin/sh\nsleep 300\n",
            )
            .unwrap_or_else(|e| panic!("sbatch {name}: {e}"));
        assert_eq!(
            self.job_field(id, "Reason"),
            "JobHeldUser",
            "job {id} not parked"
        );
        id
    }

    /// Cancels every queued or running job whose name starts with `prefix`
    /// (what a test's earlier run may have left).
    pub fn cancel_named(&self, prefix: &str) {
        let mut cmd = self.cmd("squeue");
        cmd.args(["-h", "-o", "%i %j"]);
        let (_, out, _) = self.run(cmd);
        let ids: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, n)| n.starts_with(prefix))
            .map(|(i, _)| i)
            .collect();
        if !ids.is_empty() {
            let mut cmd = self.cmd("scancel");
            cmd.args(&ids);
            self.run(cmd);
        }
    }

    /// Cancels jobs `ids` (`scancel`; one already gone is no error).
    pub fn scancel(&self, ids: &[u32]) {
        let mut cmd = self.cmd("scancel");
        cmd.args(ids.iter().map(u32::to_string));
        self.run(cmd);
    }

    /// Lets a requeued job start now: Slurm 22.05 gives a requeued batch
    /// job a later BeginTime (about two minutes), which tests do not wait for.
    /// That delay lets slurmd finish the previous start first; seen here, a
    /// job started again about 1 s after its requeue was launched without
    /// its Prolog (muxflow then refuses it again, safely, as unrecorded). So
    /// the delay is cut to a few seconds, not to nothing.
    pub fn start_now(&self, id: u32) {
        std::thread::sleep(Duration::from_secs(3));
        let mut c = self.cmd("scontrol");
        c.args(["update", &format!("JobId={id}"), "StartTime=now"]);
        let (ok, out, err) = self.run(c);
        assert!(ok, "StartTime=now for job {id}: {out}{err}");
    }

    /// Waits until job `id` is RUNNING; returns its node.
    pub fn wait_running(&self, id: u32, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let state = self.job_field(id, "JobState");
            if state == "RUNNING" {
                return self.job_field(id, "NodeList");
            }
            assert!(
                !ENDED.contains(&state.as_str()),
                "job {id} ended ({state}) before running: {}",
                self.output_or_empty(id)
            );
            assert!(
                start.elapsed() < timeout,
                "job {id} still {state} after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The job's output so far ("" if none yet).
    pub fn output_or_empty(&self, id: u32) -> String {
        std::fs::read_to_string(self.dir.join("jobs").join(format!("{id}.out"))).unwrap_or_default()
    }

    /// Waits until the job's output contains `needle`; returns the output.
    pub fn wait_output(&self, id: u32, needle: &str, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let out = self.output_or_empty(id);
            if out.contains(needle) {
                return out;
            }
            assert!(
                start.elapsed() < timeout,
                "job {id} never printed '{needle}':\n{out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A node's per-node directory (`{node}` paths of the dev config).
    pub fn node_path(&self, rel: &str, node: &str) -> PathBuf {
        self.dir.join(rel.replace("{node}", node))
    }

    /// The UUID of `node`'s simulated GPU `gpu` (what NVML reports).
    pub fn gpu_uuid(&self, node: &str, gpu: u32) -> String {
        let path = self.node_path(
            &format!("sim/state/nodes/{{node}}/gpus/{gpu}/config.toml"),
            node,
        );
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines()
            .find_map(|l| l.trim().strip_prefix("uuid = "))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| panic!("no uuid in {}", path.display()))
    }

    /// A job script line that runs the simulated-GPU workload with `args`,
    /// printing its pid first (`pid=N`) so tests can find it in MPS logs.
    pub fn workload(&self, args: &str) -> String {
        format!(
            "sh -c 'echo pid=$$; LD_LIBRARY_PATH={lib} exec {bin} {args}'",
            lib = self.sim_lib_dir().display(),
            bin = self.sim_bin("muxflow-workload").display()
        )
    }
}

/// Whether process `pid` runs (exists and is no zombie: a container's init
/// may not reap the straggler it inherited).
pub fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest.trim_start());
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

/// Makes `dir` writable by every user (a job of `nobody` writes there).
pub fn open_to_all(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
}

/// Cancels the jobs whose names start with its prefix when dropped, so a
/// test's long-running jobs go however the test ends.
pub struct CancelNamed<'a>(pub &'a Cluster, pub &'static str);

impl Drop for CancelNamed<'_> {
    fn drop(&mut self) {
        self.0.cancel_named(self.1);
    }
}

/// The directory of the workspace's built programs (`MUXFLOW_TARGET`).
pub fn target() -> PathBuf {
    std::env::var_os("MUXFLOW_TARGET")
        .map(PathBuf::from)
        .expect("MUXFLOW_TARGET (source the dev cluster's env)")
}

/// The xCUDA library the cluster's muxflow.toml names (`paths.xcuda_library`):
/// the build's, or a copy in the cluster's directory where the checkout
/// lies below a directory others can write (scripts/devcluster).
pub fn xcuda_library() -> PathBuf {
    std::env::var_os("MUXFLOW_XCUDA_LIBRARY")
        .map(PathBuf::from)
        .expect("MUXFLOW_XCUDA_LIBRARY (source the dev cluster's env)")
}

/// Simulated GPUs and the node health checks, driven the way slurmd and an
/// operator would.
impl Cluster {
    /// Runs `simgpu-ctl <args>`; panics with its output on failure.
    pub fn simgpu(&self, args: &[&str]) {
        let mut cmd = Command::new(target().join("simgpu-ctl"));
        cmd.args(args);
        let (ok, out, err) = self.run(cmd);
        assert!(ok, "simgpu-ctl {args:?}: {out}{err}");
    }

    /// `simgpu-ctl <verb> <state> --node N --gpu G <rest>`.
    fn simgpu_on(&self, verb: &str, node: &str, gpu: u32, rest: &[&str]) {
        let dir = self.dir.join("sim/state");
        let gpu = gpu.to_string();
        let mut args = vec![verb, dir.to_str().unwrap(), "--node", node, "--gpu", &gpu];
        args.extend_from_slice(rest);
        self.simgpu(&args);
    }

    /// A constant external load (fraction of SMs busy) on a simulated GPU.
    pub fn sim_load(&self, node: &str, gpu: u32, fraction: f64) {
        self.simgpu_on("load", node, gpu, &[&fraction.to_string()]);
    }

    /// Injects a fault: `["xid", "31"]`, `["lost"]`, `["clear"]`, `["sticky"]`.
    pub fn sim_fault(&self, node: &str, gpu: u32, what: &[&str]) {
        self.simgpu_on("fault", node, gpu, what);
    }

    /// The cluster's muxflow.toml plus a `[health]` section, for health
    /// steps with test dwell times.
    pub fn health_config(&self, name: &str, health: &str) -> PathBuf {
        let base = std::fs::read_to_string(self.dir.join("etc/muxflow.toml")).unwrap();
        assert!(!base.contains("[health]"), "cluster config has [health]");
        let path = self.scratch(name).join("muxflow.toml");
        std::fs::write(&path, format!("{base}\n[health]\n{health}\n")).unwrap();
        path
    }

    /// `muxflow-health` for `node` as slurmd runs it (SLURMD_NODENAME).
    /// The pid of `node`'s slurmd on another release's cluster, which runs
    /// each slurmd chrooted in a mount namespace of its own
    /// (scripts/in-slurm-root): the Prolog's mounts (a job's own directory)
    /// and its default node log are there. None on the host's release.
    fn slurmd_in_root(&self, node: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(format!("run/slurmd.{node}.pid")))
            .ok()
            .filter(|_| self.dir.join("slurm-root").exists())
            .map(|p| p.trim().to_string())
    }

    /// `path` as `node`'s programs see it (see [`Self::slurmd_in_root`]).
    pub fn node_view(&self, node: &str, path: &Path) -> PathBuf {
        match self.slurmd_in_root(node) {
            Some(pid) => Path::new("/proc")
                .join(pid)
                .join("root")
                .join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    }

    pub fn health_cmd(&self, config: &Path, node: &str) -> Command {
        let program = target().join("muxflow-health");
        // On another release's cluster, in the node's slurmd namespace and
        // root, as slurmd runs it.
        let mut cmd = match self.slurmd_in_root(node) {
            Some(pid) => {
                let mut c = self.cmd("nsenter");
                c.args(["-t", &pid, "-m", "-r", "--"]).arg(&program);
                c
            }
            None => self.cmd(program.to_str().unwrap()),
        };
        cmd.arg("--config")
            .arg(config)
            .env("SLURMD_NODENAME", node)
            .env("MUXFLOW_LOG", "info");
        cmd
    }

    /// One health step for `node`; returns its log.
    pub fn health_step(&self, config: &Path, node: &str) -> String {
        let (ok, out, err) = self.run(self.health_cmd(config, node));
        assert!(ok, "muxflow-health {node} failed: {out}{err}");
        err
    }

    /// `node`'s (state, drain reason) as sinfo shows them.
    pub fn node_reason(&self, node: &str) -> (String, String) {
        let mut cmd = self.cmd("sinfo");
        cmd.args(["-h", "-N", "-n", node, "-O", "StateLong:30,Reason:200"]);
        let (_, out, _) = self.run(cmd);
        let out = out.trim().to_string();
        let (state, reason) = out.split_once(char::is_whitespace).unwrap_or((&out, ""));
        (state.to_string(), reason.trim().to_string())
    }

    /// An offline training workload (120 s of 4 × 200 µs kernels per step)
    /// named `name`, placed on `node`/`gpu` as the matcher would, running.
    pub fn offline_running(&self, name: &str, node: &str, gpu: u32, wait: Duration) -> u32 {
        let script = format!(
            "#!/bin/sh\n{}\n",
            self.workload("offline --duration 120 --kernels-per-step 4 --kernel-us 200")
        );
        let offline = self
            .sbatch(&["--muxflow=offline", "--job-name", name], &script)
            .unwrap();
        self.place(offline, node, gpu);
        self.wait_running(offline, wait);
        offline
    }

    /// The node's GPU states as published in Slurm (node Extra).
    pub fn published(&self, node: &str) -> Vec<muxflow::records::published::GpuPublished> {
        let mut c = self.cmd("sinfo");
        c.args(["-h", "-N", "-n", node, "-O", "Extra:4096"]);
        let (ok, out, err) = self.run(c);
        assert!(ok, "{err}");
        muxflow::records::published::decode(out.trim()).unwrap_or_else(|e| panic!("{e}: '{out}'"))
    }

    /// GPU `gpu` of `node` as published.
    pub fn published_gpu(&self, node: &str, gpu: u32) -> muxflow::records::published::GpuPublished {
        let p = self.published(node);
        p.iter()
            .find(|g| g.index == gpu)
            .cloned()
            .unwrap_or_else(|| panic!("{node} gpu{gpu} not published: {p:?}"))
    }

    /// Offline job `job`'s xCUDA counters on `node`, summed over its
    /// processes' stats files: (launches, delayed). A launch the queue held
    /// for the online job's request counts as delayed.
    pub fn xcuda_counters(&self, config: &Path, node: &str, job: u32) -> (u64, u64) {
        let dir = self.node_view(node, &self.node_state(config, node).xcuda_stats_dir(job));
        let (mut launches, mut delayed) = (0, 0);
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !e.file_name().to_string_lossy().starts_with("xcuda.") {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let n = |k| {
                kv(&text, k)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            launches += n("launches");
            delayed += n("delayed");
        }
        (launches, delayed)
    }

    /// `node`'s muxflow state directory (per-GPU health, job registry).
    pub fn node_state(&self, config: &Path, node: &str) -> muxflow::node::state::NodeState {
        let cfg = muxflow::Config::load(config)
            .unwrap()
            .for_node(node)
            .unwrap();
        muxflow::node::state::NodeState::new(cfg.paths.state_dir.as_path())
    }
}

/// Jobs on the simulated GPUs.
impl Cluster {
    /// `GRES=` of the job's first node in `scontrol -d show job`
    /// (e.g. `gpu:1(IDX:0)`, `mfslot:g1:1(IDX:1)`).
    pub fn gres_detail(&self, id: u32) -> String {
        let mut c = self.cmd("scontrol");
        c.args(["-d", "show", "job", &id.to_string()]);
        let (_, out, _) = self.run(c);
        out.split_whitespace()
            .find_map(|w| w.strip_prefix("GRES="))
            .unwrap_or("")
            .to_string()
    }

    /// A running `--muxflow=online` workload on `node` that keeps `sm` of
    /// its GPU busy (an external load on the simulated GPU) and holds
    /// `mem_mib`; returns (job, GPU index Slurm gave it).
    pub fn online_workload(&self, name: &str, node: &str, sm: f64, mem_mib: u64) -> (u32, u32) {
        self.online_workload_as(name, node, sm, mem_mib, &[])
    }

    /// [`online_workload`](Self::online_workload) with more sbatch
    /// arguments (`AS_NOBODY`: the service is nobody's).
    pub fn online_workload_as(
        &self,
        name: &str,
        node: &str,
        sm: f64,
        mem_mib: u64,
        more: &[&str],
    ) -> (u32, u32) {
        // Slurm picks the GPU: load both, then take the load off the other.
        for g in 0..2 {
            self.sim_load(node, g, sm);
        }
        let script = format!(
            "#!/bin/sh\n{}\n",
            self.workload(&format!("online --rate 20 --alloc-mib {mem_mib}"))
        );
        let mut args = vec![
            "--muxflow=online",
            "--gres=gpu:1",
            "-w",
            node,
            "--job-name",
            name,
        ];
        args.extend_from_slice(more);
        let id = self
            .sbatch(&args, &script)
            .unwrap_or_else(|e| panic!("sbatch {name}: {e}"));
        let wait = Duration::from_secs(60);
        self.wait_running(id, wait);
        self.wait_output(id, "pid=", wait);
        let gres = self.gres_detail(id);
        let idx: u32 = gres
            .strip_prefix("gpu:1(IDX:")
            .and_then(|s| s.strip_suffix(')'))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("job {id}: GRES '{gres}'"));
        self.sim_load(node, 1 - idx, 0.0);
        (id, idx)
    }

    /// Holds every GPU of the cluster that no job holds now with a plain
    /// GPU job (no muxflow, `sleep 600`, named `name`), running before this
    /// returns; returns their ids. Idle GPUs take offline work (issue 15):
    /// a test that wants only its online GPUs to be candidates fills the
    /// rest this way (a GPU held by a job muxflow does not manage is no
    /// candidate). Cancel them with [`cancel_named`](Self::cancel_named).
    pub fn hold_free_gpus(&self, name: &str) -> Vec<u32> {
        let mut cmd = self.cmd("sinfo");
        cmd.args(["-h", "-N", "-O", "NodeList:20,Gres:60,GresUsed:80"]);
        let (ok, out, err) = self.run(cmd);
        assert!(ok, "sinfo: {out}{err}");
        let gpus = |field: &str| -> u32 {
            field
                .split(',')
                .find_map(|g| g.strip_prefix("gpu:"))
                .and_then(|n| n.split('(').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let mut ids = Vec::new();
        for line in out.lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let [node, total, used] = cols[..] else {
                panic!("sinfo line '{line}'")
            };
            for _ in gpus(used)..gpus(total) {
                let id = self
                    .sbatch(
                        &["--gres=gpu:1", "-w", node, "--job-name", name],
                        "#!/bin/sh\nexec sleep 600\n",
                    )
                    .unwrap_or_else(|e| panic!("sbatch {name} on {node}: {e}"));
                ids.push(id);
            }
        }
        for &id in &ids {
            self.wait_running(id, Duration::from_secs(60));
        }
        ids
    }

    /// Steps `node` until GPU `gpu` is published Healthy with its online
    /// job's solo figures measured (at least `mem_mib` of memory in use).
    pub fn settle_healthy(&self, config: &Path, node: &str, gpu: u32, mem_mib: u64) {
        self.step_until(
            config,
            node,
            &format!("{node} gpu{gpu} healthy with solo figures"),
            || {
                self.published(node).into_iter().any(|g| {
                    g.index == gpu
                        && g.state == muxflow::policy::health::HealthState::Healthy
                        && g.solo_sm_pct.is_some()
                        && g.online_mem_mib.unwrap_or(0) >= mem_mib
                })
            },
        );
    }

    /// What a failed wait on `node` needs to be understood: the jobs its
    /// state directory records per GPU, Slurm's jobs there, and the
    /// simulated GPUs' clients with their processes.
    pub fn node_picture(&self, config: &Path, node: &str) -> String {
        let ns = self.node_state(config, node);
        let mut out = String::new();
        for gpu in ns.gpus().unwrap_or_default() {
            out += &format!("recorded on gpu{gpu}: {:?}\n", ns.jobs(gpu));
        }
        let mut q = self.cmd("squeue");
        q.args(["-h", "-w", node, "-o", "%A %j %T"]);
        out += &format!("squeue -w {node}:\n{}", self.run(q).1);
        let mut t = Command::new(target().join("simgpu-ctl"));
        t.arg("table").arg(self.dir.join("sim/state"));
        let table = self.run(t).1;
        out += &table;
        for pid in table
            .lines()
            .filter(|l| l.starts_with(node))
            .filter_map(|l| l.split_once('[').map(|(_, clients)| clients))
            .flat_map(|clients| clients.split([']', ',', ' ']))
            .filter_map(|w| w.split(':').next()?.parse::<u32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_else(|e| format!("({e})"));
            out += &format!("pid {pid}: {cmdline}\n");
        }
        out
    }

    /// Runs health steps on `node` until `done()` holds (it may also be a
    /// step slurmd runs meanwhile that gets it there); returns the last
    /// step's log. Panics naming `what` after 60 s.
    pub fn step_until(
        &self,
        config: &Path,
        node: &str,
        what: &str,
        mut done: impl FnMut() -> bool,
    ) -> String {
        let start = Instant::now();
        // What every step decided, so a failure shows how the GPUs got to
        // where they are, not only the last step.
        // (message without its timestamp, first seen at, times seen)
        let mut history: Vec<(String, f64, u32)> = Vec::new();
        loop {
            let log = self.health_step(config, node);
            if done() {
                return log;
            }
            let at = start.elapsed().as_secs_f64();
            for line in log.lines().filter(|l| {
                l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("health changed")
            }) {
                let message = line.split_once(' ').map_or(line, |(_, m)| m).trim();
                match history.iter_mut().find(|(m, _, _)| m == message) {
                    Some((_, _, n)) => *n += 1,
                    None => history.push((message.to_string(), at, 1)),
                }
            }
            if start.elapsed() >= Duration::from_secs(60) {
                let history: String = history
                    .iter()
                    .map(|(m, at, n)| format!("+{at:.1}s ({n}x) {m}\n"))
                    .collect();
                panic!(
                    "never reached: {what}; published {:?}\nwarnings and changes of every step:\n{history}\nlast step:\n{log}\n{}",
                    self.published(node),
                    self.node_picture(config, node)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// A line `key=value ...` as a lookup.
pub fn kv(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// Rewrites the file at `path` through `f`.
pub fn edit(path: &Path, f: impl Fn(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(text)).unwrap();
}

/// Replaces every `key = …` line of a muxflow.toml.
pub fn set_key(toml: &Path, key: &str, value: &str) {
    edit(toml, |t| {
        t.lines()
            .map(|l| {
                if l.starts_with(&format!("{key} =")) {
                    format!("{key} = \"{value}\"")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    });
}
