//! Root's hands on one node: its state directory, each GPU's MPS daemon,
//! the kernel's and the driver's own limits (dmem, SM partitions), the
//! processes of a job and the directories its user writes in, and the
//! helper programs root runs.

pub mod dmem;
pub mod jobproc;
pub mod mps;
pub mod mps_v3;
pub mod offline_procs;
pub mod pipe_access;
pub mod process;
pub mod sm_partition;
pub mod state;
pub mod user_tree;
