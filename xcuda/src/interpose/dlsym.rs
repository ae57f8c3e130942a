//! The `dlsym` / `dlvsym` hooks.
//!
//! `dlsym(handle, "cu…")` and `dlvsym(handle, "cu…", version)` for a hooked
//! name return our wrapper whenever the real lookup (with that version)
//! finds the symbol; every other lookup goes to the real function. On
//! x86_64 the hooks are naked trampolines that *jump* to the real function
//! for names they do not answer, so `dlsym(RTLD_NEXT, …)` keeps the caller's
//! return address and resolves relative to the caller, not to this library.

use std::ffi::{c_char, c_void, CStr};

use super::hooks;
use crate::sys::driver::{
    self, is_ours, lookup, real, real_dlsym, real_dlvsym, REAL_DLSYM, REAL_DLVSYM,
};

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
    driver::load();
    if version.is_none() && !is_ours(found) {
        // The driver's own function, reached through the caller's handle (maybe
        // another path to libcuda than ours): remember it if ours lacks it. Not
        // a versioned definition: that may be a stub into the PLT, which
        // would lead back here.
        driver::remember(i, found);
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
