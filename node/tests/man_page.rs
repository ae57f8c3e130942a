//! The node programs' man pages (section 8) come from their `--help` and
//! name only installed pages (`muxflow::man::check_program_page`).

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn muxflow_doctor_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        Path::new(env!("CARGO_BIN_EXE_muxflow-doctor")),
        "muxflow-doctor",
        "8",
        repo(),
    )
    .unwrap();
    assert!(page.contains("Exit status"), "{page}");
    // The synopsis shows what each option takes.
    assert!(page.contains("[\\fB\\-\\-node\\fR \\fINAME\\fR]"), "{page}");
    assert!(page.contains("\\-\\-controller"), "{page}");
}

#[test]
fn every_node_program_prints_its_man_page() {
    // (program, its binary, a word its page must carry)
    let rows = [
        (
            "muxflow-prolog",
            env!("CARGO_BIN_EXE_muxflow-prolog"),
            "PrologFlags=Alloc",
        ),
        (
            "muxflow-epilog",
            env!("CARGO_BIN_EXE_muxflow-epilog"),
            "Epilog=",
        ),
        (
            "muxflow-health",
            env!("CARGO_BIN_EXE_muxflow-health"),
            "HealthCheckProgram=",
        ),
        (
            "muxflow-police",
            env!("CARGO_BIN_EXE_muxflow-police"),
            "police_interval_ms",
        ),
        (
            "muxflow-sampler",
            env!("CARGO_BIN_EXE_muxflow-sampler"),
            "sampler_linger_s",
        ),
    ];
    for (name, bin, word) in rows {
        let page = muxflow::man::check_program_page(Path::new(bin), name, "8", repo())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(page.contains(&word.replace('-', "\\-")), "{name}: {page}");
        assert!(page.contains("SLURMD_NODENAME"), "{name}: {page}");
    }
}
