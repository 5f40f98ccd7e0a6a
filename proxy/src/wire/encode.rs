//! Request-side encoding: the framing a forwarded request gets, and its head as bytes.

use bytes::{BufMut, Bytes, BytesMut};
use http::Method;
use http::header::{self, HeaderMap, HeaderValue};

use crate::wire::field::put_field;
use crate::wire::forwarded::ProxyHeaders;

/// How a request body is delimited on the upstream connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqFraming {
    /// No body.
    Empty,
    /// Exactly this many bytes (`Content-Length`).
    Length(u64),
    /// Chunked coding (length unknown in advance).
    Chunked,
}

/// Whether a forwarded request without a body says `Content-Length: 0`: when the client said
/// so, or the method usually has a body (some servers answer 411 to a `POST` without one).
/// Both request paths ask here.
pub(crate) fn empty_body_says_length(method: &Method, had_length: bool) -> bool {
    had_length || matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// Chooses the framing from what the client's body decoder knows, not from the client's
/// headers: a `Content-Length` that disagrees with how the client framed its body (smuggling)
/// never reaches the upstream. Sets `Content-Length` to match.
pub fn request_framing(
    method: &Method,
    headers: &mut HeaderMap,
    body: &impl http_body::Body,
) -> ReqFraming {
    if body.is_end_stream() {
        let had_length = headers.remove(header::CONTENT_LENGTH).is_some();
        if empty_body_says_length(method, had_length) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        return ReqFraming::Empty;
    }
    match body.size_hint().exact() {
        Some(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            ReqFraming::Length(n)
        }
        None => {
            headers.remove(header::CONTENT_LENGTH);
            ReqFraming::Chunked
        }
    }
}

/// Encodes the request line and header section: the client's fields and the proxy headers
/// (`fwd`). `target` is the origin-form target (path and query).
pub fn encode_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    framing: ReqFraming,
    fwd: &ProxyHeaders<'_>,
) -> Bytes {
    let fields: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    let mut out =
        BytesMut::with_capacity(method.as_str().len() + target.len() + fields + PROXY_FIELDS);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    fwd.write_h1(|| super::decode::map_fields(headers), &mut out);
    if framing == ReqFraming::Chunked {
        out.put_slice(b"transfer-encoding: chunked\r\n");
    }
    out.put_slice(b"\r\n");
    out.freeze()
}

/// Room for the request line's fixed parts and the proxy headers (so the head is written
/// into one allocation).
const PROXY_FIELDS: usize = 256;

/// The size line that precedes a chunk of `len` bytes.
pub fn chunk_size_line(len: usize) -> Bytes {
    Bytes::from(format!("{len:x}\r\n"))
}

/// The last chunk plus the trailer section.
pub fn last_chunk(trailers: Option<&HeaderMap>) -> Bytes {
    let Some(t) = trailers.filter(|t| !t.is_empty()) else {
        return Bytes::from_static(b"0\r\n\r\n");
    };
    let mut out = BytesMut::from(&b"0\r\n"[..]);
    for (name, value) in t {
        put_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.put_slice(b"\r\n");
    out.freeze()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// Proxy headers as a client 127.0.0.1 on port 80 gets them.
    pub fn fwd() -> ProxyHeaders<'static> {
        static IP: HeaderValue = HeaderValue::from_static("127.0.0.1");
        static PORT: HeaderValue = HeaderValue::from_static("80");
        ProxyHeaders {
            client_ip: &IP,
            tls: false,
            port: &PORT,
            request_id: None,
            trusted: false,
            underscores: false,
        }
    }

    /// The head without its generated request ID (random), for comparisons.
    pub fn without_id(b: &[u8]) -> String {
        String::from_utf8_lossy(b)
            .split_inclusive("\r\n")
            .filter(|l| !l.starts_with("x-request-id: "))
            .collect()
    }

    #[test]
    fn head_is_origin_form_http11_with_every_field() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a.example"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        let b = encode_head(&Method::GET, "/p?q=1", &h, ReqFraming::Empty, &fwd());
        assert_eq!(
            without_id(&b),
            "GET /p?q=1 HTTP/1.1\r\nhost: a.example\r\nx-a: 1\r\nx-a: 2\r\n\
             x-forwarded-for: 127.0.0.1\r\nx-real-ip: 127.0.0.1\r\nx-forwarded-proto: http\r\nx-forwarded-host: a.example\r\n\
             x-forwarded-port: 80\r\n\r\n"
        );
        let b = encode_head(
            &Method::POST,
            "/",
            &HeaderMap::new(),
            ReqFraming::Chunked,
            &fwd(),
        );
        assert!(
            without_id(&b).ends_with("x-forwarded-port: 80\r\ntransfer-encoding: chunked\r\n\r\n")
        );
    }

    #[test]
    fn empty_bodies_get_a_zero_length_where_a_body_is_expected() {
        let mut h = HeaderMap::new();
        assert_eq!(
            request_framing(
                &Method::GET,
                &mut h,
                &http_body_util::Empty::<bytes::Bytes>::new()
            ),
            ReqFraming::Empty
        );
        assert!(!h.contains_key(header::CONTENT_LENGTH));
        assert_eq!(
            request_framing(
                &Method::POST,
                &mut h,
                &http_body_util::Empty::<bytes::Bytes>::new()
            ),
            ReqFraming::Empty
        );
        assert_eq!(h[header::CONTENT_LENGTH], "0");
    }

    #[test]
    fn chunk_framing() {
        assert_eq!(&chunk_size_line(255)[..], b"ff\r\n");
        assert_eq!(&last_chunk(None)[..], b"0\r\n\r\n");
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        assert_eq!(&last_chunk(Some(&t))[..], b"0\r\ngrpc-status: 0\r\n\r\n");
    }
}
