//! The PROXY protocol (HAProxy's, versions 1 and 2) on the listeners (`--proxy-protocol`): an
//! L4 load balancer in front of the nodes opens each connection with a header that names the
//! client it accepted, and sluice takes that address as the connection's client (for
//! `X-Forwarded-For`, `X-Real-IP`, the access log and `--trusted-proxies`), as ingress-nginx's
//! `use-proxy-protocol` does.
//!
//! With the flag on, every connection must start with a header, read within the header timeout;
//! anything else is closed before a byte of TLS or HTTP is read. (A listener that accepted both
//! would let any client that reaches it directly claim any address.) `LOCAL` (v2) and `UNKNOWN`
//! (v1) headers — health checks of the balancer itself — keep the TCP peer's address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v1 header, CRLF included (the specification's bound).
const V1_MAX: usize = 107;
/// The most address and TLV bytes a v2 header may declare here (the specification allows up to
/// 65,535; balancers send tens to a few hundred).
const V2_MAX_BODY: usize = 4096;

/// What a header said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A proxied connection from `source` to `destination`.
    Proxied {
        /// The client the balancer accepted.
        source: SocketAddr,
        /// The address the client connected to.
        destination: SocketAddr,
    },
    /// The balancer's own connection (v2 `LOCAL`, v1 `UNKNOWN`, or an address family other
    /// than TCP over IPv4/IPv6): keep the TCP peer's address.
    Local,
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyProtocolError {
    /// The connection does not start with a PROXY header.
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    /// The header is not well formed.
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(&'static str),
    /// The connection closed, failed or went silent before the header was complete.
    #[error("the PROXY protocol header did not arrive: {0}")]
    Incomplete(&'static str),
}

/// Parses a header at the start of `buf`: `Ok(Some((header, length)))` when complete,
/// `Ok(None)` when more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyProtocolError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] == b'P' {
        return parse_v1(buf);
    }
    if buf[0] == b'\r' {
        return parse_v2(buf);
    }
    Err(ProxyProtocolError::Missing)
}

fn parse_v1(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyProtocolError> {
    let prefix = b"PROXY ";
    let n = buf.len().min(prefix.len());
    if buf[..n] != prefix[..n] {
        return Err(ProxyProtocolError::Missing);
    }
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX {
            return Err(ProxyProtocolError::Malformed(
                "v1 header longer than 107 bytes",
            ));
        }
        return Ok(None);
    };
    if end + 2 > V1_MAX {
        return Err(ProxyProtocolError::Malformed(
            "v1 header longer than 107 bytes",
        ));
    }
    let line = std::str::from_utf8(&buf[prefix.len()..end])
        .map_err(|_| ProxyProtocolError::Malformed("v1 header is not ASCII"))?;
    let mut parts = line.split(' ');
    let header = match parts.next() {
        Some("UNKNOWN") => Header::Local,
        Some(proto @ ("TCP4" | "TCP6")) => {
            let fields: Vec<&str> = parts.collect();
            let [src, dst, sport, dport] = fields[..] else {
                return Err(ProxyProtocolError::Malformed("v1 header needs four fields"));
            };
            let ip = |s: &str| -> Result<IpAddr, ProxyProtocolError> {
                let ip: IpAddr = s
                    .parse()
                    .map_err(|_| ProxyProtocolError::Malformed("v1 address"))?;
                match (proto, ip) {
                    ("TCP4", IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_)) => Ok(ip),
                    _ => Err(ProxyProtocolError::Malformed(
                        "v1 address of the wrong family",
                    )),
                }
            };
            let port = |s: &str| -> Result<u16, ProxyProtocolError> {
                if s.len() > 1 && s.starts_with('0') {
                    return Err(ProxyProtocolError::Malformed("v1 port with a leading zero"));
                }
                s.parse()
                    .map_err(|_| ProxyProtocolError::Malformed("v1 port"))
            };
            Header::Proxied {
                source: SocketAddr::new(ip(src)?, port(sport)?),
                destination: SocketAddr::new(ip(dst)?, port(dport)?),
            }
        }
        _ => {
            return Err(ProxyProtocolError::Malformed(
                "v1 protocol is not TCP4, TCP6 or UNKNOWN",
            ));
        }
    };
    Ok(Some((header, end + 2)))
}

fn parse_v2(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyProtocolError> {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] != V2_SIGNATURE[..n] {
        return Err(ProxyProtocolError::Missing);
    }
    if buf.len() < 16 {
        return Ok(None);
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0f);
    if version != 2 {
        return Err(ProxyProtocolError::Malformed("v2 version is not 2"));
    }
    let family = buf[13];
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > V2_MAX_BODY {
        return Err(ProxyProtocolError::Malformed("v2 header longer than 4 KiB"));
    }
    if buf.len() < 16 + len {
        return Ok(None);
    }
    let body = &buf[16..16 + len];
    let header = match (command, family) {
        (0x0, _) => Header::Local,
        // TCP over IPv4.
        (0x1, 0x11) => {
            let Some(a) = body.get(..12) else {
                return Err(ProxyProtocolError::Malformed("v2 IPv4 addresses cut short"));
            };
            let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            Header::Proxied {
                source: SocketAddr::new(ip(&a[0..4]), u16::from_be_bytes([a[8], a[9]])),
                destination: SocketAddr::new(ip(&a[4..8]), u16::from_be_bytes([a[10], a[11]])),
            }
        }
        // TCP over IPv6.
        (0x1, 0x21) => {
            let Some(a) = body.get(..36) else {
                return Err(ProxyProtocolError::Malformed("v2 IPv6 addresses cut short"));
            };
            let ip = |b: &[u8]| {
                let mut o = [0u8; 16];
                o.copy_from_slice(b);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            Header::Proxied {
                source: SocketAddr::new(ip(&a[0..16]), u16::from_be_bytes([a[32], a[33]])),
                destination: SocketAddr::new(ip(&a[16..32]), u16::from_be_bytes([a[34], a[35]])),
            }
        }
        // UDP, UNIX sockets, UNSPEC: nothing to take an address from.
        (0x1, _) => Header::Local,
        _ => {
            return Err(ProxyProtocolError::Malformed(
                "v2 command is not LOCAL or PROXY",
            ));
        }
    };
    Ok(Some((header, 16 + len)))
}

/// Reads a header off `io` within `limit`; returns it with the bytes read past it (the start of
/// the TLS or HTTP stream, to be read first).
pub async fn read<I: AsyncRead + Unpin>(
    io: &mut I,
    limit: Duration,
) -> Result<(Header, Bytes), ProxyProtocolError> {
    let mut buf = BytesMut::with_capacity(256);
    let read = async {
        loop {
            if let Some((h, n)) = parse(&buf)? {
                let rest = buf.split_off(n).freeze();
                return Ok((h, rest));
            }
            if buf.len() >= 16 + V2_MAX_BODY {
                return Err(ProxyProtocolError::Malformed("header too long"));
            }
            match io.read_buf(&mut buf).await {
                Ok(0) => return Err(ProxyProtocolError::Incomplete("connection closed")),
                Ok(_) => {}
                Err(_) => return Err(ProxyProtocolError::Incomplete("read failed")),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .unwrap_or(Err(ProxyProtocolError::Incomplete("header timeout")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn v1_tcp4_tcp6_and_unknown() {
        let h = b"PROXY TCP4 203.0.113.7 198.51.100.1 51234 443\r\nGET / HTTP/1.1\r\n";
        let (got, n) = parse(h).unwrap().unwrap();
        assert_eq!(
            got,
            Header::Proxied {
                source: "203.0.113.7:51234".parse().unwrap(),
                destination: "198.51.100.1:443".parse().unwrap()
            }
        );
        assert_eq!(&h[n..], b"GET / HTTP/1.1\r\n");
        let (got, _) = parse(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 80\r\n")
            .unwrap()
            .unwrap();
        assert!(
            matches!(got, Header::Proxied { source, .. } if source == "[2001:db8::1]:1".parse().unwrap())
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN ffff:: whatever\r\n")
                .unwrap()
                .unwrap()
                .0,
            Header::Local
        );
    }

    #[test]
    fn v1_needs_more_bytes_until_its_crlf_and_refuses_what_is_wrong() {
        assert_eq!(parse(b"PROX").unwrap(), None);
        assert_eq!(parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2").unwrap(), None);
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n"[..],
            b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 70000\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(ProxyProtocolError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"PROXY UNKNOWN ".as_slice(), &[b'x'; 120]].concat();
        assert!(matches!(
            parse(&long),
            Err(ProxyProtocolError::Malformed(_))
        ));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n"),
            Err(ProxyProtocolError::Missing)
        );
        assert_eq!(
            parse(b"\x16\x03\x01"),
            Err(ProxyProtocolError::Missing),
            "a TLS hello"
        );
    }

    #[test]
    fn v2_ipv4_ipv6_local_and_tlvs() {
        let mut body = vec![203, 0, 113, 7, 198, 51, 100, 1];
        body.extend_from_slice(&51234u16.to_be_bytes());
        body.extend_from_slice(&443u16.to_be_bytes());
        body.extend_from_slice(&[0x04, 0x00, 0x02, b'h', b'i']); // a TLV, skipped
        let mut h = v2(1, 0x11, &body);
        h.extend_from_slice(b"\x16\x03\x01");
        let (got, n) = parse(&h).unwrap().unwrap();
        assert_eq!(
            got,
            Header::Proxied {
                source: "203.0.113.7:51234".parse().unwrap(),
                destination: "198.51.100.1:443".parse().unwrap()
            }
        );
        assert_eq!(&h[n..], b"\x16\x03\x01");
        let mut six = [0u8; 36];
        six[15] = 1;
        six[31] = 2;
        six[33] = 9;
        let (got, _) = parse(&v2(1, 0x21, &six)).unwrap().unwrap();
        assert!(
            matches!(got, Header::Proxied { source, .. } if source == "[::1]:9".parse().unwrap())
        );
        assert_eq!(parse(&v2(0, 0x00, &[])).unwrap().unwrap().0, Header::Local);
        assert_eq!(
            parse(&v2(1, 0x31, &[0; 216])).unwrap().unwrap().0,
            Header::Local,
            "UNIX"
        );
    }

    #[test]
    fn v2_needs_its_declared_length_and_refuses_what_is_wrong() {
        let h = v2(1, 0x11, &[0; 12]);
        for cut in [1, 12, 15, 20, h.len() - 1] {
            assert_eq!(parse(&h[..cut]).unwrap(), None, "{cut}");
        }
        assert!(matches!(
            parse(&v2(1, 0x11, &[0; 4])),
            Err(ProxyProtocolError::Malformed(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x21, &[0; 12])),
            Err(ProxyProtocolError::Malformed(_))
        ));
        let mut v3 = v2(1, 0x11, &[0; 12]);
        v3[12] = 0x31;
        assert!(matches!(parse(&v3), Err(ProxyProtocolError::Malformed(_))));
        let mut huge = v2(1, 0x11, &[]);
        huge[14..16].copy_from_slice(&5000u16.to_be_bytes());
        assert!(matches!(
            parse(&huge),
            Err(ProxyProtocolError::Malformed(_))
        ));
        assert_eq!(parse(b"\r\n\r\nX"), Err(ProxyProtocolError::Missing));
    }

    #[tokio::test]
    async fn read_returns_the_bytes_after_the_header_and_gives_up_on_silence() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        tokio::io::AsyncWriteExt::write_all(
            &mut a,
            b"PROXY TCP4 203.0.113.7 10.0.0.1 5 443\r\nGET /",
        )
        .await
        .unwrap();
        let (h, rest) = read(&mut b, Duration::from_secs(1)).await.unwrap();
        assert!(matches!(h, Header::Proxied { .. }));
        assert_eq!(&rest[..], b"GET /");
        let (_a, mut silent) = tokio::io::duplex(64);
        assert_eq!(
            read(&mut silent, Duration::from_millis(50)).await,
            Err(ProxyProtocolError::Incomplete("header timeout"))
        );
    }
}
