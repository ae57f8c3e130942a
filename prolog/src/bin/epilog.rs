//! `muxflow-epilog`: see the crate docs. Never fails the node for muxflow's own errors.

fn main() {
    muxflow_prolog::run_contained("muxflow-epilog", |_config, env| {
        tracing::debug!(?env, "muxflow-epilog");
        Ok(())
    });
}
