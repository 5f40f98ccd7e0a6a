//! ingress-nginx's `default-backend` and `custom-http-errors`: a route whose pool has no
//! endpoint sends its requests to the Ingress's default backend, and an upstream answer with
//! one of the listed statuses is replaced by the default backend's answer to a GET carrying
//! ingress-nginx's `X-Code`, `X-Format`, `X-Original-URI`, `X-Namespace`, `X-Ingress-Name`,
//! `X-Service-Name`, `X-Service-Port` and `X-Request-ID` headers.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::handler::ConnInfo;
use crate::handler::local::{error_response, timed_out};
use crate::state::routes::{Action, Target};
use crate::upstream::body::{ReqBody, RespBody};
use crate::upstream::cluster::Cluster;
use crate::upstream::retry::{self, Plan};
use crate::wire::hop;

/// The pool a request goes to: the route's, or its default backend's when the route has no
/// pool or its pool has no endpoint left. `None`: the route's own answer (503) stands.
pub(crate) fn pool_for(action: &Action) -> Option<&Arc<Cluster>> {
    let own = match &action.target {
        Target::Cluster(c) => Some(c),
        Target::Unavailable(_) => None,
    };
    let empty = |c: &Cluster| {
        let set = c.endpoints.load();
        set.ready.is_empty() && set.draining.is_empty()
    };
    match (own, &action.fallback) {
        (Some(c), Some(f)) if empty(c) => Some(f),
        (None, Some(f)) => Some(f),
        (own, _) => own,
    }
}

/// What the error page request needs from the original request.
#[derive(Debug)]
pub(crate) struct Original {
    /// Path and query.
    pub uri: String,
    /// The `Host` sent upstream.
    pub host: Option<HeaderValue>,
    /// `Accept`, sent as `X-Format`.
    pub accept: Option<HeaderValue>,
    /// The client's `X-Request-ID`, if any.
    pub request_id: Option<HeaderValue>,
}

impl Original {
    /// Notes what an error page would need, before the request goes upstream.
    pub(crate) fn of(headers: &HeaderMap, uri: &http::Uri) -> Self {
        Self {
            uri: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
            host: headers.get(header::HOST).cloned(),
            accept: headers.get(header::ACCEPT).cloned(),
            request_id: headers.get("x-request-id").cloned(),
        }
    }
}

/// Whether `status` from `pool` is to be replaced by the default backend's page.
pub(crate) fn intercepts(action: &Action, pool: &Cluster, status: StatusCode) -> bool {
    action
        .edits
        .as_ref()
        .is_some_and(|e| e.custom_errors.contains(&status.as_u16()))
        && action
            .fallback
            .as_ref()
            .is_some_and(|f| !std::ptr::eq(f.as_ref(), pool))
}

/// Whether `pool` is the route's default backend serving in place of the route's own pool
/// (which has no endpoint, or is gone).
pub(crate) fn falls_back(action: &Action, pool: &Cluster) -> bool {
    action
        .fallback
        .as_ref()
        .is_some_and(|f| std::ptr::eq(f.as_ref(), pool))
        && match &action.target {
            Target::Cluster(own) => !std::ptr::eq(own.as_ref(), pool),
            Target::Unavailable(_) => true,
        }
}

/// Sets ingress-nginx's error-page fields on a request to the default backend: `X-Code`
/// (`status`), `X-Format` (the client's `Accept`, else `text/html`), `X-Original-URI`,
/// `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port`. Whatever a client sent
/// under those names is replaced, so that the page is chosen by sluice, never by the client.
/// Used for `custom-http-errors` pages and for requests the default backend serves because
/// the route's pool has no endpoint (with `X-Code: 503`), as ingress-nginx sends them.
pub(crate) fn set_fields(
    action: &Action,
    status: StatusCode,
    original_uri: &str,
    accept: Option<HeaderValue>,
    h: &mut HeaderMap,
) {
    let (namespace, ingress) = action
        .names
        .ingress
        .split_once('/')
        .unwrap_or(("", &action.names.ingress));
    let (service, port) = match &action.target {
        Target::Cluster(c) => (c.key.service.clone(), c.key.port.to_string()),
        Target::Unavailable(_) => (String::new(), String::new()),
    };
    let fields: [(&'static str, String); 6] = [
        ("x-code", status.as_u16().to_string()),
        ("x-original-uri", original_uri.to_string()),
        ("x-namespace", namespace.to_string()),
        ("x-ingress-name", ingress.to_string()),
        ("x-service-name", service),
        ("x-service-port", port),
    ];
    for (name, value) in fields {
        let name = HeaderName::from_static(name);
        match HeaderValue::from_str(&value) {
            Ok(v) if !value.is_empty() => {
                h.insert(name, v);
            }
            _ => {
                h.remove(name);
            }
        }
    }
    h.insert(
        HeaderName::from_static("x-format"),
        accept.unwrap_or_else(|| HeaderValue::from_static("text/html")),
    );
}

/// Asks the default backend for the page of `status` and returns its answer.
pub(crate) async fn page(
    action: &Action,
    conn: &ConnInfo,
    status: StatusCode,
    original: Original,
    timeout: std::time::Duration,
) -> Response<RespBody> {
    let Some(fallback) = &action.fallback else {
        return Response::new(RespBody::empty());
    };
    let mut req = Request::new(ReqBody::empty());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = original
        .uri
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/"));
    let h = req.headers_mut();
    set_fields(action, status, &original.uri, original.accept.clone(), h);
    if let Some(v) = original.request_id {
        h.insert(HeaderName::from_static("x-request-id"), v);
    }
    if let Some(v) = original.host {
        h.insert(header::HOST, v);
    }
    let plan = Plan::new(&Method::GET, &action.next_upstream, 3, None);
    let fwd = conn.proxy_headers();
    match tokio::time::timeout(
        timeout,
        retry::send(fallback, req, plan, &fwd, Instant::now()),
    )
    .await
    {
        Err(_) => timed_out(&fallback.name, timeout),
        Ok(Err(e)) => error_response(&fallback.name, &e),
        Ok(Ok(d)) => {
            let (mut parts, body) = d.response.into_parts();
            hop::strip(&mut parts.headers, false);
            if let Some(e) = &action.edits {
                e.set_response_headers(&mut parts.headers);
            }
            parts.version = http::Version::HTTP_11;
            Response::from_parts(parts, body)
        }
    }
}
