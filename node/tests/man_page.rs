//! `muxflow-doctor`'s man page (section 8) comes from its `--help`.

#[test]
fn muxflow_doctor_prints_its_man_page() {
    let page = muxflow::man::check_program_page(
        std::path::Path::new(env!("CARGO_BIN_EXE_muxflow-doctor")),
        "muxflow-doctor",
        "8",
    )
    .unwrap();
    assert!(page.contains("Exit status"), "{page}");
}
