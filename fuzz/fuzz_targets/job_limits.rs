//! xCUDA's settings file (`<state_dir>/limits/<job>`): any text is limits or
//! an error, never a panic; accepted limits encode to text that decodes to
//! the same limits, and a bad xCUDA setting falls back rather than failing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow::records::limits::JobLimits;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((limits, _problems)) = JobLimits::decode(text, 12) {
        assert!((1..=100).contains(&limits.sm_pct));
        let (again, problems) = JobLimits::decode(&limits.encode(), 12).expect("re-decode");
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(again, limits);
    }
});
