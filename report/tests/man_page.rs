//! The man page of `muxflow-report` (section 1) comes from its `--help`.

#[test]
fn muxflow_report_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        std::path::Path::new(env!("CARGO_BIN_EXE_muxflow-report")),
        "muxflow-report",
        "1",
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
    )
    .unwrap();
    assert!(page.contains("\\-\\-json"), "{page}");
    // The views besides a job's report, with their arguments.
    assert!(page.contains("\\-\\-mine"), "{page}");
    assert!(page.contains("NODE:INDEX"), "{page}");
}
