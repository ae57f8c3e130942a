//! `muxflow-epilog` (slurm.conf Epilog=): forgets a muxflow job and stops a
//! GPU's MPS daemon once no muxflow job is left on it. Never fails the node
//! for muxflow's own errors.

fn main() {
    muxflow_node::run_contained("muxflow-epilog", |config, env| {
        let job = muxflow_node::job::end(config, env);
        // The health step runs whatever the job path did.
        let step = muxflow_node::sysmon::step(config, env, muxflow_node::sysmon::Trigger::JobEnd);
        job.and(step)
    });
}
