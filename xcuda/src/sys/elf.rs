//! Finding a function in the loaded objects without `dlsym` or `dlvsym`.
//!
//! xCUDA exports both (its hooks), so any call it makes to them lands on
//! itself; the real `dlvsym` has to be found another way once, and the real
//! `dlsym` is then asked of it (see [`crate::sys::driver`]). This walks the
//! objects `dl_iterate_phdr` reports, in load order (the program, preloads,
//! libraries), and looks the name up in each dynamic
//! symbol table through its GNU or SysV hash table, taking a defined
//! function at its default version — what the dynamic linker binds a newly
//! linked program's reference to.

use std::ffi::{c_char, c_int, c_void, CStr};

/// `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
/// A `.gnu.version` entry with this bit is a non-default (`name@VERSION`) definition.
const VERSYM_HIDDEN: u16 = 0x8000;

struct Search<'a> {
    name: &'a [u8],
    skip: &'a dyn Fn(usize) -> bool,
    found: usize,
}

/// The default-version definition of function `name` in the first loaded
/// object that has one `skip` does not reject (xCUDA rejects its own); 0 if none.
pub fn find_function(name: &CStr, skip: &dyn Fn(usize) -> bool) -> usize {
    let mut s = Search {
        name: name.to_bytes(),
        skip,
        found: 0,
    };
    // SAFETY: the callback only reads what dl_iterate_phdr hands it and
    // writes to `s`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut s as *mut Search as *mut c_void) };
    s.found
}

extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info; data is our Search.
    let (info, s) = unsafe { (&*info, &mut *(data as *mut Search)) };
    // SAFETY: the object's program headers and dynamic section, as mapped.
    match unsafe { lookup(info, s.name) } {
        Some(p) if !(s.skip)(p) => {
            s.found = p;
            1
        }
        _ => 0,
    }
}

/// # Safety
/// `info` describes a loaded object whose dynamic section is mapped.
unsafe fn lookup(info: &libc::dl_phdr_info, name: &[u8]) -> Option<usize> {
    let base = info.dlpi_addr as usize;
    if info.dlpi_phdr.is_null() {
        return None;
    }
    // SAFETY: dlpi_phnum headers at dlpi_phdr, per dl_iterate_phdr.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    // glibc relocates these entries in place; objects it maps read-only
    // (the vDSO) keep offsets from the base.
    let at = |v: u64| {
        let v = v as usize;
        if v < base {
            base + v
        } else {
            v
        }
    };
    let (mut strtab, mut symtab, mut gnu, mut sysv, mut versym) = (0, 0, 0, 0, 0);
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    loop {
        // SAFETY: the dynamic section is an array ending with DT_NULL.
        let e = unsafe { &*d };
        match e.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = at(e.val),
            DT_SYMTAB => symtab = at(e.val),
            DT_GNU_HASH => gnu = at(e.val),
            DT_HASH => sysv = at(e.val),
            DT_VERSYM => versym = at(e.val),
            _ => {}
        }
        // SAFETY: not past DT_NULL yet.
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return None;
    }
    let is = |i: u32| -> Option<usize> {
        // SAFETY: `i` comes from the object's own hash table, so it indexes
        // its symbol (and version) table; names are NUL-terminated in strtab.
        unsafe {
            let sym = &*(symtab as *const libc::Elf64_Sym).add(i as usize);
            if sym.st_shndx == 0 || sym.st_value == 0 || sym.st_info & 0xf != STT_FUNC {
                return None;
            }
            if versym != 0 && *(versym as *const u16).add(i as usize) & VERSYM_HIDDEN != 0 {
                return None;
            }
            let n = CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char);
            (n.to_bytes() == name).then_some(base + sym.st_value as usize)
        }
    };
    // SAFETY: the hash tables' layouts per the ELF / GNU specifications.
    unsafe {
        if gnu != 0 {
            let h = gnu as *const u32;
            let (nbuckets, symoffset, bloom_words) = (*h, *h.add(1), *h.add(2));
            if nbuckets == 0 {
                return None;
            }
            let buckets = (gnu + 16 + bloom_words as usize * 8) as *const u32;
            let chain = buckets.add(nbuckets as usize);
            let hash = name
                .iter()
                .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
            let mut i = *buckets.add((hash % nbuckets) as usize);
            if i < symoffset {
                return None;
            }
            loop {
                let ch = *chain.add((i - symoffset) as usize);
                if ch | 1 == hash | 1 {
                    if let Some(p) = is(i) {
                        return Some(p);
                    }
                }
                if ch & 1 != 0 {
                    return None;
                }
                i += 1;
            }
        } else if sysv != 0 {
            let h = sysv as *const u32;
            let nbucket = *h;
            if nbucket == 0 {
                return None;
            }
            let bucket = h.add(2);
            let chain = bucket.add(nbucket as usize);
            let hash = name.iter().fold(0u32, |h, &c| {
                let h = (h << 4).wrapping_add(c as u32);
                let g = h & 0xf000_0000;
                (h ^ (g >> 24)) & !g
            });
            let mut i = *bucket.add((hash % nbucket) as usize);
            while i != 0 {
                if let Some(p) = is(i) {
                    return Some(p);
                }
                i = *chain.add(i as usize);
            }
            None
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_functions_where_dlsym_does() {
        for name in [c"dlvsym", c"dlsym", c"malloc", c"getpid"] {
            let p = find_function(name, &|_| false);
            // SAFETY: dlsym with a NUL-terminated name (unit tests do not
            // link the hooks' exports into the test binary's lookups).
            let want = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
            assert_ne!(p, 0, "{name:?}");
            assert_eq!(p, want, "{name:?}");
        }
        assert_eq!(find_function(c"no_such_function_anywhere", &|_| false), 0);
        // A rejected definition is passed over (there is no second malloc).
        assert_eq!(find_function(c"malloc", &|_| true), 0);
    }
}
