//! Structural checks of `kubernetes.io/tls` Secret data: the certificate chain and the private
//! key must both be present and decodable PEM. Whether the key belongs to the certificate is a
//! cryptographic check done by the data plane.

use rustls_pki_types::pem::PemObject;
use std::fmt;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Certificate and key as PEM, structurally checked (at least one certificate, one private key).
/// Whether the key matches the certificate is checked by the data plane, which owns the crypto.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CertificatePem {
    /// `tls.crt`: the certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// `tls.key`: the private key (PKCS#1, PKCS#8 or SEC1).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for CertificatePem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("CertificatePem")
            .field("cert_pem_len", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}

/// Why Secret data is not a usable certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    /// `tls.crt` or `tls.key` missing or empty.
    #[error("missing data key {0:?}")]
    Missing(&'static str),
    /// `tls.crt` holds no `CERTIFICATE` block or a broken one.
    #[error("tls.crt: {0}")]
    BadCertificate(String),
    /// `tls.key` holds no supported private key.
    #[error("tls.key: {0}")]
    BadKey(String),
}

/// Checks PEM data from a Secret and returns it as a [`CertificatePem`].
pub fn check_pem(cert: Option<&[u8]>, key: Option<&[u8]>) -> Result<CertificatePem, PemError> {
    let cert = cert
        .filter(|c| !c.is_empty())
        .ok_or(PemError::Missing("tls.crt"))?;
    let key = key
        .filter(|k| !k.is_empty())
        .ok_or(PemError::Missing("tls.key"))?;
    check_certificates(cert)?;
    PrivateKeyDer::from_pem_slice(key).map_err(|e| {
        PemError::BadKey(format!(
            "{e} (expected an RSA PRIVATE KEY, PRIVATE KEY or EC PRIVATE KEY block)"
        ))
    })?;
    Ok(CertificatePem {
        cert_pem: cert.to_vec(),
        key_pem: key.to_vec(),
    })
}

/// Checks that PEM data holds at least one `CERTIFICATE` block and that every one decodes.
pub fn check_certificates(pem: &[u8]) -> Result<(), PemError> {
    let mut count = 0usize;
    for c in CertificateDer::pem_slice_iter(pem) {
        c.map_err(|e| PemError::BadCertificate(e.to_string()))?;
        count += 1;
    }
    if count == 0 {
        return Err(PemError::BadCertificate(
            "no CERTIFICATE block found".to_string(),
        ));
    }
    Ok(())
}
