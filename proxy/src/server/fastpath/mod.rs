//! The HTTP/1.1 fast path for client connections: body-less keep-alive requests (the bulk of
//! proxied traffic) are parsed, handled and answered by a loop in the connection task, with
//! one read buffer and one write buffer per connection. A request routed to an HTTP/1
//! upstream is forwarded field by field from its raw head, and so is the answer
//! (`direct.rs`); the rest go to the general handler as an `http::Request`.
//!
//! Everything else is handed to hyper, which serves the rest of the connection: a request with
//! a body, an `Upgrade` or `Expect`, HTTP/1.0, an absolute-form or `*` target, the HTTP/2
//! preface (cleartext prior knowledge), or a `Connection` option we do not know. The bytes
//! already read go with it ([`crate::io::prefixed::Prefixed`]), so hyper sees the connection as if
//! it had read it from the start.
//!
//! Kept from hyper's server: the header-read timeout (one deadline per request head; the idle
//! wait before its first byte runs under the ConfigMap's `keep-alive` when set, else under the
//! same timeout, and the head deadline then starts with that byte), `431` for a head
//! larger than the limit, `400` for a malformed one, a `Date` header, `Content-Length` or
//! chunked framing chosen from the body, and on shutdown idle connections closed while busy
//! ones finish their response (which says `Connection: close` while draining).
//!
//! A keep-alive connection idle for a second (`SHED_AFTER`) gives its read and write buffers
//! back and waits for its next request with none, as nginx does: idle connections are most of
//! a busy edge's connections, and their memory is mostly those buffers.

use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, Response, Uri};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::Instant;

use super::close_idle::IdleWatch;
use crate::handler::ConnInfo;
use crate::handler::direct::{self, Answer, FastReq};
use crate::handler::local::Local;
use crate::handler::respond::{respond, send_body};
use crate::handler::rules::ResponseRules;
use crate::io::finish::{self, Finish, finish};
use crate::state::dataplane::DataPlane;
use crate::telemetry::access_log;
use crate::upstream::body::RespBody;
use crate::wire::decode::{Span, fields, lists};
use crate::wire::field::Field;
use crate::wire::length;

/// Most header fields in a request head (as hyper's default).
const MAX_HEADERS: usize = 100;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 8 * 1024;
/// What a connection's head buffer starts with, and returns to between requests: most request
/// heads fit, and an idle keep-alive connection holds no more (a head that needs more gets it,
/// doubling, up to the header limit).
const HEAD_START: usize = 2 * 1024;
/// A response buffer that grew past this (a large coalesced body) is released after its
/// response instead of being kept by an idle connection.
const OUT_KEEP: usize = 16 * 1024;
/// How long a keep-alive connection waits for its next request before it gives its read and
/// write buffers back and waits for the first byte with none (as nginx frees an idle
/// connection's buffers). Not at once: a busy connection's next request is usually a
/// millisecond away, and it keeps its buffers rather than paying for new ones each time.
const SHED_AFTER: Duration = Duration::from_secs(1);
/// The stack buffer the first bytes of a request are read into after the buffers were shed.
const FIRST_READ: usize = 512;
/// The start of the HTTP/2 connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// What the fast path needs about its connection.
#[derive(Debug)]
pub struct FastPath {
    /// The data plane.
    pub dp: Arc<DataPlane>,
    /// The client connection.
    pub info: Arc<ConnInfo>,
    /// Time allowed to receive a request head.
    pub header_read_timeout: Duration,
    /// Largest request head.
    pub max_header_size: usize,
    /// Says when idle connections must close (graceful shutdown).
    pub close_idle: IdleWatch,
    /// How long the connection may wait, idle, for the next request's first byte (the
    /// ConfigMap's `keep-alive`; else the head deadline).
    pub idle_timeout: Duration,
    /// Requests served on the connection so far, and the most it may serve (the ConfigMap's
    /// `keep-alive-requests`): the last one is answered with `Connection: close`.
    pub requests: (u32, Option<u32>),
}

/// How the fast path left a connection.
#[derive(Debug)]
pub enum Outcome<I> {
    /// Closed: by the client, after `Connection: close`, a timeout, an answered bad request,
    /// an error, or shutdown.
    Closed,
    /// A request the fast path does not serve: the stream and every byte read from it that
    /// was not consumed, for hyper to serve from here on.
    HandOver(I, Bytes),
}

/// A parsed request head. The size difference between variants is deliberate: boxing the
/// request would cost an allocation per request on the hot path, for a value that lives on
/// the stack for one return.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Parsed {
    /// More bytes needed.
    Partial,
    /// Served here.
    Fast(FastReq),
    /// Served by hyper.
    Other,
}

/// Parses the head at the front of `buf` (consumed only for [`Parsed::Fast`]).
pub(crate) fn parse(
    buf: &mut BytesMut,
    spans: &mut Vec<Span>,
    max: usize,
) -> Result<Parsed, Local<'static>> {
    if buf.starts_with(H2_PREFACE) || H2_PREFACE.starts_with(buf) {
        return Ok(if buf.len() >= H2_PREFACE.len() {
            Parsed::Other
        } else {
            Parsed::Partial
        });
    }
    let mut raw = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let n = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut raw)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > max => {
            return Err(Local::HeadTooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Local::HeadTooLarge);
        }
        // HTTP/0.9 and HTTP/2-looking lines and the like: let hyper give its answer.
        Err(httparse::Error::Version) => return Ok(Parsed::Other),
        Err(_) => return Err(Local::MalformedHead),
    };
    if n > max {
        return Err(Local::HeadTooLarge);
    }
    let (Some(method), Some(path), Some(1)) = (req.method, req.path, req.version) else {
        return Ok(Parsed::Other);
    };
    if !path.starts_with('/') {
        return Ok(Parsed::Other);
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Ok(Parsed::Other);
    };
    let base = buf.as_ptr() as usize;
    let mut keep_alive = true;
    let (mut hosts, mut host) = (0, (0, 0));
    spans.clear();
    for h in req.headers.iter() {
        let name = h.name;
        match Field::of(name.as_bytes()) {
            Field::ContentLength if length::one(h.value) != Ok(0) => return Ok(Parsed::Other),
            Field::TransferEncoding | Field::Upgrade | Field::Expect => return Ok(Parsed::Other),
            Field::Host => {
                hosts += 1;
                if hosts == 1 {
                    let start = h.value.as_ptr() as usize - base;
                    host = (start, start + h.value.len());
                }
            }
            Field::Connection => {
                for t in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if t.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if !t.eq_ignore_ascii_case(b"keep-alive") && !t.is_empty() {
                        return Ok(Parsed::Other);
                    }
                }
            }
            _ => {}
        }
        let ns = (name.as_ptr() as usize - base) as u32;
        let vs = (h.value.as_ptr() as usize - base) as u32;
        spans.push([ns, ns + name.len() as u32, vs, vs + h.value.len() as u32]);
    }
    let path_start = path.as_ptr() as usize - base;
    let path_end = path_start + path.len();
    let head = buf.split_to(n).freeze();
    let uri = Uri::from_maybe_shared(head.slice(path_start..path_end))
        .map_err(|_| Local::MalformedHead)?;
    Ok(Parsed::Fast(FastReq {
        head,
        method,
        uri,
        hosts,
        host,
        keep_alive,
        request_id: None,
    }))
}

/// What the access log needs of a fast-path request. A request without `X-Request-ID` gets
/// one, which the upstream will be sent too.
fn seen(req: &mut FastReq, spans: &[Span]) -> access_log::Seen {
    let host = req.head.slice(req.host.0..req.host.1);
    let client_id = fields(&req.head, spans)
        .find(|(n, _)| Field::of(n) == Field::XRequestId)
        .map(|(_, id)| req.head.slice_ref(id));
    if client_id.is_none() {
        req.request_id = Some(crate::wire::forwarded::new_request_id());
    }
    access_log::Seen::raw(&req.method, &req.uri, host, client_id, req.request_id)
}

/// A local answer that ends the connection (bad request, head too large), from the one
/// table ([`Local`]).
async fn refuse<I: AsyncWrite + Unpin + Finish>(
    io: &mut I,
    out: &mut BytesMut,
    resp: Response<RespBody>,
) {
    if let Ok(clean) = respond(io, out, resp, false, true).await {
        let _ = finish(io, out, clean).await;
    }
}

/// Runs `fut` (the request's handling) while watching the client: a client that closes its
/// connection (or resets it) before the answer cancels the request — the upstream request is
/// dropped and its connection not reused — as hyper's server does. Pipelined bytes that arrive
/// meanwhile are kept in `rbuf` (up to `limit` bytes; beyond that the client is no longer read
/// until the answer is out). `None`: the client went away.
async fn watching<I: AsyncRead + Unpin, T>(
    io: &mut I,
    rbuf: &mut BytesMut,
    limit: usize,
    mut fut: Pin<&mut impl Future<Output = T>>,
) -> Option<T> {
    loop {
        let watch = rbuf.len() < limit;
        tokio::select! {
            biased;
            resp = &mut fut => return Some(resp),
            read = io.read_buf(rbuf), if watch => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

/// Which deadline the wait for a request head runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    /// No byte of the next head yet: the keep-alive time, its first [`SHED_AFTER`] with the
    /// buffers held.
    Idle,
    /// A head has begun: the head deadline.
    Head,
}

/// How the wait for the next request's first bytes ended.
#[derive(Debug, PartialEq, Eq)]
enum Wait {
    /// Bytes came; they are in the read buffer.
    Bytes,
    /// The client closed the connection, or it failed.
    Gone,
    /// The keep-alive time ran out, or shutdown asked idle connections to close: the
    /// connection ends with a goodbye ([`goodbye`]).
    Expired,
}

/// Waits, holding no buffer, for the first bytes of the next request head and puts them in
/// `rbuf` (empty, and given its start size here).
async fn first_bytes<I: AsyncRead + Unpin>(
    io: &mut I,
    rbuf: &mut BytesMut,
    timer: Pin<&mut tokio::time::Sleep>,
    close_idle: &IdleWatch,
) -> Wait {
    let mut first = [0u8; FIRST_READ];
    tokio::select! {
        biased;
        r = io.read(&mut first) => match r {
            Ok(n) if n > 0 => {
                rbuf.reserve(HEAD_START);
                rbuf.extend_from_slice(&first[..n]);
                Wait::Bytes
            }
            _ => Wait::Gone,
        },
        () = timer => Wait::Expired,
        () = close_idle.closing() => Wait::Expired,
    }
}

/// Ends an idle keep-alive connection that sluice closes (its keep-alive time is over, or
/// shutdown): over TLS with `close_notify`, as nginx does, so that the client sees a clean end
/// rather than a truncation; one try ([`finish::goodbye`]). A connection whose head deadline
/// passed mid-head (a slow or stalled client) gets no goodbye, as nginx closes timed-out
/// connections quietly.
async fn goodbye<I: AsyncWrite + Unpin + Finish>(io: &mut I) -> Outcome<I> {
    finish::goodbye(io).await;
    Outcome::Closed
}

/// Serves `io` until it closes or needs hyper.
pub async fn serve<I>(mut io: I, fp: &mut FastPath) -> Outcome<I>
where
    I: AsyncRead + AsyncWrite + Unpin + Finish,
{
    let mut rbuf = BytesMut::with_capacity(HEAD_START);
    let mut out = BytesMut::new();
    let mut spans = Vec::new();
    let timer = tokio::time::sleep(fp.header_read_timeout);
    tokio::pin!(timer);
    loop {
        let mut deadline = None;
        // When the keep-alive time ends (set when the wait for this head turns idle).
        let mut idle_end = None;
        let parsed = loop {
            if !rbuf.is_empty() {
                match parse(&mut rbuf, &mut spans, fp.max_header_size) {
                    Ok(Parsed::Partial) => {}
                    Ok(p) => break p,
                    Err(local) => {
                        refuse(&mut io, &mut out, local.response()).await;
                        return Outcome::Closed;
                    }
                }
            }
            if rbuf.capacity() - rbuf.len() < HEAD_START / 4 {
                // Grow as the head needs: double what is held (at least the start size).
                rbuf.reserve(rbuf.len().max(HEAD_START));
            }
            // A read that is ready needs no timer; only waiting arms the head deadline.
            let ready = poll_fn(|cx| {
                Poll::Ready(tokio_util::io::poll_read_buf(
                    Pin::new(&mut io),
                    cx,
                    &mut rbuf,
                ))
            })
            .await;
            let read = match ready {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    if rbuf.is_empty() && fp.close_idle.is_closing() {
                        return goodbye(&mut io).await;
                    }
                    // Idle (no byte of the next head yet): the keep-alive time, the buffers
                    // shed after the first SHED_AFTER of it; once a head has begun, the head
                    // deadline, from then.
                    let idle = rbuf.is_empty();
                    if idle && deadline.is_none() {
                        let now = Instant::now();
                        let end = now + fp.idle_timeout;
                        idle_end = Some(end);
                        timer.as_mut().reset(end.min(now + SHED_AFTER));
                        deadline = Some(Deadline::Idle);
                    } else if !idle && deadline != Some(Deadline::Head) {
                        timer
                            .as_mut()
                            .reset(Instant::now() + fp.header_read_timeout);
                        deadline = Some(Deadline::Head);
                    }
                    tokio::select! {
                        biased;
                        r = io.read_buf(&mut rbuf) => r,
                        () = &mut timer => {
                            let Some(end) = idle_end.filter(|&e| idle && Instant::now() < e)
                            else {
                                if idle {
                                    return goodbye(&mut io).await;
                                }
                                return Outcome::Closed;
                            };
                            // Idle for SHED_AFTER: give the buffers back and wait for the
                            // rest of the keep-alive time with none.
                            (rbuf, out, spans) = (BytesMut::new(), BytesMut::new(), Vec::new());
                            timer.as_mut().reset(end);
                            match first_bytes(&mut io, &mut rbuf, timer.as_mut(), &fp.close_idle)
                                .await
                            {
                                Wait::Bytes => continue,
                                Wait::Gone => return Outcome::Closed,
                                Wait::Expired => return goodbye(&mut io).await,
                            }
                        }
                        () = fp.close_idle.closing(), if idle => return goodbye(&mut io).await,
                    }
                }
            };
            match read {
                Ok(0) | Err(_) => return Outcome::Closed,
                Ok(_) => {}
            }
        };
        let mut req = match parsed {
            Parsed::Fast(r) => r,
            Parsed::Other | Parsed::Partial => return Outcome::HandOver(io, rbuf.freeze()),
        };
        let logging = fp
            .dp
            .access_log()
            .map(|_| (seen(&mut req, &spans), std::time::Instant::now()));
        fp.requests.0 = fp.requests.0.saturating_add(1);
        if fp.requests.1.is_some_and(|max| fp.requests.0 >= max) {
            // `keep-alive-requests`: this is the connection's last request.
            req.keep_alive = false;
        }
        let (keep_alive, head_request) = (req.keep_alive, req.is_head());
        let limit = fp.max_header_size.saturating_add(READ_SIZE);
        // Pinned where it is made: the handling future is large, and moving it into
        // `watching` cost a copy per request.
        let answer = {
            let handling = direct::dispatch(&fp.dp, &fp.info, req, &mut spans, timer.as_mut());
            tokio::pin!(handling);
            watching(&mut io, &mut rbuf, limit, handling.as_mut()).await
        };
        let Some(answer) = answer else {
            return Outcome::Closed;
        };
        let mut answered = None;
        let written = match answer {
            Answer::Direct(d) => {
                let close = !keep_alive || ResponseRules::draining(&fp.dp, true);
                if logging.is_some() {
                    answered = Some(d.answered());
                }
                let (body, framing) = d.write_head(&mut out, &spans, head_request, close);
                if let Some(a) = answered.as_mut() {
                    a.bytes = framing.declared();
                }
                (
                    send_body(&mut io, &mut out, body, framing, close).await,
                    close,
                )
            }
            Answer::General(resp) => {
                if logging.is_some() {
                    answered = Some(access_log::Answered::of(&resp));
                }
                let close = !keep_alive || lists(resp.headers(), &header::CONNECTION, "close");
                (
                    respond(&mut io, &mut out, resp, head_request, close).await,
                    close,
                )
            }
        };
        // A closing answer's last bytes and the close leave together, before the log records
        // the answer (its time runs to the last byte, as nginx's `$request_time` does).
        if let (Ok(clean), true) = &written {
            let _ = finish(&mut io, &out, *clean).await;
        }
        if let (Some((seen, started)), Some(a), Some(log)) =
            (&logging, &answered, fp.dp.access_log())
        {
            log.record(fp.info.remote.ip(), seen, a, *started);
        }
        if !matches!(written, (Ok(true), false)) {
            // Closed above, or an answer cut short (its bytes are out), or a write that failed
            // (the send timeout among others): the socket closes without a goodbye. A TLS
            // `close_notify` would tell the client that a cut answer ended cleanly, and after
            // a failed write it would wait on a client that stopped reading.
            return Outcome::Closed;
        }
        // Between requests an idle connection keeps small buffers, whatever the last request
        // needed.
        if rbuf.is_empty() && rbuf.capacity() > 2 * HEAD_START {
            rbuf = BytesMut::with_capacity(HEAD_START);
        }
        if out.capacity() > OUT_KEEP {
            out = BytesMut::new();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(raw: &str) -> Result<Parsed, Local<'static>> {
        parse(&mut BytesMut::from(raw), &mut Vec::new(), 8192)
    }

    #[test]
    fn plain_requests_take_the_fast_path() {
        let mut buf =
            BytesMut::from("GET /a?b=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /next");
        let Ok(Parsed::Fast(r)) = parse(&mut buf, &mut Vec::new(), 8192) else {
            panic!("not fast");
        };
        assert_eq!(r.uri, "/a?b=1");
        assert_eq!(&r.head[r.host.0..r.host.1], b"x");
        assert_eq!(r.hosts, 1);
        assert!(!r.keep_alive && !r.is_head());
        assert_eq!(&buf[..], b"GET /next", "the pipelined rest stays");
        let Ok(Parsed::Fast(r)) = p("HEAD / HTTP/1.1\r\n\r\n") else {
            panic!("not fast");
        };
        assert!(r.keep_alive && r.is_head() && r.hosts == 0);
        assert!(matches!(
            p("DELETE / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            Ok(Parsed::Fast(..))
        ));
    }

    #[test]
    fn everything_else_goes_to_hyper_untouched() {
        for raw in [
            "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "PUT / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(raw);
            let before = buf.clone();
            assert!(
                matches!(parse(&mut buf, &mut Vec::new(), 8192), Ok(Parsed::Other)),
                "{raw:?}"
            );
            assert_eq!(buf, before, "nothing consumed for {raw:?}");
        }
        assert!(matches!(p("PRI * HTT"), Ok(Parsed::Partial)));
    }

    #[test]
    fn bad_and_oversized_heads_are_refused() {
        assert_eq!(
            p("GET / HTTP/1.1\r\nBad Header\r\n\r\n")
                .err()
                .map(|l| l.status()),
            Some(http::StatusCode::BAD_REQUEST)
        );
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(9000));
        assert_eq!(
            p(&big).err().map(|l| l.status()),
            Some(http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        assert!(matches!(
            p("GET / HTTP/1.1\r\nHost: x\r\n"),
            Ok(Parsed::Partial)
        ));
    }
}

#[cfg(test)]
mod shed_tests;
