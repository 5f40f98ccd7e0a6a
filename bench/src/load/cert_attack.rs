//! The client certificate of the `cert-subject` attack: self-signed, its subject (and so its
//! issuer) carrying a 30 KB `O=` attribute, presented to a host that asks for client
//! certificates. A server reads a presented certificate's names before it knows whether the
//! certificate verifies (nginx's `$ssl_client_s_dn`), so whatever that reading costs, an
//! attacker can make it pay on every handshake: a quadratic escape of the names made each of
//! these handshakes cost sluice 80 ms of a core before issue 39; linear, it is the parse.

use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, SignatureScheme};

use super::conn::{TlsConfigError, TlsSpec, client_config};

/// The host of the attack's handshakes: the sluice peer serves it with `auth-tls-*`.
pub const MTLS_HOST: &str = "mtls.bench.local";
/// Bytes of the subject's `O=` value (the certificate stays under TLS's 64 KiB handshake
/// message limit with the issuer a copy of it).
pub const SUBJECT_BYTES: usize = 30_000;

/// Always presents the one certificate.
#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl ResolvesClientCert for OneCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The certificate and its key.
fn big_subject_cert() -> Result<CertifiedKey, String> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "attacker");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "O".repeat(SUBJECT_BYTES));
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = super::conn::provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| e.to_string())?;
    Ok(CertifiedKey::new(vec![cert.der().clone()], signing))
}

/// `spec`'s client configuration, for [`MTLS_HOST`], presenting the attack's certificate.
pub fn config(spec: &TlsSpec) -> Result<(ClientConfig, String), TlsConfigError> {
    let spec = TlsSpec {
        server_name: MTLS_HOST.into(),
        ..spec.clone()
    };
    let mut cfg = client_config(&spec)?;
    let cert = big_subject_cert().map_err(TlsConfigError::ClientCert)?;
    cfg.client_auth_cert_resolver = Arc::new(OneCert(Arc::new(cert)));
    Ok((cfg, spec.server_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_is_big_but_fits_a_handshake_message() {
        let c = big_subject_cert().unwrap_or_else(|e| panic!("{e}"));
        let len = c.cert[0].len();
        assert!(len > 2 * SUBJECT_BYTES && len < 65_000, "{len}");
    }
}
