//! What a replay prints: the table (policies as columns), `--json`, the
//! hourly `--timeline` CSV and the `--plot` SVG. Every figure is rounded
//! to fixed decimals, so equal runs print equal bytes.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::{round, Churn, Fixed, Outcome};
use crate::scenario::{Scenario, Settings};

/// `inputs` in `--json`: what was replayed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InputFigures {
    pub nodes: String,
    pub trace: String,
    pub offline_runtimes: String,
    pub interference: String,
    pub node_count: usize,
    pub gpus: usize,
    pub online_gpus: usize,
    pub online_services: usize,
    pub online_tasks_unplaceable: usize,
    pub job_types: usize,
    pub days: f64,
    pub online_fill: f64,
    pub offline_load: f64,
    pub offline_jobs: usize,
    pub offline_rate_per_h: f64,
    pub offline_mean_runtime_s: f64,
    pub seed: u64,
    pub round_interval_s: f64,
    pub health_interval_s: f64,
    pub autoscale: bool,
    /// Services the placed online tasks form when they scale (tasks of one
    /// request shape: sim/README.md, "Services that come and go").
    pub scaled_services: usize,
    pub checkpoint_interval_s: f64,
    pub checkpoint_save_s: f64,
    pub checkpoint_on_requeue: bool,
    pub requeue_grace_s: f64,
}

impl InputFigures {
    pub fn of(sc: &Scenario, s: &Settings, names: [&str; 4]) -> InputFigures {
        InputFigures {
            nodes: names[0].into(),
            trace: names[1].into(),
            offline_runtimes: names[2].into(),
            interference: names[3].into(),
            node_count: sc.nodes.len(),
            gpus: sc.gpus.len(),
            online_gpus: sc.online_gpus,
            online_services: sc.online_services,
            online_tasks_unplaceable: sc.online_tasks_unplaceable,
            job_types: sc.pairs.types.len(),
            days: s.days,
            online_fill: s.online_fill,
            offline_load: s.offline_load,
            offline_jobs: sc.jobs.len(),
            offline_rate_per_h: round(sc.offline_rate_per_h, 2),
            offline_mean_runtime_s: round(sc.mean_runtime_s, 1),
            seed: s.seed,
            round_interval_s: s.round_interval_s,
            health_interval_s: s.health_interval_s,
            autoscale: s.autoscale,
            scaled_services: sc.services,
            checkpoint_interval_s: s.checkpoint.interval_s,
            checkpoint_save_s: s.checkpoint.save_s,
            checkpoint_on_requeue: s.checkpoint.on_requeue,
            requeue_grace_s: s.checkpoint.grace_s,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Json<'a> {
    policies: &'a [Outcome],
    inputs: &'a InputFigures,
}

pub fn json(policies: &[Outcome], inputs: &InputFigures) -> String {
    serde_json::to_string_pretty(&Json { policies, inputs }).expect("figures serialize")
}

/// A row of the table: its label and a policy's cell.
type Row = (&'static str, Box<dyn Fn(&Outcome) -> String>);

/// A figure as printed (`-` where it does not apply).
fn shown<const D: i32>(v: Option<Fixed<D>>, f: impl Fn(f64) -> String) -> String {
    v.map_or("-".to_string(), |v| f(v.shown()))
}

fn pct<const D: i32>(v: Fixed<D>) -> String {
    format!("{:.1}%", v.shown() * 100.0)
}

/// A row of the online GPUs' time while offline work waited (`-` for a
/// policy without rounds).
fn waiting(f: fn(&crate::replay::WhileWaiting) -> Fixed<1>) -> Box<dyn Fn(&Outcome) -> String> {
    Box::new(move |p: &Outcome| shown(p.while_waiting.as_ref().map(f), |v| format!("{v:.0}")))
}

fn count(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// The table: one row per figure, one column per policy.
pub fn table(policies: &[Outcome], inputs: &InputFigures) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "replay: {} GPUs on {} nodes, {} hold an online service ({} services), {:.1} days, {} offline jobs ({:.1}/h, mean run time {:.0} s alone), seed {}",
        inputs.gpus,
        inputs.node_count,
        inputs.online_gpus,
        inputs.online_services,
        inputs.days,
        inputs.offline_jobs,
        inputs.offline_rate_per_h,
        inputs.offline_mean_runtime_s,
        inputs.seed
    );
    let mut rows = figure_rows();
    // --autoscale: what services coming and going cost.
    if policies.iter().any(|p| p.churn.is_some()) {
        rows.extend(churn_rows());
    }
    let _ = write!(s, "{:<32}", "");
    for p in policies {
        let _ = write!(s, " {:>13}", p.policy.name());
    }
    s.push('\n');
    for (label, f) in &rows {
        let _ = write!(s, "{label:<32}");
        for p in policies {
            let _ = write!(s, " {:>13}", f(p));
        }
        s.push('\n');
    }
    s
}

/// The table's rows of every replay.
fn figure_rows() -> Vec<Row> {
    let x = |v: Fixed<4>| format!("x{:.3}", v.shown());
    let secs = |v: f64| format!("{v:.0}");
    vec![
        ("GPU utilization (all GPUs)", Box::new(|p| pct(p.gpu_util))),
        ("SM activity (all GPUs)", Box::new(|p| pct(p.sm_activity))),
        ("GPU memory used / total", Box::new(|p| pct(p.mem_util))),
        (
            "GPU utilization (online GPUs)",
            Box::new(|p| pct(p.online_gpu_util)),
        ),
        (
            "SM activity (online GPUs)",
            Box::new(|p| pct(p.online_gpu_sm_activity)),
        ),
        (
            "online latency factor p50",
            Box::new(move |p| x(p.online_latency_p50)),
        ),
        (
            "online latency factor p99",
            Box::new(move |p| x(p.online_latency_p99)),
        ),
        (
            "offline JCT mean, s",
            Box::new(move |p| shown(p.offline_jct_mean_s, secs)),
        ),
        (
            "offline JCT p50, s",
            Box::new(move |p| shown(p.offline_jct_p50_s, secs)),
        ),
        (
            "offline JCT p90, s",
            Box::new(move |p| shown(p.offline_jct_p90_s, secs)),
        ),
        (
            "offline queueing mean, s",
            Box::new(move |p| shown(p.offline_queue_mean_s, secs)),
        ),
        (
            "offline work done, GPU-h",
            Box::new(|p| format!("{:.0}", p.offline_gpu_hours.shown())),
        ),
        (
            "offline jobs finished",
            Box::new(|p| p.offline_finished.to_string()),
        ),
        (
            "offline jobs running at end",
            Box::new(|p| p.offline_running_end.to_string()),
        ),
        (
            "offline jobs waiting at end",
            Box::new(|p| p.offline_waiting_end.to_string()),
        ),
        (
            "lent to offline, GPU-h",
            Box::new(|p| format!("{:.0}", p.lent_gpu_hours.shown())),
        ),
        ("matcher rounds", Box::new(|p| count(p.rounds))),
        (
            "matcher time total, s",
            Box::new(|p| shown(p.round_total_s, |v| format!("{v:.2}"))),
        ),
        (
            "predictor MAE",
            Box::new(|p| shown(p.predictor_mae, |v| format!("{v:.3}"))),
        ),
        (
            "pairing vs oracle",
            Box::new(|p| shown(p.pairing_vs_oracle, |v| format!("{v:.3}"))),
        ),
        (
            "placements failed (memory)",
            Box::new(|p| count(p.oom_starts)),
        ),
        (
            "while offline waits: held, GPU-h",
            waiting(|w| w.held_gpu_hours),
        ),
        (
            "  unused beside it, GPU-h",
            waiting(|w| w.held_unused_gpu_hours),
        ),
        (
            "  work the brake held back",
            waiting(|w| w.braked_gpu_hours),
        ),
        ("  open: health, GPU-h", waiting(|w| w.health_gpu_hours)),
        (
            "  open: before a round, GPU-h",
            waiting(|w| w.rounds_gpu_hours),
        ),
        (
            "  open: no job fits memory",
            waiting(|w| w.memory_gpu_hours),
        ),
        (
            "  open: left by the round",
            waiting(|w| w.unplaced_gpu_hours),
        ),
        (
            "gang jobs (k GPUs) arrived/done",
            Box::new(|p| format!("{}/{}", p.gang_arrived, p.gang_finished)),
        ),
        (
            "gang work done, GPU-h",
            Box::new(|p| format!("{:.0}", p.gang_gpu_hours.shown())),
        ),
        (
            "jobs on fewer GPUs than asked",
            Box::new(|p| p.offline_short_of_gpus.to_string()),
        ),
    ]
}

/// The table's rows of `--autoscale`: what services coming and going
/// cost (`-` for a policy without).
fn churn_rows() -> Vec<Row> {
    let n = |f: fn(&Churn) -> u64| move |p: &Outcome| count(p.churn.as_ref().map(f));
    vec![
        ("online replicas started", Box::new(n(|c| c.replica_starts))),
        (
            "  waited for offline to leave",
            Box::new(n(|c| c.starts_delayed)),
        ),
        (
            "  start delay mean / max, s",
            Box::new(|p| match &p.churn {
                Some(c) => format!(
                    "{:.2}/{:.1}",
                    c.start_delay_mean_s.shown(),
                    c.start_delay_max_s.shown()
                ),
                None => "-".into(),
            }),
        ),
        (
            "  replica-hours with no GPU",
            Box::new(n(|c| c.replica_hours_short)),
        ),
        ("offline requeues (replicas)", Box::new(n(|c| c.requeues))),
        (
            "offline work lost, GPU-h",
            Box::new(|p| {
                shown(p.churn.as_ref().map(|c| c.lost_gpu_hours), |v| {
                    format!("{v:.1}")
                })
            }),
        ),
    ]
}

/// `--timeline`: one row per policy and simulated hour.
pub fn timeline_csv(outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "policy,hour,online_load,gpu_util,sm_activity,online_gpu_util,offline_running,offline_waiting,offline_finished,lent_gpus\n",
    );
    for o in outcomes {
        for r in &o.timeline {
            let _ = writeln!(
                s,
                "{},{},{:.4},{:.4},{:.4},{:.4},{},{},{},{:.1}",
                o.policy.name(),
                r.hour,
                r.online_load,
                r.gpu_util,
                r.sm_activity,
                r.online_gpu_util,
                r.offline_running,
                r.offline_waiting,
                r.offline_finished,
                r.lent_gpus
            );
        }
    }
    s
}

/// `--plot`: GPU utilization per hour per policy, and the offline JCT CDF.
pub fn plot_svg(outcomes: &[Outcome]) -> Result<String, String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(520);
        let colors = [
            RGBColor(120, 120, 120),
            RGBColor(214, 96, 77),
            RGBColor(244, 165, 66),
            RGBColor(33, 102, 172),
            RGBColor(27, 158, 119),
            RGBColor(117, 112, 179),
            RGBColor(231, 41, 138),
        ];
        let color = |o: &Outcome| colors[o.policy.ordinal() % colors.len()];
        let hours = outcomes
            .iter()
            .map(|o| o.timeline.len())
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let mut chart = ChartBuilder::on(&left)
            .caption("GPU utilization, all GPUs (hourly)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..hours / 24.0, 0f64..100f64)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("day")
            .y_desc("%")
            .draw()
            .map_err(|e| e.to_string())?;
        for o in outcomes {
            let c = color(o);
            chart
                .draw_series(LineSeries::new(
                    o.timeline
                        .iter()
                        .map(|r| ((f64::from(r.hour) + 0.5) / 24.0, r.gpu_util * 100.0)),
                    c.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(o.policy.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| e.to_string())?;

        let max_h = outcomes
            .iter()
            .filter_map(|o| o.jct_s.last())
            .fold(1.0f64, |a, &b| a.max(b / 3600.0));
        let mut cdf = ChartBuilder::on(&right)
            .caption("offline JCT, CDF (finished jobs)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(44)
            .build_cartesian_2d((0.01f64..max_h.max(0.02)).log_scale(), 0f64..1f64)
            .map_err(|e| e.to_string())?;
        cdf.configure_mesh()
            .x_desc("hours (log)")
            .y_desc("fraction")
            .draw()
            .map_err(|e| e.to_string())?;
        for o in outcomes {
            let n = o.jct_s.len();
            if n == 0 {
                continue;
            }
            // At most ~400 points per curve: an SVG, not a data dump.
            let step = n.div_ceil(400).max(1);
            let pts = (0..n)
                .step_by(step)
                .chain([n - 1])
                .map(|i| ((o.jct_s[i] / 3600.0).max(0.01), (i + 1) as f64 / n as f64));
            cdf.draw_series(LineSeries::new(pts, color(o).stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}
