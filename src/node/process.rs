//! Running helper programs (scontrol, nvidia-cuda-mps-control) from root
//! contexts: absolute admin-configured paths, a scrubbed environment, and a
//! timeout so a hung program cannot hang a Prolog or a job step.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} {args}: timed out after {timeout:?}")]
    Timeout {
        program: PathBuf,
        args: String,
        timeout: Duration,
    },
}

/// What a finished program said.
#[derive(Debug, Clone)]
pub struct Finished {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A command for `program` with nothing of the caller's environment but
/// PATH (fixed) and, where set, SLURM_CONF (so Slurm clients reach the same
/// cluster as the daemon that started us).
pub fn command(program: &Path) -> Command {
    let mut c = Command::new(program);
    c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    if let Some(conf) = std::env::var_os("SLURM_CONF") {
        c.env("SLURM_CONF", conf);
    }
    c
}

/// Where a program's stdout and stderr go.
#[derive(Debug)]
pub enum Output {
    /// Read into [`Finished`].
    Collect,
    /// Into this file, not collected: a daemonizing program keeps them
    /// open, and the caller reads what it said from the file.
    Detached(std::fs::File),
}

/// Runs `cmd`, feeding `input` (plus a newline) on stdin, and waits for it,
/// killing it after `timeout`.
pub fn run(
    mut cmd: Command,
    input: Option<&str>,
    timeout: Duration,
    output: Output,
) -> Result<Finished, RunError> {
    let program = PathBuf::from(cmd.get_program());
    let args = cmd
        .get_args()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    cmd.stdin(Stdio::piped());
    let detached = match output {
        Output::Detached(file) => {
            let err = file.try_clone().map_err(|source| RunError::Spawn {
                program: program.clone(),
                source,
            })?;
            cmd.stdout(file).stderr(err);
            true
        }
        Output::Collect => {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            false
        }
    };
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    if let Some(mut stdin) = child.stdin.take() {
        if let Some(input) = input {
            // A program that exits early closes the pipe; its output says why.
            let _ = writeln!(stdin, "{input}");
        }
    }
    let readers = (!detached).then(|| {
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            let (mut o, mut e) = (String::new(), String::new());
            let _ = out.read_to_string(&mut o);
            let _ = err.read_to_string(&mut e);
            (o, e)
        })
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Timeout {
                    program,
                    args,
                    timeout,
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(source) => return Err(RunError::Spawn { program, source }),
        }
    };
    let (stdout, stderr) = readers
        .map(|r| r.join().unwrap_or_default())
        .unwrap_or_default();
    Ok(Finished {
        success: status.success(),
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_input_and_scrubbed_environment() {
        let mut c = command(Path::new("/bin/sh"));
        c.arg("-c")
            .arg("read x; echo \"got $x HOME=$HOME\"; echo err >&2");
        let f = run(c, Some("hello"), Duration::from_secs(10), Output::Collect).unwrap();
        assert!(f.success);
        assert_eq!(f.stdout.trim(), "got hello HOME=");
        assert_eq!(f.stderr.trim(), "err");
    }

    #[test]
    fn times_out_and_reports_failure() {
        let mut c = command(Path::new("/bin/sleep"));
        c.arg("30");
        let e = run(c, None, Duration::from_millis(100), Output::Collect).unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
        let f = run(
            command(Path::new("/bin/false")),
            None,
            Duration::from_secs(10),
            Output::Collect,
        )
        .unwrap();
        assert!(!f.success);
        assert!(matches!(
            run(
                command(Path::new("/nonexistent/x")),
                None,
                Duration::from_secs(1),
                Output::Collect
            ),
            Err(RunError::Spawn { .. })
        ));
    }
}
