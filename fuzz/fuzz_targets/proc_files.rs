//! What the node reads from /proc and its own record files to find a
//! process's job and a job's policing: any text parses or is refused, never
//! a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use muxflow::{node::jobproc, records::limits};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = jobproc::parse_stat(text);
    let _ = jobproc::real_uid(text);
    let _ = jobproc::job_in_stepd_title(text);
    let _ = jobproc::job_in_v1_cgroup(text);
    let _ = jobproc::job_dir_in_cgroup(text);
    let codes = limits::policed_codes(text);
    assert!(codes
        .iter()
        .all(|c| !c.is_empty() && !c.contains(char::is_whitespace)));
});
