//! The reader, predictor inputs and a planned round on Slurm 22.05 JSON
//! recorded from the dev cluster (`matcher/tests/data/`):
//!
//! * jobs 1 (`serve-a`, node1 GPU 0) and 2 (`serve-b`, node2 GPUs 0-1):
//!   running online jobs;
//! * job 16 (`train-run`): a running offline job on node2's `mfslot:g1`;
//! * job 17 (`train-x`): a pending offline job, parked (recorded when parking
//!   was a constraint; its `features` and `state_reason` were edited to what
//!   job_submit.lua leaves now: held, Reason=JobHeldUser, no constraint);
//! * jobs 4-15: finished experiments (ignored; 3 and 6 were refused at submit);
//! * node Extra: node1 both GPUs healthy (GPU 1 idle: no job holds it);
//!   node2 GPU 0 busy, GPU 1 healthy (its slot taken by job 16); node3
//!   `rack=12` (not muxflow); node4 empty;
//! * sacct: `hist-a` (one run alone, one shared), `hist-b` (shared only),
//!   an online record.
//!
//! And on Slurm 24.11 JSON (data_parser v0.0.42) and 26.05 JSON
//! (data_parser v0.0.45), each recorded from `scripts/devcluster up --slurm
//! <R>` (`matcher/tests/data/<R>/`, nothing edited; the offline jobs were
//! placed by hand with the matcher's own `scontrol update`/`release` calls;
//! the same jobs in the same order, so the same ids):
//!
//! * jobs 1 (`serve-a`, node1 GPU 0) and 2 (`serve-b`, node2 GPUs 0-1):
//!   running online jobs; job 4 (`train-run`): running offline on node2's
//!   `mfslot:g1`; job 3 (`train-x`): pending, parked by job_submit.lua;
//! * nodes (`scontrol show nodes --json`): every GPU healthy as the nodes
//!   published it; `sinfo.json`: the grouped listing of the same nodes;
//! * sacct: `hist-a` and `hist-b`, finished offline runs on node1 GPU 0
//!   with the records the plugin wrote (`hist-b` with a workload figure).

use muxflow::policy::health::HealthState;
use muxflow::Mode;
use muxflow_matcher::hints::{current, Target};
use muxflow_matcher::predict::{estimate, runs_from_sacct, Model};
use muxflow_matcher::reader::{
    parse_sacct, parse_sinfo, parse_squeue, release_json, ClusterState, Names, NodeRoom, ReadError,
};
use muxflow_matcher::round::{plan, Action};

const SQUEUE: &str = include_str!("data/squeue.json");
const SINFO: &str = include_str!("data/sinfo.json");
const SACCT: &str = include_str!("data/sacct.json");

/// One recording of the same scenario on a data_parser release.
struct Recording {
    release: &'static str,
    squeue: &'static str,
    nodes: &'static str,
    sinfo: &'static str,
    sacct: &'static str,
}

macro_rules! recording {
    ($release:literal) => {
        Recording {
            release: $release,
            squeue: include_str!(concat!("data/", $release, "/squeue.json")),
            nodes: include_str!(concat!("data/", $release, "/nodes.json")),
            sinfo: include_str!(concat!("data/", $release, "/sinfo.json")),
            sacct: include_str!(concat!("data/", $release, "/sacct.json")),
        }
    };
}

/// 24.11 (data_parser v0.0.42) and 26.05 (v0.0.45), recorded alike.
const RECORDINGS: [Recording; 2] = [recording!("24.11"), recording!("26.05")];

fn names() -> Names {
    Names::from_config(&muxflow::config::Slurm::default())
}

fn state() -> ClusterState {
    ClusterState::build(
        &parse_squeue(SQUEUE).unwrap(),
        &parse_sinfo(SINFO).unwrap(),
        &names(),
    )
}

/// Each GPU as (node, index, health, offline slots used, online jobs).
fn gpu_rows(st: &ClusterState) -> Vec<(&str, u32, HealthState, u32, Vec<u32>)> {
    st.gpus
        .iter()
        .map(|g| {
            (
                g.node.as_str(),
                g.index,
                g.published.state,
                g.slots_used,
                g.online_jobs.clone(),
            )
        })
        .collect()
}

#[test]
fn squeue_and_sinfo_give_online_gpus_slots_and_pending_jobs() {
    let jobs = parse_squeue(SQUEUE).unwrap();
    assert_eq!(jobs.len(), 15);
    let j1 = jobs.iter().find(|j| j.job_id == 1).unwrap();
    assert_eq!(j1.gres_detail, ["gpu:1(IDX:0)"]);
    assert_eq!(j1.job_state, ["RUNNING"]);

    let st = state();
    let gpus = gpu_rows(&st);
    assert_eq!(
        gpus,
        [
            ("node1", 0, HealthState::Healthy, 0, vec![1]),
            // Idle (issue 15): no online job, no job holds it as gres/gpu.
            ("node1", 1, HealthState::Healthy, 0, vec![]),
            ("node2", 0, HealthState::Busy, 0, vec![2]),
            ("node2", 1, HealthState::Healthy, 1, vec![2]),
        ]
    );
    assert_eq!(st.gpus[0].published.solo_sm_pct, Some(35));
    assert_eq!(st.gpus[0].published.online_mem_mib, Some(12000));
    let open: Vec<_> = st
        .open_gpus(1)
        .map(|(_, g)| (g.node.clone(), g.index))
        .collect();
    assert_eq!(open, [("node1".to_string(), 0), ("node1".to_string(), 1)]);
    assert_eq!(st.running_offline, [(16, "node2".to_string(), 1)]);
    assert_eq!(st.pending.len(), 1);
    let p = &st.pending[0];
    assert_eq!(
        (p.id, p.name.as_str(), p.user.as_str(), p.account.as_str()),
        (17, "train-x", "root", "root")
    );
    // Who runs on each GPU (the online job, and the offline one on node2
    // gpu1), for the one-user and co_locate rules.
    let owners: Vec<Vec<(&str, &str)>> = st
        .gpus
        .iter()
        .map(|g| {
            g.owners
                .iter()
                .map(|o| (o.user.as_str(), o.account.as_str()))
                .collect()
        })
        .collect();
    assert_eq!(
        owners,
        [
            vec![("root", "root")],
            vec![],
            vec![("root", "root")],
            vec![("root", "root")]
        ]
    );
    assert!(p.slot_gpus.is_empty());
    assert_eq!(p.gpus, 1);
    assert_eq!(current(p), Target::Parked);
    // node3's Extra is not muxflow's, but it runs no online job: no note.
    assert!(st.notes.is_empty(), "{:?}", st.notes);
}

fn a_key() -> (String, String) {
    ("root".to_string(), "hist-a".to_string())
}

#[test]
fn sacct_gives_offline_runs_and_profiles() {
    let jobs = parse_sacct(SACCT).unwrap();
    assert!(jobs.iter().any(|j| j.name == "serve-a"));
    let runs = runs_from_sacct(&jobs);
    // Two cancelled offline experiments (no figures) and the three hist-* runs.
    assert_eq!(runs.len(), 5, "{runs:?}");
    assert!(runs.iter().all(|r| r.report.mode == Some(Mode::Offline)));
    let e = estimate(&runs);
    let a = &e.profiles[&("root".to_string(), "hist-a".to_string())];
    assert_eq!(a.solo, Some(120.0), "its run alone");
    assert_eq!(a.peak_mib, Some(9100));
    // hist-a's shared run against its alone run: 80.5 / 120 (no load
    // figure: the pair at the load it ran).
    let pa: Vec<_> = e.pairs.iter().filter(|p| p.job == a_key()).collect();
    assert_eq!(pa.len(), 1, "{:?}", e.pairs);
    assert!((pa[0].x - 80.5 / 120.0).abs() < 1e-9);
    assert_eq!(pa[0].share, 0.40);
}

#[test]
fn a_round_on_the_recording_places_the_parked_job_beside_the_online_job_not_on_the_idle_gpu() {
    let st = state();
    let cfg = muxflow::Config::default();
    let p = plan(&st, &Model::default(), &cfg.policy, &cfg.matcher, &names());
    assert_eq!(p.decisions.len(), 1);
    let d = &p.decisions[0];
    assert_eq!(d.action, Action::Place);
    assert_eq!((d.node.as_deref(), d.gpu), (Some("node1"), Some(0)));
    assert_eq!(
        d.update.as_deref().unwrap(),
        [
            vec![
                "update",
                "JobId=17",
                "ReqNodeList=node1",
                "Gres=mfslot:g0:1",
                // The placement record the Prolog checks (only root/SlurmUser can write it).
                "AdminComment=muxflow:v1 mode=offline placed=node1:g0",
                // An operator's hold until the release.
                "Priority=0"
            ],
            vec!["release", "17"]
        ]
    );
    // Default predictor: share = 100 - 35 - 10 = 55% -> min(1, 0.55 / 0.5),
    // as fast as alone on the idle GPU 1: the tie goes to the shared GPU.
    assert_eq!(d.predicted, Some(1.0));
    assert!(d.reason.contains("online job 1"), "{}", d.reason);
    assert_eq!(
        (
            p.summary.online_gpus,
            p.summary.idle_gpus,
            p.summary.open_gpus
        ),
        (3, 1, 2)
    );
    let table = p.table();
    assert!(table.starts_with("JOB "), "{table}");
    assert!(
        table.contains("17       train-x          place  node1"),
        "{table}"
    );
    let json: serde_json::Value = serde_json::from_str(&p.json()).unwrap();
    assert_eq!(json["decisions"][0]["action"], "place");
    assert_eq!(json["summary"]["placed"], 1);
}

fn state_of(r: &Recording) -> ClusterState {
    ClusterState::build(
        &parse_squeue(r.squeue).unwrap(),
        &parse_sinfo(r.nodes).unwrap(),
        &names(),
    )
}

#[test]
fn data_parser_squeue_and_nodes_give_online_gpus_slots_and_pending_jobs() {
    for r in &RECORDINGS {
        let jobs = parse_squeue(r.squeue).unwrap();
        let j4 = jobs.iter().find(|j| j.job_id == 4).unwrap();
        assert_eq!(j4.job_state, ["RUNNING"], "{}", r.release);
        assert_eq!(j4.tres_per_node, "gres/mfslot:g1:1", "{}", r.release);

        let st = state_of(r);
        let gpus = gpu_rows(&st);
        assert_eq!(
            gpus,
            // Every GPU of a usable node: those no job holds are idle ones,
            // candidates too since issue 15.
            [
                ("node1", 0, HealthState::Healthy, 0, vec![1]),
                ("node1", 1, HealthState::Healthy, 0, vec![]),
                ("node2", 0, HealthState::Healthy, 0, vec![2]),
                ("node2", 1, HealthState::Healthy, 1, vec![2]),
                ("node3", 0, HealthState::Healthy, 0, vec![]),
                ("node3", 1, HealthState::Healthy, 0, vec![]),
                ("node4", 0, HealthState::Healthy, 0, vec![]),
                ("node4", 1, HealthState::Healthy, 0, vec![]),
            ],
            "{}",
            r.release
        );
        assert_eq!(
            st.running_offline,
            [(4, "node2".to_string(), 1)],
            "{}",
            r.release
        );
        assert_eq!(st.pending.len(), 1, "{}", r.release);
        let p = &st.pending[0];
        assert_eq!(
            (p.id, p.name.as_str(), p.user.as_str(), p.held),
            (3, "train-x", "root", true),
            "{}",
            r.release
        );
        assert_eq!(current(p), Target::Parked, "{}", r.release);
        assert!(st.notes.is_empty(), "{}: {:?}", r.release, st.notes);
    }
}

#[test]
fn data_parser_grouped_sinfo_listing_is_refused_with_the_command_to_use() {
    for r in &RECORDINGS {
        // sinfo groups node3 and node4 into one entry: per-node Extra
        // cannot be trusted from it.
        let e = parse_sinfo(r.sinfo).unwrap_err();
        assert!(
            matches!(e, ReadError::GroupedNodes { .. }),
            "{}: {e}",
            r.release
        );
        assert!(e.to_string().contains("scontrol show nodes --json"), "{e}");
    }
}

#[test]
fn data_parser_sacct_gives_the_offline_runs_the_plugin_recorded() {
    for r in &RECORDINGS {
        let jobs = parse_sacct(r.sacct).unwrap();
        assert_eq!(
            jobs.len(),
            5,
            "{}: jobs 1, 2, 4, 5, 6 (3 never started)",
            r.release
        );
        let hist_b = jobs.iter().find(|j| j.name == "hist-b").unwrap();
        assert_eq!(hist_b.state.current, ["COMPLETED"], "{}", r.release);
        assert!(hist_b.time.end > 1_700_000_000, "{}", r.release);
        let runs = runs_from_sacct(&jobs);
        let names: Vec<&str> = runs.iter().map(|r| r.key.1.as_str()).collect();
        assert_eq!(names, ["hist-a", "hist-b"], "{}: {runs:?}", r.release);
        // hist-a's partner is serve-a, resolved from the same listing.
        assert_eq!(
            runs[0].partner_key,
            Some(("root".to_string(), "serve-a".to_string())),
            "{}",
            r.release
        );
        assert!(runs.iter().all(|r| r.report.mode == Some(Mode::Offline)));
        assert_eq!(runs[1].report.steps_per_s, Some(80.5), "{}", r.release);
    }
}

#[test]
fn data_parser_a_round_places_the_parked_job_on_the_open_gpu() {
    for r in &RECORDINGS {
        let st = state_of(r);
        let cfg = muxflow::Config::default();
        let p = plan(&st, &Model::default(), &cfg.policy, &cfg.matcher, &names());
        assert_eq!(p.decisions.len(), 1, "{}", r.release);
        let d = &p.decisions[0];
        assert_eq!(d.action, Action::Place, "{}", r.release);
        // node1 GPU 0 (slot free) or node2 GPU 0; node2 GPU 1's slot is taken.
        assert!(
            matches!(
                (d.node.as_deref(), d.gpu),
                (Some("node1"), Some(0)) | (Some("node2"), Some(0))
            ),
            "{}: {:?}",
            r.release,
            (d.node.as_deref(), d.gpu)
        );
    }
}

/// Each recording was written by the JSON writer the reader's per-release
/// table gives for its release (`reader::RELEASES`), and the node listing
/// the table names is the one recorded (`nodes.json`: scontrol's).
#[test]
fn recordings_match_the_per_release_table() {
    let meta = |text: &str| -> (String, (u32, u32)) {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let m = &v["meta"];
        // 22.05: meta.plugin.type and meta.Slurm.version (numbers);
        // data_parser: meta.plugin.data_parser and meta.slurm.version (strings).
        let writer = m["plugin"]["data_parser"]
            .as_str()
            .filter(|w| !w.is_empty())
            .or(m["plugin"]["type"].as_str())
            .unwrap()
            .to_string();
        let version = if m["slurm"].is_object() {
            &m["slurm"]["version"]
        } else {
            &m["Slurm"]["version"]
        };
        let num = |k: &str| -> u32 {
            match &version[k] {
                serde_json::Value::String(s) => s.parse().unwrap(),
                n => n.as_u64().unwrap() as u32,
            }
        };
        (writer, (num("major"), num("minor")))
    };
    let mut seen = Vec::new();
    // 22.05's sacct has a writer of its own (slurmdbd's).
    assert_eq!(meta(SACCT), ("openapi/dbv0.0.38".to_string(), (22, 5)));
    for text in [SQUEUE, SINFO].into_iter().chain(
        RECORDINGS
            .iter()
            .flat_map(|r| [r.squeue, r.nodes, r.sinfo, r.sacct]),
    ) {
        let (writer, release) = meta(text);
        let row = release_json(release);
        assert_eq!(row.writer, writer, "{release:?}");
        seen.push(release);
    }
    for r in &RECORDINGS {
        let (_, release) = meta(r.nodes);
        assert_eq!(
            release_json(release).nodes,
            ["scontrol", "show", "nodes", "--json"]
        );
        assert_eq!(format!("{}.{:02}", release.0, release.1), r.release);
    }
    assert_eq!(release_json((22, 5)).nodes, ["sinfo", "--json"]);
    seen.dedup();
    assert_eq!(seen, [(22, 5), (24, 11), (26, 5)]);
}

/// Each node's free CPUs and memory, and each pending job's request, read
/// from both releases' recordings (memory: not consumable there, CR_Core).
#[test]
fn both_releases_give_node_room_and_job_requests() {
    let recorded = RECORDINGS.iter().map(|r| (state_of(r), 3));
    for (st, pending) in std::iter::once((state(), 17)).chain(recorded) {
        let room: Vec<(&str, u32, u64)> = st
            .node_room
            .iter()
            .map(|(n, r)| (n.as_str(), r.cpus, r.mem_mib))
            .collect();
        assert_eq!(
            room,
            [
                ("node1", 3, 4000),
                ("node2", 2, 4000),
                ("node3", 4, 4000),
                ("node4", 4, 4000)
            ]
        );
        let job = st.pending.iter().find(|p| p.id == pending).unwrap();
        assert_eq!(
            job.need,
            NodeRoom {
                cpus: 1,
                mem_mib: 4000
            }
        );
    }
}

/// Slurm 22.05 JSON recorded from the dev cluster with jobs Slurm would not
/// start now (`data/squeue-unstartable.json`, `data/sinfo-unstartable.json`,
/// nothing edited; recorded at Unix 1795892105), all of user `nobody`:
///
/// * 13: an array's record of tasks 1-3 (task 0 was placed by hand as
///   `13_0`, which Slurm split out as job 14, running on node3 GPU 0);
/// * 15: `--begin=now+2hours`; 17: `--dependency=afterok:16` (16 a plain
///   running job); 18: placed on node3 GPU 0, then held by its owner
///   (`scontrol hold`); 19: placed on node4 GPU 1, started, then requeued by
///   its owner (`PENDING (BeginTime)`, its hints kept).
const RECORDED_AT: u64 = 1_795_892_105;

fn unstartable_state(now_s: u64) -> ClusterState {
    let jobs = parse_squeue(include_str!("data/squeue-unstartable.json")).unwrap();
    let nodes = parse_sinfo(include_str!("data/sinfo-unstartable.json")).unwrap();
    ClusterState::build_at(&jobs, &nodes, &names(), now_s)
}

#[test]
fn jobs_slurm_would_not_start_get_no_slot_and_give_theirs_back() {
    use muxflow::records::placement::Waiting;
    use muxflow_matcher::reader::Unstartable;
    let st = unstartable_state(RECORDED_AT);
    let of = |id: u32| st.pending.iter().find(|p| p.id == id).unwrap();
    struct Row {
        job: u32,
        unstartable: Option<Unstartable>,
        action: Action,
        waiting: Option<Waiting>,
        update: Option<Vec<&'static str>>,
    }
    let rows = [
        Row {
            job: 13,
            unstartable: None,
            action: Action::Place,
            waiting: None,
            update: None,
        },
        Row {
            job: 15,
            unstartable: Some(Unstartable::BeginTime(1_795_899_296)),
            action: Action::None,
            waiting: Some(Waiting::BeginTime),
            update: None,
        },
        Row {
            job: 17,
            unstartable: Some(Unstartable::Dependency),
            action: Action::None,
            waiting: Some(Waiting::Dependency),
            update: None,
        },
        Row {
            job: 18,
            unstartable: Some(Unstartable::UserHold),
            action: Action::None,
            waiting: None,
            update: None,
        },
        Row {
            job: 19,
            unstartable: Some(Unstartable::BeginTime(1_795_892_222)),
            action: Action::Park,
            waiting: Some(Waiting::BeginTime),
            update: Some(vec!["hold", "19"]),
        },
    ];
    assert_eq!(st.pending.len(), rows.len());
    let model = Model::default();
    let p = plan(
        &st,
        &model,
        &muxflow::config::Policy::default(),
        &muxflow::config::Matcher::default(),
        &names(),
    );
    for r in &rows {
        assert_eq!(of(r.job).unstartable, r.unstartable, "job {}", r.job);
        let d = p.decisions.iter().find(|d| d.job == r.job).unwrap();
        assert_eq!(d.action, r.action, "job {}: {d:?}", r.job);
        assert_eq!(d.waiting, r.waiting, "job {}: {d:?}", r.job);
        if let Some(want) = &r.update {
            assert_eq!(
                d.update.as_ref().unwrap(),
                std::slice::from_ref(want),
                "job {}",
                r.job
            );
        }
    }
    // The array's record is placed as its first pending task alone.
    assert_eq!(of(13).array_task, Some(1));
    let d = p.decisions.iter().find(|d| d.job == 13).unwrap();
    let calls = d.update.as_ref().unwrap();
    assert_eq!(calls[0][1], "JobId=13_1", "{calls:?}");
    assert_eq!(calls.last().unwrap(), &["release", "13_1"]);
    // Requeued on node4 GPU 1, that GPU goes to the array's task 1 (the
    // shared-GPU tie-break aside, every open GPU is alike here): what
    // matters is that the requeued job's hint no longer holds it.
    assert_eq!(
        current(of(19)),
        Target::Gpus {
            node: "node4".into(),
            gpus: vec![1],
            slots: vec![1]
        }
    );
    // Two hours later the begin time has passed: job 15 is a candidate.
    let later = unstartable_state(1_795_899_296);
    let p = plan(
        &later,
        &model,
        &muxflow::config::Policy::default(),
        &muxflow::config::Matcher::default(),
        &names(),
    );
    let d = p.decisions.iter().find(|d| d.job == 15).unwrap();
    assert_eq!(d.action, Action::Place, "{d:?}");
}

#[test]
fn data_parser_shapes_of_begin_time_dependency_hetjob_and_array() {
    use muxflow_matcher::reader::Unstartable;
    // Field shapes of the 24.11 / 26.05 recordings (NO_VAL objects).
    let n = |v: u64| format!(r#"{{"set": true, "infinite": false, "number": {v}}}"#);
    let job = |extra: &str| {
        format!(
            r#"{{"jobs": [{{"job_id": {}, "job_state": ["PENDING"], "state_reason": "JobHeldAdmin",
              "admin_comment": "muxflow:v1 mode=offline", "het_job_id": {}, "array_job_id": {},
              "array_task_id": {{"set": false, "infinite": false, "number": 0}}, {extra}}}]}}"#,
            n(30),
            n(0),
            n(0)
        )
    };
    let read = |extra: &str| {
        let jobs = parse_squeue(&job(extra)).unwrap();
        ClusterState::build_at(&jobs, &[], &names(), 1000).pending[0].clone()
    };
    let cases = [
        (
            format!(r#""eligible_time": {}, "dependency": """#, n(2000)),
            Some(Unstartable::BeginTime(2000)),
        ),
        (
            format!(r#""eligible_time": {}, "dependency": """#, n(999)),
            None,
        ),
        (
            r#""eligible_time": {"set": false, "infinite": false, "number": 0}, "dependency": "afterany:12(unfulfilled)""#.to_string(),
            Some(Unstartable::Dependency),
        ),
        (
            r#""dependency": "afterok:12(failed)""#.to_string(),
            Some(Unstartable::Dependency),
        ),
    ];
    for (extra, want) in &cases {
        assert_eq!(read(extra).unstartable, *want, "{extra}");
    }
    let het = job(r#""dependency": """#).replace(
        &format!(r#""het_job_id": {}"#, n(0)),
        &format!(r#""het_job_id": {}"#, n(30)),
    );
    let jobs = parse_squeue(&het).unwrap();
    let st = ClusterState::build_at(&jobs, &[], &names(), 1000);
    assert_eq!(st.pending[0].unstartable, Some(Unstartable::HetJob));
    let arr = job(r#""array_task_string": "4-7%2""#)
        .replace(&format!(r#""job_id": {}"#, n(30)), r#""job_id": 30"#)
        .replace(
            &format!(r#""array_job_id": {}"#, n(0)),
            &format!(r#""array_job_id": {}"#, n(30)),
        );
    let jobs = parse_squeue(&arr).unwrap();
    let st = ClusterState::build_at(&jobs, &[], &names(), 1000);
    assert_eq!(st.pending[0].slurm_id(), "30_4");
    // The array's last pending task left in its own record, and a task
    // split out as a job of its own.
    let unset_task = r#""array_task_id": {"set": false, "infinite": false, "number": 0}"#;
    let last = arr
        .replace(
            r#""array_task_string": "4-7%2""#,
            r#""array_task_string": """#,
        )
        .replace(unset_task, &format!(r#""array_task_id": {}"#, n(7)));
    let st = ClusterState::build_at(&parse_squeue(&last).unwrap(), &[], &names(), 1000);
    assert_eq!(st.pending[0].slurm_id(), "30_7");
    let split = last.replace(r#""job_id": 30"#, r#""job_id": 31"#);
    let st = ClusterState::build_at(&parse_squeue(&split).unwrap(), &[], &names(), 1000);
    assert_eq!(st.pending[0].slurm_id(), "31");
}
