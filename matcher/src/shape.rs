//! The cluster's shape for job_submit.lua: the largest offline job each
//! kind of GPU node can hold.
//!
//! An offline job's GPU request is taken out of what Slurm sees at submit
//! (job_submit.lua parks it with no GRES; the matcher writes its slots
//! later), so Slurm's own check — no node has that many GPUs — never runs
//! for it: `--gres=gpu:3` on 2-GPU nodes would wait forever. Each round
//! writes, from Slurm's node config (not from what is free now), one line
//! per undominated (GPUs, CPUs, memory) of the nodes with GPUs; the Lua
//! refuses an offline job no line can hold, naming what it asked and what
//! the largest nodes have. A missing or stale file refuses nothing.
//!
//! ```text
//! # muxflow-matcher: ...
//! written_at=1795000000
//! node gpus=8 cpus=64 mem_mib=512000
//! node gpus=2 cpus=128 mem_mib=1024000
//! ```

use std::path::Path;

use crate::reader::{parse_gres, SinfoNode};

/// What one node can give one job: its GPUs, CPUs and memory (MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeShape {
    pub gpus: u32,
    pub cpus: u32,
    pub mem_mib: u64,
}

impl NodeShape {
    /// The node's configured shape; None for a node without GPUs.
    pub fn of(node: &SinfoNode) -> Option<NodeShape> {
        let gpus: u64 = parse_gres(&node.gres)
            .iter()
            .filter(|g| g.name == "gpu")
            .map(|g| g.count)
            .sum();
        let cpus = if node.effective_cpus > 0 {
            node.effective_cpus
        } else {
            node.cpus
        };
        (gpus > 0).then(|| NodeShape {
            gpus: u32::try_from(gpus).unwrap_or(u32::MAX),
            cpus,
            mem_mib: node.real_memory.saturating_sub(node.specialized_memory),
        })
    }

    fn holds(&self, other: &NodeShape) -> bool {
        other.gpus <= self.gpus && other.cpus <= self.cpus && other.mem_mib <= self.mem_mib
    }
}

/// The undominated shapes of `nodes`' GPU nodes, largest GPU count first:
/// a node no larger than another in every part adds nothing to what a
/// job can be given.
pub fn shapes(nodes: &[SinfoNode]) -> Vec<NodeShape> {
    let mut all: Vec<NodeShape> = nodes.iter().filter_map(NodeShape::of).collect();
    all.sort_unstable_by(|a, b| b.cmp(a));
    all.dedup();
    let mut kept: Vec<NodeShape> = Vec::new();
    for s in all {
        if !kept.iter().any(|k| k.holds(&s)) {
            kept.push(s);
        }
    }
    kept
}

/// The file's text; `now_s` is the Unix time it is written at.
pub fn encode(shapes: &[NodeShape], now_s: u64) -> String {
    let mut out = String::from(
        "# muxflow-matcher: the largest offline job each kind of GPU node can hold \
         (Slurm's node config), rewritten every round; read by job_submit.lua\n",
    );
    out.push_str(&format!("written_at={now_s}\n"));
    for s in shapes {
        out.push_str(&format!(
            "node gpus={} cpus={} mem_mib={}\n",
            s.gpus, s.cpus, s.mem_mib
        ));
    }
    out
}

/// Writes the file atomically (the Lua never reads half of it).
pub fn write(path: &Path, shapes: &[NodeShape], now_s: u64) -> anyhow::Result<()> {
    use anyhow::Context;
    muxflow::node::state::write_atomic(path, encode(shapes, now_s).as_bytes()).with_context(|| {
        format!(
            "writing the cluster shape to {} ([matcher] shape_file)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(gres: &str, cpus: u32, mem: u64) -> SinfoNode {
        SinfoNode {
            name: "n".into(),
            gres: gres.into(),
            cpus,
            real_memory: mem,
            ..Default::default()
        }
    }

    #[test]
    fn a_node_counts_its_gpus_of_every_type_and_nothing_else() {
        let cases = [
            ("gpu:2,mfslot:g0:1,mfslot:g1:1", Some(2)),
            ("gpu:a100:4(S:0-1),gpu:t4:2(S:0)", Some(6)),
            ("gres/gpu:8", Some(8)),
            ("mfslot:g0:1", None),
            ("", None),
        ];
        for (gres, gpus) in cases {
            assert_eq!(
                NodeShape::of(&node(gres, 4, 4000)).map(|s| s.gpus),
                gpus,
                "{gres}"
            );
        }
    }

    #[test]
    fn only_undominated_shapes_are_kept() {
        let nodes = [
            node("gpu:2", 4, 4000),
            node("gpu:2", 4, 4000),
            node("gpu:1", 4, 4000),
            node("gpu:8", 64, 512_000),
            node("gpu:2", 128, 1_024_000),
            node("gpu:1", 256, 100),
            node("", 512, 9_999_999),
        ];
        let got = shapes(&nodes);
        let want = [
            NodeShape {
                gpus: 8,
                cpus: 64,
                mem_mib: 512_000,
            },
            NodeShape {
                gpus: 2,
                cpus: 128,
                mem_mib: 1_024_000,
            },
            NodeShape {
                gpus: 1,
                cpus: 256,
                mem_mib: 100,
            },
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn effective_cpus_and_specialized_memory_are_what_a_job_can_get() {
        let mut n = node("gpu:1", 8, 4000);
        n.effective_cpus = 6;
        n.specialized_memory = 1000;
        assert_eq!(
            NodeShape::of(&n),
            Some(NodeShape {
                gpus: 1,
                cpus: 6,
                mem_mib: 3000
            })
        );
    }

    #[test]
    fn the_text_has_one_line_per_shape_and_the_time() {
        let text = encode(
            &[NodeShape {
                gpus: 2,
                cpus: 4,
                mem_mib: 4000,
            }],
            1_795_000_000,
        );
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            lines,
            ["written_at=1795000000", "node gpus=2 cpus=4 mem_mib=4000"]
        );
    }
}
