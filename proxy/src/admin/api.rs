//! The documents of the JSON API (`/api/v1/*`), which the operator's page draws from: every
//! figure on the page is one of these. Nothing here reads a key, a Secret's data or a
//! credential: certificates are described by host, serial and dates; annotation values are
//! redacted by translation (`sluice_config::annotations::in_force`).

use std::collections::BTreeMap;

use serde::Serialize;
use sluice_config::gateway_model::{BackendTarget, GatewayRule, PathRule};
use sluice_config::{AnnotationNote, ObjectRef, PathKind, Route, RouteAction, Snapshot};

use crate::clock::now_nanos;
use crate::state::dataplane::DataPlane;

/// `GET /api/v1/status`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// sluice version.
    pub version: &'static str,
    /// Ready to serve.
    pub ready: bool,
    /// Draining for shutdown.
    pub draining: bool,
    /// Generation of the applied configuration.
    pub generation: u64,
    /// Content hash of the applied snapshot (hex).
    pub snapshot_hash: String,
    /// Unix time (ms) of the last apply.
    pub last_apply_unix_ms: u64,
    /// Virtual hosts.
    pub virtual_hosts: usize,
    /// Routes.
    pub routes: usize,
    /// Upstream pools.
    pub upstreams: usize,
    /// Endpoints across pools.
    pub endpoints: usize,
    /// TLS hosts.
    pub tls_hosts: usize,
    /// Problems (translation and certificates), as sentences.
    pub problems: Vec<String>,
}

/// One endpoint in `GET /api/v1/upstreams`.
#[derive(Debug, Serialize)]
pub struct EndpointStatus {
    /// Address.
    pub address: String,
    /// `up`, `draining` or `ejected`.
    pub state: &'static str,
    /// In-flight requests.
    pub in_flight: u32,
    /// Requests sent.
    pub requests: u64,
    /// Failures.
    pub failures: u64,
    /// Peak-EWMA latency estimate in milliseconds.
    pub ewma_ms: f64,
}

/// One pool in `GET /api/v1/upstreams`.
#[derive(Debug, Serialize)]
pub struct UpstreamStatus {
    /// `namespace/service:port`.
    pub name: String,
    /// Protocol.
    pub protocol: String,
    /// Balancing policy.
    pub balance: String,
    /// Endpoints.
    pub endpoints: Vec<EndpointStatus>,
}

/// Builds the status document.
pub fn status(dp: &DataPlane) -> Status {
    let snap = dp.current();
    let (vh, routes, tls, mut problems) = snap.as_ref().map_or((0, 0, 0, Vec::new()), |s| {
        (
            s.virtual_hosts().len(),
            s.virtual_hosts().iter().map(|v| v.routes.len()).sum(),
            s.tls().len(),
            s.problems().iter().map(|p| p.to_string()).collect(),
        )
    });
    problems.extend(
        dp.tls_problems()
            .into_iter()
            .map(|p| format!("{}: {}", p.secret, p.message)),
    );
    problems.extend(dp.source_problems());
    let clusters = dp.clusters();
    Status {
        version: env!("CARGO_PKG_VERSION"),
        ready: dp.is_ready(),
        draining: dp.is_draining(),
        generation: dp.generation(),
        snapshot_hash: snap
            .as_ref()
            .map_or_else(String::new, |s| format!("{:016x}", s.hash())),
        last_apply_unix_ms: dp.last_apply_unix_ms(),
        virtual_hosts: vh,
        routes,
        upstreams: clusters.len(),
        endpoints: clusters
            .iter()
            .map(|c| c.endpoints.load().members.len())
            .sum(),
        tls_hosts: tls,
        problems,
    }
}

/// Builds the upstreams document.
pub fn upstreams(dp: &DataPlane) -> Vec<UpstreamStatus> {
    let now = now_nanos();
    dp.clusters()
        .iter()
        .map(|c| UpstreamStatus {
            name: c.name.clone(),
            protocol: format!("{:?}", c.protocol),
            balance: format!("{:?}", c.balance),
            endpoints: c
                .endpoints
                .load()
                .members
                .iter()
                .map(|m| EndpointStatus {
                    address: m.endpoint.addr.to_string(),
                    state: if m.endpoint.is_ejected(now) {
                        "ejected"
                    } else if m.state == sluice_config::EndpointState::Draining {
                        "draining"
                    } else {
                        "up"
                    },
                    in_flight: m.endpoint.in_flight(),
                    requests: m.endpoint.requests(),
                    failures: m.endpoint.failures(),
                    ewma_ms: round3(m.endpoint.ewma().as_secs_f64() * 1000.0),
                })
                .collect(),
        })
        .collect()
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn name_of(r: &ObjectRef) -> String {
    if r.namespace.is_empty() {
        r.name.clone()
    } else {
        format!("{}/{}", r.namespace, r.name)
    }
}

/// One backend of a route in `GET /api/v1/routes`.
#[derive(Debug, Clone, Serialize)]
pub struct BackendView {
    /// `namespace/service:port`, or empty when the reference cannot be used.
    pub pool: String,
    /// Share among the rule's backends (HTTPRoute), `None` for an Ingress path.
    pub weight: Option<u32>,
    /// Why the reference cannot be used (its requests are refused).
    pub invalid: Option<String>,
}

/// A canary beside an Ingress route.
#[derive(Debug, Clone, Serialize)]
pub struct CanaryView {
    /// `namespace/name` of the canary Ingress.
    pub source: String,
    /// Its pool, or empty.
    pub pool: String,
    /// How requests are chosen: header, cookie and weight.
    pub rule: String,
}

/// One route in `GET /api/v1/routes`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteView {
    /// `Ingress`, `HTTPRoute`, `default backend` or `passthrough`.
    pub kind: &'static str,
    /// `namespace/name` of the object that made it.
    pub source: String,
    /// The host (`*` for every host).
    pub host: String,
    /// The path or expression.
    pub path: String,
    /// `Exact`, `Prefix`, `RegularExpression` or `TLS` (passthrough).
    pub path_match: &'static str,
    /// Other conditions (HTTPRoute method, headers, query parameters).
    pub conditions: Vec<String>,
    /// Where requests go.
    pub backends: Vec<BackendView>,
    /// Why every request of the route is answered 503, when it is.
    pub unavailable: Option<String>,
    /// A canary taking part of the route's requests.
    pub canary: Option<CanaryView>,
    /// The Gateway listener it is attached to (`namespace/gateway/listener :port`).
    pub listener: Option<String>,
}

/// `GET /api/v1/routes`.
#[derive(Debug, Clone, Serialize)]
pub struct RoutesDoc {
    /// The generation these routes are from.
    pub generation: u64,
    /// Every route, Ingress paths by host then HTTPRoute rules by listener.
    pub routes: Vec<RouteView>,
    /// Each Ingress's annotations sluice reads, with their verdicts (by `namespace/name`).
    pub annotations: BTreeMap<String, Vec<AnnotationNote>>,
}

fn ingress_route(kind: &'static str, host: String, r: &Route) -> RouteView {
    let (backends, unavailable) = match &r.action {
        RouteAction::Cluster(k) => (
            vec![BackendView {
                pool: k.to_string(),
                weight: None,
                invalid: None,
            }],
            None,
        ),
        RouteAction::Unavailable(why) => (Vec::new(), Some(why.clone())),
    };
    let (path, path_match) = match r.path.kind {
        PathKind::Exact => (r.path.path.clone(), "Exact"),
        PathKind::Prefix if r.path.path.is_empty() => ("/".to_string(), "Prefix"),
        PathKind::Prefix => (r.path.path.clone(), "Prefix"),
        PathKind::Regex => (r.path.path.clone(), "RegularExpression"),
    };
    let canary = r.canary.as_ref().map(|c| {
        let mut rule = Vec::new();
        if let Some((h, _)) = &c.header {
            rule.push(format!("header {h}"));
        }
        if let Some(cookie) = &c.cookie {
            rule.push(format!("cookie {cookie}"));
        }
        if c.weight > 0 {
            rule.push(format!("weight {}/{}", c.weight, c.weight_total));
        }
        CanaryView {
            source: name_of(&c.source),
            pool: match &c.action {
                RouteAction::Cluster(k) => k.to_string(),
                RouteAction::Unavailable(_) => String::new(),
            },
            rule: rule.join(", "),
        }
    });
    RouteView {
        kind,
        source: name_of(&r.source),
        host,
        path,
        path_match,
        conditions: Vec::new(),
        backends,
        unavailable,
        canary,
        listener: None,
    }
}

fn gateway_route(host: String, listener: String, r: &GatewayRule) -> RouteView {
    let (path, path_match) = match &r.path {
        PathRule::Exact(p) => (p.clone(), "Exact"),
        PathRule::Prefix(p) if p.is_empty() => ("/".to_string(), "Prefix"),
        PathRule::Prefix(p) => (p.clone(), "Prefix"),
        PathRule::Regex(re) => (re.source().to_string(), "RegularExpression"),
    };
    let mut conditions: Vec<String> = r.method.iter().map(|m| format!("method {m}")).collect();
    conditions.extend(r.headers.iter().map(|h| format!("header {}", h.name)));
    conditions.extend(r.query.iter().map(|q| format!("query {}", q.name)));
    if r.filters.redirect.is_some() {
        conditions.push("redirects".to_string());
    }
    RouteView {
        kind: "HTTPRoute",
        source: name_of(&r.source),
        host,
        path,
        path_match,
        conditions,
        backends: r
            .backends
            .iter()
            .map(|b| match &b.target {
                BackendTarget::Cluster(k) => BackendView {
                    pool: k.to_string(),
                    weight: Some(b.weight),
                    invalid: None,
                },
                BackendTarget::Invalid(why) => BackendView {
                    pool: String::new(),
                    weight: Some(b.weight),
                    invalid: Some(why.clone()),
                },
            })
            .collect(),
        unavailable: None,
        canary: None,
        listener: Some(listener),
    }
}

/// Builds the routes document from a snapshot.
pub fn routes_of(snap: &Snapshot, generation: u64) -> RoutesDoc {
    let mut routes: Vec<RouteView> = Vec::new();
    for v in snap.virtual_hosts() {
        for r in &v.routes {
            routes.push(ingress_route("Ingress", v.host.to_string(), r));
        }
    }
    if let Some(d) = snap.default_backend() {
        routes.push(ingress_route("default backend", "*".to_string(), d));
    }
    for p in snap.passthrough() {
        let mut view = ingress_route(
            "passthrough",
            p.host.clone(),
            &Route {
                path: sluice_config::PathMatch {
                    kind: PathKind::Prefix,
                    path: String::new(),
                },
                action: p.action.clone(),
                source: p.source.clone(),
                options: Default::default(),
                canary: None,
                fallback: None,
            },
        );
        view.path_match = "TLS";
        routes.push(view);
    }
    for s in snap.gateway_sockets() {
        for l in &s.listeners {
            let listener = format!("{}/{} :{}", name_of(&l.gateway), l.name, s.port);
            for h in &l.hosts {
                for r in &h.rules {
                    routes.push(gateway_route(h.host.to_string(), listener.clone(), r));
                }
            }
        }
    }
    RoutesDoc {
        generation,
        routes,
        annotations: snap
            .annotations()
            .iter()
            .map(|(r, notes)| (name_of(r), notes.clone()))
            .collect(),
    }
}

/// Builds the routes document of the applied snapshot.
pub fn routes(dp: &DataPlane) -> RoutesDoc {
    match dp.current() {
        Some(s) => routes_of(&s, dp.generation()),
        None => RoutesDoc {
            generation: 0,
            routes: Vec::new(),
            annotations: BTreeMap::new(),
        },
    }
}

/// One served certificate in `GET /api/v1/certificates`.
#[derive(Debug, Clone, Serialize)]
pub struct CertificateView {
    /// The TLS host (`*.suffix` for a wildcard, `(default)` for the default certificate).
    pub host: String,
    /// `namespace/name` of the Secret it came from (empty for the default certificate when
    /// generated or given by flag).
    pub secret: String,
    /// `RSA` or `ECDSA`.
    pub key: &'static str,
    /// Leaf serial number (hex).
    pub serial: String,
    /// Leaf DNS names.
    pub names: Vec<String>,
    /// Leaf `notAfter` (Unix seconds).
    pub not_after_unix: i64,
    /// Whole days left until `notAfter` (negative once expired).
    pub days_left: i64,
}

/// Builds the certificates document: each host's served certificate(s), the Gateway
/// listeners' certificates, then the default.
pub fn certificates(dp: &DataPlane) -> Vec<CertificateView> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let store = dp.cert_store().load_full();
    let snap = dp.current();
    let secret_of = |host: &str, ecdsa: bool| -> String {
        snap.as_ref()
            .and_then(|s| s.tls().iter().find(|t| t.host == host))
            .map(|t| match (&t.also, ecdsa) {
                (Some(also), true) => name_of(also),
                _ => name_of(&t.secret),
            })
            .unwrap_or_default()
    };
    let view =
        |host: String, secret: String, c: &crate::state::certs::LoadedCert| CertificateView {
            key: if c.is_ecdsa() { "ECDSA" } else { "RSA" },
            serial: c.serial.clone(),
            names: c.sans.clone(),
            not_after_unix: c.not_after,
            days_left: (c.not_after - now).div_euclid(86_400),
            host,
            secret,
        };
    let mut out: Vec<CertificateView> = store
        .hosts()
        .map(|(host, c)| {
            let secret = secret_of(&host, c.is_ecdsa());
            view(host, secret, c)
        })
        .collect();
    out.sort_by(|a, b| a.host.cmp(&b.host).then(a.key.cmp(b.key)));
    // Gateway listeners' certificates: the listener's hostname, and which listener it is.
    let table = dp.routes();
    let mut listeners: Vec<CertificateView> = table
        .gateway()
        .listener_certificates(table.snapshot())
        .map(|(l, c)| {
            let host = format!("{} ({} listener {})", l.hostname, l.gateway, l.name);
            let secret = l.certificates.first().map(name_of).unwrap_or_default();
            view(host, secret, c)
        })
        .collect();
    listeners.sort_by(|a, b| a.host.cmp(&b.host));
    out.extend(listeners);
    let default_secret = dp
        .settings
        .default_certificate
        .as_ref()
        .map(name_of)
        .unwrap_or_default();
    out.push(view(
        "(default)".to_string(),
        default_secret,
        store.default_cert(),
    ));
    out
}
