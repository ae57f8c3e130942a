//! `muxflow-health`: Slurm's HealthCheckProgram. Every HealthCheckInterval it
//! steps each GPU's health state machine, handles detected errors, and
//! publishes the node's GPU states (see `muxflow_node::sysmon`). Never
//! fails the node for muxflow's own errors; the only drain is a lost GPU.
//!
//! `muxflow-health --report` is the same step run as an NHC check
//! (`etc/nhc/muxflow.nhc`): it prints one line per problem and exits 1,
//! leaving the drain to NHC.

fn main() {
    if muxflow_node::Cli::parse_for("muxflow-health").report {
        let mut problems = Vec::new();
        muxflow_node::run_contained("muxflow-health", |config, env| {
            problems = muxflow_node::sysmon::report(config, env)?;
            Ok(())
        });
        if !problems.is_empty() {
            println!("{}", problems.join("; "));
            std::process::exit(1);
        }
        return;
    }
    muxflow_node::run_contained("muxflow-health", |config, env| {
        muxflow_node::sysmon::step(config, env, muxflow_node::sysmon::Trigger::HealthCheck)
    });
}
