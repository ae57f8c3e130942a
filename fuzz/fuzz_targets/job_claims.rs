//! What a job writes into its stats directory (xCUDA's `xcuda.<pid>`
//! counters, the workload's `job.report`): any text becomes bounded claims
//! in a report that encodes to text decoding to the same report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow::records::report::{claim_bound, JobReport};
use muxflow::Mode;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Files separated by NUL; the first byte of each picks its name.
    let files: Vec<(&str, &str)> = text
        .split('\0')
        .map(|f| {
            let name = match f.bytes().next().unwrap_or(0) % 3 {
                0 => "job.report",
                1 => "xcuda.1",
                _ => "xcuda.2",
            };
            (name, f)
        })
        .collect();
    let mut r = JobReport {
        mode: Some(Mode::Offline),
        ..JobReport::default()
    };
    r.add_claims(files);
    for (key, v) in [
        ("steps", r.steps),
        ("requests", r.requests),
        ("peak_mib", r.peak_mib),
    ] {
        if let Some(v) = v {
            assert!(
                v as f64 <= claim_bound(key).unwrap(),
                "{key}={v} over its bound"
            );
        }
    }
    for (key, v) in [
        ("steps_per_s", r.steps_per_s),
        ("rps", r.rps),
        ("p50_ms", r.p50_ms),
        ("p99_ms", r.p99_ms),
    ] {
        if let Some(v) = v {
            assert!(
                v.is_finite() && v >= 0.0 && v <= claim_bound(key).unwrap(),
                "{key}={v}"
            );
        }
    }
    assert_eq!(JobReport::decode(&r.encode()).expect("re-decode"), r);
});
