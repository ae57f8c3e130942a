//! The matcher's `/metrics` endpoint against clients that try to exhaust it
//! (issue 31, M5): a huge request head, hundreds of slow connections, a
//! pipelined flood left unread. Each runs against a real `muxflow-matcher`
//! (no Slurm: its rounds fail, logged, and go on) and reads the process's
//! own figures from `/proc`; a normal scrape must still answer within a
//! generous wait, and rounds must go on. No timing is asserted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a scrape may take to be answered (retrying while refused).
const GENEROUS: Duration = Duration::from_secs(120);

struct Matcher {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Matcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Matcher {
    /// A matcher looping every second, its endpoint on a free loopback port.
    fn start() -> Matcher {
        let dir = tempfile::tempdir().unwrap();
        // A free port: bound, noted, released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.path().join("muxflow.toml");
        std::fs::write(
            &config,
            format!(
                "[matcher]\ninterval_s = 1\n[slurm]\nscontrol = \"/nonexistent/scontrol\"\n\
                 [metrics]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_muxflow-matcher"))
            .arg("--config")
            .arg(&config)
            .arg("--dry-run")
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let m = Matcher {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
        };
        m.scrape_eventually();
        m
    }

    /// One `/proc/PID/status` figure (`VmHWM` in KiB, `Threads`).
    fn status(&self, key: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {status}"))
    }

    /// A normal scrape, retried while the endpoint refuses or is not up yet,
    /// until [`GENEROUS`] has passed; its body.
    fn scrape_eventually(&self) -> String {
        let start = Instant::now();
        loop {
            match scrape(self.addr) {
                Ok(body) => return body,
                Err(_) if start.elapsed() < GENEROUS => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("no answer from {} in {GENEROUS:?}: {e}", self.addr),
            }
        }
    }

    /// `muxflow_matcher_rounds_total` from a scrape.
    fn rounds(&self) -> u64 {
        let body = self.scrape_eventually();
        body.lines()
            .find_map(|l| l.strip_prefix("muxflow_matcher_rounds_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Waits (generously) for rounds after `after`: the server never holds
    /// the matcher's loop.
    fn rounds_go_on(&self, after: u64) {
        let start = Instant::now();
        while self.rounds() <= after {
            assert!(start.elapsed() < GENEROUS, "no round after {after}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// `GET /metrics` as Prometheus asks it; the body of a 200, else an error.
fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut conn = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(GENEROUS))
        .map_err(|e| e.to_string())?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: matcher\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut got = String::new();
    conn.read_to_string(&mut got).map_err(|e| e.to_string())?;
    if !got.starts_with("HTTP/1.1 200") {
        return Err(format!("answered {:?}", got.lines().next()));
    }
    got.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .ok_or_else(|| format!("no body in {got:?}"))
}

#[test]
fn an_oversized_request_head_is_refused_without_the_matcher_growing_by_it() {
    let m = Matcher::start();
    let before_kib = m.status("VmHWM");
    // 256 MiB of one header, in 1 MiB writes, until the server closes.
    let mut conn = TcpStream::connect(m.addr).unwrap();
    conn.set_write_timeout(Some(GENEROUS)).unwrap();
    conn.set_read_timeout(Some(GENEROUS)).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent_mib = 0;
    if conn
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: matcher\r\nX-Big: ")
        .is_ok()
    {
        while sent_mib < 256 && conn.write_all(&chunk).is_ok() {
            sent_mib += 1;
        }
        let _ = conn.write_all(b"\r\n\r\n");
    }
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got);
    let grown_mib = m.status("VmHWM").saturating_sub(before_kib) / 1024;
    eprintln!("oversized head: {sent_mib} MiB sent, peak RSS +{grown_mib} MiB");
    assert!(
        got.is_empty() || got.starts_with("HTTP/1.1 431"),
        "a {sent_mib} MiB head was answered {:?}",
        got.lines().next()
    );
    // Its peak memory did not take the header in, and it still serves.
    assert!(
        grown_mib < 32,
        "peak RSS grew by {grown_mib} MiB after {sent_mib} MiB of header"
    );
    let rounds = m.rounds();
    m.rounds_go_on(rounds);
}

#[test]
fn hundreds_of_slow_connections_start_no_threads_and_a_scrape_still_answers() {
    let m = Matcher::start();
    let threads_before = m.status("Threads");
    // Each starts a request head and never finishes it (the run's 300).
    let slow: Vec<TcpStream> = (0..300)
        .filter_map(|_| {
            let mut c = TcpStream::connect(m.addr).ok()?;
            let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: matcher\r\nX-Slow: ");
            Some(c)
        })
        .collect();
    let rounds = m.rounds();
    let threads = m.status("Threads");
    eprintln!(
        "{} slow connections: threads {threads_before} -> {threads}",
        slow.len()
    );
    assert!(
        threads <= threads_before + 4,
        "{} slow connections: {threads_before} threads became {threads}",
        slow.len()
    );
    m.rounds_go_on(rounds);
    drop(slow);
}

#[test]
fn a_pipelined_flood_left_unread_does_not_block_another_scraper() {
    let m = Matcher::start();
    let before_kib = m.status("VmHWM");
    let mut flood = TcpStream::connect(m.addr).unwrap();
    flood
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // 50,000 requests in one write, no response ever read. The write ends
    // when the kernel took it all or the server stopped reading (its
    // timeout): either way the server is now answering into a socket
    // nobody reads.
    let requests = b"GET /metrics HTTP/1.1\r\nHost: matcher\r\n\r\n".repeat(50_000);
    let writer = std::thread::spawn(move || {
        let _ = flood.write_all(&requests);
        flood
    });
    let flood = writer.join().unwrap();
    let rounds = m.rounds();
    m.rounds_go_on(rounds);
    let grown_mib = m.status("VmHWM").saturating_sub(before_kib) / 1024;
    eprintln!("pipelined flood: peak RSS +{grown_mib} MiB, a scrape answered");
    assert!(grown_mib < 32, "peak RSS grew by {grown_mib} MiB");
    drop(flood);
}
