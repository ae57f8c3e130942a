//! LD_PRELOAD for offline tasks: xCUDA first, exactly once.

use std::path::Path;

/// `current` with `lib` in front: entries split on ':' and spaces (as ld.so
/// does), any other copy of the same library (same path, or same file name:
/// a user's own build of the shim) dropped, order otherwise kept. Nested
/// steps inherit the variable, so this must be idempotent.
pub fn prepend(lib: &Path, current: Option<&str>) -> String {
    let lib_str = lib.to_string_lossy();
    let name = lib.file_name();
    let mut out = vec![lib_str.to_string()];
    for entry in current
        .unwrap_or("")
        .split([':', ' '])
        .filter(|e| !e.is_empty())
    {
        let same =
            Path::new(entry) == lib || (name.is_some() && Path::new(entry).file_name() == name);
        if !same && !out.iter().any(|o| o == entry) {
            out.push(entry.to_string());
        }
    }
    out.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "/usr/lib/muxflow/libmuxflow_xcuda.so";

    #[test]
    fn table() {
        let cases: &[(Option<&str>, &str)] = &[
            (None, LIB),
            (Some(""), LIB),
            (
                Some("/opt/a.so"),
                "/usr/lib/muxflow/libmuxflow_xcuda.so:/opt/a.so",
            ),
            (
                Some("/opt/a.so /opt/b.so"),
                "/usr/lib/muxflow/libmuxflow_xcuda.so:/opt/a.so:/opt/b.so",
            ),
            (Some(LIB), LIB),
            (
                Some("/usr/lib/muxflow/libmuxflow_xcuda.so:/opt/a.so"),
                "/usr/lib/muxflow/libmuxflow_xcuda.so:/opt/a.so",
            ),
            (
                Some("/opt/a.so:/home/u/libmuxflow_xcuda.so::/opt/a.so"),
                "/usr/lib/muxflow/libmuxflow_xcuda.so:/opt/a.so",
            ),
        ];
        for (current, want) in cases {
            assert_eq!(prepend(Path::new(LIB), *current), *want, "{current:?}");
        }
    }

    #[test]
    fn idempotent() {
        let once = prepend(Path::new(LIB), Some("/opt/a.so"));
        assert_eq!(prepend(Path::new(LIB), Some(&once)), once);
    }
}
