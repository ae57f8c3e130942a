//! A job's sharing figures in its AdminComment, so `sacct -o JobID,AdminComment`
//! shows them and the matcher learns from them:
//!
//! ```text
//! muxflow:v1 mode=offline node=node3 gpu=0 sm_pct=40 mem_cap_mib=60000 partner=12 launches=52000 delayed=1200 delay_ms=830 oom=0 peak_mib=2048 steps=788 steps_per_s=98.4
//! ```
//!
//! | key | meaning |
//! |---|---|
//! | mode | online or offline |
//! | node, gpu | where it ran (GPU index on the node) |
//! | sm_pct | offline: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE it got |
//! | mem_cap_mib | offline: its GPU memory cap |
//! | partner | the online job it shared the GPU with (offline), or an offline job it hosted (online) |
//! | launches, delayed, delay_ms | xCUDA: kernel launches, launches it delayed, total delay |
//! | oom, peak_mib | xCUDA: allocations refused by the cap, peak GPU memory |
//! | steps, steps_per_s | the workload's training steps, if it reports them |
//! | requests, rps, p50_ms, p99_ms | the workload's served requests and latency, if it reports them |
//!
//! Every key but `mode` is optional; unknown keys are ignored when reading, so
//! newer writers stay readable.

use crate::kv::{self, Fields, KvError};
use crate::Mode;

pub const TAG: &str = "muxflow:v1";

#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobReport {
    pub mode: Option<Mode>,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub sm_pct: Option<u8>,
    pub mem_cap_mib: Option<u64>,
    pub partner: Option<u32>,
    pub launches: Option<u64>,
    pub delayed: Option<u64>,
    pub delay_ms: Option<u64>,
    pub oom: Option<u64>,
    pub peak_mib: Option<u64>,
    pub steps: Option<u64>,
    pub steps_per_s: Option<f64>,
    pub requests: Option<u64>,
    pub rps: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReportError {
    #[error("AdminComment does not start with '{TAG}'")]
    NotMuxflow,
    #[error("AdminComment: {0}")]
    Kv(#[from] KvError),
    #[error("AdminComment: mode is missing")]
    NoMode,
}

impl JobReport {
    pub fn encode(&self) -> String {
        let mut w = kv::Writer::new().tag(TAG);
        w.push_opt("mode", self.mode)
            .push_opt("node", self.node.as_deref())
            .push_opt("gpu", self.gpu)
            .push_opt("sm_pct", self.sm_pct)
            .push_opt("mem_cap_mib", self.mem_cap_mib)
            .push_opt("partner", self.partner)
            .push_opt("launches", self.launches)
            .push_opt("delayed", self.delayed)
            .push_opt("delay_ms", self.delay_ms)
            .push_opt("oom", self.oom)
            .push_opt("peak_mib", self.peak_mib)
            .push_opt("steps", self.steps)
            .push_opt("steps_per_s", self.steps_per_s.filter(|v| v.is_finite()))
            .push_opt("requests", self.requests)
            .push_opt("rps", self.rps.filter(|v| v.is_finite()))
            .push_opt("p50_ms", self.p50_ms.filter(|v| v.is_finite()))
            .push_opt("p99_ms", self.p99_ms.filter(|v| v.is_finite()));
        w.finish()
    }

    pub fn decode(text: &str) -> Result<JobReport, ReportError> {
        let rest = text
            .trim()
            .strip_prefix(TAG)
            .ok_or(ReportError::NotMuxflow)?;
        let map = kv::parse(rest)?;
        let f = Fields(&map);
        let finite = |key: &str| -> Result<Option<f64>, KvError> {
            match f.get::<f64>(key)? {
                Some(v) if !v.is_finite() => Err(KvError::BadValue {
                    key: key.into(),
                    value: v.to_string(),
                    why: "not a finite number".into(),
                }),
                v => Ok(v),
            }
        };
        let r = JobReport {
            mode: Some(f.get("mode")?.ok_or(ReportError::NoMode)?),
            node: f.get("node")?,
            gpu: f.get("gpu")?,
            sm_pct: f.get("sm_pct")?,
            mem_cap_mib: f.get("mem_cap_mib")?,
            partner: f.get("partner")?,
            launches: f.get("launches")?,
            delayed: f.get("delayed")?,
            delay_ms: f.get("delay_ms")?,
            oom: f.get("oom")?,
            peak_mib: f.get("peak_mib")?,
            steps: f.get("steps")?,
            steps_per_s: finite("steps_per_s")?,
            requests: f.get("requests")?,
            rps: finite("rps")?,
            p50_ms: finite("p50_ms")?,
            p99_ms: finite("p99_ms")?,
        };
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> JobReport {
        JobReport {
            mode: Some(Mode::Offline),
            node: Some("node3".into()),
            gpu: Some(0),
            sm_pct: Some(40),
            mem_cap_mib: Some(60000),
            partner: Some(12),
            launches: Some(52000),
            delayed: Some(1200),
            delay_ms: Some(830),
            oom: Some(0),
            peak_mib: Some(2048),
            steps: Some(788),
            steps_per_s: Some(98.38),
            requests: None,
            rps: None,
            p50_ms: Some(1.25),
            p99_ms: Some(0.1 + 0.2),
        }
    }

    #[test]
    fn round_trips() {
        for r in [
            full(),
            JobReport {
                mode: Some(Mode::Online),
                ..Default::default()
            },
        ] {
            assert_eq!(JobReport::decode(&r.encode()).unwrap(), r);
        }
        assert!(full()
            .encode()
            .starts_with("muxflow:v1 mode=offline node=node3 gpu=0 sm_pct=40"));
    }

    #[test]
    fn unknown_keys_are_ignored_and_bad_ones_named() {
        let r = JobReport::decode("muxflow:v1 mode=online future_key=1").unwrap();
        assert_eq!(r.mode, Some(Mode::Online));
        assert_eq!(JobReport::decode("hello"), Err(ReportError::NotMuxflow));
        assert_eq!(
            JobReport::decode("muxflow:v1 gpu=1"),
            Err(ReportError::NoMode)
        );
        let e = JobReport::decode("muxflow:v1 mode=offline gpu=x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'gpu'"), "{e}");
        assert!(JobReport::decode("muxflow:v1 mode=offline rps=inf").is_err());
        assert!(JobReport::decode("muxflow:v1 mode=offline rps=NaN").is_err());
    }

    #[test]
    fn node_names_that_would_break_the_form_are_dropped() {
        let r = JobReport {
            mode: Some(Mode::Online),
            node: Some("a b".into()),
            ..Default::default()
        };
        assert_eq!(r.encode(), "muxflow:v1 mode=online");
    }

    #[test]
    fn decoding_arbitrary_text_never_panics() {
        // A cheap in-tree stand-in for the fuzz target (fuzz/).
        let pieces = [
            "muxflow:v1",
            "mode=offline",
            "gpu=",
            "=",
            "gpu=1",
            "gpu=1",
            "x",
            "p99_ms=1e400",
            "é",
            ";",
            "\n",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut s = String::new();
            for _ in 0..(seed % 7) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push_str(pieces[(seed % pieces.len() as u64) as usize]);
                s.push(if seed & 1 == 0 { ' ' } else { '\t' });
            }
            if let Ok(r) = JobReport::decode(&s) {
                assert_eq!(JobReport::decode(&r.encode()).unwrap(), r, "{s:?}");
            }
        }
    }
}
