//! The data model a [`crate::Snapshot`] is made of. Every type is plain data with `Eq` and `Hash`
//! so that two snapshots can be compared (and hashed) to skip work when nothing changed.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

pub use crate::host::HostMatch;
pub use crate::path::{PathKind, PathMatch};
pub use crate::pem::CertificatePem;
pub use crate::refs::{ClusterKey, ObjectRef, RouteAction};

/// How serious a reported problem is. Both kinds leave the rest of the configuration serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Something was accepted with an assumption (e.g. a missing `pathType`).
    Warning,
    /// Something was dropped or answers 503 because it cannot work.
    Error,
}

/// A problem found while translating: names the object and the field, says what happened.
/// The bad piece is dropped (or answers 503); everything else stays in the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    /// The object the problem is about.
    pub object: ObjectRef,
    /// The field path inside that object, e.g. `spec.rules[0].http.paths[1].backend`.
    pub field: String,
    /// What is wrong and what sluice does about it.
    pub message: String,
    /// Warning or error.
    pub severity: Severity,
    /// A short machine-readable reason (used as the Kubernetes Event reason).
    pub reason: &'static str,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}

/// How sluice talks to the pods of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive (the default).
    #[default]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (`appProtocol: kubernetes.io/h2c`).
    H2c,
    /// HTTP/1.1 over TLS (`appProtocol: https` or the backend-protocol annotation).
    Https,
    /// HTTP/2 over TLS, ALPN `h2` (`backend-protocol: GRPCS`).
    H2Tls,
}

impl UpstreamProtocol {
    /// Whether requests go over HTTP/2 (one shared connection per endpoint).
    pub fn is_h2(self) -> bool {
        matches!(self, Self::H2c | Self::H2Tls)
    }

    /// Whether connections are TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, Self::Https | Self::H2Tls)
    }
}

/// How sluice speaks TLS to a pool's pods (ingress-nginx's `proxy-ssl-*`). A pool without one
/// uses the global upstream TLS (`--upstream-ca-file`: verification against that bundle, else
/// none).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTlsSpec {
    /// `proxy-ssl-secret`'s `ca.crt`: the CAs the pods' certificates must chain to.
    pub ca_pem: Option<Vec<u8>>,
    /// `proxy-ssl-secret`'s `tls.crt`/`tls.key`: the client certificate sluice presents.
    pub client: Option<CertificatePem>,
    /// `proxy-ssl-verify: on`.
    pub verify: bool,
    /// `proxy-ssl-name`: the name the pod's certificate is verified for (and sent as SNI with
    /// `proxy-ssl-server-name`); without it, the pod's IP.
    pub name: Option<String>,
    /// `proxy-ssl-server-name: on`: send SNI.
    pub sni: bool,
    /// The Secret it came from.
    pub secret: Option<ObjectRef>,
}

impl fmt::Debug for UpstreamTlsSpec {
    /// Names the Secret rather than print its PEM.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTlsSpec")
            .field("secret", &self.secret.as_ref().map(ToString::to_string))
            .field("verify", &self.verify)
            .field("name", &self.name)
            .field("sni", &self.sni)
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// How a pool picks an endpoint for a request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum BalancePolicy {
    /// Power of two choices between the next endpoint in round-robin order and a random other:
    /// the one with fewer requests in flight wins, a tie goes to the round-robin one. At low
    /// load this is round robin, so every pod gets traffic (a new replica at once); under
    /// concurrency a slow or overloaded pod holds its requests longer and is picked less.
    #[default]
    LeastRequest,
    /// Power of two random choices over peak-EWMA latency × (in-flight + 1) (finagle,
    /// linkerd). Strongly latency-aware, but at low load a pod whose estimate is the highest
    /// never wins a comparison and can go without traffic.
    PeakEwma,
    /// Plain round robin.
    RoundRobin,
    /// Consistent (rendezvous) hashing of a request key: a key keeps reaching the same endpoint
    /// while that endpoint exists, and only the keys of an endpoint that goes move.
    Hash(HashKey),
}

impl BalancePolicy {
    /// Parses a policy name as the `load-balance` annotation and `--balance` spell it
    /// (`least_request`, `ewma`, `round_robin`; dashes or underscores).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "least_request" | "least_conn" => Some(Self::LeastRequest),
            "ewma" | "peak_ewma" => Some(Self::PeakEwma),
            "round_robin" => Some(Self::RoundRobin),
            _ => None,
        }
    }
}

/// What a [`BalancePolicy::Hash`] pool hashes, in ingress-nginx's `upstream-hash-by` spelling.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HashKey {
    /// `$remote_addr` / `$binary_remote_addr`: the client address (as the trusted-proxy rules
    /// resolve it).
    ClientIp,
    /// `$request_uri`: path and query.
    RequestUri,
    /// `$http_<name>`: a request header (lower case, `_` read as `-`, as nginx does).
    Header(String),
    /// `$cookie_<name>`: a cookie's value.
    Cookie(String),
}

impl HashKey {
    /// Parses one nginx variable; anything else (`$host$uri`, literals, other variables) is an
    /// error naming what is supported.
    pub fn parse(v: &str) -> Result<Self, String> {
        let v = v.trim();
        let bad = || {
            format!(
                "{v:?} is not supported; use one of $remote_addr, $binary_remote_addr, $request_uri, $http_<header>, $cookie_<name>"
            )
        };
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        match v {
            "$remote_addr" | "$binary_remote_addr" => Ok(Self::ClientIp),
            "$request_uri" => Ok(Self::RequestUri),
            _ => {
                if let Some(h) = v.strip_prefix("$http_").filter(|n| name_ok(n)) {
                    Ok(Self::Header(h.to_ascii_lowercase().replace('_', "-")))
                } else if let Some(c) = v.strip_prefix("$cookie_").filter(|n| name_ok(n)) {
                    Ok(Self::Cookie(c.to_string()))
                } else {
                    Err(bad())
                }
            }
        }
    }
}

/// Whether an endpoint takes new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndpointState {
    /// Ready: picked normally.
    Ready,
    /// Serving but terminating: picked only when no ready endpoint is left.
    Draining,
}

/// One pod address of a pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointSpec {
    /// Pod IP and target port.
    pub addr: SocketAddr,
    /// Ready or draining.
    pub state: EndpointState,
}

/// An upstream pool: a Service port with its resolved endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    /// Which Service port this is.
    pub key: ClusterKey,
    /// Protocol spoken to the pods.
    pub protocol: UpstreamProtocol,
    /// Balancing policy.
    pub balance: BalancePolicy,
    /// Endpoints, sorted by address, without duplicates.
    pub endpoints: Vec<EndpointSpec>,
    /// Most requests (for HTTP/1: connections) in flight to one endpoint of the pool; `None`
    /// for no limit (`sluice.dev/upstream-max-connections`, `--upstream-max-connections`).
    pub max_in_flight: Option<u32>,
    /// `service-upstream`: the one endpoint is the Service's ClusterIP (kube-proxy balances),
    /// so EndpointSlice changes do not touch this pool.
    pub service_upstream: bool,
    /// `proxy-ssl-*`: this pool's own upstream TLS.
    pub tls: Option<UpstreamTlsSpec>,
}

/// `Strict-Transport-Security` settings from the `sluice.dev/hsts` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hsts {
    /// `max-age` in seconds.
    pub max_age: u64,
    /// Whether `includeSubDomains` is sent.
    pub include_subdomains: bool,
    /// Whether `preload` is sent.
    pub preload: bool,
}

/// When a failed attempt is tried again on another endpoint (ingress-nginx's
/// `proxy-next-upstream` and `proxy-next-upstream-tries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NextUpstream {
    /// `false` for `off`: only failures before anything was sent (connect errors, a pooled
    /// connection found closed) move on; those are always safe.
    pub on_error: bool,
    /// `non_idempotent`: POST, PATCH and the like are retried after a break too.
    pub non_idempotent: bool,
    /// Endpoints to try at most; `None` uses the global `--upstream-tries`.
    pub tries: Option<u32>,
}

impl Default for NextUpstream {
    fn default() -> Self {
        Self {
            on_error: true,
            non_idempotent: false,
            tries: None,
        }
    }
}

/// Per-route behaviour that comes from the Ingress the route was defined in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RouteOptions {
    /// Redirect plain-HTTP requests to HTTPS with 308 (only when the host has TLS, unless
    /// `force-ssl-redirect` said so).
    pub ssl_redirect: bool,
    /// `force-ssl-redirect`: redirect plain HTTP to HTTPS even when the host has no TLS
    /// section (TLS terminated in front of sluice, or the default certificate).
    pub force_ssl_redirect: bool,
    /// HSTS header on HTTPS responses.
    pub hsts: Option<Hsts>,
    /// Retry rules.
    pub next_upstream: NextUpstream,
    /// Everything else the ingress-nginx annotations ask of a route.
    pub edits: crate::route_policy::RouteEdits,
    /// Body size and response-head timeout.
    pub limits: crate::route_policy::RouteLimits,
}

/// One path rule of a virtual host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// What path this route matches.
    pub path: PathMatch,
    /// Where matching requests go.
    pub action: RouteAction,
    /// The Ingress this route came from.
    pub source: ObjectRef,
    /// Per-Ingress options.
    pub options: RouteOptions,
    /// A canary Ingress for the same host and path (ingress-nginx's `canary` annotations).
    pub canary: Option<Box<crate::route_policy::Canary>>,
    /// `default-backend`: where requests go when the route's pool has no endpoint, and where
    /// `custom-http-errors` are served from.
    pub fallback: Option<RouteAction>,
}

/// A host whose TLS connections go to a backend untouched (ingress-nginx's `ssl-passthrough`
/// with `--enable-ssl-passthrough`): the ClientHello's server name selects it, so only exact
/// hosts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Passthrough {
    /// The host (lower case).
    pub host: String,
    /// The pool that gets the TCP stream.
    pub action: RouteAction,
    /// The Ingress that asked for it.
    pub source: ObjectRef,
}

/// All routes for one host, merged across every Ingress object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualHost {
    /// The host this serves.
    pub host: HostMatch,
    /// Routes sorted by path.
    pub routes: Vec<Route>,
}

/// One TLS host bound to a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsBinding {
    /// Host name or `*.` wildcard, lower case.
    pub host: String,
    /// The Secret named by the Ingress.
    pub secret: ObjectRef,
    /// The Ingress that asked for it.
    pub source: ObjectRef,
    /// A second Secret the same Ingress names for the host (another `spec.tls` entry): its
    /// certificate of the other key type is served to the clients that can verify it (ECDSA
    /// beside RSA, as nginx with two `ssl_certificate` lines).
    pub also: Option<ObjectRef>,
}

/// Global settings that apply to the whole data plane.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Settings {
    /// Default balancing policy for pools.
    pub balance: BalancePolicy,
    /// Whether hosts with TLS redirect plain HTTP to HTTPS unless an Ingress says otherwise.
    pub ssl_redirect: bool,
    /// Default per-endpoint limit of requests in flight (`--upstream-max-connections`).
    pub max_in_flight: Option<u32>,
    /// HSTS for routes whose Ingress does not say (the controller ConfigMap's `hsts` keys).
    pub hsts: Option<Hsts>,
    /// Limits for routes whose Ingress does not say (the controller ConfigMap); `None` fields
    /// leave the flags in force.
    pub limits: crate::route_policy::RouteLimits,
    /// The ConfigMap's `global-auth-*` keys as the `auth-*` annotations they stand for (empty:
    /// no global authentication). Every Ingress without its own `auth-url`/`auth-type` and
    /// without `enable-global-auth: "false"` gets them.
    pub global_auth: BTreeMap<String, String>,
    /// `no-auth-locations`: path prefixes global authentication skips.
    pub no_auth_locations: Vec<String>,
    /// `ssl-protocols`, `ssl-ciphers`: what the HTTPS listener offers.
    pub server_tls: ServerTls,
    /// `custom-http-errors` of the controller ConfigMap: for Ingresses with a
    /// `default-backend` and no `custom-http-errors` of their own.
    pub custom_errors: Vec<u16>,
    /// `use-proxy-protocol` of the controller ConfigMap (`None`: `--proxy-protocol`).
    pub proxy_protocol: Option<bool>,
    /// `enable-underscores-in-headers` of the controller ConfigMap: client fields with `_` in
    /// their names go upstream (by default they are dropped, as nginx does).
    pub underscores_in_headers: bool,
    /// `upstream-keepalive-timeout` of the controller ConfigMap: how long an idle connection to
    /// a pod may be reused (`None`: `--upstream-idle-timeout`).
    pub upstream_keepalive_timeout: Option<std::time::Duration>,
    /// `keep-alive` of the controller ConfigMap: how long an idle client connection waits for
    /// its next request (`None`: the flags).
    pub keep_alive: Option<std::time::Duration>,
    /// `keep-alive-requests` of the controller ConfigMap: the most requests one HTTP/1 client
    /// connection serves; the last is answered with `Connection: close`.
    pub keep_alive_requests: Option<u32>,
    /// `global-allowed-response-headers` of the controller ConfigMap, lower case and sorted:
    /// the only fields a `custom-headers` ConfigMap may set (empty: none may).
    pub allowed_response_headers: Vec<String>,
    /// The controller ConfigMap's `whitelist-source-range` and `denylist-source-range`: the
    /// source ranges of every route whose Ingress sets no list of that kind itself.
    pub source_ranges: crate::route_policy::SourceRanges,
    /// The controller ConfigMap's `block-cidrs`: clients answered 403 on every request,
    /// whatever the route (nginx's `deny` for the whole server).
    pub block_cidrs: Vec<crate::cidr::Cidr>,
    /// The controller ConfigMap's `allow-cross-namespace-resources`: an Ingress may name a
    /// Secret of another namespace (`auth-secret`, `auth-tls-secret`).
    pub allow_cross_namespace: bool,
    /// `--auth-url-allow`: the hosts outside the cluster an `auth-url` may call.
    pub auth_url_allow: crate::route_policy::AuthUrlAllow,
}

/// The TLS versions and TLS 1.2 cipher suites the HTTPS listener offers (the controller
/// ConfigMap's `ssl-protocols` and `ssl-ciphers`); `None`: rustls's safe defaults.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ServerTls {
    /// Offer TLS 1.2.
    pub tls12: Option<bool>,
    /// Offer TLS 1.3.
    pub tls13: Option<bool>,
    /// TLS 1.2 suites by their IANA names (`TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`), in the
    /// ConfigMap's order; TLS 1.3 suites are not chosen by `ssl-ciphers` (as in nginx).
    pub tls12_suites: Option<Vec<String>>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            balance: BalancePolicy::LeastRequest,
            ssl_redirect: true,
            max_in_flight: None,
            hsts: None,
            limits: crate::route_policy::RouteLimits::default(),
            global_auth: BTreeMap::new(),
            no_auth_locations: vec!["/.well-known/acme-challenge".to_string()],
            server_tls: ServerTls::default(),
            custom_errors: Vec::new(),
            proxy_protocol: None,
            underscores_in_headers: false,
            upstream_keepalive_timeout: None,
            keep_alive: None,
            keep_alive_requests: None,
            allowed_response_headers: Vec::new(),
            source_ranges: crate::route_policy::SourceRanges {
                allow: Vec::new(),
                deny: Vec::new(),
            },
            block_cidrs: Vec::new(),
            allow_cross_namespace: false,
            auth_url_allow: crate::route_policy::AuthUrlAllow::default(),
        }
    }
}

/// Certificates by Secret; only Secrets that are referenced and structurally valid are present.
pub type Certificates = BTreeMap<ObjectRef, Arc<CertificatePem>>;

/// One annotation of one Ingress as the operator's page lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct AnnotationNote {
    /// The full key.
    pub name: String,
    /// The value, redacted (`annotations::in_force::shown_value`).
    pub value: String,
    /// `honoured`, `differs`, `unsupported`, `refused`, `fails closed` or `invalid`.
    pub verdict: &'static str,
    /// Why, empty when honoured.
    pub why: String,
}
