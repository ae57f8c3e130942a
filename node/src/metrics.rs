//! The node's figures for Prometheus and DCGM ([`muxflow::records::metrics`]):
//! gathered from the node state the health steps, Prolog and Epilog keep,
//! written to `[metrics] textfile_dir` (`muxflow.prom`) and
//! `[metrics] dcgm_job_mapping_dir` when set.
//!
//! Series (labels `node`, `gpu`; `job` for an offline job's own):
//! * `muxflow_gpu_health_state` — 1 for the GPU's state, 0 for the others
//!   (label `state`);
//! * `muxflow_gpu_online_solo_sm_activity_ratio` — the online job's SM
//!   activity measured alone (what the SM policy sizes offline jobs by);
//! * `muxflow_gpu_jobs` — jobs on the GPU by `mode`;
//! * `muxflow_offline_sm_share_ratio`, `muxflow_offline_memory_cap_bytes` —
//!   what the policy gave each offline job;
//! * `muxflow_xcuda_launches_total`, `…_delayed_launches_total`,
//!   `…_delay_seconds_total`, `…_oom_refusals_total`,
//!   `…_graceful_releases_total` — xCUDA's counters of
//!   each running offline job (its own claims: a job can only misreport
//!   itself);
//! * `muxflow_node_actions_total` (label `action`) and
//!   `muxflow_mps_restarts_total` — what the health steps did, from the
//!   GPU's record; `muxflow_node_policed_total` (label `code`) — processes
//!   the node terminated;
//! * `muxflow_online_latency_p99_seconds`, `muxflow_online_requests_per_second`
//!   — the online service's figures where its workload reports them.

use std::collections::BTreeSet;

use muxflow::node::state::{JobRecord, NodeState};
use muxflow::policy::health::HealthState;
use muxflow::records::limits::JobLimits;
use muxflow::records::metrics::Exposition;
use muxflow::records::report::{last_kv_line, read_claim_files, JobReport};
use muxflow::{Config, Mode};

use crate::record::{load_record, GpuRecord};

/// The textfile's name in `textfile_dir`.
pub const TEXTFILE: &str = "muxflow.prom";

/// Counters of the GPU record that count MPS restarts (the detector's
/// server restart, the health check's control-daemon restart).
const RESTART_ACTIONS: [&str; 2] = ["action.restart_mps", "action.restart_mps_daemon"];

/// Everything the node knows, as one exposition, and each GPU's jobs.
pub fn collect(ns: &NodeState, node: &str) -> (Exposition, Vec<(u32, BTreeSet<u32>)>) {
    let mut e = Exposition::default();
    let mut mapping = Vec::new();
    for gpu in ns.gpus().unwrap_or_default() {
        let base = [("node", node.to_string()), ("gpu", gpu.to_string())];
        if let Some(rec) = load_record(ns, gpu).ok().flatten() {
            gpu_record(&mut e, &base, &rec);
        }
        let jobs = ns.jobs(gpu).unwrap_or_default();
        for mode in [Mode::Online, Mode::Offline] {
            let mut l = base.to_vec();
            l.push(("mode", mode.as_str().to_string()));
            e.gauge("muxflow_gpu_jobs", "Jobs on the GPU, by mode.")
                .sample(&l, jobs.iter().filter(|j| j.mode == mode).count() as f64);
        }
        for job in &jobs {
            match job.mode {
                Mode::Online => online_job(&mut e, ns, &base, job),
                Mode::Offline => offline_job(&mut e, ns, &base, job),
            }
        }
        mapping.push((gpu, jobs.iter().map(|j| j.job_id).collect()));
    }
    (e, mapping)
}

/// A GPU's labels: its node and index.
type GpuLabels = [(&'static str, String); 2];

/// What the GPU's health record says: its state, its online job's solo SM
/// activity, the node's actions and policing on it, MPS restarts.
fn gpu_record(e: &mut Exposition, base: &GpuLabels, rec: &GpuRecord) {
    let current = rec.fsm().state;
    for st in HealthState::ALL {
        let mut l = base.to_vec();
        l.push(("state", st.to_string()));
        e.gauge(
            "muxflow_gpu_health_state",
            "The GPU's health state as muxflow's state machine decided it (1: current).",
        )
        .sample(&l, f64::from(u8::from(st == current)));
    }
    if let Some(sm) = rec.solo.as_ref().and_then(|s| s.sm_pct) {
        e.gauge(
            "muxflow_gpu_online_solo_sm_activity_ratio",
            "SM activity of the GPU's online job measured while it ran alone.",
        )
        .sample(base, sm / 100.0);
    }
    let mut restarts = 0;
    for (key, n) in &rec.counters {
        if let Some(action) = key.strip_prefix("action.") {
            let mut l = base.to_vec();
            l.push(("action", action.to_string()));
            e.counter(
                "muxflow_node_actions_total",
                "Actions the node's health steps took on the GPU.",
            )
            .sample(&l, *n as f64);
        }
        if let Some(code) = key.strip_prefix("policed.") {
            let mut l = base.to_vec();
            l.push(("code", code.to_string()));
            e.counter(
                "muxflow_node_policed_total",
                "Processes or settings the node undid because they broke an offline job's limits.",
            )
            .sample(&l, *n as f64);
        }
        if RESTART_ACTIONS.contains(&key.as_str()) {
            restarts += n;
        }
    }
    e.counter(
        "muxflow_mps_restarts_total",
        "Restarts of the GPU's MPS server or control daemon by the node.",
    )
    .sample(base, restarts as f64);
}

/// A job's claim files in the node's xCUDA stats directory, and what they
/// claim together.
fn job_claims(ns: &NodeState, job_id: u32) -> (JobReport, Vec<(String, String)>) {
    let mut claims = JobReport::default();
    let files = read_claim_files(&ns.xcuda_stats_dir(job_id));
    claims.add_claims(files.iter().map(|(n, t)| (n.as_str(), t.as_str())));
    (claims, files)
}

/// An online job's figures on the GPU.
fn online_job(e: &mut Exposition, ns: &NodeState, base: &GpuLabels, job: &JobRecord) {
    // The service's own figures, where its workload writes them to
    // $MUXFLOW_JOB_REPORT (claims: it can only misreport itself).
    let (claims, _) = job_claims(ns, job.job_id);
    let mut l = base.to_vec();
    l.push(("job", job.job_id.to_string()));
    if let Some(p99) = claims.p99_ms {
        e.gauge(
            "muxflow_online_latency_p99_seconds",
            "The online service's 99th percentile latency, as its workload reports it.",
        )
        .sample(&l, p99 / 1000.0);
    }
    if let Some(rps) = claims.rps {
        e.gauge(
            "muxflow_online_requests_per_second",
            "Requests the online service served per second, as its workload reports it.",
        )
        .sample(&l, rps);
    }
}

/// An offline job's figures on the GPU: its limits, who enforces them, and
/// what xCUDA counted.
fn offline_job(e: &mut Exposition, ns: &NodeState, base: &GpuLabels, job: &JobRecord) {
    let mut l = base.to_vec();
    l.push(("job", job.job_id.to_string()));
    if let Ok((limits, _)) = JobLimits::read_trusted(&ns.limits_dir(), job.job_id, 0) {
        e.gauge(
            "muxflow_offline_sm_share_ratio",
            "SM share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) the policy gave the offline job.",
        )
        .sample(&l, f64::from(limits.sm_pct) / 100.0);
        if let Some(cap) = limits.mem_cap_mib {
            e.gauge(
                "muxflow_offline_memory_cap_bytes",
                "GPU memory cap the policy gave the offline job.",
            )
            .sample(&l, (cap as f64) * 1024.0 * 1024.0);
        }
        for (limit, by) in [
            ("memory", limits.enforced_by.mem),
            ("sm", limits.enforced_by.sm),
        ] {
            let mut l = l.clone();
            l.push(("limit", limit.to_string()));
            l.push(("by", by.to_string()));
            e.gauge(
                    "muxflow_offline_limit_enforced_by",
                    "1 per limit of the offline job, labelled with who enforces it: driver (MPS SM partition or MPS v3 namespace), kernel (cgroup dmem.max), xcuda (xCUDA and MPS client variables, policed) or policed.",
                )
                .sample(&l, 1.0);
        }
    }
    let (claims, files) = job_claims(ns, job.job_id);
    let counters = [
        (
            "muxflow_xcuda_launches_total",
            "Kernel launches xCUDA saw in the offline job.",
            claims.launches.map(|v| v as f64),
        ),
        (
            "muxflow_xcuda_delayed_launches_total",
            "Launches xCUDA delayed to give the online job the GPU.",
            claims.delayed.map(|v| v as f64),
        ),
        (
            "muxflow_xcuda_delay_seconds_total",
            "Time xCUDA held the offline job's launches back.",
            claims.delay_ms.map(|v| v as f64 / 1000.0),
        ),
        (
            "muxflow_xcuda_oom_refusals_total",
            "Allocations xCUDA refused for going over the job's memory cap.",
            claims.oom.map(|v| v as f64),
        ),
    ];
    // Not in the job report: summed here from xCUDA's files.
    let released: u64 = files
        .iter()
        .filter(|(n, _)| n.starts_with("xcuda."))
        .filter_map(|(_, t)| {
            muxflow::records::report::claim_u64("released", last_kv_line(t)?.get("released")?)
        })
        .fold(0u64, u64::saturating_add);
    e.counter(
        "muxflow_xcuda_graceful_releases_total",
        "Processes of the offline job whose GPU contexts xCUDA released on SIGTERM or SIGINT.",
    )
    .sample(&l, released as f64);
    for (name, help, value) in counters {
        if let Some(v) = value {
            e.counter(name, help).sample(&l, v);
        }
    }
}

/// Writes the node's textfile and job-mapping files where the config says;
/// a failure is logged (figures are never worth failing a job or a health
/// step for).
pub fn publish(config: &Config, ns: &NodeState, node: &str) {
    let m = &config.metrics;
    if m.textfile_dir.is_none() && m.dcgm_job_mapping_dir.is_none() {
        return;
    }
    let (exposition, mapping) = collect(ns, node);
    if let Some(dir) = &m.textfile_dir {
        if let Err(e) =
            muxflow::records::metrics::write_atomic(dir.as_path(), TEXTFILE, &exposition.render())
        {
            tracing::warn!("muxflow metrics textfile: {e}");
        }
    }
    if let Some(dir) = &m.dcgm_job_mapping_dir {
        if let Err(e) = muxflow::records::metrics::write_job_mapping(dir.as_path(), &mapping) {
            tracing::warn!("dcgm job mapping: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muxflow::config::Xcuda;
    use muxflow::node::state::JobRecord;
    use muxflow::records::xcuda_env::XcudaEnv;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_offline_jobs_limits_and_xcuda_counters_become_labelled_series() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ns = NodeState::new(dir.path());
        let lock = ns.lock_gpu(1).unwrap();
        for (job_id, mode) in [(7, Mode::Online), (12, Mode::Offline)] {
            let rec = JobRecord {
                job_id,
                mode,
                uid: 0,
                slots: Vec::new(),
            };
            ns.add_job(&lock, 1, &rec).unwrap();
        }
        drop(lock);
        let limits = JobLimits {
            job_id: 12,
            gpu: 1,
            sm_pct: 30,
            mem_cap_mib: Some(1024),
            xcuda: XcudaEnv::from_config(&Xcuda::default(), 1),
            enforced_by: muxflow::records::limits::EnforcedBy {
                mem: muxflow::records::limits::Enforcer::Kernel,
                sm: muxflow::records::limits::Enforcer::Xcuda,
            },
        };
        let ldir = ns.limits_dir();
        std::fs::create_dir_all(&ldir).unwrap();
        std::fs::set_permissions(&ldir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let lpath = muxflow::records::limits::path(&ldir, 12);
        std::fs::write(&lpath, limits.encode()).unwrap();
        std::fs::set_permissions(&lpath, std::fs::Permissions::from_mode(0o644)).unwrap();
        let stats = ns.xcuda_stats_dir(12);
        std::fs::create_dir_all(&stats).unwrap();
        for (pid, released) in [(100, 1), (101, 0)] {
            std::fs::write(
                stats.join(format!("xcuda.{pid}")),
                format!("launches=10 delayed=4 delay_us=1500000 oom=2 peak_bytes=0 released={released}\n"),
            )
            .unwrap();
        }
        let online_stats = ns.xcuda_stats_dir(7);
        std::fs::create_dir_all(&online_stats).unwrap();
        std::fs::write(
            online_stats.join("job.report"),
            "requests=10 rps=50 p99_ms=8.5\n",
        )
        .unwrap();

        let (e, mapping) = collect(&ns, "n1");
        let text = e.render();
        let job = "{node=\"n1\",gpu=\"1\",job=\"12\"}";
        for want in [
            format!("muxflow_offline_sm_share_ratio{job} 0.3\n"),
            format!("muxflow_offline_memory_cap_bytes{job} 1073741824\n"),
            format!("muxflow_xcuda_launches_total{job} 20\n"),
            "muxflow_offline_limit_enforced_by{node=\"n1\",gpu=\"1\",job=\"12\",limit=\"memory\",by=\"kernel\"} 1\n".into(),
            "muxflow_offline_limit_enforced_by{node=\"n1\",gpu=\"1\",job=\"12\",limit=\"sm\",by=\"xcuda\"} 1\n".into(),
            format!("muxflow_xcuda_delayed_launches_total{job} 8\n"),
            format!("muxflow_xcuda_delay_seconds_total{job} 3\n"),
            format!("muxflow_xcuda_oom_refusals_total{job} 4\n"),
            format!("muxflow_xcuda_graceful_releases_total{job} 1\n"),
            "muxflow_online_latency_p99_seconds{node=\"n1\",gpu=\"1\",job=\"7\"} 0.0085\n".into(),
            "muxflow_gpu_jobs{node=\"n1\",gpu=\"1\",mode=\"offline\"} 1\n".into(),
        ] {
            assert!(text.contains(&want), "missing {want}in\n{text}");
        }
        assert_eq!(mapping, vec![(1, BTreeSet::from([7, 12]))]);
    }
}
