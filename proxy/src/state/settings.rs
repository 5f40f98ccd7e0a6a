//! Data-plane settings that do not come from Kubernetes objects.

use std::time::Duration;

use sluice_config::ObjectRef;

use crate::upstream::pool::UpstreamSettings;

/// Proxy behaviour knobs (CLI flags map onto these).
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Time from sending a request upstream to receiving its response head (504 after).
    pub request_timeout: Duration,
    /// Largest request body forwarded (413 when the declared length is larger).
    pub max_body_size: u64,
    /// Endpoints tried per request when connecting fails (at least 1).
    pub upstream_tries: u32,
    /// Port used in HTTP → HTTPS redirects (omitted when 443).
    pub https_port: u16,
    /// Upstream connection settings.
    pub upstream: UpstreamSettings,
    /// Secret whose certificate is the default (unknown or missing SNI).
    pub default_certificate: Option<ObjectRef>,
    /// Access log on stdout, in this format (off when `None`).
    pub access_log: Option<crate::telemetry::access_log::Format>,
    /// Peers whose forwarding headers are believed (`--trusted-proxies`).
    pub trusted_proxies: Vec<sluice_config::Cidr>,
    /// Longest silence, both ways, in a tunnel (WebSocket and other upgrades) before it is
    /// closed (ingress-nginx: `proxy-read-timeout`, 60 s).
    pub tunnel_idle_timeout: Duration,
    /// `Upgrade` protocols tunnelled (lower case); others are forwarded as plain requests.
    pub allowed_upgrades: Vec<String>,
    /// Status of a request refused by `limit-rps`/`limit-rpm`/`limit-connections`
    /// (`--limit-req-status-code`, ingress-nginx's default 503).
    pub limit_status: u16,
}

impl ProxySettings {
    /// Whether a client at `ip` is a trusted proxy.
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        self.trusted_proxies.iter().any(|c| c.contains(ip))
    }
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(60),
            max_body_size: 64 * 1024 * 1024,
            upstream_tries: 3,
            https_port: 443,
            upstream: UpstreamSettings::default(),
            default_certificate: None,
            access_log: None,
            trusted_proxies: Vec::new(),
            tunnel_idle_timeout: Duration::from_secs(60),
            allowed_upgrades: vec!["websocket".to_string()],
            limit_status: 503,
        }
    }
}
