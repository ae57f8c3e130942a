//! What a GPU is, as far as the MPS daemon's start needs it: its compute
//! capability from NVML (multi-user MPS needs Volta, 7.0, and no Tegra).
//! Asked only when a daemon is started, so a Prolog on a GPU whose daemon
//! already runs pays nothing for it.

use muxflow::node::mps::{ComputeCapability, DeviceFacts};
use muxflow::Config;
use nvml_wrapper::Nvml;

/// Reads `what` of GPU `gpu` through NVML (`read`); None, logged with
/// `why` (what then happens), when NVML cannot say.
fn read_device<T>(
    config: &Config,
    gpu: u32,
    why: &str,
    read: impl FnOnce(&nvml_wrapper::Device) -> Result<T, nvml_wrapper::error::NvmlError>,
) -> Option<T> {
    let lib = config.paths.nvml_library.as_ref().map(|p| p.as_path());
    let nvml = match lib {
        Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
        None => Nvml::init(),
    };
    let got = nvml.map_err(|e| format!("NVML init: {e}")).and_then(|n| {
        let d = n
            .device_by_index(gpu)
            .map_err(|e| format!("GPU {gpu}: {e}"))?;
        read(&d).map_err(|e| format!("GPU {gpu}: {e}"))
    });
    got.map_err(|e| tracing::warn!(gpu, "{why}: {e}")).ok()
}

/// GPU `gpu`'s compute capability; None when NVML cannot say (logged: the
/// daemon is then started with the multi-user flag and its exit decides).
pub fn compute_capability(config: &Config, gpu: u32) -> Option<ComputeCapability> {
    device_facts(config, gpu).cc
}

/// What starting GPU `gpu`'s MPS daemon needs to know of it (one NVML
/// session; what NVML cannot say is None, logged).
pub fn device_facts(config: &Config, gpu: u32) -> DeviceFacts {
    let read = read_device(
        config,
        gpu,
        "cannot tell the GPU's UUID and compute capability to its MPS daemon",
        |d| Ok((d.uuid().ok(), d.cuda_compute_capability().ok())),
    );
    let (uuid, cc) = read.unwrap_or_default();
    DeviceFacts {
        uuid,
        cc: cc.map(|cc| ComputeCapability {
            major: u32::try_from(cc.major).unwrap_or(0),
            minor: u32::try_from(cc.minor).unwrap_or(0),
        }),
    }
}

/// GPU `gpu`'s UUID (`GPU-…`), which MPS's partition commands name it by.
pub fn uuid(config: &Config, gpu: u32) -> Option<String> {
    device_facts(config, gpu).uuid
}

/// Whether a daemon started now for GPU `gpu` can run static SM partitions:
/// `[mps] sm_partitions` asks for them, the control daemon is 13010+ and
/// the GPU Ampere (8.0) or newer. Asked only when opted in.
pub fn static_partitions_wanted(config: &Config, gpu: u32) -> bool {
    if !config.mps.sm_partitions {
        return false;
    }
    let version = mps_control_version(config);
    let cc = compute_capability(config, gpu);
    let ok = version.is_some_and(|v| v >= muxflow::node::sm_partition::MIN_VERSION)
        && cc.is_some_and(|c| c.major >= 8);
    if !ok {
        tracing::warn!(
            gpu,
            ?version,
            ?cc,
            "[mps] sm_partitions is set but this daemon or GPU has no static SM partitions (control daemon {}+ and Ampere or newer): the SM share stays MPS's active-thread percentage",
            muxflow::node::sm_partition::MIN_VERSION
        );
    }
    ok
}

/// The grammar a daemon started now speaks: MPS v3, for offline jobs'
/// namespaces, where the control daemon routes clients by cgroup
/// ([`muxflow::node::mps_v3::Support`]) and `[mps] sm_partitions` (which runs on
/// a v2 daemon) is off; else v2, today's path.
pub fn mps_protocol_wanted(config: &Config) -> muxflow::node::mps_v3::Protocol {
    use muxflow::node::mps_v3::{Protocol, Support};
    if config.mps.sm_partitions {
        return Protocol::V2;
    }
    match Support::of(mps_control_version(config)) {
        s if s.usable() => Protocol::V3,
        _ => Protocol::V2,
    }
}

/// The control daemon's version as `nvidia-cuda-mps-control -v` prints it,
/// as NVIDIA numbers it (13010 for CUDA 13.1: static SM partitioning needs
/// 13010+, the Isaac ROS partitioning guide says). None when it prints no
/// such number (older daemons printed a version on Tegra only).
pub fn mps_control_version(config: &Config) -> Option<u32> {
    let mut c = muxflow::node::process::command(config.paths.mps_control.as_path());
    c.arg("-v");
    let out = muxflow::node::process::run(
        c,
        None,
        std::time::Duration::from_secs(5),
        muxflow::node::process::Output::Collect,
    )
    .ok()?;
    // A binary without `-v` prints that it does not know it, and its help,
    // and may exit 0: no version then, whatever numbers the help holds.
    let said = format!("{}{}", out.stdout, out.stderr);
    if muxflow::node::mps::says_unrecognized(&said) {
        return None;
    }
    parse_mps_version(&said)
}

/// The first number in `text` that reads as NVIDIA's CUDA version number
/// (`13010`), or a dotted `13.1` turned into one.
pub fn parse_mps_version(text: &str) -> Option<u32> {
    for word in text.split(|c: char| !(c.is_ascii_digit() || c == '.')) {
        let parts: Vec<&str> = word.split('.').filter(|p| !p.is_empty()).collect();
        match parts[..] {
            [n] if n.len() == 5 => return n.parse().ok(),
            [major, minor, ..] => {
                let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
                if (9..100).contains(&major) && minor < 100 {
                    return Some(major * 1000 + minor * 10);
                }
            }
            _ => {}
        }
    }
    None
}

/// GPU `gpu`'s PCI bus id as NVML gives it (`00000000:18:00.0`), to find
/// its `dmem` region; None (logged) when NVML cannot say.
pub fn pci_bus_id(config: &Config, gpu: u32) -> Option<String> {
    read_device(config, gpu, "cannot find the GPU's dmem region", |d| {
        d.pci_info().map(|p| p.bus_id)
    })
}

/// GPU `gpu`'s region of the kernel's `dmem` controller under the config's
/// cgroup root: None when the kernel has no controller or the driver
/// registered no region for the GPU (the cap then stays xCUDA's).
pub fn dmem_region(config: &Config, gpu: u32) -> Option<String> {
    let regions = muxflow::node::dmem::regions(config.paths.cgroup_root.as_path())?;
    muxflow::node::dmem::region_of(&regions, &pci_bus_id(config, gpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_version_reads_as_nvidia_numbers_it() {
        for (text, want) in [
            ("13010\n", Some(13010)),
            ("nvidia-cuda-mps-control version 13.1\n", Some(13010)),
            ("CUDA MPS 12.8.93", Some(12080)),
            ("nvidia-cuda-mps-control: unknown option -v", None),
            ("", None),
        ] {
            assert_eq!(parse_mps_version(text), want, "{text:?}");
        }
    }
}
