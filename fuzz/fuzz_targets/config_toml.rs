//! muxflow.toml: any text gives a config or an error naming the file, never a
//! panic; an accepted config also resolves for a node name without panicking.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use muxflow::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/slurm/muxflow.toml");
    match Config::parse(text, path) {
        Ok(config) => {
            let _ = config.for_node("node1");
        }
        Err(e) => assert!(
            e.to_string().contains("muxflow.toml"),
            "error names no file: {e}"
        ),
    }
});
