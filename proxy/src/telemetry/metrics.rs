//! Prometheus metrics. Families are registered once and never swapped; per-route handles are
//! resolved when a route table is compiled, so a request only touches atomics.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use super::histogram::{AtomicHistogram, FAST_BUCKETS, LATENCY_BUCKETS};

/// Labels of per-route metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// `namespace/name` of the Ingress.
    pub ingress: String,
    /// `namespace/service:port`, or empty when the route has no usable backend.
    pub service: String,
    /// `2xx`, `3xx`, `4xx`, `5xx` or `1xx`.
    pub code: &'static str,
}

/// Labels naming an upstream pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabels {
    /// `namespace/service:port`.
    pub service: String,
}

/// Labels of the retries counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    /// `namespace/service:port`.
    pub service: String,
    /// Why the attempt before was not the last (see `upstream::RetryReason`).
    pub reason: &'static str,
}

/// Labels of the endpoints-per-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// `namespace/service:port`.
    pub service: String,
    /// `up`, `draining` or `ejected`.
    pub state: &'static str,
}

/// Labels with a result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// e.g. `applied`, `skipped`, `ok`, `error`.
    pub result: &'static str,
}

/// Labels of the TLS handshake counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// `TLSv1.2`, `TLSv1.3`, or `none` when the handshake did not finish.
    pub version: &'static str,
    /// `ok`, `error` or `timeout`.
    pub result: &'static str,
}

/// Handles of the TLS handshake metrics, resolved once (a handshake touches only atomics).
#[derive(Debug, Clone)]
pub struct HandshakeStats {
    ok_tls12: Counter,
    ok_tls13: Counter,
    error: Counter,
    timeout: Counter,
    duration: AtomicHistogram,
}

impl HandshakeStats {
    /// A finished handshake, by protocol version.
    pub fn ok(&self, version: Option<rustls::ProtocolVersion>, took: Duration) {
        match version {
            Some(rustls::ProtocolVersion::TLSv1_2) => self.ok_tls12.inc(),
            _ => self.ok_tls13.inc(),
        };
        self.duration.observe(took);
    }

    /// A handshake that failed.
    pub fn error(&self) {
        self.error.inc();
    }

    /// A handshake that did not finish in time.
    pub fn timeout(&self) {
        self.timeout.inc();
    }
}

/// Labels of certificate metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    /// The TLS host.
    pub host: String,
}

/// Labels of the certificate info metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertInfoLabels {
    /// The TLS host.
    pub host: String,
    /// Serial number in hex.
    pub serial: String,
}

/// Every metric family sluice exports.
#[derive(Debug)]
pub struct Metrics {
    /// Requests by ingress, service and status class.
    pub requests: Family<RouteLabels, Counter>,
    /// Request duration by ingress (from request head to response head).
    pub request_duration: Family<ServiceLabels, AtomicHistogram, fn() -> AtomicHistogram>,
    /// Upstream connect failures by pool.
    pub connect_errors: Family<ServiceLabels, Counter>,
    /// Retries by pool and reason.
    pub retries: Family<RetryLabels, Counter>,
    /// Passive-health ejections by pool.
    pub ejections: Family<ServiceLabels, Counter>,
    /// Endpoints per pool by state (refreshed on scrape).
    pub endpoints: Family<EndpointLabels, Gauge>,
    /// Snapshot applies by result (`applied`, `skipped`) and endpoint-only updates (`endpoints`).
    pub config_applies: Family<ResultLabels, Counter>,
    /// Time spent applying a snapshot.
    pub config_apply_duration: AtomicHistogram,
    /// Problems in the current snapshot.
    pub config_problems: Gauge,
    /// Time from an endpoint change being seen to its pool being swapped.
    pub propagation_delay: AtomicHistogram,
    /// Client connections open now.
    pub connections_active: Gauge,
    /// Tasks alive on the runtime (refreshed on scrape): a count that only grows under
    /// steady traffic is a leak the soak looks for.
    pub runtime_tasks: Gauge,
    /// Client connections accepted.
    pub connections: Counter,
    /// TLS handshakes by protocol version and result.
    pub tls_handshakes: Family<HandshakeLabels, Counter>,
    /// TLS handshake duration (finished handshakes).
    pub tls_handshake_duration: AtomicHistogram,
    /// Time from sending a request upstream to its response head, by pool.
    pub upstream_response_duration: Family<ServiceLabels, AtomicHistogram, fn() -> AtomicHistogram>,
    /// Access log lines dropped because the writer fell behind.
    pub access_log_dropped: Counter,
    /// Seconds since the epoch at which each host's certificate expires.
    pub cert_expiry: Family<CertLabels, Gauge>,
    /// 1 per host and certificate serial in use.
    pub cert_info: Family<CertInfoLabels, Gauge>,
    /// Each route's traffic over the last minutes (the operator's page; not exported).
    pub traffic: super::traffic::Traffic,
    /// The registry all of the above are registered in.
    pub registry: Registry,
}

fn latency_hist() -> AtomicHistogram {
    AtomicHistogram::new(LATENCY_BUCKETS)
}

impl Metrics {
    /// Creates and registers every family under the `sluice_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let m = Metrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_hist),
            connect_errors: Family::default(),
            retries: Family::default(),
            ejections: Family::default(),
            endpoints: Family::default(),
            config_applies: Family::default(),
            config_apply_duration: AtomicHistogram::new(FAST_BUCKETS),
            config_problems: Gauge::default(),
            propagation_delay: AtomicHistogram::new(FAST_BUCKETS),
            connections_active: Gauge::default(),
            runtime_tasks: Gauge::default(),
            connections: Counter::default(),
            tls_handshakes: Family::default(),
            tls_handshake_duration: AtomicHistogram::new(FAST_BUCKETS),
            upstream_response_duration: Family::new_with_constructor(latency_hist),
            access_log_dropped: Counter::default(),
            cert_expiry: Family::default(),
            cert_info: Family::default(),
            traffic: super::traffic::Traffic::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "HTTP requests by ingress, service and status class",
            m.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request head to response head, by upstream service",
            m.request_duration.clone(),
        );
        registry.register(
            "upstream_connect_errors",
            "Failed connection attempts to upstream endpoints",
            m.connect_errors.clone(),
        );
        registry.register(
            "upstream_retries",
            "Attempts that followed a failed one, by pool and reason",
            m.retries.clone(),
        );
        registry.register(
            "upstream_ejections",
            "Endpoints ejected by passive health checking",
            m.ejections.clone(),
        );
        registry.register(
            "upstream_endpoints",
            "Endpoints per pool by state",
            m.endpoints.clone(),
        );
        registry.register(
            "config_applies",
            "Configuration applies by result",
            m.config_applies.clone(),
        );
        registry.register(
            "config_apply_duration_seconds",
            "Time spent applying a configuration snapshot",
            m.config_apply_duration.clone(),
        );
        registry.register(
            "config_problems",
            "Problems reported for the current configuration",
            m.config_problems.clone(),
        );
        registry.register(
            "endpoint_propagation_delay_seconds",
            "Time from an endpoint change being seen to its pool being swapped",
            m.propagation_delay.clone(),
        );
        registry.register(
            "connections_active",
            "Client connections currently open",
            m.connections_active.clone(),
        );
        registry.register(
            "runtime_tasks",
            "Tasks alive on sluice's runtime (connections, requests in flight, background loops)",
            m.runtime_tasks.clone(),
        );
        registry.register(
            "connections",
            "Client connections accepted",
            m.connections.clone(),
        );
        registry.register(
            "tls_handshakes",
            "TLS handshakes by protocol version and result",
            m.tls_handshakes.clone(),
        );
        registry.register(
            "tls_handshake_duration_seconds",
            "Time from a client connection being accepted to its TLS handshake finishing",
            m.tls_handshake_duration.clone(),
        );
        registry.register(
            "upstream_response_duration_seconds",
            "Time from sending a request upstream to its response head, retries included, by pool",
            m.upstream_response_duration.clone(),
        );
        registry.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind",
            m.access_log_dropped.clone(),
        );
        registry.register(
            "tls_certificate_expiry_seconds",
            "Unix time at which the certificate served for a host expires",
            m.cert_expiry.clone(),
        );
        registry.register(
            "tls_certificate_info",
            "Certificate in use per host (value 1), labelled with its serial",
            m.cert_info.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The handshake handles, resolved once.
    pub fn handshake_stats(&self) -> HandshakeStats {
        let get = |version, result| {
            self.tls_handshakes
                .get_or_create_owned(&HandshakeLabels { version, result })
        };
        HandshakeStats {
            ok_tls12: get("TLSv1.2", "ok"),
            ok_tls13: get("TLSv1.3", "ok"),
            error: get("none", "error"),
            timeout: get("none", "timeout"),
            duration: self.tls_handshake_duration.clone(),
        }
    }

    /// Renders the registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Per-route counters resolved at compile time so a request only increments atomics.
#[derive(Debug, Clone)]
pub struct RouteStats {
    by_class: [Counter; 5],
    duration: AtomicHistogram,
    /// The route's own histogram (the operator's page; see [`super::traffic`]).
    route_duration: AtomicHistogram,
}

impl RouteStats {
    /// Resolves the handles for one route.
    pub fn new(m: &Metrics, ingress: &str, service: &str) -> Self {
        let get = |code: &'static str| {
            m.requests.get_or_create_owned(&RouteLabels {
                ingress: ingress.to_string(),
                service: service.to_string(),
                code,
            })
        };
        let by_class = [get("1xx"), get("2xx"), get("3xx"), get("4xx"), get("5xx")];
        Self {
            route_duration: m.traffic.register(ingress, service, &by_class),
            by_class,
            duration: m.request_duration.get_or_create_owned(&ServiceLabels {
                service: service.to_string(),
            }),
        }
    }

    /// Counts one response.
    pub fn record(&self, status: u16, elapsed: Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].inc();
        self.duration.observe(elapsed);
        self.route_duration.observe(elapsed);
    }
}
