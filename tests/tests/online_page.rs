//! The online page is bounded and dies with its job, and speaks only for
//! the job root's note beside it names, tried as unprivileged users. The
//! page is the online job's user's to write (what their service
//! experiences, for the offline gates beside it); it used to be a file of
//! theirs on the state filesystem, which they could grow without bound and
//! keep writing after their job had ended, braking the next offline job on
//! the GPU for a service no longer there.
//!
//! The pages these tests write say what a hurt service's would: a fresh
//! record far above its baseline and a busy line that is busy half the
//! time, so a gate that trusted one would hold the trainer beside it
//! (counted in its `delayed`). The trainers are alone on their GPU (the
//! online jobs launch nothing), so nothing else delays a launch: any
//! delayed launch is the page's doing.

use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use muxflow::records::online_page::{self, Record};
use muxflow_tests::{kv, CancelNamed, Cluster, AS_NOBODY};

const WAIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "mfop-";
/// A job script's line setting `P` to the job's own page among the node's
/// `pages`: the one root's note beside it names the job (a page another
/// run left of the same user is not it).
fn find_page(pages: &Path) -> String {
    format!(
        "P=$(grep -l \"^job=$SLURM_JOB_ID \" {}/*/page.job | head -n 1); P=${{P%.job}}\n",
        pages.display()
    )
}

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
    let script = format!(
        "#!/bin/sh\n\
         {find}\
         echo page=$P\n\
         head -c 4194304 /dev/zero >>\"$P\"\n\
         echo size=$(stat -c %s \"$P\")\n\
         sleep 300\n",
        find = find_page(&online_page::dir(state.dir()))
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

/// The page a service hurt by its neighbour writes, rewritten every 10 ms
/// by a thread through `write` (the 64-byte record, then the busy line)
/// until dropped: a new window every 100 ms at ten times its baseline, busy
/// the first half of each 100 ms.
struct HurtPage {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HurtPage {
    fn start(write: impl Fn(&[u8]) + Send + 'static) -> HurtPage {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seq = 0;
            while !flag.load(Ordering::Relaxed) {
                seq += 1;
                let now = online_page::now_ns();
                let period = now - now % 100_000_000;
                let rec = Record {
                    seq,
                    heartbeat_ns: now,
                    window_at_ns: period,
                    window_ns_per_launch: 10_000.0,
                    baseline_ns_per_launch: 1_000.0,
                    launches: seq * 10,
                };
                let busy = if now - period < 50_000_000 { period } else { 0 };
                let mut image = rec.encode().to_vec();
                image.extend_from_slice(&online_page::encode_busy(busy));
                write(&image);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        HurtPage {
            stop,
            thread: Some(thread),
        }
    }

    /// Written straight into the page at `path` (as root, whoever owns it).
    fn at(path: PathBuf) -> HurtPage {
        HurtPage::start(move |image| {
            if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) {
                let _ = f.write_all_at(image, 0);
            }
        })
    }
}

impl Drop for HurtPage {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The GPU Slurm gave a one-GPU job.
fn gpu_of(c: &Cluster, job: u32) -> u32 {
    let gres = c.gres_detail(job);
    gres.strip_prefix("gpu:1(IDX:")
        .and_then(|s| s.strip_suffix(')'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("job {job}: GRES '{gres}'"))
}

/// Is the page (as the node sees it) one that would hold a trainer if it
/// were trusted: a whole record, fresh, its busy line busy? Polled, since
/// it is busy only half the time.
fn says_busy(page: &Path) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if let Ok(f) = std::fs::File::open(page) {
            if let Ok((rec, line)) = online_page::read_open(&f, page) {
                if online_page::busy_at(&rec, line, online_page::now_ns()) {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Waits until offline job `job`'s trainer on `node` has made `more`
/// launches past `from`; panics, saying `what`, as soon as one of its
/// launches was delayed. Returns its launches then.
fn runs_undelayed(
    c: &Cluster,
    config: &Path,
    node: &str,
    job: u32,
    from: u64,
    more: u64,
    what: &str,
) -> u64 {
    let start = Instant::now();
    loop {
        let (launches, delayed) = c.xcuda_counters(config, node, job);
        assert!(
            delayed == 0,
            "{what}: the trainer's launches were held ({delayed} delayed of {launches}):\n{}",
            c.output_or_empty(job)
        );
        if launches >= from + more {
            return launches;
        }
        assert!(
            start.elapsed() < WAIT,
            "{what}: the trainer made {launches} launches (waiting for {}):\n{}",
            from + more,
            c.output_or_empty(job)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits (up to 30 s) for a GPU's page directory to go: the Epilog may
/// still be running when Slurm calls the job done.
fn wait_gone(dir: &Path) {
    let start = Instant::now();
    while dir.exists() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A trainer that launches about 2,000 kernels a second, alone on its GPU.
fn trainer(c: &Cluster) -> String {
    format!(
        "#!/bin/sh\n{}\n",
        c.workload(
            "offline --duration 300 --kernels-per-step 20 --kernel-us 200 --blocks 32 --host-us 5000"
        )
    )
}

/// Launches a trainer must make beside a page before the test believes
/// the page did not brake it (seconds of pages read, every sample).
const UNDELAYED: u64 = 8000;

/// Only root can make a page's owner and its note disagree, or leave a
/// page without its note; this test, as root, makes both the way a
/// leftover or raced page would look. `daemon`'s online job runs on the
/// GPU with the page of an earlier online job of `bin` in place (a hurt
/// service's, still written): `nobody`'s trainer beside it is not held,
/// and its xCUDA says why. Then `daemon`'s job ends and a page of `bin`
/// with no note at all appears: still not held.
#[test]
fn a_page_its_note_does_not_vouch_for_steers_no_offline_job() {
    let c = Cluster::get();
    const PREFIX: &str = "mfon-";
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let node = "node2";
    let config = c.dir.join("etc/muxflow.toml");
    let state = c.node_state(&config, node);
    let online = c
        .sbatch_as(
            "daemon",
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            "#!/bin/sh\necho started\nexec sleep 300\n",
        )
        .unwrap_or_else(|e| panic!("sbatch online: {e}"));
    c.wait_output(online, "started", WAIT);
    let gpu = gpu_of(&c, online);
    let dir = c.node_view(node, &online_page::gpu_dir(state.dir(), gpu));
    let page = dir.join("page");
    let note = online_page::read_job_note(&online_page::job_note_path(&page), 0)
        .unwrap_or_else(|e| panic!("the plugin noted no job beside the page: {e}"));
    assert_eq!((note.job_id, note.uid), (online, 1));

    // The page of bin (uid 2), put where daemon's job's page was.
    let bin = 2;
    let forged = dir.join(".forged");
    std::fs::write(&forged, [0u8; online_page::RECORD_BYTES]).unwrap();
    std::os::unix::fs::chown(&forged, Some(bin), Some(bin)).unwrap();
    std::fs::rename(&forged, &page).unwrap();
    let _hurt = HurtPage::at(page.clone());
    assert!(says_busy(&page), "the forged page says nothing");

    let offline = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &trainer(&c));
    c.wait_running(offline, WAIT);
    let launches = runs_undelayed(
        &c,
        &config,
        node,
        offline,
        0,
        UNDELAYED,
        "a page of bin beside daemon's online job",
    );
    let out = c.output_or_empty(offline);
    let why = format!("not trusted: owned by uid {bin}, not by the user of job {online} (uid 1)");
    assert!(out.contains(&why), "xCUDA did not say '{why}':\n{out}");

    // daemon's job ends (its Epilog takes the page away); a page of bin
    // without a note appears in a directory of root's.
    c.scancel(&[online]);
    c.wait(online, WAIT);
    wait_gone(&dir);
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the online job's Epilog left it)", dir.display()));
    std::fs::write(&page, [0u8; online_page::RECORD_BYTES]).unwrap();
    std::os::unix::fs::chown(&page, Some(bin), Some(bin)).unwrap();
    assert!(says_busy(&page), "the page without a note says nothing");
    runs_undelayed(
        &c,
        &config,
        node,
        offline,
        launches,
        UNDELAYED,
        "a page of bin with no note",
    );
    assert_eq!(c.job_field(offline, "JobState"), "RUNNING");
    c.scancel(&[offline]);
    c.wait(offline, WAIT);
    // The trainer's Epilog takes the page's directory away (no online job
    // left on the GPU); if it did not, the next online job's Prolog would.
    wait_gone(&dir);
    c.assert_no_drain();
}

/// An online job of `daemon` leaves a process behind (its own session, out
/// of the job's process tree) that keeps writing a hurt service's record
/// into the page it opened; the job ends. `nobody`'s trainer then placed on
/// the GPU runs undelayed: the page went with its job.
#[test]
fn a_process_left_behind_by_an_online_job_steers_no_later_offline_job() {
    let c = Cluster::get();
    const PREFIX: &str = "mfol-";
    c.cancel_named(PREFIX);
    let _cancel = CancelNamed(&c, PREFIX);
    let node = "node3";
    let config = c.dir.join("etc/muxflow.toml");
    let state = c.node_state(&config, node);
    // What the process left behind copies into the page: the test keeps it
    // fresh (a user can compute a record as well as the test can).
    let scratch = c.scratch("left-behind");
    let image = scratch.join("record");
    let go = scratch.join("go");
    let feed = {
        let image = image.clone();
        let tmp = scratch.join("record.tmp");
        HurtPage::start(move |bytes| {
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, &image);
            }
        })
    };
    // The writer copies the record in place through the descriptor it holds
    // (/dev/fd/3 opens what fd 3 is, wherever it is now); the job ends when
    // the test says so.
    let script = format!(
        "#!/bin/sh\n\
         {find}\
         echo page=$P\n\
         setsid sh -c 'exec 3<>\"$1\"; end=$(($(date +%s) + 300)); \
         while [ $(date +%s) -lt $end ]; do \
         dd if=\"$2\" of=/dev/fd/3 bs=80 count=1 conv=notrunc status=none; sleep 0.05; done' \
         left-behind \"$P\" {image} </dev/null >/dev/null 2>&1 &\n\
         echo writer=$!\n\
         while [ ! -e {go} ]; do sleep 0.2; done\n",
        find = find_page(&online_page::dir(state.dir())),
        image = image.display(),
        go = go.display(),
    );
    let online = c
        .sbatch_as(
            "daemon",
            &[
                "--muxflow=online",
                "--gres=gpu:1",
                "-w",
                node,
                "--job-name",
                &format!("{PREFIX}online"),
            ],
            &script,
        )
        .unwrap_or_else(|e| panic!("sbatch online: {e}"));
    let out = c.wait_output(online, "writer=", WAIT);
    let writer: u32 = kv(&out, "writer")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // The test ends the process it had the job start, however it ends.
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .arg(self.0.to_string())
                .status();
        }
    }
    let _writer = Kill(writer);
    let gpu = gpu_of(&c, online);
    let dir = c.node_view(node, &online_page::gpu_dir(state.dir(), gpu));
    let page = dir.join("page");
    // While its job runs the page is trusted and says what the writer
    // copies: a gate beside it would hold its trainer.
    let start = Instant::now();
    while online_page::read_trusted(&page, 0).map_or(true, |r| r.window_at_ns == 0) {
        assert!(
            start.elapsed() < WAIT,
            "the page never showed the writer's record: {:?}\n{}",
            online_page::read_trusted(&page, 0),
            c.output_or_empty(online)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(says_busy(&page), "the writer's page says nothing");

    std::fs::write(&go, "").unwrap();
    let end = c.wait(online, WAIT);
    assert_eq!(
        end.state,
        "COMPLETED",
        "{end:?}: {}",
        c.output_or_empty(online)
    );
    wait_gone(&dir);
    assert!(
        muxflow_tests::process_runs(writer),
        "the process left behind ended with its job"
    );

    let offline = c.offline_as_nobody(&format!("{PREFIX}offline"), node, gpu, &trainer(&c));
    c.wait_running(offline, WAIT);
    runs_undelayed(
        &c,
        &config,
        node,
        offline,
        0,
        UNDELAYED,
        "a page still written by a process of an ended online job",
    );
    // Still writing all along.
    assert!(muxflow_tests::process_runs(writer), "the writer stopped");
    drop(feed);
    c.scancel(&[offline]);
    c.wait(offline, WAIT);
    c.assert_no_drain();
}
