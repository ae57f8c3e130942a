//! `muxflow-police`: started by the Prolog for each muxflow job; for an
//! offline job it checks the job's processes against its limits every
//! `health.police_interval_ms`, for an online job it records a foreign
//! `terminate_client` of its clients within that interval; until the Epilog
//! has forgotten the job (see `muxflow_node::police`).
//! Like the other node programs it never fails the node.

fn main() {
    muxflow_node::run_contained("muxflow-police", |config, env| {
        let job = env
            .job_id
            .as_deref()
            .and_then(|j| j.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("SLURM_JOB_ID is not a job id"))?;
        muxflow_node::police::watch(config, job, env.node.as_deref())
    });
}
