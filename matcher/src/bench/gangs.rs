//! `bench --gang-share F [--slots-per-gpu N]`: one production round with
//! k-GPU jobs and sized slots on the synthetic cluster (see [`gang_run`]).

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{fmt_gap, gap, peak_rss_mb, BenchArgs};
use crate::exact::{ExactOptions, Incremental};
use crate::gang::GangChoice;
use crate::solver::{solve_with, Edge, Solution, SolveOptions};
use crate::synth::Cluster;

/// GPUs per node in the gang bench (a common GPU server).
pub const GANG_BENCH_GPUS_PER_NODE: usize = 8;

/// The bench cluster's scores with jobs and GPUs left out (`None`), its
/// pricing groups and bounds kept, so the gang bench prunes as the
/// reference does ([`crate::prune::spread_grouped`]).
#[derive(Clone, Copy)]
struct Masked<'a> {
    inner: &'a Cluster,
    job_ok: &'a [bool],
    gpu_ok: &'a [bool],
}

impl crate::exact::Scores for Masked<'_> {
    fn jobs(&self) -> usize {
        self.inner.jobs()
    }
    fn gpus(&self) -> usize {
        self.inner.gpus()
    }
    fn weight(&self, job: u32, gpu: u32) -> Option<i64> {
        (self.job_ok[job as usize] && self.gpu_ok[gpu as usize])
            .then(|| self.inner.weight(job, gpu))
            .flatten()
    }
    fn groups(&self) -> Option<(&[u32], usize)> {
        self.inner.groups()
    }
    fn group_bound(&self, job: u32, group: u32) -> Option<i64> {
        self.job_ok[job as usize]
            .then(|| self.inner.group_bound(job, group))
            .flatten()
    }
    fn pair_bound(&self, job: u32, gpu: u32) -> Option<i64> {
        (self.job_ok[job as usize] && self.gpu_ok[gpu as usize])
            .then(|| self.inner.pair_bound(job, gpu))
            .flatten()
    }
    /// The cluster's own class-by-class scan, left-out GPUs not visited
    /// (its bound also covers them: looser, still a bound).
    fn scan_row(
        &self,
        job: u32,
        price: &[i64],
        floor: i64,
        visit: &mut dyn FnMut(u32, i64),
    ) -> crate::exact::RowScan {
        if !self.job_ok[job as usize] {
            return crate::exact::RowScan::NOTHING;
        }
        self.inner.scan_row(job, price, floor, &mut |g, w| {
            if self.gpu_ok[g as usize] {
                visit(g, w);
            }
        })
    }
}

/// What each other offline job on a GPU leaves a job in the gang bench's
/// split steps: the mean measured pair throughput of the replay's table
/// (sim/data/gavel_v100_pairs.csv, 636 pairs that co-locate: 0.657).
pub const BENCH_BESIDE_OFFLINE: f64 = 0.657;

/// `muxflow-matcher-bench --gang-share F [--slots-per-gpu N]` (issue 15):
/// one production round with k-GPU jobs and sized slots
/// ([`crate::round`] module docs) on the synthetic cluster cut into nodes
/// of [`GANG_BENCH_GPUS_PER_NODE`] GPUs, each with N free offline slots, a
/// share `F` of its jobs asking for 2, 4 or 8 GPUs: (1) the 1-GPU jobs'
/// matching, one column per GPU, each job on all N slots, for prices; (2)
/// the gangs, one slot of each of their GPUs ([`crate::gang`]); (3) the
/// 1-GPU jobs' matching on the GPUs left, warm; (4) the split steps
/// ([`crate::slots::split_rounds`]): a job on s of N slots runs at
/// [`Cluster::throughput_part`], × [`BENCH_BESIDE_OFFLINE`] for each other
/// offline job there. Timed against the reference measured in the same
/// run, the same jobs all as 1-GPU jobs on one GPU each (one pruned
/// matching). Instance generation is excluded. Then, untimed: the exact
/// optimum of step 3 over every feasible pair
/// ([`crate::exact::solve_exact`]), and the round's gap to it. Ends in one
/// key=value line.
pub fn gang_run(args: &BenchArgs, slots: u32, gang_share: f64) -> anyhow::Result<String> {
    if !(0.0..=1.0).contains(&gang_share) {
        bail!("--gang-share {gang_share}: a share of the jobs, from 0 to 1");
    }
    if !(1..=4).contains(&slots) {
        bail!("--slots-per-gpu {slots}: from 1 to 4, as [policy] offline_per_gpu");
    }
    let cluster = Cluster::generate(args.gpus, args.jobs, args.seed, args.weights);
    let opts = SolveOptions {
        threads: args.threads,
        ..SolveOptions::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0x6a96);
    let ks: Vec<u32> = (0..args.jobs)
        .map(|_| {
            if rng.gen_bool(gang_share) {
                [2, 4, 8][rng.gen_range(0..3)]
            } else {
                1
            }
        })
        .collect();

    let t = Instant::now();
    let edges = cluster.candidates(args.candidates_per_job, args.threads);
    let reference = solve_with(args.jobs, args.gpus, &edges, &opts).context("solving")?;
    let reference_s = t.elapsed().as_secs_f64();

    let round = GangRound::run(args, &cluster, &ks, slots)?;
    let mut text = String::new();
    write_gang_report(
        &mut text,
        args,
        slots,
        gang_share,
        (reference_s, &reference),
        &round,
    )?;
    Ok(text)
}

/// Job j's value on GPU g holding `held` of the N slots, one of `jobs`
/// offline jobs there.
fn seat_value(
    cluster: &Cluster,
    slots: u32,
    j: u32,
    g: usize,
    (held, jobs): (u32, u32),
) -> Option<f64> {
    cluster
        .throughput_part(j, g as u32, f64::from(held) / f64::from(slots))
        .map(|x| x * BENCH_BESIDE_OFFLINE.powi(jobs as i32 - 1))
}

/// Job j's value on GPU g in a seat (held slots, offline jobs there).
type SeatValue<'a> = dyn Fn(u32, usize, &(u32, u32)) -> Option<f64> + Sync + 'a;

/// The gang round's steps, timed, and what each gave.
struct GangRound {
    gangs: usize,
    price_s: f64,
    gang_s: f64,
    final_s: f64,
    pricing_s: f64,
    split_s: f64,
    round_s: f64,
    peak_mb: f64,
    /// Gangs placed, their GPUs and value (k times the slowest GPU's).
    placed: usize,
    gang_gpus: usize,
    gang_value: i64,
    /// Step 3's objective before pricing, then after.
    warm_objective: i64,
    singles: Solution,
    /// Whether pricing finished, and its passes (None: budget 0).
    pricing: Option<(bool, usize)>,
    split_edges: usize,
    split_jobs: usize,
    /// Every 1-GPU job at its final seat.
    sized_value: i64,
    /// Step 3's exact optimum over every feasible pair (untimed).
    exact: Solution,
    exact_s: f64,
}

impl GangRound {
    fn run(args: &BenchArgs, cluster: &Cluster, ks: &[u32], slots: u32) -> anyhow::Result<Self> {
        let opts = SolveOptions {
            threads: args.threads,
            ..SolveOptions::default()
        };
        let cols = args.gpus;
        let gpu_of: Vec<u32> = (0..cols as u32).collect();
        let node_of: Vec<u32> = (0..cols)
            .map(|g| (g / GANG_BENCH_GPUS_PER_NODE) as u32)
            .collect();
        let value = |j: u32, g: usize, &seat: &(u32, u32)| seat_value(cluster, slots, j, g, seat);
        let gang_score =
            |j: u32, g: u32| value(j, g as usize, &(1, 1)).and_then(crate::weights::quantize);

        let t = Instant::now();
        let singles_only = Masked {
            inner: cluster,
            job_ok: &ks.iter().map(|&k| k == 1).collect::<Vec<_>>(),
            gpu_ok: &vec![true; cols],
        };
        let edges =
            crate::prune::spread_grouped(&singles_only, args.candidates_per_job, args.threads);
        let priced = solve_with(args.jobs, cols, &edges, &opts).context("solving")?;
        let price_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let gangs: Vec<(u32, u32)> = ks
            .iter()
            .enumerate()
            .filter(|(_, &k)| k > 1)
            .map(|(j, &k)| (j as u32, k))
            .collect();
        let mut taken = vec![false; cols];
        let columns = crate::gang::Columns {
            node_of: &node_of,
            gpu_of: &gpu_of,
        };
        let chosen =
            crate::gang::place_gangs(&gangs, &columns, &priced.duals.gpu, &mut taken, &gang_score);
        let gang_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let gpus_left: Vec<bool> = taken.iter().map(|&t| !t).collect();
        let left_only = Masked {
            gpu_ok: &gpus_left,
            ..singles_only
        };
        let edges = crate::prune::spread_grouped(&left_only, args.candidates_per_job, args.threads);
        // From the prices' matching: only what the gangs took is searched again.
        let start = priced.job_gpu(args.jobs);
        let singles = crate::solve_warm_sorted(
            args.jobs,
            cols,
            &edges,
            &crate::Start {
                job_gpu: &start,
                price: &priced.duals.gpu,
            },
        );
        let final_s = t.elapsed().as_secs_f64();
        let warm_objective = singles.matching.objective;
        let initial = edges.clone();
        // Pricing out within the round's budget, as `round::plan` does.
        let t = Instant::now();
        let budget = args.pricing_budget_ms;
        let (singles, pricing) = if budget > 0 {
            let e = Incremental::from_solution(
                &left_only,
                edges,
                singles,
                &ExactOptions {
                    threads: args.threads,
                    deadline: Some(t + std::time::Duration::from_millis(budget)),
                    ..ExactOptions::default()
                },
            )
            .into_exact();
            (e.solution, Some((e.complete, e.pricing.passes)))
        } else {
            (singles, None)
        };
        let pricing_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (members, split_edges) = split_steps(args, ks, slots, &taken, &singles, &value);
        let split_s = t.elapsed().as_secs_f64();
        let round_s = price_s + gang_s + final_s + pricing_s + split_s;
        let peak_mb = peak_rss_mb().unwrap_or(f64::NAN);
        let (sized_value, split_jobs) = sized_value(slots, &members, &value);
        let (exact, exact_s) = exact_singles(args, cluster, ks, &taken, &initial)?;
        Ok(GangRound {
            gangs: gangs.len(),
            price_s,
            gang_s,
            final_s,
            pricing_s,
            split_s,
            round_s,
            peak_mb,
            placed: chosen.iter().flatten().count(),
            gang_gpus: chosen.iter().flatten().map(|c| c.gpus.len()).sum(),
            gang_value: gang_value(&gangs, &chosen),
            warm_objective,
            singles,
            pricing,
            split_edges,
            split_jobs,
            sized_value,
            exact,
            exact_s,
        })
    }

    fn objective(&self) -> i64 {
        self.gang_value + self.sized_value
    }
}

/// Each gang's value: k times its slowest GPU's weight.
fn gang_value(gangs: &[(u32, u32)], chosen: &[Option<GangChoice>]) -> i64 {
    gangs
        .iter()
        .zip(chosen)
        .filter_map(|(&(_, k), c)| Some(c.as_ref()?.min_weight * i64::from(k)))
        .sum()
}

/// Step 4, the split steps: the 1-GPU jobs on each GPU after them, and the
/// edges they scored.
fn split_steps(
    args: &BenchArgs,
    ks: &[u32],
    slots: u32,
    taken: &[bool],
    singles: &Solution,
    value: &SeatValue,
) -> (Vec<Vec<u32>>, usize) {
    let cols = args.gpus;
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); cols];
    let mut waiting: Vec<bool> = ks.iter().map(|&k| k == 1).collect();
    for &(j, g) in &singles.matching.pairs {
        members[g as usize].push(j);
        waiting[j as usize] = false;
    }
    let free = vec![slots; cols];
    let split_edges = crate::slots::split_rounds(
        &free,
        slots,
        taken,
        &mut members,
        &mut waiting,
        args.candidates_per_job,
        args.threads,
        |_, i, n| (crate::round::split_slots(slots, n, i), n),
        value,
    );
    (members, split_edges)
}

/// Every 1-GPU job at its final seat, and the jobs the splits added.
fn sized_value(slots: u32, members: &[Vec<u32>], value: &SeatValue) -> (i64, usize) {
    let (mut sized_value, mut split_jobs) = (0i64, 0usize);
    for (g, list) in members.iter().enumerate() {
        let n = list.len() as u32;
        split_jobs += list.len().saturating_sub(1);
        for (i, &j) in list.iter().enumerate() {
            let seat = (crate::round::split_slots(slots, n, i), n);
            sized_value += value(j, g, &seat)
                .and_then(crate::weights::quantize)
                .unwrap_or(0);
        }
    }
    (sized_value, split_jobs)
}

/// Step 3's exact optimum on every feasible (job, GPU) pair the gangs
/// left: pricing from the round's graph (untimed in the round).
fn exact_singles(
    args: &BenchArgs,
    cluster: &Cluster,
    ks: &[u32],
    taken: &[bool],
    initial: &[Edge],
) -> anyhow::Result<(Solution, f64)> {
    let t = Instant::now();
    let left = |j: u32, g: u32| {
        (!taken[g as usize] && ks[j as usize] == 1)
            .then(|| cluster.weight(j, g))
            .flatten()
    };
    let full = crate::exact::FnScores {
        jobs: args.jobs,
        gpus: args.gpus,
        score: left,
    };
    let exact = crate::exact::solve_exact(
        &full,
        initial,
        &ExactOptions {
            threads: args.threads,
            ..ExactOptions::default()
        },
    )
    .context("pricing the 1-GPU part")?;
    Ok((exact.solution, t.elapsed().as_secs_f64()))
}

/// The step table and the key=value line.
fn write_gang_report(
    text: &mut String,
    args: &BenchArgs,
    slots: u32,
    gang_share: f64,
    (reference_s, reference): (f64, &Solution),
    r: &GangRound,
) -> std::fmt::Result {
    let singles_gap = gap(
        r.exact.matching.objective as i128,
        r.singles.matching.objective as i128,
    );
    let budget = args.pricing_budget_ms;
    writeln!(
        text,
        "muxflow-matcher-bench --gang-share {gang_share} --slots-per-gpu {slots}: {} GPUs in nodes of {GANG_BENCH_GPUS_PER_NODE} ({slots} slots each) x {} jobs ({} of them 2, 4 or 8-GPU gangs), seed {}, k={}, {} threads",
        args.gpus,
        args.jobs,
        r.gangs,
        args.seed,
        args.candidates_per_job,
        args.threads
    )?;
    writeln!(
        text,
        "{:<48} {:>9} {:>14} {:>8}",
        "step", "time_s", "objective", "placed"
    )?;
    let row = |text: &mut String, name: &str, s: f64, obj: Option<i64>, placed: Option<usize>| {
        writeln!(
            text,
            "{:<48} {:>9.3} {:>14} {:>8}",
            name,
            s,
            obj.map_or("-".into(), |o| o.to_string()),
            placed.map_or("-".into(), |p| p.to_string())
        )
    };
    let singles = &r.singles.matching;
    row(
        text,
        "reference: all as 1-GPU jobs, one matching",
        reference_s,
        Some(reference.matching.objective),
        Some(reference.matching.pairs.len()),
    )?;
    row(
        text,
        "1. 1-GPU jobs' matching (prices)",
        r.price_s,
        None,
        None,
    )?;
    row(
        text,
        "2. gangs (priced greedy)",
        r.gang_s,
        Some(r.gang_value),
        Some(r.placed),
    )?;
    row(
        text,
        "3. 1-GPU jobs on the GPUs left (warm)",
        r.final_s,
        Some(r.warm_objective),
        None,
    )?;
    row(
        text,
        &match r.pricing {
            None => "3b. pricing out: off (budget 0)".to_string(),
            Some((true, passes)) => format!("3b. pricing out: exact, {passes} passes"),
            Some((false, passes)) => {
                format!("3b. pricing out: {budget} ms spent, {passes} passes")
            }
        },
        r.pricing_s,
        Some(singles.objective),
        Some(singles.pairs.len()),
    )?;
    row(
        text,
        "4. split steps (jobs added beside them)",
        r.split_s,
        Some(r.sized_value - singles.objective),
        Some(r.split_jobs),
    )?;
    row(
        text,
        "round with gangs and sized slots (1+2+3+3b+4)",
        r.round_s,
        Some(r.objective()),
        None,
    )?;
    row(
        text,
        "exact optimum of step 3's jobs and GPUs (untimed)",
        r.exact_s,
        Some(r.exact.matching.objective),
        Some(r.exact.matching.pairs.len()),
    )?;
    writeln!(
        text,
        "gangs placed {} of {} on {} GPUs; {} jobs added by splits ({} edges scored); peak {:.1} MB (after the round); step 3's gap to its exact optimum {}",
        r.placed,
        r.gangs,
        r.gang_gpus,
        r.split_jobs,
        r.split_edges,
        r.peak_mb,
        fmt_gap(singles_gap)
    )?;
    writeln!(
        text,
        "gang_round_s={:.3} reference_s={reference_s:.3} ratio={:.2} slots_per_gpu={slots} gangs={} gangs_placed={} split_jobs={} peak_mb={:.1} singles_gap={} pricing_budget_ms={budget}",
        r.round_s,
        if reference_s > 0.0 { r.round_s / reference_s } else { f64::NAN },
        r.gangs,
        r.placed,
        r.split_jobs,
        r.peak_mb,
        fmt_gap(singles_gap)
    )
}
