//! A Gateway listener's client-certificate validation (`spec.tls.frontend`), compiled: the
//! verifier its handshakes use. Unlike `auth-tls-*`, which the route judges after the
//! handshake (nginx's way, so a client gets a 400 page), the Gateway API wants the handshake
//! itself to refuse a client without a certificate that chains to the listener's CAs
//! (`AllowValidOnly`); `AllowInsecureFallback` asks for one and lets everything through.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use sluice_config::gateway_model::ClientValidation;

use super::client_cert::{AskingVerifier, AsksForCertificates};
use crate::crypto::provider;

/// A listener's compiled validation.
#[derive(Debug)]
pub struct FrontendAuth {
    /// What the snapshot asked for.
    pub spec: ClientValidation,
    /// The verifier of its handshakes.
    verifier: Arc<dyn ClientCertVerifier>,
}

impl FrontendAuth {
    /// Compiles the validation; `Err` says why the listener cannot be served (its connections
    /// are then closed, never let through unchecked).
    pub fn compile(spec: &ClientValidation) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&spec.ca_pem) {
            let cert = cert.map_err(|e| format!("ca.crt: {e}"))?;
            roots.add(cert).map_err(|e| format!("ca.crt: {e}"))?;
        }
        let builder =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::new(provider()));
        let verifier: Arc<dyn ClientCertVerifier> = if spec.insecure_fallback {
            let inner = builder
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("ca.crt: {e}"))?;
            Arc::new(AskingVerifier { inner })
        } else {
            builder.build().map_err(|e| format!("ca.crt: {e}"))?
        };
        Ok(Self {
            spec: spec.clone(),
            verifier,
        })
    }

    /// Whether a request to a listener with this validation may ride a connection whose
    /// handshake `passed` (`None`: no validation asked): always under `AllowInsecureFallback`,
    /// else only when the handshake checked the same CAs. A client must not get past a
    /// listener's check by naming another listener's host in its ClientHello, or by reusing an
    /// HTTP/2 connection made for another host.
    pub fn admits(&self, passed: Option<&FrontendAuth>) -> bool {
        self.spec.insecure_fallback
            || passed.is_some_and(|p| {
                !p.spec.insecure_fallback
                    && (std::ptr::eq(self, p) || p.spec.ca_pem == self.spec.ca_pem)
            })
    }
}

impl AsksForCertificates for FrontendAuth {
    fn handshake_verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&self.verifier)
    }
}
