//! What a researcher sees of muxflow, tried as a user of the cluster
//! (`nobody`): at submit, an offline job without a GPU request is told it
//! gets one GPU and that the hold is muxflow's, an online job with zero
//! GPUs is refused with the fix; while it waits, squeue's Comment column
//! and `muxflow-report` say why, since when and what for (an array task by
//! its `A_T` name too), and `--mine` lists the user's jobs; while an online
//! job runs, its report names the offline jobs beside it, and an
//! administrator's `--gpu` view shows who shares the GPU.

use std::time::Duration;

use muxflow_tests::{decision, one_at_a_time, target, CancelNamed, Cluster};

const USER: &str = "nobody";
const WAIT: Duration = Duration::from_secs(60);

/// `muxflow-report args…` as `user` (None: root): (success, stdout, stderr).
fn report(c: &Cluster, user: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let program = target().join("muxflow-report");
    let mut cmd = match user {
        Some(u) => c.cmd_as(u, program.to_str().unwrap()),
        None => c.cmd(program.to_str().unwrap()),
    };
    cmd.args(args);
    c.run(cmd)
}

/// `sbatch args…` as `nobody`: (job id or None, sbatch's stderr).
fn submit(c: &Cluster, args: &[&str]) -> (Option<u32>, String) {
    let mut cmd = c.cmd_as(USER, "sbatch");
    cmd.args(["--parsable", "-o", "/dev/null"])
        .args(args)
        .args(["--wrap", "sleep 300"]);
    let (ok, out, err) = c.run(cmd);
    (ok.then(|| out.trim().parse().unwrap()), err)
}

/// squeue's Comment column of job `id`.
fn comment(c: &Cluster, id: u32) -> String {
    let mut cmd = c.cmd("squeue");
    cmd.args(["-h", "-j", &id.to_string(), "-O", "Comment:200"]);
    c.run(cmd).1.trim().to_string()
}

#[test]
fn a_user_is_told_at_submit_and_sees_why_a_job_waits() {
    let c = Cluster::get();
    let _turn = one_at_a_time();
    c.cancel_named("rv-");
    let _cancel = CancelNamed(&c, "rv-");

    // Zero GPUs for an online job: refused, with the fix; nothing queued.
    for zero in ["--gres=gpu:0", "--gpus=0"] {
        let (id, err) = submit(&c, &["--muxflow=online", zero, "--job-name", "rv-online0"]);
        assert_eq!(id, None, "{zero} accepted");
        assert!(
            err.contains("--muxflow=online with zero GPUs") && err.contains("--gres=gpu:1"),
            "{zero}: {err}"
        );
    }

    // No GPU request: one GPU, and said so; the hold is muxflow's, said
    // at submit and in the Comment column.
    let later = [
        "--muxflow=offline",
        "--begin=now+2hours",
        "--job-name",
        "rv-later",
    ];
    let (id, err) = submit(&c, &later);
    let job = id.unwrap_or_else(|| panic!("refused: {err}"));
    assert!(
        err.contains("no GPU requested: this offline job gets one GPU"),
        "{err}"
    );
    assert!(
        err.contains("held by muxflow until it places the job"),
        "{err}"
    );
    assert!(
        !c.admin_comment(job).contains("gpus="),
        "{}",
        c.admin_comment(job)
    );
    assert_eq!(comment(&c, job), "muxflow: held until placed on a GPU");
    // Asking for GPUs: no word about a default; a user's own comment kept.
    let (id, err) = submit(
        &c,
        &[&later[..], &["--gres=gpu:1", "--comment=my sweep 3"]].concat(),
    );
    let own = id.unwrap_or_else(|| panic!("refused: {err}"));
    assert!(!err.contains("no GPU requested"), "{err}");

    // Before the matcher looked: held by muxflow, since its submission.
    let (ok, out, err) = report(&c, Some(USER), &[&job.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("held by          muxflow, not you"), "{out}");
    assert!(out.contains("the matcher) looks at it"), "{out}");
    assert!(out.contains("since            20"), "{out}");

    // An array's task by its A_T name, before and after Slurm splits it.
    let (id, err) = submit(
        &c,
        &[
            "--muxflow=offline",
            "--begin=now+2hours",
            "--array=1-2",
            "--job-name",
            "rv-array",
        ],
    );
    let array = id.unwrap_or_else(|| panic!("refused: {err}"));
    let task = format!("{array}_1");
    let (ok, out, err) = report(&c, Some(USER), &[&task]);
    assert!(ok, "{task}: {out}{err}");
    assert!(out.contains("held by          muxflow"), "{out}");
    let (ok, _, err) = report(&c, Some(USER), &[&format!("{array}_9")]);
    assert!(
        !ok && err.contains(&format!("array task {array}_9")),
        "{err}"
    );

    // A round: the reason, since when and what for, in the AdminComment,
    // the report and the Comment (never over the user's own).
    c.matcher_once();
    assert!(
        c.admin_comment(job).contains("waiting=begin_time"),
        "{}",
        c.admin_comment(job)
    );
    let (ok, out, err) = report(&c, Some(USER), &[&job.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("why              Slurm starts it no earlier than its begin time"),
        "{out}"
    );
    assert!(out.contains("waits for        its begin time"), "{out}");
    assert!(out.contains("looked at        every "), "{out}");
    let (ok, json, err) = report(&c, Some(USER), &[&job.to_string(), "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["waiting"], "begin_time", "{json}");
    let since = v["since"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        comment(&c, job),
        format!(
            "muxflow: waiting since {since}: {}",
            muxflow::records::placement::Waiting::BeginTime.words()
        )
    );
    assert_eq!(comment(&c, own), "my sweep 3");
    // `scontrol release` by its owner: refused (the docs say why).
    let (ok, out) = c.scontrol_as(USER, &["release", &job.to_string()]);
    assert!(!ok, "{out}");

    // --mine: the user's own jobs, each with why it waits.
    let (ok, out, err) = report(&c, Some(USER), &["--mine"]);
    assert!(ok, "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("{job} ")))
        .unwrap_or_else(|| panic!("job {job} not in:\n{out}"));
    assert!(
        line.contains("waiting since") && line.contains("begin time"),
        "{line}"
    );
    assert!(out.contains(&format!("{array}_")), "{out}");
}

#[test]
fn a_running_online_jobs_report_and_its_gpu_name_the_jobs_beside_it() {
    let c = Cluster::get();
    let _turn = one_at_a_time();
    c.cancel_named("rvr-");
    let _cancel = CancelNamed(&c, "rvr-");
    let node = "node2";
    let (online, gpu) = c.online_workload("rvr-service", node, 0.2, 512);
    let script = format!("#!/bin/sh\n{}\n", c.workload("offline --duration 120"));
    let offline = c.offline_as_nobody("rvr-train", node, gpu, &script);
    c.wait_running(offline, WAIT);

    // The online job (root's: its owner and administrators see it).
    let (ok, out, err) = report(&c, None, &[&online.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("runs on          {node} GPU {gpu}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("shared now with  offline job {offline} (running)")),
        "{out}"
    );
    // The offline job, by its owner: its online partner, by ID.
    let (ok, out, err) = report(&c, Some(USER), &[&offline.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("shared now with  online job {online}")),
        "{out}"
    );
    assert!(
        !out.contains("rvr-service"),
        "a partner's name leaked:\n{out}"
    );

    // The GPU, for an administrator: both jobs, owners and names.
    let gpu_arg = format!("{node}:{gpu}");
    let (ok, out, err) = report(&c, None, &["--gpu", &gpu_arg]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("job {online} (root, rvr-service)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("job {offline} ({USER}, rvr-train)")),
        "{out}"
    );
    assert!(out.contains("offline work     "), "{out}");
    // Not for a user: it shows every user's jobs.
    let (ok, _, err) = report(&c, Some(USER), &["--gpu", &gpu_arg]);
    assert!(
        !ok && err.contains("administrators") && err.contains("--mine"),
        "{err}"
    );
}

#[test]
fn a_requeue_for_an_online_job_leaves_a_line_with_that_runs_figures() {
    let c = Cluster::get();
    let _turn = one_at_a_time();
    c.cancel_named("rvq-");
    let _cancel = CancelNamed(&c, "rvq-");
    let node = "node3";
    // Its first run lasts until the requeue; the run after it ends soon.
    let script = format!(
        "#!/bin/sh\nif [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ]; then exec {}; fi\nexec {}\n",
        c.workload("offline --duration 3"),
        c.workload("offline --duration 300")
    );
    let offline = c.offline_as_nobody("rvq-train", node, 0, &script);
    c.wait_running(offline, WAIT);
    c.wait_output(offline, "pid=", WAIT);
    // An online job that needs every GPU of the node requeues it.
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                "--gres=gpu:2",
                "-w",
                node,
                "--job-name",
                "rvq-serve",
            ],
            "#!/bin/sh\nexec sleep 300\n",
        )
        .unwrap();
    c.wait_requeued_held(offline, WAIT);
    let out = c.wait_output(offline, "muxflow: requeued", WAIT);
    let line = out
        .lines()
        .find(|l| l.contains("muxflow: requeued"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains(&format!("online job {online} needed GPU 0 of {node}")),
        "{line}"
    );
    assert!(
        line.contains("This run: ")
            && line.contains(" launches (")
            && line.contains("keeps them through its next runs"),
        "{line}"
    );
    // The figures of run 1 as the line gives them, which every report of
    // the job shows from now on: its length and launches.
    let figure = |before: &str| {
        line.split(before)
            .next()
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no '{before}' in {line}"))
            .to_string()
    };
    let run1 = format!(
        "run 1            {} s on {node} GPU 0, requeued for online job {online}: SM share",
        line.split("This run: ")
            .nth(1)
            .and_then(|l| l.split(' ').next())
            .unwrap_or_else(|| panic!("{line}"))
    );
    let launches = format!(", {} launches (", figure(" launches ("));
    let shows_run1 = |what: &str, out: &str| {
        assert!(
            out.contains(&run1) && out.contains(&launches),
            "{what}: {run1:?} and {launches:?} not in:\n{out}"
        );
    };
    // Held again: muxflow's hold, and run 1.
    let (ok, out, err) = report(&c, Some(USER), &[&offline.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("held by          muxflow"), "{out}");
    shows_run1("held after the requeue", &out);
    // The matcher writes its reason over the run's report, then places it
    // again: run 1 stays in each.
    let round = c.matcher_once();
    assert_eq!(
        decision(&round, offline)["waiting"],
        "begin_time",
        "{round}"
    );
    let (ok, out, err) = report(&c, Some(USER), &[&offline.to_string()]);
    assert!(ok, "{out}{err}");
    shows_run1("its reason written", &out);
    c.start_now(offline);
    let round = c.matcher_once();
    assert_eq!(decision(&round, offline)["action"], "place", "{round}");
    c.wait_running(offline, WAIT);
    let (ok, out, err) = report(&c, Some(USER), &[&offline.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("(run 2)"), "{out}");
    shows_run1("running again", &out);
    // Its second run's report (sacct's record of the job) keeps run 1.
    c.wait(offline, WAIT);
    let start = std::time::Instant::now();
    let out = loop {
        let (ok, out, err) = report(&c, Some(USER), &[&offline.to_string()]);
        if ok && out.contains("ran on ") {
            break out;
        }
        assert!(start.elapsed() < WAIT, "no report of run 2: {out}{err}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(out.contains(" (run 2)"), "{out}");
    shows_run1("finished", &out);

    // A job that ends otherwise gets no such line.
    c.scancel(&[online]);
    let plain = c.offline_as_nobody("rvq-short", node, 1, "#!/bin/sh\ntrue\n");
    c.wait(plain, WAIT);
    assert!(!c.output_or_empty(plain).contains("muxflow: requeued"));
}
