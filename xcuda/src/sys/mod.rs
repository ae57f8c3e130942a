//! The lowest layer: the real driver and the C library, reached without
//! xCUDA's own interposers. Nothing here knows about quotas, the gate or
//! signals.

pub mod driver;
pub mod elf;
