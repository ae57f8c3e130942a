use super::*;

#[test]
fn highest_total_wins_and_unhealthy_or_taken_gpus_get_nothing() {
    let state = ClusterState {
        gpus: vec![
            gpu("a", HealthState::Healthy, 10, 4_000, false),
            gpu("b", HealthState::Healthy, 60, 30_000, false),
            gpu("c", HealthState::Faulty, 0, 0, false),
            gpu("d", HealthState::Busy, 0, 0, false),
            gpu("e", HealthState::Healthy, 0, 0, true),
        ],
        pending: vec![
            job(1, "small", true, "", None),
            job(2, "big", true, "", None),
        ],
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    let at: Vec<_> = p.decisions.iter().map(|d| d.node.as_deref()).collect();
    // big only fits a; small goes to b; c (faulty), d (busy), e (slot
    // taken) are never used.
    assert_eq!(at, [Some("b"), Some("a")]);
    assert!((p.summary.predicted_total - 1.6).abs() < 1e-9);
    assert_eq!(p.summary.open_gpus, 2);
}

#[test]
fn a_gpu_whose_daemon_serves_one_user_takes_only_that_users_jobs() {
    // GPU at `node` with an online job of `online_user` (None: idle),
    // its daemon multi-user or not.
    let at = |node: &str, online_user: Option<&str>, multiuser: bool| {
        let mut g = gpu(node, HealthState::Healthy, 10, 4_000, false);
        g.published.multiuser = multiuser;
        if let Some(u) = online_user {
            g.owners = vec![Owner {
                user: u.to_string(),
                account: "a".into(),
            }];
        } else {
            g.online_jobs.clear();
        }
        g
    };
    let of = |id: u32, user: &str| PendingJob {
        user: user.into(),
        account: "a".into(),
        ..job(id, "small", true, "", None)
    };
    let of_account = |id: u32, user: &str, account: &str| PendingJob {
        account: account.into(),
        ..of(id, user)
    };
    struct Case {
        name: &'static str,
        gpus: Vec<GpuState>,
        jobs: Vec<PendingJob>,
        rule: CoLocate,
        /// (node, waiting) per job, in job order.
        want: Vec<(Option<&'static str>, Option<&'static str>)>,
    }
    let cases = [
        Case {
            name: "another user's job waits, naming why",
            gpus: vec![at("a", Some("alice"), false)],
            jobs: vec![of(1, "bob")],
            rule: CoLocate::Any,
            want: vec![(None, Some("same_user_only"))],
        },
        Case {
            name: "the online user's own job shares it",
            gpus: vec![at("a", Some("alice"), false)],
            jobs: vec![of(1, "alice")],
            rule: CoLocate::Any,
            want: vec![(Some("a"), None)],
        },
        Case {
            name: "a multi-user daemon takes any user",
            gpus: vec![at("a", Some("alice"), true)],
            jobs: vec![of(1, "bob")],
            rule: CoLocate::Any,
            want: vec![(Some("a"), None)],
        },
        Case {
            name: "the other user goes to the GPU it may share, the owner's job to its own",
            gpus: vec![at("a", Some("alice"), false), at("b", Some("carol"), true)],
            jobs: vec![of(1, "bob"), of(2, "alice")],
            rule: CoLocate::Any,
            want: vec![(Some("b"), None), (Some("a"), None)],
        },
        Case {
            name: "an idle one-user GPU takes one job of a round, not two users' at once",
            gpus: vec![at("a", None, false)],
            jobs: vec![of(1, "bob"), of(2, "alice")],
            rule: CoLocate::Any,
            want: vec![(Some("a"), None), (None, Some("faster_jobs_first"))],
        },
        Case {
            name: "co_locate = same_account: another account's job waits, naming the rule",
            gpus: vec![at("a", Some("alice"), true)],
            jobs: vec![of_account(1, "bob", "b")],
            rule: CoLocate::SameAccount,
            want: vec![(None, Some("co_locate"))],
        },
        Case {
            name: "co_locate = same_account: the same account's other user shares it",
            gpus: vec![at("a", Some("alice"), true)],
            jobs: vec![of(1, "bob")],
            rule: CoLocate::SameAccount,
            want: vec![(Some("a"), None)],
        },
        Case {
            name: "co_locate = same_user: the same account's other user waits",
            gpus: vec![at("a", Some("alice"), true)],
            jobs: vec![of(1, "bob")],
            rule: CoLocate::SameUser,
            want: vec![(None, Some("co_locate"))],
        },
    ];
    let mut cfg = muxflow::Config::default();
    cfg.policy.offline_per_gpu = 2;
    for case in cases {
        cfg.policy.co_locate = case.rule;
        let state = ClusterState {
            gpus: case.gpus,
            pending: case.jobs,
            ..ClusterState::default()
        };
        let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
        let got: Vec<_> = p
            .decisions
            .iter()
            .map(|d| (d.node.as_deref(), d.waiting.map(Waiting::code)))
            .collect();
        assert_eq!(got, case.want, "{}", case.name);
    }
}

fn targets(p: &Plan) -> Vec<(u32, Option<&str>, Option<&'static str>)> {
    p.decisions
        .iter()
        .map(|d| (d.job, d.node.as_deref(), d.waiting.map(Waiting::code)))
        .collect()
}

#[test]
fn gpus_on_nodes_without_the_cpus_or_memory_asked_for_get_no_job() {
    let state = ClusterState {
        // a's online job leaves more SMs: every job is faster there.
        gpus: vec![
            gpu("a", HealthState::Healthy, 10, 4_000, false),
            gpu("b", HealthState::Healthy, 60, 4_000, false),
        ],
        pending: vec![
            needing(1, 2, 1_000),
            needing(2, 1, 9_000),
            needing(3, 16, 0),
        ],
        node_room: rooms(&[("a", 1, 64_000), ("b", 8, 8_000)]),
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    // 1 needs 2 CPUs (a has 1 free), 2 needs 9,000 MiB (b has 8,000),
    // 3 needs 16 CPUs: no node has them.
    assert_eq!(
        targets(&p),
        [
            (1, Some("b"), None),
            (2, Some("a"), None),
            (3, None, Some("node_room"))
        ]
    );
    let reason = &p.decisions[2].reason;
    assert!(reason.contains("the 16 CPUs it asked for"), "{reason}");
    // A node not listed is not known: no limit.
    let state = ClusterState {
        pending: vec![needing(3, 16, 0)],
        node_room: rooms(&[("b", 8, 8_000)]),
        ..state
    };
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    assert_eq!(targets(&p), [(3, Some("a"), None)]);
}

#[test]
fn jobs_placed_on_one_node_in_one_round_fit_its_room_together() {
    let on = |node: &str, index: u32, solo: u8| GpuState {
        index,
        published: GpuPublished {
            index,
            ..gpu(node, HealthState::Healthy, solo, 4_000, false).published
        },
        ..gpu(node, HealthState::Healthy, solo, 4_000, false)
    };
    let gpus = vec![on("a", 0, 10), on("a", 1, 10), on("b", 0, 60)];
    let cfg = muxflow::Config::default();
    let round = |pending: Vec<PendingJob>, room: &[(&str, u32, u64)], memory: bool| {
        let state = ClusterState {
            gpus: gpus.clone(),
            pending,
            node_room: rooms(room),
            memory_consumable: memory,
            ..ClusterState::default()
        };
        let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
        let mut t: Vec<_> = targets(&p)
            .into_iter()
            .map(|(j, n, w)| (j, n.map(str::to_string), w))
            .collect();
        t.sort();
        (t, p)
    };
    // Two jobs of 2 CPUs on a's two GPUs; a has 3 CPUs free: one waits.
    let (t, p) = round(
        vec![needing(1, 2, 0), needing(2, 2, 0)],
        &[("a", 3, 64_000)],
        false,
    );
    assert_eq!(
        t,
        [(1, Some("a".into()), None), (2, None, Some("node_room"))],
        "{}",
        p.table()
    );
    assert!(
        p.decisions[1]
            .reason
            .contains("jobs placed on a this round"),
        "{}",
        p.table()
    );
    // A job already hinted to a keeps its place before a new one.
    let kept = PendingJob {
        required_nodes: "a".into(),
        ..needing(2, 2, 0)
    };
    let (t, _) = round(vec![needing(1, 2, 0), kept], &[("a", 3, 64_000)], false);
    assert_eq!(
        t,
        [(1, None, Some("node_room")), (2, Some("a".into()), None)]
    );
    // Memory counts together only where Slurm counts it.
    let big = || vec![needing(1, 1, 40_000), needing(2, 1, 40_000)];
    let (t, _) = round(big(), &[("a", 8, 64_000)], false);
    assert_eq!(
        t,
        [(1, Some("a".into()), None), (2, Some("a".into()), None)]
    );
    let (t, _) = round(big(), &[("a", 8, 64_000)], true);
    assert_eq!(
        t,
        [(1, Some("a".into()), None), (2, None, Some("node_room"))]
    );
}

#[test]
fn a_round_with_nothing_pending_reads_zero_and_exact() {
    let state = ClusterState {
        gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    let line = p.summary_line();
    assert!(line.contains("predicted total 0.000,"), "{line}");
    assert!(line.contains("(exact over every pair)"), "{line}");
}

fn idle(node: &str, state: HealthState) -> GpuState {
    GpuState {
        online_jobs: vec![],
        ..gpu(node, state, 0, 0, false)
    }
}

#[test]
fn idle_gpus_take_offline_work_at_solo_speed_and_lose_ties_to_shared_ones() {
    let mut m = model();
    m.profiles.insert(
        ("u".into(), "huge".into()),
        crate::predict::Profile {
            peak_mib: Some(80_000),
            ..Default::default()
        },
    );
    let cfg = muxflow::Config::default();
    struct Case {
        name: &'static str,
        gpus: Vec<GpuState>,
        jobs: Vec<PendingJob>,
        /// (node, reason starts with) per job, in job order.
        want: Vec<(Option<&'static str>, &'static str)>,
    }
    let cases = [
        Case {
            name: "a tie (both predicted 1.0): the shared GPU",
            gpus: vec![
                gpu("a", HealthState::Healthy, 10, 4_000, false),
                idle("b", HealthState::Healthy),
            ],
            jobs: vec![job(1, "small", true, "", None)],
            want: vec![(Some("a"), "best total predicted throughput (online job 1)")],
        },
        Case {
            name: "big fits only the idle GPU (60 GB, 30 GB online beside)",
            gpus: vec![
                gpu("a", HealthState::Healthy, 10, 30_000, false),
                idle("b", HealthState::Healthy),
            ],
            jobs: vec![job(1, "big", true, "", None)],
            want: vec![(Some("b"), IDLE_REASON)],
        },
        Case {
            name: "an idle cluster: every job on an idle GPU, not on a faulty or taken one",
            gpus: vec![
                idle("a", HealthState::Healthy),
                idle("b", HealthState::Faulty),
                GpuState {
                    slots_used: 1,
                    ..idle("c", HealthState::Healthy)
                },
                idle("d", HealthState::Healthy),
            ],
            jobs: vec![
                job(1, "small", true, "", None),
                job(2, "big", true, "", None),
                job(3, "small", true, "", None),
            ],
            want: vec![
                (Some("a"), IDLE_REASON),
                (Some("d"), IDLE_REASON),
                (None, "its candidate GPUs went to jobs with a higher total"),
            ],
        },
        Case {
            name: "more memory than an idle GPU leaves (80 GB > 81559 - 2048 MiB)",
            gpus: vec![idle("a", HealthState::Healthy)],
            jobs: vec![job(1, "huge", true, "", None)],
            want: vec![(None, "no candidate")],
        },
    ];
    for c in cases {
        let state = ClusterState {
            gpus: c.gpus,
            pending: c.jobs,
            ..ClusterState::default()
        };
        let p = plan(&state, &m, &cfg.policy, &cfg.matcher, &names());
        let got: Vec<(Option<&str>, &str)> = p
            .decisions
            .iter()
            .map(|d| (d.node.as_deref(), d.reason.as_str()))
            .collect();
        assert_eq!(got.len(), c.want.len(), "{}", c.name);
        for ((node, reason), (want_node, want_reason)) in got.iter().zip(&c.want) {
            assert_eq!(node, want_node, "{}: {:?}", c.name, p.decisions);
            assert!(reason.starts_with(want_reason), "{}: {reason}", c.name);
        }
        for d in p.decisions.iter().filter(|d| d.reason == IDLE_REASON) {
            assert_eq!(
                (d.predicted, d.confidence),
                (Some(1.0), Some(0.0)),
                "{}",
                c.name
            );
        }
        assert_eq!(
            p.summary.idle_gpus,
            state
                .gpus
                .iter()
                .filter(|g| g.online_jobs.is_empty())
                .count()
        );
    }
}

#[test]
fn a_gang_takes_k_gpus_of_one_node_and_is_written_as_its_slots() {
    let at = |node: &str, index: u32, g: GpuState| GpuState {
        node: node.into(),
        index,
        published: GpuPublished {
            index,
            ..g.published
        },
        ..g
    };
    let state = ClusterState {
        gpus: vec![
            at("a", 0, idle("a", HealthState::Healthy)),
            at("a", 1, idle("a", HealthState::Healthy)),
            at("b", 0, gpu("b", HealthState::Healthy, 10, 4_000, false)),
            at("c", 0, idle("c", HealthState::Healthy)),
        ],
        pending: vec![
            PendingJob {
                gpus: 2,
                ..job(1, "small", true, "", None)
            },
            job(2, "small", true, "", None),
            PendingJob {
                gpus: 3,
                ..job(3, "small", true, "", None)
            },
        ],
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    let d = &p.decisions;
    assert_eq!(
        (d[0].node.as_deref(), &d[0].gpus[..]),
        (Some("a"), &[0, 1][..])
    );
    assert!(d[0].reason.starts_with("gang of 2 GPUs"), "{}", d[0].reason);
    assert_eq!(
        d[0].update.as_ref().unwrap()[0][3..],
        [
            "Gres=mfslot:g0:1,mfslot:g1:1",
            "AdminComment=muxflow:v1 mode=offline gpus=2 placed=a:g0,g1",
            "Priority=0"
        ]
    );
    // The 1-GPU job goes beside the online job (the tie rule) on b.
    assert_eq!(d[1].node.as_deref(), Some("b"));
    // No node has 3 GPUs.
    assert_eq!(d[2].action, Action::None);
    assert!(
        d[2].reason.starts_with("no candidate: no node with 3"),
        "{}",
        d[2].reason
    );
    // The total counts the gang twice (two GPUs at its slowest speed).
    assert!(
        (p.summary.predicted_total - 3.0).abs() < 1e-5,
        "{:?}",
        p.summary
    );
    assert!(p.table().contains(" 0,1 "), "{}", p.table());
    // With two slots per GPU the gang takes every free slot of each of
    // its GPUs (its part of each as large as a 1-GPU job's alone); a
    // GPU one running job holds a slot of gives it the other one.
    let mut cfg = muxflow::Config::default();
    cfg.policy.offline_per_gpu = 2;
    let mut two = state.clone();
    two.pending.truncate(1);
    let p = plan(&two, &model(), &cfg.policy, &cfg.matcher, &names());
    assert_eq!(p.decisions[0].slots, [2, 2], "{:?}", p.decisions);
    assert_eq!(
        p.decisions[0].update.as_ref().unwrap()[0][3],
        "Gres=mfslot:g0:2,mfslot:g1:2"
    );
    two.gpus[1].slots_used = 1;
    two.gpus[1].offline_jobs = 1;
    let p = plan(&two, &model(), &cfg.policy, &cfg.matcher, &names());
    assert_eq!(p.decisions[0].slots, [2, 1], "{:?}", p.decisions);
}

#[test]
fn updates_are_bounded_parks_first_and_the_rest_deferred() {
    let state = ClusterState {
        gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
        pending: vec![
            // Placed on a GPU that is gone; typed for GPU 1, so it cannot
            // go to a (22.05 keeps the first slot type): parked again.
            job(1, "x", false, "gone", Some(1)),
            job(2, "y", true, "", None),
            job(3, "z", true, "", Some(1)),
        ],
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let mut matcher = cfg.matcher.clone();
    let p = plan(&state, &model(), &cfg.policy, &matcher, &names());
    let d: Vec<_> = p
        .decisions
        .iter()
        .map(|d| (d.job, d.action, d.update.clone()))
        .collect();
    let call = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let args = |calls: &[&[&str]]| Some(calls.iter().map(|v| call(v)).collect::<Vec<_>>());
    assert_eq!(
        d,
        [
            (1, Action::Park, args(&[&["hold", "1"]])),
            (
                2,
                Action::Place,
                args(&[
                    &[
                        "update",
                        "JobId=2",
                        "ReqNodeList=a",
                        "Gres=mfslot:g0:1",
                        "AdminComment=muxflow:v1 mode=offline placed=a:g0",
                        "Priority=0"
                    ],
                    &["release", "2"]
                ])
            ),
            (3, Action::None, None),
        ]
    );
    // One update per round: the park goes first, the placement waits.
    matcher.max_updates_per_round = 1;
    let p = plan(&state, &model(), &cfg.policy, &matcher, &names());
    assert_eq!((p.summary.updates, p.summary.deferred), (1, 1));
    assert_eq!(p.notes_budget(&matcher), 0, "nothing left for notes");
    matcher.max_updates_per_round = 5;
    assert_eq!(p.notes_budget(&matcher), 4, "what the updates left");
    matcher.max_updates_per_round = 1;
    assert!(p.decisions[0].update.is_some());
    assert!(p.decisions[1].update.is_none());
    assert!(
        p.decisions[1].reason.starts_with("deferred"),
        "{:?}",
        p.decisions[1]
    );
}
