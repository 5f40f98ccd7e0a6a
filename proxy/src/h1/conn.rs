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

use super::H1Error;
use super::decode::{Head, Span, parse_head};
use super::encode::{ReqFraming, chunk_size_line, last_chunk};
use crate::body::ReqBody;

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
    pub fn is_usable(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        self.poll_fill(&mut cx).is_pending()
    }

    /// The next final response head (skipping interim 1xx responses other than 101).
    fn poll_final_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, H1Error>> {
        loop {
            if !self.rbuf.is_empty()
                && let Some(head) = parse_head(&mut self.rbuf, &mut self.spans)?
            {
                if head.status.is_informational()
                    && head.status != http::StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                return Poll::Ready(Ok(head));
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => return Poll::Ready(Err(H1Error::Closed)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
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
        error: H1Error,
    },
    /// The exchange failed after the request (or part of it) was written.
    Failed(H1Error),
}

/// Up to three pieces of output waiting to be written (chunk size line, data, CRLF).
#[derive(Default)]
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

/// Writes the request on `conn` and reads the final response head, interleaving the two so
/// that an upstream answering before it read the whole body (a 413, a 401) is heard. Returns
/// the head and whether the request was written completely (if not, the connection must not
/// be reused).
pub async fn send(
    conn: &mut H1Conn,
    head: &Bytes,
    body: ReqBody,
    framing: ReqFraming,
) -> Result<(Head, bool), SendError> {
    let mut body = body;
    let mut out = Pending {
        parts: [head.clone(), Bytes::new(), Bytes::new()],
    };
    let mut written_any = false;
    let mut sent = 0usize;
    let mut body_done = framing == ReqFraming::Empty;
    let mut flushed = false;
    let chunked = framing == ReqFraming::Chunked;
    let mut body_touched = false;
    let r = poll_fn(|cx| {
        loop {
            if !out.is_empty() {
                let slices = [
                    IoSlice::new(&out.parts[0]),
                    IoSlice::new(&out.parts[1]),
                    IoSlice::new(&out.parts[2]),
                ];
                match Pin::new(&mut conn.io).poll_write_vectored(cx, &slices) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                    }
                    Poll::Ready(Ok(n)) => {
                        written_any = true;
                        sent += n;
                        out.advance(n);
                        continue;
                    }
                    Poll::Ready(Err(e)) => {
                        // The upstream may have answered and closed before reading everything.
                        if written_any && let Poll::Ready(Ok(h)) = conn.poll_final_head(cx) {
                            return Poll::Ready(Ok((h, false)));
                        }
                        return Poll::Ready(Err(e.into()));
                    }
                    Poll::Pending => {}
                }
            } else if !body_done {
                body_touched = true;
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        match frame.into_data() {
                            Ok(data) if data.is_empty() => {}
                            Ok(data) if chunked => {
                                out.parts = [
                                    chunk_size_line(data.len()),
                                    data,
                                    Bytes::from_static(b"\r\n"),
                                ];
                            }
                            Ok(data) => out.parts[1] = data,
                            Err(frame) => {
                                if chunked {
                                    out.parts[0] = last_chunk(frame.trailers_ref());
                                }
                                body_done = true;
                            }
                        }
                        continue;
                    }
                    Poll::Ready(None) => {
                        if chunked {
                            out.parts[0] = last_chunk(None);
                        }
                        body_done = true;
                        continue;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(H1Error::RequestBody(Box::new(e))));
                    }
                    Poll::Pending => {}
                }
            } else if !flushed {
                match Pin::new(&mut conn.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => flushed = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {}
                }
            }
            // Listen for the answer once the head is out, also while the body is still going.
            if sent < head.len() {
                return Poll::Pending;
            }
            let complete = body_done && out.is_empty() && flushed;
            return match conn.poll_final_head(cx) {
                Poll::Ready(Ok(h)) => Poll::Ready(Ok((h, complete))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            };
        }
    })
    .await;
    r.map_err(|error| {
        if written_any || body_touched {
            SendError::Failed(error)
        } else {
            SendError::Unsent { body, error }
        }
    })
}
