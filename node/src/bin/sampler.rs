//! `muxflow-sampler`: the node's one SM activity sampler, started by the
//! health steps and `muxflow-police` when none runs, gone once the node has
//! not needed it for `health.sampler_linger_s` (see
//! `muxflow_node::sampler`). Like the other node programs it never fails
//! the node.

fn main() {
    muxflow_node::run_contained("muxflow-sampler", |config, _env| {
        muxflow_node::sampler::run(config)
    });
}
