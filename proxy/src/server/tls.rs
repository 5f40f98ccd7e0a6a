//! TLS termination: one rustls server config built once for every TLS listener, whose
//! certificate resolver reads the swappable [`CertStore`]. The session-ticket key lives in the
//! server config and so survives every certificate swap. Hosts that ask for client
//! certificates (`auth-tls-*`) get a config of their own, made from that one with the host's
//! verifier ([`client_auth_config`]); the listener picks it by the ClientHello's server name.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, version};
use sluice_config::ServerTls;
use sluice_config::host::{HostBuf, normalize_request_host};

use crate::crypto::{backend, provider};
use crate::policy::auth::client_cert::{AsksForCertificates, ClientAuth};
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
        let cert = store.lookup(name);
        Some(Arc::clone(cert.for_client(
            hello.signature_schemes(),
            hello.cipher_suites(),
        )))
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
    config_with(Arc::new(SniResolver { store }), opts)
}

/// The listeners' server config around a certificate resolver (a Gateway socket has its own:
/// its listeners' certificates).
pub fn config_with(
    resolver: Arc<dyn ResolvesServerCert>,
    opts: &TlsOptions,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut cfg = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
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

/// The config of a host or listener that asks for client certificates: `base`'s certificates
/// and ALPN with `verifier`. No session resumption: a resumed session would skip the
/// certificate check, which must be fresh for these CAs.
pub fn client_auth_config(
    base: &ServerConfig,
    policy: &ServerTls,
    verifier: Arc<dyn ClientCertVerifier>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    // The listener's suites (its provider) and versions: the ConfigMap's TLS policy included.
    let mut cfg = ServerConfig::builder_with_provider(Arc::clone(base.crypto_provider()))
        .with_protocol_versions(&versions(policy))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::clone(&base.cert_resolver));
    cfg.alpn_protocols = base.alpn_protocols.clone();
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    Ok(Arc::new(cfg))
}

/// A listener's acceptors for hosts (or Gateway listeners) that ask for client certificates,
/// one per set of rules `K`, built on the first handshake after the rules changed. Looked up
/// without a lock; an acceptor whose rules left the route table is dropped when the next one
/// is built.
pub struct ClientAuthAcceptors<K = ClientAuth>(ArcSwap<Vec<ClientAuthEntry<K>>>);

impl<K> Default for ClientAuthAcceptors<K> {
    fn default() -> Self {
        Self(ArcSwap::default())
    }
}

/// One host's acceptor: its rules, the config it was made from (the listener's, with the TLS
/// policy of the time), and the acceptor.
type ClientAuthEntry<K> = (Arc<K>, Arc<ServerConfig>, tokio_rustls::TlsAcceptor);

impl<K> std::fmt::Debug for ClientAuthAcceptors<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientAuthAcceptors({} hosts)", self.0.load().len())
    }
}

impl<K: AsksForCertificates> ClientAuthAcceptors<K> {
    /// The acceptor for `auth`, made from `base`'s config; `live` says which rules the current
    /// route table still holds. `None` if rustls refused the config (logged; see the callers
    /// for what the connection then gets).
    pub fn get(
        &self,
        auth: &Arc<K>,
        (base, policy): (&tokio_rustls::TlsAcceptor, &ServerTls),
        live: impl Fn(&Arc<K>) -> bool,
    ) -> Option<tokio_rustls::TlsAcceptor> {
        let from = base.config();
        if let Some((_, _, a)) = self
            .0
            .load()
            .iter()
            .find(|(k, b, _)| Arc::ptr_eq(k, auth) && Arc::ptr_eq(b, from))
        {
            return Some(a.clone());
        }
        let cfg = match client_auth_config(from, policy, auth.handshake_verifier()) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "client certificate config refused");
                return None;
            }
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        self.0.rcu(|current| {
            let mut next: Vec<_> = current
                .iter()
                .filter(|(k, b, _)| live(k) && !Arc::ptr_eq(k, auth) && Arc::ptr_eq(b, from))
                .cloned()
                .collect();
            next.push((Arc::clone(auth), Arc::clone(from), acceptor.clone()));
            next
        });
        Some(acceptor)
    }
}

/// The TLS versions a policy offers (both unless `ssl-protocols` says).
fn versions(policy: &ServerTls) -> Vec<&'static rustls::SupportedProtocolVersion> {
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if policy.tls13 != Some(false) {
        versions.push(&version::TLS13);
    }
    if policy.tls12 != Some(false) {
        versions.push(&version::TLS12);
    }
    versions
}

/// The listener's config with the controller ConfigMap's `ssl-protocols` and `ssl-ciphers`:
/// `base`'s certificates, ALPN and session tickets, the versions and TLS 1.2 suites the policy
/// names (TLS 1.3 suites all stay, as nginx's `ssl_ciphers` leaves them).
pub fn with_policy(
    base: &ServerConfig,
    policy: &ServerTls,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut provider = provider();
    if let Some(names) = &policy.tls12_suites {
        provider.cipher_suites.retain(|s| match s {
            rustls::SupportedCipherSuite::Tls13(_) => true,
            rustls::SupportedCipherSuite::Tls12(_) => s
                .suite()
                .as_str()
                .is_some_and(|n| names.iter().any(|want| want == n)),
        });
    }
    let mut cfg = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions(policy))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&base.cert_resolver));
    cfg.alpn_protocols = base.alpn_protocols.clone();
    cfg.ticketer = Arc::clone(&base.ticketer);
    cfg.session_storage = Arc::clone(&base.session_storage);
    cfg.send_tls13_tickets = base.send_tls13_tickets;
    Ok(Arc::new(cfg))
}

/// The acceptor for the current TLS policy, rebuilt when the ConfigMap changes it; read
/// without a lock.
#[derive(Default)]
pub struct PolicyAcceptor(ArcSwapOption<(ServerTls, tokio_rustls::TlsAcceptor)>);

impl std::fmt::Debug for PolicyAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyAcceptor")
    }
}

impl PolicyAcceptor {
    /// The acceptor for `policy`, built from `base` on first use; `None` when rustls refuses
    /// the policy (logged; the base config then serves).
    pub fn get(
        &self,
        policy: &ServerTls,
        base: &tokio_rustls::TlsAcceptor,
    ) -> Option<tokio_rustls::TlsAcceptor> {
        if let Some(current) = self.0.load().as_ref()
            && current.0 == *policy
        {
            return Some(current.1.clone());
        }
        match with_policy(base.config(), policy) {
            Ok(cfg) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                self.0
                    .store(Some(Arc::new((policy.clone(), acceptor.clone()))));
                Some(acceptor)
            }
            Err(e) => {
                tracing::warn!(error = %e, "ssl-protocols/ssl-ciphers refused; the defaults serve");
                None
            }
        }
    }
}
