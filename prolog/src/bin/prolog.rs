//! `muxflow-prolog` (slurm.conf Prolog=, with PrologFlags=Alloc): starts the
//! MPS daemons of a muxflow job's GPUs and records the job. Never fails the
//! node for muxflow's own errors.

fn main() {
    muxflow_prolog::run_contained("muxflow-prolog", muxflow_prolog::job::start);
}
