//! The bounded offline queue's eyes (offline jobs with `queue_inflight` and
//! an online page): a thread that reads the page's busy line every
//! [`POLL`] and sets the queue's limit ([`crate::state::queue`]): the idle
//! bound while the online job is idle, the busy bound while it serves a
//! request. Reading the page costs one `pread` of 80 bytes; 10,000 a
//! second are about 0.5 % of one CPU core, the price of noticing a request
//! within a tenth of a millisecond (the watcher's 20-ms sample would let a
//! whole request pass unseen).
//!
//! The page is opened once after the same checks as the watcher's read
//! ([`online_page::open_trusted`]) and opened again when its record goes
//! stale (the plugin makes a new page for each online job): an unreadable,
//! missing or stale page says "idle", so the queue falls back to its idle
//! bound and never holds a trainer on a page nobody writes.

use std::path::Path;
use std::time::{Duration, Instant};

use muxflow::records::online_page;

use crate::state::{queue, Settings};

/// How often the busy line is read.
const POLL: Duration = Duration::from_micros(100);
/// How often a missing, untrusted or stale page is looked for again.
const REOPEN: Duration = Duration::from_millis(250);

pub fn spawn(s: &'static Settings) {
    let Some(path) = s.env.online_page.as_deref() else {
        return;
    };
    if let Err(e) = std::thread::Builder::new()
        .name("xcuda-queue".into())
        .spawn(move || run(path))
    {
        crate::log(format_args!(
            "cannot start the offline queue's poller ({e}); the queue keeps its idle bound"
        ));
    }
}

fn run(path: &'static Path) {
    super::shutdown::block_signals_in_this_thread();
    let mut page: Option<std::fs::File> = None;
    let mut looked = Instant::now() - REOPEN;
    let mut logged = false;
    loop {
        if page.is_none() && looked.elapsed() >= REOPEN {
            looked = Instant::now();
            match online_page::open_trusted(path, 0) {
                Ok(f) => page = Some(f),
                Err(e) => {
                    let absent = matches!(&e, online_page::PageError::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::NotFound);
                    if !absent && !std::mem::replace(&mut logged, true) {
                        crate::log(format_args!("{e}; the offline queue keeps its idle bound"));
                    }
                }
            }
        }
        let now = online_page::now_ns();
        let busy = match page.as_ref().map(|f| online_page::read_open(f, path)) {
            Some(Ok((rec, line))) => {
                if now.saturating_sub(rec.heartbeat_ns) > online_page::STALE_NS {
                    // Perhaps replaced by a new online job's page: look again.
                    page = None;
                }
                online_page::busy_at(&rec, line, now)
            }
            // Caught mid-write: as before.
            Some(Err(online_page::PageError::Torn { .. })) => continue_busy(),
            Some(Err(_)) => {
                page = None;
                false
            }
            None => false,
        };
        queue::set_online_busy(busy);
        // No page (no online job on the GPU): nothing to watch closely.
        std::thread::sleep(if page.is_some() { POLL } else { REOPEN });
    }
}

/// A torn read tells nothing new: keep the verdict as it is.
fn continue_busy() -> bool {
    queue::online_busy()
}
