//! Fork and exit paths: `fork-quota`, `fork` and `exit-on-error`.

use super::resolve::{die, pt, Resolver};
use super::{check, join, setup, Launch, H, MIB};
use cuda_abi::fnty;
use std::time::Instant;

/// `fork-quota`: the parent allocates 48 MiB (fits 64) and 48 more
/// (refused), launches 3 kernels, forks; the child does the same with 5
/// launches and exits; the parent then frees and launches 2 more. Prints
/// `child=PID` and what each side saw.
pub fn fork_quota(r: &Resolver) {
    let (cu, _ctx, f) = setup(r, c"sim_kernel_1us");
    let launch: Launch = r.get("cuLaunchKernel", "cuLaunchKernel");
    let sync: fnty::cuStreamSynchronize = r.get("cuStreamSynchronize", "cuStreamSynchronize");
    let null: H = std::ptr::null_mut();
    // One 1-block launch; then the stream synchronized after `n` of them.
    let launch_sync = |n: usize| {
        let pp = std::ptr::null_mut();
        // SAFETY: resolved entry points with valid arguments.
        unsafe {
            for _ in 0..n {
                check(
                    launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
                    "cuLaunchKernel",
                );
            }
            check(sync(null), "cuStreamSynchronize");
        }
    };
    let work = |launches: usize| {
        let mut rcs = Vec::new();
        launch_sync(launches);
        // SAFETY: a resolved entry point with a valid out-pointer.
        unsafe {
            for _ in 0..2 {
                let mut p = 0u64;
                rcs.push((cu.alloc)(&mut p, 48 * MIB));
            }
        }
        join(&rcs)
    };
    let parent = work(3);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: fork/waitpid on our own process and child.
    unsafe {
        match libc::fork() {
            -1 => die("fork failed"),
            0 => {
                let child = work(5);
                println!("child_allocs={child}");
                std::process::exit(0);
            }
            child => {
                let mut status = 0;
                libc::waitpid(child, &mut status, 0);
                launch_sync(2);
                println!("child={child} child_status={status} parent_allocs={parent}");
            }
        }
    }
}

pub fn fork_child_launches(r: &Resolver, secs: usize) {
    let (_cu, _ctx, f) = setup(r, c"sim_kernel_1ms");
    let launch: Launch = r.get("cuLaunchKernel", &pt(r, "cuLaunchKernel"));
    let sync: fnty::cuStreamSynchronize =
        r.get("cuStreamSynchronize", &pt(r, "cuStreamSynchronize"));
    let (null, pp): (H, *mut H) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: resolved entry points with valid arguments; fork/waitpid on
    // our own process and child.
    unsafe {
        // The parent's watcher is running once a launch went through.
        check(
            launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
            "cuLaunchKernel",
        );
        check(sync(null), "cuStreamSynchronize");
        match libc::fork() {
            -1 => die("fork failed"),
            0 => {
                let end = Instant::now() + std::time::Duration::from_secs(secs as u64);
                while Instant::now() < end {
                    check(
                        launch(f, 1, 1, 1, 32, 1, 1, 0, null, pp, pp),
                        "cuLaunchKernel",
                    );
                    check(sync(null), "cuStreamSynchronize");
                }
                std::process::exit(0);
            }
            child => {
                println!("child={child}");
                let mut status = 0;
                libc::waitpid(child, &mut status, 0);
                println!("child_status={status}");
            }
        }
    }
}

pub fn exit_on_error(r: &Resolver) {
    let (cu, _ctx, _) = setup(r, c"sim_kernel_1us");
    println!("ready");
    loop {
        let mut p = 0u64;
        // SAFETY: resolved entry points with valid arguments.
        let rc = unsafe {
            match (cu.alloc)(&mut p, MIB) {
                0 => (cu.free)(p),
                rc => rc,
            }
        };
        if rc != 0 {
            println!("error={rc}");
            std::process::exit(1);
        }
    }
}
