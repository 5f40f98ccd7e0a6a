//! The access log (off by default, `--access-log`): one line per request, on stdout, with
//! ingress-nginx's fields — time, client, host, method, path, protocol, status, bytes,
//! duration, upstream address, upstream status, upstream duration, retries, request id,
//! ingress and service — as text or as one JSON object per line (`--log-format json`).
//!
//! Built to cost little when on (measured in the closing notes of the issue that added it):
//! what a line needs is kept as shared byte slices of the request (no copies), the line is
//! formatted straight into a per-thread buffer (a lock no other thread takes in practice, so
//! no contention and no wake-up per request), and a writer thread swaps the buffers out every
//! [`FLUSH_EVERY`] (sooner when one fills) and writes them. Requests never wait for stdout: a
//! buffer that reaches [`MAX_BUFFERED`] because the writer is stuck drops further lines, counted
//! in `sluice_access_log_dropped_total`.
//!
//! `duration` is the time to the response head (as the request-duration metric), and `bytes`
//! the response's declared length (`-` for a streamed body): sluice logs when it answers, not
//! when the last byte leaves.

use std::cell::Cell;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, Version};
use prometheus_client::metrics::counter::Counter;

/// How often the writer drains the buffers.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// A buffer this full wakes the writer early.
const WAKE_AT: usize = 256 * 1024;
/// A buffer this full drops lines (the writer is stuck).
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;
/// Buffers; a thread uses the one its id picks.
const SHARDS: usize = 16;

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

/// The request's ID: the client's, or one sluice made (and sent upstream).
#[derive(Debug)]
enum RequestId {
    Client(Bytes),
    Made([u8; 32]),
}

/// The request side of a line, taken before the request is handed on: shared slices of the
/// request's own bytes, not copies.
#[derive(Debug)]
pub struct Seen {
    method: Method,
    uri: http::Uri,
    host: Bytes,
    version: Version,
    request_id: RequestId,
}

impl Seen {
    /// Takes what the log needs from a request's parts. A request without `X-Request-ID` gets
    /// one here, so that the upstream and the log carry the same ID.
    pub fn of(method: &Method, uri: &http::Uri, version: Version, headers: &mut HeaderMap) -> Self {
        let host = match uri.authority() {
            Some(a) => Bytes::copy_from_slice(a.as_str().as_bytes()),
            None => headers
                .get(http::header::HOST)
                .map_or_else(Bytes::new, |v| Bytes::copy_from_slice(v.as_bytes())),
        };
        let request_id = match headers.get("x-request-id") {
            Some(v) => RequestId::Client(Bytes::copy_from_slice(v.as_bytes())),
            None => {
                let id = crate::wire::forwarded::new_request_id();
                if let Ok(v) = HeaderValue::from_bytes(&id) {
                    headers.insert("x-request-id", v);
                }
                RequestId::Made(id)
            }
        };
        Self {
            method: method.clone(),
            uri: uri.clone(),
            host,
            version,
            request_id,
        }
    }

    /// The same from the fast path's head: `host` and a client `request_id` are slices of it.
    pub fn raw(
        method: &Method,
        uri: &http::Uri,
        host: Bytes,
        request_id: Option<Bytes>,
        made: Option<[u8; 32]>,
    ) -> Self {
        Self {
            method: method.clone(),
            uri: uri.clone(),
            host,
            version: Version::HTTP_11,
            request_id: match (request_id, made) {
                (Some(b), _) => RequestId::Client(b),
                (None, Some(id)) => RequestId::Made(id),
                (None, None) => RequestId::Client(Bytes::new()),
            },
        }
    }

    fn request_id(&self) -> &[u8] {
        match &self.request_id {
            RequestId::Client(b) => b,
            RequestId::Made(id) => id,
        }
    }

    fn path(&self) -> &str {
        self.uri.path_and_query().map_or("/", |p| p.as_str())
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
            bytes: crate::wire::length::of_map(resp.headers()),
            route: resp.extensions().get::<RouteSeen>().cloned(),
            upstream: resp.extensions().get::<UpstreamSeen>().copied(),
        }
    }
}

/// One buffer and the second its cached timestamp prefix is for.
#[derive(Debug, Default)]
struct Shard {
    buf: Vec<u8>,
    second: u64,
    stamp: [u8; 19],
}

#[derive(Debug)]
struct Shared {
    shards: Vec<Mutex<Shard>>,
    wake: (Mutex<bool>, Condvar),
}

/// The access log's sending side, owned by the data plane; the writer thread ends when it is
/// dropped (after a last drain).
#[derive(Debug)]
pub struct AccessLog {
    format: Format,
    shared: Arc<Shared>,
    dropped: Counter,
}

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

fn my_shard() -> usize {
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        s.get()
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let shared = Arc::new(Shared {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            wake: (Mutex::new(false), Condvar::new()),
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("sluice-access-log".into())
            .spawn(move || write_lines(&weak, w))?;
        Ok(Self {
            format,
            shared,
            dropped,
        })
    }

    /// Lines dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Logs one request.
    pub fn record(&self, client: IpAddr, seen: &Seen, a: &Answered, started: Instant) {
        let took = started.elapsed();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut shard = lock(&self.shared.shards[my_shard()]);
        if shard.buf.len() >= MAX_BUFFERED {
            drop(shard);
            self.dropped.inc();
            return;
        }
        let sh = &mut *shard;
        if sh.second != now.as_secs() || sh.buf.capacity() == 0 {
            sh.second = now.as_secs();
            sh.stamp = date_time(now.as_secs());
        }
        let stamp = sh.stamp;
        line(
            &mut sh.buf,
            self.format,
            (&stamp, now.subsec_millis()),
            client,
            seen,
            a,
            took,
        );
        let full = sh.buf.len() >= WAKE_AT;
        drop(shard);
        if full {
            let (m, cv) = &self.shared.wake;
            *lock(m) = true;
            cv.notify_one();
        }
    }
}

impl AccessLog {
    /// Wakes the writer and waits (up to `within`) until every buffered line was handed to it:
    /// called on shutdown so the last requests are not lost.
    pub fn flush(&self, within: Duration) {
        let end = Instant::now() + within;
        loop {
            {
                let (m, cv) = &self.shared.wake;
                *lock(m) = true;
                cv.notify_one();
            }
            if self.shared.shards.iter().all(|s| lock(s).buf.is_empty()) || Instant::now() >= end {
                // One more pass lets the writer finish the write it took.
                std::thread::sleep(Duration::from_millis(20));
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let (m, cv) = &self.shared.wake;
        *lock(m) = true;
        cv.notify_one();
    }
}

/// Appends one line.
fn line(
    out: &mut Vec<u8>,
    format: Format,
    (stamp, millis): (&[u8; 19], u32),
    client: IpAddr,
    seen: &Seen,
    a: &Answered,
    took: Duration,
) {
    let proto = match seen.version {
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    let (ingress, service) = a
        .route
        .as_ref()
        .map_or(("", ""), |r| (&*r.ingress, &*r.service));
    let _ = match format {
        Format::Json => json_line(
            out,
            (stamp, millis),
            client,
            seen,
            a,
            took,
            (proto, ingress, service),
        ),
        Format::Text => text_line(
            out,
            (stamp, millis),
            client,
            seen,
            a,
            took,
            (proto, ingress, service),
        ),
    };
}

fn json_line(
    out: &mut Vec<u8>,
    (stamp, millis): (&[u8; 19], u32),
    client: IpAddr,
    seen: &Seen,
    a: &Answered,
    took: Duration,
    (proto, ingress, service): (&str, &str, &str),
) -> std::io::Result<()> {
    out.extend_from_slice(b"{\"time\":\"");
    out.extend_from_slice(stamp);
    write!(out, ".{millis:03}Z\",\"client\":\"{client}\",\"host\":")?;
    json_str(out, &seen.host);
    write!(out, ",\"method\":\"{}\",\"path\":", seen.method)?;
    json_str(out, seen.path().as_bytes());
    write!(
        out,
        ",\"protocol\":\"{proto}\",\"status\":{},\"bytes\":",
        a.status
    )?;
    match a.bytes {
        Some(b) => write!(out, "{b}")?,
        None => out.extend_from_slice(b"null"),
    }
    write!(out, ",\"duration\":{:.6}", took.as_secs_f64())?;
    match a.upstream {
        Some(u) => write!(
            out,
            ",\"upstream\":\"{}\",\"upstream_status\":{},\"upstream_duration\":{:.6},\"retries\":{}",
            u.addr,
            u.status,
            u.duration.as_secs_f64(),
            u.retries
        )?,
        None => out.extend_from_slice(
            b",\"upstream\":null,\"upstream_status\":null,\"upstream_duration\":null,\"retries\":0",
        ),
    }
    out.extend_from_slice(b",\"request_id\":");
    json_str(out, seen.request_id());
    out.extend_from_slice(b",\"ingress\":");
    json_str(out, ingress.as_bytes());
    out.extend_from_slice(b",\"service\":");
    json_str(out, service.as_bytes());
    out.extend_from_slice(b"}\n");
    Ok(())
}

fn text_line(
    out: &mut Vec<u8>,
    (stamp, millis): (&[u8; 19], u32),
    client: IpAddr,
    seen: &Seen,
    a: &Answered,
    took: Duration,
    (proto, ingress, service): (&str, &str, &str),
) -> std::io::Result<()> {
    out.extend_from_slice(stamp);
    write!(out, ".{millis:03}Z access client={client} host=")?;
    text_value(out, &seen.host);
    write!(out, " method={} path=", seen.method)?;
    text_value(out, seen.path().as_bytes());
    write!(out, " protocol={proto} status={} bytes=", a.status)?;
    match a.bytes {
        Some(b) => write!(out, "{b}")?,
        None => out.push(b'-'),
    }
    write!(out, " duration={:.6}", took.as_secs_f64())?;
    match a.upstream {
        Some(u) => write!(
            out,
            " upstream={} upstream_status={} upstream_duration={:.6} retries={}",
            u.addr,
            u.status,
            u.duration.as_secs_f64(),
            u.retries
        )?,
        None => {
            out.extend_from_slice(b" upstream=- upstream_status=- upstream_duration=- retries=0")
        }
    }
    out.extend_from_slice(b" request_id=");
    text_value(out, seen.request_id());
    writeln!(
        out,
        " ingress={} service={}",
        or_dash(ingress),
        or_dash(service)
    )?;
    Ok(())
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// A text value: as it is when it has no space, quote or control byte; else JSON-quoted (so a
/// client cannot forge fields or lines).
fn text_value(out: &mut Vec<u8>, v: &[u8]) {
    if !v.is_empty() && v.iter().all(|&b| b > b' ' && b != b'"' && b < 0x7f) {
        out.extend_from_slice(v);
    } else {
        json_str(out, v);
    }
}

fn json_str(out: &mut Vec<u8>, v: &[u8]) {
    out.push(b'"');
    if v.iter()
        .all(|&b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.extend_from_slice(v);
    } else {
        for c in String::from_utf8_lossy(v).chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => {
                    let mut b = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
    }
    out.push(b'"');
}

/// Drains the buffers every [`FLUSH_EVERY`] (or when woken) until the log is dropped.
fn write_lines(shared: &Weak<Shared>, mut w: Box<dyn Write + Send>) {
    let mut spare: Vec<u8> = Vec::new();
    loop {
        let Some(sh) = shared.upgrade() else { return };
        {
            let (m, cv) = &sh.wake;
            let woken = lock(m);
            let (mut woken, _) = cv
                .wait_timeout_while(woken, FLUSH_EVERY, |w| !*w)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *woken = false;
        }
        for shard in &sh.shards {
            {
                let mut s = lock(shard);
                if s.buf.is_empty() {
                    continue;
                }
                std::mem::swap(&mut s.buf, &mut spare);
            }
            let _ = w.write_all(&spare);
            spare.clear();
            if spare.capacity() > 4 * WAKE_AT {
                spare = Vec::new();
            }
        }
        let _ = w.flush();
        // The last strong reference may be this one: the log was dropped meanwhile.
        if Arc::strong_count(&sh) == 1 {
            return;
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) for Unix seconds.
fn date_time(secs: u64) -> [u8; 19] {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = [0u8; 19];
    let s = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    );
    out.copy_from_slice(&s.as_bytes()[..19]);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn sample(format: Format) -> String {
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
        let mut out = Vec::new();
        line(
            &mut out,
            format,
            (&date_time(1_764_943_200), 123),
            "192.0.2.1".parse().unwrap(),
            &seen,
            &a,
            Duration::from_millis(2),
        );
        String::from_utf8(out).unwrap()
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
        assert_eq!(v["protocol"], "HTTP/1.1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes"], 1024);
        assert_eq!(v["upstream"], "10.0.0.1:8080");
        assert_eq!(v["upstream_status"], 200);
        assert_eq!(v["retries"], 1);
        assert_eq!(v["request_id"], "id \"1\"");
        assert_eq!(v["ingress"], "default/one");
        assert_eq!(v["service"], "default/svc:80");
        assert!(line.ends_with("}\n") && line.matches('\n').count() == 1);
        let mut odd = Vec::new();
        json_str(&mut odd, "a\"b\\c\nd\u{1}é".as_bytes());
        assert_eq!(
            serde_json::from_slice::<String>(&odd).unwrap(),
            "a\"b\\c\nd\u{1}é"
        );
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
        let mut v = Vec::new();
        text_value(&mut v, b"a b\nx=1");
        assert_eq!(v, b"\"a b\\nx=1\"");
        v.clear();
        text_value(&mut v, b"");
        assert_eq!(v, b"\"\"");
    }

    #[test]
    fn dates() {
        assert_eq!(&date_time(0), b"1970-01-01T00:00:00");
        assert_eq!(&date_time(951_782_400), b"2000-02-29T00:00:00");
        assert_eq!(&date_time(4_102_444_799), b"2099-12-31T23:59:59");
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
        assert_eq!(seen.request_id().len(), 32);
        assert_eq!(h.get("x-request-id").unwrap().as_bytes(), seen.request_id());
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
        while lock(&buf.0).iter().filter(|b| **b == b'\n').count() < 3 {
            assert!(Instant::now() < deadline, "lines were not written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(log.dropped(), 0);

        // A writer that never returns: the buffer fills, then lines are dropped, never awaited.
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
        let mut n = 0;
        while stuck.dropped() == 0 {
            stuck.record("127.0.0.1".parse().unwrap(), &seen, &a, Instant::now());
            n += 1;
            assert!(n < 1_000_000 && t.elapsed() < Duration::from_secs(20));
        }
    }
}
