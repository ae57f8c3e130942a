//! The matcher's reader of squeue/sinfo/sacct JSON: any text is a listing or
//! an error, never a panic; listings that parse build a cluster state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow_matcher::predict::runs_from_sacct;
use muxflow_matcher::reader::{self, ClusterState, Names};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let names = Names::from_config(&muxflow::config::Slurm::default());
    if let Ok(jobs) = reader::parse_squeue(text) {
        let state = ClusterState::build(&jobs, &[], &names);
        let _ = state.open_gpus(1).count();
    }
    if let Ok(nodes) = reader::parse_sinfo(text) {
        let state = ClusterState::build(&[], &nodes, &names);
        let _ = state.open_gpus(1).count();
    }
    if let Ok(jobs) = reader::parse_sacct(text) {
        let _ = runs_from_sacct(&jobs);
    }
    let _ = reader::parse_gres(text);
    let _ = reader::expand_hostlist(text);
});
