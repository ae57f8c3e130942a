//! Out-of-range and oversized input is refused at submit with a short,
//! precise message (issue 13, finding 9): a user's 5,000-character option
//! value is echoed cut, and an absurd number in muxflow.toml names the file,
//! line, key and allowed range. Nothing is queued, no node drains.

use muxflow_tests::Cluster;

/// `sbatch` run as the unprivileged user `nobody`.
fn sbatch_as_nobody(c: &Cluster, args: &[&str]) -> (bool, String, String) {
    let mut cmd = c.cmd_as("nobody", "sbatch");
    cmd.args(["--parsable", "--output=/dev/null"])
        .args(args)
        .args(["--wrap", "echo ran"]);
    c.run(cmd)
}

fn queued_jobs(c: &Cluster) -> usize {
    let mut q = c.cmd("squeue");
    q.args(["-h", "-o", "%i"]);
    c.run(q).1.lines().count()
}

#[test]
fn a_huge_option_value_is_refused_and_echoed_cut() {
    let c = Cluster::get();
    let before = queued_jobs(&c);
    let value = "x".repeat(5000);
    let (ok, out, err) = sbatch_as_nobody(&c, &[&format!("--muxflow={value}")]);
    assert!(!ok, "submitted: {out}");
    assert!(
        err.contains("invalid --muxflow value") && err.contains("… (5000 bytes)"),
        "{err}"
    );
    assert!(
        !err.contains(&"x".repeat(65)),
        "the value is echoed in full: {err}"
    );
    assert_eq!(queued_jobs(&c), before, "nothing queued");
    c.assert_no_drain();
}

#[test]
fn an_out_of_range_number_in_the_config_names_file_line_key_and_range() {
    let c = Cluster::get();
    let dir = c.scratch("bounds");
    let base = std::fs::read_to_string(c.dir.join("etc/muxflow.toml")).unwrap();
    assert!(!base.contains("[policy]"), "cluster config has [policy]");
    let config = dir.join("muxflow.toml");
    std::fs::write(
        &config,
        format!("{base}\n[policy]\nmemory_reserve_mib = 9223372036854775807\n"),
    )
    .unwrap();
    let line = base.lines().count() + 3;
    let (plugin, _) = c.plugstack_line();
    let plugstack = format!("required {plugin} config={}\n", config.display());
    let err = c
        .sbatch_with_plugstack(
            &dir,
            &plugstack,
            &["--muxflow=offline"],
            "#!/bin/sh\necho ran\n",
        )
        .expect_err("submitted with a broken config");
    let at = format!("{}:{line}:", config.display());
    assert!(
        err.contains(&at)
            && err.contains("policy.memory_reserve_mib")
            && err.contains("allowed 0..=1048576"),
        "{err}"
    );
    c.assert_no_drain();
}
