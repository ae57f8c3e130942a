//! slurm-spank 0.2's SPANK_PLUGIN! takes the plugin version as a literal, so
//! the invocation is generated here from the version muxflow's build script
//! read out of the installed Slurm headers.

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
}
