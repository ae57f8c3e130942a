//! A step of an offline job stays offline whatever the step asks for
//! (issue 13): the plugin takes the mode the Prolog recorded for the job,
//! not the step's `--muxflow` option, which the job's user controls in every
//! `srun`. Tried as `nobody`: one step asks for `--muxflow=online`, another
//! drops the option and the MPS/xCUDA variables; both still get MPS client
//! priority 1 and xCUDA, and nothing drains.

use std::time::Duration;

use muxflow_tests::{kv, Cluster};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_step_cannot_leave_offline_mode() {
    let c = Cluster::get();
    let script = "#!/bin/sh\n\
        srun --muxflow=online sh -c 'echo \"asked-online prio=$CUDA_MPS_CLIENT_PRIORITY preload=$LD_PRELOAD\"'\n\
        for v in $(env | sed -n 's/^\\(SLURM_SPANK[^=]*\\)=.*/\\1/p'); do unset \"$v\"; done\n\
        unset LD_PRELOAD CUDA_MPS_CLIENT_PRIORITY CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\n\
        srun sh -c 'echo \"no-option prio=$CUDA_MPS_CLIENT_PRIORITY preload=$LD_PRELOAD\"'\n";
    let id = c
        .sbatch(
            &[
                "--muxflow=offline",
                muxflow_tests::AS_NOBODY,
                "--job-name",
                "mfs-step-mode",
            ],
            script,
        )
        .unwrap();
    c.place(id, "node4", 1);
    let end = c.wait(id, WAIT);
    let out = c.output(id);
    assert_eq!(end.state, "COMPLETED", "{out}");
    for step in ["asked-online", "no-option"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(step))
            .unwrap_or_else(|| panic!("no '{step}' line in {out}"));
        assert_eq!(kv(line, "prio").as_deref(), Some("1"), "{line}");
        let preload = kv(line, "preload").unwrap_or_default();
        assert!(preload.contains("libmuxflow_xcuda.so"), "{line}");
    }
    c.assert_no_drain();
}
