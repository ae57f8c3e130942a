//! The plugin's plugstack.conf arguments: any words give arguments or an
//! error, never a panic, and an accepted config path is absolute.
#![no_main]

use libfuzzer_sys::fuzz_target;

use muxflow::config::plugstack as args;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // slurmd splits the plugstack line on whitespace.
    if let Ok(a) = args::PluginArgs::parse(text.split_whitespace()) {
        assert!(a.config.is_absolute());
    }
});
