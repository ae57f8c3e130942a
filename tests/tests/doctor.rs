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
    // The plugin's config= names the copy the doctor is given.
    edit(&dir.join("plugstack.conf"), |t| {
        t.replace(
            &format!("config={}/muxflow.toml", etc.display()),
            &format!("config={}/muxflow.toml", dir.display()),
        )
    });
    dir.join("slurm.conf")
}

/// `text` with each line starting with `prefix` passed through `f`.
fn map_lines(text: &str, prefix: &str, f: impl Fn(&str) -> String) -> String {
    text.lines()
        .map(|l| {
            if l.starts_with(prefix) {
                f(l)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
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
        "job submit",
        "gres types",
        "node",
        "gres.conf",
        "slurm.conf gres",
        "mps control",
        "nvml",
        "xcuda",
        "state dir",
        "mps pipe dir",
        "mps log dir",
        "mps access",
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
            name: "JobSubmitPlugins commented out",
            breaks: |dir, _| {
                edit(&dir.join("slurm.conf"), |t| {
                    map_lines(&t, "JobSubmitPlugins=", |l| format!("#{l}"))
                })
            },
            fails: "FAIL job submit: JobSubmitPlugins='' lacks lua",
            fix: "fix: add lua to JobSubmitPlugins",
        },
        Row {
            name: "mfslot missing from GresTypes",
            breaks: |dir, _| {
                edit(&dir.join("slurm.conf"), |t| {
                    map_lines(&t, "GresTypes=", |_| "GresTypes=gpu".into())
                })
            },
            fails: "FAIL gres types: GresTypes='gpu' lacks mfslot",
            fix: "fix: set GresTypes=gpu,mfslot",
        },
        Row {
            name: "the plugstack line optional",
            breaks: |dir, _| {
                edit(&dir.join("plugstack.conf"), |t| {
                    t.lines()
                        .map(|l| {
                            if l.contains("spank_muxflow.so") {
                                l.replacen("required", "optional", 1)
                            } else {
                                l.to_string()
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                })
            },
            fails: "is optional: where the plugin fails to load",
            fix: "fix: start the line with `required`",
        },
        Row {
            name: "plugstack's config= another file",
            breaks: |dir, _| {
                edit(&dir.join("plugstack.conf"), |t| {
                    t.replace("/muxflow.toml", "/elsewhere.toml")
                })
            },
            fails: "/elsewhere.toml, but the Prolog, Epilog and health check read",
            fix: "fix: set config=",
        },
        Row {
            name: "slurm.conf's Gres= with a slot fewer than gres.conf",
            breaks: |dir, _| {
                edit(&dir.join("slurm.conf"), |t| {
                    map_lines(&t, "NodeName=node1 ", |l| {
                        // The last entry of Gres= dropped.
                        l.split(' ')
                            .map(|w| match w.strip_prefix("Gres=") {
                                Some(g) => format!("Gres={}", g.rsplit_once(',').unwrap().0),
                                None => w.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                })
            },
            fails: "FAIL slurm.conf gres: NodeName=node1 has Gres=",
            fix: "fix: set Gres=gpu:",
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

    // The pipe directories on a filesystem that keeps no ACLs (ramfs has
    // no extended attributes): every user would reach every GPU's daemon.
    let dir = c.scratch("doctor-noacl");
    let conf = copy_node_config(&c, &dir);
    // Under the cluster's own directory: no ancestor others can write (the
    // scratch directories' parent is one, which the pipe dir check fails).
    let mnt = c.dir.join(format!("var/noacl-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "ramfs", "-o", "mode=0755", "none"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount ramfs at {}", mnt.display());
    set_key(
        &dir.join("muxflow.toml"),
        "mps_pipe_root",
        mnt.join("mps").to_str().unwrap(),
    );
    let (code, out) = doctor(&conf, Some(&dir.join("bin")));
    let _ = Command::new("umount").arg(&mnt).status();
    let _ = std::fs::remove_dir(&mnt);
    assert_eq!(code, 1, "{out}");
    let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 1, "exactly one check fails: {out}");
    assert!(
        fails[0].starts_with("FAIL mps access: ")
            && fails[0].contains("keeps no ACLs")
            && fails[0].contains("fix: put paths.mps_pipe_root on a filesystem with POSIX ACLs"),
        "{out}"
    );
}

/// A host slurm.conf does not name is told so (not judged by another
/// node's gres.conf lines).
#[test]
fn the_doctor_on_a_host_that_is_not_a_node_says_pass_node() {
    let c = Cluster::get();
    let out = Command::new(target().join("muxflow-doctor"))
        .args(["--node", "not-a-node", "--slurm-conf"])
        .arg(&c.slurm_conf)
        .env("SLURMD_NODENAME", "node1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL node: no NodeName=not-a-node in ")
            && text.contains("fix: pass --node NAME"),
        "{text}"
    );
    assert!(!text.contains("gres.conf"), "{text}");
}

/// `--controller` on the dev cluster's controller: slurm.conf's settings and
/// job_submit.lua pass; each broken in a copy fails with its fix; `--json`
/// carries the same checks.
#[test]
fn the_doctor_checks_the_controller() {
    let c = Cluster::get();
    let run = |slurm_conf: &Path, json: bool| {
        let mut cmd = Command::new(target().join("muxflow-doctor"));
        cmd.arg("--controller")
            .arg("--slurm-conf")
            .arg(slurm_conf)
            .arg("--config")
            .arg(c.dir.join("etc/muxflow.toml"));
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = run(&c.slurm_conf, false);
    assert_ne!(code, 2, "{out}");
    for ok in [
        "ok   job submit: ",
        "ok   gres types: ",
        "ok   job_submit.lua: ",
    ] {
        assert!(out.contains(ok), "{ok}: {out}");
    }
    // Whether a matcher runs and rounds depends on the other tests; the
    // lines are there either way.
    for name in ["matcher: ", "matcher rounds: ", "shape file: "] {
        assert!(out.contains(name), "{name}: {out}");
    }

    let (_, json) = run(&c.slurm_conf, true);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), out.lines().count(), "{json}");
    let failed = checks.iter().filter(|c| c["ok"] == false).count();
    assert_eq!(v["failed"], failed, "{json}");

    // A copy without job_submit.lua and with JobSubmitPlugins commented out.
    let dir = c.scratch("doctor-controller");
    let conf = std::fs::read_to_string(&c.slurm_conf).unwrap();
    std::fs::write(
        dir.join("slurm.conf"),
        map_lines(&conf, "JobSubmitPlugins=", |l| format!("#{l}")),
    )
    .unwrap();
    let (code, out) = run(&dir.join("slurm.conf"), false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL job submit: JobSubmitPlugins='' lacks lua"),
        "{out}"
    );
    assert!(
        out.contains("FAIL job_submit.lua: ")
            && out.contains("does not exist")
            && out.contains("fix: cp /usr/share/muxflow/job_submit.lua"),
        "{out}"
    );
}
