fn main() {
    // The real driver's soname, so dlopen("libcuda.so.1") bookkeeping matches.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
