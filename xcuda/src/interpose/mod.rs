//! The top layer: what the application's calls land on. The hooked
//! driver entry points ([`hooks`], generated from the one list in
//! [`crate::abi`]), the `dlsym`/`dlvsym` hooks and the `cuGetProcAddress`
//! answer ([`dlsym`], [`hooks`]). (The interposed `sigaction`/`signal` live
//! with the signal handling they serve, [`crate::lifecycle::shutdown`].)

pub mod dlsym;
pub mod hooks;
