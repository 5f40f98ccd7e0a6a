//! SSL passthrough (`--enable-ssl-passthrough` and ingress-nginx's `ssl-passthrough`
//! annotation): the HTTPS listener reads the ClientHello, and for a passthrough host sends
//! the TCP stream to the backend untouched — the backend's own certificate reaches the client
//! (Argo CD, API servers). Every other host's ClientHello is replayed into sluice's own TLS.
//!
//! The edge is hostile: the reader takes at most [`MAX_HELLO`] bytes within the handshake
//! timeout, and anything that is not a well-formed ClientHello goes to rustls, which refuses
//! it as it refuses any bad handshake.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

use crate::upstream::cluster::{Cluster, Tried};

/// The most ClientHello bytes read before giving up on finding a server name (a ClientHello
/// with post-quantum key shares is under 2 KiB; TLS allows a handshake message up to 16 MiB,
/// sluice does not).
pub const MAX_HELLO: usize = 16 * 1024;

/// What the first bytes of a TLS connection said.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A complete ClientHello with this server name (lower case), or none.
    Complete(Option<String>),
    /// More bytes are needed.
    Partial,
    /// Not a ClientHello sluice can read (rustls will say what is wrong with it).
    Invalid,
}

/// A big-endian reader over a byte slice that fails instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(b[0]) << 8 | usize::from(b[1]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// Parses the start of a TLS stream: handshake records joined (a ClientHello may span several)
/// until one ClientHello is complete.
pub fn parse(buf: &[u8]) -> Hello {
    let mut records = Cursor(buf);
    let mut hs = Vec::new();
    loop {
        let Some(header) = records.take(5) else {
            return Hello::Partial;
        };
        // A handshake record (22) of TLS 1.x.
        if header[0] != 22 || header[1] != 3 {
            return Hello::Invalid;
        }
        let len = usize::from(header[3]) << 8 | usize::from(header[4]);
        if len == 0 || len > 16 * 1024 + 256 {
            return Hello::Invalid;
        }
        let Some(fragment) = records.take(len) else {
            return Hello::Partial;
        };
        hs.extend_from_slice(fragment);
        let mut msg = Cursor(&hs);
        match (msg.u8(), msg.u24()) {
            (Some(1), Some(n)) if n > MAX_HELLO => return Hello::Invalid,
            (Some(1), Some(n)) => match msg.take(n) {
                Some(body) => return client_hello(body).map_or(Hello::Invalid, Hello::Complete),
                None => continue,
            },
            (Some(_), Some(_)) => return Hello::Invalid,
            _ => continue,
        }
    }
}

/// The server name of a ClientHello body; `Some(None)` when it has none.
fn client_hello(body: &[u8]) -> Option<Option<String>> {
    let mut c = Cursor(body);
    c.take(2 + 32)?; // legacy_version, random
    c.vec8()?; // legacy_session_id
    c.vec16()?; // cipher_suites
    c.vec8()?; // legacy_compression_methods
    if c.0.is_empty() {
        return Some(None);
    }
    let mut exts = Cursor(c.vec16()?);
    while !exts.0.is_empty() {
        let typ = exts.u16()?;
        let data = exts.vec16()?;
        if typ != 0 {
            continue;
        }
        // server_name: a list of (type, name); host_name is type 0.
        let mut list = Cursor(Cursor(data).vec16()?);
        while !list.0.is_empty() {
            let kind = list.u8()?;
            let name = list.vec16()?;
            if kind == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Some(None);
    }
    Some(None)
}

/// Reads from `io` until the ClientHello is complete, invalid, or [`MAX_HELLO`] bytes came.
/// Returns what was read (to be replayed) and the server name, if any. `None` when the client
/// closed or the deadline passed first.
pub async fn read_hello<S: AsyncRead + Unpin>(
    io: &mut S,
    deadline: Duration,
) -> Option<(Bytes, Option<String>)> {
    let mut buf = BytesMut::with_capacity(2048);
    let read = async {
        loop {
            match parse(&buf) {
                Hello::Complete(name) => return Some(name),
                Hello::Invalid => return Some(None),
                Hello::Partial if buf.len() >= MAX_HELLO + 5 => return Some(None),
                Hello::Partial => {}
            }
            if io.read_buf(&mut buf).await.ok()? == 0 {
                return None;
            }
        }
    };
    let name = tokio::time::timeout(deadline, read).await.ok()??;
    Some((buf.freeze(), name))
}

/// Connects to an endpoint of `cluster` (trying up to three when connecting fails), writes the
/// ClientHello already read, then copies both ways until either side closes, nothing moves
/// for `idle`, or the server's drain deadline passes (`guard`, like any tunnel).
pub async fn tunnel<S>(
    client: S,
    hello: Bytes,
    cluster: Arc<Cluster>,
    (connect_timeout, idle): (Duration, Duration),
    mut guard: Option<crate::handler::TunnelGuard>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let set = cluster.endpoints.load_full();
    let mut tried = Tried::default();
    let mut upstream: Option<(TcpStream, SocketAddr)> = None;
    for _ in 0..3 {
        let Some(ep) = cluster.pick(&set, &tried, None) else {
            break;
        };
        tried.push(ep.addr);
        if let Ok(Ok(s)) = tokio::time::timeout(connect_timeout, TcpStream::connect(ep.addr)).await
        {
            upstream = Some((s, ep.addr));
            break;
        }
        cluster.stats.connect_errors.inc();
    }
    let Some((mut up, addr)) = upstream else {
        tracing::debug!(pool = %cluster.name, "ssl passthrough: no endpoint could be reached");
        return;
    };
    let _ = up.set_nodelay(true);
    if up.write_all(&hello).await.is_err() {
        return;
    }
    let activity = crate::io::activity::Activity::new();
    let mut client = crate::io::activity::Watched::new(client, Arc::clone(&activity));
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut up) => {
            if let Err(e) = r {
                tracing::debug!(%addr, error = %e, "ssl passthrough closed with an error");
            }
        }
        why = activity.watch(Duration::MAX, idle) => {
            tracing::debug!(%addr, why, "ssl passthrough closed");
        }
        () = async {
            match guard.as_mut() {
                Some(g) => g.deadline().await,
                None => std::future::pending().await,
            }
        } => {
            tracing::debug!(%addr, "ssl passthrough closed at the drain deadline");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real ClientHello, as rustls writes it, for `sni` (or none).
    fn hello(sni: Option<&str>) -> Vec<u8> {
        crate::crypto::install_default_provider();
        let cfg = rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = match sni {
            Some(s) => rustls::pki_types::ServerName::try_from(s.to_string()).unwrap(),
            None => rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
        };
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn finds_the_server_name_in_one_or_several_records() {
        let h = hello(Some("Argo.Example.TEST"));
        assert_eq!(parse(&h), Hello::Complete(Some("argo.example.test".into())));
        assert_eq!(parse(&hello(None)), Hello::Complete(None));
        for cut in [0, 3, 5, 40, h.len() - 1] {
            assert_eq!(parse(&h[..cut]), Hello::Partial, "cut at {cut}");
        }
        // The same handshake message split over two records.
        let body = &h[5..];
        let (a, b) = body.split_at(body.len() / 2);
        let mut split = Vec::new();
        for part in [a, b] {
            split.extend_from_slice(&[22, 3, 1]);
            split.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
            split.extend_from_slice(part);
        }
        assert_eq!(
            parse(&split),
            Hello::Complete(Some("argo.example.test".into()))
        );
    }

    #[test]
    fn what_an_attacker_sends_is_invalid_or_bounded() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Hello::Invalid);
        assert_eq!(parse(&[22, 3, 1, 0, 0]), Hello::Invalid);
        // A handshake message announcing 16 MiB.
        assert_eq!(
            parse(&[22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]),
            Hello::Invalid
        );
        // A truncated body inside a complete message.
        assert_eq!(parse(&[22, 3, 1, 0, 6, 1, 0, 0, 2, 3, 3]), Hello::Invalid);
        // Every prefix of a real hello and every single-byte corruption: no panic.
        let h = hello(Some("a.test"));
        for i in 0..h.len() {
            let _ = parse(&h[..i]);
            let mut bad = h.clone();
            bad[i] ^= 0xff;
            let _ = parse(&bad);
        }
    }

    #[tokio::test]
    async fn reading_stops_at_the_deadline_or_the_cap() {
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        // Silence: the deadline ends it.
        let t = std::time::Instant::now();
        assert!(
            read_hello(&mut b, Duration::from_millis(100))
                .await
                .is_none()
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        // Endless partial records: the cap ends it, with no name.
        use tokio::io::AsyncWriteExt;
        let mut junk = vec![22u8, 3, 1, 0x40, 0x00, 1, 0, 0x40, 0];
        junk.resize(20 * 1024, 0);
        a.write_all(&junk).await.unwrap();
        let (read, name) = read_hello(&mut b, Duration::from_secs(2)).await.unwrap();
        assert!(name.is_none());
        assert!(read.len() <= MAX_HELLO + 5 + 64 * 1024);
    }
}
