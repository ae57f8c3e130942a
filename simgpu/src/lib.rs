//! Simulated GPU: built by the simulated-GPU issue.
