//! Publishing the node's GPU states to slurmctld, and the GPU-lost drain.
//!
//! The text ([`muxflow::published::encode`]) goes into the node's `Extra`
//! field with `scontrol update NodeName=… Extra=…` (Slurm 22.05 accepts it,
//! `sinfo --json` shows it as `extra`, and `scontrol reconfigure` keeps it).
//! It is sent only when it changed or is older than
//! `health.publish_refresh_s`; a health check also reads the field back and
//! re-asserts it if slurmctld lost it. The last text sent is kept in
//! `<state_dir>/node.json`, under `<state_dir>/node.lock`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};
use muxflow::node_state::{write_atomic, NodeState};
use muxflow::published::{encode, GpuPublished};
use muxflow::Config;
use serde::{Deserialize, Serialize};

use crate::sysmon::{load_record, GpuRecord, Trigger};

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
            gpus.push(r.published(gpu));
        }
    }
    let text = encode(&gpus);
    let slurm = Slurm::discover();
    let stale = now.saturating_sub(rec.published_at_s) >= config.health.publish_refresh_s;
    let mut send = rec.published.as_deref() != Some(text.as_str()) || stale;
    if !send && trigger == Trigger::HealthCheck {
        // slurmctld may have lost it (restart with a clean state): re-assert.
        match slurm.node_field(node, "Extra") {
            Ok(current) if current.trim() != text => send = true,
            Ok(_) => {}
            Err(e) => tracing::debug!("reading back Extra: {e:#}"),
        }
    }
    let mut result = Ok(());
    if send {
        match slurm.update_node(node, &[&format!("Extra={text}")]) {
            Ok(()) => {
                tracing::info!(%node, %text, "published GPU states");
                rec.published = Some(text);
                rec.published_at_s = now;
            }
            Err(e) => {
                rec.publish_failures += 1;
                result = Err(e);
            }
        }
    }
    if let Err(e) = drain_or_resume(&slurm, node, &lost, &mut rec) {
        tracing::error!(%node, "drain/resume: {e:#}");
    }
    if let Err(e) = write_atomic(&node_path(ns), &serde_json::to_vec(&rec)?) {
        // Only the memory of what was sent is lost: the next step sends again.
        tracing::error!(%node, "cannot save node.json: {e}{}", crate::sysmon::space_note(ns));
    }
    result
}

/// Drains the node when a GPU is lost; resumes it when none is and the
/// drain is muxflow's own (reason starting `muxflow:`).
fn drain_or_resume(
    slurm: &Slurm,
    node: &str,
    lost: &[u32],
    rec: &mut NodeRecord,
) -> anyhow::Result<()> {
    if !lost.is_empty() && !rec.drained {
        let list: Vec<String> = lost.iter().map(|g| format!("gpu{g}")).collect();
        let reason = format!("{DRAIN_PREFIX} {} lost (NVML: GPU is lost)", list.join(","));
        let current = slurm.node_field(node, "Reason").unwrap_or_default();
        if !current.is_empty() && !current.starts_with(DRAIN_PREFIX) {
            // Someone else's drain: leave it (and never undo it).
            tracing::warn!(%node, %current, "GPU lost on a node already drained by someone else");
            return Ok(());
        }
        slurm.update_node(node, &["State=DRAIN", &format!("Reason={reason}")])?;
        tracing::error!(%node, %reason, "node drained");
        rec.drained = true;
    } else if lost.is_empty() && rec.drained {
        let current = slurm.node_field(node, "Reason")?;
        if current.starts_with(DRAIN_PREFIX) {
            slurm.update_node(node, &["State=RESUME"])?;
            tracing::warn!(%node, "GPU back: node resumed (muxflow's drain undone)");
        } else {
            tracing::info!(%node, %current, "muxflow's drain was replaced by another; left alone");
        }
        rec.drained = false;
    }
    Ok(())
}

/// Slurm's commands as the node programs can run them: slurmd gives the
/// HealthCheckProgram neither PATH nor SLURM_CONF (checked on 22.05), so
/// both are supplied here.
pub struct Slurm {
    conf: Option<PathBuf>,
}

impl Slurm {
    /// The slurm.conf of [`muxflow::slurm_conf::discover`].
    pub fn discover() -> Slurm {
        Slurm {
            conf: muxflow::slurm_conf::discover(),
        }
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        if std::env::var_os("PATH").is_none() {
            c.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/bin");
        }
        if let Some(conf) = &self.conf {
            c.env("SLURM_CONF", conf);
        }
        c
    }

    fn run(&self, mut c: Command) -> anyhow::Result<String> {
        let out = c.output().with_context(|| format!("running {c:?}"))?;
        if !out.status.success() {
            bail!(
                "{:?} failed: {}",
                c,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn update_node(&self, node: &str, fields: &[&str]) -> anyhow::Result<()> {
        let mut c = self.cmd("scontrol");
        c.arg("update").arg(format!("NodeName={node}")).args(fields);
        self.run(c).map(drop)
    }

    /// A node field through sinfo's `-O` (values with spaces intact).
    pub fn node_field(&self, node: &str, field: &str) -> anyhow::Result<String> {
        let mut c = self.cmd("sinfo");
        c.args(["-h", "-N", "-n", node, "-O", &format!("{field}:4096")]);
        let out = self.run(c)?;
        let v = out.lines().next().unwrap_or("").trim();
        Ok(if v == "none" || v == "(null)" {
            String::new()
        } else {
            v.to_string()
        })
    }
}
