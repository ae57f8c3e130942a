//! Several offline jobs per GPU (issue 15, `[policy] offline_per_gpu` = N)
//! on the dev cluster. On a cluster brought up with `scripts/devcluster up
//! --offline-per-gpu 2` (gres.conf repeats each GPU's mfslot line, the node
//! has `mfslot:g<i>:2`; scripts/test runs this file there too):
//! - two offline jobs placed on one GPU beside an online job with one slot
//!   each (`mfslot:g<i>:1`) both start, each in its own slot with its half
//!   of the GPU's offline SM budget and memory room; both throttle while
//!   the online job is on the GPU and resume, without braking for each
//!   other, once it has left (root lists both as the GPU's offline
//!   processes); the first one's Epilog leaves the MPS daemon to the
//!   second, the second's stops it. On the default cluster (one slot per
//!   GPU) Slurm starts only one of the two.
//! - an offline job placed alone with all N slots of its GPU
//!   (`mfslot:g<i>:N`, sized slots) gets the whole budget and room, what
//!   N = 1 gives, and holds every slot: a second offline job placed on that
//!   GPU waits for Resources while it runs (on either cluster).
//! - muxflow-matcher sizes the slots (N = 2 cluster only): a lone job on an
//!   idle GPU gets both, and with more jobs waiting than GPUs it puts two on
//!   each GPU, one slot each, all running.
//!
//! - under the bounded queue (the cluster's default), a board of full power
//!   (NVML's power limit at or above `[policy] queue_ceiling_min_power_w`)
//!   gives an offline job beside an online one the SM ceiling, where the
//!   dev cluster's t4-like GPUs (70 W) size it from the online job.
//!
//! They all use the one node's GPUs, so they run one at a time.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use muxflow::config::OfflineGuard;
use muxflow::node::mps::MpsDaemon;
use muxflow::policy::share::{offline_slot_share, offline_sm_budget, offline_sm_percent};
use muxflow::records::report::JobReport;
use muxflow::Mode;
use muxflow_tests::{decision, kv, CancelNamed, Cluster};

const PREFIX: &str = "mfs-";
const WHOLE: &str = "mfswhole-";
const POWER: &str = "mfspower-";
const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "node1";
/// Held by each test for its whole run: both use node1's GPUs.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    // A test that failed poisons it; the next one still runs.
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sum of xCUDA counter `key` over job `job`'s processes (stats files are
/// rewritten every second); None before the first write.
fn counter(c: &Cluster, config: &Path, job: u32, key: &str) -> Option<u64> {
    let dir = c.node_view(NODE, &c.node_state(config, NODE).xcuda_stats_dir(job));
    let mut total = None;
    for e in std::fs::read_dir(&dir).ok()?.flatten() {
        if !e.file_name().to_string_lossy().starts_with("xcuda.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(n) = kv(&text, key).and_then(|v| v.parse::<u64>().ok()) {
            *total.get_or_insert(0) += n;
        }
    }
    total
}

/// How much counter `key` of each job grows over `secs`, after `settle`.
fn growth(c: &Cluster, config: &Path, jobs: &[u32], key: &str, settle: u64, secs: u64) -> Vec<u64> {
    std::thread::sleep(Duration::from_secs(settle));
    let before: Vec<u64> = jobs
        .iter()
        .map(|&j| counter(c, config, j, key).unwrap_or(0))
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    jobs.iter()
        .zip(before)
        .map(|(&j, b)| counter(c, config, j, key).unwrap_or(0) - b)
        .collect()
}

/// Job `id` stays pending until the scheduler has tried it and says it
/// waits for Resources (its reason is None until then; 24.11 may take a
/// few seconds longer than 22.05).
fn waits_for_resources(c: &Cluster, id: u32) {
    let start = Instant::now();
    loop {
        assert_eq!(c.job_field(id, "JobState"), "PENDING");
        let reason = c.job_field(id, "Reason");
        if reason == "Resources" {
            return;
        }
        assert!(
            start.elapsed() < WAIT,
            "job {id}: Reason={reason}, not Resources"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
#[test]
fn two_offline_jobs_share_one_gpu_beside_an_online_job_under_one_brake() {
    let _one = one_at_a_time();
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let cluster_config = c.dir.join("etc/muxflow.toml");
    let policy = muxflow::Config::load(&cluster_config).unwrap().policy;
    let quick = c.health_config("slots-health", "min_dwell_s = 1\nrecovery_quiet_s = 1");

    let (online, gpu) = c.online_workload(&format!("{PREFIX}online"), NODE, 0.30, 1000);
    c.settle_healthy(&quick, NODE, gpu, 1000);

    // Each prints what it got, then trains (saturating the GPU) until signalled.
    let script = format!(
        "#!/bin/sh\necho pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\n{}\n",
        c.workload("offline --duration 300 --kernels-per-step 20 --kernel-us 500")
    );
    let offline: Vec<u32> = (0..2)
        .map(|i| {
            c.sbatch(
                &[
                    "--muxflow=offline",
                    "--job-name",
                    &format!("{PREFIX}offline-{i}"),
                ],
                &script,
            )
            .unwrap()
        })
        .collect();
    for &id in &offline {
        c.place(id, NODE, gpu);
    }

    if policy.offline_per_gpu < 2 {
        // One slot per GPU: Slurm starts one of them; the other waits for
        // the slot (Resources) and never runs beside it.
        c.wait_running(offline[0], WAIT);
        waits_for_resources(&c, offline[1]);
        let all: Vec<u32> = offline.into_iter().chain([online]).collect();
        c.scancel(&all);
        // Gone before the next test binary uses the node (a trainer left
        // running keeps the GPU Busy for it).
        for id in all {
            c.wait(id, WAIT);
        }
        c.sim_load(NODE, gpu, 0.0);
        return;
    }

    for &id in &offline {
        assert_eq!(c.wait_running(id, WAIT), NODE);
    }
    // Both hold a slot of the same GPU (Slurm numbers the records, not GPUs).
    for &id in &offline {
        let gres = c.gres_detail(id);
        assert!(gres.starts_with(&format!("mfslot:g{gpu}:1(IDX:")), "{gres}");
    }

    // Each its own slot, each that slot's part: half the budget and room.
    // (RUNNING comes before the Prolog has recorded the job; its output
    // after.)
    let outputs: Vec<String> = offline
        .iter()
        .map(|&id| c.wait_output(id, "pct=", WAIT))
        .collect();
    let ns = c.node_state(&quick, NODE);
    let records = ns.jobs(gpu).unwrap();
    let slots_of = |id: u32| {
        records
            .iter()
            .find(|r| r.job_id == id && r.mode == Mode::Offline)
            .unwrap_or_else(|| panic!("job {id} not recorded: {records:?}"))
            .slots
            .clone()
    };
    let slots: Vec<Vec<u8>> = offline.iter().map(|&id| slots_of(id)).collect();
    assert!(
        slots.iter().all(|s| s.len() == 1),
        "one slot each: {records:?}"
    );
    let slots: BTreeSet<u8> = slots.concat().into_iter().collect();
    assert_eq!(slots, [0, 1].into(), "{records:?}");
    // The GPU's facts are frozen while offline jobs run (no solo samples).
    let facts = ns.facts(gpu).unwrap();
    let budget = offline_sm_budget(&policy, &facts);
    let mut sum = 0;
    for (&id, out) in offline.iter().zip(&outputs) {
        let want = offline_slot_share(&policy, &facts, 1);
        let pct: u8 = kv(out, "pct").unwrap().parse().unwrap();
        assert_eq!(pct, want.sm_pct, "job {id}: {out} (facts {facts:?})");
        let cap = want.mem_cap_mib.expect("GPU memory recorded");
        assert_eq!(kv(out, "mem").unwrap(), format!("0={cap}M"), "job {id}");
        sum += u32::from(pct);
    }
    assert!(
        sum <= u32::from(budget) && sum + 1 >= u32::from(budget),
        "shares {sum} vs budget {budget}"
    );

    // Both train; root lists both as the GPU's offline processes.
    let pids: BTreeSet<u32> = offline
        .iter()
        .map(|&id| {
            let out = c.wait_output(id, "pid=", WAIT);
            kv(&out.replace('\n', " "), "pid").unwrap().parse().unwrap()
        })
        .collect();
    let start = Instant::now();
    loop {
        let listed: BTreeSet<u32> =
            muxflow::node::offline_procs::read_trusted(&ns.offline_procs_file(gpu), 0)
                .map(|s| s.iter().map(|p| p.pid).collect())
                .unwrap_or_default();
        if listed == pids {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "offline processes listed {listed:?}, running {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The online job on the GPU, the GPU saturated: both throttle.
    let braked = growth(&c, &quick, &offline, "delayed", 1, 3);
    assert!(
        braked.iter().all(|&n| n > 0),
        "not both braked beside the online job: {braked:?}"
    );

    // The online job leaves: both resume, and do not brake for each other
    // though together they saturate the GPU.
    c.scancel(&[online]);
    c.wait(online, WAIT);
    let launched = growth(&c, &quick, &offline, "launches", 2, 3);
    let delayed = growth(&c, &quick, &offline, "delayed", 0, 3);
    assert_eq!(delayed, [0, 0], "braked for each other");
    assert!(launched.iter().all(|&n| n > 0), "{launched:?}");

    // The first one's Epilog leaves the GPU's MPS daemon to the second
    // (its client keeps running); the second one's stops it.
    let cfg = muxflow::Config::load(&quick)
        .unwrap()
        .for_node(NODE)
        .unwrap();
    let mps = MpsDaemon::for_gpu(&cfg, gpu);
    c.scancel(&[offline[0]]);
    c.wait(offline[0], WAIT);
    let start = Instant::now();
    while ns.jobs(gpu).unwrap().iter().any(|r| r.job_id == offline[0]) {
        assert!(start.elapsed() < WAIT, "job {} still recorded", offline[0]);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(mps.is_running(), "the first Epilog stopped the daemon");
    assert_eq!(c.job_field(offline[1], "JobState"), "RUNNING");
    let still = growth(&c, &quick, &offline[1..], "launches", 1, 2);
    assert!(still[0] > 0, "the second offline job stopped launching");
    c.scancel(&[offline[1]]);
    c.wait(offline[1], WAIT);
    let start = Instant::now();
    while mps.is_running() {
        assert!(
            start.elapsed() < WAIT,
            "the last Epilog left the daemon running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Each one's AdminComment names the other as its peer on the GPU, so
    // the matcher does not read their speeds as speeds beside the online
    // job alone.
    for (&id, &other) in offline.iter().zip(offline.iter().rev()) {
        let line = c.sacct_until(id, "AdminComment", |l| l.contains("muxflow:"));
        let report = JobReport::decode(line.split('|').nth(1).unwrap())
            .unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(report.peers, [other], "job {id}: {line}");
    }
    c.sim_load(NODE, gpu, 0.0);
    c.assert_no_drain();
}

#[test]
fn an_offline_job_holding_all_slots_of_its_gpu_gets_the_whole_budget() {
    let _one = one_at_a_time();
    let c = Cluster::get();
    c.cancel_named(WHOLE);
    let _cancel = CancelNamed(&c, WHOLE);
    let cluster_config = c.dir.join("etc/muxflow.toml");
    let policy = muxflow::Config::load(&cluster_config).unwrap().policy;
    let n = policy.offline_per_gpu;
    let quick = c.health_config("slots-health", "min_dwell_s = 1\nrecovery_quiet_s = 1");

    let (online, gpu) = c.online_workload(&format!("{WHOLE}online"), NODE, 0.30, 1000);
    c.settle_healthy(&quick, NODE, gpu, 1000);
    let script = "#!/bin/sh\necho pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\nsleep 300\n";
    let submit = |name: &str| {
        c.sbatch(
            &["--muxflow=offline", "--job-name", &format!("{WHOLE}{name}")],
            script,
        )
        .unwrap()
    };

    // Placed alone on the GPU: all N of its slots.
    let whole = submit("whole");
    c.place_slots(whole, NODE, gpu, u32::from(n));
    assert_eq!(c.wait_running(whole, WAIT), NODE);
    let gres = c.gres_detail(whole);
    assert!(
        gres.starts_with(&format!("mfslot:g{gpu}:{n}(IDX:")),
        "{gres}"
    );
    let out = c.wait_output(whole, "pct=", WAIT);
    let ns = c.node_state(&quick, NODE);
    let records = ns.jobs(gpu).unwrap();
    let record = records
        .iter()
        .find(|r| r.job_id == whole)
        .unwrap_or_else(|| panic!("job {whole} not recorded: {records:?}"));
    assert_eq!(record.mode, Mode::Offline);
    assert_eq!(record.slots, (0..n).collect::<Vec<u8>>(), "{records:?}");

    // The whole budget and room: what one slot per GPU gives.
    let facts = ns.facts(gpu).unwrap();
    let one_per_gpu = muxflow::config::Policy {
        offline_per_gpu: 1,
        ..policy.clone()
    };
    let want = offline_slot_share(&one_per_gpu, &facts, 1);
    let pct: u8 = kv(&out, "pct").unwrap().parse().unwrap();
    assert_eq!(pct, want.sm_pct, "{out} (facts {facts:?})");
    assert_eq!(pct, offline_sm_budget(&policy, &facts), "{out}");
    let cap = want.mem_cap_mib.expect("GPU memory recorded");
    assert_eq!(kv(&out, "mem").unwrap(), format!("0={cap}M"), "{out}");

    // It holds every slot of the GPU: a second offline job placed there
    // waits (Slurm has no record of the GPU left to give it).
    let second = submit("second");
    c.place(second, NODE, gpu);
    waits_for_resources(&c, second);
    assert_eq!(c.job_field(whole, "JobState"), "RUNNING");
    assert_eq!(
        ns.jobs(gpu)
            .unwrap()
            .iter()
            .filter(|r| r.mode == Mode::Offline)
            .count(),
        1
    );

    for id in [second, whole, online] {
        c.scancel(&[id]);
    }
    c.wait(whole, WAIT);
    c.sim_load(NODE, gpu, 0.0);
    c.assert_no_drain();
}

const MATCHED: &str = "mfsmatch-";

/// The matcher sizes the slots (N = 2 cluster only; on one slot per GPU
/// every job holds its GPU's one slot, which the other tests show): a job
/// alone on an idle GPU gets both slots (`mfslot:g<i>:2`); with more jobs
/// waiting than GPUs it puts two on each GPU, one slot each, and Slurm
/// starts all of them.
#[test]
fn the_matcher_gives_a_lone_job_every_slot_and_splits_gpus_when_jobs_wait() {
    let _one = one_at_a_time();
    let c = Cluster::get();
    let policy = muxflow::Config::load(&c.dir.join("etc/muxflow.toml"))
        .unwrap()
        .policy;
    if policy.offline_per_gpu != 2 {
        eprintln!("skipped: needs the offline_per_gpu = 2 cluster (scripts/test runs it there)");
        return;
    }
    c.cancel_named(MATCHED);
    let _cancel = CancelNamed(&c, MATCHED);
    for g in 0..2 {
        c.wait_gpu_healthy(NODE, g);
    }
    let submit = |i: u32| {
        c.sbatch(
            &["--muxflow=offline", "--job-name", &format!("{MATCHED}{i}")],
            "#!/bin/sh\necho pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\nexec sleep 300\n",
        )
        .unwrap()
    };

    // One job, two idle GPUs: alone on one of them, with both slots.
    let lone = submit(0);
    let round = c.matcher_once();
    let d = decision(&round, lone);
    assert_eq!(d["action"], "place", "{d}");
    assert_eq!(d["slots"], serde_json::json!([2]), "{d}");
    assert_eq!(c.wait_running(lone, WAIT), NODE);
    let gpu = d["gpu"].as_u64().unwrap();
    let gres = c.gres_detail(lone);
    assert!(gres.starts_with(&format!("mfslot:g{gpu}:2(IDX:")), "{gres}");
    // An idle GPU's whole offline budget: the ceiling.
    let out = c.wait_output(lone, "pct=", WAIT);
    let ceiling = offline_sm_percent(&policy, Some(0));
    assert_eq!(kv(&out, "pct"), Some(ceiling.to_string()), "{out}");
    c.scancel(&[lone]);
    c.wait(lone, WAIT);

    // Four jobs, two GPUs: each GPU takes one job first, then one more
    // beside it; all four hold one slot each and run.
    let jobs: Vec<u32> = (1..=4).map(submit).collect();
    let round = c.matcher_once();
    let mut per_gpu = [0; 2];
    for &id in &jobs {
        let d = decision(&round, id);
        assert_eq!(d["action"], "place", "{round}");
        assert_eq!(d["slots"], serde_json::json!([1]), "{d}");
        per_gpu[d["gpu"].as_u64().unwrap() as usize] += 1;
    }
    assert_eq!(per_gpu, [2, 2], "{round}");
    for &id in &jobs {
        assert_eq!(c.wait_running(id, WAIT), NODE);
        let out = c.wait_output(id, "pct=", WAIT);
        assert_eq!(
            kv(&out, "pct"),
            Some((ceiling / 2).to_string()),
            "job {id}: {out}"
        );
    }
    for &id in &jobs {
        c.scancel(&[id]);
    }
    for &id in &jobs {
        c.wait(id, WAIT);
    }
    c.assert_no_drain();
}

/// A simulated GPU's power limit set for a test and put back (its
/// config.toml, read by every NVML client at its start).
struct PowerLimit {
    config: std::path::PathBuf,
    before: String,
}

impl PowerLimit {
    fn set(c: &Cluster, node: &str, gpu: u32, watts: u32) -> PowerLimit {
        let config = c
            .dir
            .join(format!("sim/state/nodes/{node}/gpus/{gpu}/config.toml"));
        let before = std::fs::read_to_string(&config).unwrap();
        assert!(!before.contains("power_limit_w"), "{before}");
        std::fs::write(&config, format!("{before}power_limit_w = {watts}\n")).unwrap();
        PowerLimit { config, before }
    }
}

impl Drop for PowerLimit {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.config, &self.before);
    }
}

#[test]
fn under_the_queue_a_full_power_board_gives_the_ceiling() {
    let _one = one_at_a_time();
    let c = Cluster::get();
    c.cancel_named(POWER);
    let _cancel = CancelNamed(&c, POWER);
    let policy = muxflow::Config::load(&c.dir.join("etc/muxflow.toml"))
        .unwrap()
        .policy;
    assert_eq!(policy.guard, OfflineGuard::Queue, "the cluster's default");
    let quick = c.health_config("slots-health", "min_dwell_s = 1\nrecovery_quiet_s = 1");

    let (_online, gpu) = c.online_workload(&format!("{POWER}online"), NODE, 0.30, 1000);
    {
        // NVML says 700 W (an SXM board's): the health step records it.
        let _power = PowerLimit::set(&c, NODE, gpu, 700);
        c.settle_healthy(&quick, NODE, gpu, 1000);
        let facts = c.node_state(&quick, NODE).facts(gpu).unwrap();
        assert_eq!(facts.power_limit_w, Some(700), "{facts:?}");
        let ceiling = policy.sm_ceiling.get();
        assert!(
            offline_sm_percent(&policy, facts.online_solo_sm_pct) < ceiling,
            "sized in space the share must differ: {facts:?}"
        );
        let script = "#!/bin/sh\necho pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\nsleep 300\n";
        let job = c
            .sbatch(
                &["--muxflow=offline", "--job-name", &format!("{POWER}job")],
                script,
            )
            .unwrap();
        c.place(job, NODE, gpu);
        assert_eq!(c.wait_running(job, WAIT), NODE);
        let out = c.wait_output(job, "pct=", WAIT);
        // The GPU's budget is the ceiling; the job's one slot of N its part.
        assert_eq!(offline_sm_budget(&policy, &facts), ceiling, "{facts:?}");
        let want = offline_slot_share(&policy, &facts, 1).sm_pct;
        assert_eq!(
            kv(&out, "pct").as_deref(),
            Some(want.to_string().as_str()),
            "{out}"
        );
        c.cancel_named(POWER);
    }
    // Back to the dev cluster's 70 W at the next health step.
    let ns = c.node_state(&quick, NODE);
    c.step_until(&quick, NODE, "the GPU's power limit back to 70 W", || {
        ns.facts(gpu).unwrap().power_limit_w == Some(70)
    });
    c.assert_no_drain();
}
