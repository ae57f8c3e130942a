//! The Slurm version this build targets, read from the installed headers by
//! `build.rs`, and the special step ids from `slurm/slurm.h`.

#![allow(non_upper_case_globals, non_camel_case_types, dead_code)]

mod generated {
    include!(concat!(env!("OUT_DIR"), "/slurm_version.rs"));
}

/// `SLURM_VERSION_NUMBER` of the headers built against (e.g. 0x160508).
pub const SLURM_VERSION_NUMBER: u32 = generated::SLURM_VERSION_NUMBER;
/// Step id of the extern step (PrologFlags=Contain).
pub const SLURM_EXTERN_CONT: u32 = generated::SLURM_EXTERN_CONT;
/// Step id of the batch step.
pub const SLURM_BATCH_SCRIPT: u32 = generated::SLURM_BATCH_SCRIPT;
/// Step id of the interactive step (`salloc` with use_interactive_step).
pub const SLURM_INTERACTIVE_STEP: u32 = generated::SLURM_INTERACTIVE_STEP;

/// Slurm 25.05 and later: the plugin can choose that a failure of its
/// slurmstepd callbacks fails the job instead of draining the node
/// (`slurm_spank_init_failure_mode`, see `spank/src/compat.rs`).
pub const INIT_FAILURE_MODE: bool = cfg!(slurm_init_failure_mode);
/// `ESPANK_JOB_FAILURE` of the headers (25.05 and later).
#[cfg(slurm_init_failure_mode)]
pub const ESPANK_JOB_FAILURE: i32 = generated::slurm_err_t_ESPANK_JOB_FAILURE as i32;

// Slurm's loader compares major.minor; a header without them is not Slurm's.
const _: () = assert!(SLURM_VERSION_NUMBER >> 16 >= 20 && SLURM_VERSION_NUMBER >> 16 < 0x100);

/// What every muxflow program's `--version` prints: its version and the
/// Slurm it was built for (`0.1.0 (built for Slurm 22.05.8)`).
pub fn program_version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        format!(
            "{} (built for Slurm {})",
            env!("CARGO_PKG_VERSION"),
            version_string()
        )
    })
}

/// "major.minor.micro" of the targeted Slurm.
pub fn version_string() -> String {
    let v = SLURM_VERSION_NUMBER;
    format!("{}.{:02}.{}", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_string_matches_the_number() {
        let v = SLURM_VERSION_NUMBER;
        let parts: Vec<u32> = version_string()
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(parts, [(v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff]);
        assert_eq!(SLURM_EXTERN_CONT, 0xffff_fffc);
        assert_eq!(SLURM_BATCH_SCRIPT, 0xffff_fffb);
        assert!(program_version().ends_with(&format!("(built for Slurm {})", version_string())));
        // The build script's table: the failure mode from 25.05 on.
        assert_eq!(INIT_FAILURE_MODE, v >= 0x19_05_00);
    }
}
