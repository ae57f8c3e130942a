//! `CUDA_VISIBLE_DEVICES` as the driver reads it, and MPS's renumbering.
//!
//! NVIDIA (MPS docs, Appendix: Environment Variables, CUDA_VISIBLE_DEVICES):
//! a control daemon started with `CUDA_VISIBLE_DEVICES` set shows its
//! clients only those devices, "remapped" — numbered from 0 in the
//! daemon's order; a client that keeps the daemon's index names a device
//! the server does not have, "which would lead to an error"; UUIDs avoid the
//! ambiguity. So a client's devices are resolved twice: the daemon's list
//! against the node's GPUs, then the client's own list against the
//! daemon's devices. The driver's reading of one list: entries are indices
//! into the devices it can see or `GPU-…` UUIDs; it stops at the first
//! entry that names nothing (CUDA programming guide, "CUDA Environment
//! Variables"); an unset variable shows every device.
//!
//! Which error a client gets when nothing it names is left is not
//! documented: the model answers `CUDA_ERROR_NO_DEVICE` from `cuInit`, as
//! the driver does for a list that names no device without MPS (a guess
//! for the MPS case).

/// The positions in `uuids` (the devices a process can see, in order) that
/// the list `spec` names, in the list's order; `None`: every device.
pub fn resolve(spec: Option<&str>, uuids: &[&str]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
            uuids.iter().position(|u| *u == entry)
        } else {
            entry.parse::<usize>().ok().filter(|&i| i < uuids.len())
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The devices a client of an MPS daemon sees: the node's GPUs (`uuids`, by
/// index) through the daemon's list, then through the client's own.
/// Positions in `uuids`.
pub fn through_mps(daemon: Option<&str>, client: Option<&str>, uuids: &[&str]) -> Vec<usize> {
    let server = resolve(daemon, uuids);
    let renumbered: Vec<&str> = server.iter().map(|&i| uuids[i]).collect();
    resolve(client, &renumbered)
        .into_iter()
        .map(|i| server[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: [&str; 3] = ["GPU-a", "GPU-b", "GPU-c"];

    #[test]
    fn a_list_names_devices_by_index_or_uuid_and_stops_at_the_first_bad_entry() {
        assert_eq!(resolve(None, &NODE), vec![0, 1, 2]);
        assert_eq!(resolve(Some("2,0"), &NODE), vec![2, 0]);
        assert_eq!(resolve(Some("GPU-b"), &NODE), vec![1]);
        assert_eq!(resolve(Some("1,7,0"), &NODE), vec![1]);
        assert_eq!(resolve(Some("GPU-x,0"), &NODE), Vec::<usize>::new());
        assert_eq!(resolve(Some(""), &NODE), Vec::<usize>::new());
    }

    #[test]
    fn mps_renumbers_the_daemons_devices_from_zero() {
        // NVIDIA's example: devices 0, 1, 2; the daemon started with 0,2.
        assert_eq!(through_mps(Some("0,2"), None, &NODE), vec![0, 2]);
        assert_eq!(through_mps(Some("0,2"), Some("1"), &NODE), vec![2]);
        // "keeping CUDA_VISIBLE_DEVICES set to 0,2 ... would lead to an error"
        assert_eq!(
            through_mps(Some("0,2"), Some("2"), &NODE),
            Vec::<usize>::new()
        );
        // One GPU's daemon: its index in the client names nothing past 0.
        assert_eq!(
            through_mps(Some("1"), Some("1"), &NODE),
            Vec::<usize>::new()
        );
        assert_eq!(through_mps(Some("1"), Some("0"), &NODE), vec![1]);
        // UUIDs mean the same device on both sides.
        assert_eq!(through_mps(Some("GPU-b"), Some("GPU-b"), &NODE), vec![1]);
        assert_eq!(
            through_mps(Some("GPU-b"), Some("GPU-c"), &NODE),
            Vec::<usize>::new()
        );
        assert_eq!(through_mps(Some("GPU-c"), None, &NODE), vec![2]);
    }
}
