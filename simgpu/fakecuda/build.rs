use std::path::PathBuf;

fn main() {
    // The real driver's soname, so dlopen("libcuda.so.1") bookkeeping matches.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // The symbol version every export is also defined under (lib.rs), so
    // dlvsym lookups of the driver's names can be exercised.
    let map = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("versions.map");
    std::fs::write(&map, "SIMGPU_1 { global: cu*; };\n").unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
