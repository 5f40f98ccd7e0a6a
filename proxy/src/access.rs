//! The access log (off by default, `--access-log`): one line per request, on stdout, with
//! ingress-nginx's fields — time, client, host, method, path, protocol, status, bytes,
//! duration, upstream address, upstream status, upstream duration, retries, request id,
//! ingress and service — as text or as one JSON object per line (`--log-format json`).
//!
//! Requests never wait for the log: a line is formatted where the request finishes and handed
//! to a writer thread through a bounded channel; when the writer falls behind (a slow pipe),
//! lines are dropped and counted rather than slowing traffic. The writer flushes whenever the
//! channel runs dry, so the log is current within a moment.
//!
//! `duration` is the time to the response head (as the request-duration metric), and `bytes`
//! the response's declared length (`-` for a streamed body): sluice logs when it answers, not
//! when the last byte leaves.

use std::fmt::Write as _;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, Method, Response, Version};
use prometheus_client::metrics::counter::Counter;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 16 * 1024;

/// Text or JSON lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `key=value` fields after a timestamp, like the rest of sluice's text log.
    Text,
    /// One JSON object per line.
    Json,
}

/// The route a response was answered for (a response extension, for the log).
#[derive(Debug, Clone)]
pub struct RouteSeen {
    /// `namespace/name` of the Ingress.
    pub ingress: Arc<str>,
    /// `namespace/service:port`, or empty.
    pub service: Arc<str>,
}

/// What the upstream did for a response (a response extension, for the log).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamSeen {
    /// The endpoint that answered.
    pub addr: SocketAddr,
    /// Its status.
    pub status: u16,
    /// From sending to its response head.
    pub duration: Duration,
    /// Attempts before the one that answered.
    pub retries: u32,
}

/// The request side of a line, taken before the request is handed on.
#[derive(Debug)]
pub struct Seen {
    method: Method,
    path: String,
    host: String,
    version: Version,
    request_id: String,
}

impl Seen {
    /// Takes what the log needs from a request's parts. A request without `X-Request-ID` gets
    /// one here, so that the upstream and the log carry the same ID.
    pub fn of(method: &Method, uri: &http::Uri, version: Version, headers: &mut HeaderMap) -> Self {
        let host = uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| {
                headers
                    .get(http::header::HOST)
                    .and_then(|v| v.to_str().ok())
            })
            .unwrap_or("")
            .to_string();
        let request_id = match headers.get("x-request-id") {
            Some(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            None => {
                let id = crate::forwarded::new_request_id();
                if let Ok(v) = HeaderValue::from_bytes(&id) {
                    headers.insert("x-request-id", v);
                }
                String::from_utf8_lossy(&id).into_owned()
            }
        };
        Self {
            method: method.clone(),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
            host,
            version,
            request_id,
        }
    }

    /// The same from the fast path's raw pieces.
    pub fn raw(method: &Method, path: &str, host: &[u8], request_id: &[u8]) -> Self {
        Self {
            method: method.clone(),
            path: path.to_string(),
            host: String::from_utf8_lossy(host).into_owned(),
            version: Version::HTTP_11,
            request_id: String::from_utf8_lossy(request_id).into_owned(),
        }
    }
}

/// What the answer side of a line says.
#[derive(Debug, Clone)]
pub struct Answered {
    /// Status sent to the client.
    pub status: u16,
    /// Declared body length.
    pub bytes: Option<u64>,
    /// The route, if one matched.
    pub route: Option<RouteSeen>,
    /// The upstream, if one answered.
    pub upstream: Option<UpstreamSeen>,
}

impl Answered {
    /// Reads it from a response and the extensions the handler left on it.
    pub fn of<B>(resp: &Response<B>) -> Self {
        Self {
            status: resp.status().as_u16(),
            bytes: resp
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            route: resp.extensions().get::<RouteSeen>().cloned(),
            upstream: resp.extensions().get::<UpstreamSeen>().copied(),
        }
    }
}

/// The access log's sending side (cheap to share; requests hold it through the data plane).
#[derive(Debug)]
pub struct AccessLog {
    format: Format,
    tx: SyncSender<String>,
    dropped: Counter,
}

impl AccessLog {
    /// A log written to stdout by its own thread; dropped lines are counted in `dropped`.
    pub fn stdout(format: Format, dropped: Counter) -> std::io::Result<Self> {
        Self::to_writer(format, Box::new(std::io::stdout()), dropped)
    }

    /// A log written to `w` by its own thread (tests give it a pipe or a buffer).
    pub fn to_writer(
        format: Format,
        w: Box<dyn Write + Send>,
        dropped: Counter,
    ) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("sluice-access-log".into())
            .spawn(move || write_lines(rx, w))?;
        Ok(Self {
            format,
            tx,
            dropped,
        })
    }

    /// Lines dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Logs one request.
    pub fn record(&self, client: IpAddr, seen: &Seen, a: &Answered, started: Instant) {
        let line = self.line(client, seen, a, started.elapsed(), SystemTime::now());
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    fn line(
        &self,
        client: IpAddr,
        seen: &Seen,
        a: &Answered,
        took: Duration,
        now: SystemTime,
    ) -> String {
        let time = rfc3339(now);
        let proto = match seen.version {
            Version::HTTP_2 => "HTTP/2.0",
            Version::HTTP_10 => "HTTP/1.0",
            _ => "HTTP/1.1",
        };
        let (ingress, service) = a
            .route
            .as_ref()
            .map_or(("", ""), |r| (&*r.ingress, &*r.service));
        let up = a.upstream;
        let mut s = String::with_capacity(320);
        match self.format {
            Format::Json => {
                let _ = write!(s, "{{\"time\":\"{time}\",\"client\":\"{client}\",\"host\":");
                json_str(&mut s, &seen.host);
                let _ = write!(s, ",\"method\":\"{}\",\"path\":", seen.method);
                json_str(&mut s, &seen.path);
                let _ = write!(
                    s,
                    ",\"protocol\":\"{proto}\",\"status\":{},\"bytes\":{},\"duration\":{:.6}",
                    a.status,
                    a.bytes.map_or("null".to_string(), |b| b.to_string()),
                    took.as_secs_f64()
                );
                match up {
                    Some(u) => {
                        let _ = write!(
                            s,
                            ",\"upstream\":\"{}\",\"upstream_status\":{},\"upstream_duration\":{:.6},\"retries\":{}",
                            u.addr,
                            u.status,
                            u.duration.as_secs_f64(),
                            u.retries
                        );
                    }
                    None => s.push_str(
                        ",\"upstream\":null,\"upstream_status\":null,\"upstream_duration\":null,\"retries\":0",
                    ),
                }
                s.push_str(",\"request_id\":");
                json_str(&mut s, &seen.request_id);
                s.push_str(",\"ingress\":");
                json_str(&mut s, ingress);
                s.push_str(",\"service\":");
                json_str(&mut s, service);
                s.push('}');
            }
            Format::Text => {
                let _ = write!(
                    s,
                    "{time} access client={client} host={} method={} path={} protocol={proto} status={} bytes={} duration={:.6}",
                    quoted(&seen.host),
                    seen.method,
                    quoted(&seen.path),
                    a.status,
                    a.bytes.map_or("-".to_string(), |b| b.to_string()),
                    took.as_secs_f64()
                );
                match up {
                    Some(u) => {
                        let _ = write!(
                            s,
                            " upstream={} upstream_status={} upstream_duration={:.6} retries={}",
                            u.addr,
                            u.status,
                            u.duration.as_secs_f64(),
                            u.retries
                        );
                    }
                    None => {
                        s.push_str(" upstream=- upstream_status=- upstream_duration=- retries=0")
                    }
                }
                let _ = write!(
                    s,
                    " request_id={} ingress={} service={}",
                    quoted(&seen.request_id),
                    or_dash(ingress),
                    or_dash(service)
                );
            }
        }
        s.push('\n');
        s
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// A text value: as it is when it has no space, quote or control byte; else JSON-quoted (so a
/// client cannot forge fields or lines).
fn quoted(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b > b' ' && b != b'"' && b != 0x7f) {
        v.to_string()
    } else {
        let mut s = String::new();
        json_str(&mut s, v);
        s
    }
}

fn json_str(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_lines(rx: Receiver<String>, w: Box<dyn Write + Send>) {
    let mut w = std::io::BufWriter::with_capacity(64 * 1024, w);
    while let Ok(line) = rx.recv() {
        let _ = w.write_all(line.as_bytes());
        while let Ok(more) = rx.try_recv() {
            let _ = w.write_all(more.as_bytes());
        }
        let _ = w.flush();
    }
}

/// `2026-12-05T14:00:00.123Z` (UTC, milliseconds).
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn sample(format: Format) -> String {
        let log =
            AccessLog::to_writer(format, Box::new(std::io::sink()), Counter::default()).unwrap();
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("app.test"));
        h.insert("x-request-id", HeaderValue::from_static("id \"1\""));
        let seen = Seen::of(
            &Method::GET,
            &"/a%20b?x=%221%22".parse().unwrap(),
            Version::HTTP_11,
            &mut h,
        );
        let a = Answered {
            status: 200,
            bytes: Some(1024),
            route: Some(RouteSeen {
                ingress: "default/one".into(),
                service: "default/svc:80".into(),
            }),
            upstream: Some(UpstreamSeen {
                addr: "10.0.0.1:8080".parse().unwrap(),
                status: 200,
                duration: Duration::from_micros(1500),
                retries: 1,
            }),
        };
        log.line(
            "192.0.2.1".parse().unwrap(),
            &seen,
            &a,
            Duration::from_millis(2),
            UNIX_EPOCH + Duration::from_millis(1_764_943_200_123),
        )
    }

    #[test]
    fn json_lines_carry_ingress_nginx_fields_and_escape_client_input() {
        let line = sample(Format::Json);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time"], "2025-12-05T14:00:00.123Z");
        assert_eq!(v["client"], "192.0.2.1");
        assert_eq!(v["host"], "app.test");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["path"], "/a%20b?x=%221%22");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes"], 1024);
        assert_eq!(v["upstream"], "10.0.0.1:8080");
        assert_eq!(v["upstream_status"], 200);
        assert_eq!(v["retries"], 1);
        assert_eq!(v["request_id"], "id \"1\"");
        assert_eq!(v["ingress"], "default/one");
        assert_eq!(v["service"], "default/svc:80");
        assert!(line.ends_with("}\n") && line.matches('\n').count() == 1);
    }

    #[test]
    fn text_lines_quote_what_a_client_could_use_to_forge_fields() {
        let line = sample(Format::Text);
        assert!(
            line.starts_with(
                "2025-12-05T14:00:00.123Z access client=192.0.2.1 host=app.test method=GET"
            ),
            "{line}"
        );
        assert!(line.contains(" request_id=\"id \\\"1\\\"\" "), "{line}");
        assert!(
            line.contains(
                " upstream=10.0.0.1:8080 upstream_status=200 upstream_duration=0.001500 retries=1"
            ),
            "{line}"
        );
        assert_eq!(quoted("a b\nx=1"), "\"a b\\nx=1\"");
        assert_eq!(quoted(""), "\"\"");
    }

    #[test]
    fn a_request_without_an_id_gets_one_that_the_upstream_sees_too() {
        let mut h = HeaderMap::new();
        let seen = Seen::of(
            &Method::GET,
            &"/".parse().unwrap(),
            Version::HTTP_11,
            &mut h,
        );
        assert_eq!(seen.request_id.len(), 32);
        assert_eq!(
            h.get("x-request-id").unwrap().as_bytes(),
            seen.request_id.as_bytes()
        );
    }

    #[test]
    fn lines_reach_the_writer_and_a_stuck_writer_drops_instead_of_blocking() {
        let buf = Buf::default();
        let log =
            AccessLog::to_writer(Format::Json, Box::new(buf.clone()), Counter::default()).unwrap();
        let mut h = HeaderMap::new();
        let seen = Seen::of(
            &Method::GET,
            &"/".parse().unwrap(),
            Version::HTTP_11,
            &mut h,
        );
        let a = Answered {
            status: 404,
            bytes: None,
            route: None,
            upstream: None,
        };
        for _ in 0..3 {
            log.record("127.0.0.1".parse().unwrap(), &seen, &a, Instant::now());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while buf
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            < 3
        {
            assert!(Instant::now() < deadline, "lines were not written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(log.dropped(), 0);

        // A writer that never returns: the queue fills, then lines are dropped, never awaited.
        struct Stuck;
        impl Write for Stuck {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                std::thread::sleep(Duration::from_secs(3600));
                Ok(0)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let stuck =
            AccessLog::to_writer(Format::Text, Box::new(Stuck), Counter::default()).unwrap();
        let t = Instant::now();
        for _ in 0..(QUEUE + 100) {
            stuck.record("127.0.0.1".parse().unwrap(), &seen, &a, Instant::now());
        }
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(stuck.dropped() > 0, "{}", stuck.dropped());
    }
}
