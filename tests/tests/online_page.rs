//! The online page is bounded and dies with its job, tried as the
//! unprivileged user `nobody`. The page is the online job's user's to
//! write (what their service experiences, for the offline gates beside
//! it); it used to be a file of theirs on the state filesystem, which they
//! could grow without bound and keep writing after their job had ended,
//! braking the next offline job on the GPU for a service no longer there.

use std::time::Duration;

use muxflow::records::online_page;
use muxflow_tests::{CancelNamed, Cluster, AS_NOBODY};

const WAIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "mfop-";

#[test]
fn an_online_users_page_is_bounded_and_goes_with_the_job() {
    let c = Cluster::get();
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let node = "node1";
    let config = c.dir.join("etc/muxflow.toml");
    let state = c.node_state(&config, node);
    // 4 MiB appended to the page, its size then; the page stays open for
    // writing after the job (a process left behind).
    // The page is the one file of the user's among the pages.
    let script = format!(
        "#!/bin/sh\n\
         P=$(find {} -user $(id -u) -type f | head -n 1)\n\
         echo page=$P\n\
         head -c 4194304 /dev/zero >>\"$P\"\n\
         echo size=$(stat -c %s \"$P\")\n\
         sleep 300\n",
        online_page::dir(state.dir()).display()
    );
    let online = c
        .sbatch(
            &[
                "--muxflow=online",
                AS_NOBODY,
                "--gres=gpu:1",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            &script,
        )
        .unwrap();
    let out = c.wait_output(online, "size=", WAIT);
    let page = muxflow_tests::kv(&out, "page").unwrap_or_else(|| panic!("{out}"));
    let size: u64 = muxflow_tests::kv(&out, "size")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let gpu = (0..2)
        .find(|&g| std::path::Path::new(&page).starts_with(online_page::gpu_dir(state.dir(), g)))
        .unwrap_or_else(|| panic!("page {page} is no GPU's of {node}: {out}"));
    assert!(
        size <= online_page::PAGE_FS_MIB << 20,
        "the page grew to {size} bytes: {out}"
    );
    c.scancel(&[online]);
    c.wait(online, WAIT);
    // The Epilog may still be running when Slurm calls the job done.
    let dir = online_page::gpu_dir(state.dir(), gpu);
    let start = std::time::Instant::now();
    while dir.exists() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !dir.exists() && !std::path::Path::new(&page).exists(),
        "{} outlived its job",
        dir.display()
    );
    c.assert_no_drain();
}
