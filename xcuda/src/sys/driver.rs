//! The real driver and the C library, as they are: their functions found
//! without going through xCUDA's own exports (`dlsym`, `dlvsym`,
//! `sigaction`... which the interpose layer defines).
//!
//! The driver's entry points come from our own `dlopen("libcuda.so.1")`
//! handle (RTLD_LOCAL: its lookups search libcuda and its dependencies only,
//! never this library), so a wrapper never calls itself. Since xCUDA exports
//! `dlsym` and `dlvsym`, its own calls to either would land on its hooks: the
//! real `dlvsym` is found once in the loaded objects' symbol tables
//! ([`super::elf`], its default version), and the real `dlsym` is asked of
//! it as `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::abi::ENTRY_POINTS;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// How many entry points the list has (the index space of [`real`]).
pub const COUNT: usize = ENTRY_POINTS.len();

/// The driver's function for each hooked entry point (index = position in
/// the list); 0 = unknown.
static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// libc's `dlsym` and `dlvsym`; read by the interpose layer's x86_64 trampolines.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
pub static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);
static DRIVER: OnceLock<usize> = OnceLock::new();

/// Is `p` inside this library? (By load base: a name like `dlsym` may bind
/// to another library's definition even from inside ours.)
pub fn is_ours(p: usize) -> bool {
    fn base(p: usize) -> usize {
        // SAFETY: dladdr only reads; a zeroed Dl_info is valid.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: as above, with a valid out-pointer.
        match unsafe { libc::dladdr(p as *const c_void, &mut info) } {
            0 => 0,
            _ => info.dli_fbase as usize,
        }
    }
    base(p) == base(is_ours as *const () as usize)
}

pub fn real_dlvsym() -> Option<DlvsymFn> {
    let mut p = REAL_DLVSYM.load(Relaxed);
    if p == 0 {
        p = super::elf::find_function(c"dlvsym", &is_ours);
        REAL_DLVSYM.store(p, Relaxed);
    }
    // SAFETY: p is libc's dlvsym, whose signature DlvsymFn is.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, DlvsymFn>(p) })
}

pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Relaxed);
    if p == 0 {
        let dlvsym = real_dlvsym()?;
        // RTLD_NEXT when preloaded; RTLD_DEFAULT when dlopen'ed locally (the
        // benchmark), where RTLD_NEXT has nothing after us. Never our own.
        'found: for h in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
            for v in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
                // SAFETY: libc's dlvsym with NUL-terminated strings.
                p = unsafe { dlvsym(h, c"dlsym".as_ptr(), v.as_ptr()) } as usize;
                if p != 0 && !is_ours(p) {
                    break 'found;
                }
                p = 0;
            }
        }
        REAL_DLSYM.store(p, Relaxed);
    }
    // SAFETY: p is libc's dlsym, whose signature DlsymFn is.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// Looks `name` up with the real `dlsym`.
pub(crate) fn lookup(handle: *mut c_void, name: &CStr) -> usize {
    match real_dlsym() {
        // SAFETY: the real dlsym with a caller-supplied handle and a valid name.
        Some(f) => unsafe { f(handle, name.as_ptr()) as usize },
        None => 0,
    }
}

/// Opens the driver once and resolves every hooked entry point.
/// Returns the handle (0 when libcuda.so.1 cannot be opened).
pub fn load() -> usize {
    *DRIVER.get_or_init(|| {
        // SAFETY: dlopen with a NUL-terminated name; the handle is kept forever.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            crate::log(format_args!("cannot open libcuda.so.1; driver calls fail"));
            return 0;
        }
        for (i, e) in ENTRY_POINTS.iter().enumerate() {
            if e.action == "pass" {
                continue;
            }
            let Ok(name) = CString::new(e.symbol) else {
                continue;
            };
            let p = lookup(h, &name);
            if p != 0 && !is_ours(p) {
                let _ = REAL[i].compare_exchange(0, p, Relaxed, Relaxed);
            }
        }
        h as usize
    })
}

/// The driver's function for hook `i`, loading the driver on first use.
#[inline]
pub fn real(i: usize) -> Option<usize> {
    let p = REAL[i].load(Relaxed);
    if p != 0 {
        return Some(p);
    }
    load();
    let p = REAL[i].load(Relaxed);
    (p != 0).then_some(p)
}

/// The driver's function for hook `i` without loading anything.
pub fn real_if_known(i: usize) -> usize {
    REAL[i].load(Relaxed)
}

/// The driver's export `name` (for calls xCUDA makes itself, e.g. at exit).
pub fn driver_symbol(name: &CStr) -> usize {
    match load() {
        0 => 0,
        h => lookup(h as *mut c_void, name),
    }
}

/// Remembers `p` as the driver's function for entry point `i` if none is
/// known yet (found through a caller's own handle to the driver).
pub fn remember(i: usize, p: usize) {
    let _ = REAL[i].compare_exchange(0, p, Relaxed, Relaxed);
}

/// The C library's own function `name` (the next definition after this
/// library's, never our interposer of the same name); 0 if none.
pub fn libc_next(name: &CStr) -> usize {
    let Some(dlvsym) = real_dlvsym() else {
        return 0;
    };
    for h in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
        for v in [c"GLIBC_2.2.5", c"GLIBC_2.17", c"GLIBC_2.0"] {
            // SAFETY: libc's dlvsym with NUL-terminated strings.
            let p = unsafe { dlvsym(h, name.as_ptr(), v.as_ptr()) } as usize;
            if p != 0 && !is_ours(p) {
                return p;
            }
        }
    }
    0
}
