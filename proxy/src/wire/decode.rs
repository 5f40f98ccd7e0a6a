//! Response-side parsing: the head (httparse, zero-copy header values), how the body is framed,
//! and the chunked-coding decoder.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

use crate::error::{Error, Kind};
use crate::wire::length::{self, LengthError};

/// Largest upstream response head (and chunked trailer section) accepted.
pub const MAX_HEAD: usize = 64 * 1024;

/// Most header fields in a response head or trailer section.
const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (size plus extensions).
const MAX_CHUNK_LINE: usize = 4096;

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    /// Status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Header fields; values share the buffer the head was read into.
    pub headers: HeaderMap,
}

/// Where one header field sits in a head: name start/end, value start/end.
pub type Span = [u32; 4];

/// A response head as read: status, version and the head's bytes, whose fields the spans
/// filled in by `parse_raw` locate. Forwarding from here copies the fields as they are, with
/// no header map built (see `direct.rs`).
#[derive(Debug)]
pub struct RawHead {
    /// Status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The head, status line to the blank line.
    pub bytes: Bytes,
}

impl RawHead {
    /// The head with its fields in a header map (values share [`RawHead::bytes`]).
    pub fn into_head(self, spans: &[Span]) -> Result<Head, Error> {
        // Room for the fields the proxy adds (Server, sometimes Connection) without a regrow.
        let headers =
            header_map(&self.bytes, spans, 2).ok_or(Error::malformed("invalid header field"))?;
        Ok(Head {
            status: self.status,
            version: self.version,
            headers,
        })
    }
}

/// The fields `spans` locate in `head`, as (name, value) bytes.
pub fn fields<'a>(
    head: &'a [u8],
    spans: &'a [Span],
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone {
    spans.iter().map(move |&[ns, ne, vs, ve]| {
        (
            &head[ns as usize..ne as usize],
            &head[vs as usize..ve as usize],
        )
    })
}

/// The fields of a header map, as (name, value) bytes.
pub fn map_fields(h: &HeaderMap) -> impl Iterator<Item = (&[u8], &[u8])> {
    h.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
}

/// Parses a complete response head off the front of `buf`, or returns `None` when more bytes
/// are needed. `spans` is scratch space kept by the caller (no allocation per response, and
/// unlike a stack array it needs no initialising on every call); it ends up locating the
/// fields in [`RawHead::bytes`].
pub fn parse_raw(buf: &mut BytesMut, spans: &mut Vec<Span>) -> Result<Option<RawHead>, Error> {
    let mut raw = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let n = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut raw)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(Error::new(Kind::ResponseHeadTooLarge(MAX_HEAD)));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Error::caused(Kind::MalformedResponse("invalid head"), e)),
    };
    if n > MAX_HEAD {
        return Err(Error::new(Kind::ResponseHeadTooLarge(MAX_HEAD)));
    }
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(Error::malformed("status code"))?;
    let version = if resp.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    // Remember where each field sits. Offsets fit in u32: the head is at most MAX_HEAD bytes.
    let base = buf.as_ptr() as usize;
    spans.clear();
    for h in resp.headers.iter() {
        let name = (h.name.as_ptr() as usize - base) as u32;
        let value = (h.value.as_ptr() as usize - base) as u32;
        spans.push([
            name,
            name + h.name.len() as u32,
            value,
            value + h.value.len() as u32,
        ]);
    }
    Ok(Some(RawHead {
        status,
        version,
        bytes: buf.split_to(n).freeze(),
    }))
}

/// [`parse_raw`], with the fields put in a header map.
#[cfg(test)]
pub fn parse_head(buf: &mut BytesMut, spans: &mut Vec<Span>) -> Result<Option<Head>, Error> {
    match parse_raw(buf, spans)? {
        Some(raw) => raw.into_head(spans).map(Some),
        None => Ok(None),
    }
}

/// Builds a header map from the fields `spans` locate in `head`; the values share `head`'s
/// memory. `room` is capacity for fields added later. `None` for an invalid name or value.
pub fn header_map(head: &Bytes, spans: &[Span], room: usize) -> Option<HeaderMap> {
    let mut headers = HeaderMap::with_capacity(spans.len() + room);
    for &[ns, ne, vs, ve] in spans {
        let name = HeaderName::from_bytes(&head[ns as usize..ne as usize]).ok()?;
        let value = HeaderValue::from_maybe_shared(head.slice(vs as usize..ve as usize)).ok()?;
        headers.append(name, value);
    }
    Some(headers)
}

/// Whether a comma-separated header (all its fields) lists `token`.
pub fn lists(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| value_lists(v.as_bytes(), token.as_bytes()))
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug)]
pub enum Framing {
    /// No body.
    Empty,
    /// This many bytes remain.
    Length(u64),
    /// Chunked coding, in this state.
    Chunked(ChunkState),
    /// Everything until the upstream closes.
    UntilClose,
}

/// Whether one comma-separated field value lists `token`.
pub fn value_lists(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// How a response's body is framed and what that means for its connection.
#[derive(Debug)]
pub struct ResponseFraming {
    /// The body's framing.
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
    /// A `Content-Length` that a transfer coding overrides: not to be passed on.
    pub drop_length: bool,
}

/// Decides the framing of a response body from its status, version and fields, and whether
/// the connection may carry another request afterwards (RFC 9112 §6.3). One pass over the
/// fields, so raw heads and header maps share the rules.
pub fn framing_of<'a>(
    status: StatusCode,
    version: Version,
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    head_request: bool,
) -> Result<ResponseFraming, Error> {
    let (mut close, mut keep_alive_token) = (false, false);
    let (mut coded, mut last_is_chunked) = (false, false);
    let mut length: Result<Option<u64>, LengthError> = Ok(None);
    let mut nonzero_length = false;
    for (name, value) in fields {
        if name.eq_ignore_ascii_case(b"connection") {
            close |= value_lists(value, b"close");
            keep_alive_token |= value_lists(value, b"keep-alive");
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            coded = true;
            if let Some(t) = value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .rfind(|t| !t.is_empty())
            {
                last_is_chunked = t.eq_ignore_ascii_case(b"chunked");
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            nonzero_length |= value.trim_ascii() != b"0";
            length = length::add(length, value);
        }
    }
    let mut keep_alive = match version {
        Version::HTTP_11 => !close,
        _ => keep_alive_token,
    };
    let framed = |framing, keep_alive| ResponseFraming {
        framing,
        keep_alive,
        drop_length: false,
    };
    let s = status;
    if head_request
        || s.is_informational()
        || s == StatusCode::NO_CONTENT
        || s == StatusCode::NOT_MODIFIED
    {
        // A 1xx or 204 that announces a body (a transfer coding, or a length other than 0) has
        // a sender confused about framing: whatever it sends next cannot be trusted as the
        // next response. (HEAD and 304 carry the length of the body they leave out.)
        if !head_request && s != StatusCode::NOT_MODIFIED && (coded || nonzero_length) {
            keep_alive = false;
        }
        return Ok(framed(Framing::Empty, keep_alive));
    }
    if coded {
        // Both: the coding wins, and a sender that confused would confuse the next response
        // on this connection too (RFC 9112 §6.3, item 3).
        let had_length = !matches!(length, Ok(None));
        keep_alive &= !had_length;
        let mut f = if last_is_chunked {
            framed(Framing::Chunked(ChunkState::Size), keep_alive)
        } else {
            framed(Framing::UntilClose, false)
        };
        f.drop_length = had_length;
        return Ok(f);
    }
    let length = length.map_err(|e| Error::malformed(e.what()))?;
    Ok(match length {
        Some(0) => framed(Framing::Empty, keep_alive),
        Some(n) => framed(Framing::Length(n), keep_alive),
        None => framed(Framing::UntilClose, false),
    })
}

/// [`framing_of`] for a head whose fields are in a header map; removes a `Content-Length`
/// that a transfer coding overrides. Returns the framing and whether the connection may be
/// reused.
pub fn response_framing(head: &mut Head, head_request: bool) -> Result<(Framing, bool), Error> {
    let f = framing_of(
        head.status,
        head.version,
        map_fields(&head.headers),
        head_request,
    )?;
    if f.drop_length {
        head.headers.remove(header::CONTENT_LENGTH);
    }
    Ok((f.framing, f.keep_alive))
}

/// Where the chunked decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last chunk: expecting trailer fields or the final CRLF.
    Trailers,
    /// The body is complete.
    Done,
}

/// One step of chunked decoding.
#[derive(Debug)]
pub enum Chunk {
    /// Body bytes.
    Data(Bytes),
    /// The trailer section (the body is complete).
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// More input is needed.
    NeedMore,
}

/// Decodes what `buf` holds, consuming it.
pub fn decode_chunk(state: &mut ChunkState, buf: &mut BytesMut) -> Result<Chunk, Error> {
    loop {
        match *state {
            ChunkState::Size => {
                let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                    if buf.len() > MAX_CHUNK_LINE {
                        return Err(Error::malformed("chunk size line too long"));
                    }
                    return Ok(Chunk::NeedMore);
                };
                let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
                let size = line.split(|&b| b == b';').next().unwrap_or_default();
                let size = size.trim_ascii();
                if size.is_empty() || size.len() > 16 {
                    return Err(Error::malformed("invalid chunk size"));
                }
                let mut n: u64 = 0;
                for &b in size {
                    let d = (b as char)
                        .to_digit(16)
                        .ok_or(Error::malformed("invalid chunk size"))?;
                    n = (n << 4) | u64::from(d);
                }
                buf.advance(nl + 1);
                *state = if n == 0 {
                    ChunkState::Trailers
                } else {
                    ChunkState::Data(n)
                };
            }
            ChunkState::Data(rest) => {
                if buf.is_empty() {
                    return Ok(Chunk::NeedMore);
                }
                let n = usize::try_from(rest).unwrap_or(usize::MAX).min(buf.len());
                let data = buf.split_to(n).freeze();
                let left = rest - n as u64;
                *state = if left == 0 {
                    ChunkState::DataEnd
                } else {
                    ChunkState::Data(left)
                };
                return Ok(Chunk::Data(data));
            }
            ChunkState::DataEnd => match buf.first() {
                None => return Ok(Chunk::NeedMore),
                Some(b'\n') => {
                    buf.advance(1);
                    *state = ChunkState::Size;
                }
                Some(b'\r') if buf.len() < 2 => return Ok(Chunk::NeedMore),
                Some(b'\r') if buf[1] == b'\n' => {
                    buf.advance(2);
                    *state = ChunkState::Size;
                }
                Some(_) => return Err(Error::malformed("missing CRLF after chunk data")),
            },
            ChunkState::Trailers => {
                let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(buf, &mut raw)
                    .map_err(|e| Error::caused(Kind::MalformedResponse("invalid trailers"), e))?
                {
                    httparse::Status::Partial if buf.len() >= MAX_HEAD => {
                        return Err(Error::new(Kind::ResponseHeadTooLarge(MAX_HEAD)));
                    }
                    httparse::Status::Partial => return Ok(Chunk::NeedMore),
                    httparse::Status::Complete((n, fields)) => {
                        let mut trailers = HeaderMap::with_capacity(fields.len());
                        for f in fields {
                            let name = HeaderName::from_bytes(f.name.as_bytes())
                                .map_err(|_| Error::malformed("invalid trailer name"))?;
                            let value = HeaderValue::from_bytes(f.value)
                                .map_err(|_| Error::malformed("invalid trailer value"))?;
                            trailers.append(name, value);
                        }
                        buf.advance(n);
                        *state = ChunkState::Done;
                        return Ok(if trailers.is_empty() {
                            Chunk::End
                        } else {
                            Chunk::Trailers(trailers)
                        });
                    }
                }
            }
            ChunkState::Done => return Ok(Chunk::End),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(b: &mut BytesMut) -> Result<Option<Head>, Error> {
        parse_head(b, &mut Vec::new())
    }

    fn head(raw: &str) -> Head {
        let mut b = BytesMut::from(raw);
        parse(&mut b).unwrap().unwrap()
    }

    #[test]
    fn parses_a_head_and_leaves_the_body() {
        let mut b =
            BytesMut::from("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello");
        let h = parse(&mut b).unwrap().unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.version, Version::HTTP_11);
        assert_eq!(h.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(&b[..], b"hello");
    }

    #[test]
    fn partial_heads_wait_and_oversized_ones_fail() {
        let mut b = BytesMut::from("HTTP/1.1 200 OK\r\nContent-Le");
        assert!(parse(&mut b).unwrap().is_none());
        let mut big = BytesMut::from("HTTP/1.1 200 OK\r\n");
        big.extend_from_slice(format!("X-Big: {}\r\n", "a".repeat(MAX_HEAD)).as_bytes());
        assert!(
            matches!(parse(&mut big), Err(e) if e.kind() == Kind::ResponseHeadTooLarge(MAX_HEAD))
        );
        let mut junk = BytesMut::from("SSH-2.0-OpenSSH\r\n\r\n");
        assert!(parse(&mut junk).is_err());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let f = |raw: &str, head_req: bool| {
            let mut h = head(raw);
            let (f, ka) = response_framing(&mut h, head_req).unwrap();
            (format!("{f:?}"), ka)
        };
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", false),
            ("Length(10)".into(), true)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true),
            ("Empty".into(), true)
        );
        assert_eq!(
            f("HTTP/1.1 204 No Content\r\n\r\n", false),
            ("Empty".into(), true)
        );
        // A 204 that announces a body: no body read, and the connection is not trusted again.
        for raw in [
            "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n",
            "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(f(raw, false), ("Empty".into(), false), "{raw:?}");
        }
        assert_eq!(
            f(
                "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
                false
            ),
            ("Empty".into(), true)
        );
        assert_eq!(
            f(
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
                false
            ),
            ("Empty".into(), true)
        );
        assert_eq!(
            f(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                false
            ),
            ("Chunked(Size)".into(), true)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false),
            ("UntilClose".into(), false)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\n\r\n", false),
            ("UntilClose".into(), false)
        );
        assert_eq!(
            f(
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n",
                false
            ),
            ("Length(1)".into(), false)
        );
        assert_eq!(
            f("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false),
            ("Length(1)".into(), false)
        );
        assert_eq!(
            f(
                "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\n",
                false
            ),
            ("Length(1)".into(), true)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n", false),
            ("Length(3)".into(), true)
        );
        // Both: chunked wins, Content-Length goes, and the connection is not reused.
        let mut h =
            head("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        let (fr, ka) = response_framing(&mut h, false).unwrap();
        assert!(matches!(fr, Framing::Chunked(_)) && !ka);
        assert!(!h.headers.contains_key(header::CONTENT_LENGTH));
        for bad in ["3, 4", "-1", "1x", ""] {
            let mut h = head(&format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n"));
            assert!(response_framing(&mut h, false).is_err(), "{bad:?}");
        }
    }

    fn decode_all(input: &[u8], step: usize) -> (Vec<u8>, Option<HeaderMap>) {
        let mut state = ChunkState::Size;
        let mut buf = BytesMut::new();
        let (mut out, mut trailers) = (Vec::new(), None);
        let mut fed = 0;
        loop {
            match decode_chunk(&mut state, &mut buf).unwrap() {
                Chunk::Data(d) => out.extend_from_slice(&d),
                Chunk::Trailers(t) => {
                    trailers = Some(t);
                    break;
                }
                Chunk::End => break,
                Chunk::NeedMore => {
                    assert!(fed < input.len(), "decoder wants more than the input");
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
            }
        }
        assert!(
            buf.is_empty() && fed == input.len(),
            "decoder must stop exactly at the end"
        );
        (out, trailers)
    }

    #[test]
    fn chunked_decoding_at_every_split() {
        let input = b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nGrpc-Status: 0\r\n\r\n";
        for step in 1..=input.len() {
            let (out, trailers) = decode_all(input, step);
            assert_eq!(out, b"hello0123456789", "step {step}");
            assert_eq!(trailers.unwrap()["grpc-status"], "0");
        }
        let (out, trailers) = decode_all(b"3\nabc\n0\n\n", 1);
        assert_eq!(out, b"abc");
        assert!(trailers.is_none());
    }

    #[test]
    fn bad_chunks_are_errors() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"11111111111111111\r\n",
            b"3\r\nabcX",
        ] {
            let mut state = ChunkState::Size;
            let mut buf = BytesMut::from(bad);
            let r = loop {
                match decode_chunk(&mut state, &mut buf) {
                    Ok(Chunk::Data(_)) => continue,
                    other => break other,
                }
            };
            assert!(r.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
