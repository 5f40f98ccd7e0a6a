//! Recording outcomes: counters by class, HDR latency histograms, a per-second timeline and the
//! backends seen, sharded so that connection tasks on different threads rarely share a lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::http1::BackendTag;

/// Highest latency recorded (µs): one hour.
const MAX_US: u64 = 3_600_000_000;

/// Why a scheduled request did not get a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    /// Connect refused (RST).
    ConnectRefused,
    /// Connect (or TLS handshake) timed out.
    ConnectTimeout,
    /// Another connect error.
    ConnectOther,
    /// The TLS handshake failed.
    Handshake,
    /// Writing the request failed.
    Write,
    /// The connection closed (EOF/reset) after the request was written, before the response was
    /// complete. `retryable`: not a single response byte on a reused connection, which browsers
    /// and most HTTP clients retry silently for idempotent requests.
    ClosedAfterSend {
        /// No response byte arrived on a reused keep-alive connection.
        retryable: bool,
    },
    /// No complete response within the timeout.
    ResponseTimeout,
    /// The response could not be parsed.
    Protocol,
}

/// What happened to one scheduled request (or one idle connection).
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// A complete response.
    Response {
        /// Status code.
        status: u16,
        /// From the scheduled send time (open loop) or the send (closed loop) to the last byte.
        latency: Duration,
        /// Bytes received.
        bytes: u64,
        /// `x-backend` of the response.
        backend: BackendTag,
    },
    /// The request failed.
    Failed(Fail),
    /// A keep-alive connection was found closed by the server while idle, before a request was
    /// written on it. Not a failed request: the request goes out on a new connection.
    IdleClosed {
        /// Found by a failed write (wrk counts it as a write error) rather than by reading EOF
        /// (wrk: read error).
        on_write: bool,
    },
}

/// Counters for one period or the whole run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    /// Complete responses (any status).
    pub responses: u64,
    /// 2xx responses.
    pub ok: u64,
    /// 5xx responses.
    pub status_5xx: u64,
    /// Other non-2xx responses.
    pub status_other: u64,
    /// Idle keep-alive connections found closed by the server.
    pub idle_closed: u64,
    /// Of those, found by a failed write.
    pub idle_closed_on_write: u64,
    /// Connect refused.
    pub connect_refused: u64,
    /// Connect or handshake timed out.
    pub connect_timeout: u64,
    /// Other connect errors.
    pub connect_other: u64,
    /// TLS handshake failures.
    pub handshake_failed: u64,
    /// Request write failures.
    pub write_failed: u64,
    /// Closed after the request was sent.
    pub closed_after_send: u64,
    /// Of those, closed before any response byte on a reused connection.
    pub closed_after_send_retryable: u64,
    /// Response timeouts.
    pub response_timeout: u64,
    /// Malformed responses.
    pub protocol_error: u64,
    /// Bytes received.
    pub bytes: u64,
}

impl Counts {
    fn add_outcome(&mut self, o: &Outcome) {
        match *o {
            Outcome::Response { status, bytes, .. } => {
                self.responses += 1;
                self.bytes += bytes;
                match status {
                    200..=299 => self.ok += 1,
                    500..=599 => self.status_5xx += 1,
                    _ => self.status_other += 1,
                }
            }
            Outcome::IdleClosed { on_write } => {
                self.idle_closed += 1;
                self.idle_closed_on_write += u64::from(on_write);
            }
            Outcome::Failed(f) => match f {
                Fail::ConnectRefused => self.connect_refused += 1,
                Fail::ConnectTimeout => self.connect_timeout += 1,
                Fail::ConnectOther => self.connect_other += 1,
                Fail::Handshake => self.handshake_failed += 1,
                Fail::Write => self.write_failed += 1,
                Fail::ClosedAfterSend { retryable } => {
                    self.closed_after_send += 1;
                    self.closed_after_send_retryable += u64::from(retryable);
                }
                Fail::ResponseTimeout => self.response_timeout += 1,
                Fail::Protocol => self.protocol_error += 1,
            },
        }
    }

    fn merge(&mut self, o: &Counts) {
        self.responses += o.responses;
        self.ok += o.ok;
        self.status_5xx += o.status_5xx;
        self.status_other += o.status_other;
        self.idle_closed += o.idle_closed;
        self.idle_closed_on_write += o.idle_closed_on_write;
        self.connect_refused += o.connect_refused;
        self.connect_timeout += o.connect_timeout;
        self.connect_other += o.connect_other;
        self.handshake_failed += o.handshake_failed;
        self.write_failed += o.write_failed;
        self.closed_after_send += o.closed_after_send;
        self.closed_after_send_retryable += o.closed_after_send_retryable;
        self.response_timeout += o.response_timeout;
        self.protocol_error += o.protocol_error;
        self.bytes += o.bytes;
    }

    /// Requests that failed without a response.
    pub fn no_response(&self) -> u64 {
        self.connect_refused
            + self.connect_timeout
            + self.connect_other
            + self.handshake_failed
            + self.write_failed
            + self.closed_after_send
            + self.response_timeout
            + self.protocol_error
    }

    /// Requests that did not end in a 2xx response.
    pub fn failed(&self) -> u64 {
        self.no_response() + self.status_5xx + self.status_other
    }

    /// Requests attempted (responses and failures; idle closes are not requests).
    pub fn attempts(&self) -> u64 {
        self.responses + self.no_response()
    }

    /// wrk2's error classes.
    pub fn wrk(&self) -> WrkErrors {
        WrkErrors {
            connect: self.connect_refused
                + self.connect_timeout
                + self.connect_other
                + self.handshake_failed,
            read: self.closed_after_send
                + (self.idle_closed - self.idle_closed_on_write)
                + self.protocol_error,
            write: self.write_failed + self.idle_closed_on_write,
            timeout: self.response_timeout,
            status_non2xx: self.status_5xx + self.status_other,
        }
    }
}

/// Errors in wrk2's classes: what wrk2 would have printed for the same run. wrk2 counts a
/// keep-alive connection closed by the server as a read error even when no request was lost,
/// and a TLS handshake failure as a connect error.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WrkErrors {
    /// Connect errors, TLS handshake failures included.
    pub connect: u64,
    /// Connection closed or reset (idle or mid-request) and malformed responses.
    pub read: u64,
    /// Write errors.
    pub write: u64,
    /// Response timeouts.
    pub timeout: u64,
    /// Responses with a status outside 2xx.
    pub status_non2xx: u64,
}

impl WrkErrors {
    /// All classes added up.
    pub fn total(&self) -> u64 {
        self.connect + self.read + self.write + self.timeout + self.status_non2xx
    }
}

/// First and last time (seconds from the start) a backend answered, and how often.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Seen {
    /// First response, seconds from the start.
    pub first_s: f64,
    /// Last response, seconds from the start.
    pub last_s: f64,
    /// Responses.
    pub count: u64,
}

#[derive(Debug)]
struct Second {
    counts: Counts,
    hist: Histogram<u32>,
}

#[derive(Debug)]
struct Shard {
    counts: Counts,
    hist: Histogram<u64>,
    lag: Histogram<u64>,
    seconds: Vec<Second>,
    statuses: BTreeMap<u16, u64>,
    backends: HashMap<BackendTag, Seen>,
}

/// A histogram from 1 to `max`. Only called with constant bounds that hdrhistogram accepts.
#[allow(clippy::expect_used)]
fn hist<T: hdrhistogram::Counter>(max: u64, sigfig: u8) -> Histogram<T> {
    Histogram::new_with_bounds(1, max, sigfig).expect("constant histogram bounds are valid")
}

impl Shard {
    fn new() -> Self {
        Self {
            counts: Counts::default(),
            hist: hist(MAX_US, 3),
            lag: hist(60_000_000, 2),
            seconds: Vec::new(),
            statuses: BTreeMap::new(),
            backends: HashMap::new(),
        }
    }

    fn second(&mut self, i: usize) -> &mut Second {
        while self.seconds.len() <= i {
            self.seconds.push(Second {
                counts: Counts::default(),
                hist: hist(MAX_US, 2),
            });
        }
        &mut self.seconds[i]
    }
}

/// Counters readable while the run goes on (the progress bar).
#[derive(Debug, Default)]
pub struct Live {
    /// Complete responses.
    pub responses: AtomicU64,
    /// Failed requests (no 2xx).
    pub failed: AtomicU64,
    /// Idle connections closed by the server.
    pub idle_closed: AtomicU64,
}

/// Where connection tasks record outcomes.
#[derive(Debug)]
pub struct Recorder {
    t0: Instant,
    bucket_ms: u128,
    shards: Vec<Mutex<Shard>>,
    /// Live counters.
    pub live: Arc<Live>,
}

/// Everything recorded, merged.
#[derive(Debug)]
pub struct Merged {
    /// Totals.
    pub counts: Counts,
    /// Latency (µs).
    pub hist: Histogram<u64>,
    /// Generator wake-up lag (µs).
    pub lag: Histogram<u64>,
    /// Per second: counts and latency.
    pub seconds: Vec<(Counts, Histogram<u32>)>,
    /// Non-2xx statuses and their counts (2xx too).
    pub statuses: BTreeMap<u16, u64>,
    /// Backends seen.
    pub backends: BTreeMap<String, Seen>,
}

impl Recorder {
    /// A recorder whose timeline starts at `t0`.
    pub fn new(t0: Instant, shards: usize, live: Arc<Live>) -> Self {
        Self {
            t0,
            bucket_ms: 1000,
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(Shard::new()))
                .collect(),
            live,
        }
    }

    /// The timeline in buckets of `width` (at least a millisecond) instead of seconds.
    #[must_use]
    pub fn with_bucket(mut self, width: Duration) -> Self {
        self.bucket_ms = width.as_millis().max(1);
        self
    }

    /// Records one outcome from connection `conn`, known at `now`.
    pub fn record(&self, conn: usize, now: Instant, o: Outcome) {
        match o {
            Outcome::Response { status, .. } => {
                self.live.responses.fetch_add(1, Ordering::Relaxed);
                if !(200..300).contains(&status) {
                    self.live.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Outcome::Failed(_) => {
                self.live.failed.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::IdleClosed { .. } => {
                self.live.idle_closed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let since = now.saturating_duration_since(self.t0);
        let sec = usize::try_from(since.as_millis() / self.bucket_ms)
            .unwrap_or(usize::MAX)
            .min(100_000);
        let mut s = self.shards[conn % self.shards.len()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        s.counts.add_outcome(&o);
        let second = s.second(sec);
        second.counts.add_outcome(&o);
        if let Outcome::Response {
            status,
            latency,
            backend,
            ..
        } = o
        {
            let us = u64::try_from(latency.as_micros())
                .unwrap_or(MAX_US)
                .clamp(1, MAX_US);
            second.hist.saturating_record(us);
            s.hist.saturating_record(us);
            *s.statuses.entry(status).or_default() += 1;
            let t = since.as_secs_f64();
            s.backends
                .entry(backend)
                .and_modify(|b| {
                    b.first_s = b.first_s.min(t);
                    b.last_s = b.last_s.max(t);
                    b.count += 1;
                })
                .or_insert(Seen {
                    first_s: t,
                    last_s: t,
                    count: 1,
                });
        }
    }

    /// Records how late an idle connection woke up for its scheduled send (generator lag).
    pub fn record_lag(&self, conn: usize, lag: Duration) {
        let us = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX).max(1);
        self.shards[conn % self.shards.len()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .lag
            .saturating_record(us);
    }

    /// Merges all shards.
    pub fn merge(&self) -> Merged {
        let mut m = Merged {
            counts: Counts::default(),
            hist: hist(MAX_US, 3),
            lag: hist(60_000_000, 2),
            seconds: Vec::new(),
            statuses: BTreeMap::new(),
            backends: BTreeMap::new(),
        };
        for shard in &self.shards {
            let s = shard.lock().unwrap_or_else(PoisonError::into_inner);
            m.counts.merge(&s.counts);
            // Same bounds on both sides, so adding cannot fail.
            let _ = m.hist.add(&s.hist);
            let _ = m.lag.add(&s.lag);
            for (i, sec) in s.seconds.iter().enumerate() {
                while m.seconds.len() <= i {
                    m.seconds.push((Counts::default(), hist(MAX_US, 2)));
                }
                m.seconds[i].0.merge(&sec.counts);
                let _ = m.seconds[i].1.add(&sec.hist);
            }
            for (k, v) in &s.statuses {
                *m.statuses.entry(*k).or_default() += v;
            }
            for (tag, seen) in &s.backends {
                let name = tag.as_str().unwrap_or("-").to_string();
                m.backends
                    .entry(name)
                    .and_modify(|b| {
                        b.first_s = b.first_s.min(seen.first_s);
                        b.last_s = b.last_s.max(seen.last_s);
                        b.count += seen.count;
                    })
                    .or_insert(*seen);
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_wrk_and_truth() {
        let t0 = Instant::now();
        let r = Recorder::new(t0, 2, Arc::new(Live::default()));
        let resp = |status| Outcome::Response {
            status,
            latency: Duration::from_millis(3),
            bytes: 10,
            backend: BackendTag::default(),
        };
        r.record(0, t0, resp(200));
        r.record(1, t0, resp(503));
        r.record(0, t0, resp(404));
        r.record(1, t0, Outcome::IdleClosed { on_write: false });
        r.record(0, t0, Outcome::Failed(Fail::ConnectRefused));
        r.record(0, t0, Outcome::Failed(Fail::Handshake));
        r.record(
            0,
            t0,
            Outcome::Failed(Fail::ClosedAfterSend { retryable: true }),
        );
        r.record(0, t0, Outcome::Failed(Fail::ResponseTimeout));
        r.record(0, t0, Outcome::Failed(Fail::Write));
        let m = r.merge();
        assert_eq!(m.counts.failed(), 7);
        assert_eq!(m.counts.attempts(), 8);
        assert_eq!(
            m.counts.wrk(),
            WrkErrors {
                connect: 2,
                read: 2,
                write: 1,
                timeout: 1,
                status_non2xx: 2
            }
        );
        assert_eq!(m.hist.len(), 3);
    }
}
