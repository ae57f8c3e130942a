use super::*;

#[test]
fn one_users_long_queue_does_not_keep_another_users_job_out_of_the_round() {
    let state = ClusterState {
        gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
        pending: (1..=40)
            .map(|id| job(id, "x", true, "", None))
            .chain([PendingJob {
                user: "other".into(),
                ..job(41, "x", true, "", None)
            }])
            .collect(),
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    let scored: Vec<u32> = p
        .decisions
        .iter()
        .filter(|d| !d.reason.starts_with("waiting:"))
        .map(|d| d.job)
        .collect();
    // The window (4 for one open GPU): the other user's one job and
    // the first user's three oldest.
    assert_eq!(scored, [1, 2, 3, 41]);
    assert_eq!(p.summary.waiting, 41 - HELD_JOBS_PER_OPEN_GPU);
}

/// Who a round places among equal jobs: 10 of `u` submitted first,
/// then 2 of `other`, on `gpus` GPUs.
fn placed_users(gpus: usize, fair_share: &[(&str, f64)]) -> Vec<String> {
    let state = ClusterState {
        gpus: ["a", "b", "c"][..gpus]
            .iter()
            .map(|n| gpu(n, HealthState::Healthy, 10, 4_000, false))
            .collect(),
        pending: (1..=10)
            .map(|id| job(id, "x", true, "", None))
            .chain((11..=12).map(|id| PendingJob {
                user: "other".into(),
                ..job(id, "x", true, "", None)
            }))
            .collect(),
        fair_share: fair_share
            .iter()
            .map(|&(u, f)| (u.to_string(), f))
            .collect(),
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    p.decisions
        .iter()
        .filter(|d| d.action == Action::Place)
        .map(|d| d.user.clone())
        .collect()
}

#[test]
fn equal_jobs_of_two_users_share_a_round_turn_by_turn() {
    // Not the two oldest (both u's): one each; then u again.
    assert_eq!(placed_users(2, &[]), ["u", "other"]);
    assert_eq!(
        placed_users(2, &[("u", 0.5), ("other", 0.5)]),
        ["u", "other"]
    );
    assert_eq!(placed_users(3, &[]), ["u", "u", "other"]);
}

#[test]
fn the_user_slurms_fair_share_owes_most_goes_first() {
    // `other` is owed more: its job takes the one GPU though younger,
    // and it has the extra turn on three; a user with no factor goes
    // after those with one.
    assert_eq!(placed_users(1, &[("u", 0.1), ("other", 0.9)]), ["other"]);
    assert_eq!(placed_users(1, &[("other", 0.2)]), ["other"]);
    assert_eq!(placed_users(1, &[("u", 0.9), ("other", 0.1)]), ["u"]);
    assert_eq!(
        placed_users(3, &[("u", 0.1), ("other", 0.9)]),
        ["u", "other", "other"]
    );
}

#[test]
fn a_change_of_fair_share_alone_is_a_new_round_not_the_last_one_reused() {
    let mut state = ClusterState {
        gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
        pending: vec![
            job(1, "x", true, "", None),
            PendingJob {
                user: "other".into(),
                ..job(2, "x", true, "", None)
            },
        ],
        fair_share: [("u".to_string(), 0.9), ("other".to_string(), 0.1)].into(),
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let mut cache = crate::round_cache::RoundCache::default();
    let mut round = |state: &ClusterState| {
        let p = plan_cached(
            state,
            &model(),
            &cfg.policy,
            &cfg.matcher,
            &names(),
            &mut cache,
            0,
        );
        let placed: Vec<u32> = p
            .decisions
            .iter()
            .filter(|d| d.action == Action::Place)
            .map(|d| d.job)
            .collect();
        (placed, cache.last)
    };
    assert_eq!(round(&state).0, [1]);
    // The cache keeps the pending queue only from the second call on
    // the same GPUs (round_cache, "Rounds where nothing changed"): the
    // third identical call is the first it can reuse.
    assert_eq!(round(&state).0, [1]);
    assert_eq!(
        round(&state),
        (vec![1], crate::round_cache::RoundKind::Reused)
    );
    state.fair_share = [("u".to_string(), 0.1), ("other".to_string(), 0.9)].into();
    let (placed, kind) = round(&state);
    assert_eq!(placed, [2], "the user now owed most goes first");
    assert_ne!(kind, crate::round_cache::RoundKind::Reused);
}

#[test]
fn jobs_no_node_can_take_do_not_fill_the_window() {
    // One open GPU on a node with 3 CPUs free: 40 older jobs asking for
    // 4 CPUs or 3 GPUs (one user's), then another user's placeable job.
    let mut pending: Vec<PendingJob> = (1..=20).map(|id| needing(id, 4, 0)).collect();
    pending.extend((21..=40).map(|id| PendingJob {
        gpus: 3,
        ..job(id, "x", true, "", None)
    }));
    pending.push(PendingJob {
        user: "other".into(),
        ..job(41, "small", true, "", None)
    });
    let state = ClusterState {
        gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
        pending,
        node_room: rooms(&[("a", 3, 100_000)]),
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    let of = |id: u32| p.decisions.iter().find(|d| d.job == id).unwrap();
    assert_eq!(of(41).node.as_deref(), Some("a"), "{}", p.table());
    assert_eq!(of(1).waiting, Some(Waiting::NodeRoom), "{}", of(1).reason);
    assert!(of(1).reason.contains("4 CPUs"), "{}", of(1).reason);
    assert_eq!(of(21).waiting, Some(Waiting::FreeNode), "{}", of(21).reason);
    assert_eq!(p.decisions.len(), 41, "a line for every pending job");
}

#[test]
fn a_long_queue_is_scored_only_up_to_the_window_oldest_first() {
    let state = ClusterState {
        gpus: vec![gpu("a", HealthState::Healthy, 10, 4_000, false)],
        pending: (1..=40)
            .map(|id| job(id, "x", true, "", None))
            .chain([job(99, "y", false, "gone", Some(0))])
            .collect(),
        ..ClusterState::default()
    };
    let cfg = muxflow::Config::default();
    let p = plan(&state, &model(), &cfg.policy, &cfg.matcher, &names());
    // One open GPU: the oldest held jobs of the window and the placed
    // job 99 are scored; the others wait, each with its line.
    let scored: Vec<u32> = p
        .decisions
        .iter()
        .filter(|d| !d.reason.starts_with("waiting:"))
        .map(|d| d.job)
        .collect();
    let want: Vec<u32> = (1..=HELD_JOBS_PER_OPEN_GPU as u32).chain([99]).collect();
    assert_eq!(scored, want);
    assert_eq!(p.decisions.len(), 41, "a line for every pending job");
    // The table is by job id.
    assert!(p.decisions.windows(2).all(|w| w[0].job < w[1].job));
    assert!(p
        .decisions
        .iter()
        .filter(|d| d.job > HELD_JOBS_PER_OPEN_GPU as u32 && d.job != 99)
        .all(|d| d.action == Action::None && d.update.is_none()));
    assert_eq!(p.summary.waiting, 40 - HELD_JOBS_PER_OPEN_GPU);
    assert_eq!(p.summary.pending_offline, 41);
    assert_eq!(
        p.decisions[0].node.as_deref(),
        Some("a"),
        "the oldest gets the GPU"
    );
}
