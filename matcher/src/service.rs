//! The matcher as a systemd service: `Type=notify` readiness (sd_notify's
//! datagram to `$NOTIFY_SOCKET`, no library needed) and SIGHUP to re-read
//! the config at the next round (`ExecReload=kill -HUP $MAINPID`).

use std::sync::atomic::{AtomicBool, Ordering};

static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sighup(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    RELOAD.store(true, Ordering::SeqCst);
}

/// Installs the SIGHUP handler.
pub fn watch_sighup() -> std::io::Result<()> {
    let handler: extern "C" fn(libc::c_int) = on_sighup;
    // SAFETY: a zeroed sigaction with a handler that only stores an atomic;
    // SA_RESTART keeps the matcher's own system calls unaffected.
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGHUP, &action, std::ptr::null_mut())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a reload is requested, without taking it.
pub fn reload_requested() -> bool {
    RELOAD.load(Ordering::SeqCst)
}

/// Whether a SIGHUP arrived since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// Tells systemd `state` (`READY=1`, `RELOADING=1`, `STATUS=…`) when run
/// as a `Type=notify` service; nothing otherwise. Failures are returned
/// for the caller to log: they never stop the matcher.
pub fn notify(state: &str) -> std::io::Result<()> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    let bytes = socket.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), std::path::Path::new(&socket))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sighup_sets_the_reload_flag_once() {
        watch_sighup().unwrap();
        assert!(!take_reload());
        // SAFETY: raising a signal this process handles.
        unsafe { libc::raise(libc::SIGHUP) };
        assert!(take_reload());
        assert!(!take_reload());
    }

    #[test]
    fn notify_sends_the_state_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        notify("READY=1").unwrap();
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        // Not a service: nothing to do.
        notify("READY=1").unwrap();
    }
}
