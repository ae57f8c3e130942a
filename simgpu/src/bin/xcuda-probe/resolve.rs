//! The five ways to the driver (HOW, with --pt's per-thread variants) and
//! the report of which library and symbol each resolved name reached.

use super::cudaload;
use cudaload::{Driver, ProcAddress};
use std::ffi::{c_char, c_int, c_void, CStr, CString};

include!(concat!(env!("OUT_DIR"), "/linked.rs"));

/// The symbol version the fake driver also defines every export under.
const SIM_VERSION: &CStr = c"SIMGPU_1";

/// Does `dlvsym` still answer names xCUDA does not hook, relative to the
/// caller? (libc's `malloc` at its base version on x86_64 or aarch64.)
fn dlvsym_passes_through() -> bool {
    // SAFETY: dlsym/dlvsym with NUL-terminated strings.
    unsafe {
        let want = libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
        [c"GLIBC_2.2.5", c"GLIBC_2.17"].iter().any(|v| {
            !want.is_null()
                && libc::dlvsym(libc::RTLD_DEFAULT, c"malloc".as_ptr(), v.as_ptr()) == want
                && libc::dlvsym(libc::RTLD_NEXT, c"malloc".as_ptr(), v.as_ptr()) == want
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
pub enum How {
    Direct,
    Dlsym,
    DlsymDeepbind,
    DlsymDefault,
    Dlvsym,
    GetProc,
    GetProc2,
}

pub struct Resolver {
    how: How,
    pub pt: bool,
    driver: Driver,
    getproc: Option<ProcAddress>,
    /// (wanted symbol, got pointer) of every resolution, for the report.
    seen: std::cell::RefCell<Vec<(String, usize)>>,
}

pub fn die(msg: &str) -> ! {
    eprintln!("xcuda-probe: {msg}");
    std::process::exit(2)
}

impl Resolver {
    pub fn new(how: How, pt: bool) -> Resolver {
        let driver = match how {
            How::DlsymDeepbind => {
                Driver::open_with(libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND)
            }
            _ => Driver::open(),
        }
        .unwrap_or_else(|e| die(&e));
        // The entry point itself as a framework finds it: dlsym on its handle.
        let getproc = match how {
            How::GetProc | How::GetProc2 => Some(
                driver
                    .proc_address(how == How::GetProc2)
                    .unwrap_or_else(|e| die(&e)),
            ),
            _ => None,
        };
        Resolver {
            how,
            pt,
            driver,
            getproc,
            seen: Default::default(),
        }
    }

    /// `base` as cuGetProcAddress is asked; `symbol` the variant wanted
    /// (what the other paths name explicitly).
    pub fn get<T: Copy>(&self, base: &str, symbol: &str) -> T {
        self.get_at(base, symbol, cudaload::CUDA_VERSION)
    }

    /// As [`Resolver::get`]; cuGetProcAddress is asked for CUDA `version`
    /// (how a program built against old headers gets the v1 variants).
    pub fn get_at<T: Copy>(&self, base: &str, symbol: &str, version: c_int) -> T {
        let c = CString::new(match self.getproc {
            Some(_) => base,
            None => symbol,
        })
        .unwrap();
        let flags = if self.pt {
            cudaload::PER_THREAD_DEFAULT_STREAM
        } else {
            0
        };
        let addr = match (self.how, self.getproc) {
            (_, Some(g)) => g.resolve(&c, version, flags),
            (How::Direct, _) => {
                linked(symbol).unwrap_or_else(|| die(&format!("{symbol} not linked")))
            }
            (How::DlsymDefault, _) => {
                // SAFETY: dlsym(RTLD_DEFAULT) with a NUL-terminated name.
                unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) as usize }
            }
            (How::Dlvsym, _) => self.driver.dlvsym(&c, SIM_VERSION),
            _ => self.driver.dlsym(&c),
        };
        if addr == 0 {
            die(&format!("cannot resolve {symbol}"));
        }
        self.seen.borrow_mut().push((symbol.to_string(), addr));
        // SAFETY: `addr` is the driver's (or xCUDA's) `symbol`, whose C
        // signature T is.
        unsafe { cudaload::as_fn(addr) }
    }

    /// How many calls the fake driver's export `symbol` received so far
    /// (its test hook; u64::MAX without the fake).
    pub fn driver_calls(&self, symbol: &str) -> u64 {
        type Calls = unsafe extern "C" fn(*const c_char) -> u64;
        let p = self.driver.dlsym(c"simgpu_calls");
        if p == 0 {
            return u64::MAX;
        }
        let c = CString::new(symbol).unwrap();
        // SAFETY: the fake's `simgpu_calls(const char*)` with a NUL-terminated name.
        unsafe { cudaload::as_fn::<Calls>(p)(c.as_ptr()) }
    }

    /// What this process holds on device 0 by the fake driver's own books
    /// and the most it held at once, in bytes (its test hook; None without
    /// the fake or before `cuInit`).
    pub fn driver_books(&self) -> Option<(u64, u64)> {
        type Books = unsafe extern "C" fn(c_int, *mut u64, *mut u64) -> u32;
        let p = self.driver.dlsym(c"simgpu_mem_books");
        if p == 0 {
            return None;
        }
        let (mut used, mut peak) = (0u64, 0u64);
        // SAFETY: the fake's `simgpu_mem_books(int, u64*, u64*)` with valid out-pointers.
        let rc = unsafe { cudaload::as_fn::<Books>(p)(0, &mut used, &mut peak) };
        (rc == 0).then_some((used, peak))
    }

    /// Which library and symbol each resolved pointer is.
    pub fn report(&self) {
        let mut inside = 0;
        let mut wrong_variant = Vec::new();
        let (mut hooked, mut passed) = (Vec::new(), Vec::new());
        let seen = self.seen.borrow();
        for (want, p) in seen.iter() {
            // SAFETY: dladdr only reads; zeroed Dl_info is valid.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { libc::dladdr(*p as *const c_void, &mut info) };
            let file = if info.dli_fname.is_null() {
                String::new()
            } else {
                // SAFETY: dladdr's NUL-terminated strings.
                unsafe { CStr::from_ptr(info.dli_fname) }
                    .to_string_lossy()
                    .into_owned()
            };
            let sym = if info.dli_sname.is_null() {
                String::new()
            } else {
                // SAFETY: as above.
                unsafe { CStr::from_ptr(info.dli_sname) }
                    .to_string_lossy()
                    .into_owned()
            };
            if file.contains("libmuxflow_xcuda") {
                inside += 1;
                hooked.push(want.clone());
            } else {
                passed.push(want.clone());
            }
            if &sym != want {
                wrong_variant.push(format!("{want}->{sym}"));
            }
        }
        for l in [&mut hooked, &mut passed] {
            l.sort();
            l.dedup();
        }
        println!("resolved={} in_xcuda={inside}", seen.len());
        println!("hooked={}", hooked.join(","));
        println!("passed={}", passed.join(","));
        if self.how == How::Dlvsym {
            println!("dlvsym_passthrough={}", u8::from(dlvsym_passes_through()));
        }
        println!("wrong_variants={}", wrong_variant.join(","));
    }
}

pub fn pt(r: &Resolver, name: &str) -> String {
    if r.pt {
        format!("{name}_ptsz")
    } else {
        name.to_string()
    }
}
