//! The header fields the proxy treats specially, recognised by one length switch and at most
//! two comparisons, and field lines copied from a raw head a run at a time.
//!
//! Why: a proxied HTTP/1 request crosses the proxy as two raw heads (the client's request and
//! the upstream's response) whose fields are mostly copied as they are. Asking of every field
//! "is it hop-by-hop, one we replace, `Content-Length`, `Host`…" with a dozen case-insensitive
//! comparisons, then copying it name and value apart, was most of the per-field cost. Here a
//! name is classified once, and adjacent lines that are kept leave in one copy.

use std::ops::Range;

use bytes::{BufMut, BytesMut};

use super::decode::Span;

/// A field the proxy handles itself; [`Field::Other`] is copied as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// Any other field: end-to-end, copied.
    Other,
    /// `Host`.
    Host,
    /// `Date`.
    Date,
    /// `Content-Length`.
    ContentLength,
    /// `Transfer-Encoding` (hop-by-hop).
    TransferEncoding,
    /// `Connection` (hop-by-hop; may name more).
    Connection,
    /// `Upgrade` (hop-by-hop unless tunnelled).
    Upgrade,
    /// `TE` (hop-by-hop, but `TE: trailers` is kept).
    Te,
    /// `Keep-Alive` (hop-by-hop).
    KeepAlive,
    /// `Proxy-Connection` (hop-by-hop).
    ProxyConnection,
    /// `Proxy-Authorization` (hop-by-hop).
    ProxyAuthorization,
    /// `Trailer` (hop-by-hop).
    Trailer,
    /// `Expect` (answered by our server).
    Expect,
    /// `X-Forwarded-For` (appended to).
    XForwardedFor,
    /// `X-Forwarded-Proto` (replaced).
    XForwardedProto,
    /// `X-Forwarded-Host` (replaced).
    XForwardedHost,
    /// `X-Forwarded-Port` (replaced).
    XForwardedPort,
    /// `X-Request-ID` (kept, or generated).
    XRequestId,
    /// `X-Real-IP` (set to the client; a trusted proxy's is kept).
    XRealIp,
    /// `Forwarded` (RFC 7239; only a trusted proxy's is kept).
    Forwarded,
    /// `Server` (replaced in responses).
    Server,
    /// `Strict-Transport-Security` (replaced when a route sets HSTS).
    StrictTransportSecurity,
}

impl Field {
    /// What `name` (any case) is.
    pub(crate) fn of(name: &[u8]) -> Field {
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            2 if is(b"te") => Field::Te,
            4 if is(b"host") => Field::Host,
            4 if is(b"date") => Field::Date,
            6 if is(b"server") => Field::Server,
            6 if is(b"expect") => Field::Expect,
            9 if is(b"x-real-ip") => Field::XRealIp,
            9 if is(b"forwarded") => Field::Forwarded,
            7 if is(b"upgrade") => Field::Upgrade,
            7 if is(b"trailer") => Field::Trailer,
            10 if is(b"connection") => Field::Connection,
            10 if is(b"keep-alive") => Field::KeepAlive,
            12 if is(b"x-request-id") => Field::XRequestId,
            14 if is(b"content-length") => Field::ContentLength,
            15 if is(b"x-forwarded-for") => Field::XForwardedFor,
            16 if is(b"proxy-connection") => Field::ProxyConnection,
            16 if is(b"x-forwarded-host") => Field::XForwardedHost,
            16 if is(b"x-forwarded-port") => Field::XForwardedPort,
            17 if is(b"transfer-encoding") => Field::TransferEncoding,
            17 if is(b"x-forwarded-proto") => Field::XForwardedProto,
            19 if is(b"proxy-authorization") => Field::ProxyAuthorization,
            25 if is(b"strict-transport-security") => Field::StrictTransportSecurity,
            _ => Field::Other,
        }
    }

    /// Whether the proxy writes this field itself in a forwarded request (the client's are not
    /// copied; `X-Forwarded-For` values are carried over into ours).
    pub(crate) fn is_replaced(self) -> bool {
        matches!(
            self,
            Field::XForwardedFor
                | Field::XForwardedProto
                | Field::XForwardedHost
                | Field::XForwardedPort
        )
    }
}

/// Whether every field line of `head` ends in CRLF right before the next one starts, and the
/// head in the blank line: then line `i` runs from its name to the next line's name (the last
/// one to two bytes before the head's end), and lines can be copied whole, whitespace and all, as they came. A head
/// with bare-LF line ends (which the parser tolerates) is not, and is copied field by field.
pub(crate) fn lines_contiguous(head: &[u8], spans: &[Span]) -> bool {
    head.ends_with(b"\r\n\r\n")
        && spans.iter().all(|&[ns, ..]| {
            let ns = ns as usize;
            ns >= 2 && head.get(ns - 2..ns) == Some(b"\r\n".as_slice())
        })
}

/// The byte range of line `i` in `head` (see [`lines_contiguous`]).
pub(crate) fn line(head: &[u8], spans: &[Span], i: usize) -> Range<usize> {
    let start = spans[i][0] as usize;
    let end = spans
        .get(i + 1)
        .map_or(head.len().saturating_sub(2), |s| s[0] as usize);
    start..end
}

/// Adjacent kept lines, gathered so that they are copied in one piece.
#[derive(Debug, Default)]
pub(crate) struct Run {
    range: Range<usize>,
}

impl Run {
    /// Keeps `line`, writing out the pending run first if `line` does not follow it.
    pub(crate) fn keep(&mut self, head: &[u8], line: Range<usize>, out: &mut BytesMut) {
        if self.range.is_empty() {
            self.range = line;
        } else if line.start == self.range.end {
            self.range.end = line.end;
        } else {
            self.flush(head, out);
            self.range = line;
        }
    }

    /// Writes out the pending run.
    pub(crate) fn flush(&mut self, head: &[u8], out: &mut BytesMut) {
        if !self.range.is_empty() {
            out.put_slice(&head[self.range.clone()]);
        }
        self.range = 0..0;
    }
}

/// Writes one header line (`name: value` CRLF).
pub fn put_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_recognised_in_any_case_and_nothing_else_is() {
        for (name, kind) in [
            ("Host", Field::Host),
            ("TE", Field::Te),
            ("content-LENGTH", Field::ContentLength),
            ("X-Forwarded-Port", Field::XForwardedPort),
            ("X-Forwarded-Host", Field::XForwardedHost),
            ("Proxy-Connection", Field::ProxyConnection),
            ("Strict-Transport-Security", Field::StrictTransportSecurity),
            ("keep-alive", Field::KeepAlive),
            ("Connection", Field::Connection),
            ("User-Agent", Field::Other),
            ("Hosts", Field::Other),
            ("x-forwarded-fox", Field::Other),
            ("", Field::Other),
        ] {
            assert_eq!(Field::of(name.as_bytes()), kind, "{name}");
        }
        assert!(Field::XForwardedFor.is_replaced() && !Field::XRequestId.is_replaced());
    }

    fn spans_of(head: &[u8]) -> Vec<Span> {
        let mut spans = Vec::new();
        let mut at = head.iter().position(|&b| b == b'\n').unwrap() + 1;
        while at < head.len() && head[at] != b'\r' && head[at] != b'\n' {
            let end = at + head[at..].iter().position(|&b| b == b'\n').unwrap();
            let colon = at + head[at..].iter().position(|&b| b == b':').unwrap();
            let vs = colon + 2;
            let ve = if head[end - 1] == b'\r' { end - 1 } else { end };
            spans.push([at as u32, colon as u32, vs as u32, ve as u32]);
            at = end + 1;
        }
        spans
    }

    #[test]
    fn kept_lines_are_copied_in_runs() {
        let head = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n";
        let spans = spans_of(head);
        assert_eq!(spans.len(), 4);
        assert!(lines_contiguous(head, &spans));
        let mut out = BytesMut::new();
        let mut run = Run::default();
        for i in [0, 1, 3] {
            run.keep(head, line(head, &spans, i), &mut out);
        }
        run.flush(head, &mut out);
        assert_eq!(&out[..], b"A: 1\r\nB: 2\r\nD: 4\r\n");
        let bare = b"GET / HTTP/1.1\r\nA: 1\nB: 2\r\n\r\n";
        assert!(!lines_contiguous(bare, &spans_of(bare)));
        assert!(!lines_contiguous(b"GET / HTTP/1.1\n\n", &[]));
        assert!(lines_contiguous(b"GET / HTTP/1.1\r\n\r\n", &[]));
    }
}
