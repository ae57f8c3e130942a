//! Where muxflow put an offline job, as a record users cannot forge: the
//! job's AdminComment, which only root, SlurmUser and Slurm admins can write
//! (a user's `scontrol update AdminComment=` is refused by slurmctld).
//!
//! ```text
//! muxflow:v1 mode=offline placed=node3:g1        written by muxflow-matcher with the slot
//! muxflow:v1 mode=offline gpus=2 placed=node3:g0,g1   a 2-GPU job's gang of slots
//! muxflow:v1 mode=offline placed=any             job_submit.lua without a matcher (any slot)
//! muxflow:v1 mode=offline refused=gpu_faulty refusals=1   written by the Prolog when it refuses the job
//! muxflow:v1 mode=offline waiting=free_gpu since=2026-11-23T12:14:05 rounds_every=60s
//!                                                 a parked job: why it waits (the matcher)
//! ```
//!
//! The gang form (several `g<i>`, one node) extends the single form, which
//! is unchanged: records of either kind parse. A reader that predates it
//! fails to parse a gang's value and refuses the job: never runs it on
//! fewer GPUs than it was placed on. `gpus=` is the job's GPU count as
//! job_submit.lua recorded it; absent means 1.
//! `refusals=` counts the job's refusals by Prologs;
//! every muxflow text of a pending job keeps it, so the plugin can fail a
//! job that keeps being refused instead of requeueing it for ever.
//!
//! The Prolog compares the slot Slurm allocated with `placed=`; a job whose
//! slot is not the one muxflow wrote is refused. The end-of-job report
//! ([`crate::records::report`]) later replaces the text; it keeps the same tag and
//! `mode`, and readers ignore keys they do not know. The protocol itself
//! (tag, keys, the one parse) is [`crate::records::admin_comment`]'s.

use std::fmt;

use crate::records::admin_comment::{key, offline_record, AdminComment, PLACED_ANY};
use crate::records::runs::EarlierRuns;

/// Why a parked offline job waits, as the matcher writes it into the job's
/// AdminComment (`waiting=<code>`), so that `scontrol show job` says it.
/// The codes are words a user can read; [`Waiting::words`] says more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// No Healthy GPU (idle or beside an online job) has a free offline
    /// slot and room for the job's memory.
    FreeGpu,
    /// A k-GPU job: no node has k such GPUs at once.
    FreeNode,
    /// GPUs it could use went to jobs predicted to run faster there.
    FasterJobsFirst,
    /// Other held jobs fill this round's window (each user's oldest first).
    OlderJobsFirst,
    /// The nodes of the GPUs it could use have too few CPUs or too little
    /// memory free for what it asked for (or jobs placed this round took
    /// them).
    NodeRoom,
    /// The GPUs it could use run another user's jobs under an MPS daemon
    /// that serves one user at a time (not in multi-user mode): NVIDIA's
    /// MPS would make it wait inside `cuInit` for the other user's clients.
    SameUserOnly,
    /// The GPUs it could use run jobs the site's `[policy] co_locate`
    /// keeps it apart from (another account's, another user's).
    CoLocateRule,
    /// Slurm starts it no earlier than its begin time (`--begin`, or the
    /// delay Slurm gives a requeued job): no slot is kept for it meanwhile.
    BeginTime,
    /// Its `--dependency` is not satisfied yet.
    Dependency,
}

impl Waiting {
    pub const ALL: [Waiting; 9] = [
        Waiting::FreeGpu,
        Waiting::FreeNode,
        Waiting::FasterJobsFirst,
        Waiting::OlderJobsFirst,
        Waiting::NodeRoom,
        Waiting::SameUserOnly,
        Waiting::CoLocateRule,
        Waiting::BeginTime,
        Waiting::Dependency,
    ];

    pub fn code(self) -> &'static str {
        match self {
            Waiting::FreeGpu => "free_gpu",
            Waiting::FreeNode => "free_node",
            Waiting::FasterJobsFirst => "faster_jobs_first",
            Waiting::OlderJobsFirst => "older_jobs_first",
            Waiting::NodeRoom => "node_room",
            Waiting::SameUserOnly => "same_user_only",
            Waiting::CoLocateRule => "co_locate",
            Waiting::BeginTime => "begin_time",
            Waiting::Dependency => "dependency",
        }
    }

    /// The sentence behind the code (docs/user-guide.md's table of
    /// `waiting=` reasons, `muxflow-report`).
    pub fn words(self) -> &'static str {
        match self {
            Waiting::FreeGpu => {
                "waiting for a Healthy GPU with a free offline slot and room for its memory"
            }
            Waiting::FreeNode => "waiting for a node with as many such GPUs free as it asked for",
            Waiting::FasterJobsFirst => {
                "the GPUs it could use went to jobs predicted to run faster there"
            }
            Waiting::OlderJobsFirst => {
                "waiting behind other held offline jobs (a round scores users in turns, each its oldest first)"
            }
            Waiting::NodeRoom => {
                "waiting for a node with a free GPU and the CPUs and memory it asked for"
            }
            Waiting::SameUserOnly => {
                "waiting for a GPU it may share: the free ones run another user's jobs under an MPS daemon that serves one user at a time"
            }
            Waiting::CoLocateRule => {
                "waiting for a GPU it may share: the free ones run jobs the site's co_locate rule keeps it apart from"
            }
            Waiting::BeginTime => {
                "Slurm starts it no earlier than its begin time (--begin, or the delay after a requeue); no GPU is kept for it until then"
            }
            Waiting::Dependency => {
                "its --dependency is not satisfied yet; no GPU is kept for it until it is"
            }
        }
    }

    pub fn from_code(code: &str) -> Option<Waiting> {
        Waiting::ALL.into_iter().find(|w| w.code() == code)
    }

    /// The AdminComment of a parked job of `gpus` GPUs (refused `refusals`
    /// times so far, with `earlier` runs) that waits for this
    /// reason since `since` (local time, `YYYY-MM-DDTHH:MM:SS`), checked by
    /// a matcher round every `every_s` seconds.
    pub fn admin_comment(
        self,
        gpus: u32,
        refusals: u32,
        since: &str,
        every_s: u64,
        earlier: &EarlierRuns,
    ) -> String {
        let mut w = offline_record(gpus as usize, refusals);
        w.push(key::WAITING, self.code())
            .push(key::SINCE, since)
            .push(key::ROUNDS_EVERY, format!("{every_s}s"));
        earlier.push(&mut w);
        w.finish()
    }
}

/// What muxflow wrote about where an offline job may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// The matcher's choice: this node's offline slot of GPU `gpu`.
    Gpu { node: String, gpu: u32 },
    /// A k-GPU job's gang: the offline slots of these GPUs (ascending, at
    /// least two) of one node.
    Gang { node: String, gpus: Vec<u32> },
    /// No matcher (job_submit.lua's `PARK_OFFLINE = false`): any slot Slurm picks.
    AnySlot,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Gpu { node, gpu } => write!(f, "{node}:g{gpu}"),
            Placement::Gang { node, gpus } => {
                let list: Vec<String> = gpus.iter().map(|g| format!("g{g}")).collect();
                write!(f, "{node}:{}", list.join(","))
            }
            Placement::AnySlot => f.write_str(PLACED_ANY),
        }
    }
}

impl Placement {
    /// The value of `placed=`.
    pub(crate) fn parse(v: &str) -> Option<Placement> {
        if v == PLACED_ANY {
            return Some(Placement::AnySlot);
        }
        // The GPU list has no ':', so the last ":g" starts it.
        let (node, list) = v.rsplit_once(":g")?;
        (!node.is_empty()).then_some(())?;
        let mut gpus = list
            .split(",g")
            .map(|g| g.parse().ok())
            .collect::<Option<Vec<u32>>>()?;
        let node = node.to_string();
        if let [gpu] = gpus[..] {
            return Some(Placement::Gpu { node, gpu });
        }
        gpus.sort_unstable();
        gpus.dedup();
        (gpus.len() == list.split(",g").count()).then_some(())?;
        Some(Placement::Gang { node, gpus })
    }

    /// A placement on `gpus` (ascending, deduplicated) of `node`: the
    /// single form for one GPU.
    pub fn on(node: &str, gpus: &[u32]) -> Placement {
        let mut gpus = gpus.to_vec();
        gpus.sort_unstable();
        gpus.dedup();
        match gpus[..] {
            [gpu] => Placement::Gpu {
                node: node.to_string(),
                gpu,
            },
            _ => Placement::Gang {
                node: node.to_string(),
                gpus,
            },
        }
    }

    /// The AdminComment the matcher writes with the slot (for a job
    /// refused `refusals` times so far, with `earlier` runs).
    pub fn admin_comment(&self, refusals: u32, earlier: &EarlierRuns) -> String {
        let gpus = match self {
            Placement::Gang { gpus, .. } => gpus.len(),
            _ => 1,
        };
        let mut w = offline_record(gpus, refusals);
        w.push(key::PLACED, self);
        earlier.push(&mut w);
        w.finish()
    }

    /// Does an allocation of offline slots `slots` on `node` match?
    pub fn allows(&self, node: &str, slots: &[u32]) -> bool {
        match self {
            Placement::Gpu { node: n, gpu } => n == node && slots == [*gpu],
            Placement::Gang { node: n, gpus } => {
                let mut s = slots.to_vec();
                s.sort_unstable();
                n == node && s == *gpus
            }
            Placement::AnySlot => !slots.is_empty(),
        }
    }
}

/// The AdminComment the Prolog writes for an offline job it refused, whose
/// AdminComment was `prior`: `code` is one word (`[a-z0-9_]`), the full
/// reason goes to the job's stderr. The job's GPU count and earlier runs
/// stay and its refusals count one more.
pub fn refused_admin_comment(code: &str, prior: &str) -> String {
    let prior = AdminComment::parse(prior)
        .ok()
        .filter(|c| c.mode() == Some(crate::Mode::Offline));
    let (gpus, refusals) = prior.as_ref().map_or((1, 0), |c| (c.gpus(), c.refusals()));
    let mut w = offline_record(gpus as usize, refusals + 1);
    w.push(key::REFUSED, code);
    if let Some(c) = &prior {
        c.runs_before().push(&mut w);
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> EarlierRuns {
        EarlierRuns::default()
    }

    fn placement(text: &str) -> Option<Placement> {
        AdminComment::parse(text).ok()?.placement()
    }

    fn waiting(text: &str) -> Option<Waiting> {
        AdminComment::parse(text).ok()?.waiting()
    }

    fn refusals(text: &str) -> u32 {
        AdminComment::parse(text).map_or(0, |c| c.refusals())
    }

    #[test]
    fn round_trips_and_rejects_what_is_not_a_placement() {
        struct Case {
            name: &'static str,
            text: &'static str,
            want: Option<Placement>,
        }
        let gpu = |node: &str, gpu| {
            Some(Placement::Gpu {
                node: node.into(),
                gpu,
            })
        };
        let cases = [
            Case {
                name: "matcher's",
                text: "muxflow:v1 mode=offline placed=node3:g1",
                want: gpu("node3", 1),
            },
            Case {
                name: "node names with ':g'",
                text: "muxflow:v1 mode=offline placed=a:gx:g12",
                want: gpu("a:gx", 12),
            },
            Case {
                name: "a gang",
                text: "muxflow:v1 mode=offline gpus=2 placed=node3:g0,g1",
                want: Some(Placement::Gang {
                    node: "node3".into(),
                    gpus: vec![0, 1],
                }),
            },
            Case {
                name: "a gang written in any order",
                text: "muxflow:v1 mode=offline placed=a:gx:g3,g1",
                want: Some(Placement::Gang {
                    node: "a:gx".into(),
                    gpus: vec![1, 3],
                }),
            },
            Case {
                name: "a gang naming a GPU twice",
                text: "muxflow:v1 mode=offline placed=node3:g1,g1",
                want: None,
            },
            Case {
                name: "a gang with a bad item",
                text: "muxflow:v1 mode=offline placed=node3:g0,1",
                want: None,
            },
            Case {
                name: "no matcher",
                text: "muxflow:v1 mode=offline placed=any",
                want: Some(Placement::AnySlot),
            },
            Case {
                name: "parked, not placed",
                text: "muxflow:v1 mode=offline",
                want: None,
            },
            Case {
                name: "online job",
                text: "muxflow:v1 mode=online placed=node3:g1",
                want: None,
            },
            Case {
                name: "not muxflow's",
                text: "placed=node3:g1",
                want: None,
            },
            Case {
                name: "bad gpu",
                text: "muxflow:v1 mode=offline placed=node3:gx",
                want: None,
            },
            Case {
                name: "no node",
                text: "muxflow:v1 mode=offline placed=:g1",
                want: None,
            },
            Case {
                name: "empty",
                text: "",
                want: None,
            },
        ];
        for c in cases {
            assert_eq!(placement(c.text), c.want, "{}", c.name);
        }
        for p in [
            gpu("node3", 1).unwrap(),
            Placement::on("node3", &[1, 0]),
            Placement::AnySlot,
        ] {
            assert_eq!(placement(&p.admin_comment(0, &none())), Some(p));
        }
        // The report and the job mode still read it.
        let text = gpu("n", 0).unwrap().admin_comment(0, &none());
        assert_eq!(
            crate::records::report::JobReport::decode(&text)
                .unwrap()
                .mode,
            Some(crate::Mode::Offline)
        );
    }

    #[test]
    fn refusals_are_counted_and_kept_by_every_text_of_a_pending_job() {
        let first = refused_admin_comment("gpu_faulty", "muxflow:v1 mode=offline");
        assert_eq!(
            first,
            "muxflow:v1 mode=offline refusals=1 refused=gpu_faulty"
        );
        assert_eq!(refusals(&first), 1);
        // The matcher's next texts keep the count; the next refusal adds one.
        let waiting =
            Waiting::FreeGpu.admin_comment(1, refusals(&first), "2026-11-23T12:14:05", 60, &none());
        let placed = Placement::on("n", &[0]).admin_comment(refusals(&waiting), &none());
        assert_eq!(placed, "muxflow:v1 mode=offline refusals=1 placed=n:g0");
        assert_eq!(placement(&placed), Placement::on("n", &[0]).into());
        let second = refused_admin_comment("wrong_slot", &placed);
        assert_eq!(refusals(&second), 2);
        // A gang keeps its GPU count through a refusal.
        let gang = Placement::on("n", &[0, 1]).admin_comment(0, &none());
        assert_eq!(
            refused_admin_comment("gpu_busy", &gang),
            "muxflow:v1 mode=offline gpus=2 refusals=1 refused=gpu_busy"
        );
        for none in [
            "",
            "muxflow:v1 mode=offline",
            "muxflow:v1 mode=online refusals=4",
            "muxflow:v1 mode=offline refusals=x",
        ] {
            assert_eq!(refusals(none), 0, "{none}");
        }
    }

    #[test]
    fn a_parked_jobs_reason_round_trips_keeps_its_gpu_count_and_is_no_placement() {
        for w in Waiting::ALL {
            let one = w.admin_comment(1, 0, "2026-11-23T12:14:05", 60, &none());
            assert_eq!(waiting(&one), Some(w), "{one}");
            assert_eq!(placement(&one), None, "{one}");
            assert!(!w.words().is_empty());
        }
        let gang = Waiting::FreeNode.admin_comment(4, 0, "2026-11-23T12:14:05", 60, &none());
        assert_eq!(
            gang,
            "muxflow:v1 mode=offline gpus=4 waiting=free_node since=2026-11-23T12:14:05 rounds_every=60s"
        );
        let report = crate::records::report::JobReport::decode(&gang).unwrap();
        assert_eq!(report.mode, Some(crate::Mode::Offline));
        for not in [
            "muxflow:v1 mode=offline",
            "muxflow:v1 mode=online waiting=free_gpu",
            "muxflow:v1 mode=offline waiting=soon",
            "waiting=free_gpu",
        ] {
            assert_eq!(waiting(not), None, "{not}");
        }
    }

    #[test]
    fn only_the_written_slot_is_allowed() {
        let p = Placement::Gpu {
            node: "node1".into(),
            gpu: 0,
        };
        assert!(p.allows("node1", &[0]));
        assert!(!p.allows("node1", &[1]), "another GPU");
        assert!(!p.allows("node2", &[0]), "another node");
        assert!(!p.allows("node1", &[0, 1]), "an extra slot");
        assert!(!p.allows("node1", &[]), "no slot");
        let gang = Placement::on("node1", &[1, 0]);
        assert_eq!(
            gang.admin_comment(0, &none()),
            "muxflow:v1 mode=offline gpus=2 placed=node1:g0,g1"
        );
        assert_eq!(Placement::on("node1", &[0]), p, "one GPU: the single form");
        assert!(gang.allows("node1", &[1, 0]));
        assert!(!gang.allows("node1", &[0]), "fewer GPUs than placed");
        assert!(!gang.allows("node1", &[0, 1, 2]));
        assert!(!gang.allows("node2", &[0, 1]));
        assert!(Placement::AnySlot.allows("node9", &[1]));
        assert!(!Placement::AnySlot.allows("node9", &[]));
    }
}
