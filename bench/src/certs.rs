//! The one certificate every peer serves: RSA-2048, self-signed, as in the published tests
//! (RSA-2048 handshakes are what the TLS rate is quoted for).

use rustls_pki_types::CertificateDer;

/// A certificate and its key, PEM and DER.
#[derive(Debug, Clone)]
pub struct Cert {
    /// Certificate (PEM).
    pub cert_pem: String,
    /// PKCS#8 private key (PEM).
    pub key_pem: String,
    /// Certificate (DER), for a client that trusts exactly this certificate.
    pub cert_der: CertificateDer<'static>,
}

/// Generates an RSA-2048 self-signed certificate for `names` (DNS names or IP addresses).
pub fn rsa2048(names: &[&str]) -> Result<Cert, rcgen::Error> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)?;
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        names.first().copied().unwrap_or("bench.local"),
    );
    let cert = params.self_signed(&key)?;
    Ok(Cert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert_der: cert.der().clone(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn rsa_cert() {
        let c = super::rsa2048(&["bench.local", "127.0.0.1"]).unwrap();
        assert!(c.cert_pem.contains("BEGIN CERTIFICATE"));
        assert!(c.key_pem.contains("PRIVATE KEY"));
    }
}
