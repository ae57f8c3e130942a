//! Options an offline job cannot run with are refused at submit (issue 15),
//! tried as a user of the cluster (`nobody`): `sbatch` fails with a message
//! naming the option and what to do instead, and nothing is queued — rather
//! than a job that waits forever (`--exclusive`), fails when its tasks
//! start (`-N 2`). The same options stay accepted without `--muxflow`;
//! several GPUs of one node (`--gres=gpu:2`) are accepted as a gang.

use muxflow_tests::Cluster;

const USER: &str = "nobody";

struct Case {
    name: &'static str,
    args: &'static [&'static str],
    /// Every one of these is in sbatch's message.
    says: &'static [&'static str],
}

#[test]
fn options_an_offline_job_cannot_run_with_are_refused_at_submit() {
    let c = Cluster::get();
    let exclusive: &[&str] = &[
        "--exclusive cannot be used with --muxflow=offline",
        "Drop --exclusive",
    ];
    let cases = [
        Case {
            name: "whole nodes",
            args: &["--exclusive"],
            says: exclusive,
        },
        Case {
            name: "whole nodes of one user",
            args: &["--exclusive=user"],
            says: exclusive,
        },
        Case {
            name: "two nodes",
            args: &["-N", "2"],
            says: &[
                "-N/--nodes=2 cannot be used with --muxflow=offline",
                "Submit with -N 1",
            ],
        },
        Case {
            name: "one or two nodes",
            args: &["-N", "1-2"],
            says: &[
                "-N/--nodes=1-2 cannot be used with --muxflow=offline",
                "Submit with -N 1",
            ],
        },
        Case {
            name: "not restartable",
            args: &["--no-requeue"],
            says: &[
                "--no-requeue cannot be used with --muxflow=offline",
                "Drop --no-requeue",
            ],
        },
        Case {
            name: "a GPU for each of two tasks",
            args: &["--gpus-per-task=1", "-n", "2"],
            says: &[
                "--gpus-per-task, --gpus-per-socket) cannot be used with --muxflow=offline",
                "--gres=gpu:N",
            ],
        },
    ];
    for case in &cases {
        let mut args = vec!["--muxflow=offline", "--job-name", "refusal"];
        args.extend_from_slice(case.args);
        let err = c
            .sbatch_as(USER, &args, "#!/bin/sh\ntrue\n")
            .expect_err(case.name);
        for want in case.says {
            assert!(err.contains(want), "{}: {want:?} not in: {err}", case.name);
        }
        assert!(err.contains("muxflow: "), "{}: {err}", case.name);
    }

    // What an offline job can run with stays accepted (and parked), and the
    // refused options are muxflow's rule only: a plain job keeps them.
    // Several GPUs of one node are a gang (issue 15), recorded as gpus=N.
    let accepted: [&[&str]; 6] = [
        &["--muxflow=offline", "--gres=gpu:1"],
        &["--muxflow=offline", "--gres=gpu:2"],
        &["--muxflow=offline", "--gpus=2"],
        &["--muxflow=offline", "-N", "1"],
        &["--muxflow=offline", "--oversubscribe", "--requeue"],
        &["--exclusive", "-N", "2", "--hold"],
    ];
    let mut ids = Vec::new();
    for args in accepted {
        let mut all = vec!["--job-name", "refusal-ok"];
        all.extend_from_slice(args);
        let id = c
            .sbatch_as(USER, &all, "#!/bin/sh\ntrue\n")
            .unwrap_or_else(|e| panic!("{args:?} refused: {e}"));
        assert_eq!(c.job_field(id, "JobState"), "PENDING", "{args:?}");
        let gang = args.contains(&"--gres=gpu:2") || args.contains(&"--gpus=2");
        assert_eq!(
            c.admin_comment(id).contains(" gpus=2"),
            gang,
            "{args:?}: {}",
            c.admin_comment(id)
        );
        ids.push(id.to_string());
    }
    let mut cmd = c.cmd("scancel");
    cmd.args(&ids);
    c.run(cmd);
    c.assert_no_drain();
}
