//! Man pages from the same clap `Command` as a program's `--help`, so the
//! two cannot drift: each program with a page takes a hidden
//! `--print-man-page` ([`FLAG`]) and prints it with [`print`];
//! `scripts/package` writes the pages and the packages install them.

use std::io::Write;

/// The hidden flag every program with a man page takes.
pub const FLAG: &str = "print-man-page";

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

/// The roff page of `cmd` in man `section` ("1" user commands, "8"
/// administration).
pub fn render(cmd: clap::Command, section: &str) -> Vec<u8> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .section(section)
        .render(&mut out)
        .expect("rendering into memory cannot fail");
    out
}

/// Parses the command line as `P::parse()` does, but with the hidden flag:
/// given it, prints `P`'s page in man `section` and exits.
pub fn parse_or_print<P: clap::Parser>(section: &str) -> P {
    let matches = P::command().arg(flag()).get_matches();
    if matches.get_flag(FLAG) {
        let cmd = P::command();
        let name = cmd.get_name().to_string();
        match print(cmd, section) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("{name}: cannot print the man page: {e}");
                std::process::exit(1);
            }
        }
    }
    P::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Prints `cmd`'s page to stdout.
pub fn print(cmd: clap::Command, section: &str) -> std::io::Result<()> {
    let page = render(cmd, section);
    let mut out = std::io::stdout().lock();
    out.write_all(&page)?;
    out.flush()
}

/// Runs `program --help` and `program --print-man-page` and returns the
/// page, or what is wrong: the page is not section `section`'s of `name`,
/// or a long option `--help` lists is missing from it. For each program's
/// test (the page comes from the same Command, so this fails only when
/// the flag is not wired or the page is not that program's).
pub fn check_program_page(
    program: &std::path::Path,
    name: &str,
    section: &str,
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
    if missing.is_empty() {
        Ok(page)
    } else {
        Err(format!(
            "options in --help but not in the man page: {missing:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program() -> clap::Command {
        clap::Command::new("muxflow-example")
            .about("An example program")
            .arg(clap::Arg::new("job").required(true).help("The job's ID"))
            .arg(
                clap::Arg::new("json")
                    .long("json")
                    .action(clap::ArgAction::SetTrue)
                    .help("Print JSON instead of text"),
            )
            .arg(flag())
    }

    #[test]
    fn the_page_carries_the_help_and_hides_the_flag() {
        let page = String::from_utf8(render(program(), "8")).unwrap();
        assert!(page.contains(".TH muxflow-example 8"), "{page}");
        assert!(page.contains("Print JSON instead of text"), "{page}");
        assert!(page.contains("The job\\*(Aqs ID"), "{page}");
        assert!(!page.contains(FLAG), "{page}");
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
