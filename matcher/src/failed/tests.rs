use super::*;
use muxflow::records::report::JobReport;

fn key(name: &str) -> JobKey {
    ("u".into(), name.into())
}

const V100: u64 = 16_384;
const A100: u64 = 81_920;

/// Job `j` beside partner `p` on a `model` GPU, its slot capped at `cap`.
fn start<'a>(j: &'a JobKey, p: Option<&'a JobKey>, model: u64, cap: u64) -> Start<'a> {
    Start {
        job: j,
        partner: p,
        model_mib: model,
        cap_mib: cap,
        beside_offline: false,
    }
}

/// A GPU of `model` whose online job is `online`.
fn state(model: u64, online: u32) -> GpuState {
    use muxflow::policy::health::HealthState;
    use muxflow::records::published::GpuPublished;
    GpuState {
        node: "n1".into(),
        index: 0,
        published: GpuPublished {
            index: 0,
            state: HealthState::Healthy,
            solo_sm_pct: None,
            online_mem_mib: None,
            mem_mib: model,
            offline: 0,
            multiuser: true,
            power_w: None,
        },
        online_jobs: vec![online],
        slots_used: 0,
        offline_jobs: 0,
        owners: Vec::new(),
    }
}

fn gpu(f: &FailedPlacements, partner: Option<&JobKey>, model: u64) -> GpuLessons {
    let partner = partner.and_then(|p| f.partner_index.get(p).copied());
    GpuLessons {
        model_mib: model,
        partner,
        shunned: f.shunned(partner, model),
    }
}

/// One row per case: what a failure of job J beside S (V100, cap 8,000 MiB,
/// J's peak 5,000: the GPU was full) rules out, and what it leaves open.
#[test]
fn a_device_full_failure_reaches_partners_at_least_as_large_on_that_model() {
    let (j, s, t) = (key("j"), key("s"), key("t"));
    let mut f = FailedPlacements::default();
    f.failed(&start(&j, Some(&s), V100, 8_000), 5_000);
    let l = f.job(&j);
    let cases: [(&str, Option<&JobKey>, u64, u64, bool); 6] = [
        (
            "the same partner, model and room",
            Some(&s),
            V100,
            8_000,
            true,
        ),
        (
            "the same partner with less room",
            Some(&s),
            V100,
            6_000,
            true,
        ),
        (
            "another partner leaving no more room",
            Some(&t),
            V100,
            8_000,
            true,
        ),
        (
            "another partner leaving more room",
            Some(&t),
            V100,
            9_000,
            false,
        ),
        (
            "the same partner on another model",
            Some(&s),
            A100,
            8_000,
            false,
        ),
        (
            "the same partner leaving more room",
            Some(&s),
            V100,
            8_001,
            false,
        ),
    ];
    for (what, p, model, room, out) in cases {
        assert_eq!(l.rules_out(&gpu(&f, p, model), room), out, "{what}");
    }
    assert_eq!(l.needs_above_mib, None, "its own peak stayed below its cap");
}

#[test]
fn a_run_at_least_as_tight_withdraws_the_reach_but_never_the_exact_pair() {
    let (j, s, t) = (key("j"), key("s"), key("t"));
    let mut f = FailedPlacements::default();
    f.failed(&start(&j, Some(&s), V100, 8_000), 5_000);
    // A run beside T with only 7,000 MiB: memory was not what failed
    // beside S (S uses more than it published).
    f.ran(&start(&j, Some(&t), V100, 7_000));
    let l = f.job(&j);
    assert!(!l.rules_out(&gpu(&f, Some(&t), V100), 8_000), "T again");
    assert!(
        l.rules_out(&gpu(&f, Some(&s), V100), 8_000),
        "S never again"
    );
    // A looser run elsewhere is no evidence against the reach.
    let mut g = FailedPlacements::default();
    g.failed(&start(&j, Some(&s), V100, 8_000), 5_000);
    g.ran(&start(&j, Some(&t), V100, 9_000));
    assert!(g.job(&j).rules_out(&gpu(&g, Some(&t), V100), 8_000));
    // The pair itself ran with as much room since: new evidence.
    let mut h = FailedPlacements::default();
    h.failed(&start(&j, Some(&s), V100, 8_000), 5_000);
    h.ran(&start(&j, Some(&s), V100, 7_000));
    h.ran(&start(&j, Some(&s), V100, 8_000));
    assert!(!h.job(&j).rules_out(&gpu(&h, Some(&s), V100), 8_000));
}

#[test]
fn a_peak_at_the_cap_is_a_need_above_it_anywhere() {
    let (j, s) = (key("j"), key("s"));
    let cases: [(&str, u64, bool, Option<u64>); 3] = [
        ("its peak reached its cap", 8_000, false, Some(8_000)),
        ("beside other offline jobs", 3_000, true, Some(8_000)),
        ("below its cap, alone beside S", 3_000, false, None),
    ];
    for (what, peak, beside_offline, needs) in cases {
        let mut f = FailedPlacements::default();
        f.failed(
            &Start {
                beside_offline,
                ..start(&j, Some(&s), V100, 8_000)
            },
            peak,
        );
        assert_eq!(f.job(&j).needs_above_mib, needs, "{what}");
    }
    // On an idle GPU there is no partner to blame: its own need.
    let mut f = FailedPlacements::default();
    f.failed(&start(&j, None, V100, 12_000), 3_000);
    assert_eq!(f.job(&j).needs_above_mib, Some(12_000));
}

#[test]
fn every_replica_of_a_partner_is_that_partner() {
    let (j, s) = (key("j"), key("s"));
    let mut f = FailedPlacements::default();
    f.note_partner(41, &s);
    f.note_partner(42, &s);
    f.failed(&start(&j, Some(&s), V100, 8_000), 5_000);
    f.ran(&start(&j, Some(&key("t")), V100, 1_000));
    let g = f.gpu(&state(V100, 42));
    assert_eq!(g.partner, f.partner_index.get(&s).copied());
    assert!(f.job(&j).rules_out(&g, 8_000), "the other replica");
    let other = f.gpu(&state(V100, 43));
    assert!(!f.job(&j).rules_out(&other, 8_000), "another service");
}

/// The daemon's memory from its history: a failed run and a run beside
/// the same partner in the records, the GPU's model read from the state.
#[test]
fn the_daemon_rebuilds_it_from_its_history() {
    let run = |id: u32, oom: u64, cap: u64| Run {
        job_id: id,
        key: key("j"),
        report: JobReport {
            node: Some("n1".into()),
            gpu: Some(0),
            partner: Some(7),
            mem_cap_mib: Some(cap),
            measured_peak_mib: Some(4_000),
            oom: Some(oom),
            ..JobReport::default()
        },
        end_s: 1,
        partner_key: Some(key("s")),
    };
    let model_of = |node: &str, gpu: u32| (node == "n1" && gpu == 0).then_some(V100);
    let f = FailedPlacements::from_runs(&[run(1, 1, 8_000)], model_of);
    assert!(f.job(&key("j")).rules_out(&f.gpu(&state(V100, 7)), 8_000));
    // A GPU the state no longer lists teaches nothing of a model.
    let none = FailedPlacements::from_runs(&[run(1, 1, 8_000)], |_, _| None);
    assert_eq!(none.job(&key("j")), JobLessons::default());
}

/// Through the round: job J fails beside service S1 on GPU a (the GPU
/// the model prefers for it); the next round puts it beside S2 on b,
/// which leaves it more room, and the model alone would have tried a
/// again.
#[test]
fn the_round_does_not_propose_a_failed_placement_again() {
    use crate::reader::ClusterState;
    use crate::round::plan;
    let at = |node: &str, online: u32, solo: u8, online_mem: u64| {
        let mut g = state(A100, online);
        g.node = node.into();
        g.published.solo_sm_pct = Some(solo);
        g.published.online_mem_mib = Some(online_mem);
        g
    };
    let cfg = muxflow::Config::default();
    let cluster = ClusterState {
        gpus: vec![at("a", 1, 10, 30_000), at("b", 2, 60, 4_000)],
        pending: vec![PendingJob {
            id: 9,
            user: "u".into(),
            account: String::new(),
            name: "j".into(),
            required_nodes: String::new(),
            slot_gpus: Vec::new(),
            gpus: 1,
            slots: Vec::new(),
            held: true,
            waiting: None,
            refusals: 0,
            earlier: Default::default(),
            need: Default::default(),
            array_task: None,
            unstartable: None,
        }],
        ..ClusterState::default()
    };
    let names = crate::reader::Names::from_config(&muxflow::config::Slurm::default());
    let model = Model::default();
    let node_of = |failed: &FailedPlacements| {
        let p = plan(
            &cluster,
            &Remembering {
                model: &model,
                failed,
            },
            &cfg.policy,
            &cfg.matcher,
            &names,
        );
        p.decisions[0].node.clone()
    };
    let mut f = FailedPlacements::default();
    f.note_partner(1, &key("s1"));
    f.note_partner(2, &key("s2"));
    assert_eq!(node_of(&f).as_deref(), Some("a"), "nothing learned yet");
    let room_a = crate::predict::memory_room_mib(&cluster.gpus[0], &cfg.policy);
    f.failed(&start(&key("j"), Some(&key("s1")), A100, room_a), 1_000);
    assert_eq!(node_of(&f).as_deref(), Some("b"));
    // Failed beside k services and run beside none: no GPU beside an
    // online job is a candidate, and its reason says why it waits.
    let mut g = FailedPlacements::default();
    g.note_partner(1, &key("s1"));
    g.note_partner(2, &key("s2"));
    let others: Vec<JobKey> = (0..40).map(|i| key(&format!("o{i}"))).collect();
    for o in &others {
        g.ran(&start(o, Some(&key("t")), V100, 8_000));
    }
    for i in 0..g.shun_after() {
        g.failed(
            &start(&key("j"), Some(&key(&format!("x{i}"))), V100, 8_000),
            1_000,
        );
    }
    assert!(g.job(&key("j")).idle_only);
    let p = plan(
        &cluster,
        &Remembering {
            model: &model,
            failed: &g,
        },
        &cfg.policy,
        &cfg.matcher,
        &names,
    );
    assert_eq!(p.decisions[0].node, None);
    assert_eq!(p.decisions[0].reason, IDLE_ONLY_REASON);
}

/// A partner that failed `k` jobs (the GPU full each time) and hosted none
/// gets no new job on that model; one run beside it lifts that. `k`
/// follows the cluster's failure rate beside partners.
#[test]
fn a_partner_that_failed_k_jobs_and_hosted_none_gets_no_new_one() {
    let (s, t, x) = (key("s"), key("t"), key("x"));
    let jobs: Vec<JobKey> = (0..10).map(|i| key(&format!("j{i}"))).collect();
    let mut f = FailedPlacements::default();
    // No starts yet: r = 1/2, the fewest k with r^k <= 1 % is 7.
    assert_eq!(f.shun_after(), 7);
    // Twenty runs beside t: the cluster's rate falls, k with it.
    let others: Vec<JobKey> = (0..20).map(|i| key(&format!("o{i}"))).collect();
    for o in &others {
        f.ran(&start(o, Some(&t), V100, 8_000));
    }
    assert_eq!(f.shun_after(), 3, "r = 1/22: 2 by the rate, 3 at least");
    f.failed(&start(&jobs[0], Some(&s), V100, 8_000), 5_000);
    let shunned =
        |f: &FailedPlacements, p: &JobKey, model| gpu(f, Some(p), model).shunned != Shunned::No;
    assert!(!shunned(&f, &s, V100), "one failure");
    f.failed(&start(&jobs[1], Some(&s), V100, 8_000), 5_000);
    let k = f.shun_after();
    for j in &jobs[2..] {
        if shunned(&f, &s, V100) {
            break;
        }
        f.failed(&start(j, Some(&s), V100, 8_000), 5_000);
    }
    assert!(shunned(&f, &s, V100), "after {k} and more");
    // Even with a great deal of room, a new job is kept off it there ...
    assert!(f.job(&x).rules_out(&gpu(&f, Some(&s), V100), 16_000));
    // ... not on another model, nor beside a partner that hosted jobs.
    assert!(!f.job(&x).rules_out(&gpu(&f, Some(&s), A100), 16_000));
    assert!(!f.job(&x).rules_out(&gpu(&f, Some(&t), V100), 16_000));
    // A job whose own peak reached its cap does not count against it.
    let mut g = FailedPlacements::default();
    for o in &others {
        g.ran(&start(o, Some(&t), V100, 8_000));
    }
    for j in &jobs {
        g.failed(&start(j, Some(&s), V100, 8_000), 8_000);
    }
    assert!(!shunned(&g, &s, V100), "the jobs' own needs");
    // One run beside it lifts it.
    f.ran(&start(&x, Some(&s), V100, 8_000));
    assert!(!shunned(&f, &s, V100));
}

/// One user's failures beside a partner keep only that user's jobs from
/// it, whatever names they carry: a user could otherwise fail `k` jobs on
/// purpose and keep every other user's jobs from that service. A second
/// user's failure there makes it everyone's.
#[test]
fn one_users_failures_keep_only_that_users_jobs_from_a_partner() {
    let s = key("s");
    let mallory: Vec<JobKey> = (0..10)
        .map(|i| ("mallory".into(), format!("m{i}")))
        .collect();
    let mallory_next: JobKey = ("mallory".into(), "fresh".into());
    let alice: JobKey = ("alice".into(), "train".into());
    let bob: JobKey = ("bob".into(), "train".into());
    let mut f = FailedPlacements::default();
    let others: Vec<JobKey> = (0..20).map(|i| key(&format!("o{i}"))).collect();
    for o in &others {
        f.ran(&start(o, Some(&key("t")), V100, 8_000));
    }
    let k = f.shun_after() as usize;
    for m in &mallory[..k] {
        f.failed(&start(m, Some(&s), V100, 8_000), 5_000);
    }
    let on_s = gpu(&f, Some(&s), V100);
    assert!(
        matches!(on_s.shunned, Shunned::For(_)),
        "{:?}",
        on_s.shunned
    );
    assert!(
        f.job(&mallory_next).rules_out(&on_s, 16_000),
        "the user's own next job"
    );
    assert!(
        !f.job(&alice).rules_out(&on_s, 16_000),
        "another user's job"
    );
    // The class key tells the two users' lesson-free jobs apart.
    assert_ne!(f.job(&mallory_next).key(), f.job(&alice).key());
    // A failure of another user's job there: every user's jobs.
    f.failed(&start(&bob, Some(&s), V100, 8_000), 5_000);
    let on_s = gpu(&f, Some(&s), V100);
    assert_eq!(on_s.shunned, Shunned::All);
    assert!(f.job(&alice).rules_out(&on_s, 16_000));
}

/// A job that failed beside `k` partners (the GPU full) and ran beside
/// none goes to idle GPUs only; a run beside a partner lifts that.
#[test]
fn a_job_that_failed_beside_k_partners_and_ran_beside_none_goes_idle_only() {
    let j = key("j");
    let partners: Vec<JobKey> = (0..10).map(|i| key(&format!("s{i}"))).collect();
    let mut f = FailedPlacements::default();
    let others: Vec<JobKey> = (0..20).map(|i| key(&format!("o{i}"))).collect();
    for o in &others {
        f.ran(&start(o, Some(&partners[9]), V100, 8_000));
    }
    // A lot of room beside a partner it never met: not ruled out yet.
    f.failed(&start(&j, Some(&partners[0]), V100, 8_000), 5_000);
    assert!(!f.job(&j).idle_only);
    assert!(!f
        .job(&j)
        .rules_out(&gpu(&f, Some(&partners[8]), V100), 9_000));
    for p in &partners[1..8] {
        if f.job(&j).idle_only {
            break;
        }
        f.failed(&start(&j, Some(p), V100, 8_000), 5_000);
    }
    let l = f.job(&j);
    assert!(l.idle_only);
    assert!(l.rules_out(&gpu(&f, Some(&partners[8]), A100), 80_000));
    // An idle GPU is not beside a partner: the round asks solo() there,
    // which the lessons leave to the model (the_round_does_not_propose_…).
    assert_ne!(l.key(), FailedPlacements::default().job(&j).key());
    f.ran(&start(&j, Some(&partners[9]), A100, 40_000));
    assert!(!f.job(&j).idle_only);
}
