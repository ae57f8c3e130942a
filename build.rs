//! Reads the installed Slurm headers so every muxflow binary knows the Slurm
//! version it was built for: Slurm's plugin loader rejects a SPANK plugin whose
//! major.minor differs from its own.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const HEADER: &str = "slurm/slurm_version.h";
/// Read for the special step ids (extern, batch, interactive).
const SLURM_H: &str = "slurm/slurm.h";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");

    let include_dir = env::var_os("SLURM_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    let header = include_dir.join(HEADER);
    if !header.is_file() {
        fail(&format!(
            "{} not found. Install the Slurm development headers: \
             `apt-get install libslurm-dev` (Debian/Ubuntu), or set SLURM_INCLUDE_DIR \
             to the directory that contains slurm/slurm_version.h.",
            header.display()
        ));
    }
    println!("cargo:rerun-if-changed={}", header.display());

    let bindings = generate(&include_dir, &header);
    let version = parse_version(&bindings).unwrap_or_else(|| {
        fail(&format!(
            "{} defines no SLURM_VERSION_NUMBER; is it a Slurm header?",
            header.display()
        ))
    });

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs::write(out.join("slurm_version.rs"), bindings).expect("write slurm_version.rs");
    // Dependants' build scripts read this as DEP_SLURM_VERSION_NUMBER.
    println!("cargo:version_number={version:#08x}");
}

fn generate(include_dir: &Path, header: &Path) -> String {
    let header = header.to_string_lossy().into_owned();
    let slurm_h = include_dir.join(SLURM_H).to_string_lossy().into_owned();
    let clang_arg = format!("-I{}", include_dir.display());
    // bindgen panics when it cannot load libclang; turn that into the fix.
    let result = std::panic::catch_unwind(move || {
        bindgen::Builder::default()
            .header(header)
            .header(slurm_h)
            .clang_arg(clang_arg)
            .allowlist_var("SLURM_VERSION_.*")
            .allowlist_var("SLURM_(EXTERN_CONT|BATCH_SCRIPT|INTERACTIVE_STEP|PENDING_STEP)")
            .generate()
            .map(|b| b.to_string())
    });
    match result {
        Ok(Ok(text)) => text,
        Ok(Err(e)) => fail(&format!(
            "bindgen could not read the Slurm headers ({e:?}). Install `libclang-dev` \
             and `libslurm-dev` (`apt-get install libclang-dev libslurm-dev`)."
        )),
        Err(_) => fail(
            "libclang could not be loaded, so the Slurm headers cannot be read. \
             Install it: `apt-get install libclang-dev` (or set LIBCLANG_PATH).",
        ),
    }
}

/// Finds `SLURM_VERSION_NUMBER: u32 = N;` in bindgen's output.
fn parse_version(bindings: &str) -> Option<u32> {
    let line = bindings
        .lines()
        .find(|l| l.contains("SLURM_VERSION_NUMBER:"))?;
    let value = line.split('=').nth(1)?.trim().trim_end_matches(';').trim();
    value.parse().ok()
}

fn fail(msg: &str) -> ! {
    eprintln!("\nmuxflow build error: {msg}\n");
    std::process::exit(1);
}
