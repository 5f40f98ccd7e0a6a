//! TLS to upstream pods (`appProtocol: https` or the backend-protocol annotation). Like other
//! ingress controllers, certificate verification is off by default (pods present self-signed
//! certificates for their IPs); a CA bundle turns it on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sluice_config::{CertificatePem, UpstreamTlsSpec};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, Kind};

/// The TLS client used for HTTPS and GRPCS upstreams: one connector offering HTTP/1.1 and one
/// offering `h2` (ALPN), the name pods' certificates are checked for, and whether they are.
#[derive(Clone)]
pub struct UpstreamTls {
    h1: TlsConnector,
    h2: TlsConnector,
    /// The name verified (and sent as SNI when enabled); `None`: the pod's IP.
    name: Option<ServerName<'static>>,
    verifies: bool,
    /// Why this client must not connect at all (settings that could not be built): every
    /// connection fails rather than be made with less checking than asked for.
    broken: Option<Arc<str>>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("verifies", &self.verifies)
            .field("broken", &self.broken)
            .finish()
    }
}

/// A pool's own upstream TLS (`proxy-ssl-*`), part of its connections' identity.
#[derive(Debug)]
pub struct TlsProfile {
    /// What the Ingress asked for.
    pub spec: UpstreamTlsSpec,
    /// The client built from it.
    pub tls: UpstreamTls,
}

impl PartialEq for TlsProfile {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl Eq for TlsProfile {}

impl std::hash::Hash for TlsProfile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.spec.hash(state);
    }
}

impl TlsProfile {
    /// The profile of `spec`; settings that cannot be built give a client that refuses to
    /// connect (logged), never a laxer one.
    pub fn new(spec: &UpstreamTlsSpec) -> Self {
        let tls = UpstreamTls::from_spec(spec).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "upstream TLS settings refused; the pool's connections will fail");
            UpstreamTls {
                broken: Some(Arc::from(e.to_string())),
                ..UpstreamTls::default()
            }
        });
        Self {
            spec: spec.clone(),
            tls,
        }
    }
}

/// Why an upstream CA bundle could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// No certificate in the bundle, or a broken one.
    #[error("upstream CA bundle: {0}")]
    Ca(String),
    /// rustls refused the configuration.
    #[error("upstream TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
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

/// A client config with these roots (`None`: no verification), client certificate and SNI,
/// offering `alpn`.
fn client_config(
    roots: Option<RootCertStore>,
    client: Option<&CertificatePem>,
    sni: bool,
    alpn: &[u8],
) -> Result<ClientConfig, UpstreamTlsError> {
    let provider = Arc::new(crate::crypto::provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match roots {
        Some(r) => builder.with_root_certificates(r),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider))),
    };
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem.cert_pem)
                .collect::<Result<_, _>>()
                .map_err(|e| UpstreamTlsError::Ca(format!("tls.crt: {e}")))?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&pem.key_pem)
                .map_err(|e| UpstreamTlsError::Ca(format!("tls.key: {e}")))?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    config.enable_sni = sni;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

fn roots(pem: &[u8]) -> Result<RootCertStore, UpstreamTlsError> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| UpstreamTlsError::Ca(e.to_string()))?;
        roots
            .add(c)
            .map_err(|e| UpstreamTlsError::Ca(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(UpstreamTlsError::Ca("no CERTIFICATE found".into()));
    }
    Ok(roots)
}

impl Default for UpstreamTls {
    /// Encrypts but does not verify the upstream's certificate.
    fn default() -> Self {
        Self::build(None, None, None, true).unwrap_or_else(|e| {
            // The default provider always supports the default versions; keep a value that
            // refuses to connect rather than panic.
            let refusing = || {
                TlsConnector::from(Arc::new(
                    ClientConfig::builder_with_provider(Arc::new(crate::crypto::provider()))
                        .with_protocol_versions(&[&rustls::version::TLS13])
                        .map(|b| {
                            b.with_root_certificates(RootCertStore::empty())
                                .with_no_client_auth()
                        })
                        .unwrap_or_else(|_| {
                            ClientConfig::builder()
                                .with_root_certificates(RootCertStore::empty())
                                .with_no_client_auth()
                        }),
                ))
            };
            Self {
                h1: refusing(),
                h2: refusing(),
                name: None,
                verifies: true,
                broken: Some(Arc::from(e.to_string())),
            }
        })
    }
}

impl UpstreamTls {
    fn build(
        roots: Option<RootCertStore>,
        client: Option<&CertificatePem>,
        name: Option<ServerName<'static>>,
        sni: bool,
    ) -> Result<Self, UpstreamTlsError> {
        let verifies = roots.is_some();
        Ok(Self {
            h1: TlsConnector::from(Arc::new(client_config(
                roots.clone(),
                client,
                sni,
                b"http/1.1",
            )?)),
            h2: TlsConnector::from(Arc::new(client_config(roots, client, sni, b"h2")?)),
            name,
            verifies,
            broken: None,
        })
    }

    /// Verifies upstream certificates against this PEM CA bundle. Pods are addressed by IP, so
    /// their certificates must carry the pod IP as a SAN.
    pub fn with_ca(pem: &[u8]) -> Result<Self, UpstreamTlsError> {
        Self::build(Some(roots(pem)?), None, None, true)
    }

    /// A pool's own TLS (`proxy-ssl-*`): verification against its `ca.crt` when asked, for
    /// `proxy-ssl-name` (else the pod's IP), its client certificate, and SNI when asked.
    pub fn from_spec(spec: &UpstreamTlsSpec) -> Result<Self, UpstreamTlsError> {
        let roots = match (&spec.ca_pem, spec.verify) {
            (Some(pem), true) => Some(roots(pem)?),
            (None, true) => {
                return Err(UpstreamTlsError::Ca(
                    "proxy-ssl-verify without a ca.crt".into(),
                ));
            }
            (_, false) => None,
        };
        let name = match &spec.name {
            Some(n) => Some(
                ServerName::try_from(n.clone())
                    .map_err(|e| UpstreamTlsError::Ca(format!("proxy-ssl-name: {e}")))?,
            ),
            None => None,
        };
        Self::build(roots, spec.client.as_ref(), name, spec.sni)
    }

    /// Runs the client handshake over a connected socket, offering `h2` or HTTP/1.1.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        stream: TcpStream,
        timeout: Duration,
        h2: bool,
    ) -> Result<TlsStream<TcpStream>, Error> {
        if let Some(why) = &self.broken {
            return Err(Error::caused(
                Kind::UpstreamTls,
                std::io::Error::other(why.to_string()),
            ));
        }
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        let connector = if h2 { &self.h2 } else { &self.h1 };
        match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
            Err(_) => Err(Error::new(Kind::ConnectTimeout(timeout))),
            Ok(Err(e)) => Err(Error::caused(Kind::UpstreamTls, e)),
            Ok(Ok(s)) => Ok(s),
        }
    }
}
