//! Preemption without lost work, on the dev cluster, as a user who is not
//! root (`nobody`): a simulated trainer that checkpoints when told to stop
//! (its weights copied off the GPU, then its step counter written) loses no
//! completed step across `scancel` and across a muxflow requeue for an
//! online job, on SIGTERM and on the `#SBATCH --signal` warning; a trainer
//! that ignores SIGTERM trains on with its GPU until xCUDA's stop deadline,
//! is released there, before Slurm's SIGKILL, and the GPU's next client is
//! served; the online job starts within its bound.
//!
//! The trainer (`muxflow-workload offline --checkpoint … --progress …`)
//! records every completed step in its progress file; its checkpoint holds
//! the step it saved. No completed step lost: both hold the same step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use muxflow_tests::{CancelNamed, Cluster};

const PREFIX: &str = "mfp-";
const USER: &str = "nobody";
const WAIT: Duration = Duration::from_secs(90);

/// A trainer's files, in a directory `nobody` can write.
struct Trainer {
    dir: PathBuf,
}

impl Trainer {
    fn new(c: &Cluster, name: &str) -> Trainer {
        use std::os::unix::fs::PermissionsExt;
        let dir = c.scratch(name);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        Trainer { dir }
    }

    /// The batch script: `sbatch_lines` (e.g. `#SBATCH --signal=…`), then
    /// the trainer exec'd as the batch shell itself (a `B:` warning reaches
    /// it; no shell without a `trap` dies of it).
    fn script(&self, c: &Cluster, sbatch_lines: &str, flags: &str) -> String {
        format!(
            "#!/bin/sh\n{sbatch_lines}echo pid=$$\nLD_LIBRARY_PATH={lib} exec {bin} offline --kernels-per-step 4 --kernel-us 200 --alloc-mib 16 --progress {d}/progress {flags}\n",
            lib = c.sim_lib_dir().display(),
            bin = c.sim_bin("muxflow-workload").display(),
            d = self.dir.display(),
        )
    }

    fn checkpointing(&self, c: &Cluster, sbatch_lines: &str, on: &[&str]) -> String {
        let on: String = on.iter().map(|s| format!(" --checkpoint-on {s}")).collect();
        self.script(
            c,
            sbatch_lines,
            &format!("--checkpoint {}/ckpt{on}", self.dir.display()),
        )
    }

    fn step_in(path: &Path) -> Option<u64> {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .strip_prefix("step=")?
            .parse()
            .ok()
    }

    fn progress(&self) -> u64 {
        Self::step_in(&self.dir.join("progress")).unwrap_or(0)
    }

    fn checkpoint(&self) -> Option<u64> {
        Self::step_in(&self.dir.join("ckpt"))
    }

    fn wait_steps(&self, c: &Cluster, id: u32, n: u64) {
        let start = std::time::Instant::now();
        while self.progress() < n {
            assert!(
                start.elapsed() < WAIT,
                "job {id} never completed {n} steps: {}",
                c.output_or_empty(id)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The checkpoint holds the last completed step.
    fn assert_no_step_lost(&self, c: &Cluster, id: u32, what: &str) -> u64 {
        let done = self.progress();
        let saved = self.checkpoint().unwrap_or_else(|| {
            panic!(
                "{what}: job {id} wrote no checkpoint ({done} steps completed): {}",
                c.output_or_empty(id)
            )
        });
        assert_eq!(
            saved,
            done,
            "{what}: job {id} completed {done} steps, its checkpoint holds {saved}: {}",
            c.output_or_empty(id)
        );
        saved
    }
}

fn submit(c: &Cluster, name: &str, script: &str) -> u32 {
    c.sbatch_as(
        USER,
        &[
            "--muxflow=offline",
            "--job-name",
            &format!("{PREFIX}{name}"),
        ],
        script,
    )
    .unwrap_or_else(|e| panic!("sbatch {name}: {e}"))
}

fn pid_of(c: &Cluster, id: u32) -> u32 {
    let out = c.wait_output(id, "pid=", WAIT);
    out.lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("job {id}: no pid in {out}"))
}

fn events(c: &Cluster, node: &str, gpu: u32) -> String {
    std::fs::read_to_string(c.node_path(
        &format!("sim/state/nodes/{{node}}/gpus/{gpu}/events.log"),
        node,
    ))
    .unwrap_or_default()
}

/// `scancel` (SIGTERM, then SIGKILL `KillWait` later): a trainer ignoring
/// SIGTERM keeps its GPU until the deadline and is released before the
/// SIGKILL; the GPU's next client, a trainer checkpointing on SIGTERM, is
/// served and saves every completed step.
#[test]
fn scancel_a_trainer_checkpoints_and_one_ignoring_sigterm_is_released_before_the_sigkill() {
    let c = Cluster::get();
    let _cleanup = CancelNamed(&c, "mfp-scancel-");
    let (node, gpu) = ("node4", 0);

    let ignoring = Trainer::new(&c, "preempt-ignore");
    let id = submit(
        &c,
        "scancel-ignore",
        &ignoring.script(&c, "", "--ignore-sigterm"),
    );
    c.place(id, node, gpu);
    c.wait_running(id, WAIT);
    let pid = pid_of(&c, id);
    ignoring.wait_steps(&c, id, 20);
    c.scancel(&[id]);
    c.wait(id, WAIT);
    let out = c.output_or_empty(id);
    // It was not released at the SIGTERM (it ignores it, and SIG_IGN is
    // respected) but at the deadline, which xCUDA says ...
    assert!(
        out.contains("releasing the GPU at the stop deadline"),
        "job {id}: {out}"
    );
    // ... after which its calls failed (the context gone), so it stopped there.
    assert!(out.contains(" error="), "job {id}: {out}");
    // Released before the SIGKILL: the driver saw the release, never a
    // client killed with its context.
    let ev = events(&c, node, gpu);
    assert!(ev.contains(&format!("pid={pid} event=released")), "{ev}");
    assert!(!ev.contains(&format!("pid={pid} event=pruned")), "{ev}");

    // The GPU's next client is served, and saves its work on SIGTERM.
    let saving = Trainer::new(&c, "preempt-term");
    let id = submit(&c, "scancel-term", &saving.checkpointing(&c, "", &["term"]));
    c.place(id, node, gpu);
    c.wait_running(id, WAIT);
    let pid = pid_of(&c, id);
    saving.wait_steps(&c, id, 20);
    c.scancel(&[id]);
    c.wait(id, WAIT);
    saving.assert_no_step_lost(&c, id, "scancel");
    let ev = events(&c, node, gpu);
    assert!(ev.contains(&format!("pid={pid} event=released")), "{ev}");
    assert!(!ev.contains(&format!("pid={pid} event=pruned")), "{ev}");
    c.assert_no_drain();
}

/// An online job lands on a node whose two GPUs run trainers of `nobody`:
/// one checkpoints on SIGTERM (the requeue's), one on the warning its
/// script asks for (`#SBATCH --signal=B:USR1@5`, sent by the online job's
/// Prolog before the requeue). Both are requeued (held) with every
/// completed step saved, the online job starts only once they are gone and
/// within its bound, and the first resumes from its checkpoint.
#[test]
fn a_muxflow_requeue_warns_each_trainer_and_none_loses_a_completed_step() {
    let c = Cluster::get();
    let _cleanup = CancelNamed(&c, "mfp-rq-");
    let node = "node3";

    let on_term = Trainer::new(&c, "preempt-rq-term");
    let term_job = submit(&c, "rq-term", &on_term.checkpointing(&c, "", &["term"]));
    let on_warning = Trainer::new(&c, "preempt-rq-usr1");
    let usr1_job = submit(
        &c,
        "rq-usr1",
        &on_warning.checkpointing(&c, "#SBATCH --signal=B:USR1@5\n", &["usr1"]),
    );
    let mut pids = Vec::new();
    for (id, gpu, t) in [(term_job, 0, &on_term), (usr1_job, 1, &on_warning)] {
        c.place(id, node, gpu);
        c.wait_running(id, WAIT);
        pids.push(pid_of(&c, id));
        t.wait_steps(&c, id, 20);
    }
    let online_script = format!(
        "#!/bin/sh\nif kill -0 {} 2>/dev/null || kill -0 {} 2>/dev/null; then echo offline-still-there; else echo offline-gone; fi\nexec sleep 300\n",
        pids[0], pids[1]
    );
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:2",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}rq-online"),
            ],
            &online_script,
        )
        .unwrap();
    for id in [term_job, usr1_job] {
        c.wait_requeued_held(id, WAIT);
    }
    // The online job's start bound: its Prolog waits at most
    // OFFLINE_EXIT_WAIT (45 s) for the offline jobs, warning included.
    c.wait_running(online, Duration::from_secs(45 + 30));
    let out = c.wait_output(online, "offline-", WAIT);
    assert!(
        out.contains("offline-gone"),
        "the online job started while an offline job still ran: {out}"
    );
    let saved = on_term.assert_no_step_lost(&c, term_job, "requeue, SIGTERM");
    on_warning.assert_no_step_lost(&c, usr1_job, "requeue, SIGUSR1 warning");
    let ev = events(&c, node, 0) + &events(&c, node, 1);
    for pid in &pids {
        assert!(ev.contains(&format!("pid={pid} event=released")), "{ev}");
        assert!(!ev.contains(&format!("pid={pid} event=pruned")), "{ev}");
    }

    // Placed again (the online job gone), the first resumes where it saved.
    c.scancel(&[online]);
    c.wait(online, WAIT);
    c.scancel(&[usr1_job]);
    c.place(term_job, node, 0);
    c.start_now(term_job);
    c.wait_running(term_job, WAIT);
    on_term.wait_steps(&c, term_job, saved + 10);
    c.scancel(&[term_job]);
    c.wait(term_job, WAIT);
    let out = c.output_or_empty(term_job);
    assert!(out.contains(&format!("resumed={saved} ")), "{out}");
    on_term.assert_no_step_lost(&c, term_job, "after the restart, scancel");
    c.assert_no_drain();
}
