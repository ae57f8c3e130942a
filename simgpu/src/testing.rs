//! Test support for the crates whose tests run real processes on the
//! simulated GPU (this one's and xCUDA's): the built fake libraries and a
//! temporary simulation root wired to them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{state, GpuConfig};

/// A built artifact (`libmuxflow_fakecuda.so`, `muxflow-workload`, ...) of
/// this cargo build: next to the running test binary (`target/<profile>/deps`)
/// or one directory up. Panics, saying what to build, when it is not there.
pub fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    for d in [deps, deps.parent().unwrap_or(deps)] {
        let p = d.join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} not found near {}: build it first (`cargo build -p muxflow-simgpu -p muxflow-simgpu-fakecuda -p muxflow-simgpu-fakenvml`, plus the crate under test)",
        deps.display()
    );
}

/// A temporary simulation root, removed on drop:
/// `lib/libcuda.so.1` and `lib/libnvidia-ml.so.1` link to the built fakes,
/// `state/` holds H100-like simulated GPUs. Derefs to its path.
#[derive(Debug)]
pub struct SimRoot {
    root: PathBuf,
}

impl SimRoot {
    pub fn new(gpus: u32) -> SimRoot {
        static N: AtomicU32 = AtomicU32::new(0);
        let root = loop {
            let p = std::env::temp_dir().join(format!(
                "muxflow-sim-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&p) {
                Ok(()) => break p,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create {}: {e}", p.display()),
            }
        };
        let sim = SimRoot { root };
        std::fs::create_dir_all(sim.lib()).unwrap();
        for (lib, soname) in [
            ("libmuxflow_fakecuda.so", "libcuda.so.1"),
            ("libmuxflow_fakenvml.so", "libnvidia-ml.so.1"),
        ] {
            std::os::unix::fs::symlink(built(lib), sim.lib().join(soname)).unwrap();
        }
        state::init(&sim.state(), gpus, None, &GpuConfig::h100_like(0, 0)).unwrap();
        sim
    }

    /// The directory with the fake `libcuda.so.1` and `libnvidia-ml.so.1`.
    pub fn lib(&self) -> PathBuf {
        self.root.join("lib")
    }

    pub fn state(&self) -> PathBuf {
        self.root.join("state")
    }

    /// `exe` against these fake libraries, finding the state from their
    /// location (no MUXFLOW_SIM_DIR, MPS pipe or device mask inherited),
    /// output captured.
    pub fn command(&self, exe: &Path) -> std::process::Command {
        let mut c = std::process::Command::new(exe);
        c.env("LD_LIBRARY_PATH", self.lib())
            .env_remove("MUXFLOW_SIM_DIR")
            .env_remove("CUDA_MPS_PIPE_DIRECTORY")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    }
}

impl std::ops::Deref for SimRoot {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.root
    }
}

impl Drop for SimRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
