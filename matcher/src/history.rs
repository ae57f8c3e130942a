//! The offline runs the predictor learns from, kept between rounds of the
//! looping daemon: the first round reads `history_days` of sacct, later
//! rounds only what ended since the previous read (with an overlap, so a
//! record written late is not missed), and runs older than the window are
//! dropped. Losing the cache (a restart) costs one full read, nothing else.

use std::collections::BTreeMap;

use crate::predict::Run;

/// Re-read this much before the previous read: records that reached sacct
/// late (AdminComment is written as the batch script exits).
pub const OVERLAP_S: u64 = 600;

#[derive(Debug, Clone, Default)]
pub struct HistoryCache {
    runs: BTreeMap<u32, Run>,
    /// When the last successful read was taken (Unix seconds).
    read_at: Option<u64>,
}

impl HistoryCache {
    /// Seconds before `now` the next sacct read must start (`-S now-N`).
    pub fn lookback_s(&self, now: u64, days: u32) -> u64 {
        let window = u64::from(days) * 86_400;
        match self.read_at {
            None => window,
            Some(t) => (now.saturating_sub(t) + OVERLAP_S).min(window),
        }
    }

    /// Adds a read taken at `now` (a run read again replaces its old record)
    /// and drops runs that ended before the window.
    pub fn merge(&mut self, runs: Vec<Run>, now: u64, days: u32) {
        for r in runs {
            self.runs.insert(r.job_id, r);
        }
        let oldest = now.saturating_sub(u64::from(days) * 86_400);
        self.runs.retain(|_, r| r.end_s == 0 || r.end_s >= oldest);
        self.read_at = Some(now);
    }

    pub fn runs(&self) -> Vec<Run> {
        self.runs.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow::records::report::JobReport;

    fn run(id: u32, end_s: u64, steps: f64) -> Run {
        Run {
            job_id: id,
            key: ("u".into(), "train".into()),
            report: JobReport {
                steps_per_s: Some(steps),
                ..Default::default()
            },
            end_s,
            partner_key: None,
        }
    }

    #[test]
    fn first_read_takes_the_window_then_only_the_increment() {
        let mut h = HistoryCache::default();
        let day = 86_400;
        let now = 100 * day;
        assert_eq!(h.lookback_s(now, 30), 30 * day);
        h.merge(vec![run(1, now - 2 * day, 10.0), run(2, 0, 5.0)], now, 30);
        assert_eq!(h.lookback_s(now + 60, 30), 60 + OVERLAP_S);
        // A long outage never reads more than the window.
        assert_eq!(h.lookback_s(now + 90 * day, 30), 30 * day);

        // Job 2 ended meanwhile with its figures: the new record replaces it.
        h.merge(vec![run(2, now + 30, 7.0)], now + 60, 30);
        let runs = h.runs();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1].report.steps_per_s, Some(7.0));
        assert_eq!(runs[1].end_s, now + 30);
    }

    #[test]
    fn runs_leave_with_the_window() {
        let mut h = HistoryCache::default();
        let day = 86_400;
        let now = 100 * day;
        h.merge(vec![run(1, now - 29 * day, 1.0), run(2, 0, 2.0)], now, 30);
        h.merge(Vec::new(), now + 2 * day, 30);
        let ids: Vec<u32> = h.runs().iter().map(|r| r.job_id).collect();
        assert_eq!(ids, [2], "job 1 ended 31 days ago; job 2 still runs");
    }
}
