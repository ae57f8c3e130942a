//! The `--muxflow=` job mode.

use std::fmt;
use std::str::FromStr;

/// How a job takes part in GPU sharing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Latency-critical inference: owns its GPU, MPS client priority 0.
    Online,
    /// Best-effort training: runs in the capacity the online job leaves idle.
    Offline,
}

/// The variable the plugin exports with the job's mode (at submit, with
/// `spank_job_control_setenv`; in each step, to the tasks). Slurm passes it
/// on under two more names: [`PROLOG_ENV_VAR`] and [`JOB_ENV_VAR`].
pub const ENV_VAR: &str = "MUXFLOW_MODE";
/// [`ENV_VAR`] as the Prolog and Epilog see it.
pub const PROLOG_ENV_VAR: &str = "SPANK_MUXFLOW_MODE";
/// [`ENV_VAR`] as the job's environment carries it.
pub const JOB_ENV_VAR: &str = "SLURM_SPANK_MUXFLOW_MODE";

/// The values `--muxflow=` accepts, for messages.
pub const ACCEPTED: &str = "online, offline";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid --muxflow value '{0}': accepted values are {ACCEPTED} (e.g. sbatch --muxflow=offline)"
)]
pub struct ParseModeError(pub String);

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Online => "online",
            Mode::Offline => "offline",
        }
    }
}

impl FromStr for Mode {
    type Err = ParseModeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "online" => Ok(Mode::Online),
            "offline" => Ok(Mode::Offline),
            other => Err(ParseModeError(crate::text::shorten(other))),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_accepted_values() {
        assert_eq!("online".parse(), Ok(Mode::Online));
        assert_eq!(" offline ".parse(), Ok(Mode::Offline));
        for m in [Mode::Online, Mode::Offline] {
            assert_eq!(m.to_string().parse(), Ok(m));
        }
    }

    #[test]
    fn rejects_others_naming_the_accepted_values() {
        for bad in ["", "Offline", "bogus", "online,offline"] {
            let err = bad.parse::<Mode>().unwrap_err().to_string();
            assert!(err.contains("online, offline"), "{err}");
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
    }

    #[test]
    fn a_huge_value_is_echoed_cut() {
        let err = "x".repeat(5000).parse::<Mode>().unwrap_err().to_string();
        assert!(err.contains("… (5000 bytes)"), "{err}");
        assert!(err.len() < 300, "{err}");
    }
}
