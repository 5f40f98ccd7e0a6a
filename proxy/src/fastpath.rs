//! The HTTP/1.1 fast path for client connections: body-less keep-alive requests (the bulk of
//! proxied traffic) are parsed, handled and answered by a loop in the connection task, with
//! one read buffer and one write buffer per connection and no per-request allocation beyond
//! the header map.
//!
//! Everything else is handed to hyper, which serves the rest of the connection: a request with
//! a body, an `Upgrade` or `Expect`, HTTP/1.0, an absolute-form or `*` target, the HTTP/2
//! preface (cleartext prior knowledge), or a `Connection` option we do not know. The bytes
//! already read go with it ([`crate::prefixed::Prefixed`]), so hyper sees the connection as if
//! it had read it from the start.
//!
//! Kept from hyper's server: the header-read timeout (one deadline per request head, from
//! when the server starts waiting for it, idle keep-alive time included), `431` for a head
//! larger than the limit, `400` for a malformed one, a `Date` header, `Content-Length` or
//! chunked framing chosen from the body, and on shutdown idle connections closed while busy
//! ones finish their response (which says `Connection: close` while draining).

use std::cell::RefCell;
use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use http::header;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::RespBody;
use crate::dataplane::DataPlane;
use crate::forward::{ConnInfo, handle};
use crate::h1::decode::{Span, header_map, lists};
use crate::h1::encode::put_field;

/// Most header fields in a request head (as hyper's default).
const MAX_HEADERS: usize = 100;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 8 * 1024;
/// Body bytes gathered behind the response head before a write.
const COALESCE: usize = 64 * 1024;
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
    /// Turns true when idle connections must close (graceful shutdown).
    pub close_idle: watch::Receiver<bool>,
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
enum Parsed {
    /// More bytes needed.
    Partial,
    /// Served here: the request, whether the client keeps the connection, a `HEAD`.
    Fast(Request<Option<Incoming>>, bool, bool),
    /// Served by hyper.
    Other,
}

fn is_name(name: &str, known: &str) -> bool {
    name.eq_ignore_ascii_case(known)
}

/// Parses the head at the front of `buf` (consumed only for [`Parsed::Fast`]).
fn parse(buf: &mut BytesMut, spans: &mut Vec<Span>, max: usize) -> Result<Parsed, StatusCode> {
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
            return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        }
        // HTTP/0.9 and HTTP/2-looking lines and the like: let hyper give its answer.
        Err(httparse::Error::Version) => return Ok(Parsed::Other),
        Err(_) => return Err(StatusCode::BAD_REQUEST),
    };
    if n > max {
        return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
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
    spans.clear();
    for h in req.headers.iter() {
        let name = h.name;
        if is_name(name, "content-length") {
            if h.value.trim_ascii() != b"0" {
                return Ok(Parsed::Other);
            }
        } else if is_name(name, "transfer-encoding")
            || is_name(name, "upgrade")
            || is_name(name, "expect")
        {
            return Ok(Parsed::Other);
        } else if is_name(name, "connection") {
            for t in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if t.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if !t.eq_ignore_ascii_case(b"keep-alive") && !t.is_empty() {
                    return Ok(Parsed::Other);
                }
            }
        }
        let ns = (name.as_ptr() as usize - base) as u32;
        let vs = (h.value.as_ptr() as usize - base) as u32;
        spans.push([ns, ns + name.len() as u32, vs, vs + h.value.len() as u32]);
    }
    let path_start = path.as_ptr() as usize - base;
    let path_end = path_start + path.len();
    let head = buf.split_to(n).freeze();
    let uri = Uri::from_maybe_shared(head.slice(path_start..path_end))
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let headers = header_map(&head, spans, 0).ok_or(StatusCode::BAD_REQUEST)?;
    let head_request = method == Method::HEAD;
    let mut r = Request::new(None);
    *r.method_mut() = method;
    *r.uri_mut() = uri;
    *r.version_mut() = Version::HTTP_11;
    *r.headers_mut() = headers;
    Ok(Parsed::Fast(r, keep_alive, head_request))
}

thread_local! {
    /// The `Date` value for the current second, per worker thread.
    static DATE: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

fn put_date(out: &mut BytesMut) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            d.1 = httpdate::fmt_http_date(now).into_bytes();
            d.0 = secs;
        }
        out.put_slice(b"date: ");
        out.put_slice(&d.1);
        out.put_slice(b"\r\n");
    });
}

/// A short local answer that ends the connection (bad request, head too large).
async fn refuse<I: AsyncWrite + Unpin>(io: &mut I, status: StatusCode) {
    let reason = status.canonical_reason().unwrap_or("");
    let msg = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-length: 0\r\nconnection: close\r\nserver: sluice\r\n\r\n",
        status.as_str()
    );
    let _ = io.write_all(msg.as_bytes()).await;
    let _ = io.shutdown().await;
}

/// Writes the response; returns whether the connection is still clean (body complete and as
/// long as announced).
async fn respond<I: AsyncWrite + Unpin>(
    io: &mut I,
    out: &mut BytesMut,
    resp: Response<RespBody>,
    head_request: bool,
    close: bool,
) -> std::io::Result<bool> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    let bodyless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    out.clear();
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.put_slice(b"\r\n");
    let (mut has_date, mut has_connection) = (false, false);
    let mut declared: Option<u64> = None;
    for (name, value) in &parts.headers {
        if *name == header::TRANSFER_ENCODING {
            continue;
        }
        if *name == header::CONTENT_LENGTH {
            // A list form (`3, 3`, which the upstream client accepts when the values agree) is
            // not copied: the length is written once below, from the body.
            if declared.is_some() {
                continue;
            }
            declared = std::str::from_utf8(value.as_bytes())
                .ok()
                .and_then(|v| v.trim().parse().ok());
            if declared.is_none() {
                continue;
            }
        }
        has_date |= *name == header::DATE;
        has_connection |= *name == header::CONNECTION;
        put_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if !has_date {
        put_date(out);
    }
    let mut chunked = false;
    if !bodyless && declared.is_none() {
        match body.size_hint().exact() {
            Some(n) => {
                put_field(
                    out,
                    b"content-length",
                    itoa::Buffer::new().format(n).as_bytes(),
                );
                declared = Some(n);
            }
            None => {
                out.put_slice(b"transfer-encoding: chunked\r\n");
                chunked = true;
            }
        }
    }
    if close && !has_connection {
        out.put_slice(b"connection: close\r\n");
    }
    out.put_slice(b"\r\n");
    if bodyless {
        drop(body);
        io.write_all(out).await?;
        io.flush().await?;
        return Ok(true);
    }
    let mut sent: u64 = 0;
    let clean = loop {
        let polled = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        let next = match polled {
            Poll::Ready(f) => f,
            Poll::Pending => {
                // Nothing more right now: send what we have while the body makes progress.
                io.write_all(out).await?;
                io.flush().await?;
                out.clear();
                poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            }
        };
        match next {
            None => break declared.is_none_or(|d| d == sent),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "response body failed; closing the connection");
                break false;
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                sent += data.len() as u64;
                if declared.is_some_and(|d| sent > d) {
                    break false;
                }
                if chunked {
                    out.put_slice(format!("{:x}\r\n", data.len()).as_bytes());
                }
                if out.len() + data.len() <= COALESCE {
                    out.put_slice(&data);
                } else {
                    io.write_all(out).await?;
                    out.clear();
                    io.write_all(&data).await?;
                }
                if chunked {
                    out.put_slice(b"\r\n");
                }
            }
        }
    };
    if clean && chunked {
        out.put_slice(b"0\r\n\r\n");
    }
    io.write_all(out).await?;
    io.flush().await?;
    out.clear();
    Ok(clean)
}

/// Handles `req` while watching the client: a client that closes its connection (or resets
/// it) before the answer cancels the request — the upstream request is dropped and its
/// connection not reused — as hyper's server does. Pipelined bytes that arrive meanwhile are
/// kept in `rbuf` (up to one head's worth; beyond that the client is no longer read until
/// the answer is out). `None`: the client went away.
async fn handle_watching<I: AsyncRead + Unpin>(
    io: &mut I,
    rbuf: &mut BytesMut,
    fp: &FastPath,
    req: Request<Option<Incoming>>,
) -> Option<Response<RespBody>> {
    let fut = handle(Arc::clone(&fp.dp), Arc::clone(&fp.info), req);
    tokio::pin!(fut);
    let limit = fp.max_header_size.saturating_add(READ_SIZE);
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

/// Serves `io` until it closes or needs hyper.
pub async fn serve<I>(mut io: I, fp: &mut FastPath) -> Outcome<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut rbuf = BytesMut::with_capacity(READ_SIZE);
    let mut out = BytesMut::with_capacity(READ_SIZE);
    let mut spans = Vec::new();
    let timer = tokio::time::sleep(fp.header_read_timeout);
    tokio::pin!(timer);
    loop {
        let mut deadline_set = false;
        let parsed = loop {
            if !rbuf.is_empty() {
                match parse(&mut rbuf, &mut spans, fp.max_header_size) {
                    Ok(Parsed::Partial) => {}
                    Ok(p) => break p,
                    Err(status) => {
                        refuse(&mut io, status).await;
                        return Outcome::Closed;
                    }
                }
            }
            if rbuf.capacity() - rbuf.len() < READ_SIZE / 4 {
                rbuf.reserve(READ_SIZE);
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
                    if rbuf.is_empty() && *fp.close_idle.borrow() {
                        return Outcome::Closed;
                    }
                    if !deadline_set {
                        timer
                            .as_mut()
                            .reset(Instant::now() + fp.header_read_timeout);
                        deadline_set = true;
                    }
                    let idle = rbuf.is_empty();
                    tokio::select! {
                        biased;
                        r = io.read_buf(&mut rbuf) => r,
                        () = &mut timer => return Outcome::Closed,
                        _ = fp.close_idle.changed(), if idle => return Outcome::Closed,
                    }
                }
            };
            match read {
                Ok(0) | Err(_) => return Outcome::Closed,
                Ok(_) => {}
            }
        };
        let (req, keep_alive, head_request) = match parsed {
            Parsed::Fast(r, k, h) => (r, k, h),
            Parsed::Other | Parsed::Partial => return Outcome::HandOver(io, rbuf.freeze()),
        };
        let Some(resp) = handle_watching(&mut io, &mut rbuf, fp, req).await else {
            return Outcome::Closed;
        };
        let close = !keep_alive || lists(resp.headers(), &header::CONNECTION, "close");
        match respond(&mut io, &mut out, resp, head_request, close).await {
            Ok(true) if !close => {}
            _ => {
                let _ = io.shutdown().await;
                return Outcome::Closed;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(raw: &str) -> Result<Parsed, StatusCode> {
        parse(&mut BytesMut::from(raw), &mut Vec::new(), 8192)
    }

    #[test]
    fn plain_requests_take_the_fast_path() {
        let mut buf =
            BytesMut::from("GET /a?b=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /next");
        let Ok(Parsed::Fast(r, keep_alive, head)) = parse(&mut buf, &mut Vec::new(), 8192) else {
            panic!("not fast");
        };
        assert_eq!(r.uri(), "/a?b=1");
        assert_eq!(r.headers()["host"], "x");
        assert!(!keep_alive && !head);
        assert_eq!(&buf[..], b"GET /next", "the pipelined rest stays");
        assert!(matches!(
            p("HEAD / HTTP/1.1\r\n\r\n"),
            Ok(Parsed::Fast(_, true, true))
        ));
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

    #[tokio::test]
    async fn content_length_is_written_once() {
        for lengths in [&["3, 3"][..], &["3", "3"]] {
            let mut resp = Response::new(RespBody::full("abc"));
            for l in lengths {
                resp.headers_mut()
                    .append(header::CONTENT_LENGTH, l.parse().unwrap());
            }
            let (mut io, mut out) = (Vec::new(), BytesMut::new());
            assert!(
                respond(&mut io, &mut out, resp, false, false)
                    .await
                    .unwrap()
            );
            let text = String::from_utf8(io).unwrap();
            assert_eq!(text.matches("content-length").count(), 1, "{text}");
            assert!(text.contains("content-length: 3\r\n"), "{text}");
        }
    }

    #[test]
    fn bad_and_oversized_heads_are_refused() {
        assert_eq!(
            p("GET / HTTP/1.1\r\nBad Header\r\n\r\n").err(),
            Some(StatusCode::BAD_REQUEST)
        );
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(9000));
        assert_eq!(
            p(&big).err(),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        assert!(matches!(
            p("GET / HTTP/1.1\r\nHost: x\r\n"),
            Ok(Parsed::Partial)
        ));
    }
}
