//! What Slurm writes for the CPU and memory requests a user may give, as the
//! matcher reads them (`tres_req_str` in `squeue --json`,
//! `muxflow_matcher::reader::tres_need`): a node's free room is compared
//! with this need, so a form Slurm writes differently would send jobs where
//! they cannot start. Submitted as an ordinary user, held, not offline (the
//! matcher leaves them alone); the dev cluster's nodes have 4 CPUs and
//! 4000 MiB each.

use muxflow_matcher::reader::{parse_squeue, tres_need};
use muxflow_tests::Cluster;

const USER: &str = "nobody";

#[test]
fn cpu_and_memory_requests_read_as_slurm_counts_them() {
    let c = Cluster::get();
    // (what, sbatch options, CPUs, MiB)
    let cases: [(&str, &[&str], u32, u64); 5] = [
        // No DefMemPerCPU on the dev cluster: Slurm counts the node's
        // whole memory, as it would allocate it where memory is consumable.
        ("nothing asked", &[], 1, 4000),
        ("a node's whole memory (--mem=0)", &["--mem=0"], 1, 4000),
        ("memory in G", &["--mem=1G"], 1, 1024),
        (
            "memory per CPU",
            &["-c", "2", "--mem-per-cpu=1000"],
            2,
            2000,
        ),
        (
            "two tasks of 2 CPUs, memory per CPU",
            &["-n", "2", "-c", "2", "--mem-per-cpu=500"],
            4,
            2000,
        ),
    ];
    let ids: Vec<u32> = cases
        .iter()
        .map(|(what, opts, _, _)| {
            let mut args = vec!["-H", "--job-name", "mfq-request"];
            args.extend_from_slice(opts);
            c.sbatch_as(USER, &args, "#!/bin/sh\ntrue\n")
                .unwrap_or_else(|e| panic!("{what}: {e}"))
        })
        .collect();
    let mut squeue = c.cmd("squeue");
    squeue.arg("--json");
    let (ok, out, err) = c.run(squeue);
    c.scancel(&ids);
    assert!(ok, "squeue --json: {err}");
    let jobs = parse_squeue(&out).expect("squeue --json parses");
    for ((what, _, cpus, mib), id) in cases.iter().zip(&ids) {
        let job = jobs
            .iter()
            .find(|j| j.job_id == *id)
            .unwrap_or_else(|| panic!("{what}: job {id} not listed"));
        let need = tres_need(&job.tres_req_str);
        assert_eq!(
            (need.cpus, need.mem_mib),
            (*cpus, *mib),
            "{what}: tres_req_str {:?}",
            job.tres_req_str
        );
    }
}
