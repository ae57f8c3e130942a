//! The first vertical slice on the dev cluster: the option, its validation,
//! the mode reaching batch and srun steps, sacct, and plugstack arguments.

use std::time::Duration;

use muxflow_tests::Cluster;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn sbatch_help_lists_the_option() {
    let c = Cluster::get();
    let mut cmd = c.cmd("sbatch");
    cmd.arg("--help");
    let (ok, out, err) = c.run(cmd);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("--muxflow="))
        .unwrap_or_else(|| panic!("no --muxflow in:\n{out}"));
    assert!(line.contains("--muxflow=mode"), "{line}");
    assert!(
        out.contains("'offline'") && out.contains("'online'"),
        "{out}"
    );
}

#[test]
fn bad_mode_fails_at_submit_naming_accepted_values() {
    let c = Cluster::get();
    let err = c
        .sbatch(&["--muxflow=bogus"], "#!/bin/sh\ntrue\n")
        .unwrap_err();
    assert!(err.contains("invalid --muxflow value 'bogus'"), "{err}");
    assert!(err.contains("online, offline"), "{err}");
    c.assert_no_drain();
}

#[test]
fn offline_mode_reaches_the_batch_step_and_an_inner_srun() {
    let c = Cluster::get();
    let id = c
        .sbatch(
            &["--muxflow=offline"],
            "#!/bin/sh\necho \"batch MUXFLOW_MODE=$MUXFLOW_MODE SLURM_SPANK_MUXFLOW_MODE=$SLURM_SPANK_MUXFLOW_MODE\"\n\
             srun sh -c 'echo \"step MUXFLOW_MODE=$MUXFLOW_MODE\"'\n",
        )
        .unwrap();
    // Offline jobs wait, held, for a placement (the matcher's job).
    assert_eq!(c.job_field(id, "Reason"), "JobHeldUser");
    c.place(id, "node3", 0);
    let end = c.wait(id, WAIT);
    assert_eq!(
        (end.state.as_str(), end.exit_code.as_str()),
        ("COMPLETED", "0:0"),
        "{end:?}"
    );
    let out = c.output(id);
    assert!(
        out.contains("batch MUXFLOW_MODE=offline SLURM_SPANK_MUXFLOW_MODE=offline"),
        "{out}"
    );
    assert!(out.contains("step MUXFLOW_MODE=offline"), "{out}");
    c.assert_no_drain();
}

#[test]
fn job_without_the_option_gets_no_mode() {
    let c = Cluster::get();
    let id = c
        .sbatch(&[], "#!/bin/sh\necho \"mode=[$MUXFLOW_MODE]\"\n")
        .unwrap();
    assert_eq!(c.wait(id, WAIT).state, "COMPLETED");
    assert!(c.output(id).contains("mode=[]"), "{}", c.output(id));
}

#[test]
fn sacct_shows_finished_jobs() {
    let c = Cluster::get();
    let id = c
        .sbatch(
            &["--muxflow=online", "--job-name=mf-sacct"],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap();
    c.wait(id, WAIT);
    let line = c.sacct_until(id, "JobName,ExitCode", |l| l.contains("mf-sacct"));
    assert_eq!(line, "COMPLETED|mf-sacct|0:0");
}

#[test]
fn unknown_plugstack_key_is_rejected_at_submit() {
    let c = Cluster::get();
    let (plugin, config) = c.plugstack_line();
    let dir = c.scratch("badargs");
    let err = c
        .sbatch_with_plugstack(
            &dir,
            &format!("required {plugin} config={config} colour=blue\n"),
            &["--muxflow=offline"],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap_err();
    assert!(
        err.contains("unknown muxflow argument key 'colour'"),
        "{err}"
    );
    assert!(err.contains("accepted keys: config"), "{err}");
    c.assert_no_drain();
}

#[test]
fn bad_config_value_is_rejected_at_submit_naming_file_line_and_key() {
    let c = Cluster::get();
    let (plugin, _) = c.plugstack_line();
    let dir = c.scratch("badconfig");
    let toml = dir.join("muxflow.toml");
    std::fs::write(&toml, "[policy]\nsm_floor = 10\nsm_ceiling = 250\n").unwrap();
    let err = c
        .sbatch_with_plugstack(
            &dir,
            &format!("required {plugin} config={}\n", toml.display()),
            &["--muxflow=online"],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap_err();
    assert!(err.contains(&format!("{}:3:", toml.display())), "{err}");
    assert!(err.contains("policy.sm_ceiling"), "{err}");
    assert!(err.contains("0 to 100"), "{err}");
    c.assert_no_drain();
}

#[test]
fn missing_config_is_rejected_at_submit() {
    let c = Cluster::get();
    let (plugin, _) = c.plugstack_line();
    let dir = c.scratch("noconfig");
    let err = c
        .sbatch_with_plugstack(
            &dir,
            &format!("required {plugin} config={}/absent.toml\n", dir.display()),
            &["--muxflow=offline"],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap_err();
    assert!(
        err.contains("cannot read muxflow config") && err.contains("absent.toml"),
        "{err}"
    );
}

#[test]
fn broken_plugstack_does_not_stop_jobs_that_do_not_use_muxflow() {
    let c = Cluster::get();
    let (plugin, config) = c.plugstack_line();
    let dir = c.scratch("badargs-plain");
    let id = c
        .sbatch_with_plugstack(
            &dir,
            &format!("required {plugin} config={config} colour=blue\n"),
            &[],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap();
    assert_eq!(c.wait(id, WAIT).state, "COMPLETED");
    c.assert_no_drain();
}
