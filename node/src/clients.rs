//! Which job each client of a GPU's MPS daemon belonged to, remembered by
//! root past the client's exit and its job's Epilog.
//!
//! NVIDIA's daemon names the client a `terminate_client` ended (a pid), never
//! who sent it, and any user who reaches the socket can send one. By the
//! time a health step reads the command, the client has usually exited and
//! its job's Epilog has forgotten the job: only what the police saw while
//! the client ran tells whose it was. Every police pass notes each client's
//! job and user in `gpu<i>/mps_clients` (root, rewritten whole); a note
//! stays [`KEEP_S`] after the client was last seen.

use std::collections::BTreeMap;

use muxflow::node::state::NodeState;

/// How long a client's note outlives its last sighting.
pub const KEEP_S: u64 = 600;

/// A sighting is written again only once this old (a pass every second
/// must not rewrite the file every second).
const REFRESH_S: u64 = 60;

/// Whose a client was: its job (None: of no job) and its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub job: Option<u32>,
    pub uid: Option<u32>,
}

/// pid -> (owner, last seen, unix seconds).
type Notes = BTreeMap<u32, (Owner, u64)>;

fn path(ns: &NodeState, gpu: u32) -> std::path::PathBuf {
    ns.gpu_dir(gpu).join("mps_clients")
}

fn parse(text: &str) -> Notes {
    let mut notes = Notes::new();
    for line in text.lines() {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse::<u32>().ok())
        };
        let seen = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("seen="))
            .and_then(|v| v.parse::<u64>().ok());
        if let (Some(pid), Some(seen)) = (field("pid"), seen) {
            let owner = Owner {
                job: field("job"),
                uid: field("uid"),
            };
            notes.insert(pid, (owner, seen));
        }
    }
    notes
}

fn encode(notes: &Notes) -> String {
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    notes
        .iter()
        .map(|(pid, (o, seen))| {
            format!(
                "pid={pid} job={} uid={} seen={seen}\n",
                opt(o.job),
                opt(o.uid)
            )
        })
        .collect()
}

/// `notes` with the clients seen `now` noted, and those unseen for
/// [`KEEP_S`] dropped; whether anything worth writing changed.
fn merge(notes: &mut Notes, seen: &[(u32, Owner)], now: u64) -> bool {
    let mut changed = false;
    for (pid, owner) in seen {
        match notes.get(pid) {
            Some((o, at)) if o == owner && now.saturating_sub(*at) < REFRESH_S => {}
            _ => {
                notes.insert(*pid, (*owner, now));
                changed = true;
            }
        }
    }
    let before = notes.len();
    notes.retain(|_, (_, at)| now.saturating_sub(*at) <= KEEP_S);
    changed || notes.len() != before
}

/// Notes the GPU's MPS clients seen now. The caller holds the GPU's lock.
/// A failure is logged: attribution then falls back to the live process.
pub fn remember(ns: &NodeState, gpu: u32, seen: &[(u32, Owner)], now: u64) {
    let path = path(ns, gpu);
    let mut notes = std::fs::read_to_string(&path)
        .map(|t| parse(&t))
        .unwrap_or_default();
    if merge(&mut notes, seen, now) {
        if let Err(e) = muxflow::node::state::write_atomic(&path, encode(&notes).as_bytes()) {
            tracing::warn!(gpu, "cannot note the GPU's MPS clients: {e}");
        }
    }
}

/// Whose client `pid` of GPU `gpu` was, as last noted.
pub fn recall(ns: &NodeState, gpu: u32, pid: u32) -> Option<Owner> {
    let text = std::fs::read_to_string(path(ns, gpu)).ok()?;
    parse(&text).get(&pid).map(|(o, _)| *o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_remembered_past_its_exit_for_a_while() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = NodeState::new(tmp.path());
        std::fs::create_dir_all(ns.gpu_dir(0)).unwrap();
        let b = Owner {
            job: Some(12),
            uid: Some(1002),
        };
        let stray = Owner {
            job: None,
            uid: Some(1003),
        };
        remember(&ns, 0, &[(100, b), (101, stray)], 1000);
        // (what, pid, when asked, owner)
        let rows = [
            ("a client seen now", 100, 1000, Some(b)),
            ("a client of no job", 101, 1000, Some(stray)),
            ("a pid never seen", 102, 1000, None),
            ("gone, still within the keep", 100, 1000 + KEEP_S, Some(b)),
            ("gone past the keep", 100, 1001 + KEEP_S, None),
        ];
        for (what, pid, now, owner) in rows {
            // Another pass at `now` with neither client listed any more.
            remember(&ns, 0, &[], now);
            assert_eq!(recall(&ns, 0, pid), owner, "{what}");
        }
        // The text the file keeps reads back as written.
        let mut notes = Notes::new();
        assert!(merge(&mut notes, &[(7, b)], 5));
        assert!(
            !merge(&mut notes, &[(7, b)], 6),
            "seen again soon: no write"
        );
        assert_eq!(parse(&encode(&notes)), notes);
    }
}
