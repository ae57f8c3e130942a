//! What the offline watcher adds to its clock/utilization law: the online
//! page of its GPU, read every sample, and the [`OnlineBrake`] stepped once
//! per new window the page shows. The delay the gate applies is the larger
//! of the two laws': either sees a reason to brake, both must see room to
//! let go; while the clock law brakes, the online law does not grow
//! ([`OnlineBrake::admit`]). No page named (an older plugin, a GPU without an online job),
//! or one that fails its checks: the clock/utilization law alone, as before.

use std::path::PathBuf;
use std::time::Duration;

use muxflow::records::online_page::{self, Reading};

use crate::state::online::{OnlineBrake, OnlineParams};
use crate::state::queue::{self, BusyBound};
use crate::state::Settings;

pub struct OnlineGate {
    page: Option<PathBuf>,
    brake: OnlineBrake,
    /// With the bounded queue on: its busy bound, which replaces the
    /// per-launch delay of [`OnlineBrake`] (the queue holds the trainer off
    /// the online job's requests; delaying its launches between them too
    /// would only cost it speed).
    bound: Option<BusyBound>,
    last_window_at: u64,
    last_launches: Option<u64>,
    logged: bool,
}

impl OnlineGate {
    pub fn new(s: &Settings) -> OnlineGate {
        OnlineGate {
            page: s.env.online_page.clone(),
            brake: OnlineBrake::new(OnlineParams::from_env(&s.env)),
            bound: (s.env.queue_inflight > 0)
                .then(|| BusyBound::new(s.env.online_brake_deviation, s.env.queue_inflight)),
            last_window_at: 0,
            last_launches: None,
            logged: false,
        }
    }

    /// The delay to apply, given the clock/utilization law's.
    pub fn combine(&mut self, clock_delay: Duration) -> Duration {
        let Some(path) = self.page.as_deref() else {
            return clock_delay;
        };
        let reading = match online_page::read_trusted(path, 0) {
            Ok(rec) => {
                let r = rec.reading(online_page::now_ns(), self.last_launches);
                self.last_launches = Some(rec.launches);
                let new = rec.window_at_ns != self.last_window_at;
                self.last_window_at = rec.window_at_ns;
                self.brake.admit(r, new, !clock_delay.is_zero())
            }
            // Caught mid-write: nothing new, hold.
            Err(online_page::PageError::Torn { .. }) => None,
            Err(e) => {
                let absent = matches!(&e, online_page::PageError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound);
                if !absent && !std::mem::replace(&mut self.logged, true) {
                    crate::log(format_args!(
                        "{e}; braking on the clock and utilization only"
                    ));
                }
                self.last_launches = None;
                Some(Reading::Absent)
            }
        };
        if let Some(bound) = self.bound.as_mut() {
            let b = match reading {
                Some(r) => bound.step(r, queue::take_admitted_while_busy() > 0),
                None => bound.current(),
            };
            queue::set_busy_bound(b);
            return clock_delay;
        }
        let online = match reading {
            Some(r) => self.brake.step(r),
            None => self.brake.current(),
        };
        online.map_or(clock_delay, |d| d.max(clock_delay))
    }
}
