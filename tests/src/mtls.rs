//! Client certificates for end-to-end tests: a client CA with its clients, a rustls client
//! config presenting one, and one request over a fresh TLS connection.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client's certificate chain and key.
#[derive(Debug)]
pub struct Identity {
    /// The chain, the client's own certificate first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key (PEM).
    pub key_pem: String,
}

/// A client CA and clients.
#[derive(Debug)]
pub struct Pki {
    /// The CA's certificate (PEM).
    pub ca_pem: String,
    /// Signed by the CA.
    pub member: Identity,
    /// Self-signed.
    pub stranger: Identity,
    /// Signed by an intermediate the CA signed; sends the intermediate along.
    pub nephew: Identity,
}

/// A fresh client CA, a member, a stranger and a member by way of an intermediate.
pub fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Test Client CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(params, ca_key);
    let client = |cn: &str, issuer: Option<&rcgen::Issuer<'_, rcgen::KeyPair>>| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = match issuer {
            Some(i) => p.signed_by(&key, i).unwrap(),
            None => p.self_signed(&key).unwrap(),
        };
        Identity {
            chain: vec![cert.der().clone()],
            key_pem: key.serialize_pem(),
        }
    };
    let mid_key = rcgen::KeyPair::generate().unwrap();
    let mut mid_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    mid_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    mid_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Test Intermediate");
    let mid = mid_params.signed_by(&mid_key, &issuer).unwrap();
    let mid_issuer = rcgen::Issuer::new(mid_params, mid_key);
    let mut nephew = client("client-2", Some(&mid_issuer));
    nephew.chain.push(mid.der().clone());
    Pki {
        ca_pem: ca.pem(),
        member: client("client-1", Some(&issuer)),
        stranger: client("client-1", None),
        nephew,
    }
}

/// A client trusting `server_cert`, presenting `identity` when asked.
pub fn client_config(server_cert: &str, identity: Option<&Identity>) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(server_cert.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = ClientConfig::builder_with_provider(Arc::new(sluice_proxy::crypto::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = match identity {
        Some(id) => b
            .with_client_auth_cert(
                id.chain.clone(),
                PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    Arc::new(cfg)
}

/// One request over a fresh TLS connection (SNI `sni`, `Host: host`): the status, or `None`
/// when the handshake failed; and the body.
pub async fn fetch(
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
    sni: &str,
    host: &str,
    extra: &str,
) -> (Option<u16>, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let Ok(mut tls) = tokio_rustls::TlsConnector::from(Arc::clone(cfg))
        .connect(name, tcp)
        .await
    else {
        return (None, String::new());
    };
    // `host/path` asks for that path; a bare host for `/echo`.
    let (host, path) = match host.split_once('/') {
        Some((h, p)) => (h, format!("/{p}")),
        None => (host, "/echo".to_string()),
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    if tls.write_all(req.as_bytes()).await.is_err() {
        return (None, String::new());
    }
    let mut out = Vec::new();
    // TLS 1.3 reports a refused certificate after the handshake: as a failed read.
    if tls.read_to_end(&mut out).await.is_err() && out.is_empty() {
        return (None, String::new());
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok());
    (status, text)
}
