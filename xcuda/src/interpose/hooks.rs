//! The hooks, generated from the one entry-point list
//! ([`cuda_entry_points!`](crate::abi)): for every entry point whose action
//! is not `pass`, an exported function of its exact C signature that calls
//! the driver's own function through the action (count against the quota,
//! gate, record the context...); and [`table`] / [`index_of`], what the
//! `dlsym`/`dlvsym` hooks and the `cuGetProcAddress` answer look names and
//! variants up in.
//!
//! Every export catches panics (`CUDA_ERROR_UNKNOWN`) and returns the
//! driver's CUresult as a raw `u32`, so codes we do not know pass through.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // C ABI: the CUDA driver API documents these.
#![allow(clippy::too_many_arguments)] // C signatures.

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::abi::types::*;
use crate::abi::{cu, Array3dDesc, Array3dDescV1, ArrayDesc, ArrayDescV1, MemAllocNodeParams};
use crate::lifecycle::start;
use crate::state::graphmem::{stream_key, Target};
use crate::state::memcap::{array_bytes, Kind};
use crate::state::{contexts, gate, graphmem, memcap, online, Source};
use crate::sys::driver::{self, COUNT};

/// One entry point of the list: `symbol` is the exported name
/// (NUL-terminated for dlsym), `base` the name cuGetProcAddress is asked
/// for, `wrapper` the address of our export (0: passed through, not hooked).
#[derive(Debug)]
pub struct Hook {
    pub symbol: &'static CStr,
    pub base: &'static str,
    pub wrapper: usize,
}

fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(cu::UNKNOWN)
}

/// A value a driver writes through an out-pointer, as a number.
trait OutValue: Copy {
    fn value(self) -> u64;
}
impl OutValue for u32 {
    fn value(self) -> u64 {
        self as u64
    }
}
impl OutValue for u64 {
    fn value(self) -> u64 {
        self
    }
}
impl OutValue for usize {
    fn value(self) -> u64 {
        self as u64
    }
}
impl OutValue for *mut c_void {
    fn value(self) -> u64 {
        self as usize as u64
    }
}

/// Reads a caller's out-pointer after the driver filled it (0 if null).
fn out<T: OutValue>(p: *const T) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: non-null out-pointer the driver just wrote on success.
    unsafe { p.read() }.value()
}

/// A handle argument (pointer, 32- or 64-bit address) as the books' key.
trait AsHandle: Copy {
    fn handle(self) -> u64;
}
impl AsHandle for u32 {
    fn handle(self) -> u64 {
        self as u64
    }
}
impl AsHandle for u64 {
    fn handle(self) -> u64 {
        self
    }
}
impl AsHandle for *mut c_void {
    fn handle(self) -> u64 {
        self as usize as u64
    }
}

/// An array descriptor: extents (0 = dimension unused), format, channels.
trait Extents {
    fn extents(&self) -> (usize, usize, usize, c_uint, c_uint);
}
impl Extents for ArrayDesc {
    fn extents(&self) -> (usize, usize, usize, c_uint, c_uint) {
        (self.width, self.height, 0, self.format, self.channels)
    }
}
impl Extents for Array3dDesc {
    fn extents(&self) -> (usize, usize, usize, c_uint, c_uint) {
        (
            self.width,
            self.height,
            self.depth,
            self.format,
            self.channels,
        )
    }
}
impl Extents for ArrayDescV1 {
    fn extents(&self) -> (usize, usize, usize, c_uint, c_uint) {
        let e = |v: c_uint| v as usize;
        (e(self.width), e(self.height), 0, self.format, self.channels)
    }
}
impl Extents for Array3dDescV1 {
    fn extents(&self) -> (usize, usize, usize, c_uint, c_uint) {
        let e = |v: c_uint| v as usize;
        (
            e(self.width),
            e(self.height),
            e(self.depth),
            self.format,
            self.channels,
        )
    }
}

/// The figures `cuMemGetInfo` writes (`usize`, or `c_uint` for v1).
trait MemFigure: Copy {
    fn get(self) -> u64;
    fn from_clamped(v: u64) -> Self;
}
impl MemFigure for usize {
    fn get(self) -> u64 {
        self as u64
    }
    fn from_clamped(v: u64) -> Self {
        v.min(usize::MAX as u64) as usize
    }
}
impl MemFigure for c_uint {
    fn get(self) -> u64 {
        self as u64
    }
    fn from_clamped(v: u64) -> Self {
        v.min(c_uint::MAX as u64) as c_uint
    }
}

/// The action applied around the driver's call `$real` (args `$a`).
macro_rules! act {
    ($real:ident, ($($a:ident),*), init) => { start::on_init($real($($a),*)) };
    ($real:ident, ($($a:ident),*), lookup($sym:ident, $pfn:ident)) => {
        proc_address($sym, $pfn, $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), gate) => {{
        // cuLaunch/cuLaunchGrid: the legacy default stream.
        online::on_launch();
        queued(std::ptr::null_mut(), false);
        gate().pass(|| $real($($a),*))
    }};
    ($real:ident, ($($a:ident),*), gate($s:ident, $pt:literal)) => {{
        online::on_launch();
        queued($s.stream(), $pt);
        gate().pass(|| $real($($a),*))
    }};
    ($real:ident, ($($a:ident),*), sync) => { online::on_sync($real($($a),*)) };
    ($real:ident, ($($a:ident),*), count($kind:ident, $size:ident, $out:ident)) => {
        alloc(Kind::$kind, $size as u64, $out, || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), pitch($out:ident, $pitch:ident, $w:ident, $h:ident)) => {
        alloc_pitch(|| out($out), || out($pitch), $w as usize, $h as usize, || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), array($kind:ident, $out:ident, $desc:ident, $levels:tt)) => {
        array(Kind::$kind, $out, $desc, $levels, || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), stream_alloc($size:ident, $out:ident, $s:ident, $pt:literal)) => {
        stream_alloc($size as u64, $out, $s, $pt, || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), stream_free($h:ident, $s:ident, $pt:literal)) => {
        stream_free($h, $s, $pt, || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), graph_alloc($g:ident, $params:ident)) => {
        graph_alloc($g.handle(), $params, || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), graph_free($g:ident, $h:ident)) => {{
        let rc = $real($($a),*);
        if rc == cu::SUCCESS {
            graphmem().free_node($g.handle(), $h);
        }
        rc
    }};
    ($real:ident, ($($a:ident),*), capture_begin($s:ident, $pt:literal)) => {
        graphmem().capture_began(stream_key($s.handle(), $pt), None, $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), capture_begin_to($s:ident, $g:ident, $pt:literal)) => {
        graphmem().capture_began(stream_key($s.handle(), $pt), Some($g.handle()), $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), capture_end($s:ident, $g:ident, $pt:literal)) => {{
        let rc = $real($($a),*);
        graphmem().capture_ended(stream_key($s.handle(), $pt), rc, || out($g), || {
            is_capturing($s, $pt)
        })
    }};
    ($real:ident, ($($a:ident),*), instantiate($e:ident, $g:ident)) => {
        graphmem().instantiate(memcap(), $g.handle(), current_device(), || $real($($a),*), || out($e))
    };
    ($real:ident, ($($a:ident),*), exec_update($e:ident, $g:ident)) => {
        graphmem().exec_updated(memcap(), $e.handle(), $g.handle(), current_device(), || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), graph_launch($e:ident, $s:ident, $pt:literal)) => {{
        online::on_launch();
        queued($s, $pt);
        let rc = gate().pass(|| $real($($a),*));
        graphmem().launched(memcap(), $e.handle(), rc)
    }};
    ($real:ident, ($($a:ident),*), exec_destroyed($e:ident)) => {
        graphmem().exec_destroyed($e.handle(), $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), graph_destroyed($g:ident)) => {
        graphmem().graph_destroyed($g.handle(), $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), trim($d:ident)) => {
        graphmem().trimmed(memcap(), $d, $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), free($kind:ident, $h:ident)) => {
        free(Kind::$kind, $h.handle(), || $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), cap($free:ident, $total:ident)) => {
        mem_info($free, $total, $real($($a),*))
    };
    ($real:ident, ($($a:ident),*), retained($d:ident)) => { contexts().retained($d, $real($($a),*)) };
    ($real:ident, ($($a:ident),*), released($d:ident)) => { contexts().released($d, $real($($a),*)) };
    ($real:ident, ($($a:ident),*), reset($d:ident)) => { contexts().reset($d, $real($($a),*)) };
    ($real:ident, ($($a:ident),*), created($c:ident)) => {
        contexts().created($real($($a),*), || out($c))
    };
    ($real:ident, ($($a:ident),*), destroyed($c:ident)) => { contexts().destroyed($c, $real($($a),*)) };
}

/// One export, unless the entry point passes through.
macro_rules! hook {
    ($name:ident, pass, ($($arg:ident : $ty:ty),*)) => {};
    ($name:ident, $action:ident $(( $($aa:tt)* ))?, ($($arg:ident : $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            guard(|| {
                let Some(p) = driver::real(Id::$name as usize) else {
                    return cu::NOT_FOUND;
                };
                // SAFETY: `p` is the driver's export of this very name, whose C
                // signature is the one the list declares.
                let f: unsafe extern "C" fn($($ty),*) -> CUresult = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller's arguments, passed through unchanged.
                let real = |$($arg: $ty),*| unsafe { f($($arg),*) };
                act!(real, ($($arg),*), $action $(( $($aa)* ))?)
            })
        }
    };
}

macro_rules! wrapper {
    ($name:ident, pass) => {
        0
    };
    ($name:ident, $action:ident) => {
        $name as *const () as usize
    };
}

macro_rules! hooks {
    ($( {$name:ident, $base:literal, $since:literal, $pt:literal, $action:ident $(( $($aa:tt)* ))?, ( $($arg:ident : $ty:ty),* $(,)? )} )*) => {
        /// Index of each entry point of the list (hooked or not) in [`table`].
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Debug, Clone, Copy)]
        #[repr(usize)]
        pub enum Id { $($name),* }

        $( hook!($name, $action $(( $($aa)* ))?, ($($arg: $ty),*)); )*

        /// Every entry point, in [`Id`] order.
        pub fn table() -> &'static [Hook; COUNT] {
            static T: OnceLock<[Hook; COUNT]> = OnceLock::new();
            T.get_or_init(|| [$(Hook {
                symbol: match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => unreachable!(),
                },
                base: $base,
                wrapper: wrapper!($name, $action),
            }),*])
        }
    };
}

cuda_abi::cuda_entry_points!(hooks);

/// The hooked entry point whose exported name is `name`.
pub fn index_of(name: &[u8]) -> Option<usize> {
    if !name.starts_with(b"cu") {
        return None;
    }
    table()
        .iter()
        .position(|h| h.wrapper != 0 && h.symbol.to_bytes() == name)
}

/// Bytes of an array of `levels` mipmap levels (each halving every extent,
/// down to 1) of `w x h x d` elements (0 = dimension unused).
fn array_size(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    levels: c_uint,
) -> u64 {
    let elems = (0..levels.clamp(1, 64))
        .map(|l| {
            [w, h, d]
                .iter()
                .fold(1u64, |n, &e| n.saturating_mul(((e as u64) >> l).max(1)))
        })
        .fold(0u64, u64::saturating_add);
    array_bytes(elems, format, channels)
}

/// Reserves an array's bytes (from its descriptor; null: the driver says
/// what is wrong with it) around the driver's `call`, recorded by the handle
/// it writes to `handle_out`.
fn array<D: Extents>(
    kind: Kind,
    handle_out: *mut Handle,
    desc: *const D,
    levels: c_uint,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // SAFETY: a descriptor pointer valid for this call (or null), per the API.
    match unsafe { desc.as_ref() } {
        None => call(),
        Some(d) => {
            let (w, h, dd, format, channels) = d.extents();
            let n = array_size(w, h, dd, format, channels, levels);
            memcap().alloc(kind, n, call, || out(handle_out), || n)
        }
    }
}

fn alloc<T: OutValue>(
    kind: Kind,
    size: u64,
    handle: *const T,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    memcap().alloc(kind, size, call, || out(handle), || size)
}

/// A free of a plain handle: its quota back; a device address may also be
/// a graph's allocation, which the graph books hear of.
fn free(kind: Kind, h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let rc = memcap().free(kind, h, call);
    if rc == cu::SUCCESS && kind == Kind::Device {
        graphmem().freed(h);
    }
    rc
}

/// A graph memory-allocation node: recorded in its graph's recipe by the
/// address the driver writes into the parameters; held against the quota
/// from the graph's instantiation ([`crate::state::graphmem`]).
fn graph_alloc(
    g: u64,
    params: *mut MemAllocNodeParams,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let rc = call();
    // SAFETY: the caller's parameter block, valid for this call (or null);
    // on success the driver just wrote `dptr`.
    if let (cu::SUCCESS, Some(p)) = (rc, unsafe { params.as_ref() }) {
        graphmem().alloc_node(g, p.dptr, p.bytesize as u64);
    }
    rc
}

/// The driver's export `name` for a call xCUDA makes itself (found once,
/// kept in `cell`); None when the driver has none.
fn own_call(cell: &OnceLock<usize>, name: &CStr) -> Option<usize> {
    let p = *cell.get_or_init(|| driver::driver_symbol(name));
    (p != 0).then_some(p)
}

/// The stream a launch goes to: its argument, or a launch config's.
trait LaunchStream: Copy {
    fn stream(self) -> Handle;
}
impl LaunchStream for Handle {
    fn stream(self) -> Handle {
        self
    }
}
impl LaunchStream for *const crate::abi::LaunchConfig {
    fn stream(self) -> Handle {
        match self.is_null() {
            true => std::ptr::null_mut(),
            // SAFETY: a non-null launch config the caller passes to the
            // driver, which reads it the same way.
            false => unsafe { (*self).stream },
        }
    }
}

/// The bounded offline queue in front of a launch on stream `s`
/// ([`crate::state::queue`]): one relaxed load while it is off.
#[inline(always)]
fn queued(s: Handle, pt: bool) {
    crate::state::queue::admit(
        s as usize,
        pt,
        || stream_empty(s, pt),
        || gate().shutting_down(),
    );
}

/// Has stream `s` nothing in flight (`cuStreamQuery`)? None when the
/// driver cannot say (an error other than "not ready"), or must not be
/// asked: while a capture is open, a query would invalidate it.
fn stream_empty(s: Handle, pt: bool) -> Option<bool> {
    if graphmem().capturing() {
        return None;
    }
    static F: [OnceLock<usize>; 2] = [OnceLock::new(), OnceLock::new()];
    let p = match pt {
        false => own_call(&F[0], c"cuStreamQuery")?,
        true => own_call(&F[1], c"cuStreamQuery_ptsz")?,
    };
    // SAFETY: the driver's cuStreamQuery(_ptsz), of the list's signature.
    let f: crate::abi::fnty::cuStreamQuery = unsafe { std::mem::transmute(p) };
    // SAFETY: the caller's stream, as it passed it to a launch.
    match unsafe { f(s) } {
        cu::SUCCESS => Some(true),
        cu::NOT_READY => Some(false),
        _ => None,
    }
}

/// Does the driver say stream `s` is capturing (joined into a capture by an
/// event)? None when it cannot say.
fn is_capturing(s: Handle, pt: bool) -> Option<bool> {
    static F: [OnceLock<usize>; 2] = [OnceLock::new(), OnceLock::new()];
    let p = match pt {
        false => own_call(&F[0], c"cuStreamIsCapturing")?,
        true => own_call(&F[1], c"cuStreamIsCapturing_ptsz")?,
    };
    // SAFETY: the driver's cuStreamIsCapturing(_ptsz), of the list's signature.
    let f: crate::abi::fnty::cuStreamIsCapturing = unsafe { std::mem::transmute(p) };
    let mut status: std::ffi::c_int = 0;
    // SAFETY: the caller's stream and a valid out-pointer.
    match unsafe { f(s, &mut status) } {
        cu::SUCCESS => Some(status != 0), // ACTIVE or INVALIDATED: still a capture
        _ => None,
    }
}

/// The current context's device (the one a graph is instantiated on);
/// -1 when the driver cannot say (that pool is then never trimmed: safe).
fn current_device() -> i32 {
    static F: OnceLock<usize> = OnceLock::new();
    let Some(p) = own_call(&F, c"cuCtxGetDevice") else {
        return -1;
    };
    // SAFETY: the driver's cuCtxGetDevice, of the list's signature.
    let f: crate::abi::fnty::cuCtxGetDevice = unsafe { std::mem::transmute(p) };
    let mut d: std::ffi::c_int = -1;
    // SAFETY: a valid out-pointer.
    match unsafe { f(&mut d) } {
        cu::SUCCESS => d,
        _ => -1,
    }
}

/// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`: on a capturing stream
/// the driver only records an allocation node (the graph is charged at
/// instantiation); otherwise a plain allocation.
fn stream_alloc(
    size: u64,
    p: *mut Dptr,
    s: Handle,
    pt: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match graphmem().target(stream_key(s.handle(), pt), || is_capturing(s, pt)) {
        Target::Real => alloc(Kind::Device, size, p, call),
        Target::Recorded(keys) => {
            let rc = call();
            if rc == cu::SUCCESS {
                graphmem().recorded_alloc(&keys, out(p), size);
            }
            rc
        }
        Target::Both(keys) => {
            let rc = alloc(Kind::Device, size, p, call);
            if rc == cu::SUCCESS {
                graphmem().recorded_alloc(&keys, out(p), size);
            }
            rc
        }
    }
}

/// `cuMemFreeAsync`: on a capturing stream recorded (the memory is freed
/// when the graph runs); otherwise a plain free.
/// When the driver cannot say whether the stream captures, only recorded:
/// a plain allocation it frees keeps its quota until a graph frees it
/// (over-counted, never under).
fn stream_free(h: Dptr, s: Handle, pt: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    match graphmem().target(stream_key(s.handle(), pt), || is_capturing(s, pt)) {
        Target::Real => free(Kind::Device, h, call),
        Target::Recorded(keys) | Target::Both(keys) => {
            let rc = call();
            if rc == cu::SUCCESS {
                graphmem().recorded_free(&keys, h);
            }
            rc
        }
    }
}

/// `handle` and `pitch` read the driver's outputs after the call.
fn alloc_pitch(
    handle: impl FnOnce() -> u64,
    pitch: impl FnOnce() -> u64,
    width: usize,
    height: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // Reserve with the widest pitch alignment drivers use; settle on the real pitch.
    let bound = width
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height.max(1));
    memcap().alloc(Kind::Device, bound as u64, call, handle, || {
        pitch().saturating_mul(height.max(1) as u64)
    })
}

/// `cuMemGetInfo` (either width): the cap as the total, what is left of it
/// as the free memory.
fn mem_info<T: MemFigure>(free_bytes: *mut T, total_bytes: *mut T, rc: CUresult) -> CUresult {
    if rc != cu::SUCCESS || free_bytes.is_null() || total_bytes.is_null() {
        return rc;
    }
    // SAFETY: both out-pointers non-null and just written by the driver.
    unsafe {
        let (f, t) = memcap().info((*free_bytes).get(), (*total_bytes).get());
        *free_bytes = T::from_clamped(f);
        *total_bytes = T::from_clamped(t);
    }
    rc
}

/// After the real cuGetProcAddress: swap the driver's function for our
/// wrapper of the same variant. Unknown names and variants pass untouched.
fn proc_address(symbol: *const c_char, pfn: *mut *mut c_void, rc: CUresult) -> CUresult {
    if rc != cu::SUCCESS || symbol.is_null() || pfn.is_null() {
        return rc;
    }
    // SAFETY: NUL-terminated name per the API; pfn non-null and just written.
    let (name, p) = unsafe { (CStr::from_ptr(symbol), *pfn as usize) };
    if p == 0 {
        return rc;
    }
    if let Some(i) = hook_of_driver_fn(name.to_bytes(), p) {
        if !deliberately_unhooked(i) {
            // SAFETY: as above.
            unsafe { *pfn = table()[i].wrapper as *mut c_void };
        }
    }
    rc
}

/// Which hook's driver function is `p`? By address, then by the exported
/// name `dladdr` gives it (drivers may hand out other addresses than dlsym).
/// A name may be answered with another base's function: CUDA 12 answers
/// `cuGraphInstantiate` with `cuGraphInstantiateWithFlags` (cuda.h renames
/// it). That function's own wrapper is then the right one, whoever asked,
/// provided exactly one hook has it (its wrapper calls `p` with `p`'s
/// signature).
pub fn hook_of_driver_fn(base: &[u8], p: usize) -> Option<usize> {
    let t = table();
    let known: Vec<usize> = (0..COUNT)
        .filter(|&i| driver::real_if_known(i) == p)
        .collect();
    if let Some(&i) = known.iter().find(|&&i| t[i].base.as_bytes() == base) {
        return Some(i);
    }
    if let [i] = known[..] {
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
    index_of(sname.to_bytes())
}

/// Test-only mutation, to prove the lookup tests can fail: the hook named by
/// `MUXFLOW_XCUDA_TEST_UNHOOK` is not handed out by `cuGetProcAddress`,
/// `dlsym` or `dlvsym` (the driver's own function is). Honoured only where
/// the environment is trusted anyway (root, outside a Slurm job: see
/// [`Source`]); a job's processes never read it.
pub fn deliberately_unhooked(i: usize) -> bool {
    static UNHOOKED: OnceLock<Option<usize>> = OnceLock::new();
    let u = *UNHOOKED.get_or_init(|| {
        let name = std::env::var(TEST_UNHOOK).ok()?;
        if Source::of_this_process() != Source::RootEnvironment {
            return None;
        }
        let i = index_of(name.as_bytes());
        crate::log(format_args!(
            "{TEST_UNHOOK}={name}: lookups of it return the driver's function (a test's deliberate breakage)"
        ));
        i
    });
    u == Some(i)
}

/// The variable [`deliberately_unhooked`] reads.
pub const TEST_UNHOOK: &str = "MUXFLOW_XCUDA_TEST_UNHOOK";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_follows_the_list_and_variants_share_their_base() {
        let t = table();
        assert_eq!(t.len(), crate::abi::ENTRY_POINTS.len());
        for (i, (h, e)) in t.iter().zip(crate::abi::ENTRY_POINTS).enumerate() {
            assert_eq!(h.symbol.to_str().unwrap(), e.symbol);
            assert_eq!(h.wrapper != 0, e.action != "pass", "{}", e.symbol);
            if h.wrapper != 0 {
                assert_eq!(index_of(h.symbol.to_bytes()), Some(i));
            }
            let s = h.symbol.to_str().unwrap();
            assert!(s.starts_with(h.base), "{s} vs {}", h.base);
            let rest = &s[h.base.len()..];
            assert!(
                rest.is_empty() || rest.starts_with("_v") || rest.starts_with("_pt"),
                "{s}"
            );
        }
        assert_eq!(
            index_of(b"cuLaunchKernel_ptsz"),
            Some(Id::cuLaunchKernel_ptsz as usize)
        );
        assert_eq!(
            index_of(b"cuMemPoolCreate"),
            None,
            "a pass entry is not hooked"
        );
        assert_eq!(index_of(b"cuNotHooked"), None);
        assert_eq!(index_of(b"malloc"), None);
    }

    #[test]
    fn array_sizes_count_every_mipmap_level() {
        const FLOAT: c_uint = 0x20;
        assert_eq!(array_size(1024, 0, 0, FLOAT, 1, 1), 4096);
        assert_eq!(array_size(1024, 768, 0, FLOAT, 4, 1), 1024 * 768 * 16);
        // 8x4x2, 4x2x1, 2x1x1, 1x1x1 (extents stop halving at 1).
        assert_eq!(array_size(8, 4, 2, FLOAT, 1, 4), (64 + 8 + 2 + 1) * 4);
        // Levels are at least 1, and absurd extents saturate rather than wrap.
        assert_eq!(array_size(16, 0, 0, FLOAT, 1, 0), 64);
        assert_eq!(array_size(usize::MAX, usize::MAX, 2, FLOAT, 1, 1), u64::MAX);
    }
}
