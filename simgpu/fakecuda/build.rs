use std::path::PathBuf;

fn main() {
    // The real driver's soname, so dlopen("libcuda.so.1") bookkeeping matches.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Bind the library's own references to its own definitions, as the real
    // driver's do: the addresses its cuGetProcAddress hands out and its
    // versioned aliases' jumps must be the fake's own functions even when a
    // preloaded library (xCUDA) exports the same names. Without this they go
    // through the GOT, land on xCUDA's exports, and a lookup test passes
    // whether or not xCUDA swapped the pointer.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    // The symbol version every export is also defined under (lib.rs), so
    // dlvsym lookups of the driver's names can be exercised.
    let map = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("versions.map");
    std::fs::write(&map, "SIMGPU_1 { global: cu*; };\n").unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
