//! Which slurm.conf a muxflow program works with: the one discovery every
//! Slurm call and the config search share.
//!
//! slurmd gives its HealthCheckProgram neither PATH nor SLURM_CONF (checked
//! on 22.05), so a node program without SLURM_CONF takes the slurm.conf of
//! the slurmd that started it (its `-f` argument or its own SLURM_CONF).
//! Those are root's and slurmd's settings, not the job user's.

use std::path::{Path, PathBuf};

/// Slurm's own default when nothing names another.
pub const DEFAULT_SLURM_CONF: &str = "/etc/slurm/slurm.conf";

/// SLURM_CONF from the environment, else the parent slurmd's slurm.conf,
/// else None (Slurm's default, [`DEFAULT_SLURM_CONF`]).
pub fn discover() -> Option<PathBuf> {
    if let Some(c) = std::env::var_os("SLURM_CONF").filter(|c| !c.is_empty()) {
        return Some(c.into());
    }
    // SAFETY: getppid cannot fail and touches no memory.
    let ppid = unsafe { libc::getppid() };
    parent_conf(ppid)
}

/// The slurm.conf of process `pid`: its `-f FILE` argument, else its
/// SLURM_CONF.
fn parent_conf(pid: i32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    from_proc(
        &cmdline,
        &std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default(),
    )
}

fn from_proc(cmdline: &[u8], environ: &[u8]) -> Option<PathBuf> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    for w in args.windows(2) {
        if w[0] == b"-f" {
            return Some(PathBuf::from(String::from_utf8_lossy(w[1]).into_owned()));
        }
    }
    environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"SLURM_CONF="))
        .filter(|v| !v.is_empty())
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
}

/// The directory of `slurm_conf` (or of Slurm's default).
pub fn conf_dir(slurm_conf: Option<&Path>) -> PathBuf {
    slurm_conf
        .unwrap_or(Path::new(DEFAULT_SLURM_CONF))
        .parent()
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Row {
        name: &'static str,
        cmdline: &'static [u8],
        environ: &'static [u8],
        want: Option<&'static str>,
    }

    #[test]
    fn a_parents_dash_f_wins_over_its_environment() {
        let rows = [
            Row {
                name: "slurmd -f FILE",
                cmdline: b"slurmd\0-f\0/srv/slurm.conf\0-N\0n1\0",
                environ: b"SLURM_CONF=/x/slurm.conf\0",
                want: Some("/srv/slurm.conf"),
            },
            Row {
                name: "SLURM_CONF of the parent",
                cmdline: b"slurmd\0",
                environ: b"PATH=/bin\0SLURM_CONF=/x/slurm.conf\0",
                want: Some("/x/slurm.conf"),
            },
            Row {
                name: "neither",
                cmdline: b"slurmd\0",
                environ: b"PATH=/bin\0",
                want: None,
            },
            Row {
                name: "empty SLURM_CONF",
                cmdline: b"slurmd\0",
                environ: b"SLURM_CONF=\0",
                want: None,
            },
        ];
        for r in rows {
            assert_eq!(
                from_proc(r.cmdline, r.environ),
                r.want.map(PathBuf::from),
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn conf_dir_defaults_to_etc_slurm() {
        assert_eq!(conf_dir(None), Path::new("/etc/slurm"));
        assert_eq!(
            conf_dir(Some(Path::new("/srv/c/slurm.conf"))),
            Path::new("/srv/c")
        );
    }
}
