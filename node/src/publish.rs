//! Publishing the node's GPU states to slurmctld, and the GPU-lost drain.
//!
//! The text ([`muxflow::records::published::encode`]) goes into the node's `Extra`
//! field with `scontrol update NodeName=… Extra=…` (Slurm 22.05 and 24.11
//! accept it, the matcher reads it back as `extra`, and `scontrol
//! reconfigure` keeps it). It is sent only when it changed or is older than
//! `health.publish_refresh_s`; a health check also reads the field back and
//! re-asserts it if slurmctld lost it. The last text sent is kept in
//! `<state_dir>/node.json`, under `<state_dir>/node.lock`.
//!
//! Two layers: [`plan`] decides, from the node's record and what slurmctld
//! showed, which updates to send (pure, table-tested); [`publish`] reads
//! what the plan [`needs`], applies the updates with the one Slurm client
//! ([`muxflow_slurm::cli::SlurmClient`], timeouts included) and keeps the
//! record.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use muxflow::node::mps::MpsDaemon;
use muxflow::node::state::{write_atomic, NodeState};
use muxflow::records::published::{encode, GpuPublished};
use muxflow::Config;
use muxflow_slurm::cli::SlurmClient;
use serde::{Deserialize, Serialize};

use crate::record::{load_record, space_note, GpuRecord, Trigger};

/// Prefix of every drain reason muxflow sets; only such drains are undone.
pub const DRAIN_PREFIX: &str = "muxflow:";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub published: Option<String>,
    pub published_at_s: u64,
    /// This node was drained by muxflow (a GPU was lost).
    pub drained: bool,
    pub publish_failures: u64,
}

fn node_path(ns: &NodeState) -> PathBuf {
    ns.dir().join("node.json")
}

pub fn load_node(ns: &NodeState) -> anyhow::Result<NodeRecord> {
    match std::fs::read(node_path(ns)) {
        Ok(b) => Ok(serde_json::from_slice(&b).unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NodeRecord::default()),
        Err(e) => Err(e).context("reading node.json"),
    }
}

/// What one step has to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<'a> {
    pub rec: &'a NodeRecord,
    /// The encoded GPU states.
    pub text: &'a str,
    /// Lost GPUs.
    pub lost: &'a [u32],
    pub trigger: Trigger,
    pub now_s: u64,
    pub refresh_s: u64,
}

impl Step<'_> {
    /// muxflow drains for a lost GPU itself, unless run as an NHC check
    /// (`--report`), which leaves the drain, with its own reason, to NHC.
    fn drains(&self) -> bool {
        self.trigger != Trigger::HealthReport
    }
}

/// Node fields the plan needs read from slurmctld first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `Extra`: a health check re-asserts a text slurmctld lost.
    Extra,
    /// The drain `Reason`: someone else's drain is never touched.
    Reason,
}

impl Field {
    pub fn name(self) -> &'static str {
        match self {
            Field::Extra => "Extra",
            Field::Reason => "Reason",
        }
    }
}

/// What slurmctld showed of the fields [`needs`] named (None: not read, or
/// the read failed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    pub extra: Option<String>,
    pub reason: Option<String>,
}

/// One update to send, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// `Extra=<text>`.
    Publish(String),
    /// `State=DRAIN Reason=<reason>`.
    Drain(String),
    /// `State=RESUME`: muxflow's own drain undone.
    Resume,
}

impl Update {
    /// The `scontrol update NodeName=…` fields.
    pub fn fields(&self) -> Vec<String> {
        match self {
            Update::Publish(text) => vec![format!("Extra={text}")],
            Update::Drain(reason) => vec!["State=DRAIN".into(), format!("Reason={reason}")],
            Update::Resume => vec!["State=RESUME".into()],
        }
    }
}

/// What a step sends, and what it only logs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub updates: Vec<Update>,
    /// The drain/resume decision was left to another's drain: forget
    /// muxflow's (`drained` false) without touching the node.
    pub forget_drain: bool,
    /// Lines to log (someone else's drain left alone …).
    pub notes: Vec<String>,
}

fn changed_or_stale(s: &Step) -> bool {
    s.rec.published.as_deref() != Some(s.text)
        || s.now_s.saturating_sub(s.rec.published_at_s) >= s.refresh_s
}

/// The fields [`plan`] needs read first: Extra when a health check would
/// otherwise send nothing; the drain Reason when a drain or resume is due.
pub fn needs(s: &Step) -> Vec<Field> {
    let mut fields = Vec::new();
    if !changed_or_stale(s) && s.trigger.is_health_check() {
        fields.push(Field::Extra);
    }
    let due = (!s.lost.is_empty() && !s.rec.drained) || (s.lost.is_empty() && s.rec.drained);
    if due && s.drains() {
        fields.push(Field::Reason);
    }
    fields
}

/// The updates one step sends (pure).
pub fn plan(s: &Step, seen: &Seen) -> Plan {
    let mut p = Plan::default();
    let readback_differs =
        s.trigger.is_health_check() && seen.extra.as_deref().is_some_and(|e| e.trim() != s.text);
    if changed_or_stale(s) || readback_differs {
        p.updates.push(Update::Publish(s.text.to_string()));
    }
    if !s.drains() {
        return p;
    }
    if !s.lost.is_empty() && !s.rec.drained {
        let list: Vec<String> = s.lost.iter().map(|g| format!("gpu{g}")).collect();
        let reason = format!("{DRAIN_PREFIX} {} lost (NVML: GPU is lost)", list.join(","));
        match seen.reason.as_deref().unwrap_or("") {
            "" => p.updates.push(Update::Drain(reason)),
            mine if mine.starts_with(DRAIN_PREFIX) => p.updates.push(Update::Drain(reason)),
            theirs => p.notes.push(format!(
                "GPU lost on a node already drained by someone else ({theirs}); left alone"
            )),
        }
    } else if s.lost.is_empty() && s.rec.drained {
        match seen.reason.as_deref() {
            Some(r) if r.starts_with(DRAIN_PREFIX) => p.updates.push(Update::Resume),
            Some(r) => {
                p.notes.push(format!(
                    "muxflow's drain was replaced by another ({r}); left alone"
                ));
                p.forget_drain = true;
            }
            // Unknown: try again at the next step.
            None => {}
        }
    }
    p
}

/// Publishes the persisted GPU records of the node and drains/undrains on a
/// lost GPU. Runs under the node lock and reads the records from disk, so
/// concurrent steps publish the newest state whatever order they finish in.
/// `stepped`: the records this step computed, used instead of the saved
/// ones (the same, unless the state directory could not keep them).
pub fn publish(
    config: &Config,
    ns: &NodeState,
    node: &str,
    trigger: Trigger,
    now: u64,
    stepped: &BTreeMap<u32, GpuRecord>,
) -> anyhow::Result<()> {
    let _lock = ns.lock_node()?;
    let mut rec = load_node(ns)?;
    let mut gpus: Vec<GpuPublished> = Vec::new();
    let mut lost = Vec::new();
    let mut indices: Vec<u32> = ns.gpus()?;
    indices.extend(stepped.keys());
    indices.sort_unstable();
    indices.dedup();
    for gpu in indices {
        let r = match stepped.get(&gpu) {
            Some(r) => Some(r.clone()),
            None => load_record(ns, gpu)?,
        };
        if let Some(r) = r {
            if r.lost {
                lost.push(gpu);
            }
            // Read from the daemon's command line, not sent to it: quick.
            let multiuser = MpsDaemon::for_gpu(config, gpu).published_mode(None);
            gpus.push(r.published(gpu, multiuser));
        }
    }
    let text = encode(&gpus);
    let slurm = SlurmClient::new(config);
    let step = Step {
        rec: &rec,
        text: &text,
        lost: &lost,
        trigger,
        now_s: now,
        refresh_s: config.health.publish_refresh_s,
    };
    let mut seen = Seen::default();
    for field in needs(&step) {
        match slurm.node_field(node, field.name()) {
            Ok(v) => match field {
                Field::Extra => seen.extra = Some(v),
                Field::Reason => seen.reason = Some(v),
            },
            Err(e) if e.is_timeout() => {
                // A hung slurmctld: one timeout per step is enough.
                rec.publish_failures += 1;
                save_node(ns, node, &rec);
                return Err(e).context("slurmctld did not answer; GPU states not published");
            }
            Err(e) => tracing::debug!(%node, "reading back {}: {e}", field.name()),
        }
    }
    let plan = plan(&step, &seen);
    for note in &plan.notes {
        tracing::warn!(%node, "{note}");
    }
    if plan.forget_drain {
        rec.drained = false;
    }
    let mut result = Ok(());
    for update in &plan.updates {
        let fields = update.fields();
        let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
        match (slurm.update_node(node, &fields), update) {
            (Ok(()), Update::Publish(text)) => {
                tracing::info!(%node, %text, "published GPU states");
                rec.published = Some(text.clone());
                rec.published_at_s = now;
            }
            (Ok(()), Update::Drain(reason)) => {
                tracing::error!(%node, %reason, "node drained");
                rec.drained = true;
            }
            (Ok(()), Update::Resume) => {
                tracing::warn!(%node, "GPU back: node resumed (muxflow's drain undone)");
                rec.drained = false;
            }
            (Err(e), Update::Publish(_)) => {
                rec.publish_failures += 1;
                let timed_out = e.is_timeout();
                result = Err(anyhow::Error::from(e));
                // Hung: the drain decision waits for the next step.
                if timed_out {
                    break;
                }
            }
            (Err(e), _) => {
                tracing::error!(%node, "drain/resume: {e}");
                if e.is_timeout() {
                    break;
                }
            }
        }
    }
    save_node(ns, node, &rec);
    result
}

fn save_node(ns: &NodeState, node: &str, rec: &NodeRecord) {
    let bytes = match serde_json::to_vec(rec) {
        Ok(b) => b,
        Err(e) => return tracing::error!(%node, "cannot encode node.json: {e}"),
    };
    if let Err(e) = write_atomic(&node_path(ns), &bytes) {
        // Only the memory of what was sent is lost: the next step sends again.
        tracing::error!(%node, "cannot save node.json: {e}{}", space_note(ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "muxflow:v1 gpu0.state=healthy";
    const NEW: &str = "muxflow:v1 gpu0.state=busy";

    fn sent(text: &str, at_s: u64, drained: bool) -> NodeRecord {
        NodeRecord {
            published: Some(text.into()),
            published_at_s: at_s,
            drained,
            publish_failures: 0,
        }
    }

    struct Row {
        name: &'static str,
        rec: NodeRecord,
        text: &'static str,
        lost: &'static [u32],
        trigger: Trigger,
        needs: &'static [Field],
        seen: Seen,
        updates: Vec<Update>,
        forget_drain: bool,
    }

    fn seen(extra: Option<&str>, reason: Option<&str>) -> Seen {
        Seen {
            extra: extra.map(String::from),
            reason: reason.map(String::from),
        }
    }

    #[test]
    fn plans_of_one_step() {
        let drain = || Update::Drain("muxflow: gpu1 lost (NVML: GPU is lost)".into());
        let rows = [
            Row {
                name: "unchanged and fresh at a Prolog: nothing read, nothing sent",
                rec: sent(TEXT, 990, false),
                text: TEXT,
                lost: &[],
                trigger: Trigger::JobStart,
                needs: &[],
                seen: Seen::default(),
                updates: vec![],
                forget_drain: false,
            },
            Row {
                name: "changed: sent",
                rec: sent(TEXT, 990, false),
                text: NEW,
                lost: &[],
                trigger: Trigger::JobStart,
                needs: &[],
                seen: Seen::default(),
                updates: vec![Update::Publish(NEW.into())],
                forget_drain: false,
            },
            Row {
                name: "stale: sent again",
                rec: sent(TEXT, 100, false),
                text: TEXT,
                lost: &[],
                trigger: Trigger::JobEnd,
                needs: &[],
                seen: Seen::default(),
                updates: vec![Update::Publish(TEXT.into())],
                forget_drain: false,
            },
            Row {
                name: "health check, slurmctld lost the text: re-asserted",
                rec: sent(TEXT, 990, false),
                text: TEXT,
                lost: &[],
                trigger: Trigger::HealthCheck,
                needs: &[Field::Extra],
                seen: seen(Some(""), None),
                updates: vec![Update::Publish(TEXT.into())],
                forget_drain: false,
            },
            Row {
                name: "health check, slurmctld has it: nothing sent",
                rec: sent(TEXT, 990, false),
                text: TEXT,
                lost: &[],
                trigger: Trigger::HealthCheck,
                needs: &[Field::Extra],
                seen: seen(Some(TEXT), None),
                updates: vec![],
                forget_drain: false,
            },
            Row {
                name: "GPU lost on an undrained node: drained with muxflow's reason",
                rec: sent(TEXT, 990, false),
                text: TEXT,
                lost: &[1],
                trigger: Trigger::JobStart,
                needs: &[Field::Reason],
                seen: seen(None, Some("")),
                updates: vec![drain()],
                forget_drain: false,
            },
            Row {
                name: "GPU lost on a node someone else drained: left alone",
                rec: sent(TEXT, 990, false),
                text: TEXT,
                lost: &[1],
                trigger: Trigger::JobStart,
                needs: &[Field::Reason],
                seen: seen(None, Some("NHC: nv_health: gpu1 lost")),
                updates: vec![],
                forget_drain: false,
            },
            Row {
                name: "already drained by muxflow: not drained twice",
                rec: sent(TEXT, 990, true),
                text: TEXT,
                lost: &[1],
                trigger: Trigger::HealthCheck,
                needs: &[Field::Extra],
                seen: seen(Some(TEXT), None),
                updates: vec![],
                forget_drain: false,
            },
            Row {
                name: "GPU lost, run as an NHC check: published, drain left to NHC",
                rec: sent(TEXT, 990, false),
                text: NEW,
                lost: &[1],
                trigger: Trigger::HealthReport,
                needs: &[],
                seen: Seen::default(),
                updates: vec![Update::Publish(NEW.into())],
                forget_drain: false,
            },
            Row {
                name: "GPU back, muxflow's drain: resumed",
                rec: sent(TEXT, 990, true),
                text: TEXT,
                lost: &[],
                trigger: Trigger::JobEnd,
                needs: &[Field::Reason],
                seen: seen(None, Some("muxflow: gpu1 lost (NVML: GPU is lost)")),
                updates: vec![Update::Resume],
                forget_drain: false,
            },
            Row {
                name: "GPU back, the drain is now someone else's: forgotten, not resumed",
                rec: sent(TEXT, 990, true),
                text: TEXT,
                lost: &[],
                trigger: Trigger::JobEnd,
                needs: &[Field::Reason],
                seen: seen(None, Some("admin: maintenance")),
                updates: vec![],
                forget_drain: true,
            },
            Row {
                name: "GPU back, Reason unreadable: decided at the next step",
                rec: sent(TEXT, 990, true),
                text: TEXT,
                lost: &[],
                trigger: Trigger::JobEnd,
                needs: &[Field::Reason],
                seen: Seen::default(),
                updates: vec![],
                forget_drain: false,
            },
        ];
        for row in rows {
            let step = Step {
                rec: &row.rec,
                text: row.text,
                lost: row.lost,
                trigger: row.trigger,
                now_s: 1000,
                refresh_s: 300,
            };
            assert_eq!(needs(&step), row.needs, "{}", row.name);
            let p = plan(&step, &row.seen);
            assert_eq!(p.updates, row.updates, "{}", row.name);
            assert_eq!(p.forget_drain, row.forget_drain, "{}", row.name);
        }
    }

    #[test]
    fn updates_spell_scontrol_fields() {
        assert_eq!(Update::Publish("a b".into()).fields(), ["Extra=a b"]);
        assert_eq!(
            Update::Drain("muxflow: x".into()).fields(),
            ["State=DRAIN", "Reason=muxflow: x"]
        );
        assert_eq!(Update::Resume.fields(), ["State=RESUME"]);
    }
}
