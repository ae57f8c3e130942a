//! `muxflow-health`: Slurm's HealthCheckProgram. Every HealthCheckInterval it
//! steps each GPU's health state machine, handles detected errors, and
//! publishes the node's GPU states (see `muxflow_prolog::sysmon`). Never
//! fails the node for muxflow's own errors; the only drain is a lost GPU.

fn main() {
    muxflow_prolog::run_contained("muxflow-health", |config, env| {
        muxflow_prolog::sysmon::step(config, env, muxflow_prolog::sysmon::Trigger::HealthCheck)
    });
}
