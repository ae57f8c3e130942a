//! The man page of `muxflow-matcher` (section 8) comes from its `--help`.

#[test]
fn muxflow_matcher_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        std::path::Path::new(env!("CARGO_BIN_EXE_muxflow-matcher")),
        "muxflow-matcher",
        "8",
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
    )
    .unwrap();
    assert!(page.contains("\\-\\-once"), "{page}");
    assert!(page.contains(".SH SIGNALS"), "{page}");
    assert!(page.contains("SIGHUP"), "{page}");
}
