//! The backends' lean path: a plain keep-alive `GET` is answered straight from the socket
//! with a canned response, and anything else hands the connection (with the bytes already
//! read) to hyper.
//!
//! Why: in the capacity scenarios the backends share the load CPUs with the load generator.
//! Through hyper they took about half of that core (7–8 µs a request), so at high rates the
//! generator, not the proxy under test, was the limit and every peer's figure was capped by
//! the harness. The canned answer is byte-for-byte what hyper sends for the same request
//! (status, `x-backend`, `content-length`, `date`), so peers see the same pods either way.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::query_param;

/// Unanswered bytes past this go to hyper, which answers an over-long head properly.
const MAX_HEAD: usize = 64 * 1024;
/// Headers a simple request may carry (more: hyper decides).
const MAX_HEADERS: usize = 64;

/// The fixed part of a backend's usual answer.
#[derive(Debug, Clone)]
pub(crate) struct Canned {
    /// Status line, `x-backend` and `content-length`, each ending in CRLF.
    head: Bytes,
    /// The body every simple request gets.
    body: Bytes,
}

impl Canned {
    /// The answer a backend named `name` gives with `body` (no `x-backend` when the name is
    /// not a valid header value, as the hyper path does).
    pub(crate) fn new(name: &str, body: Bytes) -> Self {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        if http::HeaderValue::from_str(name).is_ok() {
            head.extend_from_slice(b"x-backend: ");
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        Self {
            head: Bytes::from(head),
            body,
        }
    }

    /// Status line, `x-backend` and `content-length`, each ending in CRLF: the fields that
    /// close the head (and its blank line) are the caller's.
    pub(crate) fn head(&self) -> &[u8] {
        &self.head
    }

    /// The body.
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }
}

/// How the lean path left the connection.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Closed (by the client, an error, `Connection: close` or a graceful stop).
    Closed,
    /// A request the lean path does not answer: hyper takes the connection from these bytes.
    HandOver(Bytes),
}

/// What the buffer starts with.
#[derive(Debug, PartialEq)]
enum Parsed {
    /// A complete simple request of `len` bytes; `close` if it asked to close.
    Simple { len: usize, close: bool },
    /// Not a whole head yet.
    Partial,
    /// Anything else: a body, an upgrade, a query that changes the answer, HTTP/1.0, HTTP/2,
    /// another method, a malformed head.
    Other,
}

fn parse(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    if req.method != Some("GET") || req.version != Some(1) {
        return Parsed::Other;
    }
    let Some(target) = req.path else {
        return Parsed::Other;
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if path == "/echo"
        || ["delay_ms", "status", "size"]
            .iter()
            .any(|k| query_param(query, k).is_some())
    {
        return Parsed::Other;
    }
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(h.value);
            if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")) {
                close = true;
            } else if v
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            {
                return Parsed::Other;
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            if h.value != b"0" {
                return Parsed::Other;
            }
        } else if ["transfer-encoding", "upgrade", "expect"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            return Parsed::Other;
        }
    }
    Parsed::Simple { len, close }
}

/// The `date` value, formatted once a second.
#[derive(Debug, Default)]
struct DateCache {
    secs: u64,
    text: String,
}

impl DateCache {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let secs = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        if secs != self.secs || self.text.is_empty() {
            self.secs = secs;
            self.text = httpdate::fmt_http_date(now);
        }
        self.text.as_bytes()
    }
}

/// Answers simple requests on `stream` until it closes or a request needs hyper. A graceful
/// stop (`stop` turning true) closes the connection when it is idle, or right after the
/// answer in progress (which then says `connection: close`), as hyper's graceful shutdown
/// does.
pub(crate) async fn serve(
    stream: &mut TcpStream,
    canned: &Canned,
    count: &AtomicU64,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let mut buf = BytesMut::with_capacity(4096);
    let mut head = Vec::with_capacity(canned.head.len() + 64);
    let mut date = DateCache::default();
    loop {
        // Answer every whole request already here (pipelined ones included).
        loop {
            match parse(&buf) {
                Parsed::Simple { len, close } => {
                    buf.advance(len);
                    count.fetch_add(1, Ordering::Relaxed);
                    let closing = close || *stop.borrow();
                    head.clear();
                    head.extend_from_slice(&canned.head);
                    if closing {
                        head.extend_from_slice(b"connection: close\r\n");
                    }
                    head.extend_from_slice(b"date: ");
                    head.extend_from_slice(date.now());
                    head.extend_from_slice(b"\r\n\r\n");
                    let mut out = Buf::chain(&head[..], &canned.body[..]);
                    if stream.write_all_buf(&mut out).await.is_err() || closing {
                        return Outcome::Closed;
                    }
                }
                Parsed::Partial if buf.len() < MAX_HEAD => break,
                Parsed::Partial | Parsed::Other => return Outcome::HandOver(buf.freeze()),
            }
        }
        let read = if buf.is_empty() {
            tokio::select! {
                r = stream.read_buf(&mut buf) => r,
                _ = stop.wait_for(|s| *s) => return Outcome::Closed,
            }
        } else {
            stream.read_buf(&mut buf).await
        };
        match read {
            Ok(0) | Err(_) => return Outcome::Closed,
            Ok(_) => {}
        }
    }
}

/// A connection handed to hyper: the bytes the lean path read, then the socket.
#[derive(Debug)]
pub(crate) struct Rewound {
    prefix: Bytes,
    io: TcpStream,
}

impl Rewound {
    pub(crate) fn new(prefix: Bytes, io: TcpStream) -> Self {
        Self { prefix, io }
    }
}

impl AsyncRead for Rewound {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::{Parsed, parse};

    #[test]
    fn only_plain_keep_alive_gets_are_simple() {
        let simple = |s: &str| parse(s.as_bytes());
        let get = "GET /x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            simple(get),
            Parsed::Simple {
                len: get.len(),
                close: false
            }
        );
        let close = "GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Close\r\n\r\nGET";
        assert_eq!(
            simple(close),
            Parsed::Simple {
                len: close.len() - 3,
                close: true
            }
        );
        assert_eq!(simple("GET / HTTP/1.1\r\nHost: h\r\n"), Parsed::Partial);
        for other in [
            "HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: h\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
            "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
            "GET /echo HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /?delay_ms=5 HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /?a=1&status=503 HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /?size=10 HTTP/1.1\r\nHost: h\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            assert_eq!(simple(other), Parsed::Other, "{other:?}");
        }
    }
}
