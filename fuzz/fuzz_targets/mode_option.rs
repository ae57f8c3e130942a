//! `--muxflow=VALUE`: any value parses to a mode that prints back to itself,
//! or to an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow::Mode;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<Mode>() {
        Ok(mode) => assert_eq!(mode.as_str().parse::<Mode>(), Ok(mode)),
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
