//! What a routed request becomes on its way to the pool, and what the pool's answer becomes on
//! its way back: hop-by-hop fields, the authority, the route's edits, the fields the gates
//! pass on, and, for an HTTP/2 pool, the absolute URI.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode, Uri, Version};

use super::admit::Admitted;
use super::upgrade_allowed;
use crate::handler::errors;
use crate::policy::edits::Edits;
use crate::state::dataplane::DataPlane;
use crate::state::routes::Action;
use crate::upstream::body::RespBody;
use crate::upstream::cluster::Cluster;
use crate::wire::decode::lists;
use crate::wire::hop;

/// Makes the request's head the upstream's; returns the client's side of an upgrade it may
/// tunnel (a WebSocket), taken out of the request.
pub(super) fn upstream_parts(
    dp: &DataPlane,
    action: &Action,
    cluster: &Cluster,
    admitted: &Admitted<'_>,
    parts: &mut http::request::Parts,
) -> Option<hyper::upgrade::OnUpgrade> {
    let h2_up = cluster.protocol.is_h2();
    let upgrade = !h2_up
        && lists(&parts.headers, &header::CONNECTION, "upgrade")
        && parts
            .headers
            .get(header::UPGRADE)
            .is_some_and(|v| upgrade_allowed(v.as_bytes(), &dp.settings.allowed_upgrades));
    let client_upgrade = if upgrade {
        parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
    } else {
        None
    };
    hop::strip(&mut parts.headers, upgrade);
    // The request was routed on the target's authority when it has one (absolute-form, HTTP/2
    // `:authority`), so the upstream gets that host too (RFC 9112 §3.2.2), whatever `Host` said.
    if let Some(a) = parts
        .uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(header::HOST, a);
    }
    // The default backend serving for a pool with no endpoint gets ingress-nginx's
    // error-page fields, as for a `custom-http-errors` page (the URI before any rewrite).
    let fallback_fields = errors::falls_back(action, cluster).then(|| {
        let uri = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        (uri.to_string(), parts.headers.get(header::ACCEPT).cloned())
    });
    if let Some(e) = action.edits.as_deref() {
        e.apply(parts);
    }
    for p in [&admitted.cert_fields, &admitted.passed]
        .into_iter()
        .flatten()
    {
        p.apply(&mut parts.headers);
    }
    if let Some((uri, accept)) = fallback_fields {
        let status = StatusCode::SERVICE_UNAVAILABLE;
        errors::set_fields(action, status, &uri, accept, &mut parts.headers);
    }
    if h2_up {
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.version = Version::HTTP_2;
        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("localhost");
        let scheme = if cluster.protocol.is_tls() {
            "https"
        } else {
            "http"
        };
        parts.uri = format!("{scheme}://{host}{pq}")
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/"));
    }
    client_upgrade
}

/// The pool's answer as the client gets it: hop-by-hop fields gone, the route's response
/// fields, CORS, a new session cookie, what a passed auth check adds, and the bandwidth limit.
pub(super) fn answer(
    edits: Option<&Edits>,
    admitted: Admitted<'_>,
    session: Option<String>,
    mut rparts: http::response::Parts,
    rbody: RespBody,
) -> Response<RespBody> {
    hop::strip(&mut rparts.headers, false);
    if let Some(e) = edits {
        e.set_response_headers(&mut rparts.headers);
    }
    if let (Some(origin), Some(cors)) = (admitted.cors_origin, edits.and_then(|e| e.cors.as_ref()))
    {
        cors.apply(&mut rparts.headers, origin, false);
    }
    if let (Some(value), Some(a)) = (&session, edits.and_then(|e| e.affinity.as_ref()))
        && let Some(v) = a.set_cookie(value, std::time::SystemTime::now())
    {
        rparts.headers.append(header::SET_COOKIE, v);
    }
    if let Some(p) = &admitted.passed {
        p.finish(rparts.status, &mut rparts.headers);
    }
    rparts.version = Version::HTTP_11;
    let rbody = match edits.and_then(|e| e.bandwidth) {
        Some(b) => rbody.throttled(b.rate, b.after),
        None => rbody,
    };
    Response::from_parts(rparts, rbody)
}
