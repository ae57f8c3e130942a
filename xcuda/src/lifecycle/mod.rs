//! The lifecycle layer: what happens over a process's life around the
//! state — start-up at `cuInit` ([`start`]), the watcher that samples the
//! GPU and moves the gate ([`watcher`]), fork, the graceful exit on
//! SIGINT/SIGTERM and the signal interposition it needs ([`shutdown`]); in
//! online jobs, counting mode's publisher ([`publisher`]) instead, and in
//! offline ones the online page's part of the gate ([`online_gate`]).

pub mod online_gate;
pub mod publisher;
pub mod queue_poll;
pub mod shutdown;
pub mod start;
pub mod watcher;
