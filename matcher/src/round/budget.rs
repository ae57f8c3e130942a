//! The budget phase: a round sends at most `max_updates_per_round` hint
//! updates, parks first (they free slots), then placements by predicted
//! speed; the rest are deferred to the next round, each line saying so.
//! Then the round's [`Summary`].

use super::{Action, Decision, Predictor, Round, Summary};

/// Drops the updates beyond `limit` (parks first, then the fastest
/// placements, then by job id) and says so in their reasons; how many.
pub(super) fn defer_updates(decisions: &mut [Decision], limit: usize) -> usize {
    let mut order: Vec<usize> = (0..decisions.len())
        .filter(|&i| decisions[i].update.is_some())
        .collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| {
            (
                decisions[i].action != Action::Park,
                -(decisions[i].predicted.unwrap_or(0.0) * 1e6) as i64,
                decisions[i].job,
            )
        };
        key(a).cmp(&key(b))
    });
    let mut deferred = 0;
    for &i in order.iter().skip(limit) {
        let d = &mut decisions[i];
        d.update = None;
        d.reason = format!(
            "deferred to the next round (max_updates_per_round = {limit}); {}",
            d.reason
        );
        deferred += 1;
    }
    deferred
}

impl<P: Predictor> Round<'_, P> {
    /// The round's summary: `candidate_edges` the matching's and the
    /// splits' edges, `full_graph` whether the matching is exact over
    /// every pair.
    pub(super) fn summary(
        &self,
        decisions: &[Decision],
        candidate_edges: usize,
        full_graph: bool,
        deferred: usize,
    ) -> Summary {
        let state = self.state;
        let placed: Vec<&Decision> = decisions
            .iter()
            .filter(|d| matches!(d.action, Action::Place | Action::Keep))
            .collect();
        Summary {
            pending_offline: state.pending.len(),
            online_gpus: state
                .gpus
                .iter()
                .filter(|g| !g.online_jobs.is_empty())
                .count(),
            idle_gpus: state
                .gpus
                .iter()
                .filter(|g| g.online_jobs.is_empty())
                .count(),
            open_gpus: self.open.len(),
            open_slots: self.free.iter().map(|&f| f as usize).sum(),
            candidate_edges,
            full_graph,
            placed: placed.len(),
            // A gang counts k times its (slowest GPU's) speed.
            // + 0.0: an empty float sum is −0.0, which prints as "-0.000".
            predicted_total: placed
                .iter()
                .filter_map(|d| Some(d.predicted? * d.gpus.len() as f64))
                .sum::<f64>()
                + 0.0,
            updates: decisions.iter().filter(|d| d.update.is_some()).count(),
            deferred,
            waiting: self.waiting(),
        }
    }
}
