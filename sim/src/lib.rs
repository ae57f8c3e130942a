//! `muxflow-sim`: a deterministic discrete-event replay of a GPU cluster
//! that drives muxflow's production decision code — the matcher's round,
//! the predictor, the SM and memory policy, the health state machine and
//! the AdminComment report codec — and replaces only Slurm, the nodes and
//! the GPUs. The model and its sources are in `sim/README.md`.
//!
//! Layers: [`input`] (CSV) → [`scenario`] (GPUs, online services, offline
//! arrivals) → [`replay`] (one policy's event loop over [`engine`] and
//! [`model`]) → [`output`] (table, JSON, timeline, plot). [`predictor`]:
//! the `predictor` subcommand (the predictor scored on a pair table).

pub mod engine;
pub mod input;
pub mod model;
pub mod output;
pub mod predictor;
pub mod protection;
pub mod replay;
pub mod scenario;

use std::sync::atomic::AtomicU64;

pub use replay::{Outcome, PolicyKind, RunOptions};
pub use scenario::{Scenario, Settings};

/// The shipped default inputs (sim/data/, sources and licenses in its
/// README), built into the binary so it runs with no arguments.
pub mod data {
    pub const NODES: &[u8] = include_bytes!("../data/openb_node_list_gpu_node.csv");
    pub const TRACE: &[u8] = include_bytes!("../data/openb_pod_list_default.csv");
    pub const RUNTIMES: &[u8] = include_bytes!("../data/philly_runtime.csv");
    pub const PAIRS: &[u8] = include_bytes!("../data/gavel_v100_pairs.csv");
}

/// The four inputs, each as (name for messages, bytes).
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub nodes: input::Source<'a>,
    pub trace: input::Source<'a>,
    pub runtimes: input::Source<'a>,
    pub pairs: input::Source<'a>,
}

impl Inputs<'static> {
    pub fn shipped() -> Inputs<'static> {
        let s = |name: &str, bytes: &'static [u8]| input::Source {
            name: format!("(built-in) sim/data/{name}"),
            bytes,
        };
        Inputs {
            nodes: s("openb_node_list_gpu_node.csv", data::NODES),
            trace: s("openb_pod_list_default.csv", data::TRACE),
            runtimes: s("philly_runtime.csv", data::RUNTIMES),
            pairs: s("gavel_v100_pairs.csv", data::PAIRS),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Input(#[from] input::InputError),
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
}

/// Reads the inputs and builds the scenario every policy replays.
pub fn prepare(inputs: &Inputs, settings: &Settings) -> Result<Scenario, SimError> {
    let nodes = input::read_nodes(&inputs.nodes)?;
    let tasks = input::read_tasks(&inputs.trace)?;
    let runtimes = input::read_runtimes(&inputs.runtimes)?;
    let pairs = input::read_pairs(&inputs.pairs)?;
    Ok(scenario::build(&nodes, tasks, &runtimes, pairs, settings)?)
}

/// Replays `policies` on `scenario`, each on its own thread; results in
/// the order asked. `progress` counts simulated seconds over all policies.
pub fn simulate(
    scenario: &Scenario,
    policies: &[PolicyKind],
    config: &muxflow::Config,
    settings: &Settings,
    opts: &RunOptions,
    progress: &AtomicU64,
) -> Vec<Outcome> {
    std::thread::scope(|s| {
        let handles: Vec<_> = policies
            .iter()
            .map(|&p| s.spawn(move || replay::run(scenario, p, config, settings, opts, progress)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a replay thread panicked"))
            .collect()
    })
}
