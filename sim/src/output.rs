//! What a replay prints: the table (policies as columns), `--json`, the
//! hourly `--timeline` CSV and the `--plot` SVG. Every figure is rounded
//! to fixed decimals, so equal runs print equal bytes.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::Outcome;
use crate::scenario::{Scenario, Settings};

fn round(v: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    let r = (v * f).round() / f;
    if r == 0.0 {
        0.0 // no "-0"
    } else {
        r
    }
}

/// Quantile of sorted values (nearest rank); `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[k - 1])
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// One policy in `--json` (field names are the stable interface).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicyFigures {
    pub name: String,
    pub gpu_util: f64,
    pub sm_activity: f64,
    pub mem_util: f64,
    pub online_gpu_util: f64,
    pub online_gpu_sm_activity: f64,
    pub online_latency_p50: f64,
    pub online_latency_p99: f64,
    pub offline_jct_mean_s: Option<f64>,
    pub offline_jct_p50_s: Option<f64>,
    pub offline_jct_p90_s: Option<f64>,
    pub offline_queue_mean_s: Option<f64>,
    pub offline_gpu_hours: f64,
    pub offline_finished: u64,
    pub lent_gpu_hours: f64,
    pub rounds: Option<u64>,
    pub round_total_s: Option<f64>,
    pub predictor_mae: Option<f64>,
    pub pairing_vs_oracle: Option<f64>,
    pub offline_arrived: u64,
    pub offline_running_end: u64,
    pub offline_waiting_end: u64,
    pub offline_oom_starts: Option<u64>,
    pub offline_peer_runs: Option<u64>,
    pub offline_refused_placements: Option<u64>,
    pub offline_short_of_gpus: u64,
    pub gang_arrived: u64,
    pub gang_finished: u64,
    pub gang_gpu_hours: f64,
    /// `--autoscale` (null without): replicas started, those that waited
    /// for offline work to leave their GPUs, the wait (mean over every
    /// start, and longest), replica-hours no node could take, offline
    /// requeues and the work they lost.
    pub online_replica_starts: Option<u64>,
    pub online_starts_delayed: Option<u64>,
    pub online_start_delay_mean_s: Option<f64>,
    pub online_start_delay_max_s: Option<f64>,
    pub online_replica_hours_short: Option<u64>,
    pub offline_requeues: Option<u64>,
    pub offline_lost_gpu_hours: Option<f64>,
}

impl PolicyFigures {
    pub fn of(o: &Outcome) -> PolicyFigures {
        let r4 = |v: f64| round(v, 4);
        let r1 = |v: f64| round(v, 1);
        PolicyFigures {
            name: o.policy.name().to_string(),
            gpu_util: r4(o.gpu_util),
            sm_activity: r4(o.sm_activity),
            mem_util: r4(o.mem_util),
            online_gpu_util: r4(o.online_gpu_util),
            online_gpu_sm_activity: r4(o.online_gpu_sm_activity),
            online_latency_p50: r4(o.online_latency_p50),
            online_latency_p99: r4(o.online_latency_p99),
            offline_jct_mean_s: mean(&o.jct_s).map(r1),
            offline_jct_p50_s: quantile(&o.jct_s, 0.5).map(r1),
            offline_jct_p90_s: quantile(&o.jct_s, 0.9).map(r1),
            offline_queue_mean_s: mean(&o.queue_s).map(r1),
            offline_gpu_hours: r1(o.offline_gpu_hours),
            offline_finished: o.offline_finished,
            lent_gpu_hours: r1(o.lent_gpu_hours),
            rounds: o.rounds,
            round_total_s: o.round_total_s.map(|v| round(v, 3)),
            predictor_mae: o.predictor_mae.map(r4),
            pairing_vs_oracle: o.pairing_vs_oracle.map(r4),
            offline_arrived: o.offline_arrived,
            offline_running_end: o.offline_running_end,
            offline_waiting_end: o.offline_waiting_end,
            offline_oom_starts: o.oom_starts,
            offline_peer_runs: o.peer_runs,
            offline_refused_placements: o.refused_placements,
            offline_short_of_gpus: o.offline_short_of_gpus,
            gang_arrived: o.gang_arrived,
            gang_finished: o.gang_finished,
            gang_gpu_hours: r1(o.gang_gpu_hours),
            online_replica_starts: o.churn.as_ref().map(|c| c.replica_starts),
            online_starts_delayed: o.churn.as_ref().map(|c| c.starts_delayed),
            online_start_delay_mean_s: o
                .churn
                .as_ref()
                .map(|c| round(c.start_delay_total_s / (c.replica_starts.max(1) as f64), 3)),
            online_start_delay_max_s: o.churn.as_ref().map(|c| round(c.start_delay_max_s, 3)),
            online_replica_hours_short: o.churn.as_ref().map(|c| c.replica_hours_short),
            offline_requeues: o.churn.as_ref().map(|c| c.requeues),
            offline_lost_gpu_hours: o.churn.as_ref().map(|c| r1(c.lost_gpu_hours)),
        }
    }
}

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
    policies: &'a [PolicyFigures],
    inputs: &'a InputFigures,
}

pub fn json(policies: &[PolicyFigures], inputs: &InputFigures) -> String {
    serde_json::to_string_pretty(&Json { policies, inputs }).expect("figures serialize")
}

/// The table: one row per figure, one column per policy.
pub fn table(policies: &[PolicyFigures], inputs: &InputFigures) -> String {
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
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    let x = |v: f64| format!("x{v:.3}");
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
    let secs = |v: f64| format!("{v:.0}");
    type Row<'a> = (&'a str, Box<dyn Fn(&PolicyFigures) -> String + 'a>);
    let rows: Vec<Row> = vec![
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
            Box::new(|p| x(p.online_latency_p50)),
        ),
        (
            "online latency factor p99",
            Box::new(|p| x(p.online_latency_p99)),
        ),
        (
            "offline JCT mean, s",
            Box::new(|p| opt(p.offline_jct_mean_s, &secs)),
        ),
        (
            "offline JCT p50, s",
            Box::new(|p| opt(p.offline_jct_p50_s, &secs)),
        ),
        (
            "offline JCT p90, s",
            Box::new(|p| opt(p.offline_jct_p90_s, &secs)),
        ),
        (
            "offline queueing mean, s",
            Box::new(|p| opt(p.offline_queue_mean_s, &secs)),
        ),
        (
            "offline work done, GPU-h",
            Box::new(|p| format!("{:.0}", p.offline_gpu_hours)),
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
            Box::new(|p| format!("{:.0}", p.lent_gpu_hours)),
        ),
        (
            "matcher rounds",
            Box::new(|p| p.rounds.map_or("-".into(), |r| r.to_string())),
        ),
        (
            "matcher time total, s",
            Box::new(|p| opt(p.round_total_s, &|v| format!("{v:.2}"))),
        ),
        (
            "predictor MAE",
            Box::new(|p| opt(p.predictor_mae, &|v| format!("{v:.3}"))),
        ),
        (
            "pairing vs oracle",
            Box::new(|p| opt(p.pairing_vs_oracle, &|v| format!("{v:.3}"))),
        ),
        (
            "placements failed (memory)",
            Box::new(|p| p.offline_oom_starts.map_or("-".into(), |r| r.to_string())),
        ),
        (
            "gang jobs (k GPUs) arrived/done",
            Box::new(|p| format!("{}/{}", p.gang_arrived, p.gang_finished)),
        ),
        (
            "gang work done, GPU-h",
            Box::new(|p| format!("{:.0}", p.gang_gpu_hours)),
        ),
        (
            "jobs on fewer GPUs than asked",
            Box::new(|p| p.offline_short_of_gpus.to_string()),
        ),
    ];
    // --autoscale: what services coming and going cost.
    let mut rows = rows;
    if policies.iter().any(|p| p.online_replica_starts.is_some()) {
        let n = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        let churn: Vec<Row> = vec![
            (
                "online replicas started",
                Box::new(move |p| n(p.online_replica_starts)),
            ),
            (
                "  waited for offline to leave",
                Box::new(move |p| n(p.online_starts_delayed)),
            ),
            (
                "  start delay mean / max, s",
                Box::new(
                    |p| match (p.online_start_delay_mean_s, p.online_start_delay_max_s) {
                        (Some(a), Some(b)) => format!("{a:.2}/{b:.1}"),
                        _ => "-".into(),
                    },
                ),
            ),
            (
                "  replica-hours with no GPU",
                Box::new(move |p| n(p.online_replica_hours_short)),
            ),
            (
                "offline requeues (replicas)",
                Box::new(move |p| n(p.offline_requeues)),
            ),
            (
                "offline work lost, GPU-h",
                Box::new(|p| opt(p.offline_lost_gpu_hours, &|v| format!("{v:.1}"))),
            ),
        ];
        rows.extend(churn);
    }
    let _ = write!(s, "{:<32}", "");
    for p in policies {
        let _ = write!(s, " {:>13}", p.name);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), Some(2.0));
        assert_eq!(quantile(&v, 0.9), Some(4.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(round(-0.00001, 4).to_string(), "0");
    }
}
