use super::*;
use muxflow::policy::health::HealthState;
use muxflow::records::published::GpuPublished;
use muxflow::records::report::GangGpu;

fn key(u: &str, n: &str) -> JobKey {
    (u.to_string(), n.to_string())
}

#[test]
fn learned_model_beats_the_default_on_held_out_pairs() {
    let runs = synthetic_runs(60, 12, 7);
    let e = evaluate(&runs);
    assert!(e.test_pairs > 20 && e.train_pairs > 100, "{e:?}");
    assert!(e.model_mae < e.default_mae * 0.5, "{e}");
    assert!(e.model_mae <= e.rowcol_mae, "{e}");
    assert!(
        e.model_pairing > e.default_pairing - 0.05 && e.model_pairing > 0.8,
        "{e}"
    );
}

#[test]
fn a_planted_low_rank_matrix_is_recovered_from_a_third_of_its_pairs() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (rows, cols) = (30, 20);
    let a: Vec<f64> = (0..rows).map(|_| rng.gen_range(0.1..0.9)).collect();
    let b: Vec<f64> = (0..cols).map(|_| rng.gen_range(0.1..0.9)).collect();
    let x = |i: usize, k: usize| 1.0 - a[i] * b[k];
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for i in 0..rows {
        for k in 0..cols {
            let p = PairObs {
                job: key("u", &format!("j{i}")),
                partner: key("s", &format!("k{k}")),
                x: x(i, k),
                runs: 3,
                share: 0.5,
                mem: 0.5,
                rate: DEFAULT_RATE,
            };
            if rng.gen_bool(0.33) {
                train.push(p)
            } else {
                test.push(p)
            }
        }
    }
    let m = Model::from_estimates(&Estimates {
        pairs: train.clone(),
        ..Estimates::default()
    });
    let e = score(&m, &train, &test);
    assert!(e.model_mae < 0.03, "{e}");
    assert!(e.model_mae < e.rowcol_mae * 0.6, "{e}");
    assert!(e.model_pairing > 0.98, "{e}");
}

/// A gang beside two different online jobs says nothing about either
/// pair; beside one online job on all its GPUs it is that pair's run.
#[test]
fn gang_runs_count_only_beside_one_partner() {
    let (runs, _, _) = synthetic(1, 12, 5);
    let base = estimate(&runs);
    // Partner id k + 1 is ("svc", "online-k") in `synthetic`.
    let pair_x = |e: &Estimates, id: u32| {
        let want: JobKey = ("svc".into(), format!("online-{}", id - 1));
        e.pairs
            .iter()
            .find(|p| p.partner == want)
            .map(|p| (p.x, p.runs))
    };
    let first = runs[0].report.partner.unwrap();
    let before = pair_x(&base, first).unwrap();
    // The same pair, a run far slower than any before, as a gang whose
    // second GPU was beside another online job, then beside the same.
    let mut gang = runs[0].clone();
    gang.job_id = 99_999;
    gang.report.launches = gang.report.launches.map(|l| l / 10);
    gang.report.gang = vec![GangGpu {
        gpu: 1,
        partner: Some(first % 8 + 1),
        ..GangGpu::default()
    }];
    let mixed: Vec<Run> = runs.iter().cloned().chain([gang.clone()]).collect();
    assert_eq!(pair_x(&estimate(&mixed), first), Some(before));
    gang.report.gang[0].partner = gang.report.partner;
    let same: Vec<Run> = runs.iter().cloned().chain([gang]).collect();
    let after = pair_x(&estimate(&same), first).unwrap();
    assert_eq!(after.1, before.1 + 1);
    assert!(after.0 < before.0, "{after:?} vs {before:?}");
}

/// A run that shared its GPU with other offline jobs is slower for
/// their sake: neither its solo speed nor its pair may learn from it.
#[test]
fn runs_beside_other_offline_jobs_teach_nothing() {
    let (mut runs, _, _) = synthetic(1, 12, 5);
    let first = runs[0].report.partner.unwrap();
    let mut alone = runs[0].clone();
    alone.report.partner = None;
    alone.report.partner_load_pct = None;
    alone.partner_key = None;
    runs.push(alone);
    let base = estimate(&runs);
    let profile = |e: &Estimates| e.profiles[&runs[0].key].clone();
    let pair = |e: &Estimates| {
        let want: JobKey = ("svc".into(), format!("online-{}", first - 1));
        e.pairs.iter().find(|p| p.partner == want).cloned().unwrap()
    };
    // The same runs a third as fast, beside another offline job: alone
    // and beside the first partner.
    let slow: Vec<Run> = runs[..1]
        .iter()
        .chain(runs.last())
        .map(|r| {
            let mut r = r.clone();
            r.job_id += 50_000;
            r.report.launches = r.report.launches.map(|l| l / 3);
            r.report.peers = vec![77];
            r
        })
        .collect();
    let with = estimate(&runs.iter().cloned().chain(slow.clone()).collect::<Vec<_>>());
    assert_eq!(profile(&with).solo, profile(&base).solo);
    assert_eq!(pair(&with), pair(&base));
    assert_eq!(profile(&with).runs, profile(&base).runs + 2);
    assert_eq!(profile(&with).peer_runs, 2);
    // Failing for memory beside another offline job: no pair is ruled
    // out, but the job needs more than the cap it had there.
    let mut failed = runs[0].clone();
    failed.job_id = 70_000;
    failed.report.launches = None;
    failed.report.oom = Some(1);
    failed.report.mem_cap_mib = Some(30_000);
    failed.report.peers = vec![77];
    let e = estimate(
        &runs
            .iter()
            .cloned()
            .chain([failed.clone()])
            .collect::<Vec<_>>(),
    );
    assert!(e.infeasible.is_empty());
    assert_eq!(profile(&e).peak_mib, Some(30_001));
    failed.report.peers.clear();
    let e = estimate(&runs.iter().cloned().chain([failed]).collect::<Vec<_>>());
    assert_eq!(e.infeasible.len(), 1, "alone with its partner: the pair's");
    // Without the peers they are read as the job's own runs (the check
    // above can fail).
    let unmarked: Vec<Run> = slow
        .into_iter()
        .map(|mut r| {
            r.report.peers.clear();
            r
        })
        .collect();
    let read = estimate(&runs.iter().cloned().chain(unmarked).collect::<Vec<_>>());
    assert!(profile(&read).solo < profile(&base).solo);
}

/// What other offline jobs on its GPU cost a job is learned from its
/// own runs beside them, per other job.
#[test]
fn the_cost_of_offline_peers_is_learned_per_job() {
    let (runs, _, _) = synthetic(2, 12, 9);
    let key = runs[0].key.clone();
    let other = runs.iter().find(|r| r.key != key).unwrap().key.clone();
    // Job 0's runs again: beside one peer at 60% of the speed, beside
    // two at 36% (0.6 each).
    let peer_runs: Vec<Run> = runs
        .iter()
        .filter(|r| r.key == key)
        .take(6)
        .enumerate()
        .map(|(i, r)| {
            let mut r = r.clone();
            r.job_id += 50_000;
            let (factor, peers) = if i % 2 == 0 {
                (0.6, vec![1])
            } else {
                (0.36, vec![1, 2])
            };
            r.report.launches = r.report.launches.map(|l| (l as f64 * factor) as u64);
            r.report.peers = peers;
            r
        })
        .collect();
    let all: Vec<Run> = runs.iter().cloned().chain(peer_runs).collect();
    let m = Model::train(&all);
    let (learned, n) = m.job_terms(&key).beside_offline.expect("learned");
    assert!((learned - 0.6).abs() < 0.03, "{learned}");
    assert_eq!(n, 6);
    // Used as 6 runs against one of the prior (what a job with no such
    // run gets).
    let mut unknown = m.job_terms(&key);
    unknown.beside_offline = None;
    let prior = m.beside_offline(&unknown, 0.5);
    let want = ((6.0 * learned.ln() + prior.ln()) / 7.0).exp();
    assert!((m.beside_offline(&m.job_terms(&key), 0.5) - want).abs() < 1e-12);
    assert!(
        (prior - learned).abs() > 0.05,
        "the check can tell them apart"
    );
    // A job with no run beside other offline jobs keeps the prior.
    let terms = m.job_terms(&other);
    assert_eq!(terms.beside_offline, None);
    assert!(m.beside_offline(&terms, 0.5) > 0.0);
    // Without peer runs nothing is learned for job 0 either.
    assert_eq!(Model::train(&runs).job_terms(&key).beside_offline, None);
    // Failing for memory beside other offline jobs lowers what the
    // round expects of it there: 6 runs and 1 failure, 1/8.
    let mut failed = all.iter().find(|r| r.key == key).unwrap().clone();
    failed.job_id = 90_000;
    failed.report.launches = None;
    failed.report.oom = Some(1);
    failed.report.peers = vec![3];
    let m = Model::train(&all.iter().cloned().chain([failed]).collect::<Vec<_>>());
    let terms = m.job_terms(&key);
    assert!((terms.beside_offline_fail - 1.0 / 8.0).abs() < 1e-12);
    let mut no_failures = terms;
    no_failures.beside_offline_fail = 0.0;
    assert!(
        (m.beside_offline(&terms, 0.5) - m.beside_offline(&no_failures, 0.5) * 7.0 / 8.0).abs()
            < 1e-12
    );
}

#[test]
fn solo_speed_is_recovered_from_shared_runs_at_varying_partner_load() {
    let (runs, solo, truth) = synthetic(20, 12, 3);
    assert!(
        runs.iter().all(|r| r.report.partner.is_some()),
        "no run alone"
    );
    let e = estimate(&runs);
    for (j, sigma) in solo.iter().enumerate() {
        let p = &e.profiles[&(format!("user{}", j % 7), format!("train-{j}"))];
        assert_eq!(p.signal, Some(Signal::LaunchesPerS));
        let got = p.solo.unwrap();
        assert!(
            (got / sigma - 1.0).abs() < 0.05,
            "job {j}: {got} vs {sigma}"
        );
    }
    let err: f64 = e
        .pairs
        .iter()
        .map(|p| {
            let j: usize = p.job.1["train-".len()..].parse().unwrap();
            let k: usize = p.partner.1["online-".len()..].parse().unwrap();
            (p.x - truth[j][k]).abs()
        })
        .sum::<f64>()
        / e.pairs.len() as f64;
    assert!(err < 0.05, "pair estimates off by {err}");
}

#[test]
fn cold_start_falls_back_to_side_features_then_the_default_and_widens() {
    let (runs, _, _) = synthetic(30, 10, 5);
    let m = Model::train(&runs);
    let seen = m.seen[0];
    let job = m
        .job_index
        .iter()
        .find(|(_, &i)| i == seen.0)
        .unwrap()
        .0
        .clone();
    let partner = m
        .partner_index
        .iter()
        .find(|(_, &i)| i == seen.1)
        .unwrap()
        .0
        .clone();
    let unseen_partner = m
        .partner_index
        .iter()
        .map(|(k, &i)| (k, i))
        .find(|&(_, i)| {
            !m.seen
                [m.seen_range[seen.0 as usize].0 as usize..m.seen_range[seen.0 as usize].1 as usize]
                .iter()
                .any(|s| s.1 == i)
        })
        .expect("a service job 0 never met")
        .0
        .clone();
    let new_job = key("someone", "never-ran");
    let new_svc = key("svc", "never-hosted");
    let at = |j: &JobKey, p: &JobKey| m.predict_pair(j, p, 0.5, 0.3).unwrap();
    let levels = [
        ("pair seen", at(&job, &partner)),
        ("both seen, pair not", at(&job, &unseen_partner)),
        ("job new", at(&new_job, &partner)),
        ("both new", at(&new_job, &new_svc)),
    ];
    for w in levels.windows(2) {
        assert!(w[0].1.sd < w[1].1.sd, "{levels:?}");
    }
    // Both new: the side features alone, the same for any new pair.
    assert_eq!(at(&new_job, &new_svc), at(&key("b", "c"), &key("d", "e")));
    let none = Model::train(&[]);
    let d = none.predict_pair(&new_job, &new_svc, 0.25, 0.3).unwrap();
    assert_eq!((d.mean, d.sd), (0.5, DEFAULT_SD));
    assert!(levels[3].1.sd < DEFAULT_SD, "{levels:?}");
    // Exploration is bounded.
    assert!(levels[3].1.weight() - levels[3].1.mean <= EXPLORE_MAX + 1e-12);
}

#[test]
fn records_round_trip_through_the_admincomment_codec() {
    use crate::reader::{SacctComment, SacctJob};
    let (runs, _, _) = synthetic(10, 6, 9);
    let mut listing: Vec<SacctJob> = runs
        .iter()
        .map(|r| SacctJob {
            job_id: r.job_id,
            name: r.key.1.clone(),
            user: r.key.0.clone(),
            comment: SacctComment {
                administrator: Some(r.report.encode()),
            },
            ..SacctJob::default()
        })
        .collect();
    // The online services, running: their names resolve the partners.
    for k in 0..8u32 {
        listing.push(SacctJob {
            job_id: k + 1,
            name: format!("online-{k}"),
            user: "svc".into(),
            ..SacctJob::default()
        });
    }
    let back = runs_from_sacct(&listing);
    assert_eq!(back, runs);
    assert_eq!(estimate(&back), estimate(&runs));
}

#[test]
fn a_pair_that_failed_for_memory_is_excluded_not_predicted_slow() {
    let (mut runs, _, _) = synthetic(12, 10, 2);
    let job = runs[0].key.clone();
    runs.push(Run {
        job_id: 1,
        key: job.clone(),
        report: JobReport {
            mode: Some(Mode::Offline),
            partner: Some(99),
            oom: Some(1),
            run_s: Some(3),
            ..JobReport::default()
        },
        end_s: 0,
        partner_key: Some(key("svc", "big-model")),
    });
    let m = Model::train(&runs);
    assert_eq!(
        m.predict_pair(&job, &key("svc", "big-model"), 0.5, 0.3),
        None
    );
    assert!(m
        .predict_pair(&job, &key("svc", "online-0"), 0.5, 0.3)
        .is_some());
    let gpu = gpu_with(10, vec![99]);
    let p = Policy::default();
    assert_eq!(
        m.predict(&job, &gpu, &p),
        None,
        "by the online job's id too"
    );
    assert!(
        m.predict(&runs[15].key, &gpu, &p).is_some(),
        "another job may go there"
    );
    // Its untried pairs carry the risk into what the matcher maximizes.
    let risky = m
        .predict_pair(&job, &key("svc", "never-hosted"), 0.5, 0.3)
        .unwrap();
    let clean = m
        .predict_pair(&runs[15].key, &key("svc", "never-hosted"), 0.5, 0.3)
        .unwrap();
    assert!(risky.p_fail > clean.p_fail, "{risky:?} {clean:?}");
}

#[test]
fn the_predictor_learns_from_what_the_node_measured() {
    use crate::reader::{SacctComment, SacctJob};
    let job = |id: u32, comment: &str| SacctJob {
        job_id: id,
        name: "train".into(),
        user: "u".into(),
        comment: SacctComment {
            administrator: Some(comment.into()),
        },
        ..SacctJob::default()
    };
    let jobs = [
        job(
            1,
            "muxflow:v1 mode=offline mem_cap_mib=1000 measured_peak_mib=300 claim.peak_mib=5",
        ),
        job(
            2,
            "muxflow:v1 mode=offline mem_cap_mib=1000 peak_mib=900000",
        ),
        job(
            3,
            "muxflow:v1 mode=offline policed=no_xcuda claim.steps_per_s=1000",
        ),
        job(4, "muxflow:v1 mode=online"),
    ];
    let runs = runs_from_sacct(&jobs);
    let ids: Vec<u32> = runs.iter().map(|r| r.job_id).collect();
    assert_eq!(ids, [1, 2], "policed and online runs are not learned from");
    let peaks: Vec<Option<u64>> = runs.iter().map(|r| trusted_peak_mib(&r.report)).collect();
    assert_eq!(
        peaks,
        [Some(300), Some(1000)],
        "the node's measurement over the claim; an old claim never above the cap"
    );
}

#[test]
fn steps_are_preferred_and_launches_need_the_nodes_run_time() {
    let r = JobReport {
        steps_per_s: Some(2.0),
        launches: Some(600),
        run_s: Some(60),
        ..JobReport::default()
    };
    assert_eq!(progress(&r, Signal::StepsPerS), Some(2.0));
    assert_eq!(progress(&r, Signal::LaunchesPerS), Some(10.0));
    let no_time = JobReport {
        launches: Some(600),
        ..JobReport::default()
    };
    assert_eq!(progress(&no_time, Signal::LaunchesPerS), None);
}

fn gpu_with(solo: u8, online: Vec<u32>) -> GpuState {
    GpuState {
        node: "n".into(),
        index: 0,
        published: GpuPublished {
            index: 0,
            state: HealthState::Healthy,
            solo_sm_pct: Some(solo),
            online_mem_mib: Some(10_000),
            mem_mib: 80_000,
            offline: 0,
            multiuser: true,
            power_w: None,
        },
        online_jobs: online,
        offline_jobs: 0,
        owners: Vec::new(),
        slots_used: 0,
    }
}

#[test]
fn share_and_room_are_the_policys() {
    let at = |solo: Option<u8>, watts: Option<u32>| {
        let mut g = gpu_with(0, vec![1]).published;
        g.solo_sm_pct = solo;
        g.power_w = watts;
        g
    };
    // Under the bounded queue (the default) a full-power board gets the
    // ceiling; a power-capped one, or one without a reading, is sized in
    // space (the node's own rule: muxflow::policy::share).
    let queue = Policy::default();
    assert_eq!(sm_share(&at(Some(35), Some(700)), &queue), 0.80);
    assert_eq!(sm_share(&at(Some(35), Some(70)), &queue), 0.55);
    assert_eq!(sm_share(&at(Some(35), None), &queue), 0.55);
    let p = Policy {
        guard: muxflow::config::OfflineGuard::Share,
        ..Policy::default()
    };
    assert_eq!(sm_share(&at(Some(35), Some(700)), &p), 0.55);
    assert_eq!(sm_share(&at(Some(95), None), &p), 0.10);
    assert_eq!(sm_share(&at(Some(0), None), &p), 0.80);
    assert_eq!(sm_share(&at(None, None), &p), 0.30);
    assert_eq!(
        memory_room_mib(&gpu_with(10, vec![1]), &p),
        80_000 - 10_000 - 2048
    );
}

#[test]
fn two_jobs_with_different_histories_get_different_predictions_and_pairings() {
    // Job a ran slow next to service 1 and fast next to 2; b the other
    // way round: each is predicted (and placed) where it ran fast.
    let mut runs = Vec::new();
    let mut id = 100;
    for (job, slow, fast, rate) in [("a", 1u32, 2u32, 900.0), ("b", 2, 1, 40.0)] {
        for (partner, x) in [(slow, 0.4), (fast, 0.9)] {
            for load in [30u8, 60, 90] {
                id += 1;
                let l = f64::from(load) / 100.0;
                runs.push(Run {
                    job_id: id,
                    key: key("u", job),
                    report: JobReport {
                        mode: Some(Mode::Offline),
                        partner: Some(partner),
                        partner_load_pct: Some(load),
                        run_s: Some(100),
                        launches: Some((rate * (1.0 - l * (1.0 - x)) * 100.0) as u64),
                        ..JobReport::default()
                    },
                    end_s: 0,
                    partner_key: Some(key("svc", &format!("s{partner}"))),
                });
            }
        }
    }
    let m = Model::train(&runs);
    let p = Policy::default();
    let at = |job: &str, svc: u32| {
        m.predict(&key("u", job), &gpu_with(20, vec![svc]), &p)
            .unwrap()
            .mean
    };
    assert!(
        at("a", 2) > at("a", 1) + 0.3,
        "{} {}",
        at("a", 2),
        at("a", 1)
    );
    assert!(at("b", 1) > at("b", 2) + 0.3);
}

#[test]
fn a_cold_job_is_predicted_from_its_launch_rate_when_rates_explain_the_pairs() {
    // Jobs that launch more suffer more next to every partner; a job
    // never seen is told apart only by its launch rate.
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut pairs = Vec::new();
    for i in 0..24 {
        let rate = rng.gen_range(0.1..0.9);
        for k in 0..4 {
            pairs.push(PairObs {
                job: key("u", &format!("j{i}")),
                partner: key("s", &format!("k{k}")),
                x: 1.0 - 0.8 * rate + rng.gen_range(-0.02..0.02),
                runs: 2,
                share: 0.5,
                mem: 0.5,
                rate,
            });
        }
    }
    let m = Model::from_estimates(&Estimates {
        pairs,
        run_sd: 0.02,
        ..Estimates::default()
    });
    let gpu = GpuTerms {
        share: 0.5,
        room_mib: u64::MAX,
        partner: None,
        others: 0,
        budget: 0.5,
    };
    let cold = |rate: f64| {
        let job = JobTerms {
            index: None,
            peak_mib: None,
            rate,
            beside_offline: None,
            beside_offline_fail: 0.0,
        };
        m.predict_terms(&job, &gpu).unwrap().mean
    };
    assert!((cold(0.2) - 0.84).abs() < 0.05, "{}", cold(0.2));
    assert!((cold(0.8) - 0.36).abs() < 0.05, "{}", cold(0.8));
}

#[test]
fn the_launch_rate_is_left_out_where_it_explains_nothing() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let pairs: Vec<PairObs> = (0..40)
        .map(|i| PairObs {
            job: key("u", &format!("j{i}")),
            partner: key("s", "k"),
            x: rng.gen_range(0.3..0.9),
            runs: 2,
            share: rng.gen_range(0.3..0.9),
            mem: 0.5,
            rate: rng.gen_range(0.0..1.0),
        })
        .collect();
    assert_eq!(choose_features(&pairs), BASE_FEATURES);
}

#[test]
fn side_features_are_not_extrapolated_beyond_the_history() {
    // The history saw small jobs only (memory feature up to 0.1), where
    // more memory cost speed steeply; a job filling the room is not
    // predicted from that slope's extension (which says 0).
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let pairs: Vec<PairObs> = (0..30)
        .map(|i| {
            let mem = rng.gen_range(0.0..0.1);
            PairObs {
                job: key("u", &format!("j{i}")),
                partner: key("s", &format!("k{}", i % 3)),
                x: 1.0 - 3.0 * mem,
                runs: 2,
                share: 0.5,
                mem,
                rate: DEFAULT_RATE,
            }
        })
        .collect();
    let m = Model::from_estimates(&Estimates {
        pairs,
        run_sd: 0.02,
        ..Estimates::default()
    });
    let gpu = GpuTerms {
        share: 0.5,
        room_mib: 10_000,
        partner: None,
        others: 0,
        budget: 0.5,
    };
    let big = JobTerms {
        index: None,
        peak_mib: Some(9_000),
        rate: DEFAULT_RATE,
        beside_offline: None,
        beside_offline_fail: 0.0,
    };
    let e = m.predict_terms(&big, &gpu).unwrap();
    // Within what the history saw (0.7 to 1), not the slope's 0.01.
    assert!(e.mean > 0.65 && e.mean <= 1.0, "{e:?}");
}

#[test]
fn a_partner_sacct_did_not_list_is_found_by_its_job_id() {
    // The online job was running and not in the listing: its runs name
    // it by id, and a GPU whose online job has that id finds the pair.
    let runs: Vec<Run> = [(0.3, 500u64), (0.9, 380)]
        .iter()
        .enumerate()
        .map(|(i, &(load, launches))| Run {
            job_id: 100 + i as u32,
            key: key("u", "train"),
            report: JobReport {
                mode: Some(Mode::Offline),
                partner: Some(76),
                partner_load_pct: Some((load * 100.0) as u8),
                run_s: Some(1),
                launches: Some(launches),
                ..JobReport::default()
            },
            end_s: 1,
            partner_key: None,
        })
        .collect();
    let m = Model::train(&runs);
    let gpu = GpuTerms {
        share: 0.5,
        room_mib: u64::MAX,
        partner: m.partner_by_id.get(&76).copied(),
        others: 0,
        budget: 0.5,
    };
    assert!(gpu.partner.is_some());
    let e = m
        .predict_terms(&m.job_terms(&key("u", "train")), &gpu)
        .unwrap();
    // progress = σ(1 − load·d): 500 at 0.3, 380 at 0.9 → σ = 560, x = 0.64.
    assert!((e.mean - 0.64).abs() < 0.08, "{e:?}");
}

/// Runs each at a steady partner load (night, evening, peak): the node's
/// within-run figure reads every one as full load, so the slowdown seen
/// at night is taken for the pair's whole; the partner's mean SM
/// utilization, read against its busiest run, gives each run its load
/// back and the pair's slowdown at full load.
#[test]
fn the_partners_utilization_against_its_busiest_run_gives_steady_runs_their_load() {
    let (sigma, x) = (1000.0, 0.5);
    let mut id = 100;
    let mut run = |partner: Option<u32>, load: f64, with_sm: bool| {
        id += 1;
        Run {
            job_id: id,
            key: key("u", "a"),
            report: JobReport {
                mode: Some(Mode::Offline),
                partner,
                partner_load_pct: partner.map(|_| 100),
                partner_sm_pct: partner
                    .filter(|_| with_sm)
                    .map(|_| (50.0 * load).round() as u8),
                run_s: Some(100),
                launches: Some((sigma * (1.0 - load * (1.0 - x)) * 100.0) as u64),
                ..JobReport::default()
            },
            end_s: 0,
            partner_key: partner.map(|p| key("svc", &format!("s{p}"))),
        }
    };
    let mut history = |with_sm: bool| -> Vec<Run> {
        let mut v = vec![run(None, 0.0, with_sm)];
        for load in [1.0, 0.6, 0.25, 0.1, 0.1, 0.25] {
            v.push(run(Some(1), load, with_sm));
        }
        v
    };
    let pair_x = |runs: &[Run]| {
        let e = estimate(runs);
        let p = e
            .pairs
            .iter()
            .find(|p| p.job == key("u", "a"))
            .expect("the pair");
        p.x
    };
    let with = pair_x(&history(true));
    assert!(
        (with - x).abs() < 0.03,
        "with the partner's utilization: {with}"
    );
    let without = pair_x(&history(false));
    assert!(without > x + 0.1, "the within-run figure alone: {without}");
}
