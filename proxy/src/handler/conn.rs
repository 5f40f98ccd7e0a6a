//! The per-connection facts a handler receives: who the client is, on which listener, and the
//! header values rendered once per connection rather than once per request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::HeaderValue;
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::policy::auth::client_cert::ClientCert;
use crate::policy::auth::frontend::FrontendAuth;
use crate::wire::forwarded::ProxyHeaders;

/// Facts about the client connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Client address.
    pub remote: SocketAddr,
    /// Our address.
    pub local: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// `remote`'s IP as a header value, rendered once per connection rather than per request.
    client_ip: HeaderValue,
    /// `local`'s port as a header value (`X-Forwarded-Port`), likewise rendered once.
    local_port: HeaderValue,
    /// The client is a trusted proxy (`--trusted-proxies`).
    pub trusted: bool,
    /// The connection's place under `--max-connections` and in the drain (none in tests that
    /// build a `ConnInfo` by hand).
    pub slot: Option<Slot>,
    /// The certificate the client presented in the TLS handshake (only on hosts that ask).
    pub client_cert: Option<Arc<ClientCert>>,
    /// The server name of the TLS handshake (lower case), when one was read: a route that
    /// asks for client certificates is refused (421) to requests naming another host.
    pub sni: Option<Arc<str>>,
    /// The connection came in on a Gateway's socket: its requests are routed by the
    /// Gateway API's rules for that socket, never by the Ingress routes.
    pub gateway: bool,
    /// The Gateway listener's client-certificate validation the handshake passed: requests
    /// may go to listeners with the same CAs only (see `FrontendAuth::admits`).
    pub frontend: Option<Arc<FrontendAuth>>,
}

/// A client connection's place under `--max-connections`, shared by whatever serves it: the
/// connection's task holds it, and so does a tunnel (WebSocket) that outlives the HTTP
/// connection it came from, so tunnels count against the cap and are closed when the drain's
/// deadline passes.
#[derive(Debug, Clone)]
pub struct Slot {
    _permit: Arc<OwnedSemaphorePermit>,
    deadline: watch::Receiver<bool>,
    tunnels: Arc<AtomicUsize>,
}

impl Slot {
    /// A slot holding `permit`; `deadline` turns true when the drain deadline has passed;
    /// `tunnels` counts open tunnels (for the drain to wait on).
    pub fn new(
        permit: OwnedSemaphorePermit,
        deadline: watch::Receiver<bool>,
        tunnels: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            _permit: Arc::new(permit),
            deadline,
            tunnels,
        }
    }

    /// Marks a tunnel open for as long as the returned guard lives.
    pub fn tunnel(&self) -> TunnelGuard {
        self.tunnels.fetch_add(1, Ordering::Relaxed);
        TunnelGuard { slot: self.clone() }
    }
}

/// An open tunnel: holds its connection's slot, and is counted until dropped.
#[derive(Debug)]
pub struct TunnelGuard {
    slot: Slot,
}

impl TunnelGuard {
    /// Resolves when the drain deadline has passed (never, if the server is not shutting down).
    pub async fn deadline(&mut self) {
        let _ = self.slot.deadline.wait_for(|passed| *passed).await;
        if !*self.slot.deadline.borrow() {
            // The server is gone without saying so: keep the tunnel to its own end.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.slot.tunnels.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnInfo {
    /// Facts about a new client connection; renders the per-connection header values once.
    pub fn new(remote: SocketAddr, local: SocketAddr, tls: bool, trusted: bool) -> Self {
        let client_ip = HeaderValue::from_str(&remote.ip().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self {
            remote,
            local,
            tls,
            client_ip,
            local_port: HeaderValue::from(local.port()),
            trusted,
            slot: None,
            client_cert: None,
            sni: None,
            gateway: false,
            frontend: None,
        }
    }

    /// The same facts for a connection on a Gateway's socket.
    #[must_use]
    pub fn on_gateway(mut self, gateway: bool) -> Self {
        self.gateway = gateway;
        self
    }

    /// The same facts with what the TLS handshake told: the server name and the certificate
    /// the client presented.
    #[must_use]
    pub fn with_handshake(mut self, sni: Option<&str>, cert: Option<ClientCert>) -> Self {
        self.sni = sni.map(|s| Arc::from(s.to_ascii_lowercase()));
        self.client_cert = cert.map(Arc::new);
        self
    }

    /// The same facts with the Gateway listener validation its handshake passed.
    #[must_use]
    pub fn with_frontend(mut self, passed: Option<Arc<FrontendAuth>>) -> Self {
        self.frontend = passed;
        self
    }

    /// The same facts with the connection's slot.
    #[must_use]
    pub fn with_slot(mut self, slot: Slot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// What [`Self::proxy_headers`] borrows, owned: for a request that outlives the handler
    /// (a mirrored copy): the client's IP and our port as header values, TLS, trusted.
    pub(crate) fn proxy_fields(&self) -> (HeaderValue, HeaderValue, bool, bool) {
        (
            self.client_ip.clone(),
            self.local_port.clone(),
            self.tls,
            self.trusted,
        )
    }

    /// The proxy headers requests from this connection get.
    pub fn proxy_headers(&self) -> ProxyHeaders<'_> {
        ProxyHeaders {
            client_ip: &self.client_ip,
            tls: self.tls,
            port: &self.local_port,
            request_id: None,
            trusted: self.trusted,
            underscores: false,
        }
    }
}
