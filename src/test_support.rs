//! Helpers for muxflow's own tests (unit and dev-cluster); not an API.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Writes `text` to `path` as an executable (mode 755) that is safe to run at
/// once from a multi-threaded test.
///
/// Written with `std::fs::write`, the file's write descriptor lives in this
/// process for a moment; a test on another thread that forks then hands a
/// copy to its child until that child execs, and running the script in that
/// window fails with ETXTBSY ("Text file busy"). A `sh` child writes the
/// file instead, so no descriptor of it ever exists here.
pub fn write_executable(path: &Path, text: &str) {
    let mut writer = Command::new("/bin/sh")
        .args(["-c", r#"cat > "$1" && chmod 755 "$1""#, "sh"])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start /bin/sh to write {}: {e}", path.display()));
    writer
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    let status = writer.wait().unwrap();
    assert!(
        status.success(),
        "writing {} failed: {status}",
        path.display()
    );
}
