//! The admin listener: health, readiness, Prometheus metrics and the JSON status/upstreams API
//! (the read side of the NGINX Plus upstream API).
//!
//! With `hostNetwork` the admin port is open on every node's address, so it is hardened like
//! the edge: `/healthz` and `/readyz` answer anyone (kubelet probes them from the node);
//! `/metrics`, `/api/v1/*` and the operator's page (`/`, in `page.rs`) — pod IPs, hosts,
//! certificate serials — answer loopback peers only unless [`AdminOptions`] exposes them
//! (`--admin-expose metrics,api`), and the API and page answer only a Host that is an address
//! or `localhost` (DNS rebinding); connections are capped, HTTP/1.1 only, and cut after a
//! header timeout and a lifetime.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;

use crate::state::dataplane::DataPlane;

pub mod api;
mod page;

pub use api::{EndpointStatus, Status, UpstreamStatus, status, upstreams};

fn text(status: StatusCode, ct: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
    // Live state: never cached, never sniffed into something executable.
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
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
    // The operator's page shows what the API does, so it follows the API's rule.
    let api_like = path.starts_with("/api/") || page::is_page(path);
    let private = (path == "/metrics" && !opts.expose_metrics) || (api_like && !opts.expose_api);
    if private && !local {
        return text(
            StatusCode::FORBIDDEN,
            "text/plain",
            "forbidden: served on loopback only (see --admin-expose)\n",
        );
    }
    // A web page on the operator's machine must not read the loopback-only API through a
    // name it rebinds to 127.0.0.1 (DNS rebinding): the Host must be an address or localhost.
    if api_like && !opts.expose_api && !page::host_is_local(req.headers().get(header::HOST)) {
        return text(
            StatusCode::FORBIDDEN,
            "text/plain",
            "forbidden: the Host header must be an IP address or localhost (see --admin-expose)\n",
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
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let tasks = i64::try_from(rt.metrics().num_alive_tasks()).unwrap_or(i64::MAX);
                dp.metrics.runtime_tasks.set(tasks);
            }
            text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                dp.metrics.render(),
            )
        }
        "/api/v1/status" => json(&status(dp)),
        "/api/v1/upstreams" => json(&upstreams(dp)),
        "/api/v1/routes" => json(&api::routes(dp)),
        "/api/v1/certificates" => json(&api::certificates(dp)),
        "/api/v1/changes" => json(&dp.changes.newest_first()),
        "/api/v1/traffic" => json(&dp.metrics.traffic.report()),
        p if page::is_page(p) => page::asset(p).unwrap_or_else(not_found),
        _ => not_found(),
    }
}

fn not_found() -> Response<Full<Bytes>> {
    text(
        StatusCode::NOT_FOUND,
        "text/plain",
        "not found; try / /healthz /readyz /metrics /api/v1/status /api/v1/upstreams \
         /api/v1/routes /api/v1/certificates /api/v1/changes /api/v1/traffic\n",
    )
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

    #[test]
    fn the_page_follows_the_api_rule_and_refuses_rebound_names() {
        let dp = DataPlane::new(ProxySettings::default(), None).unwrap();
        let closed = AdminOptions::default();
        let with_host = |opts: &AdminOptions, peer: &str, path: &str, host: &str| {
            let req = Request::get(path)
                .header(header::HOST, host)
                .body(())
                .unwrap();
            respond(&dp, opts, peer.parse().unwrap(), &req).status()
        };
        for path in [
            "/",
            "/ui/app.js",
            "/ui/app.css",
            "/api/v1/routes",
            "/api/v1/traffic",
        ] {
            assert_eq!(
                with_host(&closed, "127.0.0.1", path, "127.0.0.1:10254"),
                StatusCode::OK,
                "{path}"
            );
            assert_eq!(
                with_host(&closed, "127.0.0.1", path, "localhost:10254"),
                StatusCode::OK
            );
            assert_eq!(
                with_host(&closed, "10.0.0.7", path, "10.0.0.1:10254"),
                StatusCode::FORBIDDEN
            );
            // A page elsewhere whose name now resolves to 127.0.0.1.
            assert_eq!(
                with_host(&closed, "127.0.0.1", path, "evil.example:10254"),
                StatusCode::FORBIDDEN,
                "{path}"
            );
        }
        // Probes and metrics keep working under any name (kubelet, Prometheus by node name).
        assert_eq!(
            with_host(&closed, "127.0.0.1", "/metrics", "node-1.example:10254"),
            StatusCode::OK
        );
        let exposed = AdminOptions {
            expose_api: true,
            ..AdminOptions::default()
        };
        assert_eq!(
            with_host(&exposed, "10.0.0.7", "/", "node-1.example:10254"),
            StatusCode::OK
        );
        assert_eq!(
            get(&dp, &closed, "127.0.0.1", "/ui/other.js"),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn every_api_document_is_json_and_never_cached() {
        let dp = DataPlane::new(ProxySettings::default(), None).unwrap();
        for path in [
            "/api/v1/status",
            "/api/v1/upstreams",
            "/api/v1/routes",
            "/api/v1/certificates",
            "/api/v1/changes",
            "/api/v1/traffic",
        ] {
            let req = Request::get(path).body(()).unwrap();
            let r = respond(
                &dp,
                &AdminOptions::default(),
                "127.0.0.1".parse().unwrap(),
                &req,
            );
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
            assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        }
    }
}
