//! `muxflow-health`: see the crate docs. Never fails the node for muxflow's own errors.

fn main() {
    muxflow_prolog::run_contained("muxflow-health", |_config, env| {
        tracing::debug!(?env, "muxflow-health");
        Ok(())
    });
}
