//! The one certificate every peer serves: RSA-2048, self-signed, as in the published tests
//! (RSA-2048 handshakes are what the TLS rate is quoted for), or ECDSA P-256 (`--key`), what
//! cert-manager and Let's Encrypt users increasingly get.

use std::time::{Duration, Instant};

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

/// The certificate's key type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyKind {
    /// RSA, 2048 bits.
    #[value(name = "rsa-2048")]
    Rsa2048,
    /// ECDSA on P-256.
    #[value(name = "ecdsa-p256")]
    EcdsaP256,
}

impl KeyKind {
    /// How reports name it.
    pub fn label(self) -> &'static str {
        match self {
            KeyKind::Rsa2048 => "RSA-2048",
            KeyKind::EcdsaP256 => "ECDSA P-256",
        }
    }
}

/// Generates an RSA-2048 self-signed certificate for `names` (DNS names or IP addresses).
pub fn rsa2048(names: &[&str]) -> Result<Cert, rcgen::Error> {
    generate(KeyKind::Rsa2048, names)
}

/// Generates a self-signed certificate of this key type for `names`.
pub fn generate(kind: KeyKind, names: &[&str]) -> Result<Cert, rcgen::Error> {
    let key = rcgen::KeyPair::generate_for(match kind {
        KeyKind::Rsa2048 => &rcgen::PKCS_RSA_SHA256,
        KeyKind::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
    })?;
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

/// Signatures per second the TLS provider (aws-lc-rs, as sluice's) makes with this
/// certificate's key on one thread, pinned to `cpu` when given, for `duration`: the ceiling of
/// full handshakes one core can do (each costs the server one signature), to set the measured
/// handshake rate against.
pub fn sign_rate(cert: &Cert, cpu: Option<usize>, duration: Duration) -> Result<f64, String> {
    use rustls::SignatureScheme as S;
    use rustls_pki_types::pem::PemObject;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| format!("key: {e}"))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("key: {e}"))?;
    // What TLS 1.3 clients ask for first: RSA-PSS, or ECDSA P-256.
    let signer = signing
        .choose_scheme(&[S::RSA_PSS_SHA256, S::ECDSA_NISTP256_SHA256])
        .ok_or("no signature scheme for this key")?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                if let Some(c) = cpu {
                    crate::sys::pin_self(&[c])?;
                }
                // A handshake transcript hash's size.
                let message = [7u8; 32];
                let started = Instant::now();
                let mut n = 0u64;
                while started.elapsed() < duration {
                    signer.sign(&message).map_err(|e| e.to_string())?;
                    n += 1;
                }
                Ok(n as f64 / started.elapsed().as_secs_f64())
            })
            .join()
            .map_err(|_| "the signing thread panicked".to_string())?
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ecdsa_cert_and_a_signature_rate() {
        let c = super::generate(super::KeyKind::EcdsaP256, &["bench.local"]).unwrap();
        let rate = super::sign_rate(&c, None, std::time::Duration::from_millis(50)).unwrap();
        assert!(rate > 0.0);
        assert!(
            super::sign_rate(
                &super::Cert {
                    key_pem: "x".into(),
                    ..c
                },
                None,
                std::time::Duration::from_millis(1)
            )
            .is_err()
        );
    }

    #[test]
    fn rsa_cert() {
        let c = super::rsa2048(&["bench.local", "127.0.0.1"]).unwrap();
        assert!(c.cert_pem.contains("BEGIN CERTIFICATE"));
        assert!(c.key_pem.contains("PRIVATE KEY"));
    }
}
