//! `muxflow-matcher-bench`: one matching round on a synthetic cluster, timed,
//! exact on every feasible pair, then incremental rounds after small
//! changes; dense Kuhn–Munkres on the full graph where that fits.
//!
//! * `round_s` = candidate pruning (score every (job, GPU) pair with the
//!   synthetic predictor, build the production candidate graph: each job's
//!   best k ∪ capacity-spread lists) + the solve + pricing until no pair
//!   outside the graph has a positive reduced cost ([`crate::exact`]).
//!   Instance generation is excluded and shown separately.
//! * `peak_mb` = the process's peak resident set (VmHWM in /proc/self/status)
//!   read right after the cold round, before any reference solver runs.
//! * `objective_gap` = (reference − round) / reference, the reference being
//!   dense Kuhn–Munkres on every feasible pair when it ran, else the LP
//!   bound below. On integer weights an exact round shows 0.
//! * `full_graph_gap` = (bound − round) / bound, where the bound comes from
//!   the round's duals raised to feasibility on every feasible pair by an
//!   independent full scan (it does not trust pricing). 0 = certified
//!   optimal over the whole cluster. The same line for the candidate graph
//!   alone shows what pruning without pricing loses.
//! * `incremental_ms` = median of [`INCREMENTAL_ROUNDS`] rounds, each after
//!   [`INCREMENTAL_CHANGE`] of the jobs were replaced and as many of the
//!   GPUs flipped health; each round's optimality is checked the same way.
//! * `--export F` writes the round's final candidate graph: its optimum is
//!   the full graph's (certified), so other solvers can be timed on it.

//!
//! The bench's three runs, one file each: [`run`] (the cold round above,
//! `cold.rs`), [`gang_run`] (gangs and sized slots, `gangs.rs`) and
//! [`daemon_run`] (the daemon's own round and its cache, `daemon.rs`).

mod cold;
mod daemon;
mod gangs;
#[cfg(test)]
mod tests;

use anyhow::Context;

use crate::solver::Edge;
use crate::synth::WeightMode;

pub use cold::{run, INCREMENTAL_CHANGE, INCREMENTAL_ROUNDS};
pub use daemon::{daemon_run, daemon_state};
pub use gangs::{gang_run, BENCH_BESIDE_OFFLINE, GANG_BENCH_GPUS_PER_NODE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseMode {
    /// Only when both sides are ≤ [`DENSE_AUTO_MAX`].
    Auto,
    Always,
    Never,
}

/// Largest side `--dense auto` runs dense Kuhn–Munkres on.
pub const DENSE_AUTO_MAX: usize = 4000;

#[derive(Debug, Clone)]
pub struct BenchArgs {
    pub gpus: usize,
    pub jobs: usize,
    pub seed: u64,
    pub weights: WeightMode,
    pub dense: DenseMode,
    pub candidates_per_job: usize,
    pub threads: usize,
    /// Write the round's final candidate graph here ([`export`]).
    pub export: Option<std::path::PathBuf>,
    /// The gang bench's round prices out within this (`matcher.pricing_budget_ms`).
    pub pricing_budget_ms: u64,
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub round_s: f64,
    pub peak_mb: f64,
    pub objective_gap: f64,
    pub gap_reference: &'static str,
    pub matched: usize,
    pub top_k_matched: usize,
    pub full_graph_gap: f64,
    pub incremental_ms: f64,
    /// Everything to print, the key=value line last.
    pub text: String,
}

/// Peak resident set of this process in MB (VmHWM), if /proc has it.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU seconds this process has used, all threads (user + system); the
/// bench prints them next to wall times because the load of a shared
/// machine moves them less.
pub fn cpu_s() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a full rusage into the pointer it is given;
    // RUSAGE_SELF is always valid.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } == 0;
    if !ok {
        return f64::NAN;
    }
    // SAFETY: getrusage returned 0, so it filled the struct.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

pub(crate) fn gap(reference: i128, value: i128) -> f64 {
    if reference == 0 {
        0.0
    } else {
        (reference - value) as f64 / reference as f64
    }
}

pub(crate) fn fmt_gap(g: f64) -> String {
    if g == 0.0 {
        "0".into()
    } else {
        format!("{g:.3e}")
    }
}

/// Writes `edges` as text: a `# jobs gpus edges` header line, then one
/// `job gpu weight` line per edge (0-based indices, integer weights).
pub fn export(
    path: &std::path::Path,
    jobs: usize,
    gpus: usize,
    edges: &[Edge],
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let file = std::fs::File::create(path)
        .with_context(|| format!("creating the export file {}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    writeln!(w, "# jobs gpus edges\n{jobs} {gpus} {}", edges.len())?;
    for e in edges {
        writeln!(w, "{} {} {}", e.job, e.gpu, e.weight)?;
    }
    w.flush()
        .with_context(|| format!("writing the export file {}", path.display()))?;
    Ok(())
}
