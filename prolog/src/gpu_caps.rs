//! What a GPU is, as far as the MPS daemon's start needs it: its compute
//! capability from NVML (multi-user MPS needs Volta, 7.0, and no Tegra).
//! Asked only when a daemon is started, so a Prolog on a GPU whose daemon
//! already runs pays nothing for it.

use muxflow::mps::ComputeCapability;
use muxflow::Config;
use nvml_wrapper::Nvml;

/// GPU `gpu`'s compute capability; None when NVML cannot say (logged: the
/// daemon is then started with the multi-user flag and its exit decides).
pub fn compute_capability(config: &Config, gpu: u32) -> Option<ComputeCapability> {
    let lib = config.paths.nvml_library.as_ref().map(|p| p.as_path());
    let nvml = match lib {
        Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
        None => Nvml::init(),
    };
    let read = nvml.map_err(|e| format!("NVML init: {e}")).and_then(|n| {
        let d = n
            .device_by_index(gpu)
            .map_err(|e| format!("GPU {gpu}: {e}"))?;
        d.cuda_compute_capability()
            .map_err(|e| format!("GPU {gpu}: compute capability: {e}"))
    });
    match read {
        Ok(cc) => Some(ComputeCapability {
            major: u32::try_from(cc.major).unwrap_or(0),
            minor: u32::try_from(cc.minor).unwrap_or(0),
        }),
        Err(e) => {
            tracing::warn!(
                gpu,
                "cannot tell whether the GPU supports multi-user MPS: {e}"
            );
            None
        }
    }
}
