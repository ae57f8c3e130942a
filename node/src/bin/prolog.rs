//! `muxflow-prolog` (slurm.conf Prolog=, with PrologFlags=Alloc): starts the
//! MPS daemons of a muxflow job's GPUs and records the job. Never fails the
//! node for muxflow's own errors.

fn main() {
    muxflow_node::run_contained("muxflow-prolog", |config, env| {
        let job = muxflow_node::job::start(config, env);
        // The health step runs whatever the job path did.
        let step = muxflow_node::sysmon::step(config, env, muxflow_node::sysmon::Trigger::JobStart);
        job.and(step)
    });
}
