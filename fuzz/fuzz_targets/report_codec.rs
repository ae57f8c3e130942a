//! The AdminComment codec never panics on any text, and whatever it accepts
//! encodes back to text it decodes to the same report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow::records::report::JobReport;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(report) = JobReport::decode(text) {
        let again = JobReport::decode(&report.encode()).expect("re-decode");
        assert_eq!(again, report);
    }
});
