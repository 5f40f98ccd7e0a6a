//! A minimal HTTP/1.1 client exchange on a raw stream.
//!
//! Hand-rolled rather than hyper's client so that every way a request can fail is visible and
//! told apart: a write error, the connection closing before any response byte (the usual sign of
//! a reload closing a keep-alive connection), closing mid-response, or a malformed response. The
//! body is counted and thrown away; nothing is allocated per request once the buffer has grown.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest response head accepted; larger is a protocol error.
const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4 * 1024;
/// How much the buffer grows by for each read.
const READ_CHUNK: usize = 64 * 1024;

/// Builds the bytes of one `GET` request. `close` adds `Connection: close` (one request per
/// connection, as the TLS handshake test wants).
pub fn build_request(host: &str, path: &str, close: bool) -> Bytes {
    let conn = if close { "close" } else { "keep-alive" };
    Bytes::from(format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: sluice-bench\r\nAccept: */*\r\nConnection: {conn}\r\n\r\n"
    ))
}

/// The value of a response's `x-backend` header, kept inline so recording it never allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BackendTag {
    len: u8,
    bytes: [u8; 32],
}

impl BackendTag {
    fn new(v: &[u8]) -> Self {
        let mut t = Self::default();
        let n = v.len().min(t.bytes.len());
        t.bytes[..n].copy_from_slice(&v[..n]);
        // n <= 32, so it fits in a u8.
        t.len = u8::try_from(n).unwrap_or(0);
        t
    }

    /// The header value, or `None` when the response had none.
    pub fn as_str(&self) -> Option<&str> {
        if self.len == 0 {
            return None;
        }
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).ok()
    }
}

/// A response that was read completely.
#[derive(Debug, Clone, Copy)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// The server will close the connection (`Connection: close`, HTTP/1.0, or a body delimited
    /// by the close itself).
    pub close: bool,
    /// Bytes received for this response (head and body).
    pub bytes: u64,
    /// `x-backend` header.
    pub backend: BackendTag,
}

/// Why an exchange failed after the connection was established.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// Writing the request failed (wrk's "write" class).
    #[error("writing the request failed: {0}")]
    Write(io::Error),
    /// The connection ended (EOF or reset) before the response was complete; `got` response bytes
    /// had arrived (0 means not a single byte: the request may never have been processed).
    #[error("connection closed after {got} response bytes: {err:?}")]
    Closed {
        /// Response bytes received before the end.
        got: u64,
        /// The read error, `None` for a clean EOF.
        err: Option<io::Error>,
    },
    /// The response could not be parsed.
    #[error("malformed response: {0}")]
    Protocol(String),
}

/// How the body is delimited.
#[derive(Debug, Clone, Copy)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Reads more bytes into `buf`; `Ok(0)` is EOF.
async fn fill<S: AsyncRead + Unpin>(s: &mut S, buf: &mut BytesMut) -> io::Result<usize> {
    if buf.is_empty() {
        // Lets `reserve` reuse the whole allocation instead of growing.
        buf.clear();
    }
    buf.reserve(READ_CHUNK);
    s.read_buf(buf).await
}

/// Reads more, turning EOF and errors into [`ExchangeError::Closed`].
async fn fill_or_closed<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    got: &mut u64,
) -> Result<(), ExchangeError> {
    match fill(s, buf).await {
        Ok(0) => Err(ExchangeError::Closed {
            got: *got,
            err: None,
        }),
        Ok(n) => {
            *got += n as u64;
            Ok(())
        }
        Err(e) => Err(ExchangeError::Closed {
            got: *got,
            err: Some(e),
        }),
    }
}

struct Head {
    status: u16,
    framing: Framing,
    close: bool,
    backend: BackendTag,
    len: usize,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, ExchangeError> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > MAX_HEAD {
                return Err(ExchangeError::Protocol("response head too large".into()));
            }
            return Ok(None);
        }
        Err(e) => return Err(ExchangeError::Protocol(e.to_string())),
    };
    let status = resp.code.unwrap_or(0);
    let mut close = resp.version == Some(0);
    let mut length = None;
    let mut chunked = false;
    let mut backend = BackendTag::default();
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ExchangeError::Protocol("bad content-length".into()))?;
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h
                .value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for tok in h.value.split(|b| *b == b',') {
                let tok = tok.trim_ascii();
                if tok.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if tok.eq_ignore_ascii_case(b"keep-alive") && resp.version == Some(0) {
                    close = false;
                }
            }
        } else if h.name.eq_ignore_ascii_case("x-backend") {
            backend = BackendTag::new(h.value);
        }
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        close = true;
        Framing::UntilClose
    };
    Ok(Some(Head {
        status,
        framing,
        close,
        backend,
        len,
    }))
}

/// Takes one CRLF-terminated line off the front of `buf`, reading more as needed.
async fn take_line<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    got: &mut u64,
) -> Result<BytesMut, ExchangeError> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = buf.split_to(i);
            buf.advance(2);
            return Ok(line);
        }
        if buf.len() > MAX_LINE {
            return Err(ExchangeError::Protocol("chunk line too long".into()));
        }
        fill_or_closed(s, buf, got).await?;
    }
}

/// Discards `n` body bytes.
async fn skip<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    got: &mut u64,
    mut n: u64,
) -> Result<(), ExchangeError> {
    loop {
        let take = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
        buf.advance(take);
        n -= take as u64;
        if n == 0 {
            return Ok(());
        }
        fill_or_closed(s, buf, got).await?;
    }
}

async fn read_chunked<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    got: &mut u64,
) -> Result<(), ExchangeError> {
    loop {
        let line = take_line(s, buf, got).await?;
        let hex = line[..]
            .split(|b: &u8| *b == b';')
            .next()
            .unwrap_or(&[])
            .trim_ascii();
        let size = std::str::from_utf8(hex)
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| ExchangeError::Protocol("bad chunk size".into()))?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                if take_line(s, buf, got).await?.is_empty() {
                    return Ok(());
                }
            }
        }
        skip(s, buf, got, size).await?;
        if !take_line(s, buf, got).await?.is_empty() {
            return Err(ExchangeError::Protocol("missing CRLF after chunk".into()));
        }
    }
}

/// Sends `req` and reads one complete response. `buf` keeps bytes read past the response (there
/// should be none) and its allocation across exchanges on one connection.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    req: &[u8],
) -> Result<Response, ExchangeError> {
    s.write_all(req).await.map_err(ExchangeError::Write)?;
    s.flush().await.map_err(ExchangeError::Write)?;
    let mut got = buf.len() as u64;
    let head = loop {
        if !buf.is_empty()
            && let Some(h) = parse_head(buf)?
        {
            if (100..200).contains(&h.status) && h.status != 101 {
                // An interim response: skip it and read the real one.
                buf.advance(h.len);
                continue;
            }
            break h;
        }
        fill_or_closed(s, buf, &mut got).await?;
    };
    buf.advance(head.len);
    match head.framing {
        Framing::None => {}
        Framing::Length(n) => skip(s, buf, &mut got, n).await?,
        Framing::Chunked => read_chunked(s, buf, &mut got).await?,
        Framing::UntilClose => loop {
            buf.clear();
            match fill(s, buf).await {
                Ok(0) => break,
                Ok(n) => got += n as u64,
                Err(e) => return Err(ExchangeError::Closed { got, err: Some(e) }),
            }
        },
    }
    Ok(Response {
        status: head.status,
        close: head.close,
        bytes: got,
        backend: head.backend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(resp: &'static [u8]) -> Result<Response, ExchangeError> {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let mut req = [0u8; 1024];
            let _ = b.read(&mut req).await;
            let _ = b.write_all(resp).await;
        });
        let mut buf = BytesMut::new();
        exchange(&mut a, &mut buf, &build_request("h", "/", false)).await
    }

    #[tokio::test]
    async fn content_length_and_backend() {
        let r = run(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Backend: pod-3\r\n\r\nhello")
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(!r.close);
        assert_eq!(r.backend.as_str(), Some("pod-3"));
    }

    #[tokio::test]
    async fn chunked_with_trailers() {
        let r = run(b"HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: v\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(r.status, 503);
        assert!(r.close);
    }

    #[tokio::test]
    async fn eof_before_any_byte_and_mid_body() {
        match run(b"").await {
            Err(ExchangeError::Closed { got: 0, .. }) => {}
            other => panic!("{other:?}"),
        }
        match run(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").await {
            Err(ExchangeError::Closed { got, .. }) => assert!(got > 0),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn until_close_and_garbage() {
        let r = run(b"HTTP/1.0 200 OK\r\n\r\nbody").await.unwrap();
        assert!(r.close);
        assert!(matches!(
            run(b"garbage\r\n\r\n").await,
            Err(ExchangeError::Protocol(_))
        ));
    }
}
