//! Opening connections to the target: TCP, optionally TLS (rustls with aws-lc-rs), each failure
//! classified (refused, timed out, handshake failed) because the report counts them apart.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// TLS protocol versions offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum TlsVersion {
    /// TLS 1.3, and TLS 1.2 with ECDHE-RSA-AES256-GCM-SHA384.
    Any,
    /// TLS 1.2 only, ECDHE-RSA-AES256-GCM-SHA384 only (the published handshake test).
    V12,
    /// TLS 1.3 only.
    V13,
}

/// How the server certificate is checked.
#[derive(Debug, Clone)]
pub enum Verify {
    /// Any certificate is accepted (handshake signatures are still verified, so the client does
    /// the same work as a verifying one).
    Insecure,
    /// Any certificate and any handshake signature are accepted: the handshake scenario, where
    /// one generator core must keep a proxy core busy. The proxy's work (key exchange, its
    /// signature) is the same; only the client skips checking it.
    Unchecked,
    /// Chains must lead to one of these roots.
    Roots(Vec<CertificateDer<'static>>),
    /// The system's trust store.
    System,
}

/// TLS client settings.
#[derive(Debug, Clone)]
pub struct TlsSpec {
    /// Versions offered.
    pub version: TlsVersion,
    /// Certificate checking.
    pub verify: Verify,
    /// Resume sessions (tickets). Off for the handshake test, so every connection is a full
    /// handshake.
    pub resumption: bool,
    /// Server name sent in SNI and checked against the certificate.
    pub server_name: String,
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The port refused (RST to the SYN).
    #[error("connection refused")]
    Refused,
    /// TCP connect (or the TLS handshake) did not finish in time.
    #[error("connect timed out")]
    Timeout,
    /// Another socket error.
    #[error("connect failed: {0}")]
    Other(io::Error),
    /// The TLS handshake failed (alert, EOF, reset, bad certificate).
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
}

/// Builds TLS client settings.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The system trust store could not be read.
    #[error("no usable root certificates: {0}")]
    Roots(String),
    /// The server name is neither a DNS name nor an IP address.
    #[error("bad TLS server name {0:?}")]
    ServerName(String),
    /// A client certificate could not be made.
    #[error("client certificate: {0}")]
    ClientCert(String),
}

/// A plain or TLS client stream.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Accepts any certificate but checks handshake signatures with the provider's algorithms
/// (unless `.1`, [`Verify::Unchecked`]).
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>, bool);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if self.1 {
            return Ok(HandshakeSignatureValid::assertion());
        }
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if self.1 {
            return Ok(HandshakeSignatureValid::assertion());
        }
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The aws-lc-rs provider restricted to the suites the published tests use: TLS 1.3's defaults
/// and, for TLS 1.2, ECDHE-RSA-AES256-GCM-SHA384 (or, for an ECDSA certificate (`--key`),
/// its ECDHE-ECDSA twin).
pub fn provider() -> CryptoProvider {
    use rustls::crypto::aws_lc_rs::cipher_suite as cs;
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ];
    p
}

/// Builds the rustls client configuration for `spec`.
pub fn client_config(spec: &TlsSpec) -> Result<ClientConfig, TlsConfigError> {
    let provider = Arc::new(provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match spec.version {
        TlsVersion::Any => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V12 => &[&rustls::version::TLS12],
        TlsVersion::V13 => &[&rustls::version::TLS13],
    };
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)?;
    let mut cfg = match &spec.verify {
        Verify::Insecure | Verify::Unchecked => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(
                provider,
                matches!(spec.verify, Verify::Unchecked),
            )))
            .with_no_client_auth(),
        Verify::Roots(certs) => {
            let mut roots = RootCertStore::empty();
            for c in certs {
                roots.add(c.clone())?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Verify::System => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsConfigError::Roots(format!("{:?}", found.errors)));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !spec.resumption {
        cfg.resumption = rustls::client::Resumption::disabled();
    }
    Ok(cfg)
}

/// Opens connections to one target, spreading them over its addresses.
pub struct Connector {
    addrs: Vec<SocketAddr>,
    next: AtomicUsize,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// `SO_RCVBUF` set before connecting (a slow reader's small window), if any.
    recv_buffer: Option<u32>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("addrs", &self.addrs)
            .field("tls", &self.tls.as_ref().map(|(_, n)| n))
            .finish()
    }
}

impl Connector {
    /// A connector for `addrs`, with TLS when `tls` is given (ALPN `http/1.1`).
    pub fn new(addrs: Vec<SocketAddr>, tls: Option<&TlsSpec>) -> Result<Self, TlsConfigError> {
        Self::with_alpn(addrs, tls, &[b"http/1.1"])
    }

    /// [`Connector::new`] offering these ALPN protocols (the abuse scenario's HTTP/2
    /// attackers offer `h2`).
    pub fn with_alpn(
        addrs: Vec<SocketAddr>,
        tls: Option<&TlsSpec>,
        alpn: &[&[u8]],
    ) -> Result<Self, TlsConfigError> {
        let tls = match tls {
            None => None,
            Some(spec) => {
                let mut cfg = client_config(spec)?;
                cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
                let name = ServerName::try_from(spec.server_name.clone())
                    .map_err(|_| TlsConfigError::ServerName(spec.server_name.clone()))?;
                Some((TlsConnector::from(Arc::new(cfg)), name))
            }
        };
        Ok(Self {
            addrs,
            next: AtomicUsize::new(0),
            tls,
            recv_buffer: None,
        })
    }

    /// A TLS connector for `addrs` with a configuration of the caller's (the `cert-subject`
    /// attack's, which presents a client certificate), sending `server_name`.
    pub fn with_config(
        addrs: Vec<SocketAddr>,
        cfg: ClientConfig,
        server_name: &str,
    ) -> Result<Self, TlsConfigError> {
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| TlsConfigError::ServerName(server_name.to_string()))?;
        Ok(Self {
            addrs,
            next: AtomicUsize::new(0),
            tls: Some((TlsConnector::from(Arc::new(cfg)), name)),
            recv_buffer: None,
        })
    }

    /// Connections get this receive buffer (set before the handshake, so the window the
    /// server sees stays small).
    #[must_use]
    pub fn with_recv_buffer(mut self, bytes: u32) -> Self {
        self.recv_buffer = Some(bytes);
        self
    }

    async fn tcp(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let Some(bytes) = self.recv_buffer else {
            return TcpStream::connect(addr).await;
        };
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_recv_buffer_size(bytes)?;
        socket.connect(addr).await
    }

    /// Connects (and handshakes) before `deadline`.
    pub async fn connect(&self, deadline: Instant) -> Result<Stream, ConnectError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let addr = *self
            .addrs
            .get(i % self.addrs.len().max(1))
            .ok_or(ConnectError::Other(io::Error::other("no address")))?;
        let tcp = match tokio::time::timeout_at(deadline, self.tcp(addr)).await {
            Err(_) => return Err(ConnectError::Timeout),
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(ConnectError::Refused);
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::TimedOut => return Err(ConnectError::Timeout),
            Ok(Err(e)) => return Err(ConnectError::Other(e)),
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        let Some((connector, name)) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        match tokio::time::timeout_at(deadline, connector.connect(name.clone(), tcp)).await {
            Err(_) => Err(ConnectError::Timeout),
            Ok(Err(e)) => Err(ConnectError::Handshake(e)),
            Ok(Ok(s)) => Ok(Stream::Tls(Box::new(s))),
        }
    }
}
