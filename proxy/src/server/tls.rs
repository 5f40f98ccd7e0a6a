//! TLS termination: one rustls server config built once for every TLS listener, whose
//! certificate resolver reads the swappable [`CertStore`]. The session-ticket key lives in the
//! server config and so survives every certificate swap.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, version};
use sluice_config::host::{HostBuf, normalize_request_host};

use crate::crypto::{backend, provider};
use crate::state::certs::CertStore;

/// The rustls resolver over the swappable store.
#[derive(Debug)]
pub struct SniResolver {
    store: Arc<ArcSwap<CertStore>>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let store = self.store.load();
        let mut buf = HostBuf::default();
        let name = hello
            .server_name()
            .and_then(|n| normalize_request_host(n, &mut buf));
        Some(Arc::clone(&store.lookup(name).key))
    }
}

/// TLS listener options.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// Offer `h2` in ALPN.
    pub http2: bool,
    /// Issue session tickets (resumption).
    pub session_resumption: bool,
}

/// Builds the one server config used by every TLS listener.
pub fn server_config(
    store: Arc<ArcSwap<CertStore>>,
    opts: &TlsOptions,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut cfg = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver { store }));
    cfg.alpn_protocols = if opts.http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    if opts.session_resumption {
        cfg.ticketer = backend::Ticketer::new()?;
    } else {
        cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        cfg.send_tls13_tickets = 0;
    }
    Ok(Arc::new(cfg))
}
