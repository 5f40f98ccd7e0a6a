//! The soak's HTTP/2 and WebSocket clients (the HTTPS keep-alive load is the generator's own,
//! [`crate::load::run`]). Each records into [`Buckets`]: per sampling interval, what finished,
//! what failed, and a latency histogram.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

use crate::load::{Connector, TlsSpec};
use crate::report::soak::Traffic;

/// How long one request or one echo may take before it counts as failed.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

struct Bucket {
    requests: u64,
    failed: u64,
    hist: Option<Histogram<u64>>,
}

/// Outcomes per interval of `width` from `t0`.
pub struct Buckets {
    t0: Instant,
    width: Duration,
    inner: Mutex<Vec<Bucket>>,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("width", &self.width)
            .finish()
    }
}

impl Buckets {
    /// Empty buckets of `width` from `t0`.
    pub fn new(t0: Instant, width: Duration) -> Self {
        Self {
            t0,
            width,
            inner: Mutex::new(Vec::new()),
        }
    }

    /// Records one outcome finished now: `Some(latency)` answered, `None` failed.
    pub fn record(&self, latency: Option<Duration>) {
        let since = Instant::now().saturating_duration_since(self.t0);
        let i = usize::try_from(since.as_millis() / self.width.as_millis().max(1))
            .unwrap_or(usize::MAX)
            .min(100_000);
        let mut v = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while v.len() <= i {
            v.push(Bucket {
                requests: 0,
                failed: 0,
                hist: Histogram::new_with_bounds(1, 60_000_000, 2).ok(),
            });
        }
        let b = &mut v[i];
        b.requests += 1;
        match latency {
            Some(l) => {
                if let Some(h) = b.hist.as_mut() {
                    let us = u64::try_from(l.as_micros()).unwrap_or(u64::MAX);
                    h.saturating_record(us.clamp(1, 60_000_000));
                }
            }
            None => b.failed += 1,
        }
    }

    /// Interval `i`'s traffic.
    pub fn traffic(&self, i: usize) -> Traffic {
        let v = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        v.get(i).map_or(Traffic::default(), |b| Traffic {
            requests: b.requests,
            failed: b.failed,
            p99_ms: b
                .hist
                .as_ref()
                .filter(|h| !h.is_empty())
                .map_or(0.0, |h| h.value_at_quantile(0.99) as f64 / 1000.0),
        })
    }

    /// Everything recorded: (finished, failed).
    pub fn totals(&self) -> (u64, u64) {
        let v = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        v.iter()
            .fold((0, 0), |(r, f), b| (r + b.requests, f + b.failed))
    }
}

/// Where the clients connect and what they send.
#[derive(Debug, Clone)]
pub struct Target {
    /// The proxy's TLS listener.
    pub addr: SocketAddr,
    /// TLS settings (server name, verification).
    pub tls: TlsSpec,
    /// `Host` / `:authority`.
    pub host: String,
}

/// HTTP/2 load: `connections` connections, `rate` requests per second across them, each
/// request its own stream, until `end`. A connection that breaks is opened again; the
/// requests it lost count as failed.
pub async fn h2(target: Target, connections: usize, rate: f64, end: Instant, out: Arc<Buckets>) {
    let connector =
        match Connector::with_alpn(vec![target.addr], Some(&target.tls), &[b"h2".as_slice()]) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::warn!("soak h2: {e}");
                return;
            }
        };
    let uri: hyper::Uri = match format!("https://{}/", target.host).parse() {
        Ok(u) => u,
        Err(_) => return,
    };
    let mut tasks = JoinSet::new();
    let n = connections.max(1);
    for id in 0..n {
        let (connector, uri, out) = (Arc::clone(&connector), uri.clone(), Arc::clone(&out));
        let period = Duration::from_secs_f64(n as f64 / rate.max(0.1));
        let offset = period.mul_f64(id as f64 / n as f64);
        tasks.spawn(async move {
            let mut next = Instant::now() + offset;
            while next < end {
                let opened = timeout(ANSWER_WITHIN, async {
                    let stream = connector
                        .connect(Instant::now() + ANSWER_WITHIN)
                        .await
                        .ok()?;
                    hyper::client::conn::http2::handshake(
                        TokioExecutor::new(),
                        TokioIo::new(stream),
                    )
                    .await
                    .ok()
                })
                .await;
                let Ok(Some((sender, conn))) = opened else {
                    // The request due now could not be sent: it failed.
                    out.record(None);
                    next += period;
                    sleep_until(next).await;
                    continue;
                };
                let driver = tokio::spawn(conn);
                let mut inflight = JoinSet::new();
                while next < end {
                    sleep_until(next).await;
                    next += period;
                    if sender.is_closed() {
                        break;
                    }
                    let (mut sender, uri, out) = (sender.clone(), uri.clone(), Arc::clone(&out));
                    inflight.spawn(async move {
                        let start = Instant::now();
                        let req = hyper::Request::get(uri).body(Empty::<Bytes>::new());
                        let Ok(req) = req else {
                            out.record(None);
                            return;
                        };
                        let answered = timeout(ANSWER_WITHIN, async {
                            let resp = sender.send_request(req).await.ok()?;
                            let ok = resp.status().is_success();
                            resp.into_body().collect().await.ok()?;
                            ok.then_some(())
                        })
                        .await;
                        out.record(matches!(answered, Ok(Some(()))).then(|| start.elapsed()));
                    });
                    while inflight.try_join_next().is_some() {}
                }
                while inflight.join_next().await.is_some() {}
                drop(sender);
                driver.abort();
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// A masked client WebSocket frame (text, FIN) carrying `payload` (under 126 bytes).
fn ws_frame(payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0x81, 0x80 | (payload.len() as u8 & 0x7f)];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads an HTTP response head (up to the blank line) and returns it.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<String> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || s.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).ok()
}

/// One WebSocket session: upgrade, then `messages` echoes one `gap` apart (fewer if `end`
/// comes first), then a close. The upgrade and each echo are recorded (the backend echoes
/// every byte, so an echo is the frame sent, byte for byte).
pub(super) async fn ws_session(
    connector: &Connector,
    host: &str,
    (messages, gap): (usize, Duration),
    (seq, end): (u64, Instant),
    out: &Buckets,
) {
    let start = Instant::now();
    let Ok(Ok(mut s)) = timeout(ANSWER_WITHIN, connector.connect(start + ANSWER_WITHIN)).await
    else {
        out.record(None);
        return;
    };
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2x1aWNlLXNvYWstMDAwMQ==\r\n\r\n"
    );
    let head = timeout(ANSWER_WITHIN, async {
        s.write_all(upgrade.as_bytes()).await.ok()?;
        read_head(&mut s).await
    })
    .await;
    match head {
        Ok(Some(h)) if h.starts_with("HTTP/1.1 101") => out.record(Some(start.elapsed())),
        _ => {
            out.record(None);
            return;
        }
    }
    let mut next = Instant::now();
    for i in 0..messages {
        if next >= end {
            break;
        }
        sleep_until(next).await;
        next += gap;
        let payload = format!("soak {seq} message {i}");
        let mask = (seq as u32 ^ (i as u32).rotate_left(16)).to_be_bytes();
        let frame = ws_frame(payload.as_bytes(), mask);
        let sent = Instant::now();
        let echoed = timeout(ANSWER_WITHIN, async {
            s.write_all(&frame).await.ok()?;
            let mut back = vec![0u8; frame.len()];
            s.read_exact(&mut back).await.ok()?;
            (back == frame).then_some(())
        })
        .await;
        if matches!(echoed, Ok(Some(()))) {
            out.record(Some(sent.elapsed()));
        } else {
            out.record(None);
            return;
        }
    }
    // Close (opcode 8, no payload); the echo server sends it back.
    let close = [0x88, 0x80, 1, 2, 3, 4];
    let _ = timeout(Duration::from_secs(1), async {
        s.write_all(&close).await.ok()?;
        let mut back = [0u8; 6];
        s.read_exact(&mut back).await.ok()?;
        s.shutdown().await.ok()
    })
    .await;
}

/// WebSocket load: `sessions` sessions open at once, each `messages` echoes `gap` apart and
/// then a close, a new one opened in its place, until `end` (the last ones cut short).
pub async fn websockets(
    target: Target,
    sessions: usize,
    (messages, gap): (usize, Duration),
    end: Instant,
    out: Arc<Buckets>,
) {
    let connector = match Connector::new(vec![target.addr], Some(&target.tls)) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            tracing::warn!("soak websocket: {e}");
            return;
        }
    };
    let mut tasks = JoinSet::new();
    for id in 0..sessions {
        let (connector, host, out) = (
            Arc::clone(&connector),
            target.host.clone(),
            Arc::clone(&out),
        );
        tasks.spawn(async move {
            // Spread the sessions' starts over one session's length.
            let stagger = gap.mul_f64(messages as f64 * id as f64 / sessions.max(1) as f64);
            tokio::time::sleep(stagger).await;
            let mut seq = id as u64;
            // Sessions run to the end (the last one cut short), so the connections stay
            // open through the last reading.
            while Instant::now() + gap < end {
                ws_session(&connector, &host, (messages, gap), (seq, end), &out).await;
                seq += sessions as u64;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frames_are_masked_and_buckets_split_by_interval() {
        let f = ws_frame(b"abcd", [1, 2, 3, 4]);
        assert_eq!(
            f,
            vec![
                0x81,
                0x84,
                1,
                2,
                3,
                4,
                b'a' ^ 1,
                b'b' ^ 2,
                b'c' ^ 3,
                b'd' ^ 4
            ]
        );
        let b = Buckets::new(Instant::now(), Duration::from_secs(3600));
        b.record(Some(Duration::from_millis(2)));
        b.record(None);
        let t = b.traffic(0);
        assert_eq!((t.requests, t.failed), (2, 1));
        assert!((t.p99_ms - 2.0).abs() < 0.1, "{}", t.p99_ms);
        assert_eq!(b.traffic(1), Traffic::default());
        assert_eq!(b.totals(), (2, 1));
    }
}
