//! The man pages of `muxflow-report` (section 1) and `muxflow-matcher`
//! (section 8) come from their `--help`.

#[test]
fn muxflow_report_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        std::path::Path::new(env!("CARGO_BIN_EXE_muxflow-report")),
        "muxflow-report",
        "1",
    )
    .unwrap();
    assert!(page.contains("\\-\\-json"), "{page}");
}

#[test]
fn muxflow_matcher_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        std::path::Path::new(env!("CARGO_BIN_EXE_muxflow-matcher")),
        "muxflow-matcher",
        "8",
    )
    .unwrap();
    assert!(page.contains("\\-\\-once"), "{page}");
}
