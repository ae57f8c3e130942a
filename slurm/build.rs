//! Reads the installed Slurm headers so every muxflow binary knows the Slurm
//! version it was built for: Slurm's plugin loader rejects a SPANK plugin whose
//! major.minor differs from its own.
//!
//! The one place where Slurm releases differ at build time: [`FEATURES`]
//! turns the version into `cfg`s for this crate and, through
//! `DEP_SLURM_FEATURES`, for the plugin's (`spank/build.rs`); the code they
//! select lives in `spank/src/compat.rs` and `slurm/src/version.rs`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const HEADER: &str = "slurm/slurm_version.h";
/// Read for the special step ids (extern, batch, interactive).
const SLURM_H: &str = "slurm/slurm.h";
/// SPANK's declarations (read for the features' symbols).
const SPANK_H: &str = "slurm/spank.h";

/// What a Slurm release from `since` on offers muxflow: (cfg name, first
/// release as SLURM_VERSION_NUMBER, a symbol `slurm/spank.h` must declare).
const FEATURES: &[(&str, u32, &str)] = &[
    // 25.05: a plugin may choose that a failure of its slurmstepd callbacks
    // fails the job (ESPANK_JOB_FAILURE) instead of draining the node.
    (
        "slurm_init_failure_mode",
        0x19_05_00,
        "slurm_spank_init_failure_mode",
    ),
];

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

    let spank_h = fs::read_to_string(include_dir.join(SPANK_H)).unwrap_or_default();
    let mut on = Vec::new();
    for &(name, since, symbol) in FEATURES {
        println!("cargo::rustc-check-cfg=cfg({name})");
        if version < since {
            continue;
        }
        if !spank_h.contains(symbol) {
            fail(&format!(
                "{} is Slurm {}.{:02} but declares no {symbol} (expected from {}.{:02} on); \
                 are slurm/slurm_version.h and slurm/spank.h from the same release?",
                include_dir.join(SPANK_H).display(),
                version >> 16,
                (version >> 8) & 0xff,
                since >> 16,
                (since >> 8) & 0xff,
            ));
        }
        println!("cargo:rustc-cfg={name}");
        on.push(name);
    }
    // Dependants' build scripts read these as DEP_SLURM_FEATURES (this
    // release's) and DEP_SLURM_KNOWN_FEATURES (every name, for check-cfg).
    println!("cargo:features={}", on.join(","));
    let known: Vec<&str> = FEATURES.iter().map(|f| f.0).collect();
    println!("cargo:known_features={}", known.join(","));
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
            // SPANK's error codes (ESPANK_JOB_FAILURE from 25.05 on).
            .allowlist_var("slurm_err_t_ESPANK_.*")
            .allowlist_type("slurm_err_t")
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
