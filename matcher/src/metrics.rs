//! The matcher's figures for Prometheus ([`muxflow::records::metrics`]): after each
//! round, served on `[metrics] listen` (`GET /metrics`) and written to
//! `[metrics] textfile_dir` (`muxflow-matcher.prom`) when set.
//!
//! * `muxflow_matcher_build_info{version, slurm}` — always 1: which build
//!   runs, for the Slurm release it was built for;
//! * `muxflow_matcher_rounds_total`, `…_round_failures_total`,
//!   `…_round_duration_seconds` (the last round), `…_round_duration_seconds_total`;
//! * `muxflow_matcher_last_success_timestamp_seconds` — when the last
//!   successful round ended (Unix time): the series to alert on, since a
//!   matcher that stops rounding leaves every offline job held;
//! * `muxflow_matcher_offline_jobs` by `state`: `pending` (held, waiting for
//!   a GPU), `placed` (placed by the last round, or kept where it was),
//!   `parked` (left waiting by it);
//! * `muxflow_matcher_placements_total` — new placements (a job kept where
//!   it was placed counts once);
//! * `muxflow_matcher_gpus` by `state`: `online` (holding an online job),
//!   `open` (Healthy with a free offline slot);
//! * `muxflow_matcher_predicted_throughput` — the last round's total
//!   predicted normalized throughput;
//! * `muxflow_matcher_predictor_mae_ratio` — the predictor's mean absolute
//!   error on held-out pairs of the finished jobs' history (the figure
//!   `--evaluate` prints), with `…_predictor_test_pairs`; absent while no
//!   pair was held out (a 0 would read as a perfect predictor).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use muxflow::records::metrics::Exposition;
use tokio::sync::{watch, Semaphore};

use crate::predict::Evaluation;
use crate::round::{Action, Plan, Summary};

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
    /// Unix time the last successful round ended.
    last_success_s: Option<f64>,
    last: Option<Summary>,
    /// The last round's jobs left waiting.
    last_parked: usize,
    evaluation: Option<Evaluation>,
    /// The Slurm release the build is for (`build_info`'s `slurm` label).
    slurm_release: String,
}

impl MatcherMetrics {
    /// Metrics of a matcher built for Slurm `slurm_release` (`22.05.8`; the
    /// daemon passes `muxflow_slurm::version::version_string()`, which this
    /// module cannot call: it builds without the Slurm client too).
    pub fn new(slurm_release: impl Into<String>) -> MatcherMetrics {
        MatcherMetrics {
            slurm_release: slurm_release.into(),
            ..MatcherMetrics::default()
        }
    }

    /// A round that produced `plan` in `seconds`, ending at Unix time `now_s`.
    pub fn round_done(&mut self, plan: &Plan, seconds: f64, now_s: f64) {
        self.rounds += 1;
        // `summary.placed` also counts jobs kept where an earlier round put
        // them: counted here, a job would add one per round it waits to start.
        self.placements += plan
            .decisions
            .iter()
            .filter(|d| d.action == Action::Place)
            .count() as u64;
        self.seconds_total += seconds;
        self.last_seconds = Some(seconds);
        self.last_success_s = Some(now_s);
        self.last = Some(plan.summary.clone());
        self.last_parked = plan.parked().count();
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
        e.gauge(
            "muxflow_matcher_build_info",
            "Always 1: the matcher's version and the Slurm release it was built for.",
        )
        .sample(
            &[
                ("version", env!("CARGO_PKG_VERSION").into()),
                ("slurm", self.slurm_release.clone()),
            ],
            1.0,
        );
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
        if let Some(t) = self.last_success_s {
            e.gauge(
                "muxflow_matcher_last_success_timestamp_seconds",
                "Unix time the last successful round ended; alert when it falls behind (offline jobs stay held without rounds).",
            )
            .sample(&[], t);
        }
        e.counter(
            "muxflow_matcher_placements_total",
            "Offline jobs placed on a GPU (a job kept where it was placed counts once).",
        )
        .sample(&[], self.placements as f64);
        if let Some(s) = &self.last {
            let jobs = e.gauge(
                "muxflow_matcher_offline_jobs",
                "Offline jobs in the last round: pending (held, waiting for a GPU), placed (by it, or kept where placed) and parked (left waiting by it).",
            );
            jobs.sample(&[("state", "pending".into())], s.pending_offline as f64);
            jobs.sample(&[("state", "placed".into())], s.placed as f64);
            jobs.sample(&[("state", "parked".into())], self.last_parked as f64);
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
            // No held-out pair: nothing was measured, and the evaluation's
            // 0 would read as a perfect predictor.
            if ev.test_pairs > 0 {
                e.gauge(
                    "muxflow_matcher_predictor_mae_ratio",
                    "Mean absolute error of the predicted normalized throughput on held-out pairs of finished jobs.",
                )
                .sample(&[], ev.model_mae);
            }
            e.gauge(
                "muxflow_matcher_predictor_test_pairs",
                "Held-out pairs the predictor error is measured on.",
            )
            .sample(&[], ev.test_pairs as f64);
        }
        e
    }
}

/// Most connections the endpoint serves at once; one more is answered
/// `503` without waiting for its request, and closed. Prometheus keeps one
/// connection per target.
pub const MAX_CONNECTIONS: usize = 32;
/// Largest request head (request line and headers) read from a client; a
/// longer one is answered `431` and the connection closed. A scrape's head
/// is under 1 KiB. hyper's read buffer limit (8 KiB at least), which also
/// bounds what a pipelining client makes the server hold.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Longest wait for a whole request head, from the connect and between two
/// requests on a kept-alive connection; then the connection is closed.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection stays open: then the response under way is
/// finished and the connection closed...
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// ...or closed this long after, finished or not (a client that does not
/// read its responses).
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// What a connection beyond [`MAX_CONNECTIONS`] is told.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {why} (check [metrics] listen)")]
pub struct ServeError {
    pub addr: SocketAddr,
    pub why: String,
}

/// The running endpoint: what it serves is replaced by [`Endpoint::publish`].
#[derive(Debug)]
pub struct Endpoint {
    text: watch::Sender<Bytes>,
    addr: SocketAddr,
}

impl Endpoint {
    /// Serves `text` from now on; never waits for the server (a watch
    /// channel: connections clone the latest text, no lock is held over
    /// I/O).
    pub fn publish(&self, text: String) {
        self.text.send_replace(Bytes::from(text));
    }

    /// The address bound (the port chosen, where `addr` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Serves the latest exposition on `addr` (`GET /metrics`) with hyper's
/// HTTP/1 server on a one-thread tokio runtime in its own thread, within
/// [`MAX_CONNECTIONS`], [`MAX_HEAD_BYTES`], [`HEAD_TIMEOUT`] and
/// [`CONNECTION_LIFETIME`]: no client makes it hold more than those, start
/// a thread, or wait on the matcher's rounds. Binds before returning, so a
/// taken or foreign address is an error here.
pub fn serve(addr: SocketAddr) -> Result<Endpoint, ServeError> {
    let fail = |e: std::io::Error| ServeError {
        addr,
        why: e.to_string(),
    };
    let listener = std::net::TcpListener::bind(addr).map_err(fail)?;
    let bound = listener.local_addr().map_err(fail)?;
    listener.set_nonblocking(true).map_err(fail)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(fail)?;
    let listener = {
        let _in_runtime = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(fail)?
    };
    let (sender, text) = watch::channel(Bytes::new());
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept(listener, text)))
        .map_err(fail)?;
    Ok(Endpoint {
        text: sender,
        addr: bound,
    })
}

/// Accepts forever: each connection a task while a slot is free.
async fn accept(listener: tokio::net::TcpListener, text: watch::Receiver<Bytes>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // Refusals are logged at most once a minute, so a flood of connects
    // does not become a flood of log lines.
    let mut refused = 0u64;
    let mut last_warned: Option<Instant> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: try again shortly rather than spin.
                tracing::warn!("metrics endpoint cannot accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Never waits on this client: what its socket takes now, then closed.
            let _ = stream.try_write(BUSY);
            refused += 1;
            if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(
                    "metrics endpoint: {refused} connection(s) refused with {MAX_CONNECTIONS} open"
                );
                refused = 0;
                last_warned = Some(Instant::now());
            }
            continue;
        };
        let text = text.clone();
        tokio::spawn(async move {
            connection(stream, text).await;
            drop(slot);
        });
    }
}

/// One client's connection, within the limits above.
async fn connection(stream: tokio::net::TcpStream, text: watch::Receiver<Bytes>) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let service =
        service_fn(move |request| std::future::ready(Ok::<_, Infallible>(answer(&request, &text))));
    let conn = http.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let result = match tokio::time::timeout(CONNECTION_LIFETIME, conn.as_mut()).await {
        Ok(result) => result,
        Err(_) => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(CLOSE_GRACE, conn).await {
                Ok(result) => result,
                // Dropped: closed.
                Err(_) => return,
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!("metrics connection: {e}");
    }
}

/// `GET` or `HEAD /metrics`: the latest exposition; anything else says where
/// to look.
fn answer<B>(request: &Request<B>, text: &watch::Receiver<Bytes>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        r
    };
    if request.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            Bytes::from_static(b"muxflow-matcher: see /metrics\n"),
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            Bytes::from_static(b"muxflow-matcher: GET /metrics\n"),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = reply(StatusCode::OK, text.borrow().clone());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn rounds_and_failures_add_up_and_the_endpoint_serves_them() {
        let mut m = MatcherMetrics::new("22.05.8");
        let plan = Plan {
            summary: Summary {
                pending_offline: 5,
                online_gpus: 8,
                open_gpus: 3,
                placed: 2,
                predicted_total: 1.5,
                full_graph: true,
                ..Summary::default()
            },
            decisions: vec![
                decision(1, Action::Place),
                decision(2, Action::Keep),
                decision(3, Action::Park),
                decision(4, Action::None),
                decision(5, Action::None),
            ],
            notes: vec![],
        };
        let before = m.exposition().render();
        assert!(
            !before.contains("last_success_timestamp"),
            "no round yet: {before}"
        );
        m.round_done(&plan, 0.25, 1_795_000_000.5);
        m.round_failed(0.5);
        let text = m.exposition().render();
        assert!(text.contains("muxflow_matcher_rounds_total 2\n"), "{text}");
        assert!(text.contains("muxflow_matcher_round_failures_total 1\n"));
        // The kept job was placed by an earlier round: one new placement.
        assert!(
            text.contains("muxflow_matcher_placements_total 1\n"),
            "{text}"
        );
        assert!(text.contains("muxflow_matcher_offline_jobs{state=\"pending\"} 5\n"));
        assert!(text.contains("muxflow_matcher_offline_jobs{state=\"placed\"} 2\n"));
        assert!(
            text.contains("muxflow_matcher_offline_jobs{state=\"parked\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("muxflow_matcher_round_duration_seconds 0.5\n"));
        assert!(text.contains("muxflow_matcher_round_exact_over_every_pair 1\n"));
        // A failed round leaves the last success where it was.
        assert!(
            text.contains("muxflow_matcher_last_success_timestamp_seconds 1795000000.5\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "muxflow_matcher_build_info{{version=\"{}\",slurm=\"22.05.8\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );

        let endpoint = serve("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.publish(text.clone());
        let addr = endpoint.local_addr();
        let ask = |request: &str| {
            let mut conn = std::net::TcpStream::connect(addr).unwrap();
            conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))
                .unwrap();
            conn.write_all(request.as_bytes()).unwrap();
            let mut got = String::new();
            conn.read_to_string(&mut got).unwrap();
            got
        };
        let got = ask("GET /metrics HTTP/1.0\r\n\r\n");
        assert!(got.starts_with("HTTP/1.0 200"), "{got}");
        assert!(got.contains("version=0.0.4"), "{got}");
        assert!(got.ends_with(&text), "{got}");
        let got = ask("GET / HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n");
        assert!(got.starts_with("HTTP/1.1 404"), "{got}");
        let got = ask("POST /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n");
        assert!(got.starts_with("HTTP/1.1 405"), "{got}");
        // What is published next is served next.
        endpoint.publish("muxflow_matcher_rounds_total 3\n".into());
        let got = ask("GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n");
        assert!(
            got.ends_with("\r\n\r\nmuxflow_matcher_rounds_total 3\n"),
            "{got}"
        );
        // A head over the limit is refused: 431, or the connection closed
        // before the client reads it; never served.
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let head = format!(
            "GET /metrics HTTP/1.1\r\nX-Big: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        let _ = conn.write_all(head.as_bytes());
        let mut got = Vec::new();
        let _ = conn.read_to_end(&mut got);
        let got = String::from_utf8_lossy(&got);
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 431"), "{got}");
        let e = serve(addr).unwrap_err();
        assert!(e.to_string().contains("[metrics] listen"), "{e}");
    }

    fn decision(job: u32, action: Action) -> crate::round::Decision {
        crate::round::Decision {
            job,
            name: format!("j{job}"),
            user: "u".into(),
            action,
            node: None,
            gpu: None,
            gpus: vec![],
            slots: vec![],
            predicted: None,
            confidence: None,
            reason: String::new(),
            waiting: None,
            update: None,
        }
    }

    #[test]
    fn the_predictor_error_is_absent_until_a_pair_was_held_out() {
        let evaluation = |test_pairs, model_mae| Evaluation {
            records: 4,
            train_pairs: 3,
            test_pairs,
            default_mae: 0.0,
            rowcol_mae: 0.0,
            model_mae,
            default_pairing: 0.0,
            rowcol_pairing: 0.0,
            model_pairing: 0.0,
            model_sd: 0.0,
        };
        let mut m = MatcherMetrics::new("22.05.8");
        m.evaluated(evaluation(0, 0.0));
        let text = m.exposition().render();
        assert!(
            !text.contains("muxflow_matcher_predictor_mae_ratio"),
            "{text}"
        );
        assert!(
            text.contains("muxflow_matcher_predictor_test_pairs 0\n"),
            "{text}"
        );
        m.evaluated(evaluation(7, 0.125));
        let text = m.exposition().render();
        assert!(
            text.contains("muxflow_matcher_predictor_mae_ratio 0.125\n"),
            "{text}"
        );
    }

    /// Every series etc/prometheus/muxflow-alerts.yml names is one muxflow
    /// exports, and promtool (where installed) accepts the file.
    #[test]
    fn the_example_alert_rules_name_exported_series() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let rules = root.join("etc/prometheus/muxflow-alerts.yml");
        let text = std::fs::read_to_string(&rules).unwrap();
        let mut exported = String::new();
        for source in ["matcher/src/metrics.rs", "node/src/metrics.rs"] {
            exported += &std::fs::read_to_string(root.join(source)).unwrap();
        }
        let names: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("muxflow_"))
            .collect();
        assert!(names.len() >= 4, "{names:?}");
        for name in names {
            assert!(
                exported.contains(&format!("\"{name}\"")),
                "{name}: named in {} but exported by no muxflow program",
                rules.display()
            );
        }
        match std::process::Command::new("promtool")
            .args(["check", "rules"])
            .arg(&rules)
            .output()
        {
            Ok(out) => assert!(
                out.status.success(),
                "promtool check rules: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            // Not installed: the names above are what can be checked.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("promtool: {e}"),
        }
    }

    #[test]
    fn a_connection_beyond_the_limit_is_refused_not_served() {
        let endpoint = serve("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.publish("x 1\n".into());
        let addr = endpoint.local_addr();
        let request = b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";
        let ask = || {
            let mut conn = std::net::TcpStream::connect(addr).unwrap();
            conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))
                .unwrap();
            let _ = conn.write_all(request);
            let mut got = Vec::new();
            let _ = conn.read_to_end(&mut got);
            String::from_utf8_lossy(&got).into_owned()
        };
        // Every slot taken by a client that says nothing (accepted in
        // connect order, so before the next one).
        let quiet: Vec<_> = (0..MAX_CONNECTIONS)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let got = ask();
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 503"), "{got}");
        // A slot given back is taken by the next client.
        drop(quiet);
        let start = std::time::Instant::now();
        while !ask().starts_with("HTTP/1.1 200") {
            assert!(start.elapsed() < std::time::Duration::from_secs(60));
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
