//! Who may reach a GPU's MPS daemon: the users with a job recorded on
//! that GPU, and root.
//!
//! The daemon takes commands from whoever reaches its control socket
//! (`terminate_client`, `quit`, …; NVIDIA documents no per-user check), and
//! the socket lives in the GPU's pipe directory, which root makes. That
//! directory's POSIX access ACL gives each user with a job recorded on the
//! GPU what every user had before (read and search: a client connects to
//! the sockets the daemon made there) and everyone else nothing, so a user
//! with no job on the GPU can neither be its client nor send its daemon a
//! command. The Prolog sets it once the job is recorded, the Epilog once it
//! is forgotten, and each health step again (a daemon started again by the
//! step may have made the directory afresh). A connection made before a
//! user's last job there ended stays open (the kernel checks at connect):
//! the police evict such clients as before.
//!
//! Where the filesystem has no ACLs (`EOPNOTSUPP`), the directory stays
//! open to every user as before (mode 0755) and [`Access::Open`] says so:
//! no job is refused for it, and the police still judge every client.
//!
//! The ACL is written as the kernel's `system.posix_acl_access` extended
//! attribute (linux/posix_acl_xattr.h): a 4-byte version, then (tag, perm,
//! id) entries, little-endian, in tag order and, for named users, uid
//! order; with a named user the mask entry is required.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const XATTR_NAME: &std::ffi::CStr = c"system.posix_acl_access";
const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;
const RWX: u16 = 7;
const RX: u16 = 5;
/// The directory's mode where no ACL can be set: what every GPU's pipe
/// directory had before (root writes, every user reads and searches).
const OPEN_MODE: u32 = 0o755;

#[derive(Debug, thiserror::Error)]
#[error("{dir}: cannot set who may reach the MPS daemon: {source}")]
pub struct PipeAccessError {
    dir: PathBuf,
    source: std::io::Error,
}

/// What [`admit_only`] left the directory as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Root and these users only.
    Users(BTreeSet<u32>),
    /// Every user: the filesystem keeps no ACLs.
    Open,
}

/// Gives the users `uids` (and root) access to the pipe directory `dir`,
/// and every other user none. `dir` must be a directory owned by this
/// process's user (root), not a symlink.
pub fn admit_only(dir: &Path, uids: &BTreeSet<u32>) -> Result<Access, PipeAccessError> {
    let err = |source| PipeAccessError {
        dir: dir.to_path_buf(),
        source,
    };
    let f = open_dir(dir).map_err(err)?;
    let acl = encode(uids);
    // SAFETY: the fd is open for the call; name is NUL-terminated and
    // acl's pointer and length describe a live buffer.
    let rc = unsafe {
        libc::fsetxattr(
            f.as_raw_fd(),
            XATTR_NAME.as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    if rc == 0 {
        return Ok(Access::Users(uids.clone()));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        f.set_permissions(std::fs::Permissions::from_mode(OPEN_MODE))
            .map_err(err)?;
        return Ok(Access::Open);
    }
    Err(err(e))
}

/// Who may reach `dir` now: the users its ACL names, [`Access::Open`]
/// where it has none and others may search it; `None` where neither (a
/// directory only root reaches).
pub fn admitted(dir: &Path) -> std::io::Result<Option<Access>> {
    let f = open_dir(dir)?;
    let mut buf = vec![0u8; 4 + 8 * 512];
    // SAFETY: the fd is open; buf's pointer and length describe a live,
    // writable buffer.
    let n = unsafe {
        libc::fgetxattr(
            f.as_raw_fd(),
            XATTR_NAME.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) {
            let mode = f.metadata()?.mode();
            return Ok((mode & 0o001 != 0).then_some(Access::Open));
        }
        return Err(e);
    }
    Ok(decode(&buf[..n as usize]).map(Access::Users))
}

fn open_dir(dir: &Path) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)?;
    if f.metadata()?.uid() != crate::node::state::euid() {
        return Err(std::io::Error::other("not owned by this user"));
    }
    Ok(f)
}

/// The xattr value: the owner rwx, each of `uids` r-x, the group and
/// others nothing.
fn encode(uids: &BTreeSet<u32>) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    let mut entry = |tag: u16, perm: u16, id: u32| {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    };
    entry(USER_OBJ, RWX, UNDEFINED_ID);
    for &uid in uids {
        entry(USER, RX, uid);
    }
    entry(GROUP_OBJ, 0, UNDEFINED_ID);
    if !uids.is_empty() {
        entry(MASK, RX, UNDEFINED_ID);
    }
    entry(OTHER, 0, UNDEFINED_ID);
    out
}

/// The named users of an xattr value with r-x under the mask; `None` for a
/// value that is not an ACL or lets others in.
fn decode(bytes: &[u8]) -> Option<BTreeSet<u32>> {
    let (version, rest) = bytes.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*version) != VERSION || rest.len() % 8 != 0 {
        return None;
    }
    let mut users = BTreeSet::new();
    let mut mask = RWX;
    for e in rest.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        match tag {
            USER if perm & 1 != 0 => {
                users.insert(id);
            }
            MASK => mask = perm,
            OTHER if perm != 0 => return None,
            _ => {}
        }
    }
    Some(if mask & 1 != 0 {
        users
    } else {
        BTreeSet::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(uids: &[u32]) -> BTreeSet<u32> {
        uids.iter().copied().collect()
    }

    #[test]
    fn the_acl_names_each_user_in_order_with_a_mask() {
        let acl = encode(&set(&[1001, 7]));
        // version, owner, two users (sorted), group, mask, other.
        assert_eq!(acl.len(), 4 + 6 * 8);
        assert_eq!(&acl[..4], &2u32.to_le_bytes());
        let tags: Vec<u16> = acl[4..]
            .chunks_exact(8)
            .map(|e| u16::from_le_bytes([e[0], e[1]]))
            .collect();
        assert_eq!(tags, [USER_OBJ, USER, USER, GROUP_OBJ, MASK, OTHER]);
        assert_eq!(decode(&acl), Some(set(&[7, 1001])));
        // No user: no mask, nobody but root.
        let none = encode(&BTreeSet::new());
        assert_eq!(none.len(), 4 + 3 * 8);
        assert_eq!(decode(&none), Some(BTreeSet::new()));
    }

    #[test]
    fn an_acl_that_lets_others_in_is_not_read_as_a_list() {
        let mut acl = encode(&set(&[7]));
        let other = acl.len() - 8;
        acl[other + 2] = 5;
        assert_eq!(decode(&acl), None);
        assert_eq!(decode(b"\x01\x00\x00\x00"), None);
    }

    /// On this machine's filesystem (the test's temporary directory): the
    /// kernel takes the ACL and gives it back; where it keeps none, the
    /// directory is left open as before.
    #[test]
    fn the_kernel_keeps_the_list_or_the_directory_stays_open() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("0");
        std::fs::create_dir(&pipe).unwrap();
        match admit_only(&pipe, &set(&[65534, 1])).unwrap() {
            Access::Users(u) => {
                assert_eq!(u, set(&[1, 65534]));
                assert_eq!(
                    admitted(&pipe).unwrap(),
                    Some(Access::Users(set(&[1, 65534])))
                );
                // Others: nothing (the mode's last digit).
                let mode = std::fs::metadata(&pipe).unwrap().mode() & 0o777;
                assert_eq!(mode & 0o007, 0, "{mode:o}");
                // No user: the kernel keeps it as the mode, 0700: root only.
                admit_only(&pipe, &BTreeSet::new()).unwrap();
                assert_eq!(admitted(&pipe).unwrap(), None);
                let mode = std::fs::metadata(&pipe).unwrap().mode() & 0o777;
                assert_eq!(mode, 0o700, "{mode:o}");
            }
            Access::Open => {
                let mode = std::fs::metadata(&pipe).unwrap().mode() & 0o777;
                assert_eq!(mode, OPEN_MODE);
                assert_eq!(admitted(&pipe).unwrap(), Some(Access::Open));
            }
        }
    }

    #[test]
    fn a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("0");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(admit_only(&link, &set(&[7])).is_err());
    }
}
