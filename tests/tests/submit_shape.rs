//! An offline job that no GPU node could ever hold is refused at submit
//! (issue 31, the root of H3): job_submit.lua takes its GPU request out of
//! what Slurm sees, so Slurm's own check never runs for it, and
//! `--gres=gpu:3` on 2-GPU nodes used to wait forever. The matcher writes
//! the nodes' shapes each round ([matcher] shape_file); the Lua reads
//! them. Tried as a user of the cluster (`nobody`). Without a fresh file
//! (no matcher running) nothing is refused.

use muxflow_tests::Cluster;

const USER: &str = "nobody";

/// The shapes' largest GPUs, CPUs and memory, and the shapes' lines.
fn largest(text: &str) -> (u64, u64, u64, usize) {
    let mut max = (0, 0, 0);
    let mut lines = 0;
    for line in text.lines().filter(|l| l.starts_with("node ")) {
        let num = |key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        max = (
            max.0.max(num("gpus=")),
            max.1.max(num("cpus=")),
            max.2.max(num("mem_mib=")),
        );
        lines += 1;
    }
    (max.0, max.1, max.2, lines)
}

fn submit(c: &Cluster, args: &[&str]) -> Result<u32, String> {
    let mut all = vec!["--muxflow=offline", "--job-name", "shape"];
    all.extend_from_slice(args);
    c.sbatch_as(USER, &all, "#!/bin/sh\ntrue\n")
}

fn cancel(c: &Cluster, id: u32) {
    let mut cmd = c.cmd("scancel");
    cmd.arg(id.to_string());
    c.run(cmd);
}

#[test]
fn an_offline_job_no_node_could_ever_hold_is_refused_at_submit() {
    let c = Cluster::get();
    let file = c.dir.join("var/lib/muxflow-matcher/cluster-shape");
    let _ = std::fs::remove_file(&file);
    // No shape yet (no matcher round): nothing is refused on its account.
    let id = submit(&c, &["--gres=gpu:9"]).expect("refused without a shape file");
    cancel(&c, id);

    // A round writes the nodes' shapes from Slurm's node config.
    c.matcher_once();
    let text = std::fs::read_to_string(&file).expect("the round wrote no shape file");
    let (gpus, cpus, mem, lines) = largest(&text);
    assert!(lines >= 1 && gpus >= 1, "{text}");
    // Every dev node: CPUs=4 RealMemory=4000 (scripts/devcluster).
    assert_eq!((cpus, mem, lines), (4, 4000, 1), "{text}");

    let too_many_gpus = format!("--gres=gpu:{}", gpus + 1);
    let too_many_cpus = format!("--cpus-per-task={}", cpus + 1);
    let too_much_memory = format!("--mem={}M", mem + 1);
    let per_cpu = format!("--mem-per-cpu={}M", mem / 2 + 1);
    let refused: [(&str, Vec<&str>, String); 4] = [
        ("GPUs", vec![&too_many_gpus], format!("{} GPU(s)", gpus + 1)),
        (
            "CPUs",
            vec!["--gres=gpu:1", &too_many_cpus],
            format!("{} CPU(s)", cpus + 1),
        ),
        (
            "memory",
            vec!["--gres=gpu:1", &too_much_memory],
            format!("{} MiB", mem + 1),
        ),
        (
            "memory per CPU",
            vec!["--gres=gpu:1", "-c", "2", &per_cpu],
            format!("{} MiB", 2 * (mem / 2 + 1)),
        ),
    ];
    for (what, args, asked) in &refused {
        let err = submit(&c, args).expect_err(what);
        for want in [
            "muxflow: no node of this cluster can ever hold this offline job",
            asked.as_str(),
            &format!("{gpus} GPUs, {cpus} CPUs and {mem} MiB"),
            "Ask for less",
        ] {
            assert!(err.contains(want), "{what}: {want:?} not in: {err}");
        }
    }

    // The largest a node has is accepted, and parked.
    let all_gpus = format!("--gres=gpu:{gpus}");
    let all_cpus = format!("--cpus-per-task={cpus}");
    let all_memory = format!("--mem={mem}M");
    let id = submit(&c, &[&all_gpus, &all_cpus, &all_memory]).expect("the largest job refused");
    assert_eq!(c.job_field(id, "JobState"), "PENDING");
    cancel(&c, id);

    // A stale file (no matcher for 15 minutes) refuses nothing.
    let stale = text
        .lines()
        .map(|l| {
            if l.starts_with("written_at=") {
                "written_at=1"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&file, stale).unwrap();
    let id = submit(&c, &[&too_many_gpus]).expect("refused on a stale shape file");
    cancel(&c, id);
    std::fs::write(&file, &text).unwrap();
    c.assert_no_drain();
}
