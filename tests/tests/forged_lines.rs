//! A muxflow job's name, comment and paths cannot forge the lines the node
//! reads (its offline slots, its placement) from `scontrol show job -d`:
//! a line break in any of them is refused at submit, naming the field, and
//! on a later `scontrol update` by the user; a forged slot line that gets
//! through anyway (a field set by an operator) makes the job unreadable,
//! never a holder of slots it was not given. As the user `nobody`.

use muxflow_tests::Cluster;

const USER: &str = "nobody";

fn sbatch_nobody(c: &Cluster, args: &[&str]) -> (bool, String, String) {
    let mut cmd = c.cmd_as(USER, "sbatch");
    // Kept from running by a begin time (a hold is refused for an
    // offline job: it looks like muxflow's own parking).
    cmd.args(["--parsable", "--begin=now+1hour"])
        .args(args)
        .args(["--wrap", "echo ran"]);
    c.run(cmd)
}

#[test]
fn a_line_break_in_a_muxflow_jobs_name_comment_or_path_is_refused_at_submit() {
    let c = Cluster::get();
    let forged = "train\n     Nodes=node4 CPU_IDs=0 Mem=0 GRES=mfslot:g0:1(IDX:0)";
    let out = "--output=/dev/null\n     Nodes=node4 GRES=mfslot:g1:1(IDX:1)".to_string();
    // (arguments, the option the refusal names)
    let cases: [(Vec<String>, &str); 4] = [
        (
            vec!["--muxflow=offline".into(), format!("--job-name={forged}")],
            "--job-name",
        ),
        (
            vec!["--muxflow=offline".into(), format!("--comment={forged}")],
            "--comment",
        ),
        (vec!["--muxflow=offline".into(), out], "--output"),
        (
            vec![
                "--muxflow=online".into(),
                "--gres=gpu:1".into(),
                format!("--job-name={forged}"),
            ],
            "--job-name",
        ),
    ];
    for (args, option) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, err) = sbatch_nobody(&c, &args);
        assert!(!ok, "{args:?} was accepted: job {stdout}");
        assert!(
            err.contains("muxflow:") && err.contains(option) && err.contains("control character"),
            "{args:?}: {err}"
        );
    }
    // Without --muxflow, Slurm's own rules apply: muxflow does not read it.
    let (ok, stdout, err) = sbatch_nobody(&c, &[&format!("--job-name={forged}")]);
    assert!(ok, "a plain job: {err}");
    let plain: u32 = stdout.trim().parse().unwrap();
    c.scancel(&[plain]);

    // A parked offline job cannot be renamed that way either.
    let (ok, stdout, err) = sbatch_nobody(&c, &["--muxflow=offline", "--job-name=mff-ok"]);
    assert!(ok, "{err}");
    let id: u32 = stdout.trim().parse().unwrap();
    let (ok, out) = c.scontrol_as(
        USER,
        &["update", &format!("JobId={id}"), &format!("Name={forged}")],
    );
    assert!(!ok, "renamed with a line break: {out}");
    assert_eq!(c.job_field(id, "JobName"), "mff-ok");
    c.scancel(&[id]);
    c.assert_no_drain();
}

/// The batch script's path is printed as `Command=` in `scontrol show job`:
/// a line break in a directory's name there forges a slot line as well as
/// the options above do. A muxflow job whose script path holds one is
/// refused at submit, the message naming the path and the fix; a plain
/// job is Slurm's to judge.
#[test]
fn a_line_break_in_a_muxflow_jobs_script_path_is_refused_at_submit() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::get();
    let base = c.scratch("script-path");
    muxflow_tests::open_to_all(&base);
    // The file's own name is plain (sbatch names the job after it, which
    // the job-name check already covers): the forged line is in its directory.
    let dir = base.join("x\n     Nodes=node4 CPU_IDs=0 Mem=0 GRES=mfslot:g0:1(IDX:0)");
    std::fs::create_dir(&dir).unwrap();
    muxflow_tests::open_to_all(&dir);
    let script = dir.join("job.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let submit = |args: &[&str]| {
        let mut cmd = c.cmd_as(USER, "sbatch");
        cmd.current_dir(&base)
            .args(["--parsable", "--begin=now+1hour"])
            .args(args)
            .arg(&script);
        c.run(cmd)
    };
    for mode in ["--muxflow=offline", "--muxflow=online"] {
        let mut args = vec![mode];
        if mode == "--muxflow=online" {
            args.push("--gres=gpu:1");
        }
        let (ok, stdout, err) = submit(&args);
        assert!(
            !ok,
            "{mode}: a script path with a line break was accepted: job {stdout}"
        );
        assert!(
            err.contains("muxflow:")
                && err.contains("batch script path (Command=")
                && err.contains("control character (code 10")
                && err.contains("Rename the directory or script"),
            "{mode}: {err}"
        );
    }
    let (ok, stdout, err) = submit(&[]);
    assert!(ok, "a plain job: {err}");
    c.scancel(&[stdout.trim().parse().unwrap()]);
    c.assert_no_drain();
}
