//! `muxflow-report JOBID|--mine|--gpu NODE:INDEX [--json]`: what sharing
//! did to one of your jobs, from sacct, or why it waits; what runs now,
//! from squeue (see the [`muxflow_report`] library). Any user, for their
//! own jobs; Slurm administrators (root, AdminLevel Operator or
//! Administrator) for every job and for a GPU's view.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use muxflow_matcher::reader::Names;
use muxflow_matcher::slurm::SlurmCli;
use muxflow_report::{live, report, Refusal, Viewer};

#[derive(Parser)]
#[command(
    name = "muxflow-report",
    version,
    about = "What sharing did to one of your jobs, why a job waits, your muxflow jobs now (--mine), or who shares a GPU (--gpu, administrators)",
    long_about = "What sharing did to one of your jobs: partners (by job ID), SM share and \
memory cap, time throttled, OOM refusals, speed shared vs alone and predicted. For a pending \
offline job: why it waits, since when and what for; for a running job: the jobs sharing its \
GPUs now. --mine lists your muxflow jobs now; --gpu NODE:INDEX shows an administrator who \
shares a GPU, who is placed on it, who waits for a GPU and why. Any user, for their own \
jobs; root and Slurm administrators (AdminLevel Operator or Administrator) for every job. \
Partners appear by job ID only. A finished job's figures come from sacct (its AdminComment, \
the owner's runs of the same job name in the last --days, the jobs beside it); what runs \
now, from squeue. The figures are written when the job's batch step ends."
)]
// One of the three (not `required`: `--print-man-page` takes none; run() says so).
#[command(group(clap::ArgGroup::new("what").args(["job", "mine", "gpu"])))]
struct Cli {
    /// The job's ID (an array task: ARRAYID_TASK, e.g. 16_1).
    #[arg(value_parser = parse_job, value_name = "JOBID")]
    job: Option<JobSpec>,
    /// Your muxflow jobs now: where each runs and beside whom, or why it waits.
    #[arg(long)]
    mine: bool,
    /// One GPU, NODE:INDEX (e.g. node3:0), for administrators: who shares
    /// it, who is placed on it, who waits for a GPU and why.
    #[arg(long, value_name = "NODE:INDEX", value_parser = live::parse_gpu)]
    gpu: Option<live::Gpu>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Days of your earlier runs the speed estimate and the prediction use.
    #[arg(long, default_value_t = 30)]
    days: u32,
    /// Seconds each Slurm command may take.
    #[arg(long, default_value_t = 30)]
    timeout_s: u64,
    /// muxflow.toml (for the Slurm client's paths); default: beside
    /// $SLURM_CONF, then /etc/slurm, else built-in defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
}

/// A job as a user names it: `1234`, or an array task `1234_5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct JobSpec {
    id: u32,
    task: Option<u32>,
}

impl std::fmt::Display for JobSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.task {
            Some(t) => write!(f, "{}_{t}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

fn parse_job(s: &str) -> Result<JobSpec, String> {
    let bad = || {
        format!("'{s}' is not a job ID: give a number (1234), or ARRAYID_TASK for an array task (1234_5)")
    };
    let (id, task) = match s.split_once('_') {
        Some((id, task)) => (id, Some(task.parse().map_err(|_| bad())?)),
        None => (s, None),
    };
    Ok(JobSpec {
        id: id.parse().map_err(|_| bad())?,
        task,
    })
}

/// The man page's sections beyond `--help`.
const PAGE: muxflow::man::Page = muxflow::man::Page {
    section: "1",
    files: &[(
        "/etc/slurm/muxflow.toml",
        "muxflow's configuration, read for the Slurm client's paths (muxflow.toml(5))",
    )],
    environment: &[(
        "SLURM_CONF",
        "the cluster's slurm.conf; muxflow.toml is looked for beside it first",
    )],
    signals: &[],
    examples: &[
        (
            "muxflow-report 1234",
            "what sharing did to job 1234; if it is pending, why it waits and since when",
        ),
        ("muxflow-report 1234_5", "task 5 of array job 1234"),
        ("muxflow-report --mine", "your muxflow jobs now"),
        (
            "muxflow-report --gpu node3:0",
            "who shares GPU 0 of node3, who is placed on it, who waits (administrators)",
        ),
        ("muxflow-report 1234 --json", "the same as JSON"),
        (
            "muxflow-report 1234 --days 90",
            "with 90 days of earlier runs for the speed estimate",
        ),
    ],
    see_also: &["muxflow(7)", "spank-muxflow(8)", "sacct(1)", "sbatch(1)"],
};

fn main() -> ExitCode {
    let cli: Cli = muxflow::man::parse_or_print(&PAGE);
    match run(&cli) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("muxflow-report: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<String> {
    let mut config = match muxflow::Config::find(
        cli.config.as_deref(),
        muxflow::config::slurm_conf::discover().as_deref(),
    ) {
        Ok((_, c)) => c,
        // A login node without muxflow.toml: Slurm's commands from PATH.
        Err(_) if cli.config.is_none() => muxflow::Config::default(),
        Err(e) => return Err(e.into()),
    };
    config.matcher.command_timeout_s = cli.timeout_s;
    let slurm = SlurmCli::new(&config);
    // SAFETY: getuid(2) cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let user = user_name(uid).with_context(|| format!("cannot find the name of uid {uid}"))?;
    let admin = uid == 0 || slurm.is_slurm_admin(&user).unwrap_or(false);
    let viewer = Viewer { user, admin };
    let names = Names::from_config(&config.slurm);
    if cli.mine {
        let jobs = slurm.squeue().context("reading your jobs from squeue")?;
        let rows = live::Live::new(&jobs, &names).mine(&viewer);
        return Ok(match cli.json {
            true => serde_json::to_string_pretty(&rows)? + "\n",
            false => live::mine_text(&rows),
        });
    }
    if let Some(gpu) = &cli.gpu {
        if !viewer.admin {
            anyhow::bail!(
                "--gpu shows every user's jobs on a GPU: for root and Slurm administrators (AdminLevel Operator or Administrator) only; your own jobs: muxflow-report --mine"
            );
        }
        let jobs = slurm.squeue().context("reading the jobs from squeue")?;
        let nodes = slurm.nodes().context("reading the nodes")?;
        let r = live::Live::new(&jobs, &names).gpu(
            gpu,
            &nodes,
            u32::from(config.policy.offline_per_gpu),
        );
        return Ok(match cli.json {
            true => serde_json::to_string_pretty(&r)? + "\n",
            false => r.to_string(),
        });
    }
    let Some(spec) = cli.job else {
        anyhow::bail!("give a job ID (e.g. muxflow-report 1234), --mine, or --gpu NODE:INDEX");
    };
    // A pending job: Slurm's record now (sacct lags behind it by seconds).
    let jobs = slurm.squeue().context("reading the job from squeue")?;
    if let Some(job) = live::pending_record(&jobs, spec.id, spec.task) {
        let answer = report(job.job_id, &[job], &viewer)?;
        return Ok(match cli.json {
            true => serde_json::to_string_pretty(&answer)? + "\n",
            false => answer.to_string(),
        });
    }
    let mut listing = slurm
        .sacct(&["-j".into(), spec.to_string()])
        .context("reading the job from sacct")?;
    // An array task is a job of its own once Slurm split it out; until
    // then the array's pending record stands for it.
    let job_id = match spec.task {
        None => spec.id,
        Some(task) => listing
            .iter()
            .find(|j| j.array.job_id == spec.id && j.array.task_id == Some(task))
            .or_else(|| {
                listing
                    .iter()
                    .find(|j| j.array.job_id == spec.id && j.array.task_id.is_none())
            })
            .map(|j| j.job_id)
            .with_context(|| {
                format!(
                    "array task {spec}: no such task in the accounting database (check it with `sacct -j {spec}`)"
                )
            })?,
    };
    live::keep_the_job(&mut listing, &jobs, job_id);
    if let Some(job) = listing.first_mut() {
        if job.user.is_empty() {
            job.user = slurm
                .job_user(job_id)
                .context("reading the job's owner from sacct")?
                .unwrap_or_default();
        }
    }
    if let Some(job) = listing.first().cloned() {
        let since = format!("now-{}days", cli.days);
        // The owner's runs of the same name (the speed estimate), and the
        // jobs that ran beside it (partners, by ID).
        // By uid where the name resolves: Slurm 26.05's sacct refuses some
        // names ("Invalid user id: nobody") whose uid it takes.
        let owner = user_id(&job.user).map_or_else(|| job.user.clone(), |u| u.to_string());
        let mut more = slurm
            .sacct(&[
                "-u".into(),
                owner,
                "--name".into(),
                job.name.clone(),
                "-S".into(),
                since.clone(),
            ])
            .context("reading the job's earlier runs from sacct")?;
        // Asked by user: theirs, whatever the JSON's user field says.
        for j in &mut more {
            j.user.clone_from(&job.user);
        }
        let partners: Vec<String> = more
            .iter()
            .chain(&listing)
            .filter_map(|j| {
                muxflow::records::report::JobReport::decode(j.comment.administrator.as_deref()?)
                    .ok()?
                    .partner
            })
            .map(|p| p.to_string())
            .collect();
        if !partners.is_empty() {
            more.extend(
                slurm
                    .sacct(&["-a".into(), "-j".into(), partners.join(",")])
                    .context("reading the partner jobs from sacct")?,
            );
        }
        // An online job's offline partners name it: everything that ran
        // while it did.
        more.extend(
            slurm
                .sacct(&["-a".into(), "-S".into(), since])
                .context("reading the jobs that shared its GPU from sacct")?
                .into_iter()
                .filter(|j| {
                    j.comment
                        .administrator
                        .as_deref()
                        .and_then(|c| muxflow::records::report::JobReport::decode(c).ok())
                        .is_some_and(|r| r.partner == Some(job_id))
                }),
        );
        // The job's own record first: it wins over its copies in `more`.
        more.retain(|j| j.job_id != job_id);
        listing.extend(more);
        live::latest_per_id(&mut listing);
    }
    let answer = match report(job_id, &listing, &viewer) {
        // A running job: who shares its GPUs now, from squeue (the
        // figures come when its batch step ends).
        Err(e @ Refusal::NoFigures { .. }) => {
            match live::Live::new(&jobs, &names).running_job(job_id) {
                Some(r) => {
                    return Ok(match cli.json {
                        true => serde_json::to_string_pretty(&r)? + "\n",
                        false => r.to_string(),
                    })
                }
                None => return Err(e.into()),
            }
        }
        a => a?,
    };
    Ok(if cli.json {
        serde_json::to_string_pretty(&answer)? + "\n"
    } else {
        answer.to_string()
    })
}

/// The uid of user `name`, if this host knows the name.
fn user_id(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: an all-zero passwd is a valid value to be overwritten.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r reads the NUL-terminated `name`, writes into `pw`
    // and `buf` (its length given) and sets `out` to `&pw` on success; all
    // outlive the call.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    (rc == 0 && !out.is_null()).then_some(pw.pw_uid)
}

/// The user name of `uid` from the password database.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: an all-zero passwd is a valid value to be overwritten.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into `pw` and `buf` (its length given) and
    // sets `out` to `&pw` on success; both outlive the call.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return None;
    }
    // SAFETY: on success pw_name points into `buf`, NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_a_number_or_an_array_task() {
        let ok = [
            ("1234", 1234, None),
            ("16_1", 16, Some(1)),
            ("16_0", 16, Some(0)),
        ];
        for (arg, id, task) in ok {
            assert_eq!(parse_job(arg), Ok(JobSpec { id, task }), "{arg}");
            assert_eq!(parse_job(arg).unwrap().to_string(), arg);
        }
        for bad in ["", "x", "16_", "_1", "16_x", "16_1_2", "-3", "16.1"] {
            let e = parse_job(bad).unwrap_err();
            assert!(
                e.contains(&format!("'{bad}'")) && e.contains("1234_5"),
                "{e}"
            );
        }
    }
}
