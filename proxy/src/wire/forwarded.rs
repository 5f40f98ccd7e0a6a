//! The headers a proxy adds to every forwarded request: `X-Forwarded-For` (appended to),
//! `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Forwarded-Port` (replacing whatever the client
//! sent) and `X-Request-ID` (kept, or generated).
//!
//! Two renderings of the same rules: [`ProxyHeaders::write_h1`] writes them straight into an
//! HTTP/1 request head while the client's fields are copied (no header map insertions, hashing
//! or allocation per request), and [`ProxyHeaders::apply`] puts them into a header map for
//! HTTP/2 upstreams.

use bytes::{BufMut, BytesMut};

use crate::wire::field::Field;
use crate::wire::field::put_field;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Facts about the client connection that the proxy headers carry.
#[derive(Debug, Clone, Copy)]
pub struct ProxyHeaders<'a> {
    /// The client's IP, rendered once per connection.
    pub client_ip: &'a HeaderValue,
    /// Whether the client connection is TLS.
    pub tls: bool,
    /// Our port the client connected to, rendered once per connection.
    pub port: &'a HeaderValue,
    /// The `X-Request-ID` to send when the client sent none (already given to the access
    /// log); `None` generates one.
    pub request_id: Option<[u8; 32]>,
    /// The client is a trusted proxy (`--trusted-proxies`): its `X-Forwarded-For`, `X-Real-IP`
    /// and `Forwarded` are extended or kept. From anyone else they are replaced with what
    /// sluice saw, so an application never reads a client address the client chose.
    pub trusted: bool,
    /// Client fields with `_` in their names go upstream (the ConfigMap's
    /// `enable-underscores-in-headers`); by default they are dropped.
    pub underscores: bool,
}

/// A fresh request ID: 128 random bits as 32 hex digits.
pub fn new_request_id() -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut bits = fastrand::u128(..);
    let mut out = [0u8; 32];
    for digit in out.iter_mut().rev() {
        *digit = HEX[(bits & 0xf) as usize];
        bits >>= 4;
    }
    out
}

/// What the proxy headers need from the client's fields, noted while they are copied (one
/// scan, the same for the raw-head and the header-map renderings).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ClientFields<'a> {
    /// The first `Host` value.
    pub host: Option<&'a [u8]>,
    /// The client sent `X-Forwarded-For`.
    pub prior_for: bool,
    /// The client sent `X-Request-ID`.
    pub has_id: bool,
    /// The first `X-Real-IP` value.
    pub real_ip: Option<&'a [u8]>,
}

impl<'a> ClientFields<'a> {
    /// Notes one client field.
    pub(crate) fn note(&mut self, kind: Field, value: &'a [u8]) {
        match kind {
            Field::Host if self.host.is_none() => self.host = Some(value),
            Field::XForwardedFor => self.prior_for = true,
            Field::XRequestId => self.has_id = true,
            Field::XRealIp if self.real_ip.is_none() => self.real_ip = Some(value),
            _ => {}
        }
    }
}

impl ProxyHeaders<'_> {
    fn proto(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// Whether a client field of this kind and name goes upstream as it is (the one rule for
    /// both request paths): not the forwarding fields sluice writes itself, not an untrusted
    /// client's claims about identity, and not a name with `_` (nginx's `underscores_in_headers
    /// off`: `X_Forwarded_For` could otherwise reach an application that folds `_` into `-`).
    pub(crate) fn keeps(&self, kind: Field, name: &[u8]) -> bool {
        !(kind.is_replaced()
            || (!self.trusted && matches!(kind, Field::XRealIp | Field::Forwarded))
            || (self.trusted && kind == Field::XRealIp)
            || (!self.underscores && name.contains(&b'_')))
    }

    /// Writes the client's fields (minus the ones we replace) and ours into an HTTP/1 head.
    /// `fields` gives the (name, value) pairs, from a header map or straight from a raw head
    /// (names in any case), as often as asked.
    pub fn write_h1<'a, I>(&self, fields: impl Fn() -> I, out: &mut BytesMut)
    where
        I: Iterator<Item = (&'a [u8], &'a [u8])>,
    {
        let mut seen = ClientFields::default();
        for (name, value) in fields() {
            let kind = Field::of(name);
            seen.note(kind, value);
            if self.keeps(kind, name) {
                put_field(out, name, value);
            }
        }
        self.write_own(out, &seen, fields());
    }

    /// Writes our fields: `X-Forwarded-For` (from a trusted proxy, the values it sent first —
    /// read again from `fields`, only when `seen` says there are some; then the client's IP),
    /// `X-Real-IP` (a trusted proxy's, else the client's IP), `-Proto`, `-Host` (the client's
    /// `Host`, if it sent one), `-Port`, and a fresh `X-Request-ID` unless the client sent one.
    pub(crate) fn write_own<'a>(
        &self,
        out: &mut BytesMut,
        seen: &ClientFields<'_>,
        fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    ) {
        let ClientFields {
            host,
            prior_for,
            has_id,
            real_ip,
        } = *seen;
        out.put_slice(b"x-forwarded-for: ");
        if self.trusted && prior_for {
            let prior = fields
                .filter(|&(n, _)| Field::of(n) == Field::XForwardedFor)
                .map(|(_, v)| v);
            for v in prior {
                out.put_slice(v);
                out.put_slice(b", ");
            }
        }
        out.put_slice(self.client_ip.as_bytes());
        out.put_slice(b"\r\n");
        let real_ip = real_ip.filter(|_| self.trusted);
        put_field(
            out,
            b"x-real-ip",
            real_ip.unwrap_or(self.client_ip.as_bytes()),
        );
        put_field(out, b"x-forwarded-proto", self.proto().as_bytes());
        if let Some(h) = host {
            put_field(out, b"x-forwarded-host", h);
        }
        put_field(out, b"x-forwarded-port", self.port.as_bytes());
        if !has_id {
            let id = self.request_id.unwrap_or_else(new_request_id);
            put_field(out, b"x-request-id", &id);
        }
    }

    /// Puts the same fields into a header map (for HTTP/2 upstreams).
    pub fn apply(&self, h: &mut HeaderMap) {
        let mut xff = Vec::new();
        if self.trusted {
            for v in h.get_all(&X_FORWARDED_FOR) {
                xff.extend_from_slice(v.as_bytes());
                xff.extend_from_slice(b", ");
            }
        }
        let underscored: Vec<http::HeaderName> = h
            .keys()
            .filter(|n| !self.underscores && n.as_str().contains('_'))
            .cloned()
            .collect();
        for n in underscored {
            h.remove(n);
        }
        if !self.trusted {
            h.remove(header::FORWARDED);
            h.remove(&X_REAL_IP);
        }
        if !h.contains_key(&X_REAL_IP) {
            h.insert(X_REAL_IP.clone(), self.client_ip.clone());
        }
        xff.extend_from_slice(self.client_ip.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&xff) {
            h.insert(X_FORWARDED_FOR.clone(), v);
        }
        h.insert(
            X_FORWARDED_PROTO.clone(),
            HeaderValue::from_static(self.proto()),
        );
        match h.get(header::HOST).cloned() {
            Some(host) => h.insert(X_FORWARDED_HOST.clone(), host),
            None => h.remove(&X_FORWARDED_HOST),
        };
        h.insert(X_FORWARDED_PORT.clone(), self.port.clone());
        if !h.contains_key(&X_REQUEST_ID)
            && let Ok(v) = HeaderValue::from_bytes(&self.request_id.unwrap_or_else(new_request_id))
        {
            h.insert(X_REQUEST_ID.clone(), v);
        }
    }
}

/// The client address that access rules judge. From a trusted proxy (`--trusted-proxies`),
/// the rightmost `X-Forwarded-For` address that is not itself a trusted proxy (nginx's
/// `real_ip_recursive`); from anyone else, the peer itself — a client cannot choose its
/// address by sending the field. An address that does not parse stops the walk at the last
/// trusted hop, which access lists do not normally admit.
pub fn client_ip(
    peer: std::net::IpAddr,
    headers: &HeaderMap,
    trusts: impl Fn(std::net::IpAddr) -> bool,
) -> std::net::IpAddr {
    if !trusts(peer) {
        return peer;
    }
    let mut client = peer;
    let fields: Vec<&HeaderValue> = headers.get_all(&X_FORWARDED_FOR).iter().collect();
    for v in fields.iter().rev() {
        let Ok(text) = v.to_str() else {
            return client;
        };
        for hop in text.rsplit(',').map(str::trim).filter(|h| !h.is_empty()) {
            let Ok(ip) = hop.trim_matches(|c| c == '[' || c == ']').parse() else {
                return client;
            };
            client = ip;
            if !trusts(ip) {
                return ip;
            }
        }
    }
    client
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse_fields(raw: &[u8]) -> Vec<(String, String)> {
        String::from_utf8(raw.to_vec())
            .unwrap()
            .split("\r\n")
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(": ").unwrap();
                (n.to_string(), v.to_string())
            })
            .collect()
    }

    fn sorted(mut v: Vec<(String, String)>) -> Vec<(String, String)> {
        v.retain(|(n, _)| n != "x-request-id");
        v.sort();
        v
    }

    #[test]
    fn both_renderings_agree() {
        let ip = HeaderValue::from_static("10.1.2.3");
        let port = HeaderValue::from_static("8443");
        let fwd = ProxyHeaders {
            client_ip: &ip,
            tls: true,
            port: &port,
            request_id: None,
            trusted: true,
            underscores: false,
        };
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a.example"));
        h.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("2.2.2.2"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("spoofed"));
        h.insert("x-forwarded-port", HeaderValue::from_static("1"));
        h.insert(header::USER_AGENT, HeaderValue::from_static("t"));
        let mut out = BytesMut::new();
        fwd.write_h1(|| crate::wire::decode::map_fields(&h), &mut out);
        let written = parse_fields(&out);
        let mut applied = h.clone();
        fwd.apply(&mut applied);
        let from_map: Vec<_> = applied
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        assert_eq!(sorted(written.clone()), sorted(from_map));
        let get = |n: &str| {
            written
                .iter()
                .filter(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("x-forwarded-for"), ["1.1.1.1, 2.2.2.2, 10.1.2.3"]);
        assert_eq!(get("x-forwarded-proto"), ["https"]);
        assert_eq!(get("x-forwarded-host"), ["a.example"]);
        assert_eq!(get("x-forwarded-port"), ["8443"]);
        assert_eq!(get("x-request-id")[0].len(), 32);
    }

    #[test]
    fn a_client_request_id_is_kept() {
        let ip = HeaderValue::from_static("10.1.2.3");
        let port = HeaderValue::from_static("80");
        let fwd = ProxyHeaders {
            client_ip: &ip,
            tls: false,
            port: &port,
            request_id: None,
            trusted: false,
            underscores: false,
        };
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        let mut out = BytesMut::new();
        fwd.write_h1(|| crate::wire::decode::map_fields(&h), &mut out);
        let ids: Vec<_> = parse_fields(&out)
            .into_iter()
            .filter(|(n, _)| n == "x-request-id")
            .collect();
        assert_eq!(ids, [("x-request-id".to_string(), "abc".to_string())]);
        assert_ne!(new_request_id(), new_request_id());
    }

    #[test]
    fn the_client_address_access_rules_judge() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let proxies = |a: std::net::IpAddr| a == ip("127.0.0.1") || a == ip("10.0.0.5");
        let xff = |vals: &[&str]| {
            let mut h = HeaderMap::new();
            for v in vals {
                h.append(&X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
            }
            h
        };
        // An untrusted peer's field is ignored.
        assert_eq!(
            client_ip(ip("192.0.2.9"), &xff(&["10.1.1.1"]), proxies),
            ip("192.0.2.9")
        );
        // Through two trusted proxies: the rightmost untrusted address.
        assert_eq!(
            client_ip(
                ip("127.0.0.1"),
                &xff(&["6.6.6.6, 203.0.113.7", "10.0.0.5"]),
                proxies
            ),
            ip("203.0.113.7")
        );
        // No field: the peer.
        assert_eq!(
            client_ip(ip("127.0.0.1"), &xff(&[]), proxies),
            ip("127.0.0.1")
        );
        // Garbage stops at the last trusted hop.
        assert_eq!(
            client_ip(ip("127.0.0.1"), &xff(&["203.0.113.7, nonsense"]), proxies),
            ip("127.0.0.1")
        );
        assert_eq!(
            client_ip(ip("127.0.0.1"), &xff(&["[2001:db8::1]"]), proxies),
            ip("2001:db8::1")
        );
    }
}
