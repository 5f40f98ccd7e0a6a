//! One upstream HTTP/1.1 connection: its socket, its read buffer, and sending a request on it.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, Kind, Side};
use crate::upstream::body::ReqBody;
use crate::wire::decode::{Head, RawHead, Span, parse_raw};
use crate::wire::encode::{ReqFraming, chunk_size_line, last_chunk};

/// Bytes asked of the socket per read.
const READ_SIZE: usize = 8 * 1024;

/// The socket under an upstream connection.
#[derive(Debug)]
pub enum UpIo {
    /// Cleartext TCP.
    Plain(TcpStream),
    /// TLS to the pod.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpIo::Plain(s) => s.is_write_vectored(),
            UpIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An upstream connection between requests, or carrying one.
#[derive(Debug)]
pub struct H1Conn {
    io: UpIo,
    /// Bytes read but not yet consumed (the start of a response, or its body).
    pub(super) rbuf: BytesMut,
    /// Scratch space for response head parsing.
    spans: Vec<Span>,
}

impl H1Conn {
    /// Wraps a connected (and, for HTTPS, handshaken) socket.
    pub fn new(io: UpIo) -> Self {
        Self {
            io,
            rbuf: BytesMut::with_capacity(READ_SIZE),
            spans: Vec::new(),
        }
    }

    /// Reads more into the buffer; `Ok(0)` is end of stream.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_SIZE / 4 {
            self.rbuf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf)
    }

    /// Whether no byte past the last response has been read (a precondition for reuse).
    pub fn is_clean(&self) -> bool {
        self.rbuf.is_empty()
    }

    /// Whether an idle connection can carry a request: nothing unread, and the peer has not
    /// closed it (checked without a system call unless the socket was reported readable).
    /// The probe reads into a few bytes on the stack, not the read buffer, so checking a
    /// connection that has [shed](H1Conn::shed) its buffer does not grow it back: any byte
    /// that arrives unasked makes the connection unusable anyway.
    pub fn is_usable(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [0u8; 64];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut probe)
            .is_pending()
    }

    /// Gives back the read buffer and the head-parsing scratch of a connection that waits in
    /// the idle pool (its buffer is empty: only clean connections are pooled). The next
    /// response read allocates them again; the pool's sweep calls this for connections that
    /// have been idle a while, so a busy connection never pays for it.
    pub fn shed(&mut self) {
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
            self.spans = Vec::new();
        }
    }

    /// Bytes this connection holds in its buffers (capacity), for the tests of shedding.
    #[cfg(test)]
    pub(crate) fn buffered_capacity(&self) -> usize {
        self.rbuf.capacity() + self.spans.capacity() * std::mem::size_of::<Span>()
    }

    /// The next final response head (skipping interim 1xx responses other than 101), its
    /// fields located by `spans`.
    pub fn poll_raw_head(
        &mut self,
        cx: &mut Context<'_>,
        spans: &mut Vec<Span>,
    ) -> Poll<Result<RawHead, Error>> {
        loop {
            if !self.rbuf.is_empty()
                && let Some(head) = parse_raw(&mut self.rbuf, spans)?
            {
                if head.status.is_informational()
                    && head.status != http::StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                return Poll::Ready(Ok(head));
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => return Poll::Ready(Err(Error::new(Kind::UpstreamClosed))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(Error::upstream_io(e))),
            }
        }
    }

    /// The next final response head, its fields in a header map.
    pub fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, Error>> {
        let mut spans = std::mem::take(&mut self.spans);
        let r = self.poll_raw_head(cx, &mut spans);
        let r = r.map(|h| h.and_then(|h| h.into_head(&spans)));
        self.spans = spans;
        r
    }

    /// Gives up the connection for a tunnel: the socket plus bytes already read past the head.
    pub fn into_parts(self) -> (UpIo, Bytes) {
        (self.io, self.rbuf.freeze())
    }
}

/// Why [`send`] failed.
#[derive(Debug)]
pub enum SendError {
    /// Not one byte reached the upstream and the body was not touched: the request can be sent
    /// anywhere else, whatever its method.
    Unsent {
        /// The untouched request body, for the next attempt.
        body: ReqBody,
        /// What went wrong.
        error: Error,
    },
    /// The exchange failed after the request (or part of it) was written.
    Failed(Error),
}

/// Up to three pieces of output waiting to be written (chunk size line, data, CRLF).
#[derive(Debug, Default)]
struct Pending {
    parts: [Bytes; 3],
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.parts.iter().all(Bytes::is_empty)
    }

    fn advance(&mut self, mut n: usize) {
        for p in &mut self.parts {
            let k = n.min(p.len());
            p.advance(k);
            n -= k;
        }
    }
}

/// The write side of one request: the encoded head, then the body, framed, then a flush.
///
/// An upstream may answer before it has read the whole body. Then the rest of the upload
/// goes on inside the response body ([`super::H1Body`]) while the answer streams back, as a
/// full-duplex exchange needs; the connection is reused only if both sides completed.
#[derive(Debug)]
pub struct Upload {
    body: ReqBody,
    out: Pending,
    head_len: usize,
    sent: usize,
    body_done: bool,
    body_touched: bool,
    flushed: bool,
    chunked: bool,
    /// The write side broke after the answer arrived: the upload can never complete.
    failed: bool,
}

impl Upload {
    fn new(head: &Bytes, body: ReqBody, framing: ReqFraming) -> Self {
        Self {
            body,
            out: Pending {
                parts: [head.clone(), Bytes::new(), Bytes::new()],
            },
            head_len: head.len(),
            sent: 0,
            body_done: framing == ReqFraming::Empty,
            body_touched: false,
            flushed: false,
            chunked: framing == ReqFraming::Chunked,
            failed: false,
        }
    }

    /// Whether the whole head has been written (the answer can be listened for).
    fn head_sent(&self) -> bool {
        self.sent >= self.head_len
    }

    /// Writes what can be written now; `Ready(Ok(()))` once everything is written and flushed.
    fn poll_drive(&mut self, io: &mut UpIo, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if !self.out.is_empty() {
                let slices = [
                    IoSlice::new(&self.out.parts[0]),
                    IoSlice::new(&self.out.parts[1]),
                    IoSlice::new(&self.out.parts[2]),
                ];
                match ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices)) {
                    Ok(0) => {
                        return Poll::Ready(Err(Error::upstream_io(
                            io::ErrorKind::WriteZero.into(),
                        )));
                    }
                    Ok(n) => {
                        self.sent += n;
                        self.out.advance(n);
                    }
                    Err(e) => return Poll::Ready(Err(Error::upstream_io(e))),
                }
            } else if !self.body_done && self.body.is_end_stream() {
                // All of a sized body is out: done now, without waiting for the client
                // connection's task to report the end (an answer may already be complete).
                if self.chunked {
                    self.out.parts[0] = last_chunk(None);
                }
                self.body_done = true;
            } else if !self.body_done {
                self.body_touched = true;
                match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) if data.is_empty() => {}
                        Ok(data) if self.chunked => {
                            self.out.parts = [
                                chunk_size_line(data.len()),
                                data,
                                Bytes::from_static(b"\r\n"),
                            ];
                        }
                        Ok(data) => self.out.parts[1] = data,
                        Err(frame) => {
                            if self.chunked {
                                self.out.parts[0] = last_chunk(frame.trailers_ref());
                            }
                            self.body_done = true;
                        }
                    },
                    None => {
                        if self.chunked {
                            self.out.parts[0] = last_chunk(None);
                        }
                        self.body_done = true;
                    }
                    Some(Err(e)) => return Poll::Ready(Err(e)),
                }
            } else if !self.flushed {
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(Error::upstream_io)?;
                self.flushed = true;
            } else {
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// Drives the rest of an upload that outlived its response head (see [`Upload`]) on
    /// `conn`; `Ready(true)` when it completed, `Ready(false)` when it failed (the connection
    /// must not be reused; the response may still be read).
    pub fn poll_rest(&mut self, conn: &mut H1Conn, cx: &mut Context<'_>) -> Poll<bool> {
        if self.failed {
            return Poll::Ready(false);
        }
        self.poll_drive(&mut conn.io, cx).map(|r| r.is_ok())
    }
}

/// Writes the request on `conn` and reads the final response head, interleaving the two so
/// that an upstream answering before it read the whole body (a 413, a 401, a full-duplex
/// stream) is heard. Returns the head and, when the request was not completely written yet,
/// the rest of the upload, which the response body carries on with.
pub async fn send(
    conn: &mut H1Conn,
    head: &Bytes,
    body: ReqBody,
    framing: ReqFraming,
) -> Result<(Head, Option<Box<Upload>>), SendError> {
    send_with(conn, head, body, framing, H1Conn::poll_head).await
}

/// [`send`], reading the response head with `read_head` (a header map, or raw fields).
pub async fn send_with<H>(
    conn: &mut H1Conn,
    head: &Bytes,
    body: ReqBody,
    framing: ReqFraming,
    mut read_head: impl FnMut(&mut H1Conn, &mut Context<'_>) -> Poll<Result<H, Error>>,
) -> Result<(H, Option<Box<Upload>>), SendError> {
    let mut up = Upload::new(head, body, framing);
    let mut done = false;
    let r = poll_fn(|cx| {
        if !done {
            match up.poll_drive(&mut conn.io, cx) {
                Poll::Ready(Ok(())) => done = true,
                Poll::Ready(Err(e)) if e.side() == Side::Upstream => {
                    // The upstream may have answered and closed before reading everything.
                    if up.sent > 0
                        && let Poll::Ready(Ok(h)) = read_head(conn, cx)
                    {
                        up.failed = true;
                        return Poll::Ready(Ok(h));
                    }
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        // Listen for the answer once the head is out, also while the body is still going.
        if !up.head_sent() {
            return Poll::Pending;
        }
        read_head(conn, cx)
    })
    .await;
    match r {
        Ok(h) if done && !up.failed => Ok((h, None)),
        // Boxed: rare, and it keeps every response body small.
        Ok(h) => Ok((h, Some(Box::new(up)))),
        Err(error) if up.sent > 0 || up.body_touched => Err(SendError::Failed(error)),
        Err(error) => Err(SendError::Unsent {
            body: up.body,
            error,
        }),
    }
}
