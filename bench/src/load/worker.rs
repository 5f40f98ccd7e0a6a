//! One task per connection: the open-loop schedule (wrk2 semantics), the closed loop, and one
//! attempt with its classification.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::time::{Instant, sleep_until};

use super::conn::{ConnectError, Connector, Stream};
use super::http1::{self, ExchangeError};
use super::record::{Fail, Outcome, Recorder};

/// Wake-up lateness of an idle connection that is charged to the generator's timer rather than
/// to the server: tokio's timer has 1 ms resolution, so a send scheduled at 10.3 ms leaves at
/// ~11 ms. Later than this and the latency is counted from the scheduled time again (and the
/// lag is reported, flagging an overloaded generator).
pub const TIMER_SLOP: Duration = Duration::from_millis(2);

/// Back-off after a failed connect in the closed loop, so that a refusing port is not hammered
/// in a tight loop (the open loop keeps its schedule instead).
const CLOSED_LOOP_BACKOFF: Duration = Duration::from_millis(10);

/// What every connection task shares.
#[derive(Debug)]
pub struct Shared {
    /// Opens connections.
    pub connector: Connector,
    /// The request bytes.
    pub request: Bytes,
    /// Connect + response timeout.
    pub timeout: Duration,
    /// Reuse connections.
    pub keep_alive: bool,
}

/// When a task runs.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Start of the measured run.
    pub t0: Instant,
    /// No new request is scheduled at or after this.
    pub end: Instant,
    /// Scheduled requests not yet sent by now are given up (counted as missed).
    pub hard_stop: Instant,
}

enum Idle {
    Due,
    Closed,
}

/// Waits until `until` while watching an idle keep-alive connection: EOF, a reset or unsolicited
/// bytes mean the server closed (or is closing) it.
async fn watch_idle(s: &mut Stream, buf: &mut BytesMut, until: Instant) -> Idle {
    tokio::select! {
        biased;
        _ = s.read_buf(buf) => Idle::Closed,
        _ = sleep_until(until) => Idle::Due,
    }
}

/// Checks, without waiting, whether the server closed an idle connection.
async fn closed_now(s: &mut Stream, buf: &mut BytesMut) -> bool {
    tokio::select! {
        biased;
        _ = s.read_buf(buf) => true,
        _ = std::future::ready(()) => false,
    }
}

fn connect_fail(e: &ConnectError) -> Fail {
    match e {
        ConnectError::Refused => Fail::ConnectRefused,
        ConnectError::Timeout => Fail::ConnectTimeout,
        ConnectError::Other(_) => Fail::ConnectOther,
        ConnectError::Handshake(_) => Fail::Handshake,
    }
}

/// Opens a connection before the run starts (not timed, not counted), so the run measures
/// steady state rather than N simultaneous handshakes.
pub async fn preconnect(shared: &Shared, deadline: Instant) -> Option<Stream> {
    shared.connector.connect(deadline).await.ok()
}

/// One request: connect if needed, send, read. Latency is measured from `origin`.
async fn attempt(
    id: usize,
    shared: &Shared,
    rec: &Recorder,
    stream: &mut Option<Stream>,
    buf: &mut BytesMut,
    origin: Instant,
) -> Outcome {
    let mut tries = 0;
    loop {
        tries += 1;
        let deadline = Instant::now() + shared.timeout;
        let reused = stream.is_some();
        let s = match stream {
            Some(s) => s,
            None => match shared.connector.connect(deadline).await {
                Ok(s) => {
                    buf.clear();
                    stream.insert(s)
                }
                Err(e) => return Outcome::Failed(connect_fail(&e)),
            },
        };
        let r = tokio::time::timeout_at(deadline, http1::exchange(s, buf, &shared.request)).await;
        let fail = match r {
            Ok(Ok(resp)) => {
                if resp.close || !shared.keep_alive {
                    *stream = None;
                }
                return Outcome::Response {
                    status: resp.status,
                    latency: Instant::now().saturating_duration_since(origin),
                    bytes: resp.bytes,
                    backend: resp.backend,
                };
            }
            Err(_) => Fail::ResponseTimeout,
            Ok(Err(ExchangeError::Write(_))) if reused && tries == 1 => {
                // The request never left: the server had closed this keep-alive connection.
                // Not a failed request; it goes out again on a new connection.
                *stream = None;
                rec.record(id, Instant::now(), Outcome::IdleClosed { on_write: true });
                continue;
            }
            Ok(Err(ExchangeError::Write(_))) => Fail::Write,
            Ok(Err(ExchangeError::Closed { got, .. })) => Fail::ClosedAfterSend {
                retryable: reused && got == 0,
            },
            Ok(Err(ExchangeError::Protocol(_))) => Fail::Protocol,
        };
        *stream = None;
        return Outcome::Failed(fail);
    }
}

/// Open loop: connection `id` sends at `t0 + offset + k * period` for k = 0, 1, ... while that
/// is before `end`. A send waits for the previous response (one request in flight per
/// connection, as wrk2), and latency runs from the scheduled time, so time spent behind
/// schedule is charged to the server (no coordinated omission). Returns the number of
/// scheduled requests never sent (given up at the hard stop).
pub async fn open_loop(
    id: usize,
    shared: Arc<Shared>,
    rec: Arc<Recorder>,
    w: Window,
    offset: f64,
    period: f64,
    mut stream: Option<Stream>,
) -> u64 {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let slot = |k: u64| w.t0 + Duration::from_secs_f64(offset + k as f64 * period);
    let mut k: u64 = 0;
    loop {
        let sched = slot(k);
        if sched >= w.end {
            return 0;
        }
        let now = Instant::now();
        if now >= w.hard_stop {
            let left = ((w.end - w.t0).as_secs_f64() - offset) / period;
            return (left.ceil().max(0.0) as u64).saturating_sub(k);
        }
        let waited = sched > now;
        if waited {
            if let Some(s) = stream.as_mut() {
                if let Idle::Closed = watch_idle(s, &mut buf, sched).await {
                    stream = None;
                    rec.record(id, Instant::now(), Outcome::IdleClosed { on_write: false });
                    sleep_until(sched).await;
                }
            } else {
                sleep_until(sched).await;
            }
        } else if let Some(s) = stream.as_mut()
            && closed_now(s, &mut buf).await
        {
            stream = None;
            rec.record(id, Instant::now(), Outcome::IdleClosed { on_write: false });
        }
        let send = Instant::now();
        let origin = if waited {
            let lag = send.saturating_duration_since(sched);
            rec.record_lag(id, lag);
            if lag <= TIMER_SLOP { send } else { sched }
        } else {
            sched
        };
        let o = attempt(id, &shared, &rec, &mut stream, &mut buf, origin).await;
        rec.record(id, Instant::now(), o);
        k += 1;
    }
}

/// Closed loop: send the next request as soon as the previous one finished, until `end`.
/// Latency runs from the send (connect included in connection-per-request mode).
pub async fn closed_loop(
    id: usize,
    shared: Arc<Shared>,
    rec: Arc<Recorder>,
    w: Window,
    mut stream: Option<Stream>,
) -> u64 {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    while Instant::now() < w.end {
        let origin = Instant::now();
        let o = attempt(id, &shared, &rec, &mut stream, &mut buf, origin).await;
        let connect_failed = matches!(
            o,
            Outcome::Failed(
                Fail::ConnectRefused | Fail::ConnectTimeout | Fail::ConnectOther | Fail::Handshake
            )
        );
        rec.record(id, Instant::now(), o);
        if connect_failed {
            tokio::time::sleep(CLOSED_LOOP_BACKOFF).await;
        }
    }
    0
}
