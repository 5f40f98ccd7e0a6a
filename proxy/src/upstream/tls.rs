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
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, Kind};

/// The TLS client used for HTTPS upstreams.
#[derive(Clone)]
pub struct UpstreamTls {
    connector: TlsConnector,
    verifies: bool,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("verifies", &self.verifies)
            .finish()
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

impl Default for UpstreamTls {
    /// Encrypts but does not verify the upstream's certificate.
    fn default() -> Self {
        let provider = Arc::new(crate::crypto::provider());
        let config = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map(|b| {
                b.dangerous()
                    .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
                    .with_no_client_auth()
            });
        match config {
            Ok(c) => Self {
                connector: TlsConnector::from(Arc::new(c)),
                verifies: false,
            },
            // The default provider always supports the default versions; keep a usable value.
            Err(_) => Self {
                connector: TlsConnector::from(Arc::new(
                    ClientConfig::builder()
                        .with_root_certificates(RootCertStore::empty())
                        .with_no_client_auth(),
                )),
                verifies: true,
            },
        }
    }
}

impl UpstreamTls {
    /// Verifies upstream certificates against this PEM CA bundle. Pods are addressed by IP, so
    /// their certificates must carry the pod IP as a SAN.
    pub fn with_ca(pem: &[u8]) -> Result<Self, UpstreamTlsError> {
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
        let config = ClientConfig::builder_with_provider(Arc::new(crate::crypto::provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            verifies: true,
        })
    }

    /// Runs the client handshake over a connected socket.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        stream: TcpStream,
        timeout: Duration,
    ) -> Result<TlsStream<TcpStream>, Error> {
        let name = ServerName::IpAddress(addr.ip().into());
        match tokio::time::timeout(timeout, self.connector.connect(name, stream)).await {
            Err(_) => Err(Error::new(Kind::ConnectTimeout(timeout))),
            Ok(Err(e)) => Err(Error::caused(Kind::UpstreamTls, e)),
            Ok(Ok(s)) => Ok(s),
        }
    }
}
