//! Xid records in the kernel log. The NVIDIA driver logs every Xid there
//! (`NVRM: Xid (PCI:0000:18:00): 31, pid=…`), while an NVML event reaches
//! only a program registered at that moment; reading the log from a cursor
//! lets each node program see the Xids since the previous one ran.
//!
//! The log is `/dev/kmsg` (one `prio,seq,usec,flags;text` record per read,
//! EAGAIN at the end) or a regular file of such lines (the simulated GPU's).
//!
//! **What counts as an Xid.** Any user can make the kernel log text of their
//! choosing: in a user namespace, `mount -t tmpfs -o '<text>'` logs
//! `tmpfs: Unknown parameter '<text>'`, with the kernel's own facility. An
//! Xid is therefore only a record of the kernel facility (userspace
//! writers of `/dev/kmsg` never get it) whose text the NVIDIA module itself
//! began with `NVRM: Xid (PCI:<address>): <n>`; the marker anywhere else in
//! a record is someone's echo.
//! The cursor (boot id + next sequence number) lives in the node's state
//! directory, taken and advanced under the node lock so two concurrent runs
//! never act on the same record twice.

use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use muxflow::node::state::{write_atomic, NodeState, StateError};
use serde::{Deserialize, Serialize};

/// A PCI location: (domain, bus, device).
pub type Pci = (u32, u32, u32);

/// One Xid the driver logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelXid {
    pub seq: u64,
    pub pci: Pci,
    pub xid: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    #[error("reading the kernel log {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] StateError),
}

/// Where reading resumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// `/proc/sys/kernel/random/boot_id` when written: sequence numbers
    /// restart at every boot.
    pub boot_id: String,
    /// The first sequence number not yet looked at.
    pub next: u64,
}

/// One record of the kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    /// The syslog facility (the record's priority over 8): 0 only for the
    /// kernel's own messages.
    pub facility: u32,
    pub text: String,
}

/// The syslog facility of the kernel's own messages.
const KERNEL_FACILITY: u32 = 0;

/// `prio,seq,usec,flags;text` -> the record. Continuation lines (a leading
/// space: the record's key=value dictionary) and other text give None.
pub fn parse_record(line: &str) -> Option<Record> {
    let (head, text) = line.split_once(';')?;
    let mut fields = head.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    Some(Record {
        seq,
        facility: prio >> 3,
        text: text.trim_end().to_string(),
    })
}

/// The Xid `record` reports, if it is one the driver logged: of the kernel
/// facility, its text starting with the driver's marker ([`parse_xid`]).
pub fn record_xid(record: &Record) -> Option<(Pci, u64)> {
    (record.facility == KERNEL_FACILITY)
        .then(|| parse_xid(&record.text))
        .flatten()
}

/// `NVRM: Xid (PCI:0000:18:00): 31, pid=…` -> ((0, 0x18, 0), 31), only
/// where the text starts so (the module's own line, not an echo of it).
pub fn parse_xid(text: &str) -> Option<(Pci, u64)> {
    let rest = text.strip_prefix("NVRM: Xid (PCI:")?;
    let (addr, rest) = rest.split_once("): ")?;
    let mut parts = addr.split(':').map(|p| u32::from_str_radix(p, 16).ok());
    let pci = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(Some(d)), Some(Some(b)), Some(Some(dev)), None) => (d, b, dev),
        // Older drivers leave the domain out: `PCI:18:00`.
        (Some(Some(b)), Some(Some(dev)), None, None) => (0, b, dev),
        _ => return None,
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((pci, digits.parse().ok()?))
}

/// Every record in the log, oldest first.
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut records = Vec::new();
    if f.metadata()?.file_type().is_char_device() {
        // /dev/kmsg: one record per read; EPIPE when the ring buffer
        // overwrote the next record (reading goes on at the oldest left).
        let mut buf = vec![0u8; 8192];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    if let Some(r) = text.lines().next().and_then(parse_record) {
                        records.push(r);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::BrokenPipe => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    } else {
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        records.extend(text.lines().filter_map(parse_record));
    }
    Ok(records)
}

/// The records after `cursor`, and the cursor to store. Without a cursor
/// (first run on this node) the log's history is skipped: old Xids were
/// handled, or not, before muxflow was installed. A new boot, or a log that
/// restarted below the cursor, is read from its start.
pub fn select_new(
    records: &[Record],
    cursor: Option<&Cursor>,
    boot_id: &str,
) -> (Vec<KernelXid>, Cursor) {
    let last = records.iter().map(|r| r.seq).max();
    let next_after = last.map_or(0, |l| l + 1);
    let from = match cursor {
        None => next_after,
        Some(c) if c.boot_id != boot_id => 0,
        Some(c) if next_after < c.next => 0,
        Some(c) => c.next,
    };
    let xids = records
        .iter()
        .filter(|r| r.seq >= from)
        .filter_map(|r| {
            record_xid(r).map(|(pci, xid)| KernelXid {
                seq: r.seq,
                pci,
                xid,
            })
        })
        .collect();
    let next = match cursor {
        Some(c) if records.is_empty() && c.boot_id == boot_id => c.next,
        _ => next_after,
    };
    (
        xids,
        Cursor {
            boot_id: boot_id.to_string(),
            next,
        },
    )
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn cursor_path(ns: &NodeState) -> PathBuf {
    ns.dir().join("kernel-log-cursor.json")
}

/// The Xids logged since the previous run on this node; advances the cursor.
pub fn new_xids(ns: &NodeState, log: &Path) -> Result<Vec<KernelXid>, KmsgError> {
    let _lock = ns.lock_node()?;
    let records = match read_records(log) {
        Ok(r) => r,
        // Not written yet (a log file created at its first record): empty,
        // so the cursor starts at its beginning and the first Xid counts.
        Err(e) if e.kind() == ErrorKind::NotFound && log.parent().is_some_and(Path::is_dir) => {
            Vec::new()
        }
        Err(source) => {
            return Err(KmsgError::Read {
                path: log.to_path_buf(),
                source,
            })
        }
    };
    let path = cursor_path(ns);
    let cursor = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Cursor>(&b).ok());
    let (xids, next) = select_new(&records, cursor.as_ref(), &boot_id());
    if cursor.as_ref() != Some(&next) {
        let bytes = serde_json::to_vec(&next).expect("cursor serializes");
        if let Err(e) = write_atomic(&path, &bytes) {
            // A full state directory: acting on these Xids twice beats missing them.
            tracing::error!(
                "cannot save the kernel log cursor: {e}; these Xids may count again next step"
            );
        }
    }
    Ok(xids)
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = "NVRM: Xid (PCI:0000:3b:00): 31, pid=10553, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_d9000000.";
    const LOST: &str =
        "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.";

    #[test]
    fn parses_driver_xid_lines() {
        assert_eq!(parse_xid(APP), Some(((0, 0x3b, 0), 31)));
        assert_eq!(parse_xid(LOST), Some(((0, 0x9a, 0), 79)));
        assert_eq!(
            parse_xid("NVRM: Xid (PCI:18:00): 48, An uncorrectable double bit error"),
            Some(((0, 0x18, 0), 48))
        );
        for other in [
            "NVRM: GPU at PCI:0000:3b:00: GPU-1234",
            "NVRM: Xid (PCI:zz:00): 31, x",
            "NVRM: Xid (PCI:0000:3b:00): , pid=1",
            "usb 1-1: new high-speed USB device",
        ] {
            assert_eq!(parse_xid(other), None, "{other}");
        }
    }

    #[test]
    fn only_the_drivers_own_records_are_xids() {
        // (name, record as /dev/kmsg gives it, an Xid?)
        let rows = [
            ("the driver's", format!("3,10,1,-;{LOST}"), true),
            (
                "the driver's, another level",
                format!("4,11,1,-;{APP}"),
                true,
            ),
            (
                "echoed by tmpfs from a user namespace's mount option",
                "3,12,1,-;tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:9a:00): 79'".into(),
                false,
            ),
            (
                "a process named like the marker (15 characters, the most a name holds)",
                "6,13,1,-;NVRM: Xid (PCI:[4242]: segfault at 0 ip 0 sp 0 error 4".into(),
                false,
            ),
            (
                "written to /dev/kmsg from userspace (never the kernel facility)",
                format!("11,14,1,-;{LOST}"),
                false,
            ),
            (
                "syslog's daemon facility",
                format!("27,15,1,-;{LOST}"),
                false,
            ),
            ("after a leading space", format!("3,16,1,-; {LOST}"), false),
        ];
        for (name, line, xid) in rows {
            let record = parse_record(&line).unwrap();
            assert_eq!(record_xid(&record).is_some(), xid, "{name}");
        }
    }

    #[test]
    fn parses_kmsg_records() {
        assert_eq!(
            parse_record(&format!("3,1042,8123456789,-;{APP}")),
            Some(Record {
                seq: 1042,
                facility: 0,
                text: APP.into()
            })
        );
        assert_eq!(parse_record("14,7,1,-;x").unwrap().facility, 1);
        assert_eq!(parse_record(" DEVICE=+pci:0000:3b:00.0"), None);
        assert_eq!(parse_record("garbage"), None);
    }

    #[test]
    fn reads_this_machines_kernel_log_when_allowed() {
        // /dev/kmsg needs root (or CAP_SYSLOG), and a container may lack it
        // or put another device there (char 1:11 is the kernel's): then
        // there is nothing to check here.
        use std::os::unix::fs::MetadataExt;
        let kmsg = Path::new("/dev/kmsg");
        let real = std::fs::metadata(kmsg).is_ok_and(|m| m.rdev() == libc::makedev(1, 11));
        let Ok(records) = read_records(kmsg) else {
            return;
        };
        if !real {
            return;
        }
        assert!(!records.is_empty(), "a booted kernel has logged something");
        assert!(
            records.windows(2).all(|w| w[0].seq < w[1].seq),
            "sequence numbers increase"
        );
    }

    fn recs(list: &[(u64, &str)]) -> Vec<Record> {
        list.iter()
            .map(|(s, t)| Record {
                seq: *s,
                facility: KERNEL_FACILITY,
                text: t.to_string(),
            })
            .collect()
    }

    #[test]
    fn cursor_skips_history_then_reads_only_new_records() {
        let log = recs(&[(7, APP), (8, "other")]);
        let (xids, c) = select_new(&log, None, "boot-a");
        assert!(xids.is_empty(), "history before the first run is skipped");
        assert_eq!(c.next, 9);

        let log = recs(&[(7, APP), (8, "other"), (9, LOST), (10, APP)]);
        let (xids, c2) = select_new(&log, Some(&c), "boot-a");
        assert_eq!(
            xids.iter().map(|x| (x.seq, x.xid)).collect::<Vec<_>>(),
            vec![(9, 79), (10, 31)]
        );
        assert_eq!(c2.next, 11);

        let (xids, c3) = select_new(&log, Some(&c2), "boot-a");
        assert!(xids.is_empty(), "nothing twice");
        assert_eq!(c3, c2);
    }

    #[test]
    fn new_boot_or_restarted_log_reads_from_the_start() {
        let c = Cursor {
            boot_id: "boot-a".into(),
            next: 500,
        };
        let log = recs(&[(0, "Linux version"), (3, APP)]);
        let (xids, c2) = select_new(&log, Some(&c), "boot-b");
        assert_eq!(xids.len(), 1, "a new boot");
        assert_eq!(c2.next, 4);
        let (xids, _) = select_new(&log, Some(&c), "boot-a");
        assert_eq!(
            xids.len(),
            1,
            "sequence below the cursor: the log restarted"
        );
        // An empty log keeps the cursor.
        let (xids, c3) = select_new(&[], Some(&c), "boot-a");
        assert!(xids.is_empty());
        assert_eq!(c3, c);
    }

    #[test]
    fn file_log_round_trip_through_the_state_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let log = dir.join("kmsg");
        std::fs::write(&log, format!("6,0,1,-;boot\n3,1,2,-;{APP}\n")).unwrap();
        let ns = NodeState::new(dir.join("state"));
        assert!(new_xids(&ns, &log).unwrap().is_empty(), "first run");
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str(&format!("3,2,3,-;{LOST}\n"));
        std::fs::write(&log, text).unwrap();
        let got = new_xids(&ns, &log).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].pci, got[0].xid), ((0, 0x9a, 0), 79));
        assert!(new_xids(&ns, &log).unwrap().is_empty());
        assert!(matches!(
            new_xids(&ns, &dir.join("missing/kmsg")),
            Err(KmsgError::Read { .. })
        ));
    }

    #[test]
    fn a_log_not_yet_written_counts_from_its_first_record() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("kmsg");
        let ns = NodeState::new(tmp.path().join("state"));
        assert!(new_xids(&ns, &log).unwrap().is_empty());
        std::fs::write(&log, format!("3,0,2,-;{APP}\n")).unwrap();
        let got = new_xids(&ns, &log).unwrap();
        assert_eq!(got.iter().map(|x| x.xid).collect::<Vec<_>>(), [31]);
    }
}
