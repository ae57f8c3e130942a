//! `bench --daemon-round`: the daemon's own round ([`crate::round::plan`]
//! with the predictor) on a synthetic cluster as the daemon reads it
//! ([`daemon_state`]), and its loop with the round cache.

use std::fmt::Write as _;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{peak_rss_mb, BenchArgs, GANG_BENCH_GPUS_PER_NODE};
use crate::predict::{Model, Seat};
use crate::reader::{ClusterState, Names};
use crate::round::{plan, IdleSlot, Plan, Predictor};
use crate::round_cache::{RoundCache, RoundKind};
use crate::weights::quantize;

/// Online services on this share of the daemon bench's GPUs; the rest idle.
const DAEMON_ONLINE_SHARE: f64 = 0.8;
/// Job kinds (user, name) of the daemon bench, and their users.
const DAEMON_KINDS: usize = 200;
const DAEMON_USERS: usize = 40;

/// A synthetic cluster as the daemon reads it, deterministic by seed: nodes
/// of 8 GPUs of 81,559 MiB, `DAEMON_ONLINE_SHARE` (80%) of them running an
/// online job (solo SM 5–89%, 2–40 GB), all Healthy with a free slot; jobs
/// pending, held, of `DAEMON_KINDS` (200) kinds whose history gave a solo speed
/// (0.3–1.0) and a memory peak (1–60 GB) but no pair. A load shape for
/// timing the round, not a model of any cluster.
pub fn daemon_state(
    gpus: usize,
    jobs: usize,
    seed: u64,
) -> (crate::reader::ClusterState, crate::predict::Model) {
    use crate::reader::{ClusterState, GpuState, PendingJob};
    use muxflow::policy::health::HealthState;
    use muxflow::records::published::GpuPublished;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let gpus: Vec<GpuState> = (0..gpus as u32)
        .map(|g| {
            let (node, index) = (
                g / GANG_BENCH_GPUS_PER_NODE as u32,
                g % GANG_BENCH_GPUS_PER_NODE as u32,
            );
            let online = rng.gen_bool(DAEMON_ONLINE_SHARE);
            GpuState {
                node: format!("n{node:05}"),
                index,
                published: GpuPublished {
                    index,
                    state: HealthState::Healthy,
                    solo_sm_pct: online.then(|| rng.gen_range(5..90)),
                    online_mem_mib: online.then(|| rng.gen_range(2_000..40_000)),
                    mem_mib: 81_559,
                    offline: 0,
                    multiuser: true,
                    power_w: None,
                },
                online_jobs: if online { vec![1_000_000 + g] } else { vec![] },
                slots_used: 0,
                offline_jobs: 0,
                owners: Vec::new(),
            }
        })
        .collect();
    let kind = |k: usize| (format!("user{}", k % DAEMON_USERS), format!("train-{k}"));
    let mut model = crate::predict::Model::default();
    for k in 0..DAEMON_KINDS {
        model.profiles.insert(
            kind(k),
            crate::predict::Profile {
                solo: Some(rng.gen_range(0.3..1.0)),
                peak_mib: Some(rng.gen_range(1_000..60_000)),
                runs: 5,
                alone_runs: 2,
                ..Default::default()
            },
        );
    }
    let pending = (0..jobs as u32)
        .map(|id| {
            let (user, name) = kind(rng.gen_range(0..DAEMON_KINDS));
            PendingJob {
                id,
                user,
                account: String::new(),
                name,
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
            }
        })
        .collect();
    let state = ClusterState {
        gpus,
        pending,
        ..ClusterState::default()
    };
    (state, model)
}

/// `bench --daemon-round`: the daemon's own round ([`crate::round::plan`]
/// with the predictor, [`daemon_state`]) without pricing and with the
/// default pricing budget; reference: scoring every (job, GPU) pair once
/// through the same predictor terms, the least any round that looks at
/// every pair does, timed in the same run.
pub fn daemon_run(args: &BenchArgs) -> anyhow::Result<String> {
    let (state, model) = daemon_state(args.gpus, args.jobs, args.seed);
    let config = muxflow::Config::default();
    let names = Names::from_config(&config.slurm);
    let mut text = String::new();
    writeln!(
        text,
        "muxflow-matcher-bench --daemon-round: {} GPUs ({:.0}% with an online job) x {} pending jobs of {DAEMON_KINDS} kinds, seed {}, default config",
        args.gpus,
        DAEMON_ONLINE_SHARE * 100.0,
        args.jobs,
        args.seed
    )?;

    let (scored, reference_s) = score_every_pair(args, &state, &model, &config.policy);
    let mut runs = Vec::new();
    for budget in [0, config.matcher.pricing_budget_ms] {
        let matcher = muxflow::config::Matcher {
            pricing_budget_ms: budget,
            ..config.matcher.clone()
        };
        let t = Instant::now();
        let p = plan(&state, &model, &config.policy, &matcher, &names);
        runs.push((budget, t.elapsed().as_secs_f64(), p));
    }
    let peak_mb = peak_rss_mb().unwrap_or(f64::NAN);
    write_rounds(&mut text, scored, reference_s, &runs)?;
    let steps = cache_steps(args, &state, &model, &config, &names);
    let peak_mb = peak_rss_mb().unwrap_or(f64::NAN).max(peak_mb);
    write_cache_steps(&mut text, &steps)?;
    let incremental: Vec<f64> = steps[1..4].iter().map(|s| s.cached_s).collect();
    let mut sorted = incremental.clone();
    sorted.sort_by(f64::total_cmp);
    let (_, plain_s, _) = &runs[0];
    let (_, priced_s, priced) = &runs[1];
    writeln!(
        text,
        "daemon_round_s={plain_s:.3} priced_round_s={priced_s:.3} reference_s={reference_s:.3} peak_mb={peak_mb:.1} full_graph={} cached_round_s={:.3} cached_full_graph={} gpus_changed_round_s={:.3} gpus_changed_kind={:?}",
        priced.summary.full_graph,
        sorted[1],
        steps[1..4].iter().all(|s| s.full),
        steps[4].cached_s,
        steps[4].kind
    )?;
    Ok(text)
}

/// The reference: every (job, GPU) pair scored once through the
/// predictor's terms, on the same threads, each weight quantized and
/// summed (kept from the optimizer), as the round uses them. The feasible
/// pairs and the time.
fn score_every_pair(
    args: &BenchArgs,
    state: &ClusterState,
    model: &Model,
    policy: &muxflow::config::Policy,
) -> (usize, f64) {
    let t = Instant::now();
    let jobs: Vec<_> = state
        .pending
        .iter()
        .map(|j| Predictor::job_terms(model, j))
        .collect();
    let seat = Seat {
        slots: 1,
        offline_jobs: 1,
    };
    let (shared, idle): (Vec<_>, Vec<_>) =
        state.gpus.iter().partition(|g| !g.online_jobs.is_empty());
    let cols: Vec<_> = shared
        .iter()
        .map(|g| Predictor::gpu_terms(model, g, policy, seat))
        .collect();
    let slots: Vec<_> = idle
        .iter()
        .map(|&g| (g, IdleSlot::new(g, policy, seat)))
        .collect();
    let chunk = jobs.len().div_ceil(args.threads.max(1)).max(1);
    let (scored, _total): (usize, i64) = std::thread::scope(|sc| {
        let handles: Vec<_> = jobs
            .chunks(chunk)
            .map(|part| {
                let (cols, slots) = (&cols, &slots);
                sc.spawn(move || {
                    let (mut n, mut sum) = (0usize, 0i64);
                    for j in part {
                        let shared = cols.iter().map(|g| Predictor::predict(model, j, g));
                        let idle = slots
                            .iter()
                            .map(|(g, slot)| Predictor::solo(model, j, g, slot).map(|e| e.0));
                        for w in shared.chain(idle).filter_map(|v| v.and_then(quantize)) {
                            n += 1;
                            sum = sum.wrapping_add(w);
                        }
                    }
                    std::hint::black_box((n, sum))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("scoring thread"))
            .fold((0usize, 0i64), |a, b| (a.0 + b.0, a.1.wrapping_add(b.1)))
    });
    (scored, t.elapsed().as_secs_f64())
}

/// The reference's row and one per cold round (by pricing budget).
fn write_rounds(
    text: &mut String,
    scored: usize,
    reference_s: f64,
    runs: &[(u64, f64, Plan)],
) -> std::fmt::Result {
    writeln!(
        text,
        "{:<52} {:>9} {:>10} {:>8} {:>16}",
        "step", "time_s", "x reference", "placed", "exact"
    )?;
    writeln!(
        text,
        "{:<52} {:>9.3} {:>10.2} {:>8} {:>16}",
        format!("reference: score every pair once ({scored} feasible)"),
        reference_s,
        1.0,
        "-",
        "-"
    )?;
    for (budget, s, p) in runs {
        writeln!(
            text,
            "{:<52} {:>9.3} {:>10.2} {:>8} {:>16}",
            format!("round::plan, pricing_budget_ms = {budget}"),
            s,
            s / reference_s.max(1e-9),
            p.summary.placed,
            if p.summary.full_graph {
                "every pair"
            } else {
                "candidates"
            }
        )?;
    }
    Ok(())
}

/// One step of the daemon's loop: a round from the cache and a cold
/// round of the same state timed beside it.
struct CacheStep {
    label: &'static str,
    cached_s: f64,
    cold_s: f64,
    /// The cached round is exact over every pair.
    full: bool,
    kind: RoundKind,
}

/// The daemon's loop (crate::round_cache): a cold round kept in the
/// cache, then rounds after 1% of the jobs were replaced by new ones,
/// then one after 1% of the GPUs changed too (both past the cache's
/// cold threshold, 0.1%: the kind column says which ran), each against
/// a cold round of the same state timed beside it.
fn cache_steps(
    args: &BenchArgs,
    state: &ClusterState,
    model: &Model,
    config: &muxflow::Config,
    names: &Names,
) -> Vec<CacheStep> {
    let mut cache = RoundCache::default();
    let mut st = state.clone();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0x30);
    let mut next_id = st.pending.iter().map(|j| j.id).max().unwrap_or(0) + 1;
    let mut steps = Vec::new();
    for (label, job_share, gpu_share) in [
        ("first round, kept", 0.0, 0.0),
        ("after 1% of jobs replaced (1)", 0.01, 0.0),
        ("after 1% of jobs replaced (2)", 0.01, 0.0),
        ("after 1% of jobs replaced (3)", 0.01, 0.0),
        ("after 1% of jobs and GPUs changed", 0.01, 0.01),
    ] {
        change_daemon_state(&mut st, &mut rng, job_share, gpu_share, &mut next_id);
        let t = Instant::now();
        let got = crate::round::plan_cached(
            &st,
            model,
            &config.policy,
            &config.matcher,
            names,
            &mut cache,
            0,
        );
        let cached_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let _cold = plan(&st, model, &config.policy, &config.matcher, names);
        let cold_s = t.elapsed().as_secs_f64();
        steps.push(CacheStep {
            label,
            cached_s,
            cold_s,
            full: got.summary.full_graph,
            kind: cache.last,
        });
    }
    steps
}

/// The loop's table.
fn write_cache_steps(text: &mut String, steps: &[CacheStep]) -> std::fmt::Result {
    writeln!(text)?;
    writeln!(
        text,
        "{:<34} {:>8} {:>12} {:>11} {:>9} {:>16}",
        "the daemon's loop (round cache)", "kind", "cached_s", "cold_s", "x cold", "exact (cached)"
    )?;
    for s in steps {
        writeln!(
            text,
            "{:<34} {:>8} {:>12.3} {:>11.3} {:>9.2} {:>16}",
            s.label,
            format!("{:?}", s.kind).to_lowercase(),
            s.cached_s,
            s.cold_s,
            s.cached_s / s.cold_s.max(1e-9),
            if s.full { "every pair" } else { "candidates" }
        )?;
    }
    Ok(())
}

/// Changes the daemon bench's state as between two rounds: `job_share` of
/// the pending jobs replaced by new ones (new ids, random kinds),
/// `gpu_share` of the GPUs changed (an online job's solo SM share and
/// memory drawn again; an idle GPU gets an online job).
fn change_daemon_state(
    st: &mut crate::reader::ClusterState,
    rng: &mut ChaCha8Rng,
    job_share: f64,
    gpu_share: f64,
    next_id: &mut u32,
) {
    let jobs = st.pending.len();
    for _ in 0..(jobs as f64 * job_share).round() as usize {
        let k = rng.gen_range(0..jobs);
        let kind = rng.gen_range(0..DAEMON_KINDS);
        let job = &mut st.pending[k];
        job.id = *next_id;
        *next_id += 1;
        job.user = format!("user{}", kind % DAEMON_USERS);
        job.name = format!("train-{kind}");
    }
    st.pending.sort_by_key(|j| j.id);
    let gpus = st.gpus.len();
    for _ in 0..(gpus as f64 * gpu_share).round() as usize {
        let g = rng.gen_range(0..gpus);
        let gpu = &mut st.gpus[g];
        gpu.published.solo_sm_pct = Some(rng.gen_range(5..90));
        gpu.published.online_mem_mib = Some(rng.gen_range(2_000..40_000));
        if gpu.online_jobs.is_empty() {
            gpu.online_jobs = vec![2_000_000 + g as u32];
        }
    }
}
