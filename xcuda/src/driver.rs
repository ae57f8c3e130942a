//! The real driver and the `dlsym` / `dlvsym` hooks.
//!
//! The real entry points come from our own `dlopen("libcuda.so.1")` handle
//! (RTLD_LOCAL: its lookups search libcuda and its dependencies only, never
//! this library), so a wrapper never calls itself. Since we export `dlsym`
//! and `dlvsym`, our own calls to either would land on our hooks: the real
//! `dlvsym` is found once in the loaded objects' symbol tables
//! ([`crate::elf`], its default version), and the real `dlsym` is asked of it
//! as `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`.
//!
//! `dlsym(handle, "cu…")` and `dlvsym(handle, "cu…", version)` for a hooked
//! name return our wrapper whenever the real lookup (with that version)
//! finds the symbol; every other lookup goes to the real function. On
//! x86_64 the hooks are naked trampolines that *jump* to the real function
//! for names they do not answer, so `dlsym(RTLD_NEXT, …)` keeps the caller's
//! return address and resolves relative to the caller, not to this library.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::hooks::{self, COUNT};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// The driver's entry point for each hook (index = `hooks::Id`); 0 = unknown.
static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// libc's `dlsym` and `dlvsym`; read by the x86_64 trampolines.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);
static DRIVER: OnceLock<usize> = OnceLock::new();

/// Is `p` inside this library? (By load base: a name like `dlsym` may bind
/// to another library's definition even from inside ours.)
fn is_ours(p: usize) -> bool {
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

fn real_dlvsym() -> Option<DlvsymFn> {
    let mut p = REAL_DLVSYM.load(Relaxed);
    if p == 0 {
        p = crate::elf::find_function(c"dlvsym", &is_ours);
        REAL_DLVSYM.store(p, Relaxed);
    }
    // SAFETY: p is libc's dlvsym, whose signature DlvsymFn is.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, DlvsymFn>(p) })
}

fn real_dlsym() -> Option<DlsymFn> {
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
fn lookup(handle: *mut c_void, name: &CStr) -> usize {
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
        for (i, hk) in hooks::table().iter().enumerate() {
            let p = lookup(h, hk.symbol);
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

/// Our answer to `dlsym(handle, name)` (`version` None) or `dlvsym(handle,
/// name, version)`: the wrapper, or 0 for "ask the real function".
fn answer(handle: *mut c_void, name: *const c_char, version: Option<*const c_char>) -> usize {
    if name.is_null() {
        return 0;
    }
    // SAFETY: the name is a NUL-terminated string per the dlsym/dlvsym contract.
    let name = unsafe { CStr::from_ptr(name) };
    let Some(i) = hooks::index_of(name.to_bytes()) else {
        return 0;
    };
    let found = match version {
        None => lookup(handle, name),
        Some(v) if v.is_null() => 0,
        Some(v) => match real_dlvsym() {
            // SAFETY: the real dlvsym with the caller's handle, name and version.
            Some(f) => unsafe { f(handle, name.as_ptr(), v) as usize },
            None => 0,
        },
    };
    if found == 0 {
        return 0;
    }
    let hk = &hooks::table()[i];
    // Our own handle first: what it resolves is the driver's function itself.
    load();
    if version.is_none() && !is_ours(found) {
        // The driver's own function, reached through the caller's handle (maybe
        // another path to libcuda than ours): remember it if ours lacks it. Not
        // a versioned definition: that may be a stub into the PLT, which
        // would lead back here.
        let _ = REAL[i].compare_exchange(0, found, Relaxed, Relaxed);
    }
    if hooks::deliberately_unhooked(i) {
        return 0;
    }
    // Found our own export (RTLD_DEFAULT): only an answer if the driver has it.
    if real(i).is_some() {
        hk.wrapper
    } else {
        0
    }
}

/// Called by the dlsym trampoline; never unwinds.
extern "C" fn dlsym_answer(handle: *mut c_void, name: *const c_char) -> usize {
    let a = std::panic::catch_unwind(|| answer(handle, name, None)).unwrap_or(0);
    // Make sure the trampoline has somewhere to jump.
    if a == 0 && real_dlsym().is_none() {
        crate::log(format_args!("no real dlsym found"));
        std::process::abort();
    }
    a
}

/// Called by the dlvsym trampoline; never unwinds.
extern "C" fn dlvsym_answer(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> usize {
    let a = std::panic::catch_unwind(|| answer(handle, name, Some(version))).unwrap_or(0);
    if a == 0 && real_dlvsym().is_none() {
        crate::log(format_args!("no real dlvsym found"));
        std::process::abort();
    }
    a
}

/// The exported `dlsym` / `dlvsym`. On x86_64 a naked trampoline: keep the
/// argument registers (three pushes: 16-byte alignment at the call) across
/// the call to the answer, return it if any, else tail-jump to the real
/// function with the caller's return address still on the stack. Elsewhere a
/// plain function (there `RTLD_NEXT` resolves relative to xCUDA).
macro_rules! interpose {
    ($name:ident($($a:ident: $t:ty),*), $answer:ident, $real:ident, $real_fn:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        /// # Safety
        /// The C contract of the libc function of this name.
        pub unsafe extern "C" fn $name($($a: $t),*) -> *mut c_void {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",
                "call {answer}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "test rax, rax",
                "jz 2f",
                "ret",
                "2:",
                "jmp qword ptr [rip + {real}]",
                answer = sym $answer,
                real = sym $real,
            )
        }

        #[cfg(not(target_arch = "x86_64"))]
        #[no_mangle]
        /// # Safety
        /// The C contract of the libc function of this name.
        pub unsafe extern "C" fn $name($($a: $t),*) -> *mut c_void {
            match $answer($($a),*) {
                0 => match $real_fn() {
                    // SAFETY: forwarding the caller's arguments to libc's function.
                    Some(f) => unsafe { f($($a),*) },
                    None => std::ptr::null_mut(),
                },
                a => a as *mut c_void,
            }
        }
    };
}

interpose!(dlsym(handle: *mut c_void, name: *const c_char), dlsym_answer, REAL_DLSYM, real_dlsym);
interpose!(
    dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char),
    dlvsym_answer,
    REAL_DLVSYM,
    real_dlvsym
);

/// Which hook's driver function is `p`? By address, then by the exported
/// name `dladdr` gives it (drivers may hand out other addresses than dlsym).
pub fn hook_of_driver_fn(base: &[u8], p: usize) -> Option<usize> {
    let t = hooks::table();
    if let Some(i) = (0..COUNT).find(|&i| t[i].base.as_bytes() == base && real_if_known(i) == p) {
        return Some(i);
    }
    // SAFETY: dladdr only reads the address; the info is plain data.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a valid out-pointer.
    let ok = unsafe { libc::dladdr(p as *const c_void, &mut info) } != 0;
    if !ok || info.dli_sname.is_null() || info.dli_saddr as usize != p {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated symbol name.
    let sname = unsafe { CStr::from_ptr(info.dli_sname) };
    hooks::index_of(sname.to_bytes()).filter(|&i| t[i].base.as_bytes() == base)
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
