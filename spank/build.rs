//! slurm-spank 0.2's SPANK_PLUGIN! takes the plugin version as a literal, so
//! the invocation is generated here from the version muxflow's build script
//! read out of the installed Slurm headers. The release's features (that
//! build script's table) become this crate's `cfg`s, for `src/compat.rs`.

fn main() {
    let version = std::env::var("DEP_SLURM_VERSION_NUMBER")
        .expect("the muxflow crate's build script exports the Slurm version");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(
        out.join("plugin_decl.rs"),
        format!("slurm_spank::SPANK_PLUGIN!(b\"muxflow\", {version}, crate::MuxflowPlugin);\n"),
    )
    .expect("write plugin_decl.rs");
    println!("cargo:rerun-if-env-changed=DEP_SLURM_VERSION_NUMBER");
    println!("cargo:rerun-if-env-changed=DEP_SLURM_FEATURES");
    println!("cargo:rerun-if-env-changed=DEP_SLURM_KNOWN_FEATURES");
    let names = |var: &str| {
        let list = std::env::var(var).unwrap_or_default();
        list.split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for name in names("DEP_SLURM_KNOWN_FEATURES") {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    for name in names("DEP_SLURM_FEATURES") {
        println!("cargo:rustc-cfg={name}");
    }
}
