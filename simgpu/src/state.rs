//! State directory: how it is found and laid out.
//!
//! ```text
//! <state>/                      MUXFLOW_SIM_DIR, else <dir of the fake lib>/../state
//!   nodes/<node>/               optional: one sub-tree per Slurm node
//!   [nodes/<node>/]gpus/<i>/config.toml   static GpuConfig (human-editable)
//!   [nodes/<node>/]gpus/<i>/shared.bin    mmap'd table (clients, kernels, faults)
//!   [nodes/<node>/]gpus/<i>/events.log    attach / released / pruned / fault lines
//! ```

use crate::config::GpuConfig;
use crate::shared::SharedGpu;
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;

pub const ENV_DIR: &str = "MUXFLOW_SIM_DIR";
pub const ENV_NODE: &str = "MUXFLOW_SIM_NODE";

#[derive(Debug, Error)]
pub enum StateError {
    #[error("simgpu: no state directory: set {ENV_DIR} (or install the fake library as <root>/lib/<name> next to <root>/state)")]
    NoStateDir,
    #[error("simgpu: {0}/nodes exists but no node is named: set {ENV_NODE} or SLURMD_NODENAME")]
    NoNode(PathBuf),
    #[error("simgpu: {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("simgpu: {path}: bad config: {msg}")]
    Config { path: PathBuf, msg: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Path of the shared object containing `addr` (dladdr).
/// `addr` is an address inside the object (e.g. a function's), as an integer.
pub fn object_path_of(addr: usize) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: dladdr only reads `addr` and fills `info`; dli_fname, when
    // non-null, is a NUL-terminated string owned by the loader.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const libc::c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(info.dli_fname);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
    }
}

/// The one resolution rule. `lib` is the path of the loaded fake library, if any.
pub fn resolve_with(
    env: &dyn Fn(&str) -> Option<String>,
    lib: Option<&Path>,
) -> Result<PathBuf, StateError> {
    let base = match env(ENV_DIR).filter(|s| !s.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => {
            let lib = lib.ok_or(StateError::NoStateDir)?;
            let lib = if lib.is_absolute() {
                lib.to_path_buf()
            } else {
                std::env::current_dir().map_err(io(lib))?.join(lib)
            };
            lib.parent()
                .and_then(Path::parent)
                .map(|p| p.join("state"))
                .ok_or(StateError::NoStateDir)?
        }
    };
    let nodes = base.join("nodes");
    if nodes.is_dir() {
        let node = env(ENV_NODE)
            .filter(|s| !s.is_empty())
            .or_else(|| env("SLURMD_NODENAME").filter(|s| !s.is_empty()))
            .ok_or_else(|| StateError::NoNode(base.clone()))?;
        return Ok(nodes.join(node));
    }
    Ok(base)
}

pub fn resolve(lib: Option<&Path>) -> Result<PathBuf, StateError> {
    resolve_with(&|k| std::env::var(k).ok(), lib)
}

/// One effective state directory (one node's GPUs).
#[derive(Debug, Clone)]
pub struct SimDir {
    pub root: PathBuf,
    pub gpus: Vec<GpuConfig>,
}

impl SimDir {
    pub fn open(root: &Path) -> Result<Self, StateError> {
        let gdir = root.join("gpus");
        let rd = std::fs::read_dir(&gdir).map_err(io(&gdir))?;
        let mut gpus = Vec::new();
        for e in rd.flatten() {
            let p = e.path().join("config.toml");
            if !p.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&p).map_err(io(&p))?;
            let cfg: GpuConfig = toml::from_str(&text).map_err(|e| StateError::Config {
                path: p.clone(),
                msg: e.to_string(),
            })?;
            gpus.push(cfg);
        }
        gpus.sort_by_key(|g| g.index);
        Ok(SimDir {
            root: root.to_path_buf(),
            gpus,
        })
    }

    pub fn gpu_dir(&self, index: u32) -> PathBuf {
        gpu_dir(&self.root, index)
    }

    pub fn open_gpu(&self, index: u32) -> Result<SharedGpu, StateError> {
        let p = self.gpu_dir(index).join("shared.bin");
        SharedGpu::open(&p).map_err(io(&p))
    }

    /// Appends one line to the GPU's event log (best effort: telemetry must
    /// never fail a driver call).
    pub fn event(&self, index: u32, line: &str) {
        append_line(&self.gpu_dir(index).join("events.log"), line);
    }

    /// The node's simulated kernel log (what `/dev/kmsg` is on a real node).
    pub fn kernel_log(&self) -> PathBuf {
        self.root.join("kmsg")
    }

    pub fn events(&self, index: u32) -> String {
        std::fs::read_to_string(self.gpu_dir(index).join("events.log")).unwrap_or_default()
    }
}

pub fn gpu_dir(root: &Path, index: u32) -> PathBuf {
    root.join("gpus").join(index.to_string())
}

/// Appends `line` + newline with one write (O_APPEND keeps lines whole).
pub fn append_line(path: &Path, line: &str) {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let text = format!("{ms} {line}\n");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(text.as_bytes());
    }
}

/// Creates one node's GPUs under `root` from a template (index/uuid set per GPU).
pub fn init_node(
    root: &Path,
    node: u32,
    gpus: u32,
    template: &GpuConfig,
) -> Result<SimDir, StateError> {
    for i in 0..gpus {
        let d = gpu_dir(root, i);
        std::fs::create_dir_all(&d).map_err(io(&d))?;
        let mut cfg = template.clone();
        cfg.index = i;
        cfg.uuid = GpuConfig::h100_like(node, i).uuid;
        let text = toml::to_string_pretty(&cfg).map_err(|e| StateError::Config {
            path: d.clone(),
            msg: e.to_string(),
        })?;
        let p = d.join("config.toml");
        std::fs::write(&p, text).map_err(io(&p))?;
        let s = d.join("shared.bin");
        SharedGpu::create(&s).map_err(io(&s))?;
        let _ = std::fs::write(d.join("events.log"), b"");
    }
    SimDir::open(root)
}

/// Creates the whole layout: flat when `nodes` is None, else `nodes/node1..N`.
pub fn init(
    dir: &Path,
    gpus: u32,
    nodes: Option<u32>,
    template: &GpuConfig,
) -> Result<Vec<SimDir>, StateError> {
    match nodes {
        None => Ok(vec![init_node(dir, 0, gpus, template)?]),
        Some(n) => (1..=n)
            .map(|k| {
                init_node(
                    &dir.join("nodes").join(format!("node{k}")),
                    k,
                    gpus,
                    template,
                )
            })
            .collect(),
    }
}

/// Every effective directory under `dir` with its node name ("" when flat).
pub fn all_nodes(dir: &Path) -> Result<Vec<(String, SimDir)>, StateError> {
    let nodes = dir.join("nodes");
    if !nodes.is_dir() {
        return Ok(vec![(String::new(), SimDir::open(dir)?)]);
    }
    let mut names: Vec<String> = std::fs::read_dir(&nodes)
        .map_err(io(&nodes))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_by_key(|a| natural_key(a));
    names
        .into_iter()
        .map(|n| Ok((n.clone(), SimDir::open(&nodes.join(&n))?)))
        .collect()
}

fn natural_key(s: &str) -> (String, u64) {
    let digits: String = s.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    let num: String = digits.chars().rev().collect();
    (
        s[..s.len() - num.len()].to_string(),
        num.parse().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_rule() {
        let t = tempfile::tempdir().unwrap();
        let st = t.path().join("state");
        std::fs::create_dir_all(&st).unwrap();
        let lib = t.path().join("lib/libcuda.so.1");
        let none = |_: &str| None;
        assert_eq!(resolve_with(&none, Some(&lib)).unwrap(), st);
        assert!(matches!(
            resolve_with(&none, None),
            Err(StateError::NoStateDir)
        ));
        let d = st.to_string_lossy().into_owned();
        let env = move |k: &str| (k == ENV_DIR).then(|| d.clone());
        assert_eq!(resolve_with(&env, None).unwrap(), st);
        std::fs::create_dir_all(st.join("nodes/node2")).unwrap();
        assert!(matches!(
            resolve_with(&none, Some(&lib)),
            Err(StateError::NoNode(_))
        ));
        let slurm = |k: &str| (k == "SLURMD_NODENAME").then(|| "node2".to_string());
        assert_eq!(
            resolve_with(&slurm, Some(&lib)).unwrap(),
            st.join("nodes/node2")
        );
    }

    #[test]
    fn init_and_open() {
        let t = tempfile::tempdir().unwrap();
        let dirs = init(t.path(), 2, Some(2), &GpuConfig::h100_like(0, 0)).unwrap();
        assert_eq!(dirs.len(), 2);
        let all = all_nodes(t.path()).unwrap();
        assert_eq!(all[1].0, "node2");
        assert_eq!(all[1].1.gpus.len(), 2);
        assert_ne!(all[0].1.gpus[0].uuid, all[1].1.gpus[0].uuid);
        all[0].1.open_gpu(1).unwrap();
    }
}
