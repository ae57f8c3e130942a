//! What muxflow decides, as pure functions of what it read: an offline
//! job's SM share and memory cap ([`share`]) and each GPU's health state
//! ([`health`]).

pub mod health;
pub mod share;
