//! `muxflow-doctor` on a dev-cluster node: every check passes on the node
//! as the dev cluster set it up, and each way of breaking it fails exactly
//! that check, with the fix, and exit status 1. The broken nodes are copies
//! of the cluster's configuration with one thing changed (the cluster
//! itself is left alone).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use muxflow_tests::{edit, set_key, target, Cluster};

/// The cluster's slurm.conf, plugstack.conf, gres.conf and muxflow.toml,
/// copied into `dir` (slurm.conf pointing at the copies).
fn copy_node_config(c: &Cluster, dir: &Path) -> PathBuf {
    let etc = c.dir.join("etc");
    for f in ["plugstack.conf", "gres.conf", "muxflow.toml"] {
        std::fs::copy(etc.join(f), dir.join(f)).unwrap();
    }
    let conf = std::fs::read_to_string(etc.join("slurm.conf"))
        .unwrap()
        .replace(
            &format!("PlugStackConfig={}/plugstack.conf", etc.display()),
            &format!("PlugStackConfig={}/plugstack.conf", dir.display()),
        );
    std::fs::write(dir.join("slurm.conf"), conf).unwrap();
    dir.join("slurm.conf")
}

/// (exit code, output) of the doctor for node1 with this slurm.conf;
/// `path_dir` first in PATH (a fake slurmd).
fn doctor(slurm_conf: &Path, path_dir: Option<&Path>) -> (i32, String) {
    let mut cmd = Command::new(target().join("muxflow-doctor"));
    cmd.args(["--node", "node1", "--slurm-conf"])
        .arg(slurm_conf)
        .arg("--config")
        .arg(slurm_conf.with_file_name("muxflow.toml"))
        // The simulated NVML serves the node slurmd names.
        .env("SLURMD_NODENAME", "node1");
    if let Some(dir) = path_dir {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", dir.display()));
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_doctor_passes_a_correct_node_and_names_each_breakage_with_its_fix() {
    let c = Cluster::get();
    let (code, out) = doctor(&c.slurm_conf, None);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    for name in [
        "plugstack",
        "slurm version",
        "prolog",
        "epilog",
        "health check",
        "prolog flags",
        "gres.conf",
        "mps control",
        "nvml",
        "xcuda",
        "state dir",
        "mps pipe dir",
        "mps log dir",
    ] {
        assert!(out.contains(&format!("ok   {name}: ")), "{name}: {out}");
    }

    struct Row {
        name: &'static str,
        /// Breaks the copy in `dir` (slurm.conf, muxflow.toml beside it).
        breaks: fn(&Path, &Path),
        fails: &'static str,
        fix: &'static str,
    }
    let rows = [
        Row {
            name: "no plugstack line",
            breaks: |dir, _| std::fs::write(dir.join("plugstack.conf"), "").unwrap(),
            fails: "FAIL plugstack: no spank_muxflow.so line",
            fix: "fix: link /usr/share/muxflow/plugstack.conf",
        },
        Row {
            name: "a slurmd of another release",
            breaks: |dir, _| {
                let fake = dir.join("bin/slurmd");
                std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
                // A release other than the build's.
                let other = if muxflow_slurm::version::version_string().starts_with("24.11") {
                    "22.05.8"
                } else {
                    "24.11.5"
                };
                muxflow::test_support::write_executable(
                    &fake,
                    &format!("#!/bin/sh\necho slurm {other}\n"),
                );
            },
            fails: "Slurm will not load the plugin",
            fix: "fix: install the muxflow packages built for Slurm ",
        },
        Row {
            name: "Prolog not muxflow's",
            breaks: |dir, _| {
                edit(&dir.join("slurm.conf"), |t| {
                    t.lines()
                        .map(|l| {
                            if l.starts_with("Prolog=") {
                                "Prolog=/bin/true"
                            } else {
                                l
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                })
            },
            fails: "FAIL prolog: Prolog='/bin/true' does not run muxflow-prolog",
            fix: "fix: set Prolog=/etc/slurm/prolog.d/*",
        },
        Row {
            name: "a GPU without its slot",
            breaks: |dir, _| {
                edit(&dir.join("gres.conf"), |t| {
                    t.lines()
                        .filter(|l| !l.starts_with("NodeName=node1 Name=mfslot Type=g1"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
            },
            fails: "FAIL gres.conf: GPU 1",
            fix: "fix: add `Name=mfslot Type=g1 File=",
        },
        Row {
            name: "no MPS control program",
            breaks: |_, toml| set_key(toml, "mps_control", "/nonexistent/nvidia-cuda-mps-control"),
            fails: "FAIL mps control: /nonexistent/nvidia-cuda-mps-control",
            fix: "correct paths.mps_control",
        },
        Row {
            name: "NVML not loadable",
            breaks: |_, toml| set_key(toml, "nvml_library", "/nonexistent/libnvidia-ml.so.1"),
            fails: "FAIL nvml: ",
            fix: "fix: install the NVIDIA driver",
        },
        Row {
            name: "xCUDA writable by users",
            breaks: |dir, toml| {
                let lib = dir.join("lib/libmuxflow_xcuda.so");
                std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
                std::fs::copy(target().join("libmuxflow_xcuda.so"), &lib).unwrap();
                std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
                set_key(toml, "xcuda_library", lib.to_str().unwrap());
            },
            fails: "libmuxflow_xcuda.so is writable by others (mode 0666)",
            fix: "fix: chmod go-w",
        },
        Row {
            name: "state directory in a world-writable place",
            breaks: |dir, toml| {
                let open = dir.join("open");
                std::fs::create_dir_all(open.join("state")).unwrap();
                std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
                set_key(toml, "state_dir", open.join("state").to_str().unwrap());
            },
            fails: "/open is writable by others (mode 0777)",
            fix: "fix: chmod go-w",
        },
    ];
    for row in rows {
        let dir = c.scratch("doctor");
        let conf = copy_node_config(&c, &dir);
        (row.breaks)(&dir, &dir.join("muxflow.toml"));
        let (code, out) = doctor(&conf, Some(&dir.join("bin")));
        assert_eq!(code, 1, "{}: {out}", row.name);
        let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
        assert_eq!(
            fails.len(),
            1,
            "{}: exactly one check fails: {out}",
            row.name
        );
        assert!(fails[0].contains(row.fails), "{}: {out}", row.name);
        assert!(fails[0].contains(row.fix), "{}: {out}", row.name);
    }
}
