//! muxflow's figures for Prometheus: the text exposition format (0.0.4,
//! what node_exporter's textfile collector and `promtool check metrics`
//! read), written atomically, and dcgm-exporter's job-mapping files.
//!
//! Names follow Prometheus's conventions: `muxflow_` prefix, base units
//! (`_seconds`, `_bytes`, `_ratio`), counters end in `_total`; labels
//! `node`, `gpu`, `job`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use crate::node::state::StateError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One metric family: its samples, each with its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    pub fn sample(&mut self, labels: &[(&'static str, String)], value: f64) -> &mut Family {
        self.samples.push((labels.to_vec(), value));
        self
    }
}

/// The families of one exposition, in the order first named.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    /// The family `name` (created on first use). A counter's name must end
    /// in `_total`.
    pub fn family(&mut self, name: &'static str, help: &'static str, kind: Kind) -> &mut Family {
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"), "{name}");
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name,
                    help,
                    kind,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[i]
    }

    pub fn gauge(&mut self, name: &'static str, help: &'static str) -> &mut Family {
        self.family(name, help, Kind::Gauge)
    }

    pub fn counter(&mut self, name: &'static str, help: &'static str) -> &mut Family {
        self.family(name, help, Kind::Counter)
    }

    /// The text format; families without samples are left out.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(out, "# TYPE {} {kind}", f.name);
            for (labels, value) in &f.samples {
                out.push_str(f.name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {}", number(*value));
            }
        }
        out
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Writes `text` to `dir/name` atomically (a temporary file in `dir`, then
/// a rename), mode 0644: a collector never reads half a file.
pub fn write_atomic(dir: &Path, name: &str, text: &str) -> Result<(), StateError> {
    crate::node::state::write_atomic(&dir.join(name), text.as_bytes())
}

/// dcgm-exporter's job mapping: in `dir`, one file per GPU index of
/// `gpus` listing its jobs, one per line; a GPU without jobs has no file
/// (its old one is removed).
pub fn write_job_mapping(dir: &Path, gpus: &[(u32, BTreeSet<u32>)]) -> Result<(), StateError> {
    for (gpu, jobs) in gpus {
        let path = dir.join(gpu.to_string());
        if jobs.is_empty() {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(StateError::Io { path, source }),
            }
            continue;
        }
        let text: String = jobs.iter().map(|j| format!("{j}\n")).collect();
        crate::node::state::write_atomic(&path, text.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_type_labels_and_escapes() {
        let mut e = Exposition::default();
        e.gauge("muxflow_gpu_offline_sm_share_ratio", "SM share.")
            .sample(&[("node", "n1".into()), ("gpu", "0".into())], 0.4);
        e.counter("muxflow_xcuda_oom_refusals_total", "Refusals.")
            .sample(&[("job", "a\"b\\c\nd".into())], 3.0);
        e.gauge("muxflow_unused", "No samples: not rendered.");
        let text = e.render();
        assert_eq!(
            text,
            "# HELP muxflow_gpu_offline_sm_share_ratio SM share.\n\
             # TYPE muxflow_gpu_offline_sm_share_ratio gauge\n\
             muxflow_gpu_offline_sm_share_ratio{node=\"n1\",gpu=\"0\"} 0.4\n\
             # HELP muxflow_xcuda_oom_refusals_total Refusals.\n\
             # TYPE muxflow_xcuda_oom_refusals_total counter\n\
             muxflow_xcuda_oom_refusals_total{job=\"a\\\"b\\\\c\\nd\"} 3\n"
        );
    }

    #[test]
    fn files_are_replaced_whole_and_empty_gpus_lose_their_mapping() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "m.prom", "a 1\n").unwrap();
        write_atomic(dir.path(), "m.prom", "a 2\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("m.prom")).unwrap(),
            "a 2\n"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
        let gpus = vec![(0, BTreeSet::from([12, 7])), (1, BTreeSet::new())];
        std::fs::write(dir.path().join("1"), "5\n").unwrap();
        write_job_mapping(dir.path(), &gpus).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("0")).unwrap(),
            "7\n12\n"
        );
        assert!(!dir.path().join("1").exists());
    }
}
