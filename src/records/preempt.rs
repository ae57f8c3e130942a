//! The warning muxflow gives an offline job before it requeues it for an
//! online job: the signal the job asked for with Slurm's `--signal`, sent
//! ahead of the requeue's SIGTERM, so that a trainer can checkpoint.
//!
//! The one fact that shapes it: Slurm 22.05 keeps a job's `--signal` where
//! no node program can read it (not in `scontrol show job`, `squeue`, the
//! job's environment or `job_submit.lua`'s fields). What a node can read,
//! as root, is the job's batch script (`scontrol write batch_script`), and
//! that is where the training recipes put it (`#SBATCH --signal=B:USR1@90`:
//! submitit and PyTorch Lightning's Slurm pages). So the warning is the
//! script's `#SBATCH --signal`; one given only on sbatch's command line or
//! in `SBATCH_SIGNAL` is not seen.
//!
//! Without one there is no extra signal: the requeue's SIGTERM is the
//! warning (xCUDA hands it to the application with its GPU until the stop
//! deadline, [`crate::records::limits::StopBounds`]). A default SIGUSR1 was weighed
//! and refused: its default action terminates the process (a batch shell
//! without a `trap`, a Python program without a handler), and that
//! termination, with streams running, is one xCUDA does not hold back — the
//! kill the MPS server cannot survive, sent by muxflow to a job that never
//! asked for it.

use std::time::Duration;

/// A job's `--signal=[{R|B}:]<sig>[@<sig_time>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Warning {
    pub signal: i32,
    /// `B:`: the batch shell only (`scancel --batch`); otherwise every
    /// step but the batch shell, as Slurm sends it.
    pub batch_only: bool,
    /// `@<sig_time>`: how long before its end the job wants it (Slurm's
    /// default: 60 s).
    pub lead: Duration,
}

/// Slurm's `sig_time` when `--signal` names none.
pub const DEFAULT_LEAD: Duration = Duration::from_secs(60);

/// Signals muxflow sends as a warning: ones an application can catch and a
/// trainer plausibly asks for. Never SIGKILL or SIGSTOP (no handler could
/// run), nor the fault signals.
const SENDABLE: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("URG", libc::SIGURG),
    ("WINCH", libc::SIGWINCH),
];

/// The signal's name without `SIG` (for logs and `scancel --signal`).
pub fn signal_name(sig: i32) -> Option<&'static str> {
    SENDABLE.iter().find(|(_, n)| *n == sig).map(|(s, _)| *s)
}

/// Parses `[{R|B}:]<sig>[@<sig_time>]`; None for what Slurm would refuse
/// or muxflow does not send.
pub fn parse_signal_option(spec: &str) -> Option<Warning> {
    let spec = spec.trim();
    let (flags, rest) = match spec.split_once(':') {
        Some((f, r)) if !f.is_empty() && f.chars().all(|c| c == 'B' || c == 'R') => (f, r),
        Some(_) => return None,
        None => ("", spec),
    };
    let (sig, time) = match rest.split_once('@') {
        Some((s, t)) => (s, Some(t)),
        None => (rest, None),
    };
    let signal = match sig.parse::<i32>() {
        Ok(n) => SENDABLE.iter().find(|(_, v)| *v == n)?.1,
        Err(_) => {
            let name = sig.to_ascii_uppercase();
            let name = name.strip_prefix("SIG").unwrap_or(&name);
            SENDABLE.iter().find(|(s, _)| *s == name)?.1
        }
    };
    let lead = match time {
        Some(t) => Duration::from_secs(t.parse::<u16>().ok()?.into()),
        None => DEFAULT_LEAD,
    };
    Some(Warning {
        signal,
        batch_only: flags.contains('B'),
        lead,
    })
}

/// The `--signal` of a batch script's `#SBATCH` lines, read as sbatch does:
/// up to the first command (a line that is neither blank nor a comment);
/// the last one counts.
pub fn warning_in_script(script: &str) -> Option<Warning> {
    let mut found = None;
    for line in script.lines().skip_while(|l| l.starts_with("#!")) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(opts) = line.strip_prefix("#SBATCH") else {
            if line.starts_with('#') {
                continue;
            }
            break;
        };
        let mut words = opts.split_whitespace();
        while let Some(w) = words.next() {
            if w.starts_with('#') {
                break; // a comment after the options
            }
            let value = match w.strip_prefix("--signal") {
                Some(v) if v.starts_with('=') => Some(v[1..].to_string()),
                Some("") => words.next().map(str::to_string),
                _ => None,
            };
            if let Some(v) = value {
                found = Some(parse_signal_option(&v));
            }
        }
    }
    found.flatten()
}

/// How long muxflow waits after the warning before the requeue: the lead
/// the job asked for, at most `cap` (what the online job's bounded wait
/// leaves for it).
pub fn grace(w: &Warning, cap: Duration) -> Duration {
    w.lead.min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_options_read_as_slurm_reads_them() {
        struct Case {
            name: &'static str,
            spec: &'static str,
            want: Option<(i32, bool, u64)>,
        }
        let cases = [
            Case {
                name: "batch shell, with a lead",
                spec: "B:USR1@90",
                want: Some((libc::SIGUSR1, true, 90)),
            },
            Case {
                name: "SIG prefix, steps, Slurm's default lead",
                spec: "SIGUSR2",
                want: Some((libc::SIGUSR2, false, 60)),
            },
            Case {
                name: "a number",
                spec: "10@30",
                want: Some((libc::SIGUSR1, false, 30)),
            },
            Case {
                name: "reservation flag only",
                spec: "R:TERM@5",
                want: Some((libc::SIGTERM, false, 5)),
            },
            Case {
                name: "SIGKILL is never a warning",
                spec: "B:KILL@60",
                want: None,
            },
            Case {
                name: "SIGSTOP neither",
                spec: "19",
                want: None,
            },
            Case {
                name: "an unknown flag",
                spec: "X:USR1",
                want: None,
            },
            Case {
                name: "a bad time",
                spec: "USR1@soon",
                want: None,
            },
        ];
        for c in cases {
            let got =
                parse_signal_option(c.spec).map(|w| (w.signal, w.batch_only, w.lead.as_secs()));
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn the_scripts_sbatch_lines_give_the_warning_until_the_first_command() {
        let cases = [
            (
                "recipe",
                "#!/bin/bash\n#SBATCH --job-name=t\n#SBATCH --signal=B:USR1@90\nsrun python train.py\n",
                Some(libc::SIGUSR1),
            ),
            (
                "separate value, comment after",
                "#!/bin/sh\n# setup\n\n#SBATCH --signal USR2@20 # warn me\nexec x\n",
                Some(libc::SIGUSR2),
            ),
            (
                "after the first command sbatch reads no more",
                "#!/bin/sh\necho hi\n#SBATCH --signal=B:USR1@90\n",
                None,
            ),
            ("none", "#!/bin/sh\nsleep 1\n", None),
            (
                "the last one counts",
                "#SBATCH --signal=USR1\n#SBATCH --signal=B:TERM@10\nx\n",
                Some(libc::SIGTERM),
            ),
            (
                "--signal-something else is not --signal",
                "#SBATCH --signalx=USR1\nx\n",
                None,
            ),
        ];
        for (name, script, want) in cases {
            assert_eq!(warning_in_script(script).map(|w| w.signal), want, "{name}");
        }
        let w = warning_in_script("#SBATCH --signal=B:USR1@90\nx").unwrap();
        assert_eq!(grace(&w, Duration::from_secs(25)), Duration::from_secs(25));
        let w = warning_in_script("#SBATCH --signal=B:USR1@5\nx").unwrap();
        assert_eq!(grace(&w, Duration::from_secs(25)), Duration::from_secs(5));
    }
}
