//! The one rustls crypto provider, shared by the listeners' TLS and the upstream TLS clients.

use rustls::crypto::CryptoProvider;

// The crypto backend: aws-lc-rs (measured faster than ring for the RSA-2048 signatures that
// dominate full handshakes; see the benchmark notes). The `ring` feature swaps it, only for that
// comparison; provider and session ticketer both come from the one chosen here.
#[cfg(not(feature = "ring"))]
pub(crate) use rustls::crypto::aws_lc_rs as backend;
#[cfg(feature = "ring")]
pub(crate) use rustls::crypto::ring as backend;

/// The crypto provider sluice uses everywhere (aws-lc-rs by default, ring with the `ring`
/// feature).
pub fn provider() -> CryptoProvider {
    backend::default_provider()
}

/// Installs [`provider`] as the process default, so that any library in the graph that asks
/// rustls for "the" provider gets the same one. Safe to call more than once.
pub fn install_default_provider() {
    let _ = provider().install_default();
}
