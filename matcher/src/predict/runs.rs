//! What one shared run of an offline job says: its progress, its partner and
//! the partner's load, its memory (the node's measurement), read from the
//! job's sacct record.

use super::*;

/// One finished (or running) offline run from sacct.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job_id: u32,
    pub key: JobKey,
    pub report: JobReport,
    /// When the run ended (Unix seconds); 0 while it runs.
    pub end_s: u64,
    /// The online partner's (user, name), when the listing had it.
    pub partner_key: Option<JobKey>,
}

/// Offline runs in a `sacct --json` listing (other records are skipped);
/// each partner's job id is resolved to its (user, name) from the same
/// listing.
pub fn runs_from_sacct(jobs: &[SacctJob]) -> Vec<Run> {
    let names: BTreeMap<u32, &SacctJob> = jobs.iter().map(|j| (j.job_id, j)).collect();
    jobs.iter()
        .filter_map(|j| {
            let report = JobReport::decode(j.comment.administrator.as_deref()?).ok()?;
            // A run the node had to police did not run within its limits:
            // its figures say nothing about a protected run.
            let learnable = report.mode == Some(Mode::Offline) && report.policed.is_none();
            let partner_key = report
                .partner
                .and_then(|p| names.get(&p))
                .map(|p| (p.user.clone(), p.name.clone()));
            learnable.then(|| Run {
                job_id: j.job_id,
                key: (j.user.clone(), j.name.clone()),
                report,
                end_s: j.time.end,
                partner_key,
            })
        })
        .collect()
}

/// The job's peak GPU memory as the predictor uses it: what the node
/// measured; for records without a measurement (written before the node
/// measured), the job's own claim, never above the cap the node gave it.
pub fn trusted_peak_mib(r: &JobReport) -> Option<u64> {
    const MAX_MIB: u64 = 1 << 20;
    r.measured_peak_mib.or_else(|| {
        let claim = r.peak_mib?;
        Some(claim.min(r.mem_cap_mib.unwrap_or(MAX_MIB)).min(MAX_MIB))
    })
}

/// A job's progress signal, in its own units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    StepsPerS,
    LaunchesPerS,
}

/// The run's progress in `signal`'s units, when it has one.
pub fn progress(r: &JobReport, signal: Signal) -> Option<f64> {
    let v = match signal {
        Signal::StepsPerS => r.steps_per_s?,
        Signal::LaunchesPerS => r.launches? as f64 / r.run_s.filter(|&s| s > 0)? as f64,
    };
    (v.is_finite() && v > 0.0).then_some(v)
}

/// Every GPU of the run had the same partner (or none): a k-GPU job
/// beside different online jobs runs at its slowest GPU's pace, which no
/// one of its partners can be credited or blamed for.
pub(super) fn one_partner(r: &JobReport) -> bool {
    r.gang.iter().all(|g| g.partner == r.partner)
}

/// The run's speed is its speed beside its partner (or alone) and nothing
/// else: [`one_partner`], and no other offline job shared its GPUs
/// (`peers`, issue 15), whose part of the GPU would be counted against the
/// partner or the job's solo speed.
pub(super) fn beside_its_partner_only(r: &JobReport) -> bool {
    one_partner(r) && r.peers.is_empty()
}

/// The partner's load during the run, a fraction: its mean SM utilization
/// in the run (`partner_sm_pct`) over the busiest any run beside it saw
/// (`peak_sm_pct`, [`partner_peaks`]); else the node's within-run figure
/// (`partner_load_pct`: the mean over the run's largest sample, which
/// reads a run at a steady load as full load whatever the load); else 1.
pub(super) fn partner_load(r: &JobReport, peak_sm_pct: Option<u8>) -> f64 {
    match (r.partner_sm_pct, peak_sm_pct) {
        (Some(_), Some(0)) => 0.0,
        (Some(sm), Some(peak)) => (f64::from(sm) / f64::from(peak)).min(1.0),
        _ => r
            .partner_load_pct
            .map_or(1.0, |l| f64::from(l.min(100)) / 100.0),
    }
}

/// Per partner (its one name, [`canonical_partner`]): the largest
/// `partner_sm_pct` among the runs beside it, its busiest seen: what a
/// run's own figure is read against ([`partner_load`]).
pub(super) fn partner_peaks(runs: &[Run], names: &BTreeMap<u32, JobKey>) -> BTreeMap<JobKey, u8> {
    let mut peaks: BTreeMap<JobKey, u8> = BTreeMap::new();
    for r in runs {
        if let (Some(sm), Some(k)) = (r.report.partner_sm_pct, canonical_partner(names, r)) {
            let e = peaks.entry(k.clone()).or_insert(0);
            *e = (*e).max(sm);
        }
    }
    peaks
}

pub fn failed_for_memory(r: &JobReport) -> bool {
    r.oom.unwrap_or(0) > 0
        && progress(r, Signal::StepsPerS).is_none()
        && progress(r, Signal::LaunchesPerS).is_none()
}

/// The partner as the model names it: its (user, name), else its job id.
pub fn partner_of(r: &Run) -> Option<JobKey> {
    r.partner_key
        .clone()
        .or_else(|| Some(unresolved_partner(r.report.partner?)))
}

pub(super) fn unresolved_partner(id: u32) -> JobKey {
    (String::new(), format!("job {id}"))
}
