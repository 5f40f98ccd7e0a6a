//! The load generator: open-loop constant rate (wrk2 semantics, latency from the scheduled send
//! time), closed-loop maximum throughput, keep-alive or one connection per request, over plain
//! TCP or TLS, counting wrk2's error classes and what really happened to each request.
//!
//! It runs on the caller's tokio runtime: one task per connection, so N connections over the
//! runtime's M worker threads.

pub mod attack;
pub mod cert_attack;
pub mod conn;
pub mod h2load;
pub mod http1;
pub mod record;
mod worker;
pub mod wrk;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use conn::{Connector, TlsSpec, TlsVersion, Verify};
pub use record::{Counts, Live, Seen, WrkErrors};
pub use worker::TIMER_SLOP;

/// Below this fraction of the requested rate the run is flagged: the generator (or the machine)
/// was the bottleneck, not only the target.
pub const RATE_KEPT_FRACTION: f64 = 0.97;
/// Generator wake-up lag (p99) above which the run is flagged.
pub const MAX_LAG_P99_MS: f64 = 10.0;

/// Open or closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Constant rate (requests per second over all connections).
    Open {
        /// Requests per second.
        rate: f64,
    },
    /// As fast as responses come back.
    Closed,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Where to connect (round robin over connections).
    pub addrs: Vec<SocketAddr>,
    /// `Host` header.
    pub host: String,
    /// Request path (with query).
    pub path: String,
    /// TLS, if any.
    pub tls: Option<TlsSpec>,
    /// Open or closed loop.
    pub mode: Mode,
    /// Connections.
    pub connections: usize,
    /// Measured duration.
    pub duration: Duration,
    /// Connect (with handshake) and response timeout.
    pub timeout: Duration,
    /// Keep-alive (`false`: one request per connection with `Connection: close`).
    pub keep_alive: bool,
}

impl LoadSpec {
    /// Closed-loop plain-HTTP requests for `/`, with no target yet (the caller sets `addrs`,
    /// `host` and `tls` per peer).
    pub fn closed(
        connections: usize,
        duration: Duration,
        timeout: Duration,
        keep_alive: bool,
    ) -> Self {
        Self {
            addrs: Vec::new(),
            host: String::new(),
            path: "/".into(),
            tls: None,
            mode: Mode::Closed,
            connections,
            duration,
            timeout,
            keep_alive,
        }
    }
}

/// Optional hooks into a run.
#[derive(Debug, Default)]
pub struct Hooks {
    /// Receives the instant the measured run starts (after connections are opened).
    pub started: Option<oneshot::Sender<Instant>>,
    /// Live counters for a progress display.
    pub live: Arc<Live>,
    /// Width of one timeline entry (default one second). A run of an hour (the soak) records
    /// per minute: a latency histogram per second for an hour would take hundreds of MB.
    pub bucket: Option<Duration>,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Bad parameters.
    #[error("invalid load: {0}")]
    Invalid(String),
    /// TLS configuration failed.
    #[error(transparent)]
    Tls(#[from] conn::TlsConfigError),
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th.
    pub p90: f64,
    /// 99th.
    pub p99: f64,
    /// 99.9th.
    pub p99_9: f64,
    /// 99.99th.
    pub p99_99: f64,
    /// 99.999th.
    pub p99_999: f64,
    /// 99.9999th.
    pub p99_9999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// Per-request truth: what happened to the requests that did not get a 2xx.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Truth {
    /// Connect refused.
    pub connect_refused: u64,
    /// Connect (or TLS handshake) timed out.
    pub connect_timeout: u64,
    /// Other connect errors.
    pub connect_other: u64,
    /// TLS handshake failed.
    pub handshake_failed: u64,
    /// Writing the request failed on a new connection.
    pub write_failed: u64,
    /// Connection closed or reset after the request was sent, before a complete response.
    pub failed_after_send: u64,
    /// Of those: no response byte on a reused keep-alive connection (what browsers retry).
    pub failed_after_send_retryable: u64,
    /// No complete response within the timeout.
    pub response_timeout: u64,
    /// Malformed response.
    pub protocol_error: u64,
    /// 5xx responses.
    pub status_5xx: u64,
    /// Other non-2xx responses.
    pub status_other_non2xx: u64,
}

/// The failure causes as every report groups them into columns (the markdown report, the
/// `load` command's summary): connect errors other than refusals count as connect timeouts'
/// column, write failures as failed after send, malformed answers as other non-2xx.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Causes {
    /// Connect refused.
    pub refused: u64,
    /// Connect timed out, or failed otherwise.
    pub connect_timeout: u64,
    /// TLS handshake failed.
    pub handshake: u64,
    /// Closed or failed after the request was (being) sent.
    pub failed_after_send: u64,
    /// Of those, what a browser would retry (no response byte on a reused connection).
    pub retryable: u64,
    /// No complete response within the timeout.
    pub response_timeout: u64,
    /// 5xx responses.
    pub status_5xx: u64,
    /// Other non-2xx responses and malformed ones.
    pub other_non2xx: u64,
}

impl Truth {
    /// This truth in the reports' columns.
    pub fn causes(&self) -> Causes {
        Causes {
            refused: self.connect_refused,
            connect_timeout: self.connect_timeout + self.connect_other,
            handshake: self.handshake_failed,
            failed_after_send: self.failed_after_send + self.write_failed,
            retryable: self.failed_after_send_retryable,
            response_timeout: self.response_timeout,
            status_5xx: self.status_5xx,
            other_non2xx: self.status_other_non2xx + self.protocol_error,
        }
    }
}

impl From<&Counts> for Truth {
    fn from(c: &Counts) -> Self {
        Self {
            connect_refused: c.connect_refused,
            connect_timeout: c.connect_timeout,
            connect_other: c.connect_other,
            handshake_failed: c.handshake_failed,
            write_failed: c.write_failed,
            failed_after_send: c.closed_after_send,
            failed_after_send_retryable: c.closed_after_send_retryable,
            response_timeout: c.response_timeout,
            protocol_error: c.protocol_error,
            status_5xx: c.status_5xx,
            status_other_non2xx: c.status_other,
        }
    }
}

/// One second of the run (one bucket, where [`Hooks::bucket`] is wider).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SecondStats {
    /// Seconds (buckets) from the start.
    pub t: u32,
    /// Requests finished (responses and failures).
    pub requests: u64,
    /// Failed requests.
    pub failed: u64,
    /// Idle connections closed by the server.
    pub idle_closed: u64,
    /// wrk2 classes.
    pub errors: WrkErrors,
    /// p99 latency of the responses in this second (ms).
    pub p99_ms: f64,
}

/// The result of a run; also what `sluice-bench load --json` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    /// `open-loop` or `closed-loop`.
    pub mode: String,
    /// Requested rate (open loop).
    pub requested_rps: Option<f64>,
    /// Requests (responses and failures) per second of the measured duration.
    pub achieved_rps: f64,
    /// Measured duration (s).
    pub duration_s: f64,
    /// Connections.
    pub connections: usize,
    /// Keep-alive or a connection per request.
    pub keep_alive: bool,
    /// Requests attempted (responses and failures).
    pub requests: u64,
    /// Complete responses.
    pub responses: u64,
    /// Requests without a 2xx response.
    pub requests_failed: u64,
    /// Keep-alive connections found closed by the server before a request was written on
    /// them (not failed requests).
    pub idle_closed_by_server: u64,
    /// Scheduled requests never sent (the run ended while the connection was still behind).
    pub missed: u64,
    /// wrk2's error classes.
    pub errors: WrkErrors,
    /// Per-request truth.
    pub truth: Truth,
    /// Responses by status.
    pub status: BTreeMap<u16, u64>,
    /// Latency percentiles (ms).
    pub latency_ms: Percentiles,
    /// `[percentile, ms]` points for the latency-by-percentile plot.
    pub latency_curve: Vec<[f64; 2]>,
    /// Bytes received.
    pub bytes_received: u64,
    /// The requested rate was kept.
    pub rate_kept: bool,
    /// Why the run was flagged, if it was.
    pub rate_note: Option<String>,
    /// p99 of how late idle connections woke for their scheduled send (ms): the generator's lag.
    pub generator_lag_p99_ms: f64,
    /// Per-second timeline.
    pub timeline: Vec<SecondStats>,
    /// Backends seen in `x-backend`: first/last response (s from start) and count.
    pub backends_seen: BTreeMap<String, Seen>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn percentiles(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
    if h.is_empty() {
        return Percentiles::default();
    }
    let q = |q: f64| ms(h.value_at_quantile(q));
    Percentiles {
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
        p99_9: q(0.999),
        p99_99: q(0.9999),
        p99_999: q(0.99999),
        p99_9999: q(0.999999),
        max: ms(h.max()),
        mean: h.mean() / 1000.0,
    }
}

fn curve(h: &hdrhistogram::Histogram<u64>) -> Vec<[f64; 2]> {
    if h.is_empty() {
        return Vec::new();
    }
    (0..=120)
        .map(|i| {
            let q = 1.0 - 10f64.powf(-f64::from(i) / 20.0);
            [q * 100.0, ms(h.value_at_quantile(q))]
        })
        .collect()
}

/// Runs the load and returns its report.
pub async fn run(spec: &LoadSpec, hooks: Hooks) -> Result<LoadReport, LoadError> {
    if spec.connections == 0 || spec.addrs.is_empty() || spec.duration.is_zero() {
        return Err(LoadError::Invalid(
            "connections, addresses and duration must be non-zero".into(),
        ));
    }
    if let Mode::Open { rate } = spec.mode
        && (!rate.is_finite() || rate <= 0.0)
    {
        return Err(LoadError::Invalid(format!(
            "rate must be positive, got {rate}"
        )));
    }
    let shared = Arc::new(worker::Shared {
        connector: conn::Connector::new(spec.addrs.clone(), spec.tls.as_ref())?,
        request: http1::build_request(&spec.host, &spec.path, !spec.keep_alive),
        timeout: spec.timeout,
        keep_alive: spec.keep_alive,
    });
    let (go_tx, go_rx) = watch::channel(None::<(worker::Window, Arc<record::Recorder>)>);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(spec.connections);
    let pre_deadline = Instant::now() + spec.timeout.max(Duration::from_secs(10));
    let mut tasks = JoinSet::new();
    for id in 0..spec.connections {
        let (shared, mut go, ready) = (Arc::clone(&shared), go_rx.clone(), ready_tx.clone());
        let mode = spec.mode;
        let n = spec.connections as f64;
        tasks.spawn(async move {
            let stream = if shared.keep_alive {
                worker::preconnect(&shared, pre_deadline).await
            } else {
                None
            };
            let _ = ready.send(()).await;
            let go = go
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|v| v.clone());
            let Some((w, rec)) = go else { return 0 };
            match mode {
                Mode::Open { rate } => {
                    let (offset, period) = (id as f64 / rate, n / rate);
                    worker::open_loop(id, shared, rec, w, offset, period, stream).await
                }
                Mode::Closed => worker::closed_loop(id, shared, rec, w, stream).await,
            }
        });
    }
    drop(ready_tx);
    for _ in 0..spec.connections {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let t0 = Instant::now() + Duration::from_millis(20);
    let window = worker::Window {
        t0,
        end: t0 + spec.duration,
        hard_stop: t0 + spec.duration + spec.timeout,
    };
    let shards = (spec.connections / 8).clamp(1, 64);
    let bucket = hooks.bucket.unwrap_or(Duration::from_secs(1));
    let rec =
        Arc::new(record::Recorder::new(t0, shards, Arc::clone(&hooks.live)).with_bucket(bucket));
    let _ = go_tx.send(Some((window, Arc::clone(&rec))));
    if let Some(tx) = hooks.started {
        let _ = tx.send(t0);
    }
    let mut missed = 0;
    while let Some(r) = tasks.join_next().await {
        missed += r.unwrap_or(0);
    }
    Ok(summarize(spec, &rec.merge(), missed))
}

fn summarize(spec: &LoadSpec, m: &record::Merged, missed: u64) -> LoadReport {
    let c = &m.counts;
    let duration_s = spec.duration.as_secs_f64();
    let achieved = c.attempts() as f64 / duration_s;
    let lag_p99 = if m.lag.is_empty() {
        0.0
    } else {
        ms(m.lag.value_at_quantile(0.99))
    };
    let (requested, rate_note) = match spec.mode {
        Mode::Open { rate } => {
            let mut notes = Vec::new();
            if achieved < RATE_KEPT_FRACTION * rate {
                notes.push(format!(
                    "achieved {achieved:.0} req/s, below {:.0}% of the requested {rate:.0}",
                    RATE_KEPT_FRACTION * 100.0
                ));
            }
            if lag_p99 > MAX_LAG_P99_MS {
                notes.push(format!(
                    "the load generator woke up late (p99 {lag_p99:.1} ms): it was short of CPU"
                ));
            }
            if missed > 0 {
                notes.push(format!("{missed} scheduled requests were never sent"));
            }
            let note = (!notes.is_empty()).then(|| notes.join("; "));
            (Some(rate), note)
        }
        Mode::Closed => (None, None),
    };
    let timeline = m
        .seconds
        .iter()
        .enumerate()
        .map(|(i, (sc, h))| SecondStats {
            t: u32::try_from(i).unwrap_or(u32::MAX),
            requests: sc.attempts(),
            failed: sc.failed(),
            idle_closed: sc.idle_closed,
            errors: sc.wrk(),
            p99_ms: if h.is_empty() {
                0.0
            } else {
                ms(h.value_at_quantile(0.99))
            },
        })
        .collect();
    LoadReport {
        mode: match spec.mode {
            Mode::Open { .. } => "open-loop".into(),
            Mode::Closed => "closed-loop".into(),
        },
        requested_rps: requested,
        achieved_rps: achieved,
        duration_s,
        connections: spec.connections,
        keep_alive: spec.keep_alive,
        requests: c.attempts(),
        responses: c.responses,
        requests_failed: c.failed(),
        idle_closed_by_server: c.idle_closed,
        missed,
        errors: c.wrk(),
        truth: Truth::from(c),
        status: m.statuses.clone(),
        latency_ms: percentiles(&m.hist),
        latency_curve: curve(&m.hist),
        bytes_received: c.bytes,
        rate_kept: rate_note.is_none(),
        rate_note,
        generator_lag_p99_ms: lag_p99,
        timeline,
        backends_seen: m.backends.clone(),
    }
}

/// One request on a new connection (`Connection: close`): readiness checks and probes.
pub async fn probe(
    addr: SocketAddr,
    host: &str,
    path: &str,
    tls: Option<&TlsSpec>,
    timeout: Duration,
) -> Result<http1::Response, String> {
    let c = conn::Connector::new(vec![addr], tls).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    let mut s = c.connect(deadline).await.map_err(|e| e.to_string())?;
    let req = http1::build_request(host, path, true);
    let mut buf = bytes::BytesMut::new();
    tokio::time::timeout_at(deadline, http1::exchange(&mut s, &mut buf, &req))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())
}
