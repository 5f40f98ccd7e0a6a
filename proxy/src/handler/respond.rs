//! Writing HTTP/1.1 responses to a fast-path client: the status line, the fields (from a
//! header map, or copied straight from an upstream's raw head), `Date`, framing chosen from
//! the body, and the body itself, gathered behind the head so that a small response leaves in
//! one write.

use std::cell::RefCell;
use std::fmt::Display;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::SystemTime;

use bytes::{BufMut, Bytes, BytesMut};
use http::header;
use http::{Response, StatusCode};
use http_body::Body;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::upstream::body::RespBody;
use crate::wire::field::put_field;
use crate::wire::length;

/// Body bytes gathered behind the response head before a write.
const COALESCE: usize = 64 * 1024;

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

/// A response head being written into a buffer: the status line first, then fields, then
/// [`HeadWriter::finish`] adds what is missing and chooses the framing.
pub(crate) struct HeadWriter<'a> {
    out: &'a mut BytesMut,
    status: StatusCode,
    has_date: bool,
    declared: Option<u64>,
}

/// How the body follows a written head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyFraming {
    /// No body at all (`HEAD`, 1xx, 204, 304).
    bodyless: bool,
    /// The length the head announced, if it did.
    declared: Option<u64>,
    /// Chunked coding.
    chunked: bool,
}

impl BodyFraming {
    /// The length the head announced, if it did.
    pub(crate) fn declared(&self) -> Option<u64> {
        self.declared
    }
}

impl<'a> HeadWriter<'a> {
    /// Clears `out` and writes the status line.
    pub(crate) fn new(out: &'a mut BytesMut, status: StatusCode) -> Self {
        out.clear();
        if status == StatusCode::OK {
            // Most answers: one copy instead of five and a reason lookup.
            out.put_slice(b"HTTP/1.1 200 OK\r\n");
        } else {
            out.put_slice(b"HTTP/1.1 ");
            out.put_slice(status.as_str().as_bytes());
            out.put_u8(b' ');
            out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
            out.put_slice(b"\r\n");
        }
        Self {
            out,
            status,
            has_date: false,
            declared: None,
        }
    }

    /// The buffer, for field lines copied as they are (see [`HeadWriter::has_date`]).
    pub(crate) fn out(&mut self) -> &mut BytesMut {
        self.out
    }

    /// A `Date` field was copied into [`HeadWriter::out`] (so none is added).
    pub(crate) fn has_date(&mut self) {
        self.has_date = true;
    }

    /// Copies one end-to-end field. A `Content-Length` is copied once, and only when valid
    /// by [`crate::wire::length`] (an agreeing list like `3, 3` is written as one value's field); `Transfer-Encoding` is never copied (the framing is ours).
    pub(crate) fn field(&mut self, name: &[u8], value: &[u8]) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            if self.declared.is_some() {
                return;
            }
            self.declared = length::one(value).ok();
            match self.declared {
                Some(n) => put_field(
                    self.out,
                    b"content-length",
                    itoa::Buffer::new().format(n).as_bytes(),
                ),
                None => return,
            }
            return;
        }
        self.has_date |= name.eq_ignore_ascii_case(b"date");
        put_field(self.out, name, value);
    }

    /// Ends the head: `Date` if none was copied, `Content-Length` from the body's exact size or
    /// else chunked coding (unless the response has no body), `Connection: close` when asked.
    pub(crate) fn finish(
        self,
        head_request: bool,
        exact: Option<u64>,
        close: bool,
        has_connection: bool,
    ) -> BodyFraming {
        let status = self.status;
        let bodyless = head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let out = self.out;
        if !self.has_date {
            put_date(out);
        }
        let mut declared = self.declared;
        let mut chunked = false;
        if !bodyless && declared.is_none() {
            match exact {
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
        BodyFraming {
            bodyless,
            declared,
            chunked,
        }
    }
}

/// Writes a response whose fields are in a header map; returns whether the connection is
/// still clean (body complete and as long as announced). With `close`, the final bytes stay
/// in `out` (see [`send_body`]).
pub(crate) async fn respond<I: AsyncWrite + Unpin>(
    io: &mut I,
    out: &mut BytesMut,
    resp: Response<RespBody>,
    head_request: bool,
    close: bool,
) -> std::io::Result<bool> {
    let (parts, body) = resp.into_parts();
    let mut w = HeadWriter::new(out, parts.status);
    let mut has_connection = false;
    for (name, value) in &parts.headers {
        has_connection |= *name == header::CONNECTION;
        w.field(name.as_str().as_bytes(), value.as_bytes());
    }
    let framing = w.finish(
        head_request,
        body.size_hint().exact(),
        close,
        has_connection,
    );
    send_body(io, out, body, framing, close).await
}

/// Writes the head in `out` and then `body` with the head's framing; returns whether the
/// connection is still clean (body complete and as long as announced). With `last` (the
/// connection closes after this answer) the final bytes stay in `out`, for
/// [`crate::io::finish::finish`] to send with the close.
pub(crate) async fn send_body<I, B>(
    io: &mut I,
    out: &mut BytesMut,
    body: B,
    framing: BodyFraming,
    last: bool,
) -> std::io::Result<bool>
where
    I: AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Display,
{
    let BodyFraming {
        bodyless,
        declared,
        chunked,
    } = framing;
    let mut body = body;
    if bodyless {
        drop(body);
        if last {
            return Ok(true);
        }
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
    if last {
        return Ok(clean);
    }
    io.write_all(out).await?;
    io.flush().await?;
    out.clear();
    Ok(clean)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
}
