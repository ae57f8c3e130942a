//! Graph memory against the quota: the graph and capture entry points, and
//! `graph`, the quota's cases end to end.

use super::api::count_row;
use super::resolve::{pt, Resolver};
use super::{check, die, setup, Res, H, MIB};
use cuda_abi::{fnty, MemAllocNodeParams};
use std::ffi::{c_int, c_void};

/// How a capture begins: `cuStreamBeginCapture` (v1, CUDA 10.0), its `_v2`
/// (with a mode), or `cuStreamBeginCaptureToGraph` (into a new graph).
#[derive(Clone, Copy)]
pub enum Begin {
    V1,
    V2,
    ToGraph,
}

/// Which instantiation entry point.
#[derive(Clone, Copy)]
pub enum Inst {
    V1,
    V2,
    Flags,
    Params,
    Renamed,
}

/// The graph and capture entry points, resolved as HOW and --pt say, and
/// the stream captures use: the per-thread default stream with --pt, a
/// created stream otherwise.
pub struct Graphs {
    create: fnty::cuGraphCreate,
    alloc_node: fnty::cuGraphAddMemAllocNode,
    free_node: fnty::cuGraphAddMemFreeNode,
    begin_v1: unsafe extern "C" fn(H) -> Res,
    begin_v2: unsafe extern "C" fn(H, c_int) -> Res,
    begin_to: unsafe extern "C" fn(H, H, *const H, *const c_void, usize, c_int) -> Res,
    end: unsafe extern "C" fn(H, *mut H) -> Res,
    alloc_async: unsafe extern "C" fn(*mut u64, usize, H) -> Res,
    free_async: unsafe extern "C" fn(u64, H) -> Res,
    inst_v1: fnty::cuGraphInstantiate,
    inst_v2: fnty::cuGraphInstantiate_v2,
    inst_flags: fnty::cuGraphInstantiateWithFlags,
    inst_params: unsafe extern "C" fn(*mut H, H, *mut c_void) -> Res,
    /// `cuGraphInstantiate` as CUDA 12 asks for it: the driver answers with
    /// `cuGraphInstantiateWithFlags` (cuda.h renamed it).
    inst_12: fnty::cuGraphInstantiateWithFlags,
    launch: unsafe extern "C" fn(H, H) -> Res,
    exec_destroy: fnty::cuGraphExecDestroy,
    /// `cuGraphExecUpdate` as CUDA 12 asks for it (the `_v2` ABI).
    update: fnty::cuGraphExecUpdate_v2,
    destroy: fnty::cuGraphDestroy,
    trim: fnty::cuDeviceGraphMemTrim,
    stream: H,
}

impl Graphs {
    /// Resolves them (after `setup`: a created stream needs a context).
    pub fn new(r: &Resolver) -> Graphs {
        let stream_create: fnty::cuStreamCreate = r.get("cuStreamCreate", "cuStreamCreate");
        let mut stream: H = std::ptr::null_mut();
        if !r.pt {
            // SAFETY: a resolved entry point with a valid out-pointer.
            check(unsafe { stream_create(&mut stream, 0) }, "cuStreamCreate");
        }
        Graphs {
            create: r.get("cuGraphCreate", "cuGraphCreate"),
            alloc_node: r.get("cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode"),
            free_node: r.get("cuGraphAddMemFreeNode", "cuGraphAddMemFreeNode"),
            begin_v1: r.get_at(
                "cuStreamBeginCapture",
                &pt(r, "cuStreamBeginCapture"),
                10000,
            ),
            begin_v2: r.get("cuStreamBeginCapture", &pt(r, "cuStreamBeginCapture_v2")),
            begin_to: r.get(
                "cuStreamBeginCaptureToGraph",
                &pt(r, "cuStreamBeginCaptureToGraph"),
            ),
            end: r.get("cuStreamEndCapture", &pt(r, "cuStreamEndCapture")),
            alloc_async: r.get("cuMemAllocAsync", &pt(r, "cuMemAllocAsync")),
            free_async: r.get("cuMemFreeAsync", &pt(r, "cuMemFreeAsync")),
            inst_v1: r.get_at("cuGraphInstantiate", "cuGraphInstantiate", 10000),
            inst_v2: r.get_at("cuGraphInstantiate", "cuGraphInstantiate_v2", 11000),
            inst_flags: r.get("cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"),
            inst_12: r.get("cuGraphInstantiate", "cuGraphInstantiateWithFlags"),
            inst_params: r.get(
                "cuGraphInstantiateWithParams",
                &pt(r, "cuGraphInstantiateWithParams"),
            ),
            launch: r.get("cuGraphLaunch", &pt(r, "cuGraphLaunch")),
            exec_destroy: r.get("cuGraphExecDestroy", "cuGraphExecDestroy"),
            update: r.get("cuGraphExecUpdate", "cuGraphExecUpdate_v2"),
            destroy: r.get("cuGraphDestroy", "cuGraphDestroy"),
            trim: r.get("cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim"),
            stream,
        }
    }

    /// A graph with one allocation node of `n` bytes, and its free node when
    /// `free_inside`; returns the graph and the allocation's address.
    pub fn explicit(&self, n: usize, free_inside: bool) -> (H, u64) {
        let null: H = std::ptr::null_mut();
        let (mut g, mut node) = (null, null);
        let mut prm = MemAllocNodeParams {
            pool_props: [0; 88],
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: n,
            dptr: 0,
        };
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            check((self.create)(&mut g, 0), "cuGraphCreate");
            check(
                (self.alloc_node)(&mut node, g, std::ptr::null(), 0, &mut prm),
                "cuGraphAddMemAllocNode",
            );
            if free_inside {
                let dep = node;
                check(
                    (self.free_node)(&mut node, g, &dep, 1, prm.dptr),
                    "cuGraphAddMemFreeNode",
                );
            }
        }
        (g, prm.dptr)
    }

    /// A graph recorded by stream capture (begun as `how`): `n` bytes from
    /// cuMemAllocAsync, freed by cuMemFreeAsync when `free_inside`.
    pub fn captured(&self, how: Begin, n: usize, free_inside: bool) -> (H, u64) {
        let null: H = std::ptr::null_mut();
        let (mut g, mut p) = (null, 0u64);
        let s = self.stream;
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            match how {
                Begin::V1 => check((self.begin_v1)(s), "cuStreamBeginCapture"),
                Begin::V2 => check((self.begin_v2)(s, 0), "cuStreamBeginCapture_v2"),
                Begin::ToGraph => {
                    check((self.create)(&mut g, 0), "cuGraphCreate");
                    check(
                        (self.begin_to)(s, g, std::ptr::null(), std::ptr::null(), 0, 0),
                        "cuStreamBeginCaptureToGraph",
                    );
                }
            }
            check((self.alloc_async)(&mut p, n, s), "captured cuMemAllocAsync");
            if free_inside {
                check((self.free_async)(p, s), "captured cuMemFreeAsync");
            }
            check((self.end)(s, &mut g), "cuStreamEndCapture");
        }
        (g, p)
    }

    /// A graph whose only node frees `dptr` (another graph's allocation).
    pub fn frees(&self, dptr: u64) -> H {
        let null: H = std::ptr::null_mut();
        let (mut g, mut node) = (null, null);
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            check((self.create)(&mut g, 0), "cuGraphCreate");
            check(
                (self.free_node)(&mut node, g, std::ptr::null(), 0, dptr),
                "cuGraphAddMemFreeNode",
            );
        }
        g
    }

    /// A graph recorded by stream capture whose only work is
    /// `cuMemFreeAsync(dptr)` (another graph's allocation).
    pub fn captured_free(&self, dptr: u64) -> H {
        let mut g: H = std::ptr::null_mut();
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            check((self.begin_v2)(self.stream, 0), "cuStreamBeginCapture_v2");
            check(
                (self.free_async)(dptr, self.stream),
                "captured cuMemFreeAsync",
            );
            check((self.end)(self.stream, &mut g), "cuStreamEndCapture");
        }
        g
    }

    /// Instantiates `g` with entry point `which`: (result, executable graph).
    pub fn instantiate(&self, which: Inst, g: H) -> (Res, H) {
        let mut e: H = std::ptr::null_mut();
        let none = std::ptr::null_mut();
        // SAFETY: resolved entry points with valid arguments.
        let rc = unsafe {
            match which {
                Inst::V1 => (self.inst_v1)(&mut e, g, none, std::ptr::null_mut(), 0),
                Inst::V2 => (self.inst_v2)(&mut e, g, none, std::ptr::null_mut(), 0),
                Inst::Flags => (self.inst_flags)(&mut e, g, 0),
                Inst::Params => (self.inst_params)(&mut e, g, std::ptr::null_mut()),
                Inst::Renamed => (self.inst_12)(&mut e, g, 0),
            }
        };
        (rc, e)
    }

    pub fn launch(&self, e: H) -> Res {
        // SAFETY: a resolved entry point with valid arguments.
        unsafe { (self.launch)(e, self.stream) }
    }

    /// Destroys the executable graph, then trims the device's graph pool.
    pub fn drop_exec(&self, e: H) -> Res {
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            let rc = (self.exec_destroy)(e);
            check((self.trim)(0), "cuDeviceGraphMemTrim");
            rc
        }
    }
}

/// An instantiation row ([`count_row`]): each "allocation" builds a graph
/// that allocates 48 MiB and frees it itself (`build`) and instantiates it
/// (`which`), each "free" destroys the executable graph and trims.
pub fn graph_row(
    r: &Resolver,
    gr: &Graphs,
    key: &str,
    sym: &str,
    which: Inst,
    build: impl Fn() -> H,
) {
    count_row(
        r,
        key,
        sym,
        |p| {
            let (rc, e) = gr.instantiate(which, build());
            *p = e as u64;
            rc
        },
        |p| gr.drop_exec(p as H),
    );
}

/// `graph`: the quota of graph memory (64 MiB cap, Q below), end to end.
/// Prints one line per case (each a list of results; 2 = refused).
pub fn graph_quota(r: &Resolver) {
    let (cu, _ctx, _f) = setup(r, c"sim_kernel_1us");
    let gr = Graphs::new(r);
    let q = 64 * MIB;
    let free_now = || {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a resolved entry point with valid out-pointers.
        check(
            unsafe { (cu.info)(&mut free, &mut total) },
            "cuMemGetInfo_v2",
        );
        free
    };
    // SAFETY: resolved entry points with valid arguments.
    unsafe {
        // The issue: a graph that allocates Q/2 and frees it itself commits
        // Q/2 at every launch; 3Q/4 more must not fit beside it.
        let (g, _) = gr.explicit(q / 2, true);
        let (i, e) = gr.instantiate(Inst::Flags, g);
        let l1 = gr.launch(e);
        let mut p = 0u64;
        let a = (cu.alloc)(&mut p, 3 * q / 4);
        let l2 = gr.launch(e);
        println!("issue_explicit={i},{l1},{a},{l2}");
        // Destroying the executable graph leaves the pool's memory held; a trim frees it.
        let d = (gr.exec_destroy)(e);
        let a1 = (cu.alloc)(&mut p, 3 * q / 4);
        let t = (gr.trim)(0);
        let a2 = (cu.alloc)(&mut p, 3 * q / 4);
        println!("destroy_then_trim={d},{a1},{t},{a2}");
        // The other order: 3Q/4 held, the instantiation is refused.
        let (i2, _) = gr.instantiate(Inst::Flags, g);
        let f = (cu.free)(p);
        println!("instantiate_over_quota={i2},{f}");
        check((gr.destroy)(g), "cuGraphDestroy");
        // The shape as stream capture gives it: nothing counted
        // while recording (no double count), all of it from instantiation.
        let (g, _) = gr.captured(Begin::V2, q / 2, true);
        let recorded = free_now();
        let (i, e) = gr.instantiate(Inst::Flags, g);
        let l = gr.launch(e);
        let a = (cu.alloc)(&mut p, 3 * q / 4);
        println!("issue_capture={recorded},{i},{l},{a}");
        check(gr.drop_exec(e), "cuGraphExecDestroy");
        check((gr.destroy)(g), "cuGraphDestroy");
        // While a capture is open, another stream that the driver says is
        // not capturing allocates for real: counted now, refused past Q.
        let stream_create: fnty::cuStreamCreate = r.get("cuStreamCreate", "cuStreamCreate");
        let mut other: H = std::ptr::null_mut();
        check(stream_create(&mut other, 0), "cuStreamCreate");
        check((gr.begin_v2)(gr.stream, 0), "cuStreamBeginCapture_v2");
        let (mut x, mut y) = (0u64, 0u64);
        let a = (gr.alloc_async)(&mut x, 3 * q / 4, other);
        let left = free_now();
        let b = (gr.alloc_async)(&mut y, q / 2, other);
        let f = (gr.free_async)(x, other);
        let mut g = std::ptr::null_mut();
        check((gr.end)(gr.stream, &mut g), "cuStreamEndCapture");
        check((gr.destroy)(g), "cuGraphDestroy");
        println!("beside_capture={a},{left},{b},{f}");
        // Allocated by the graph, freed outside it: counted once, and
        // held by the pool while the executable graph exists.
        let (g, dptr) = gr.explicit(q / 2, false);
        let (i, e) = gr.instantiate(Inst::Flags, g);
        let l = gr.launch(e);
        let before = free_now();
        let f = (cu.free)(dptr);
        let after = free_now();
        let a = (cu.alloc)(&mut p, q / 2);
        let f2 = (cu.free)(p);
        println!("freed_outside={i},{l},{before},{f},{after},{a},{f2}");
        check(gr.drop_exec(e), "cuGraphExecDestroy");
        check((gr.destroy)(g), "cuGraphDestroy");
        // An executable graph of Q/4 updated with a graph of Q: fits (its
        // need replaces Q/4's); then with one of Q/2: the pool's charge
        // stays at Q until a trim, so Q/2 more is refused.
        let (small, _) = gr.explicit(q / 4, true);
        let (i, e) = gr.instantiate(Inst::Flags, small);
        let (whole, _) = gr.explicit(q, true);
        let mut info = [0u8; 24];
        let big = (gr.update)(e, whole, info.as_mut_ptr().cast());
        let (half, _) = gr.explicit(q / 2, true);
        let fits = (gr.update)(e, half, info.as_mut_ptr().cast());
        let a = (cu.alloc)(&mut p, q / 2);
        println!("exec_update={i},{big},{fits},{a}");
        check(gr.drop_exec(e), "cuGraphExecDestroy");
        for g in [small, whole, half] {
            check((gr.destroy)(g), "cuGraphDestroy");
        }
    }
    println!("meminfo_free={}", free_now());
}

/// `graph-path PATH`: one way graph memory is allocated or freed, in a
/// process of its own (the driver's peak is the process's), under a 64 MiB
/// quota Q. Prints `PATH=<results>` (2 = refused by the quota), then,
/// after every graph is destroyed and the pool trimmed, `fit=<result>` of a
/// 3Q/4 `cuMemAlloc` (nothing must be left counted) and
/// `driver=<used>,<peak>`: what the simulated driver itself held then and
/// at its peak, read from its own books.
pub fn graph_path(r: &Resolver, path: &str) {
    let (cu, _ctx, _f) = setup(r, c"sim_kernel_1us");
    let gr = Graphs::new(r);
    let q = 64 * MIB;
    let mut p = 0u64;
    let mut graphs: Vec<H> = Vec::new();
    let mut execs: Vec<H> = Vec::new();
    // SAFETY: resolved entry points with valid arguments (a double free is
    // the driver's to refuse, which is what the rows show).
    let row: Vec<Res> = unsafe {
        match path {
            // An allocation node freed by the graph itself: every launch
            // within one charge, 3Q/4 beside it refused, Q/2 beside it fits.
            "free_same" => {
                let (g, _) = gr.explicit(q / 2, true);
                let (i, e) = gr.instantiate(Inst::Flags, g);
                graphs.push(g);
                execs.push(e);
                let (l1, l2) = (gr.launch(e), gr.launch(e));
                let over = (cu.alloc)(&mut p, 3 * q / 4);
                let fits = (cu.alloc)(&mut p, q / 2);
                let f = (cu.free)(p);
                vec![i, l1, l2, over, fits, f]
            }
            // An allocation node the graph does not free: alive after the
            // launch; a second launch before it is freed is the driver's
            // error; freed with cuMemFree, launched again, freed again.
            "alloc_node" => {
                let (g, x) = gr.explicit(q / 2, false);
                let (i, e) = gr.instantiate(Inst::Flags, g);
                graphs.push(g);
                execs.push(e);
                let l1 = gr.launch(e);
                let again = gr.launch(e);
                let f1 = (cu.free)(x);
                let l2 = gr.launch(e);
                let f2 = (cu.free)(x);
                let over = (cu.alloc)(&mut p, 3 * q / 4);
                vec![i, l1, again, f1, l2, f2, over]
            }
            // Allocated in one graph, freed by a free node of another.
            "free_other" => {
                let (a, x) = gr.explicit(q / 2, false);
                let b = gr.frees(x);
                let (ia, ea) = gr.instantiate(Inst::Flags, a);
                let (ib, eb) = gr.instantiate(Inst::Flags, b);
                graphs.extend([a, b]);
                execs.extend([ea, eb]);
                let (l1, l2, l3, l4) = (gr.launch(ea), gr.launch(eb), gr.launch(ea), gr.launch(eb));
                let fits = (cu.alloc)(&mut p, q / 2);
                let over = (cu.alloc)(&mut 0, q / 4);
                let f = (cu.free)(p);
                vec![ia, ib, l1, l2, l3, l4, fits, over, f]
            }
            // A graph allocation freed with cuMemFree, then once more (the
            // driver refuses the second; nothing is given back twice).
            "mem_free" | "mem_free_async" => {
                let (g, x) = gr.explicit(q / 2, false);
                let (i, e) = gr.instantiate(Inst::Flags, g);
                graphs.push(g);
                execs.push(e);
                let l = gr.launch(e);
                let free = |d: u64| match path {
                    "mem_free" => (cu.free)(d),
                    _ => (gr.free_async)(d, gr.stream),
                };
                let (f1, f2) = (free(x), free(x));
                let fits = (cu.alloc)(&mut p, q / 2);
                let over = (cu.alloc)(&mut 0, MIB);
                let f = (cu.free)(p);
                vec![i, l, f1, f2, fits, over, f]
            }
            // The graph, then its executable graph destroyed while its
            // allocation is alive: the pool keeps it through a trim until
            // it is freed.
            "destroy" => {
                let (g, x) = gr.explicit(q / 2, false);
                let (i, e) = gr.instantiate(Inst::Flags, g);
                let l = gr.launch(e);
                let dg = (gr.destroy)(g);
                let f1 = (cu.free)(x);
                let l2 = gr.launch(e);
                let de = (gr.exec_destroy)(e);
                let t1 = (gr.trim)(0);
                let over = (cu.alloc)(&mut p, 3 * q / 4);
                let f = (cu.free)(x);
                vec![i, l, dg, f1, l2, de, t1, over, f]
            }
            // An executable graph of Q/4 updated with a graph of Q/2 and
            // launched: its need is Q/2 from then on, so Q/2 more fits.
            "update" => {
                let (small, _) = gr.explicit(q / 4, true);
                let (i, e) = gr.instantiate(Inst::Flags, small);
                let l1 = gr.launch(e);
                let (half, _) = gr.explicit(q / 2, true);
                let mut info = [0u8; 24];
                let u = (gr.update)(e, half, info.as_mut_ptr().cast());
                let l2 = gr.launch(e);
                let fits = (cu.alloc)(&mut p, q / 2);
                let f = (cu.free)(p);
                graphs.extend([small, half]);
                execs.push(e);
                vec![i, l1, u, l2, fits, f]
            }
            // Stream capture: one capture allocates Q/2, another frees it.
            "captured" => {
                let (a, x) = gr.captured(Begin::V2, q / 2, false);
                let b = gr.captured_free(x);
                let (ia, ea) = gr.instantiate(Inst::Flags, a);
                let (ib, eb) = gr.instantiate(Inst::Flags, b);
                graphs.extend([a, b]);
                execs.extend([ea, eb]);
                let (l1, l2, l3, l4) = (gr.launch(ea), gr.launch(eb), gr.launch(ea), gr.launch(eb));
                let fits = (cu.alloc)(&mut p, q / 2);
                let over = (cu.alloc)(&mut 0, q / 4);
                let f = (cu.free)(p);
                vec![ia, ib, l1, l2, l3, l4, fits, over, f]
            }
            _ => die("graph-path: free_same|alloc_node|free_other|mem_free|mem_free_async|destroy|update|captured"),
        }
    };
    let list: Vec<String> = row.iter().map(|r| r.to_string()).collect();
    println!("{path}={}", list.join(","));
    // SAFETY: resolved entry points with valid arguments.
    unsafe {
        for e in execs {
            check((gr.exec_destroy)(e), "cuGraphExecDestroy");
        }
        for g in graphs {
            check((gr.destroy)(g), "cuGraphDestroy");
        }
        check((gr.trim)(0), "cuDeviceGraphMemTrim");
        println!("fit={}", (cu.alloc)(&mut p, 3 * q / 4));
    }
    match r.driver_books() {
        Some((used, peak)) => println!("driver={used},{peak}"),
        None => println!("driver=none"),
    }
}
