//! Directories a job's user writes in, under a root-owned parent (the
//! xCUDA statistics and report files of a job, an online job's page):
//! bounded while the job runs, removed by root afterwards without trusting
//! what the user left there.
//!
//! * [`mount_bounded`]: a small tmpfs of the user's (bytes and inodes
//!   capped) at the directory, so whatever the user writes there cannot fill
//!   the filesystem muxflow's own state lives on;
//! * [`remove`]: detaches such a mount, then removes what is left with at
//!   most two directory descriptors open, however deep the user's tree is
//!   (`std::fs::remove_dir_all` holds one per level and runs out of
//!   descriptors on a tree thousands of levels deep). Every step is
//!   relative to a descriptor opened without following symlinks, so a
//!   symlink the user swaps in is never followed.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Bytes and inodes a job's directory may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub mib: u64,
    pub inodes: u64,
}

/// Mounts a tmpfs of `bounds` at `dir` (created if missing, its root
/// owned by `uid`:`gid` with `mode`). An error leaves `dir` as it was (the
/// caller may fall back to a plain directory).
pub fn mount_bounded(dir: &Path, uid: u32, gid: u32, mode: u32, bounds: Bounds) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let target = cstring(dir.as_os_str())?;
    let options = CString::new(format!(
        "size={}m,nr_inodes={},mode={mode:04o},uid={uid},gid={gid}",
        bounds.mib, bounds.inodes
    ))
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"muxflow-job".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            flags,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `dir` and everything in it: a mount there is detached first
/// (lazily: a process still holding it open keeps its files, nobody else
/// sees them). A missing `dir` is no error.
pub fn remove(dir: &Path) -> io::Result<()> {
    let path = cstring(dir.as_os_str())?;
    // SAFETY: a NUL-terminated path; EINVAL means nothing is mounted there.
    let rc = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
            return Err(e);
        }
    }
    let root = match open_dir(libc::AT_FDCWD, &path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    empty(&root)?;
    drop(root);
    std::fs::remove_dir(dir)
}

/// Empties the directory `root` with at most one more descriptor open:
/// files are unlinked; each subdirectory's entries are moved up into
/// `root` (flattening the tree one level per pass), then it is removed.
fn empty(root: &OwnedFd) -> io::Result<()> {
    let mut serial = 0u64;
    loop {
        let entries = list(root)?;
        if entries.is_empty() {
            return Ok(());
        }
        for name in entries {
            // SAFETY: a NUL-terminated name relative to a directory we hold.
            if unsafe { libc::unlinkat(root.as_raw_fd(), name.as_ptr(), 0) } == 0 {
                continue;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EISDIR) {
                return Err(e);
            }
            let sub = open_dir(root.as_raw_fd(), &name)?;
            for inner in list(&sub)? {
                serial += 1;
                let up = CString::new(format!(".muxflow-rm-{serial}")).expect("no NUL");
                // SAFETY: NUL-terminated names relative to directories we hold.
                let rc = unsafe {
                    libc::renameat(
                        sub.as_raw_fd(),
                        inner.as_ptr(),
                        root.as_raw_fd(),
                        up.as_ptr(),
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            drop(sub);
            // SAFETY: as above; the directory is empty now.
            if unsafe { libc::unlinkat(root.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
}

/// Opens directory `name` relative to `at`, never through a symlink.
fn open_dir(at: libc::c_int, name: &CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name; the returned descriptor is owned below.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names in directory `dir` (not `.` and `..`), read through a
/// duplicate of its descriptor that is closed before returning.
fn list(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let dup = dir.try_clone()?;
    // SAFETY: fdopendir takes ownership of the duplicate descriptor.
    let stream = unsafe { libc::fdopendir(dup.as_raw_fd()) };
    if stream.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(dup);
    // SAFETY: the stream is valid until closedir below.
    unsafe { libc::rewinddir(stream) };
    let mut names = Vec::new();
    loop {
        // SAFETY: the stream is valid; readdir's entry lives until the next call.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    // SAFETY: the stream came from fdopendir and is closed once.
    unsafe { libc::closedir(stream) };
    Ok(names)
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain `a/a/a/…` `depth` deep under `dir`, built one level at a
    /// time relative to the level above (paths stay short), with a file at
    /// the bottom.
    fn deep_tree(dir: &Path, depth: usize) {
        std::fs::create_dir(dir).unwrap();
        let mut at = open_dir(libc::AT_FDCWD, &cstring(dir.as_os_str()).unwrap()).unwrap();
        for _ in 0..depth {
            // SAFETY: a NUL-terminated name relative to a directory we hold.
            assert_eq!(
                unsafe { libc::mkdirat(at.as_raw_fd(), c"a".as_ptr(), 0o755) },
                0
            );
            at = open_dir(at.as_raw_fd(), c"a").unwrap();
        }
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC;
        // SAFETY: as above; the descriptor is closed at once.
        let fd = unsafe { libc::openat(at.as_raw_fd(), c"bottom".as_ptr(), flags, 0o644) };
        assert!(fd >= 0);
        // SAFETY: `fd` was just opened here.
        unsafe { libc::close(fd) };
    }

    /// Run in a process of its own: running out of descriptors is
    /// process-wide, and the other tests of this binary open files
    /// meanwhile (one failed with EMFILE while std's removal below ran).
    #[test]
    fn a_tree_deeper_than_the_descriptor_limit_is_removed() {
        let name = "node::user_tree::tests::deep_tree_removal_in_its_own_process";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--ignored", "--test-threads=1"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{name}: {text}"
        );
    }

    #[test]
    #[ignore = "run in its own process by a_tree_deeper_than_the_descriptor_limit_is_removed"]
    fn deep_tree_removal_in_its_own_process() {
        let tmp = tempfile::tempdir().unwrap();
        // Deeper than a soft limit of 1024 open files, which this test
        // sets for its process.
        let depth = 1500;
        let saved = set_nofile_soft(1024);
        let std_way = tmp.path().join("std");
        deep_tree(&std_way, depth);
        // What the Epilog used: it runs out of descriptors.
        let std_result = std::fs::remove_dir_all(&std_way);
        let ours = tmp.path().join("ours");
        deep_tree(&ours, depth);
        let ours_result = remove(&ours);
        set_nofile_soft(saved);
        assert!(
            std_result.is_err(),
            "std's removal did not run out of descriptors"
        );
        ours_result.unwrap();
        assert!(!ours.exists());
        // Files, a symlink out of the tree (not followed) and nested
        // directories side by side.
        let mixed = tmp.path().join("mixed");
        std::fs::create_dir_all(mixed.join("d/e")).unwrap();
        std::fs::write(mixed.join("d/e/f"), b"x").unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, mixed.join("d/link")).unwrap();
        remove(&mixed).unwrap();
        assert!(!mixed.exists());
        assert!(outside.join("keep").exists(), "the symlink was followed");
        remove(&tmp.path().join("never-made")).unwrap();
    }

    /// Sets the soft limit of open files (at most the hard one); returns
    /// the previous soft limit.
    fn set_nofile_soft(soft: u64) -> u64 {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write the struct we pass.
        unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
            let previous = r.rlim_cur;
            r.rlim_cur = soft.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            previous
        }
    }
}
