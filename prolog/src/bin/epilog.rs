//! `muxflow-epilog` (slurm.conf Epilog=): forgets a muxflow job and stops a
//! GPU's MPS daemon once no muxflow job is left on it. Never fails the node
//! for muxflow's own errors.

fn main() {
    muxflow_prolog::run_contained("muxflow-epilog", |config, env| {
        let job = muxflow_prolog::job::end(config, env);
        // The health step runs whatever the job path did.
        let step =
            muxflow_prolog::sysmon::step(config, env, muxflow_prolog::sysmon::Trigger::JobEnd);
        job.and(step)
    });
}
