#![allow(dead_code)] // each test binary uses its own part
//! Small scenarios built from CSV text, shared by the replay tests.

use std::sync::atomic::AtomicU64;

use muxflow_sim::input::Source;
use muxflow_sim::replay::{run, Outcome, PolicyKind, RunOptions};
use muxflow_sim::scenario::{OfflineJob, Scenario, Settings};
use muxflow_sim::Inputs;

pub fn src(name: &str, text: &str) -> Source<'static> {
    Source {
        name: name.into(),
        bytes: Box::leak(text.to_string().into_bytes().into_boxed_slice()),
    }
}

pub fn inputs(nodes: &str, trace: &str, pairs: &str) -> Inputs<'static> {
    Inputs {
        nodes: src("nodes.csv", nodes),
        trace: src("trace.csv", trace),
        runtimes: src("runtimes.csv", "runtime\n3600\n"),
        pairs: src("pairs.csv", pairs),
    }
}

/// An offline job of BE task `task` (index in the trace).
pub fn job(id: u32, arrival_s: f64, work_s: f64, task: u32, job_type: u16) -> OfflineJob {
    OfflineJob {
        id,
        arrival_s,
        work_s,
        gpus: 1,
        task,
        job_type,
        share: 1.0,
        mem_mib: 6554,
        models: None,
    }
}

pub fn replay(sc: &Scenario, kind: PolicyKind, cfg: &muxflow::Config, s: &Settings) -> Outcome {
    run(sc, kind, cfg, s, &RunOptions::default(), &AtomicU64::new(0))
}
