//! The per-connection facts a handler receives: who the client is, on which listener, and the
//! header values rendered once per connection rather than once per request.

use std::net::SocketAddr;

use http::HeaderValue;

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
        }
    }

    /// The proxy headers requests from this connection get.
    pub fn proxy_headers(&self) -> ProxyHeaders<'_> {
        ProxyHeaders {
            client_ip: &self.client_ip,
            tls: self.tls,
            port: &self.local_port,
            request_id: None,
            trusted: self.trusted,
        }
    }
}
