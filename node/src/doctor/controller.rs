//! `muxflow-doctor --controller`: the controller host's side — slurm.conf's
//! job_submit and GRES settings, job_submit.lua beside slurm.conf, the
//! matcher running and rounding, and the cluster-shape file job_submit.lua
//! reads. Without a running, rounding matcher every offline job stays held.
//!
//! As on the node side, each check is a function of what it reads; [`run`]
//! gathers the inputs from the host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    check_gres_types, check_job_submit_plugins, conf_values, slurm_conf_text, Check, Inputs,
};

/// The series the matcher writes after each successful round
/// (`matcher/src/metrics.rs`).
pub const LAST_SUCCESS_SERIES: &str = "muxflow_matcher_last_success_timestamp_seconds";

/// The process name the matcher runs under (`/proc/PID/comm`: at most 15
/// bytes, which this name is exactly).
pub const MATCHER_COMM: &str = "muxflow-matcher";

/// How old the shape file may be before job_submit.lua ignores it
/// (`SHAPE_MAX_AGE_S` in etc/job_submit.lua).
pub const LUA_SHAPE_MAX_AGE_S: u64 = 900;

/// The path job_submit.lua reads when slurmctld's environment sets no
/// `MUXFLOW_SHAPE_FILE` (its `or "..."` default), if the text has one.
pub fn lua_default_shape_file(lua: &str) -> Option<PathBuf> {
    let line = lua
        .lines()
        .find(|l| l.contains("os.getenv(\"MUXFLOW_SHAPE_FILE\")"))?;
    let after = line.split_once(") or \"")?.1;
    Some(PathBuf::from(after.split('"').next()?))
}

/// job_submit.lua beside slurm.conf, muxflow's (slurmctld loads the one
/// file of that name in its config directory).
pub fn check_job_submit_lua(path: &Path, text: Option<&str>) -> Check {
    const NAME: &str = "job_submit.lua";
    let fix = format!(
        "cp /usr/share/muxflow/job_submit.lua {} and run scontrol reconfigure",
        path.display()
    );
    match text {
        None => Check::fail(
            NAME,
            format!(
                "{} does not exist: offline jobs are never parked for the matcher",
                path.display()
            ),
            fix,
        ),
        Some(t) if !t.contains("MUXFLOW_SHAPE_FILE") => Check::fail(
            NAME,
            format!(
                "{} is not muxflow's (it never reads the matcher's shape file)",
                path.display()
            ),
            format!("merge /usr/share/muxflow/job_submit.lua into it, or {fix}"),
        ),
        Some(_) => Check::ok(NAME, path.display().to_string()),
    }
}

/// A muxflow-matcher process on this host (`pids`: those found).
pub fn check_matcher_process(pids: &[u32]) -> Check {
    const NAME: &str = "matcher";
    if pids.is_empty() {
        return Check::fail(
            NAME,
            "no muxflow-matcher process on this host: offline jobs stay held (JobHeldUser) until one runs",
            "systemctl enable --now muxflow-matcher (journalctl -u muxflow-matcher says why it stopped)",
        );
    }
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    Check::ok(NAME, format!("running (pid {})", list.join(", ")))
}

/// The value of an unlabelled `series` in a Prometheus text exposition.
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// When the matcher last finished a round, by `source` (its metrics, or
/// the shape file every round rewrites).
#[derive(Debug, Clone, PartialEq)]
pub struct LastRound {
    pub at_s: f64,
    pub source: String,
}

/// The matcher rounded within three intervals (and a minute for a slow
/// round): an older last round means it is stuck or failing.
pub fn check_matcher_rounds(last: Option<&LastRound>, now_s: u64, interval_s: u64) -> Check {
    const NAME: &str = "matcher rounds";
    let limit = interval_s.saturating_mul(3).saturating_add(60);
    let Some(last) = last else {
        return Check::fail(
            NAME,
            "no sign of a finished round: neither the matcher's metrics nor the shape file say when it last rounded",
            "start the matcher (systemctl enable --now muxflow-matcher) and read its log (journalctl -u muxflow-matcher); set [metrics] listen or textfile_dir to let the doctor see its rounds",
        );
    };
    let age = (now_s as f64 - last.at_s).max(0.0).round() as u64;
    if age > limit {
        return Check::fail(
            NAME,
            format!(
                "the last successful round was {age} s ago (by {}), with rounds every {interval_s} s: the matcher is stuck or every round fails",
                last.source
            ),
            "read journalctl -u muxflow-matcher (\"round failed: …\" says why; Slurm unreachable is the usual cause), then systemctl restart muxflow-matcher",
        );
    }
    Check::ok(
        NAME,
        format!(
            "last successful round {age} s ago (by {}), every {interval_s} s",
            last.source
        ),
    )
}

/// `written_at` and the number of node lines of a shape file.
pub fn parse_shape_file(text: &str) -> (Option<u64>, usize) {
    let written = text
        .lines()
        .find_map(|l| l.strip_prefix("written_at=")?.trim().parse().ok());
    let nodes = text.lines().filter(|l| l.starts_with("node ")).count();
    (written, nodes)
}

/// The shape file: where job_submit.lua reads it (`lua_reads`), fresh
/// enough for the Lua to use, and naming at least one GPU node. A missing
/// or stale file refuses nothing at submit: an offline job asking more
/// than any node has then waits forever instead of being refused.
pub fn check_shape_file(
    path: &Path,
    text: Result<&str, String>,
    lua_reads: Option<&Path>,
    now_s: u64,
) -> Check {
    const NAME: &str = "shape file";
    if let Some(lua) = lua_reads.filter(|l| *l != path) {
        return Check::fail(
            NAME,
            format!(
                "the matcher writes {} ([matcher] shape_file) but job_submit.lua reads {}",
                path.display(),
                lua.display()
            ),
            format!(
                "set shape_file = \"{}\" under [matcher] in muxflow.toml, or MUXFLOW_SHAPE_FILE={} in slurmctld's environment",
                lua.display(),
                path.display()
            ),
        );
    }
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("{}: {e}: submissions are not checked against the nodes' shapes", path.display()),
                "start the matcher (it writes the file every round) and check that its directory exists and is writable by it",
            )
        }
    };
    let (written, nodes) = parse_shape_file(text);
    let Some(written) = written else {
        return Check::fail(
            NAME,
            format!("{} has no written_at= line", path.display()),
            "remove it: the matcher writes it afresh at its next round",
        );
    };
    let age = now_s.saturating_sub(written);
    if age > LUA_SHAPE_MAX_AGE_S {
        return Check::fail(
            NAME,
            format!(
                "{} was written {age} s ago: job_submit.lua ignores it after {LUA_SHAPE_MAX_AGE_S} s",
                path.display()
            ),
            "the matcher has not rounded since: see the `matcher rounds` check and journalctl -u muxflow-matcher",
        );
    }
    if nodes == 0 {
        return Check::fail(
            NAME,
            format!(
                "{} lists no GPU node: Slurm's node config has no node with Gres=gpu",
                path.display()
            ),
            "give the GPU nodes Gres=gpu:N,... in slurm.conf",
        );
    }
    Check::ok(
        NAME,
        format!(
            "{}: {nodes} node shape(s), written {age} s ago",
            path.display()
        ),
    )
}

/// The `--interval S` (or `--interval=S`) of a matcher's command line
/// (`/proc/PID/cmdline`: NUL-separated).
pub fn interval_arg(cmdline: &[u8]) -> Option<u64> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.iter().enumerate().find_map(|(i, a)| {
        let value = match a.strip_prefix("--interval") {
            Some("") => args.get(i + 1)?.as_str(),
            Some(rest) => rest.strip_prefix('=')?,
            None => return None,
        };
        value.parse().ok()
    })
}

/// PIDs of this host's processes named `comm`.
fn processes_named(comm: &str) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|c| c.trim_end() == comm)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// `MUXFLOW_SHAPE_FILE` in the environment of the running slurmctld of
/// `slurm_conf` (root reads it): on a host with several clusters, the one
/// whose `-f`, else `SLURM_CONF`, else Slurm's default is that file.
fn slurmctld_shape_env(slurm_conf: &Path) -> Option<PathBuf> {
    processes_named("slurmctld").into_iter().find_map(|pid| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let var = |name: &[u8]| {
            env.split(|b| *b == 0).find_map(|kv| {
                let v = kv.strip_prefix(name)?.strip_prefix(b"=")?;
                Some(PathBuf::from(String::from_utf8_lossy(v).into_owned()))
            })
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let conf = args
            .windows(2)
            .find(|w| w[0] == b"-f")
            .map(|w| PathBuf::from(String::from_utf8_lossy(w[1]).into_owned()))
            .or_else(|| var(b"SLURM_CONF"))
            .unwrap_or_else(|| PathBuf::from(muxflow::config::slurm_conf::DEFAULT_SLURM_CONF));
        if !super::same_file(&conf, slurm_conf) {
            return None;
        }
        var(b"MUXFLOW_SHAPE_FILE")
    })
}

/// The matcher's exposition: its textfile, else its endpoint.
fn matcher_metrics(config: &muxflow::Config) -> Option<(String, String)> {
    if let Some(dir) = &config.metrics.textfile_dir {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let dir = dir
            .as_path()
            .to_string_lossy()
            .replace("{node}", host.trim());
        let file = Path::new(&dir).join("muxflow-matcher.prom");
        if let Ok(t) = std::fs::read_to_string(&file) {
            return Some((t, file.display().to_string()));
        }
    }
    let mut addr = config.metrics.listen_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let text = http_get_metrics(addr).ok()?;
    Some((text, format!("http://{addr}/metrics")))
}

fn http_get_metrics(addr: std::net::SocketAddr) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(3);
    let mut conn = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut got = String::new();
    conn.take(4 << 20).read_to_string(&mut got)?;
    Ok(got
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

/// Every controller check, at Unix time `now_s`.
pub fn run(inputs: &Inputs, now_s: u64) -> Vec<Check> {
    let config = inputs.config;
    let conf = conf_values(&slurm_conf_text(inputs.slurm_conf));
    let mut checks = vec![
        check_job_submit_plugins(&conf),
        check_gres_types(&conf, &config.slurm.offline_gres),
    ];
    let lua_path = inputs
        .slurm_conf
        .parent()
        .unwrap_or(Path::new("/"))
        .join("job_submit.lua");
    let lua = std::fs::read_to_string(&lua_path).ok();
    checks.push(check_job_submit_lua(&lua_path, lua.as_deref()));
    let matchers = processes_named(MATCHER_COMM);
    checks.push(check_matcher_process(&matchers));
    // A matcher started with --interval rounds at that pace, not the config's.
    let interval_s = matchers
        .iter()
        .find_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            interval_arg(&cmdline)
        })
        .unwrap_or(config.matcher.interval_s);

    let shape_path = config.matcher.shape_file.as_path();
    let shape = std::fs::read_to_string(shape_path).map_err(|e| e.to_string());
    let from_metrics = matcher_metrics(config).and_then(|(text, source)| {
        Some(LastRound {
            at_s: metric_value(&text, LAST_SUCCESS_SERIES)?,
            source,
        })
    });
    let last = from_metrics.or_else(|| {
        let (written, _) = parse_shape_file(shape.as_deref().ok()?);
        Some(LastRound {
            at_s: written? as f64,
            source: format!("{}'s written_at", shape_path.display()),
        })
    });
    checks.push(check_matcher_rounds(last.as_ref(), now_s, interval_s));
    let lua_reads = slurmctld_shape_env(inputs.slurm_conf)
        .or_else(|| lua.as_deref().and_then(lua_default_shape_file));
    checks.push(check_shape_file(
        shape_path,
        shape.as_deref().map_err(Clone::clone),
        lua_reads.as_deref(),
        now_s,
    ));
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_lua_names_its_default_shape_file() {
        let lua = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/job_submit.lua"),
        )
        .unwrap();
        assert_eq!(
            lua_default_shape_file(&lua),
            Some(PathBuf::from(
                muxflow::Config::default().matcher.shape_file.as_path()
            ))
        );
        assert!(
            check_job_submit_lua(Path::new("/etc/slurm/job_submit.lua"), Some(&lua))
                .fix
                .is_none()
        );
    }

    #[test]
    fn job_submit_lua_missing_or_foreign_fails_with_the_copy() {
        let p = Path::new("/etc/slurm/job_submit.lua");
        // (case, text, line contains)
        let rows = [
            ("missing", None, "does not exist"),
            (
                "a site's own",
                Some("function slurm_job_submit() end"),
                "is not muxflow's",
            ),
        ];
        for (case, text, want) in rows {
            let c = check_job_submit_lua(p, text);
            assert!(c.fix.is_some(), "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
            assert!(
                c.line()
                    .contains("cp /usr/share/muxflow/job_submit.lua /etc/slurm/job_submit.lua"),
                "{case}: {}",
                c.line()
            );
        }
    }

    #[test]
    fn no_matcher_process_fails_with_the_unit() {
        let c = check_matcher_process(&[]);
        assert!(
            c.line()
                .starts_with("FAIL matcher: no muxflow-matcher process"),
            "{}",
            c.line()
        );
        assert!(c.line().contains("systemctl enable --now muxflow-matcher"));
        assert!(check_matcher_process(&[42]).fix.is_none());
    }

    #[test]
    fn the_matcher_must_have_rounded_within_three_intervals() {
        let now = 10_000;
        let at = |ago: u64| LastRound {
            at_s: (now - ago) as f64,
            source: "metrics".into(),
        };
        // (case, last round, interval, passes, line contains)
        let rows = [
            ("just now", Some(at(5)), 60, true, "5 s ago"),
            ("at the limit", Some(at(240)), 60, true, "240 s ago"),
            ("stuck", Some(at(241)), 60, false, "241 s ago (by metrics)"),
            ("a long interval", Some(at(900)), 600, true, "900 s ago"),
            ("never", None, 60, false, "no sign of a finished round"),
        ];
        for (case, last, interval, passes, want) in rows {
            let c = check_matcher_rounds(last.as_ref(), now, interval);
            assert_eq!(c.fix.is_none(), passes, "{case}: {}", c.line());
            assert!(c.line().contains(want), "{case}: {}", c.line());
        }
    }

    #[test]
    fn a_matchers_own_interval_is_read_from_its_command_line() {
        // (command line, interval)
        let rows: [(&[u8], Option<u64>); 4] = [
            (
                b"muxflow-matcher\0--config\0/x.toml\0--interval\x0010\0",
                Some(10),
            ),
            (b"muxflow-matcher\0--interval=30\0", Some(30)),
            (b"muxflow-matcher\0--once\0", None),
            (b"muxflow-matcher\0--interval\0", None),
        ];
        for (cmdline, want) in rows {
            assert_eq!(
                interval_arg(cmdline),
                want,
                "{}",
                String::from_utf8_lossy(cmdline)
            );
        }
    }

    #[test]
    fn the_last_success_is_read_from_the_exposition() {
        let text = format!(
            "# HELP x\n{LAST_SUCCESS_SERIES}_other 3\n{LAST_SUCCESS_SERIES} 1795000000\nmuxflow_matcher_rounds_total 4\n"
        );
        assert_eq!(
            metric_value(&text, LAST_SUCCESS_SERIES),
            Some(1_795_000_000.0)
        );
        assert_eq!(
            metric_value("muxflow_matcher_rounds_total 4\n", LAST_SUCCESS_SERIES),
            None
        );
    }

    #[test]
    fn the_shape_file_must_be_where_the_lua_reads_fresh_and_not_empty() {
        let p = Path::new("/var/lib/muxflow-matcher/cluster-shape");
        let now = 1_795_000_000;
        let good = format!(
            "# x\nwritten_at={}\nnode gpus=2 cpus=4 mem_mib=4000\n",
            now - 30
        );
        let stale = format!(
            "written_at={}\nnode gpus=2 cpus=4 mem_mib=4000\n",
            now - 901
        );
        let empty = format!("written_at={}\n", now - 30);
        let other = Path::new("/srv/shape");
        struct Row<'a> {
            case: &'a str,
            text: Result<&'a str, String>,
            lua_reads: Option<&'a Path>,
            passes: bool,
            says: &'a str,
        }
        let row = |case, text, lua_reads, passes, says| Row {
            case,
            text,
            lua_reads,
            passes,
            says,
        };
        let rows = [
            row(
                "fresh",
                Ok(&good),
                Some(p),
                true,
                "1 node shape(s), written 30 s ago",
            ),
            row(
                "the Lua's path unknown",
                Ok(&good),
                None,
                true,
                "written 30 s ago",
            ),
            row(
                "missing",
                Err("No such file or directory".into()),
                Some(p),
                false,
                "start the matcher",
            ),
            row(
                "stale",
                Ok(&stale),
                Some(p),
                false,
                "ignores it after 900 s",
            ),
            row(
                "no GPU node",
                Ok(&empty),
                Some(p),
                false,
                "lists no GPU node",
            ),
            row(
                "no time",
                Ok("node gpus=2 cpus=4 mem_mib=4000\n"),
                Some(p),
                false,
                "no written_at= line",
            ),
            row(
                "another path than the Lua's",
                Ok(&good),
                Some(other),
                false,
                "job_submit.lua reads /srv/shape",
            ),
        ];
        for r in rows {
            let c = check_shape_file(p, r.text, r.lua_reads, now);
            assert_eq!(c.fix.is_none(), r.passes, "{}: {}", r.case, c.line());
            assert!(c.line().contains(r.says), "{}: {}", r.case, c.line());
        }
    }
}
