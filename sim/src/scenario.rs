//! What every policy replays, built once from the inputs: the GPUs, the
//! online services placed on them, and the offline arrivals. Policies run
//! on the same scenario, so their differences are theirs alone.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::input::{Kind, Node, Pairs, Task};
use crate::model::{MEM_PER_SHARE, OFFLINE_REFERENCE_GPU_MIB};

/// Most offline jobs one replay holds in memory (about 100 bytes each per
/// policy).
pub const MAX_OFFLINE_JOBS: usize = 5_000_000;

/// Replay settings (the CLI's flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub days: f64,
    pub online_fill: f64,
    pub offline_load: f64,
    pub seed: u64,
    /// Seconds between matcher rounds.
    pub round_interval_s: f64,
    /// Seconds between health checks (SysMonitor steps).
    pub health_interval_s: f64,
    /// Online services scale with their load (`--autoscale`, issue 30):
    /// replicas started and stopped at every hourly load step
    /// ([`replicas_for`]); off, every service holds its GPUs all along.
    pub autoscale: bool,
    /// What a requeue for a landing replica costs the offline jobs there
    /// (`--checkpoint-*`).
    pub checkpoint: Checkpointing,
    /// The online load the offline side's measured slowdowns are taken at
    /// (`--pair-load`; sim/README.md, "The model").
    pub pair_load: PairLoad,
}

/// The online load at which the pair table's offline slowdown and xCUDA's
/// cost to the offline job apply ([`crate::model::at_load`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PairLoad {
    /// The service's load at each hour: the slowdown in proportion to it.
    #[default]
    Now,
    /// Its daily peak, every hour: the pairs as measured (both jobs busy),
    /// which overstates what a quiet service costs the offline job.
    Peak,
}

/// How the replayed offline jobs save their work (sim/README.md,
/// "Services that come and go"; defaults with their sources there).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Checkpointing {
    /// A periodic checkpoint every this many seconds of progress at full
    /// speed (a trainer saves every N steps): 3600, "once per hour is
    /// common" on stable clusters; CheckFreq (FAST '21) finds epoch-boundary
    /// checkpoints, hours apart, the norm.
    pub interval_s: f64,
    /// Seconds a checkpoint takes to write: 20, the middle of the 10–30 s
    /// snapshot stall commonly reported.
    pub save_s: f64,
    /// The job checkpoints when warned of the requeue (issue 29's
    /// checkpoint-on-requeue: `--signal` warning or the SIGTERM handler with
    /// its GPU); off, it loses the work since its last periodic checkpoint.
    pub on_requeue: bool,
    /// The longest the warning may last before the requeue: 25 s, the
    /// plugin's cap (docs/user-guide.md, "What happens to a job").
    pub grace_s: f64,
}

impl Default for Checkpointing {
    fn default() -> Self {
        Checkpointing {
            interval_s: 3600.0,
            save_s: 20.0,
            on_requeue: false,
            grace_s: 25.0,
        }
    }
}

/// Seconds from the requeue to the offline job's exit once it stops (its
/// Epilog run): 0.2 s, measured on the dev cluster (docs/user-guide.md, "What happens
/// to a job").
pub const REQUEUE_EXIT_S: f64 = 0.2;

/// Replicas a service of `peak` replicas runs at `load` (fraction of its
/// daily peak): `ceil(peak × load)`, at least 1 — an autoscaler keeping
/// each replica at most at the load one replica carries at the peak
/// (Kubernetes' HPA: `ceil(replicas × metric / target)`, the target being
/// the peak's per-replica load).
pub fn replicas_for(peak: u32, load: f64) -> u32 {
    ((f64::from(peak) * load - 1e-9).ceil() as u32).clamp(1, peak.max(1))
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            days: 7.0,
            online_fill: 0.8,
            offline_load: 1.0,
            seed: 1,
            // The daemon's own interval: one place says it.
            round_interval_s: muxflow::config::Matcher::default().interval_s as f64,
            health_interval_s: 300.0,
            autoscale: false,
            checkpoint: Checkpointing::default(),
            pair_load: PairLoad::Now,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub node: u32,
    /// Index on its node.
    pub index: u32,
    /// Into [`Scenario::models`].
    pub model: u16,
    pub mem_mib: u64,
}

/// An online replica holding a GPU as its owner (for the whole replay
/// unless services scale).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Service {
    /// Slurm-style job id (shared by the GPUs of a multi-GPU service).
    pub job_id: u32,
    pub task: u32,
    pub job_type: u16,
    pub share: f64,
    pub mem_mib: u64,
}

/// One placed online task: a replica of its service, with its GPUs at the
/// daily peak. A service is the set of online tasks with the same request
/// (`num_gpu`, `gpu_milli`, `gpu_spec`): replicas of one service share
/// their template, and the trace names no service (an assumption: a few
/// shapes hold most tasks).
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    pub service: u32,
    pub task: u32,
    /// Its GPUs when every replica runs (all of one node).
    pub gpus: Vec<u32>,
    /// Allowed models (into [`Scenario::models`]); `None`: any.
    pub models: Option<Vec<u16>>,
}

/// One offline job (a BE task's shape, a run time from the run-time list).
#[derive(Debug, Clone, PartialEq)]
pub struct OfflineJob {
    pub id: u32,
    pub arrival_s: f64,
    /// Seconds it runs alone on whole GPUs (each of its GPUs does this
    /// much: its work is `gpus × work_s` GPU-seconds).
    pub work_s: f64,
    /// GPUs it asks for, all on one node (more than 1: a gang, started
    /// and stopped on all of them together).
    pub gpus: u32,
    pub task: u32,
    pub job_type: u16,
    pub share: f64,
    pub mem_mib: u64,
    /// Allowed models (into [`Scenario::models`]); `None`: any.
    pub models: Option<Vec<u16>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scenario {
    pub nodes: Vec<String>,
    pub models: Vec<String>,
    pub gpus: Vec<Gpu>,
    /// Per GPU, its online owner at the daily peak (every replica running).
    pub online: Vec<Option<Service>>,
    /// The placed online tasks (replicas), in placement order.
    pub replicas: Vec<Replica>,
    /// Number of services the replicas form ([`Replica::service`]).
    pub services: usize,
    pub tasks: Vec<Task>,
    pub jobs: Vec<OfflineJob>,
    pub pairs: Pairs,
    pub end_s: f64,
    /// Figures of the preparation, for the table and `inputs` in JSON.
    pub online_gpus: usize,
    pub online_services: usize,
    pub online_tasks_unplaceable: usize,
    pub offline_rate_per_h: f64,
    pub mean_runtime_s: f64,
}

impl Default for Pairs {
    fn default() -> Self {
        crate::input::read_pairs(&crate::input::Source {
            name: "-".into(),
            bytes: b"job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,A,1,1,0.5,0.5\n",
        })
        .expect("a valid table")
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScenarioError {
    #[error("no online task fits any node (check gpu_spec against the node list's models)")]
    NoOnlinePlaced,
    #[error("no offline task can run on any node (check gpu_spec against the node list's models)")]
    NoOfflineFits,
    #[error("{0}")]
    Settings(String),
}

fn model_index(models: &[String], name: &str) -> Option<u16> {
    models.iter().position(|m| m == name).map(|i| i as u16)
}

/// Builds the scenario: online services placed in trace order (repeating
/// the list) until `online_fill` of the GPUs hold one; offline arrivals as
/// a Poisson stream whose demand is `offline_load` × the online GPUs.
pub fn build(
    nodes: &[Node],
    tasks: Vec<Task>,
    runtimes: &[f64],
    pairs: Pairs,
    s: &Settings,
) -> Result<Scenario, ScenarioError> {
    let bad = |m: &str| Err(ScenarioError::Settings(m.to_string()));
    if !(s.days > 0.0 && s.days <= 366.0) {
        return bad("--days must be in (0, 366]");
    }
    if !(0.0..=1.0).contains(&s.online_fill) {
        return bad("--online-fill must be in [0, 1]");
    }
    if !(s.offline_load >= 0.0 && s.offline_load <= 100.0) {
        return bad("--offline-load must be in [0, 100]");
    }
    if !(s.round_interval_s >= 1.0 && s.health_interval_s >= 1.0) {
        return bad("--round-interval and --health-interval must be at least 1 s");
    }
    let ck = &s.checkpoint;
    if !(ck.interval_s >= 1.0 && ck.save_s >= 0.0 && ck.grace_s >= 0.0 && ck.save_s.is_finite()) {
        return bad("--checkpoint-interval must be at least 1 s, --checkpoint-save and --requeue-grace at least 0 s");
    }
    let mut sc = Scenario {
        pairs,
        end_s: s.days * 86_400.0,
        ..Scenario::default()
    };
    for n in nodes {
        let model = match model_index(&sc.models, &n.model) {
            Some(m) => m,
            None => {
                sc.models.push(n.model.clone());
                (sc.models.len() - 1) as u16
            }
        };
        sc.nodes.push(n.name.clone());
        for index in 0..n.gpus {
            sc.gpus.push(Gpu {
                node: (sc.nodes.len() - 1) as u32,
                index,
                model,
                mem_mib: n.mem_mib,
            });
        }
    }
    sc.online = vec![None; sc.gpus.len()];
    let allowed = |spec: &Option<Vec<String>>, models: &[String]| -> Option<Vec<u16>> {
        spec.as_ref().map(|names| {
            let mut v: Vec<u16> = names
                .iter()
                .filter_map(|n| model_index(models, n))
                .collect();
            v.sort_unstable();
            v
        })
    };
    place_online(&mut sc, &tasks, s.online_fill, &allowed);
    group_replicas(&mut sc, &tasks, &allowed);
    if s.online_fill > 0.0 && sc.online_gpus == 0 {
        return Err(ScenarioError::NoOnlinePlaced);
    }

    // Offline shapes: BE tasks that use a GPU and can run somewhere.
    let shapes: Vec<u32> = tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind == Kind::Offline && t.num_gpu > 0 && t.gpu_milli > 0)
        .filter(|(_, t)| allowed(&t.gpu_spec, &sc.models).is_none_or(|m| !m.is_empty()))
        .map(|(i, _)| i as u32)
        .collect();
    if shapes.is_empty() {
        return Err(ScenarioError::NoOfflineFits);
    }
    let mean_gpus = shapes
        .iter()
        .map(|&i| f64::from(tasks[i as usize].num_gpu))
        .sum::<f64>()
        / shapes.len() as f64;
    let runtime = |r: f64| r.max(1.0);
    sc.mean_runtime_s = runtimes.iter().map(|&r| runtime(r)).sum::<f64>() / runtimes.len() as f64;
    // Demand (GPU-seconds per second) = rate × mean run time × mean GPUs.
    let rate_per_s = s.offline_load * sc.online_gpus as f64 / (sc.mean_runtime_s * mean_gpus);
    sc.offline_rate_per_h = rate_per_s * 3600.0;
    let expected = rate_per_s * sc.end_s;
    if expected > MAX_OFFLINE_JOBS as f64 {
        return Err(ScenarioError::Settings(format!(
            "about {expected:.0} offline jobs would arrive (the replay holds at most {MAX_OFFLINE_JOBS}): lower --offline-load or --days"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    let mut t = 0.0;
    let mut id = 0u32;
    if rate_per_s > 0.0 {
        loop {
            // Exponential gaps: -ln(U)/λ with U in (0, 1].
            let u: f64 = 1.0 - rng.gen::<f64>();
            t += -u.ln() / rate_per_s;
            if t >= sc.end_s {
                break;
            }
            let task = shapes[rng.gen_range(0..shapes.len())];
            let work_s = runtime(runtimes[rng.gen_range(0..runtimes.len())]);
            let tk = &tasks[task as usize];
            let share = f64::from(tk.gpu_milli) / 1000.0;
            // A multi-GPU offline task is one job on that many GPUs of one
            // node (a gang: synchronous training needs all of them).
            id += 1;
            sc.jobs.push(OfflineJob {
                id,
                arrival_s: t,
                work_s,
                gpus: tk.num_gpu,
                task,
                job_type: sc.pairs.job_type(&tk.name),
                share,
                mem_mib: (MEM_PER_SHARE * share * OFFLINE_REFERENCE_GPU_MIB).round() as u64,
                models: allowed(&tk.gpu_spec, &sc.models),
            });
        }
    }
    sc.tasks = tasks;
    Ok(sc)
}

/// Online services in trace order, the list repeated, until `fill` of the
/// GPUs hold one; a task goes to the first node (list order) with
/// `num_gpu` free GPUs of an allowed model, and holds each as its owner.
/// A pass that places nothing ends the filling (what is left cannot fit).
fn place_online(
    sc: &mut Scenario,
    tasks: &[Task],
    fill: f64,
    allowed: &impl Fn(&Option<Vec<String>>, &[String]) -> Option<Vec<u16>>,
) {
    let target = (fill * sc.gpus.len() as f64).round() as usize;
    let online: Vec<u32> = tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind == Kind::Online && t.num_gpu > 0 && t.gpu_milli > 0)
        .map(|(i, _)| i as u32)
        .collect();
    // First GPU of each node; GPUs of a node are contiguous.
    let mut first = vec![0usize; sc.nodes.len() + 1];
    for (i, g) in sc.gpus.iter().enumerate().rev() {
        first[g.node as usize] = i;
    }
    first[sc.nodes.len()] = sc.gpus.len();
    let mut free: Vec<u32> = (0..sc.nodes.len())
        .map(|n| (first[n + 1] - first[n]) as u32)
        .collect();
    let mut unplaceable = std::collections::BTreeSet::new();
    let mut job_id = 1_000_000u32;
    'fill: while sc.online_gpus < target && !online.is_empty() {
        let mut placed_any = false;
        for &ti in &online {
            if sc.online_gpus >= target {
                break 'fill;
            }
            let t = &tasks[ti as usize];
            let models = allowed(&t.gpu_spec, &sc.models);
            let need = t.num_gpu;
            let node = (0..sc.nodes.len()).find(|&n| {
                free[n] >= need
                    && models
                        .as_ref()
                        .is_none_or(|m| m.contains(&sc.gpus[first[n]].model))
            });
            let Some(n) = node else {
                unplaceable.insert(ti);
                continue;
            };
            job_id += 1;
            let mut left = need;
            for g in first[n]..first[n + 1] {
                if left == 0 {
                    break;
                }
                if sc.online[g].is_none() {
                    let share = f64::from(t.gpu_milli) / 1000.0;
                    sc.online[g] = Some(Service {
                        job_id,
                        task: ti,
                        job_type: sc.pairs.job_type(&t.name),
                        share,
                        mem_mib: (MEM_PER_SHARE * share * sc.gpus[g].mem_mib as f64).round() as u64,
                    });
                    left -= 1;
                }
            }
            free[n] -= need;
            sc.online_gpus += need as usize;
            sc.online_services += 1;
            placed_any = true;
        }
        if !placed_any {
            break;
        }
    }
    sc.online_tasks_unplaceable = unplaceable.len();
}

/// The replicas of the placed services, grouped into services by request
/// shape (in order of first placement).
fn group_replicas(
    sc: &mut Scenario,
    tasks: &[Task],
    allowed: &impl Fn(&Option<Vec<String>>, &[String]) -> Option<Vec<u16>>,
) {
    let mut by_id: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (g, o) in sc.online.iter().enumerate() {
        if let Some(svc) = o {
            by_id.entry(svc.job_id).or_default().push(g as u32);
        }
    }
    let mut shapes: Vec<(u32, u32, Option<Vec<String>>)> = Vec::new();
    for gpus in by_id.into_values() {
        let task = sc.online[gpus[0] as usize].expect("an online GPU").task;
        let t = &tasks[task as usize];
        let shape = (t.num_gpu, t.gpu_milli, t.gpu_spec.clone());
        let service = match shapes.iter().position(|s| *s == shape) {
            Some(i) => i,
            None => {
                shapes.push(shape);
                shapes.len() - 1
            }
        };
        sc.replicas.push(Replica {
            service: service as u32,
            task,
            gpus,
            models: allowed(&t.gpu_spec, &sc.models),
        });
    }
    sc.services = shapes.len();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{read_nodes, read_pairs, read_tasks, Source};

    fn src(text: &str) -> Source<'_> {
        Source {
            name: "t".into(),
            bytes: text.as_bytes(),
        }
    }

    #[test]
    fn online_fill_repeats_the_list_respects_gpu_spec_and_keeps_offline_gangs_whole() {
        let nodes = read_nodes(&src("sn,gpu,model\nn1,4,V100M16\nn2,2,T4\n")).unwrap();
        let tasks = read_tasks(&src("name,num_gpu,gpu_milli,gpu_spec,qos\n\
             svc-a,1,1000,,LS\nsvc-b,2,1000,T4,LS\nsvc-c,1,460,,Burstable\ncpu,0,0,,LS\n\
             be,2,500,,BE\n"))
        .unwrap();
        let pairs = read_pairs(&src(
            "job_a,job_b,solo_a,solo_b,shared_a,shared_b\nA,B,1,1,0.5,0.5\n",
        ))
        .unwrap();
        let s = Settings {
            days: 1.0,
            online_fill: 1.0,
            ..Settings::default()
        };
        let sc = build(&nodes, tasks, &[3600.0], pairs, &s).unwrap();
        // Pass 1: svc-a n1/0, svc-b both T4s of n2, svc-c n1/1; pass 2:
        // svc-a n1/2, svc-b fits nowhere (no T4 left), svc-c n1/3.
        let owner: Vec<Option<(&str, f64)>> = sc
            .online
            .iter()
            .map(|o| {
                o.as_ref()
                    .map(|s| (sc.tasks[s.task as usize].name.as_str(), s.share))
            })
            .collect();
        assert_eq!(
            owner,
            [
                Some(("svc-a", 1.0)),
                Some(("svc-c", 0.46)),
                Some(("svc-a", 1.0)),
                Some(("svc-c", 0.46)),
                Some(("svc-b", 1.0)),
                Some(("svc-b", 1.0)),
            ]
        );
        assert_eq!(
            (
                sc.online_gpus,
                sc.online_services,
                sc.online_tasks_unplaceable
            ),
            (6, 5, 1)
        );
        // Both T4s belong to one service: one job id.
        let ids: Vec<u32> = sc.online[4..]
            .iter()
            .map(|o| o.as_ref().unwrap().job_id)
            .collect();
        assert_eq!(ids[0], ids[1]);
        // Memory: 0.4 of the share of the GPU's memory.
        assert_eq!(sc.online[1].as_ref().unwrap().mem_mib, 3015); // 0.4 × 0.46 × 16384
        assert_eq!(sc.online[4].as_ref().unwrap().mem_mib, 6144); // 0.4 × 15360

        // Offline: rate = 6 GPUs / (3600 s × 2 GPUs per task); each arrival
        // is one 2-GPU job (a gang), not two workers.
        assert!((sc.offline_rate_per_h - 3.0).abs() < 1e-9);
        assert!(sc.jobs.len() > 20, "{}", sc.jobs.len());
        for (i, j) in sc.jobs.iter().enumerate() {
            assert_eq!(j.id, i as u32 + 1);
            assert_eq!((j.gpus, j.share, j.mem_mib), (2, 0.5, 3277));
        }
        assert!(sc.jobs.windows(2).all(|w| w[0].arrival_s < w[1].arrival_s));
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        let nodes = read_nodes(&src("sn,gpu,model\nn1,1,V100M16\n")).unwrap();
        let tasks = || {
            read_tasks(&src(
                "name,num_gpu,gpu_milli,gpu_spec,qos\na,1,1000,,LS\nb,1,1000,,BE\n",
            ))
            .unwrap()
        };
        for (s, want) in [
            (
                Settings {
                    days: 0.0,
                    ..Settings::default()
                },
                "--days",
            ),
            (
                Settings {
                    online_fill: 1.5,
                    ..Settings::default()
                },
                "--online-fill",
            ),
            (
                Settings {
                    offline_load: f64::NAN,
                    ..Settings::default()
                },
                "--offline-load",
            ),
            (
                Settings {
                    round_interval_s: 0.5,
                    ..Settings::default()
                },
                "--round-interval",
            ),
        ] {
            let e = build(&nodes, tasks(), &[60.0], Pairs::default(), &s).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
    }
}
