//! `floor`: not a proxy but the least a TLS server can do per request on this host, measured in
//! the same run as the proxies. A tokio + rustls server (the provider and protocol versions
//! sluice uses, the same certificate) that answers every request itself with the scenario's
//! body size: no routing, no upstream, no headers beyond the status line, length and
//! `x-backend`.
//!
//! Why: the handshake scenario compares each proxy with a signature ceiling (the one private-key
//! operation a full handshake costs), and a proxy's distance from it mixes two things: what any
//! TLS server pays on this host besides the signature (key exchange, hashing, the kernel's
//! loopback path) and what the proxy adds (parsing, routing, the upstream exchange). The floor
//! measures the first; a proxy's rate over the floor's is the second. Like `direct` for plain
//! HTTP, it takes no configuration changes.
//!
//! It runs as a process of its own (`sluice-bench floor-serve`, hidden), pinned like every peer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::proc::Proc;
use super::{PeerEnv, PeerError, Proto, State};
use crate::backend::lean::Canned;

/// A request head larger than this is refused (431) and the connection closed.
const MAX_HEAD: usize = 16 * 1024;
/// An idle keep-alive connection is closed after this long without a request.
const IDLE: Duration = Duration::from_secs(super::CLIENT_IDLE_S);

/// Reading the certificate, the key or the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    /// PEM files.
    #[error("{0}: {1}")]
    Pem(String, rustls_pki_types::pem::Error),
    /// The rustls configuration refused them.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// The TLS configuration: sluice's provider (aws-lc-rs) and versions, HTTP/1.1 only, no
/// session resumption (the handshake scenario's client never resumes).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, FloorError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| FloorError::Pem(cert.display().to_string(), e))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| FloorError::Pem(key.display().to_string(), e))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    Ok(Arc::new(cfg))
}

/// Accepts on `listener` until the process ends; each connection in a task of its own.
pub async fn serve(listener: TcpListener, tls: Option<Arc<ServerConfig>>, body: usize) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    // The backends' canned answer (`backend/lean.rs`), named `floor`: built once, not per
    // request.
    let canned = Arc::new(Canned::new("floor", Bytes::from(vec![b'x'; body])));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of descriptors or a connection reset before accept: keep serving.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let canned = Arc::clone(&canned);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                Some(a) => {
                    if let Ok(Ok(s)) = tokio::time::timeout(IDLE, a.accept(tcp)).await {
                        answer(s, &canned).await;
                    }
                }
                None => answer(tcp, &canned).await,
            }
        });
    }
}

/// What a request head asks of the connection.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A whole head; the connection stays open after the answer. `http10`: an HTTP/1.0
    /// client that asked for keep-alive (the answer must say it is kept).
    KeepAlive { head: bool, http10: bool },
    /// A whole head; close after the answer (`Connection: close`, or HTTP/1.0 without
    /// keep-alive).
    Close { head: bool },
    /// Not HTTP/1.x: the connection is closed without an answer.
    Bad,
}

/// Parses one request head (up to and including its blank line). Bodies are not read: the
/// benchmark's requests have none. `Connection` is read as a token list, over every such field.
fn parse_head(head: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = req.parse(head) else {
        return Head::Bad;
    };
    let says = |token: &[u8]| {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .flat_map(|h| h.value.split(|&b| b == b','))
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
    };
    let is_head = req.method == Some("HEAD");
    match req.version {
        Some(1) if says(b"close") => Head::Close { head: is_head },
        Some(1) => Head::KeepAlive {
            head: is_head,
            http10: false,
        },
        Some(0) if says(b"keep-alive") => Head::KeepAlive {
            head: is_head,
            http10: true,
        },
        Some(0) => Head::Close { head: is_head },
        _ => Head::Bad,
    }
}

/// Answers requests on one connection until it closes, asks to, idles out or misbehaves.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, canned: &Canned) {
    let mut buf = Vec::with_capacity(2048);
    let mut out = Vec::with_capacity(canned.head().len() + 32 + canned.body().len());
    loop {
        // Read until the blank line that ends a head.
        let end = loop {
            // Only a blank line within the limit ends a head that is answered.
            let within = &buf[..buf.len().min(MAX_HEAD)];
            if let Some(i) = within.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() >= MAX_HEAD {
                let _ = s
                    .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                let _ = s.shutdown().await;
                return;
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(IDLE, s.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        };
        let parsed = parse_head(&buf[..end]);
        buf.drain(..end);
        let (close, head, http10) = match parsed {
            Head::Bad => return,
            Head::Close { head } => (true, head, false),
            Head::KeepAlive { head, http10 } => (false, head, http10),
        };
        out.clear();
        out.extend_from_slice(canned.head());
        out.extend_from_slice(match (close, http10) {
            (true, _) => b"connection: close\r\n\r\n".as_slice(),
            (false, true) => b"connection: keep-alive\r\n\r\n".as_slice(),
            (false, false) => b"\r\n".as_slice(),
        });
        // A HEAD answer has the length of the body it would have had, and no body.
        if !head {
            out.extend_from_slice(canned.body());
        }
        if s.write_all(&out).await.is_err() {
            return;
        }
        if close {
            // Over TLS this sends close_notify with the flush; then the drop closes the socket.
            let _ = s.shutdown().await;
            return;
        }
        if s.flush().await.is_err() {
            return;
        }
    }
}

/// Starts the floor server as a pinned process of its own.
pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    body: usize,
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let exe =
        std::env::current_exe().map_err(|e| PeerError::Io("sluice-bench's path".into(), e))?;
    let mut args = vec![
        "floor-serve".to_string(),
        "--listen".into(),
        SocketAddr::from(([127, 0, 0, 1], port)).to_string(),
        "--body".into(),
        body.to_string(),
        "--workers".into(),
        env.workers.to_string(),
    ];
    if env.proto == Proto::Https {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        super::write(&cert, &env.cert.cert_pem)?;
        super::write(&key, &env.cert.key_pem)?;
        args.extend([
            "--cert".into(),
            cert.display().to_string(),
            "--key".into(),
            key.display().to_string(),
        ]);
    }
    let proc = Proc::spawn(&exe, &args, dir, &[], env.cpus.as_deref())?;
    let mut s = BTreeMap::new();
    s.insert(
        "proxy".into(),
        "none: sluice-bench's own tokio + rustls server (aws-lc-rs, TLS 1.3 and 1.2, as sluice) answers every request itself; the least a TLS server pays per request here".into(),
    );
    s.insert("workers".into(), format!("--workers {}", env.workers));
    s.insert("changes".into(), "none (no backends)".into());
    Ok((Some(proc), State::Floor, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{self, TlsSpec, TlsVersion, Verify};

    #[test]
    fn heads_are_read_as_http_says() {
        let kept = |head, http10| Head::KeepAlive { head, http10 };
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            kept(false, false)
        );
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"),
            Head::Close { head: false }
        );
        // A token list, and the token in a second field.
        assert_eq!(
            parse_head(b"HEAD / HTTP/1.1\r\nConnection: te\r\nConnection: foo , close\r\n\r\n"),
            Head::Close { head: true }
        );
        assert_eq!(
            parse_head(b"GET / HTTP/1.0\r\n\r\n"),
            Head::Close { head: false }
        );
        assert_eq!(
            parse_head(b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"),
            kept(false, true)
        );
        assert_eq!(parse_head(b"\x16\x03\x01garbage\r\n\r\n"), Head::Bad);
    }

    /// A real TLS handshake on 127.0.0.1, a keep-alive request and a closing one, then a head
    /// past the limit: 431 and the connection closed.
    #[tokio::test]
    async fn answers_over_tls_and_refuses_oversized_heads() {
        let cert = crate::certs::generate(crate::certs::KeyKind::EcdsaP256, &["bench.local"])
            .expect("certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let (cp, kp) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cp, &cert.cert_pem).expect("write");
        std::fs::write(&kp, &cert.key_pem).expect("write");
        let cfg = tls_config(&cp, &kp).expect("config");
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = tokio::spawn(serve(l, Some(cfg), 5));
        let tls = TlsSpec {
            version: TlsVersion::Any,
            verify: Verify::Insecure,
            resumption: false,
            server_name: "bench.local".into(),
        };
        let r = load::probe(addr, "bench.local", "/", Some(&tls), Duration::from_secs(5))
            .await
            .expect("answer");
        assert_eq!(r.status, 200);
        assert_eq!(r.backend.as_str(), Some("floor"));

        let c = load::conn::Connector::new(vec![addr], Some(&tls)).expect("connector");
        let deadline = || tokio::time::Instant::now() + Duration::from_secs(5);
        // HEAD: the body's length, no body.
        let mut s = c.connect(deadline()).await.expect("connect");
        s.write_all(b"HEAD / HTTP/1.1\r\nHost: bench.local\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        s.flush().await.expect("flush");
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.contains("content-length: 5\r\n"), "{text:?}");
        assert!(text.ends_with("\r\n\r\n"), "a body after a HEAD: {text:?}");

        let mut s = c.connect(deadline()).await.expect("connect");
        let mut head = b"GET / HTTP/1.1\r\nHost: bench.local\r\nX-Pad: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        head.extend_from_slice(b"\r\n\r\n");
        s.write_all(&head).await.expect("send");
        s.flush().await.expect("flush");
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
        assert!(
            got.starts_with(b"HTTP/1.1 431 "),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        server.abort();
    }

    #[test]
    fn bad_pem_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("bad.pem");
        std::fs::write(&p, "not pem").expect("write");
        let e = tls_config(&p, &p).expect_err("must fail");
        assert!(e.to_string().contains("bad.pem"), "{e}");
    }
}
