//! Counting mode's one thread (online jobs): every sample interval it takes
//! the launch count and the busy periods timed on the launch and
//! synchronize paths ([`crate::state::online`]), closes a window when it is
//! full ([`Estimator`]) and writes the GPU's online page with one `pwrite`.
//! The page file is opened once; if it cannot be (no page named, a missing
//! or foreign file) the thread logs once and stops: the online job runs on,
//! unmeasured, and the offline gates fall back to their clock and
//! utilization triggers. Nothing here can block or fail a launch.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Duration;

use muxflow::records::online_page::{self, Estimator, Record};

use crate::state::{self, online, Settings};

pub fn spawn(s: &'static Settings) {
    if let Err(e) = std::thread::Builder::new()
        .name("xcuda-count".into())
        .spawn(move || run(s))
    {
        crate::log(format_args!(
            "cannot start the online counter ({e}); the online job is not measured"
        ));
    }
}

fn run(s: &'static Settings) {
    super::shutdown::block_signals_in_this_thread();
    let Some(path) = s.env.online_page.as_deref() else {
        crate::log(format_args!(
            "counting mode without an online page: the online job is not measured"
        ));
        return;
    };
    let page = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        // From now on the busy transitions write its busy line too.
        Ok(f) => online::set_page(f),
        Err(e) => {
            crate::log(format_args!(
                "online page {}: {e}; the online job is not measured",
                path.display()
            ));
            return;
        }
    };
    let interval = Duration::from_millis(s.env.sample_interval_ms);
    let mut est = Estimator::default();
    let mut rec = Record::default();
    let (mut seen, mut periods) = (0u64, Vec::new());
    let mut logged = false;
    loop {
        std::thread::sleep(interval);
        let launches = state::gate().counts().launches;
        online::periods_since(&mut seen, &mut periods);
        let now = online_page::now_ns();
        let window = est.feed(now, &periods);
        rec.seq += 1;
        rec.heartbeat_ns = now;
        rec.launches = launches;
        if let Some((at, w, b)) = window {
            (
                rec.window_at_ns,
                rec.window_ns_per_launch,
                rec.baseline_ns_per_launch,
            ) = (at, w, b);
        }
        if let Err(e) = page.write_all_at(&rec.encode(), 0) {
            if !std::mem::replace(&mut logged, true) {
                crate::log(format_args!("online page {}: {e}", path.display()));
            }
        }
    }
}
