//! MPS static SM partitions (opt-in, `[mps] sm_partitions = true`): the
//! driver holds each job to its partition's SMs, whatever the job's own
//! environment says.
//!
//! What NVIDIA documents (MPS docs, Legacy MPS v2 Interface; CUDA 13.1,
//! control daemon 13010+, Ampere and newer): the daemon is started with
//! `-S` (`--static-partitioning`), which cannot be turned on later;
//! `sm_partition add <device UUID> <number of chunks>` creates a partition,
//! `sm_partition rm <device UUID> <partition>` removes one, `lspart` lists
//! them; a client binds with `CUDA_MPS_SM_PARTITION=<partition id>`;
//! partitions are exclusive ("other clients cannot automatically borrow
//! idle SMs"). The unit is a chunk of SMs whose size depends on the
//! architecture. What users report and NVIDIA's pages do not state (so the
//! parsers below accept a little more than one spelling): `add` prints
//! `Partition <uuid>/<opaque> created`; `lspart` prints per device a line
//! `<uuid> free chunks F, used chunks U, free SM FS, used SM US`; in `-S`
//! mode a client without a partition fails
//! (`CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION`), so every client of such a
//! daemon, online jobs included, gets one.
//!
//! Planning here is pure (table-tested); `crate::node::mps` sends the commands.

/// The client's variable naming its partition.
pub const ENV: &str = "CUDA_MPS_SM_PARTITION";
/// The daemon's flag for static partitioning mode.
pub const STATIC_FLAG: &str = "-S";
/// The long spelling NVIDIA documents too.
pub const STATIC_FLAG_LONG: &str = "--static-partitioning";
/// The lowest control daemon version with static partitioning (CUDA 13.1).
pub const MIN_VERSION: u32 = 13010;

/// One device's chunks as `lspart` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    pub free: u32,
    pub used: u32,
    /// SMs in one chunk (from the SM figures of the same line), if given.
    pub sm_per_chunk: Option<u32>,
}

impl Chunks {
    pub fn total(&self) -> u32 {
        self.free + self.used
    }
}

/// The id in `sm_partition add`'s reply (`Partition <id> created`); None
/// when the daemon said anything else (its words are the error).
pub fn parse_created(reply: &str) -> Option<String> {
    reply.lines().find_map(|l| {
        let id = l
            .trim()
            .strip_prefix("Partition ")?
            .strip_suffix(" created")?;
        (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_string())
    })
}

/// `uuid`'s chunks in `lspart`'s text: the line that starts with the
/// device's UUID and names `free chunks` and `used chunks`.
pub fn parse_lspart(text: &str, uuid: &str) -> Option<Chunks> {
    let line = text.lines().find(|l| {
        let first = l.split_whitespace().next().unwrap_or("");
        first == uuid && l.contains("free chunks")
    })?;
    let after = |key: &str| -> Option<u32> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let (free, used) = (after("free chunks")?, after("used chunks")?);
    let sms = after("free SM")
        .zip(after("used SM"))
        .map(|(f, u)| f + u)
        .filter(|_| free + used > 0);
    Some(Chunks {
        free,
        used,
        sm_per_chunk: sms.map(|s| s / (free + used)),
    })
}

/// Chunks for a share of `pct` percent of a device's `total`: rounded down
/// (a partition never exceeds its share), at least 1, and leaving at least
/// one chunk for the rest of the device.
pub fn chunks_for(total: u32, pct: u8) -> u32 {
    let want = (u64::from(total) * u64::from(pct.min(100)) / 100) as u32;
    want.max(1).min(total.saturating_sub(1)).max(1)
}

/// What a job gets on a device with `chunks` as `lspart` shows them now.
/// An online job takes every free chunk but those kept for the offline
/// side (`offline_pct`, the policy's share before the online job is
/// measured); an offline job its policy share `offline_pct`, within what
/// is free. None when nothing is free for it.
pub fn plan(online: bool, chunks: Chunks, offline_pct: u8) -> Option<u32> {
    let total = chunks.total();
    let offline = chunks_for(total, offline_pct);
    let want = if online {
        total.saturating_sub(offline)
    } else {
        offline
    };
    let got = want.min(chunks.free);
    (got > 0).then_some(got)
}

/// The SM percentage a partition of `chunks` of `total` is (what the
/// driver holds the job to), at least 1.
pub fn percent_of(chunks: u32, total: u32) -> u8 {
    if total == 0 {
        return 100;
    }
    ((u64::from(chunks) * 100 / u64::from(total)) as u8).clamp(1, 100)
}

/// A job's partition as the Prolog recorded it (`<gpu dir>/partitions/<job>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The GPU's UUID, as the partition commands name it.
    pub uuid: String,
    pub id: String,
    pub chunks: u32,
    pub total_chunks: u32,
}

impl Record {
    pub fn encode(&self) -> String {
        format!(
            "uuid={}\nid={}\nchunks={}\ntotal_chunks={}\n",
            self.uuid, self.id, self.chunks, self.total_chunks
        )
    }

    pub fn decode(text: &str) -> Option<Record> {
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(str::trim)
        };
        let word = |k: &str| {
            get(k)
                .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
                .map(str::to_string)
        };
        Some(Record {
            uuid: word("uuid")?,
            id: word("id")?,
            chunks: get("chunks")?.parse().ok()?,
            total_chunks: get("total_chunks")?.parse().ok()?,
        })
    }

    /// The SM percentage the partition is of its device.
    pub fn percent(&self) -> u8 {
        percent_of(self.chunks, self.total_chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_the_daemon_prints_them() {
        let uuid = "GPU-f6b31fa7-854b-4642-d739-82eec1c300db";
        assert_eq!(
            parse_created(&format!("Partition {uuid}/AbC+9= created\n")).as_deref(),
            Some(format!("{uuid}/AbC+9=").as_str())
        );
        for bad in ["Failed to create partition\n", "", "Partition  created\n"] {
            assert_eq!(parse_created(bad), None, "{bad:?}");
        }
        let text = format!(
            "{uuid} free chunks 15, used chunks 18, free SM 60, used SM 72\npartition {uuid}/p1: 9 chunks, 36 SM\n"
        );
        assert_eq!(
            parse_lspart(&text, uuid),
            Some(Chunks {
                free: 15,
                used: 18,
                sm_per_chunk: Some(4)
            })
        );
        assert_eq!(parse_lspart(&text, "GPU-other"), None);
        assert_eq!(
            parse_lspart(&format!("{uuid} free chunks 2, used chunks 0\n"), uuid),
            Some(Chunks {
                free: 2,
                used: 0,
                sm_per_chunk: None
            })
        );
    }

    #[test]
    fn jobs_get_their_share_in_whole_chunks_within_what_is_free() {
        let c = |free, used| Chunks {
            free,
            used,
            sm_per_chunk: Some(4),
        };
        // (case, online?, chunks now, offline share %, chunks planned)
        let cases = [
            (
                "online on an empty H100 (33 chunks), 30% kept",
                true,
                c(33, 0),
                30,
                Some(24),
            ),
            ("offline beside it", false, c(9, 24), 30, Some(9)),
            (
                "offline share above what is free",
                false,
                c(4, 29),
                30,
                Some(4),
            ),
            ("nothing free", false, c(0, 33), 30, None),
            (
                "offline on an idle GPU: its share (80% ceiling)",
                false,
                c(33, 0),
                80,
                Some(26),
            ),
            (
                "a tiny share still gets a chunk",
                false,
                c(33, 0),
                1,
                Some(1),
            ),
            (
                "a share of 100% leaves one chunk",
                false,
                c(33, 0),
                100,
                Some(32),
            ),
            (
                "online when offline partitions remain",
                true,
                c(5, 28),
                30,
                Some(5),
            ),
        ];
        for (case, online, chunks, pct, want) in cases {
            assert_eq!(plan(online, chunks, pct), want, "{case}");
        }
        assert_eq!(percent_of(9, 33), 27);
        assert_eq!(percent_of(0, 33), 1);
    }

    #[test]
    fn records_round_trip_and_refuse_what_they_cannot_read() {
        let r = Record {
            uuid: "GPU-1".into(),
            id: "GPU-1/p3".into(),
            chunks: 9,
            total_chunks: 33,
        };
        assert_eq!(Record::decode(&r.encode()), Some(r.clone()));
        assert_eq!(r.percent(), 27);
        assert_eq!(
            Record::decode("uuid=G\nid=a b\nchunks=1\ntotal_chunks=2\n"),
            None
        );
        assert_eq!(
            Record::decode("uuid=G\nid=x\nchunks=one\ntotal_chunks=2\n"),
            None
        );
        assert_eq!(
            Record::decode("id=x\nchunks=1\ntotal_chunks=2\n"),
            None,
            "no uuid"
        );
    }
}
