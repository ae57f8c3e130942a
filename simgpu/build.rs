//! Builds what xcuda-probe links against for its direct-symbol path: a stub
//! `libcuda.so` (soname libcuda.so.1, empty functions) used only at link
//! time, and the probe's extern block, both from the one entry-point list
//! (`cuda_entry_points!` in cuda-abi/src/lib.rs, read as text: every line `{name,
//! "base", ...}`). At run time the dynamic linker binds those symbols like
//! for any program linked with -lcuda: to xCUDA when preloaded, else to the
//! libcuda.so.1 found.
use std::fmt::Write;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    // The list, read as text from its crate beside this one.
    const LIST: &str = "../cuda-abi/src/lib.rs";
    println!("cargo:rerun-if-changed={LIST}");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let list = std::fs::read_to_string(LIST).unwrap();
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.trim().strip_prefix('{'))
        .filter_map(|l| l.split_once(", \""))
        .map(|(name, _)| name)
        .filter(|n| n.starts_with("cu") && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    assert!(names.len() > 100, "entry-point list not found in {LIST}");
    let mut stub = String::new();
    let mut linked = String::from("#[link(name = \"cuda\")]\nextern \"C\" {\n");
    let mut lookup = String::from(
        "/// Address of the linked symbol `name`.\npub fn linked(name: &str) -> Option<usize> {\n    Some(match name {\n",
    );
    for n in &names {
        writeln!(stub, "#[no_mangle] pub extern \"C\" fn {n}() {{}}").unwrap();
        writeln!(linked, "    fn {n}();").unwrap();
        writeln!(lookup, "        \"{n}\" => {n} as *const () as usize,").unwrap();
    }
    linked.push_str("}\n");
    lookup.push_str("        _ => return None,\n    })\n}\n");
    std::fs::write(out.join("linked.rs"), linked + &lookup).unwrap();
    let src = out.join("cuda_stub.rs");
    std::fs::write(&src, stub).unwrap();
    let dir = out.join("stub");
    std::fs::create_dir_all(&dir).unwrap();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let st = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "cdylib",
            "--crate-name",
            "cuda_stub",
        ])
        .args(["-C", "link-arg=-Wl,-soname,libcuda.so.1", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&src)
        .status()
        .expect("run rustc for the libcuda link stub");
    assert!(st.success(), "building the libcuda link stub failed");
    println!("cargo:rustc-link-search=native={}", dir.display());
}
