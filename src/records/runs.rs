//! A requeued job's earlier runs, kept in its AdminComment.
//!
//! Slurm closes a run's accounting record when an online job requeues the
//! offline job (`sacct --duplicates` shows it with the placement only), and
//! each new text of the job (the matcher's reason or placement, a Prolog's
//! refusal, the next run's report) replaces the last. So every writer of an
//! offline job's text carries its runs before ([`EarlierRuns::carried`]):
//! the ones the text kept, and the run whose report the text is, which
//! becomes the latest of them.
//!
//! ```text
//! muxflow:v1 mode=offline placed=node2:g1 runs_before=1 run1.node=node4 run1.gpu=0 run1.sm_pct=80 run1.mem_cap_mib=79511 run1.partner=90 run1.run_s=7 run1.requeued=1 run1.claim.launches=11180 run1.claim.delayed=0 run1.claim.delay_ms=0 run1.claim.oom=0
//! ```
//!
//! `runs_before` counts every earlier run; the last [`MAX_KEPT`] of them
//! keep their figures under `run<n>.` (n from 1), in the report's own keys
//! ([`JobReport::push_figures`]) but only those [`kept_figures`] names, so
//! a text stays within about 1.5 KB however often the job is requeued.
//! Keys `run<n>.*` outside that window are not read.
//!
//! Nothing here is copied as text: a run is decoded into a [`JobReport`]
//! and written again, so a value the job's user chose (its claims, which
//! are bounded numbers) cannot become a key, and a text that is not
//! muxflow's carries nothing.

use std::collections::BTreeMap;

use crate::records::kv::{self, Fields, KvError};
use crate::records::report::JobReport;

/// Most earlier runs whose figures a text keeps (the latest ones).
pub const MAX_KEPT: usize = 4;

/// How many runs the job had before this text's ([`EarlierRuns::count`]).
pub const RUNS_BEFORE: &str = "runs_before";

/// The key prefix of earlier run `n`'s figures.
fn prefix(n: u32) -> String {
    format!("run{n}.")
}

/// A job's runs before the one its text is about.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EarlierRuns {
    /// How many there were, kept or not.
    pub count: u32,
    /// The latest [`MAX_KEPT`] of them, oldest first: the run's number
    /// (from 1) and its figures ([`kept_figures`]).
    pub kept: Vec<(u32, JobReport)>,
}

impl EarlierRuns {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The earlier runs of a text's words; a kept run's figures are read
    /// as strictly as the report's.
    pub(crate) fn read(map: &BTreeMap<String, String>) -> Result<EarlierRuns, KvError> {
        let Some(count) = Fields(map).get::<u32>(RUNS_BEFORE)? else {
            return Ok(EarlierRuns::default());
        };
        let first = count.saturating_sub(MAX_KEPT as u32).max(1);
        let mut kept = Vec::new();
        for n in first..=count {
            let r = JobReport::read_figures(map, &prefix(n))?;
            // A run with no figures is not kept (nor written back).
            if r != JobReport::default() {
                kept.push((n, r));
            }
        }
        Ok(EarlierRuns { count, kept })
    }

    /// Appends the runs to a text being written.
    pub(crate) fn push(&self, w: &mut kv::Writer) {
        if self.is_empty() {
            return;
        }
        w.push(RUNS_BEFORE, self.count);
        for (n, r) in &self.kept {
            r.push_figures(w, &prefix(*n));
        }
    }

    /// What the next text of a job carries from its text `prior`: the runs
    /// it kept and, where `prior` is a run's report (the node's `run_s`),
    /// that run as the latest; the last [`MAX_KEPT`] keep their figures.
    pub fn carried(prior: &JobReport) -> EarlierRuns {
        let mut runs = prior.earlier.clone();
        if prior.run_s.is_some() {
            runs.count = runs.count.saturating_add(1);
            runs.kept.push((runs.count, kept_figures(prior)));
            let over = runs.kept.len().saturating_sub(MAX_KEPT);
            runs.kept.drain(..over);
        }
        runs
    }
}

/// The figures an earlier run keeps: where it ran, what it got, how long
/// and how far it came, and whether an online job requeued it. Its other
/// figures (peers, per-GPU figures of a gang, an online job's service
/// figures) stay in the accounting of the run's end only.
pub fn kept_figures(r: &JobReport) -> JobReport {
    JobReport {
        node: r.node.clone(),
        gpu: r.gpu,
        sm_pct: r.sm_pct,
        mem_cap_mib: r.mem_cap_mib,
        partner: r.partner,
        measured_peak_mib: r.measured_peak_mib,
        policed: r.policed.clone(),
        run_s: r.run_s,
        requeued: r.requeued,
        launches: r.launches,
        delayed: r.delayed,
        delay_ms: r.delay_ms,
        oom: r.oom,
        steps: r.steps,
        steps_per_s: r.steps_per_s,
        ..JobReport::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::admin_comment::AdminComment;
    use crate::records::placement::{refused_admin_comment, Placement, Waiting};
    use crate::Mode;

    /// Run `n`'s report as the node writes it at the batch step's end.
    fn run_report(n: u64, earlier: EarlierRuns) -> JobReport {
        JobReport {
            mode: Some(Mode::Offline),
            node: Some(format!("node{n}")),
            gpu: Some(0),
            sm_pct: Some(80),
            mem_cap_mib: Some(79511),
            partner: Some(90 + n as u32),
            run_s: Some(n * 10),
            requeued: true,
            launches: Some(11180 + n),
            delayed: Some(0),
            delay_ms: Some(0),
            oom: Some(0),
            // Not kept once the run is an earlier one.
            peers: vec![3],
            enforced_by: Some("mem:xcuda,sm:xcuda".into()),
            earlier,
            ..JobReport::default()
        }
    }

    fn carried(text: &str) -> EarlierRuns {
        AdminComment::parse(text).unwrap().runs_before()
    }

    #[test]
    fn every_writer_after_a_requeue_carries_the_runs_before() {
        // Run 1 ends, requeued: its report is the job's text.
        let report1 = run_report(1, EarlierRuns::default()).encode();
        assert!(report1.contains(" requeued=1"), "{report1}");
        // The matcher's reason, then its placement: run 1 carried.
        let runs = carried(&report1);
        assert_eq!(runs.count, 1);
        let noted = Waiting::BeginTime.admin_comment(1, 0, "2026-11-28T22:23:00", 60, &runs);
        assert!(
            noted.starts_with("muxflow:v1 mode=offline waiting=begin_time"),
            "{noted}"
        );
        let placed = Placement::on("node2", &[1]).admin_comment(0, &carried(&noted));
        assert_eq!(
            placed,
            "muxflow:v1 mode=offline placed=node2:g1 runs_before=1 run1.node=node1 run1.gpu=0 \
             run1.sm_pct=80 run1.mem_cap_mib=79511 run1.partner=91 run1.run_s=10 run1.requeued=1 \
             run1.claim.launches=11181 run1.claim.delayed=0 run1.claim.delay_ms=0 run1.claim.oom=0"
        );
        // Still a placement to every reader (the Prolog, the matcher).
        let c = AdminComment::parse(&placed).unwrap();
        assert_eq!(c.placement(), Some(Placement::on("node2", &[1])));
        // A refusal keeps them, so does the next run's report.
        let refused = refused_admin_comment("gpu_busy", &placed);
        assert_eq!(carried(&refused), carried(&placed));
        let report2 = run_report(2, carried(&placed));
        let back = JobReport::decode(&report2.encode()).unwrap();
        assert_eq!(back, report2);
        assert_eq!(back.earlier.count, 1);
        let (n, first) = &back.earlier.kept[0];
        assert_eq!(
            (
                *n,
                first.run_s,
                first.partner,
                first.requeued,
                first.launches
            ),
            (1, Some(10), Some(91), true, Some(11181))
        );
        assert!(first.peers.is_empty() && first.enforced_by.is_none());
        // A placement written again (no run ended since) adds nothing.
        assert_eq!(carried(&placed), carried(&noted));
    }

    #[test]
    fn the_latest_runs_are_kept_and_all_counted() {
        let mut text = run_report(1, EarlierRuns::default()).encode();
        for n in 2..=7 {
            let placed = Placement::on("n", &[0]).admin_comment(0, &carried(&text));
            text = run_report(n, carried(&placed)).encode();
        }
        let r = JobReport::decode(&text).unwrap();
        assert_eq!(r.run_s, Some(70));
        assert_eq!(r.earlier.count, 6);
        let kept: Vec<u32> = r.earlier.kept.iter().map(|(n, _)| *n).collect();
        assert_eq!(kept, [3, 4, 5, 6]);
        assert_eq!(r.earlier.kept[3].1.node.as_deref(), Some("node6"));
        assert!(!text.contains("run2."), "{text}");
        // The text stays bounded however often the job is requeued.
        assert!(text.len() < 1600, "{} bytes: {text}", text.len());
        // What the next writer carries: run 7 in, run 3 out.
        let next = carried(&text);
        assert_eq!(next.count, 7);
        assert_eq!(next.kept.first().map(|(n, _)| *n), Some(4));
        assert_eq!(next.kept.last().map(|(n, _)| *n), Some(7));
    }

    #[test]
    fn runs_are_read_only_where_the_count_says_and_strictly() {
        // Run keys outside the window, or without a count, are not runs.
        for text in [
            "muxflow:v1 mode=offline placed=n:g0 run1.run_s=5",
            "muxflow:v1 mode=offline placed=n:g0 runs_before=1 run2.run_s=5",
            "muxflow:v1 mode=offline placed=n:g0 runs_before=9 run1.run_s=5",
        ] {
            assert!(carried(text).kept.is_empty(), "{text}");
        }
        let e = JobReport::decode("muxflow:v1 mode=offline runs_before=1 run1.run_s=x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'run1.run_s'"), "{e}");
        assert!(JobReport::decode("muxflow:v1 mode=offline runs_before=-1").is_err());
        // An unreadable text carries nothing rather than failing its writer.
        let c = AdminComment::parse("muxflow:v1 mode=offline runs_before=1 run1.gpu=x").unwrap();
        assert_eq!(c.runs_before(), EarlierRuns::default());
        assert!(refused_admin_comment("gpu_busy", "someone's note").ends_with(" refused=gpu_busy"));
    }

    #[test]
    fn what_the_job_controls_cannot_become_a_run_or_a_key() {
        // The workload's own report names run keys and a count: they are
        // not claims, and its claims are numbers (a line with a value that
        // holds '=' is not read at all).
        let mut r = JobReport {
            mode: Some(Mode::Offline),
            node: Some("node1".into()),
            run_s: Some(5),
            ..JobReport::default()
        };
        r.add_claims([(
            "job.report",
            "steps=9 runs_before=3 run3.run_s=999 run3.node=evil requeued=1 steps_per_s=1,run3.gpu",
        )]);
        let text = r.encode();
        assert!(
            !text.contains("run3") && !text.contains("runs_before") && !text.contains("requeued"),
            "{text}"
        );
        assert_eq!(r.claims_refused.as_deref(), Some("steps_per_s"));
        let runs = carried(&text);
        assert_eq!(runs.count, 1);
        assert_eq!(runs.kept[0].1.steps, Some(9));
        // A value that would carry words of its own is dropped by the
        // writer, not split into keys.
        let forged = JobReport {
            mode: Some(Mode::Offline),
            node: Some("n1 runs_before=2 run2.run_s=1".into()),
            policed: Some("x run2.node=n9".into()),
            run_s: Some(5),
            ..JobReport::default()
        };
        let placed = Placement::on("n", &[0]).admin_comment(0, &EarlierRuns::carried(&forged));
        assert!(
            !placed.contains("run2") && !placed.contains("n9"),
            "{placed}"
        );
        assert_eq!(carried(&placed).count, 1);
        let kept = &carried(&placed).kept[0].1;
        assert_eq!((kept.node.as_deref(), kept.run_s), (None, Some(5)));
    }
}
