//! `muxflow-epilog` (slurm.conf Epilog=): forgets a muxflow job and stops a
//! GPU's MPS daemon once no muxflow job is left on it. Never fails the node
//! for muxflow's own errors.

fn main() {
    muxflow_prolog::run_contained("muxflow-epilog", muxflow_prolog::job::end);
}
