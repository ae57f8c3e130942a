//! What a round returns ([`Plan`]: a [`Summary`] and one [`Decision`] per
//! pending offline job) and its two formats, the decision table and
//! `--json` (documented in the [module docs](super)).

use std::fmt::Write as _;

use muxflow::records::placement::Waiting;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Place,
    Keep,
    Park,
    None,
}

impl Action {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Action::Place => "place",
            Action::Keep => "keep",
            Action::Park => "park",
            Action::None => "none",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub job: u32,
    pub name: String,
    pub user: String,
    pub action: Action,
    pub node: Option<String>,
    /// The first of `gpus`.
    pub gpu: Option<u32>,
    /// Its GPUs on `node` (a k-GPU job's gang: k of them); empty when not
    /// placed.
    pub gpus: Vec<u32>,
    /// Offline slots it holds on each of `gpus` (of `[policy]
    /// offline_per_gpu`; its part of the GPU's offline SMs and memory,
    /// [`muxflow::policy::share::offline_part`]); empty when not placed.
    pub slots: Vec<u32>,
    pub predicted: Option<f64>,
    /// The prediction's standard deviation.
    pub confidence: Option<f64>,
    pub reason: String,
    /// A parked job's reason to wait, as written into its AdminComment
    /// (`waiting=`, [`Waiting`]) by the daemon; `None` when placed.
    #[serde(serialize_with = "waiting_code")]
    pub waiting: Option<Waiting>,
    /// The scontrol calls (full argument lists) that change the hint.
    #[serde(skip)]
    pub update: Option<Vec<Vec<String>>>,
}

/// Jobs a summary line names of each kind; the rest are counted.
pub const SUMMARY_JOBS: usize = 10;

/// `N (a, b, … and K more)`, or `0`.
fn job_list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        return "0".into();
    }
    let shown = &items[..items.len().min(SUMMARY_JOBS)];
    let more = items.len() - shown.len();
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{} ({}{tail})", items.len(), shown.join(", "))
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub pending_offline: usize,
    pub online_gpus: usize,
    /// GPUs no job holds as gres/gpu, of any health (issue 15).
    pub idle_gpus: usize,
    pub open_gpus: usize,
    /// Free offline slots on the open GPUs (`[policy] offline_per_gpu` per
    /// GPU, less the offline jobs running there; issue 15).
    pub open_slots: usize,
    pub candidate_edges: usize,
    /// The 1-GPU jobs' matching is exact over every feasible (job, GPU)
    /// pair, not just the candidates (pricing finished within
    /// `matcher.pricing_budget_ms`).
    pub full_graph: bool,
    pub placed: usize,
    pub predicted_total: f64,
    pub updates: usize,
    /// Updates left for the next round (bounded per round).
    pub deferred: usize,
    /// Held jobs not scored this round (beyond the window of
    /// [`super::considered_jobs`]): they stay parked, with a decision line saying so.
    pub waiting: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub summary: Summary,
    pub decisions: Vec<Decision>,
    #[serde(skip)]
    pub notes: Vec<String>,
}

fn waiting_code<S: serde::Serializer>(w: &Option<Waiting>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_some(&w.map(Waiting::code))
}

impl Plan {
    /// What the round's hint updates left of `max_updates_per_round` for
    /// the parked jobs' waiting notes: the one budget of Slurm updates a
    /// round sends, placements first (the deferral, `budget.rs`), notes
    /// after.
    pub fn notes_budget(&self, matcher: &muxflow::config::Matcher) -> usize {
        matcher
            .max_updates_per_round
            .saturating_sub(self.summary.updates)
    }

    /// The decision table (format documented in the module docs).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<8} {:<16} {:<6} {:<10} {:>3} {:>11}  REASON",
            "JOB", "NAME", "ACTION", "NODE", "GPU", "SPEED"
        );
        for d in &self.decisions {
            let _ = writeln!(
                s,
                "{:<8} {:<16} {:<6} {:<10} {:>3} {:>11}  {}",
                d.job,
                muxflow::text::printable(&d.name),
                d.action.as_str(),
                d.node.as_deref().unwrap_or("-"),
                if d.gpus.is_empty() {
                    "-".to_string()
                } else {
                    d.gpus
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                },
                match (d.predicted, d.confidence) {
                    (Some(p), Some(sd)) => format!("{p:.3}±{sd:.2}"),
                    (Some(p), None) => format!("{p:.3}"),
                    _ => "-".into(),
                },
                d.reason
            );
        }
        let _ = write!(s, "{}", self.summary_line());
        s
    }

    /// The jobs the round left waiting: parked (hint cleared) or staying
    /// parked.
    pub fn parked(&self) -> impl Iterator<Item = &Decision> {
        self.decisions
            .iter()
            .filter(|d| matches!(d.action, Action::Park | Action::None))
    }

    /// One-line summary, also what loop mode logs: what it placed (job on
    /// node and GPUs), kept and parked, by job ID (the first
    /// [`SUMMARY_JOBS`] of each), then the cluster's figures. `not scored`
    /// counts the parked jobs beyond the round's window.
    pub fn summary_line(&self) -> String {
        let m = &self.summary;
        let of = |action: Action| self.decisions.iter().filter(move |d| d.action == action);
        let placed = job_list(of(Action::Place).map(|d| {
            let gpus: Vec<String> = d.gpus.iter().map(u32::to_string).collect();
            format!(
                "{} on {} GPU {}",
                d.job,
                d.node.as_deref().unwrap_or("-"),
                gpus.join(",")
            )
        }));
        let kept = of(Action::Keep).count();
        let parked = job_list(self.parked().map(|d| d.job.to_string()));
        format!(
            "round: placed {placed}, kept {kept}, parked {parked}, of {} pending offline; {} online GPUs, {} idle GPUs ({} open), {} candidate edges ({}), predicted total {:.3}, {} updates, {} deferred, {} not scored",
            m.pending_offline, m.online_gpus, m.idle_gpus, m.open_gpus, m.candidate_edges,
            if m.full_graph { "exact over every pair" } else { "exact on the candidates" },
            m.predicted_total, m.updates, m.deferred, m.waiting
        )
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(job: u32, action: Action, node: Option<&str>, gpus: &[u32]) -> Decision {
        Decision {
            job,
            name: format!("j{job}"),
            user: "u".into(),
            action,
            node: node.map(str::to_string),
            gpu: gpus.first().copied(),
            gpus: gpus.to_vec(),
            slots: vec![1; gpus.len()],
            predicted: None,
            confidence: None,
            reason: String::new(),
            waiting: None,
            update: None,
        }
    }

    #[test]
    fn the_summary_line_names_what_it_placed_and_parked() {
        let plan = |decisions: Vec<Decision>, not_scored| Plan {
            summary: Summary {
                pending_offline: decisions.len(),
                waiting: not_scored,
                ..Summary::default()
            },
            decisions,
            notes: vec![],
        };
        // (case, plan, the line starts with, and contains)
        let rows = [
            (
                "nothing pending",
                plan(vec![], 0),
                "round: placed 0, kept 0, parked 0, of 0 pending offline;",
                "0 not scored",
            ),
            (
                "one placed, a gang, one kept, three parked of which one not scored",
                plan(
                    vec![
                        decision(17, Action::Place, Some("node1"), &[0]),
                        decision(18, Action::Place, Some("node2"), &[0, 1]),
                        decision(19, Action::Keep, Some("node3"), &[1]),
                        decision(20, Action::Park, None, &[]),
                        decision(21, Action::None, None, &[]),
                        decision(22, Action::None, None, &[]),
                    ],
                    1,
                ),
                "round: placed 2 (17 on node1 GPU 0, 18 on node2 GPU 0,1), kept 1, parked 3 (20, 21, 22), of 6 pending offline;",
                "1 not scored",
            ),
            (
                "a long queue: the first ten named, the rest counted",
                plan(
                    (1..=12)
                        .map(|j| decision(j, Action::None, None, &[]))
                        .collect(),
                    0,
                ),
                "round: placed 0, kept 0, parked 12 (1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more), of 12 pending offline;",
                "0 not scored",
            ),
        ];
        for (case, plan, starts, has) in rows {
            let line = plan.summary_line();
            assert!(line.starts_with(starts), "{case}: {line}");
            assert!(line.contains(has), "{case}: {line}");
        }
    }
}
