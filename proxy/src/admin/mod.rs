//! The admin listener: health, readiness, Prometheus metrics and the JSON status/upstreams API
//! (the read side of the NGINX Plus upstream API).
//!
//! With `hostNetwork` the admin port is open on every node's address, so it is hardened like
//! the edge: `/healthz` and `/readyz` answer anyone (kubelet probes them from the node);
//! `/metrics` and `/api/v1/*` — pod IPs, hosts, certificate serials — answer loopback peers
//! only unless [`AdminOptions`] exposes them (`--admin-expose metrics,api`); connections are
//! capped, HTTP/1.1 only, and cut after a header timeout and a lifetime.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;

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
                    ewma_ms: m.endpoint.ewma().as_secs_f64() * 1000.0,
                })
                .collect(),
        })
        .collect()
}

fn text(status: StatusCode, ct: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
    r
}

fn json<T: Serialize>(v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec_pretty(v) {
        Ok(b) => text(StatusCode::OK, "application/json", b),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            e.to_string(),
        ),
    }
}

/// Who may read what on the admin listener, and its limits.
#[derive(Debug, Clone, Copy)]
pub struct AdminOptions {
    /// Serve `/metrics` to peers that are not on loopback.
    pub expose_metrics: bool,
    /// Serve `/api/v1/*` to peers that are not on loopback.
    pub expose_api: bool,
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// Time to send a request head.
    pub header_timeout: std::time::Duration,
    /// Longest a connection stays open.
    pub max_lifetime: std::time::Duration,
}

impl Default for AdminOptions {
    fn default() -> Self {
        Self {
            expose_metrics: false,
            expose_api: false,
            max_connections: 64,
            header_timeout: std::time::Duration::from_secs(5),
            max_lifetime: std::time::Duration::from_secs(60),
        }
    }
}

/// Answers one admin request from `peer`.
pub fn respond<B>(
    dp: &DataPlane,
    opts: &AdminOptions,
    peer: std::net::IpAddr,
    req: &Request<B>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    let local = peer.is_loopback()
        || matches!(peer, std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()));
    let path = req.uri().path();
    let private = (path == "/metrics" && !opts.expose_metrics)
        || (path.starts_with("/api/") && !opts.expose_api);
    if private && !local {
        return text(
            StatusCode::FORBIDDEN,
            "text/plain",
            "forbidden: served on loopback only (see --admin-expose)\n",
        );
    }
    match path {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" if dp.is_yielding() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "handing over to a successor\n",
        ),
        "/readyz" if dp.is_ready() => text(StatusCode::OK, "text/plain", "ready\n"),
        "/readyz" if dp.is_draining() => {
            text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: waiting for the first configuration\n",
        ),
        "/metrics" => {
            dp.refresh_endpoint_gauges();
            text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                dp.metrics.render(),
            )
        }
        "/api/v1/status" => json(&status(dp)),
        "/api/v1/upstreams" => json(&upstreams(dp)),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /healthz /readyz /metrics /api/v1/status /api/v1/upstreams\n",
        ),
    }
}

/// Serves the admin API until the task is dropped.
pub async fn serve(listener: TcpListener, dp: Arc<DataPlane>, opts: AdminOptions) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout);
    let builder = Arc::new(builder);
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.max_connections.max(1)));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        // Over the cap: the connection is closed at once (dropped), never queued.
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let dp = Arc::clone(&dp);
        let builder = Arc::clone(&builder);
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req| {
                let r = respond(&dp, &opts, peer.ip(), &req);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(opts.max_lifetime, conn).await;
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::settings::ProxySettings;

    fn get(dp: &DataPlane, opts: &AdminOptions, peer: &str, path: &str) -> StatusCode {
        let req = Request::get(path).body(()).unwrap();
        respond(dp, opts, peer.parse().unwrap(), &req).status()
    }

    #[test]
    fn only_probes_answer_off_the_node_unless_exposed() {
        let dp = DataPlane::new(ProxySettings::default(), None).unwrap();
        let closed = AdminOptions::default();
        for peer in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(
                get(&dp, &closed, peer, "/metrics"),
                StatusCode::OK,
                "{peer}"
            );
            assert_eq!(get(&dp, &closed, peer, "/api/v1/status"), StatusCode::OK);
        }
        for peer in ["10.0.0.7", "192.0.2.1", "2001:db8::1"] {
            assert_eq!(get(&dp, &closed, peer, "/healthz"), StatusCode::OK);
            assert_eq!(
                get(&dp, &closed, peer, "/readyz"),
                StatusCode::SERVICE_UNAVAILABLE
            );
            assert_eq!(get(&dp, &closed, peer, "/metrics"), StatusCode::FORBIDDEN);
            assert_eq!(
                get(&dp, &closed, peer, "/api/v1/status"),
                StatusCode::FORBIDDEN
            );
            assert_eq!(
                get(&dp, &closed, peer, "/api/v1/upstreams"),
                StatusCode::FORBIDDEN
            );
        }
        let metrics = AdminOptions {
            expose_metrics: true,
            ..AdminOptions::default()
        };
        assert_eq!(get(&dp, &metrics, "10.0.0.7", "/metrics"), StatusCode::OK);
        assert_eq!(
            get(&dp, &metrics, "10.0.0.7", "/api/v1/status"),
            StatusCode::FORBIDDEN
        );
        let all = AdminOptions {
            expose_metrics: true,
            expose_api: true,
            ..AdminOptions::default()
        };
        assert_eq!(get(&dp, &all, "10.0.0.7", "/api/v1/status"), StatusCode::OK);
    }
}
