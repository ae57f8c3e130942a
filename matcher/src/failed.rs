//! What placements that failed at start teach the next rounds, and the
//! round's predictor that heeds it ([`Remembering`]).
//!
//! A start that fails at once is a job that ran out of GPU memory where it
//! was placed. The fact that shapes this module: which memory ran out
//! tells what else cannot work. A job whose own peak reached the cap its
//! slot had needs more than that cap anywhere. A job that failed below its
//! cap found the GPU full: it and its partner together need more than the
//! GPU has, so (memory adds up) it cannot fit beside any partner that
//! leaves it no more room on a GPU of the same model — unless it has since
//! run somewhere that left it as little room, which says the failure was
//! that partner's, not its size's; the exact (job, partner, GPU model) is
//! then still never proposed again.
//!
//! Nothing here is forgotten but by new evidence: a lesson is dropped only
//! where a later run contradicts it (more room than the failure had, or a
//! run at least as tight). The daemon rebuilds it from its sacct history
//! every round ([`FailedPlacements::from_runs`]), so it holds what the
//! history window holds; the replay keeps one for the whole replay and
//! records each start as it happens.
//!
//! Beside memory, a count: a partner that no job has run beside, after
//! `k` jobs failed beside it with the GPU full, is left without new jobs
//! on that model — the jobs of every user where the failures came from
//! two users or more, else only the jobs of the one user they came from
//! (so one user cannot, by failing jobs on purpose, keep everyone else's
//! jobs from a service: a job name is the user's to choose); a job that
//! has run beside no partner, after failing beside `k` of them, is placed
//! on idle GPUs only. `k` is the fewest
//! straight failures a typical pair of this cluster shows less than once
//! in a hundred (`r^k ≤ 1 %`, r the rate of device-full failures among
//! starts beside partners; 3 to 8, [`FailedPlacements::shun_after`]). A
//! run beside it lifts either; the history window's end forgets it.
//!
//! A GPU model is named by its total memory ([`GpuPublished::mem_mib`]):
//! what decides whether two jobs fit together is how much memory there is,
//! and the node publishes nothing else of the board.
//!
//! [`GpuPublished::mem_mib`]: muxflow::records::published::GpuPublished

use std::collections::{BTreeMap, BTreeSet};

use muxflow::config::Policy;

use crate::predict::{
    failed_for_memory, partner_of, trusted_peak_mib, GpuTerms, JobKey, JobTerms, Model, Run, Seat,
};
use crate::reader::{GpuState, PendingJob};
use crate::round::{IdleSlot, Predictor};

/// One failed or successful start as the memory records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start<'a> {
    pub job: &'a JobKey,
    /// The online partner on that GPU (none: an idle GPU).
    pub partner: Option<&'a JobKey>,
    /// The GPU's total memory: its model.
    pub model_mib: u64,
    /// The memory cap the job's slot had there.
    pub cap_mib: u64,
    /// Other offline jobs were on the GPU: a failure then is the slot's
    /// part of the room running out, not the pair's.
    pub beside_offline: bool,
}

/// A job's lessons on one GPU model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct OnModel {
    model_mib: u64,
    /// The largest cap under which it failed with the GPU full: it needs
    /// more than a partner leaving that much lets it have.
    full_at_mib: Option<u64>,
    /// The smallest cap it has run under beside a partner.
    ran_at_mib: Option<u64>,
}

impl OnModel {
    /// The room at or below which the job is kept off this model's shared
    /// GPUs: the device-full bound, unless a run at least as tight
    /// contradicts it.
    fn bound(&self) -> Option<u64> {
        let full = self.full_at_mib?;
        self.ran_at_mib.is_none_or(|ran| ran > full).then_some(full)
    }
}

/// Everything learned of one job (user, name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Lessons {
    /// The largest cap its own peak reached: it needs more, anywhere.
    needs_above_mib: Option<u64>,
    models: Vec<OnModel>,
    /// (partner, model) -> the largest cap it failed under there.
    exact: BTreeMap<(u32, u64), u64>,
    /// Its largest cap run under per (partner, model): new evidence
    /// against the exact lesson where it is at least the failure's.
    ran_beside: BTreeMap<(u32, u64), u64>,
    /// Its runs beside any partner: one keeps it from being left to idle
    /// GPUs.
    runs_beside: u32,
}

impl Lessons {
    fn on_model(&mut self, model_mib: u64) -> &mut OnModel {
        let i = match self.models.iter().position(|m| m.model_mib == model_mib) {
            Some(i) => i,
            None => {
                self.models.push(OnModel {
                    model_mib,
                    ..OnModel::default()
                });
                self.models.len() - 1
            }
        };
        &mut self.models[i]
    }
}

/// A partner's starts on one GPU model: jobs that failed beside it with
/// the GPU full, and runs beside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PartnerTally {
    failed: u32,
    ran: u32,
    /// The users whose jobs failed there (their index in
    /// `FailedPlacements::user_index`): a shun reaches every user only
    /// where two or more of them failed.
    users: BTreeSet<u32>,
}

/// Whose new jobs a partner is kept from ([`FailedPlacements::shun_after`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shunned {
    #[default]
    No,
    /// The failures came from two users or more: every user's jobs.
    All,
    /// They all came from one user (its index): that user's jobs only.
    For(u32),
}

/// The failed placements of the cluster's offline jobs and what each
/// teaches (module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailedPlacements {
    /// (partner, model) -> its starts.
    partners: BTreeMap<(u32, u64), PartnerTally>,
    /// Starts beside a partner (device-full failures and runs), and the
    /// failures among them: the cluster's rate for [`Self::shun_after`].
    beside_starts: u64,
    beside_fails: u64,
    jobs: BTreeMap<JobKey, Lessons>,
    partner_index: BTreeMap<JobKey, u32>,
    /// Users whose jobs failed beside a partner -> an index.
    user_index: BTreeMap<String, u32>,
    /// Online job id -> its partner index (every replica of a service
    /// shares its (user, name)).
    partner_of_id: BTreeMap<u32, u32>,
    /// Partners some job failed beside exactly: only their GPUs need a
    /// column of their own.
    failed_beside: BTreeSet<u32>,
}

impl FailedPlacements {
    /// The memory of a sacct history: each run's first GPU, its model read
    /// from the cluster's GPUs now (`model_of(node, gpu index)`; a run on
    /// a GPU no longer listed teaches nothing of a model).
    pub fn from_runs(runs: &[Run], model_of: impl Fn(&str, u32) -> Option<u64>) -> Self {
        let mut f = FailedPlacements::default();
        for r in runs {
            let rep = &r.report;
            let partner = partner_of(r);
            if let (Some(id), Some(p)) = (rep.partner, &partner) {
                f.note_partner(id, p);
            }
            let (Some(node), Some(gpu), Some(cap_mib)) =
                (rep.node.as_deref(), rep.gpu, rep.mem_cap_mib)
            else {
                continue;
            };
            let Some(model_mib) = model_of(node, gpu) else {
                continue;
            };
            let start = Start {
                job: &r.key,
                partner: partner.as_ref(),
                model_mib,
                cap_mib,
                beside_offline: !rep.peers.is_empty(),
            };
            if failed_for_memory(rep) {
                f.failed(&start, trusted_peak_mib(rep).unwrap_or(0));
            } else if !start.beside_offline {
                f.ran(&start);
            }
        }
        f
    }

    /// Online job `id` is a replica of `partner`.
    pub fn note_partner(&mut self, id: u32, partner: &JobKey) {
        let i = self.partner(partner);
        self.partner_of_id.insert(id, i);
    }

    fn partner(&mut self, key: &JobKey) -> u32 {
        if let Some(&i) = self.partner_index.get(key) {
            return i;
        }
        let i = self.partner_index.len() as u32;
        self.partner_index.insert(key.clone(), i);
        i
    }

    /// A start that failed at once, its job's peak `peak_mib` (what the
    /// node measured).
    pub fn failed(&mut self, s: &Start, peak_mib: u64) {
        let partner = s.partner.map(|p| self.partner(p));
        let own = s.beside_offline || peak_mib >= s.cap_mib || partner.is_none();
        let l = self.jobs.entry(s.job.clone()).or_default();
        if own {
            // Its own peak reached its cap (or, beside other offline
            // jobs, its part of the room ran out): more is needed anywhere.
            l.needs_above_mib = l.needs_above_mib.max(Some(s.cap_mib));
            return;
        }
        let Some(p) = partner else { return };
        let m = l.on_model(s.model_mib);
        m.full_at_mib = m.full_at_mib.max(Some(s.cap_mib));
        let e = l.exact.entry((p, s.model_mib)).or_insert(0);
        *e = (*e).max(s.cap_mib);
        // Newer than any run of the pair: those no longer say it fits.
        l.ran_beside.remove(&(p, s.model_mib));
        self.beside_starts += 1;
        self.beside_fails += 1;
        let next = self.user_index.len() as u32;
        let user = *self.user_index.entry(s.job.0.clone()).or_insert(next);
        let tally = self.partners.entry((p, s.model_mib)).or_default();
        tally.failed += 1;
        tally.users.insert(user);
        self.failed_beside.insert(p);
    }

    /// A start beside a partner that ran: evidence against the device-full
    /// lessons it is at least as tight as.
    pub fn ran(&mut self, s: &Start) {
        let Some(p) = s.partner.map(|p| self.partner(p)) else {
            return;
        };
        if s.beside_offline {
            return;
        }
        self.beside_starts += 1;
        self.partners.entry((p, s.model_mib)).or_default().ran += 1;
        let l = self.jobs.entry(s.job.clone()).or_default();
        l.runs_beside += 1;
        let m = l.on_model(s.model_mib);
        m.ran_at_mib = Some(m.ran_at_mib.map_or(s.cap_mib, |r| r.min(s.cap_mib)));
        let e = l.ran_beside.entry((p, s.model_mib)).or_insert(0);
        *e = (*e).max(s.cap_mib);
    }

    /// Straight failures with no run that single out a partner (on one
    /// model) or a job: the fewest `k` with `r^k ≤ 0.01`, `r` the cluster's
    /// rate of device-full failures among starts beside partners (shrunk
    /// towards 1/2 by one start each way), from 3 to 8. A pair as likely
    /// to fail as the cluster's typical one fails `k` times running less
    /// than once in a hundred; never fewer than 3 (with 2, the replay kept
    /// more services' GPUs from jobs that would have run there: sim/README.md).
    pub fn shun_after(&self) -> u32 {
        let r = (self.beside_fails as f64 + 1.0) / (self.beside_starts as f64 + 2.0);
        ((0.01f64.ln() / r.ln()).ceil() as u32).clamp(3, 8)
    }

    /// What a round needs of job `key`, looked up once.
    pub fn job(&self, key: &JobKey) -> JobLessons {
        let user = self.user_index.get(&key.0).copied();
        let Some(l) = self.jobs.get(key) else {
            return JobLessons {
                user,
                ..JobLessons::default()
            };
        };
        // Distinct partners it failed beside (per model, as the exact
        // lessons are kept).
        let failed_beside = l.exact.len() as u64;
        JobLessons {
            user,
            idle_only: l.runs_beside == 0 && failed_beside >= u64::from(self.shun_after()),
            needs_above_mib: l.needs_above_mib,
            full: (l.models.iter())
                .filter_map(|m| Some((m.model_mib, m.bound()?)))
                .collect(),
            exact: (l.exact.iter())
                .filter(|(k, &cap)| l.ran_beside.get(k).is_none_or(|&ran| ran < cap))
                .map(|(&(p, model), &cap)| (p, model, cap))
                .collect(),
        }
    }

    /// What a round needs of GPU `gpu`: its model, and its online partner
    /// as the memory names it.
    pub fn gpu(&self, gpu: &GpuState) -> GpuLessons {
        let model_mib = gpu.published.mem_mib;
        let partner = (gpu.online_jobs.iter()).find_map(|id| self.partner_of_id.get(id).copied());
        GpuLessons {
            model_mib,
            partner,
            shunned: self.shunned(partner, model_mib),
        }
    }

    /// Partner `p` on `model_mib` failed `k` jobs and hosted none: whose
    /// jobs it is kept from.
    fn shunned(&self, partner: Option<u32>, model_mib: u64) -> Shunned {
        let Some(t) = partner.and_then(|p| self.partners.get(&(p, model_mib))) else {
            return Shunned::No;
        };
        if t.ran > 0 || t.failed < self.shun_after() {
            return Shunned::No;
        }
        match (t.users.len(), t.users.first()) {
            (1, Some(&user)) => Shunned::For(user),
            _ => Shunned::All,
        }
    }
}

/// A job's lessons as a round reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobLessons {
    /// Its user's index where that user's jobs failed beside a partner:
    /// a partner only they failed beside is kept from their jobs alone.
    pub user: Option<u32>,
    /// It failed beside `k` partners and ran beside none
    /// ([`FailedPlacements::shun_after`]): idle GPUs only.
    pub idle_only: bool,
    pub needs_above_mib: Option<u64>,
    /// (model, room): kept off that model's shared GPUs with at most that
    /// room.
    pub full: Vec<(u64, u64)>,
    /// (partner, model, room): kept off that partner on that model with
    /// at most that room.
    pub exact: Vec<(u32, u64, u64)>,
}

impl JobLessons {
    /// Beside an online job on `gpu`, with `room_mib` for the job.
    pub fn rules_out(&self, gpu: &GpuLessons, room_mib: u64) -> bool {
        self.idle_only
            || match gpu.shunned {
                Shunned::No => false,
                Shunned::All => true,
                Shunned::For(user) => self.user == Some(user),
            }
            || self
                .full
                .iter()
                .any(|&(m, r)| m == gpu.model_mib && room_mib <= r)
            || gpu.partner.is_some_and(|p| {
                (self.exact.iter()).any(|&(q, m, r)| q == p && m == gpu.model_mib && room_mib <= r)
            })
    }

    fn key(&self) -> u64 {
        let fnv = |h: u64, v: u64| (h ^ v).wrapping_mul(0x0100_0000_01b3);
        let mut h = fnv(
            fnv(
                fnv(0xcbf2_9ce4_8422_2325, u64::from(self.idle_only)),
                self.needs_above_mib.unwrap_or(u64::MAX),
            ),
            self.user.map_or(u64::MAX, u64::from),
        );
        for &(m, r) in &self.full {
            h = fnv(fnv(h, m), r);
        }
        for &(p, m, r) in &self.exact {
            h = fnv(fnv(fnv(h, u64::from(p)), m), r);
        }
        h
    }
}

/// A GPU as the lessons read it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuLessons {
    pub model_mib: u64,
    pub partner: Option<u32>,
    /// Its partner, on this model, failed `k` jobs and hosted none
    /// ([`FailedPlacements::shun_after`]): no new job beside it, of
    /// every user or of the one whose jobs failed there.
    pub shunned: Shunned,
}

/// A job kept to idle GPUs ([`JobLessons::idle_only`]) that finds none.
pub const IDLE_ONLY_REASON: &str = "no candidate: its starts beside online jobs failed for memory, beside several of them, and it has run beside none: it waits for an idle GPU";

/// The production model, less what the failed placements rule out: the
/// round's predictor in the daemon and in the replay.
pub struct Remembering<'a> {
    pub model: &'a Model,
    pub failed: &'a FailedPlacements,
}

impl Predictor for Remembering<'_> {
    type Job = (JobTerms, JobLessons);
    type Gpu = (GpuTerms, GpuLessons);
    /// A need above a cap it failed under is a peak above it: the model
    /// keeps it off every GPU with no more room, idle ones too.
    fn job_terms(&self, job: &PendingJob) -> Self::Job {
        let key = (job.user.clone(), job.name.clone());
        let lessons = self.failed.job(&key);
        let mut terms = self.model.job_terms(&key);
        if let Some(cap) = lessons.needs_above_mib {
            terms.peak_mib = Some(terms.peak_mib.unwrap_or(0).max(cap.saturating_add(1)));
        }
        (terms, lessons)
    }
    fn gpu_terms(&self, gpu: &GpuState, policy: &Policy, seat: Seat) -> Self::Gpu {
        (
            Predictor::gpu_terms(self.model, gpu, policy, seat),
            self.failed.gpu(gpu),
        )
    }
    fn predict(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<f64> {
        if job.1.rules_out(&gpu.1, gpu.0.room_mib) {
            return None;
        }
        Predictor::predict(self.model, &job.0, &gpu.0)
    }
    fn estimate(&self, job: &Self::Job, gpu: &Self::Gpu) -> Option<(f64, f64)> {
        if job.1.rules_out(&gpu.1, gpu.0.room_mib) {
            return None;
        }
        Predictor::estimate(self.model, &job.0, &gpu.0)
    }
    fn solo(&self, job: &Self::Job, gpu: &GpuState, slot: &IdleSlot) -> Option<(f64, f64)> {
        Predictor::solo(self.model, &job.0, gpu, slot)
    }
    fn kept_off_shared(&self, job: &Self::Job) -> Option<&'static str> {
        job.1.idle_only.then_some(IDLE_ONLY_REASON)
    }
    /// The model's key, the GPU's model, and its partner where some job
    /// failed beside it exactly (other partners read alike: a column of
    /// their own would only split the classes).
    fn column_key(
        &self,
        at: usize,
        gpu: &GpuState,
        terms: Option<&Self::Gpu>,
        key: &mut Vec<u64>,
    ) -> bool {
        let Some((terms, lessons)) = terms else {
            return Predictor::column_key(self.model, at, gpu, None, key);
        };
        let failed_here = (lessons.partner).filter(|p| self.failed.failed_beside.contains(p));
        key.push(failed_here.map_or(u64::MAX, u64::from));
        key.push(lessons.model_mib);
        key.push(match lessons.shunned {
            Shunned::No => u64::MAX,
            Shunned::All => u64::MAX - 1,
            Shunned::For(user) => u64::from(user),
        });
        Predictor::column_key(self.model, at, gpu, Some(terms), key)
    }
    /// What was learned of the job: its lessons change its values.
    fn job_key(&self, job: &PendingJob) -> u64 {
        let key = (job.user.clone(), job.name.clone());
        let known =
            self.failed.jobs.contains_key(&key) || self.failed.user_index.contains_key(&key.0);
        if known {
            self.failed.job(&key).key()
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests;
