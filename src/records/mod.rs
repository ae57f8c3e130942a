//! What one muxflow context writes for another to read: the job's
//! AdminComment (its protocol, placement and report), the node's published
//! record (with a requeued job's earlier runs), the job's limits file, the online and SM activity pages, the
//! preemption warning, the xCUDA settings and the metrics exposition. Each
//! module says who writes it, who reads it and what the reader may trust.

pub mod admin_comment;
pub mod job_comment;
pub mod kv;
pub mod limits;
pub mod metrics;
pub mod online_page;
pub mod placement;
pub mod preempt;
pub mod published;
pub mod report;
pub mod runs;
pub mod sm_page;
pub mod xcuda_env;
