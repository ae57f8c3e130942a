//! Man pages like Slurm's: NAME, SYNOPSIS with each option's argument,
//! DESCRIPTION, OPTIONS, then FILES, ENVIRONMENT, SIGNALS (where the
//! program takes any), EXAMPLES and SEE ALSO — and nothing in SEE ALSO that
//! the packages do not install.
//!
//! A program's page comes from the same clap `Command` as its `--help`, so
//! the two cannot drift, plus a [`Page`] for the sections clap knows
//! nothing of: each program with a page takes a hidden `--print-man-page`
//! ([`FLAG`]); `scripts/package` and the rpm spec write the pages from it.
//! muxflow.toml(5) is generated from the shipped `etc/muxflow.toml`
//! ([`config_page`]); the plugin's page is written by hand. [`check_page`]
//! is the one check every page's test runs: it renders the page (groff
//! where installed) and checks its references against [`installed_pages`],
//! read from the packaging files.

use std::collections::BTreeSet;
use std::path::Path;

/// The hidden flag every program with a man page takes.
pub const FLAG: &str = "print-man-page";

/// What a program's page says beyond its clap `Command`.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    /// "1" user commands, "5" files, "7" overviews, "8" administration.
    pub section: &'static str,
    /// (path, what it is to the program).
    pub files: &'static [(&'static str, &'static str)],
    /// (variable, what it does).
    pub environment: &'static [(&'static str, &'static str)],
    /// (signal, what the program does on it); empty: no SIGNALS section.
    pub signals: &'static [(&'static str, &'static str)],
    /// (command line, what it does).
    pub examples: &'static [(&'static str, &'static str)],
    /// `name(section)` of related pages.
    pub see_also: &'static [&'static str],
}

impl Page {
    /// A page with no sections beyond clap's (a program that is not
    /// installed, such as a benchmark).
    pub const fn bare(section: &'static str) -> Page {
        Page {
            section,
            files: &[],
            environment: &[],
            signals: &[],
            examples: &[],
            see_also: &[],
        }
    }
}

/// Pages muxflow's own pages may name that other packages install: the
/// Slurm packages the muxflow packages depend on, systemd, the NVIDIA
/// driver, Prometheus.
pub const EXTERNAL_PAGES: &[&str] = &[
    "sbatch(1)",
    "srun(1)",
    "salloc(1)",
    "squeue(1)",
    "scontrol(1)",
    "sacct(1)",
    "sinfo(1)",
    "scancel(1)",
    "slurm.conf(5)",
    "gres.conf(5)",
    "cgroup.conf(5)",
    "slurmd(8)",
    "slurmctld(8)",
    "spank(7)",
    "systemctl(1)",
    "journalctl(1)",
    "nvidia-smi(1)",
    "nvidia-cuda-mps-control(1)",
];

/// Escapes text for roff: backslashes and hyphens (so `--json` is not
/// typeset with en dashes), and a `.` or `'` that would start a line.
pub fn escape(text: &str) -> String {
    let body = text.replace('\\', "\\e").replace('-', "\\-");
    body.lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sections of `page` after OPTIONS: FILES, ENVIRONMENT, SIGNALS,
/// EXAMPLES, SEE ALSO.
fn tail_sections(page: &Page) -> String {
    let mut out = String::new();
    let mut list = |title: &str, items: &[(&str, &str)], bold: bool| {
        if items.is_empty() {
            return;
        }
        out.push_str(&format!(".SH {title}\n"));
        for (term, what) in items {
            let font = if bold { "B" } else { "I" };
            out.push_str(&format!(
                ".TP\n\\f{font}{}\\fR\n{}\n",
                escape(term),
                escape(what)
            ));
        }
    };
    list("FILES", page.files, false);
    // Every page has the section, saying so where the program reads none.
    const NONE: &[(&str, &str)] = &[("(none)", "it reads no environment variable")];
    let environment = if page.environment.is_empty() {
        NONE
    } else {
        page.environment
    };
    list("ENVIRONMENT", environment, true);
    list("SIGNALS", page.signals, true);
    list("EXAMPLES", page.examples, true);
    if !page.see_also.is_empty() {
        out.push_str(".SH SEE ALSO\n");
        let last = page.see_also.len() - 1;
        for (i, r) in page.see_also.iter().enumerate() {
            let (name, section) = r.split_once('(').unwrap_or((r, ""));
            let comma = if i < last { "," } else { "" };
            out.push_str(&format!(".BR {} ({}{comma}\n", escape(name), section));
        }
    }
    out
}

#[cfg(feature = "man")]
mod program {
    use super::{escape, tail_sections, Page, FLAG};
    use std::io::Write;

    /// The flag's clap argument: hidden from `--help`, and exclusive, so a
    /// program's required arguments are not asked for with it.
    pub fn flag() -> clap::Arg {
        clap::Arg::new(FLAG)
            .long(FLAG)
            .help("Print this program's man page (roff) and exit")
            .action(clap::ArgAction::SetTrue)
            .hide(true)
            .exclusive(true)
    }

    /// One argument as the synopsis shows it: `[--config FILE]`, `JOBID`.
    fn synopsis_arg(a: &clap::Arg) -> Option<String> {
        let value = || {
            a.get_value_names()
                .and_then(|v| v.first())
                .map(|v| v.to_string())
                .unwrap_or_else(|| a.get_id().as_str().to_ascii_uppercase())
        };
        let takes = a.get_action().takes_values();
        let text = match (a.get_long(), a.get_short()) {
            (Some(l), _) if takes => format!("\\fB\\-\\-{}\\fR \\fI{}\\fR", escape(l), value()),
            (Some(l), _) => format!("\\fB\\-\\-{}\\fR", escape(l)),
            (None, Some(s)) if takes => format!("\\fB\\-{s}\\fR \\fI{}\\fR", value()),
            (None, Some(s)) => format!("\\fB\\-{s}\\fR"),
            (None, None) => format!("\\fI{}\\fR", escape(&value())),
        };
        if matches!(a.get_id().as_str(), "help" | "version") {
            return None;
        }
        Some(if a.is_required_set() {
            text
        } else {
            format!("[{text}]")
        })
    }

    /// `.SH SYNOPSIS`: the program with every visible argument and its
    /// value's name, and a line per subcommand.
    fn synopsis(cmd: &clap::Command) -> String {
        let name = cmd.get_name();
        let args = |c: &clap::Command| -> String {
            let mut opts: Vec<&clap::Arg> =
                c.get_arguments().filter(|a| !a.is_hide_set()).collect();
            // Options first, then positionals, as clap's usage line.
            opts.sort_by_key(|a| a.is_positional());
            opts.iter()
                .filter_map(|a| synopsis_arg(a))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut out = format!(".SH SYNOPSIS\n\\fB{}\\fR {}\n", escape(name), args(cmd));
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            out.push_str(&format!(
                ".br\n\\fB{}\\fR \\fB{}\\fR {}\n",
                escape(name),
                escape(sub.get_name()),
                args(sub)
            ));
        }
        out.push_str(&format!(
            ".br\n\\fB{}\\fR \\fB\\-\\-help\\fR | \\fB\\-\\-version\\fR\n",
            escape(name)
        ));
        out
    }

    /// Subcommands described in this page (a page per subcommand would name
    /// pages that are not installed).
    fn commands(cmd: &clap::Command, section: &str) -> String {
        let subs: Vec<&clap::Command> = cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
            .collect();
        if subs.is_empty() {
            return String::new();
        }
        let mut out = String::from(".SH COMMANDS\n");
        for sub in subs {
            let about = sub
                .get_long_about()
                .or_else(|| sub.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            out.push_str(&format!(
                ".TP\n\\fB{}\\fR\n{}\n",
                escape(sub.get_name()),
                escape(&about)
            ));
            // The subcommand's own options, from its own rendering.
            let mut page = Vec::new();
            let man = clap_mangen::Man::new(sub.clone()).section(section);
            man.render_options_section(&mut page)
                .expect("rendering into memory cannot fail");
            let text = String::from_utf8_lossy(&page);
            let body: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with(".SH") && !l.starts_with(".ie") && !l.starts_with(".el"))
                .collect();
            out.push_str(".RS\n");
            out.push_str(&body.join("\n"));
            out.push_str("\n.RE\n");
        }
        out
    }

    /// The roff page of `cmd`, with `page`'s sections.
    pub fn render(cmd: clap::Command, page: &Page) -> Vec<u8> {
        let cmd = cmd.disable_help_subcommand(true);
        let mut out = Vec::new();
        let man = clap_mangen::Man::new(cmd.clone())
            .section(page.section)
            .manual("muxflow");
        let mut part = |f: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| {
            f(&mut out).expect("rendering into memory cannot fail")
        };
        part(&|w| man.render_title(w));
        part(&|w| man.render_name_section(w));
        part(&|w| w.write_all(synopsis(&cmd).as_bytes()));
        part(&|w| man.render_description_section(w));
        if cmd.get_arguments().any(|a| !a.is_hide_set()) {
            part(&|w| man.render_options_section(w));
        }
        part(&|w| w.write_all(commands(&cmd, page.section).as_bytes()));
        if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
            let text = after.to_string();
            part(&|w| {
                w.write_all(b".SH NOTES\n")?;
                for para in text.split("\n\n") {
                    writeln!(w, ".PP\n{}", escape(para.trim()))?;
                }
                Ok(())
            });
        }
        part(&|w| w.write_all(tail_sections(page).as_bytes()));
        if cmd.get_version().is_some() {
            part(&|w| man.render_version_section(w));
        }
        out
    }

    /// Parses the command line as `P::parse()` does, but with the hidden
    /// flag: given it, prints `P`'s page and exits.
    pub fn parse_or_print<P: clap::Parser>(page: &Page) -> P {
        let matches = print_if_asked(P::command(), page);
        P::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// `cmd`'s matches with the hidden flag added; given the flag, prints
    /// the page and exits.
    pub fn print_if_asked(cmd: clap::Command, page: &Page) -> clap::ArgMatches {
        let matches = cmd.clone().arg(flag()).get_matches();
        if matches.get_flag(FLAG) {
            let name = cmd.get_name().to_string();
            match print(cmd, page) {
                Ok(()) => std::process::exit(0),
                Err(e) => {
                    eprintln!("{name}: cannot print the man page: {e}");
                    std::process::exit(1);
                }
            }
        }
        matches
    }

    /// Prints `cmd`'s page to stdout.
    pub fn print(cmd: clap::Command, page: &Page) -> std::io::Result<()> {
        let text = render(cmd, page);
        let mut out = std::io::stdout().lock();
        out.write_all(&text)?;
        out.flush()
    }
}

#[cfg(feature = "man")]
pub use program::{flag, parse_or_print, print, print_if_asked, render};

/// Runs `program --help` and `program --print-man-page` and returns the
/// page, or what is wrong: the page is not section `section`'s of `name`,
/// a long option `--help` lists is missing from it, or [`check_page`]
/// fails with the pages the packages under `repo` install.
pub fn check_program_page(
    program: &Path,
    name: &str,
    section: &str,
    repo: &Path,
) -> Result<String, String> {
    let run = |arg: &str| -> Result<String, String> {
        let out = std::process::Command::new(program)
            .arg(arg)
            .output()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} {arg} exited {}: {}",
                program.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        String::from_utf8(out.stdout).map_err(|e| format!("{arg}: {e}"))
    };
    let help = run("--help")?;
    let page = run(&format!("--{FLAG}"))?;
    let title = format!(".TH {name} {section} ");
    if !page.contains(&title) {
        return Err(format!("the page has no '{title}':\n{page}"));
    }
    let missing: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'))
        .filter(|w| !page.contains(&w.replace('-', "\\-")))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "options in --help but not in the man page: {missing:?}"
        ));
    }
    check_page(&page, &installed_pages(repo)?).map_err(|e| format!("{name}({section}): {e}"))?;
    Ok(page)
}

/// The sections every page has.
pub const REQUIRED_SECTIONS: &[&str] = &[
    "NAME",
    "SYNOPSIS",
    "DESCRIPTION",
    "FILES",
    "ENVIRONMENT",
    "EXAMPLES",
    "SEE ALSO",
];

/// `name(section)` references in a roff text: `.BR name (8)`,
/// `\fBname\fR(8)`, `name(8)`.
pub fn references(page: &str) -> BTreeSet<String> {
    let plain = page
        .replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fI", "")
        .replace("\\fR", "")
        .replace("\\fP", "");
    // `.BR name (8)`: the request's two words are one reference.
    let plain: String = plain
        .lines()
        .map(
            |l| match l.strip_prefix(".BR ").or_else(|| l.strip_prefix(".IR ")) {
                Some(rest) => rest.replacen(" (", "(", 1),
                None => l.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    for (i, _) in plain.match_indices('(') {
        // `(N)` with N a section digit and an optional letter, then not a word.
        let Some(close) = plain[i..].find(')').map(|c| i + c) else {
            continue;
        };
        let sec = &plain[i + 1..close];
        if !(1..=3).contains(&sec.len())
            || !sec.starts_with(|c: char| ('1'..='8').contains(&c))
            || !sec[1..].chars().all(|c| c.is_ascii_lowercase())
        {
            continue;
        }
        let end = i;
        let start = plain[..end]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
            .map_or(0, |s| s + 1);
        let name = &plain[start..end];
        if name.chars().any(|c| c.is_ascii_alphabetic()) {
            out.insert(format!("{name}({sec})"));
        }
    }
    out
}

/// Checks one page: its required sections, each reference installed (by
/// muxflow's packages, `installed`, or one of [`EXTERNAL_PAGES`]), and its
/// roff: rendered by groff with every warning on where groff is installed,
/// else each request line checked against the man macros.
pub fn check_page(page: &str, installed: &BTreeSet<String>) -> Result<(), String> {
    let missing: Vec<&&str> = REQUIRED_SECTIONS
        .iter()
        .filter(|s| {
            !page
                .lines()
                .any(|l| l == format!(".SH {s}") || l == format!(".SH \"{s}\""))
        })
        .collect();
    if !missing.is_empty() {
        return Err(format!("no section {missing:?}"));
    }
    let foreign: Vec<String> = references(page)
        .into_iter()
        .filter(|r| !installed.contains(r) && !EXTERNAL_PAGES.contains(&r.as_str()))
        .collect();
    if !foreign.is_empty() {
        return Err(format!(
            "names pages no package installs: {foreign:?} (installed: {installed:?})"
        ));
    }
    for (n, line) in page.lines().enumerate() {
        if let Some(req) = line.strip_prefix('.') {
            let name = req.split_whitespace().next().unwrap_or("");
            if !name.is_empty() && !name.starts_with("\\\"") && !MACROS.contains(&name) {
                return Err(format!("line {}: unknown request '.{name}'", n + 1));
            }
        }
    }
    render_with_groff(page)
}

/// The man(7) macros and roff requests muxflow's pages use.
const MACROS: &[&str] = &[
    "TH", "SH", "SS", "TP", "PP", "LP", "P", "IP", "RS", "RE", "B", "I", "BR", "BI", "IR", "RB",
    "RI", "IB", "nf", "fi", "br", "sp", "ie", "el", "ds", "EX", "EE", "UR", "UE", "\\\"",
];

/// groff's verdict (`-ww`: every warning) where it is installed.
fn render_with_groff(page: &str) -> Result<(), String> {
    use std::io::Write;
    let child = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        // Not installed: the request check above is what there is.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("groff: {e}")),
    };
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(page.as_bytes())
        .map_err(|e| format!("groff: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("groff: {e}"))?;
    let warnings = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !warnings.trim().is_empty() {
        return Err(format!("groff -man -ww: {}{warnings}", out.status));
    }
    Ok(())
}

/// The pages muxflow's packages install, `name(section)`, from the Debian
/// packages' assets (`node/`, `matcher/`, `sim/` Cargo.toml) — the same set
/// the rpm spec's `%files` must list, or this is an error.
pub fn installed_pages(repo: &Path) -> Result<BTreeSet<String>, String> {
    let read = |p: &str| {
        std::fs::read_to_string(repo.join(p))
            .map_err(|e| format!("{}: {e}", repo.join(p).display()))
    };
    let mut deb = BTreeSet::new();
    for manifest in DEB_MANIFESTS {
        for (source, dest) in deb_assets(&read(manifest)?) {
            if dest.starts_with("usr/share/man/man") {
                let file = source.rsplit('/').next().unwrap_or(&source);
                deb.insert(page_ref(file.trim_end_matches(".gz"))?);
            }
        }
    }
    let mut rpm = BTreeSet::new();
    for line in read("muxflow.spec")?.lines() {
        if let Some(rest) = line.strip_prefix("%{_mandir}/man") {
            let file = rest.split_once('/').map_or("", |(_, f)| f);
            rpm.insert(page_ref(file.trim_end_matches('*'))?);
        }
    }
    if deb != rpm {
        return Err(format!(
            "the debs install the pages {deb:?} but muxflow.spec's %files lists {rpm:?}"
        ));
    }
    Ok(deb)
}

/// The Cargo.toml files whose `[package.metadata.deb]` assets are packages.
pub const DEB_MANIFESTS: &[&str] = &["node/Cargo.toml", "matcher/Cargo.toml", "sim/Cargo.toml"];

/// `muxflow-doctor.8` → `muxflow-doctor(8)`.
fn page_ref(file: &str) -> Result<String, String> {
    let (name, section) = file
        .rsplit_once('.')
        .ok_or_else(|| format!("'{file}' is not NAME.SECTION"))?;
    Ok(format!("{name}({section})"))
}

/// `(source, destination)` of each `["source", "dest", "mode"]` line of a
/// Cargo.toml's deb assets.
pub fn deb_assets(manifest: &str) -> Vec<(String, String)> {
    manifest
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let inner = l.strip_prefix('[')?.strip_suffix("],")?;
            let parts: Vec<&str> = inner.split(", ").map(|p| p.trim_matches('"')).collect();
            match parts.as_slice() {
                [source, dest, _mode] => Some((source.to_string(), dest.to_string())),
                _ => None,
            }
        })
        .collect()
}

/// The programs the packages install in `usr/bin` and `usr/sbin`.
pub fn installed_programs(repo: &Path) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    for manifest in DEB_MANIFESTS {
        let text =
            std::fs::read_to_string(repo.join(manifest)).map_err(|e| format!("{manifest}: {e}"))?;
        for (source, dest) in deb_assets(&text) {
            if dest.starts_with("usr/bin/") || dest.starts_with("usr/sbin/") {
                out.insert(source.rsplit('/').next().unwrap_or(&source).to_string());
            }
        }
    }
    Ok(out)
}

/// The sections the config file's page groups its keys in, with what each
/// is for (the sample file's `[section]` headers, in its order).
const CONFIG_SECTIONS: &[(&str, &str)] = &[
    ("paths", "Where muxflow's files, programs and libraries are."),
    ("mps", "How each GPU's MPS control daemon is started."),
    ("slurm", "How muxflow names its GRES and calls Slurm."),
    ("policy", "What an offline job is given: its SM share, memory cap, slots, and whose jobs may share a GPU."),
    ("xcuda", "The launch gate xCUDA runs inside offline jobs."),
    ("health", "Each GPU's health state machine, the police and the sampler on the nodes."),
    ("matcher", "The matcher daemon on the controller host."),
    ("metrics", "Figures for Prometheus and DCGM; each is off while unset."),
];

/// muxflow.toml(5), generated from the sample config (`etc/muxflow.toml`):
/// each key with its default and the comment above it, so the page says
/// what the shipped file says.
pub fn config_page(sample: &str) -> Result<String, String> {
    let mut out = String::from(
        ".\\\" Generated from etc/muxflow.toml by muxflow::man::config_page; a unit test\n\
         .\\\" keeps it current (MUXFLOW_BLESS=1 cargo test -p muxflow man:: rewrites it).\n\
         .TH muxflow.toml 5 \"\" \"muxflow\" \"muxflow\"\n\
         .SH NAME\n\
         muxflow.toml \\- muxflow's configuration file\n\
         .SH SYNOPSIS\n\
         .I /etc/slurm/muxflow.toml\n\
         .SH DESCRIPTION\n\
         The configuration of muxflow's SPANK plugin, node programs and matcher, in TOML.\n\
         The plugin reads the file its plugstack line's \\fBconfig=\\fR names (default\n\
         \\fI/etc/slurm/muxflow.toml\\fR); the node programs, the matcher and\n\
         \\fBmuxflow\\-report\\fR read \\fBmuxflow.toml\\fR beside the \\fBslurm.conf\\fR in use\n\
         (\\fBSLURM_CONF\\fR, or slurmd's), else \\fI/etc/slurm/muxflow.toml\\fR, unless given\n\
         \\fB\\-\\-config\\fR.\n\
         .PP\n\
         Every key is optional; the values below are the defaults. An unknown key or a\n\
         bad value is an error naming the file, the line and the key: the plugin then\n\
         refuses \\fB\\-\\-muxflow\\fR jobs at submit (other jobs are untouched), and the\n\
         matcher keeps its previous settings on \\fBSIGHUP\\fR.\n",
    );
    let mut section: Option<&str> = None;
    let mut comment: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for line in sample.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let what = CONFIG_SECTIONS
                .iter()
                .find(|(s, _)| *s == name)
                .map(|(_, w)| *w)
                .ok_or_else(|| {
                    format!("etc/muxflow.toml: section [{name}] is not in CONFIG_SECTIONS: say what it is for there")
                })?;
            out.push_str(&format!(".SH [{name}]\n{}\n", escape(what)));
            section = Some(name);
            seen.insert(name.to_string());
            comment.clear();
            continue;
        }
        let text = line.strip_prefix('#').map(str::trim).unwrap_or(line);
        // `key = value`, set or commented out.
        let key_value = text.split_once(" = ").filter(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        });
        match (key_value, section) {
            (Some((key, value)), Some(_)) => {
                let default = if line.starts_with('#') {
                    format!("unset (e.g. {value})")
                } else {
                    value.to_string()
                };
                out.push_str(&format!(
                    ".TP\n\\fB{}\\fR = \\fI{}\\fR\n{}\n",
                    escape(key),
                    escape(&default),
                    escape(&comment.join(" "))
                ));
                comment.clear();
            }
            _ if line.starts_with('#') && section.is_some() => comment.push(text.to_string()),
            _ => comment.clear(),
        }
    }
    let unused: Vec<&str> = CONFIG_SECTIONS
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| !seen.contains(*s))
        .collect();
    if !unused.is_empty() {
        return Err(format!(
            "CONFIG_SECTIONS lists {unused:?}, which etc/muxflow.toml lacks"
        ));
    }
    out.push_str(&tail_sections(&Page {
        section: "5",
        files: &[
            ("/etc/slurm/muxflow.toml", "the configuration (the muxflow-node package installs it)"),
            ("/usr/share/doc/muxflow-node/admin-guide.md", "the admin guide: install, operate, metrics"),
        ],
        environment: &[(
            "SLURM_CONF",
            "the slurm.conf in use; muxflow.toml is looked for beside it first",
        )],
        signals: &[],
        examples: &[
            (
                "muxflow-doctor",
                "checks the file (file, line and key of any error) with the rest of the node's installation",
            ),
            (
                "systemctl reload muxflow-matcher",
                "makes the matcher read it again before its next round",
            ),
        ],
        see_also: &[
            "spank-muxflow(8)",
            "muxflow-doctor(8)",
            "muxflow-matcher(8)",
            "muxflow-health(8)",
            "slurm.conf(5)",
            "gres.conf(5)",
        ],
    }));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn references_are_found_in_each_form() {
        let page = ".BR muxflow\\-doctor (8),\n\\fBsbatch\\fR(1) and slurm.conf(5); f(x) and (1) alone are not\n";
        let got: Vec<String> = references(page).into_iter().collect();
        assert_eq!(got, ["muxflow-doctor(8)", "sbatch(1)", "slurm.conf(5)"]);
    }

    #[test]
    fn a_page_naming_an_uninstalled_page_or_lacking_a_section_fails() {
        let installed: BTreeSet<String> = ["muxflow-doctor(8)".to_string()].into();
        let sections: String = REQUIRED_SECTIONS
            .iter()
            .map(|s| format!(".SH {s}\ntext\n"))
            .collect();
        let good = format!(".TH x 8\n{sections}.BR muxflow\\-doctor (8),\n.BR sbatch (1)\n");
        assert_eq!(check_page(&good, &installed), Ok(()));
        let foreign = format!("{good}.BR muxflow\\-sim\\-predictor (1)\n");
        let e = check_page(&foreign, &installed).unwrap_err();
        assert!(e.contains("muxflow-sim-predictor(1)"), "{e}");
        let no_files = good.replace(".SH FILES\n", "");
        let e = check_page(&no_files, &installed).unwrap_err();
        assert!(e.contains("FILES"), "{e}");
        let bad_request = format!("{good}.XX nothing\n");
        assert!(check_page(&bad_request, &installed)
            .unwrap_err()
            .contains(".XX"));
    }

    /// The debs and the rpm install the same pages, and every installed
    /// program has one.
    #[test]
    fn every_installed_program_has_a_page_and_both_package_kinds_install_them() {
        let pages = installed_pages(repo()).unwrap();
        let programs = installed_programs(repo()).unwrap();
        assert!(programs.contains("muxflow-doctor"), "{programs:?}");
        for p in &programs {
            assert!(
                pages.iter().any(|r| r.starts_with(&format!("{p}("))),
                "{p} is installed without a man page (installed pages: {pages:?})"
            );
        }
        assert!(pages.contains("muxflow.toml(5)"), "{pages:?}");
    }

    /// The hand-written and generated pages under etc/man/: each is
    /// installed, renders, and names only installed pages.
    #[test]
    fn the_pages_under_etc_man_render_and_name_installed_pages() {
        let installed = installed_pages(repo()).unwrap();
        let dir = repo().join("etc/man");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let file = path.file_name().unwrap().to_str().unwrap().to_string();
            assert!(
                installed.contains(&page_ref(&file).unwrap()),
                "{file} is not installed by the packages"
            );
            let page = std::fs::read_to_string(&path).unwrap();
            if let Err(e) = check_page(&page, &installed) {
                panic!("{file}: {e}");
            }
            n += 1;
        }
        assert!(n >= 3, "{n} pages under {}", dir.display());
    }

    /// etc/man/muxflow.toml.5 is what the sample config gives, and names
    /// every key of it.
    #[test]
    fn the_config_page_is_generated_from_the_sample_and_current() {
        let sample = std::fs::read_to_string(repo().join("etc/muxflow.toml")).unwrap();
        let page = config_page(&sample).unwrap();
        for key in [
            "state_dir",
            "multiuser",
            "offline_per_gpu",
            "interval_s",
            "listen",
            "shape_file",
        ] {
            assert!(
                page.contains(&format!("\\fB{}\\fR = ", escape(key))),
                "{key}: {page}"
            );
        }
        assert!(page.contains(".SH [metrics]"), "{page}");
        let path = repo().join("etc/man/muxflow.toml.5");
        if std::env::var_os("MUXFLOW_BLESS").is_some() {
            std::fs::write(&path, &page).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == page,
            "{} is not what etc/muxflow.toml gives: MUXFLOW_BLESS=1 cargo test -p muxflow man:: rewrites it",
            path.display()
        );
    }

    #[test]
    fn an_unknown_config_section_is_an_error_naming_it() {
        let e = config_page("[paths]\nstate_dir = \"/x\"\n[new]\nk = 1\n").unwrap_err();
        assert!(e.contains("[new]"), "{e}");
    }

    #[cfg(feature = "man")]
    mod program {
        use super::super::*;

        fn program() -> clap::Command {
            clap::Command::new("muxflow-example")
                .about("An example program")
                .version("1.0")
                .arg(clap::Arg::new("job").required(true).help("The job's ID"))
                .arg(
                    clap::Arg::new("config")
                        .long("config")
                        .value_name("FILE")
                        .help("The config"),
                )
                .arg(
                    clap::Arg::new("json")
                        .long("json")
                        .action(clap::ArgAction::SetTrue)
                        .help("Print JSON instead of text"),
                )
                .subcommand(
                    clap::Command::new("predictor")
                        .about("Score the predictor")
                        .arg(clap::Arg::new("seeds").long("seeds").help("Seeds")),
                )
                .arg(flag())
        }

        const PAGE: Page = Page {
            section: "8",
            files: &[("/etc/slurm/muxflow.toml", "the config")],
            environment: &[("SLURM_CONF", "the slurm.conf")],
            signals: &[("SIGHUP", "reads the config again")],
            examples: &[("muxflow-example 17 --json", "prints job 17 as JSON")],
            see_also: &["muxflow-doctor(8)", "sbatch(1)"],
        };

        #[test]
        fn the_page_carries_the_help_the_sections_and_hides_the_flag() {
            let page = String::from_utf8(render(program(), &PAGE)).unwrap();
            assert!(page.contains(".TH muxflow-example 8"), "{page}");
            assert!(page.contains("Print JSON instead of text"), "{page}");
            assert!(page.contains("The job\\*(Aqs ID"), "{page}");
            assert!(!page.contains(FLAG), "{page}");
            // The synopsis shows each option's argument.
            assert!(
                page.contains(
                    "[\\fB\\-\\-config\\fR \\fIFILE\\fR] [\\fB\\-\\-json\\fR] \\fIJOB\\fR"
                ),
                "{page}"
            );
            // Subcommands are described here, not in pages of their own.
            assert!(page.contains(".SH COMMANDS"), "{page}");
            assert!(!page.contains("muxflow\\-example\\-predictor("), "{page}");
            for s in ["FILES", "ENVIRONMENT", "SIGNALS", "EXAMPLES", "SEE ALSO"] {
                assert!(page.contains(&format!(".SH {s}\n")), "{s}: {page}");
            }
            let installed: BTreeSet<String> = ["muxflow-doctor(8)".to_string()].into();
            assert_eq!(check_page(&page, &installed), Ok(()));
        }

        #[test]
        fn the_flag_needs_no_required_argument_and_takes_no_other() {
            let m = program()
                .try_get_matches_from(["muxflow-example", "--print-man-page"])
                .unwrap();
            assert!(m.get_flag(FLAG));
            assert!(program()
                .try_get_matches_from(["muxflow-example", "--print-man-page", "--json"])
                .is_err());
            assert!(program()
                .try_get_matches_from(["muxflow-example", "--json"])
                .is_err());
        }
    }
}
