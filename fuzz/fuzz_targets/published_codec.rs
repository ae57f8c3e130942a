//! The node-Extra codec never panics on any text, and round-trips what it accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow::records::published::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(gpus) = decode(text) {
        assert_eq!(decode(&encode(&gpus)).expect("re-decode"), gpus);
    }
});
