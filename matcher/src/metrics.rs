//! The matcher's figures for Prometheus ([`muxflow::metrics`]): after each
//! round, served on `[metrics] listen` (`GET /metrics`) and written to
//! `[metrics] textfile_dir` (`muxflow-matcher.prom`) when set.
//!
//! * `muxflow_matcher_rounds_total`, `…_round_failures_total`,
//!   `…_round_duration_seconds` (the last round), `…_round_duration_seconds_total`;
//! * `muxflow_matcher_offline_jobs` by `state`: `pending` (held, waiting for
//!   a GPU), `placed` (placed by the last round);
//! * `muxflow_matcher_placements_total`;
//! * `muxflow_matcher_gpus` by `state`: `online` (holding an online job),
//!   `open` (Healthy with a free offline slot);
//! * `muxflow_matcher_predicted_throughput` — the last round's total
//!   predicted normalized throughput;
//! * `muxflow_matcher_predictor_mae_ratio` — the predictor's mean absolute
//!   error on held-out pairs of the finished jobs' history (the figure
//!   `--evaluate` prints), with `…_predictor_test_pairs`.

use std::sync::{Arc, Mutex};

use muxflow::metrics::Exposition;

use crate::predict::Evaluation;
use crate::round::Summary;

/// The textfile's name in `textfile_dir`.
pub const TEXTFILE: &str = "muxflow-matcher.prom";

/// What the daemon has done since it started.
#[derive(Debug, Clone, Default)]
pub struct MatcherMetrics {
    rounds: u64,
    failures: u64,
    placements: u64,
    seconds_total: f64,
    last_seconds: Option<f64>,
    last: Option<Summary>,
    evaluation: Option<Evaluation>,
}

impl MatcherMetrics {
    pub fn round_done(&mut self, summary: &Summary, seconds: f64) {
        self.rounds += 1;
        self.placements += summary.placed as u64;
        self.seconds_total += seconds;
        self.last_seconds = Some(seconds);
        self.last = Some(summary.clone());
    }

    pub fn round_failed(&mut self, seconds: f64) {
        self.rounds += 1;
        self.failures += 1;
        self.seconds_total += seconds;
        self.last_seconds = Some(seconds);
    }

    pub fn evaluated(&mut self, e: Evaluation) {
        self.evaluation = Some(e);
    }

    pub fn exposition(&self) -> Exposition {
        let mut e = Exposition::default();
        e.counter("muxflow_matcher_rounds_total", "Matching rounds run.")
            .sample(&[], self.rounds as f64);
        e.counter(
            "muxflow_matcher_round_failures_total",
            "Rounds that failed (Slurm unreachable, bad output); the next round reads Slurm afresh.",
        )
        .sample(&[], self.failures as f64);
        e.counter(
            "muxflow_matcher_round_duration_seconds_total",
            "Time spent in rounds.",
        )
        .sample(&[], self.seconds_total);
        if let Some(s) = self.last_seconds {
            e.gauge(
                "muxflow_matcher_round_duration_seconds",
                "Duration of the last round (read Slurm, predict, match, apply).",
            )
            .sample(&[], s);
        }
        e.counter(
            "muxflow_matcher_placements_total",
            "Offline jobs placed on a GPU.",
        )
        .sample(&[], self.placements as f64);
        if let Some(s) = &self.last {
            let jobs = e.gauge(
                "muxflow_matcher_offline_jobs",
                "Offline jobs in the last round: pending (held, waiting for a GPU) and placed by it.",
            );
            jobs.sample(&[("state", "pending".into())], s.pending_offline as f64);
            jobs.sample(&[("state", "placed".into())], s.placed as f64);
            let gpus = e.gauge(
                "muxflow_matcher_gpus",
                "GPUs in the last round: holding an online job, and open (Healthy, a free offline slot).",
            );
            gpus.sample(&[("state", "online".into())], s.online_gpus as f64);
            gpus.sample(&[("state", "open".into())], s.open_gpus as f64);
            e.gauge(
                "muxflow_matcher_predicted_throughput",
                "Total predicted normalized throughput of the last round's placements.",
            )
            .sample(&[], s.predicted_total);
            e.gauge(
                "muxflow_matcher_round_exact_over_every_pair",
                "1 when the last round's matching of 1-GPU jobs was exact over every (job, GPU) pair, 0 when matcher.pricing_budget_ms ran out first (exact on its candidates only).",
            )
            .sample(&[], f64::from(u8::from(s.full_graph)));
        }
        if let Some(ev) = &self.evaluation {
            e.gauge(
                "muxflow_matcher_predictor_mae_ratio",
                "Mean absolute error of the predicted normalized throughput on held-out pairs of finished jobs.",
            )
            .sample(&[], ev.model_mae);
            e.gauge(
                "muxflow_matcher_predictor_test_pairs",
                "Held-out pairs the predictor error is measured on.",
            )
            .sample(&[], ev.test_pairs as f64);
        }
        e
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {why} (check [metrics] listen)")]
pub struct ServeError {
    pub addr: String,
    pub why: String,
}

/// Serves the latest exposition on `addr` (`GET /metrics`) from a thread;
/// the returned handle updates what it serves.
pub fn serve(addr: &str) -> Result<Arc<Mutex<String>>, ServeError> {
    let server = tiny_http::Server::http(addr).map_err(|e| ServeError {
        addr: addr.to_string(),
        why: e.to_string(),
    })?;
    let text = Arc::new(Mutex::new(String::new()));
    let shared = Arc::clone(&text);
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let response = if request.url() == "/metrics" {
                    let body = shared.lock().map(|t| t.clone()).unwrap_or_default();
                    let header = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"text/plain; version=0.0.4; charset=utf-8"[..],
                    )
                    .expect("a valid header");
                    tiny_http::Response::from_string(body).with_header(header)
                } else {
                    tiny_http::Response::from_string("muxflow-matcher: see /metrics\n")
                        .with_status_code(404)
                };
                if let Err(e) = request.respond(response) {
                    tracing::debug!("metrics response: {e}");
                }
            }
        })
        .map_err(|e| ServeError {
            addr: addr.to_string(),
            why: e.to_string(),
        })?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn rounds_and_failures_add_up_and_the_endpoint_serves_them() {
        let mut m = MatcherMetrics::default();
        let s = Summary {
            pending_offline: 5,
            online_gpus: 8,
            open_gpus: 3,
            placed: 2,
            predicted_total: 1.5,
            full_graph: true,
            ..Summary::default()
        };
        m.round_done(&s, 0.25);
        m.round_failed(0.5);
        let text = m.exposition().render();
        assert!(text.contains("muxflow_matcher_rounds_total 2\n"), "{text}");
        assert!(text.contains("muxflow_matcher_round_failures_total 1\n"));
        assert!(text.contains("muxflow_matcher_placements_total 2\n"));
        assert!(text.contains("muxflow_matcher_offline_jobs{state=\"pending\"} 5\n"));
        assert!(text.contains("muxflow_matcher_round_duration_seconds 0.5\n"));
        assert!(text.contains("muxflow_matcher_round_exact_over_every_pair 1\n"));

        // A free port: bound, noted, released.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let handle = serve(&addr).unwrap();
        *handle.lock().unwrap() = text.clone();
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut got = String::new();
        conn.read_to_string(&mut got).unwrap();
        assert!(
            got.starts_with("HTTP/1.0 200") || got.starts_with("HTTP/1.1 200"),
            "{got}"
        );
        assert!(got.contains("version=0.0.4"), "{got}");
        assert!(got.ends_with(&text), "{got}");
        let e = serve(&addr).unwrap_err();
        assert!(e.to_string().contains("[metrics] listen"), "{e}");
    }
}
