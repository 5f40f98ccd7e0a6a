//! The request handler: route → redirect or forward → response, with the standard proxy headers.

mod admit;
mod gateway;
mod rewrite;

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice_config::host::{HostBuf, normalize_request_host, valid_request_host};
use sluice_config::request_path;
use sluice_config::{BalancePolicy, HashKey};
use tokio::io::AsyncWriteExt;

use crate::handler::local::{Local, error_response, timed_out, unasked_switch};
use crate::handler::rules::ResponseRules;
use crate::handler::{ConnInfo, errors};
use crate::io::activity::{Activity, Watched};
use crate::policy::edits::Edits;
use crate::state::dataplane::DataPlane;
use crate::state::routes::{Action, RouteTable, Target};
use crate::telemetry::access_log::{self, UpstreamSeen};
use crate::upstream::balance::{KeySource, cookie, cookie_key, request_hash};
use crate::upstream::body::{ReqBody, RespBody};
use crate::upstream::retry::{self, Plan};
use crate::wire::forwarded;
use crate::wire::length;

/// Routes and forwards the normalised path (see [`sluice_config::request_path`]): a request
/// whose path changes gets the normalised one in its URI (query kept); one whose path climbs
/// above the root, or is not a path, is answered 400 and its connection closed.
fn normalize_path<B>(req: &mut Request<B>) -> Result<(), Local<'static>> {
    let bad = || Local::InvalidPath;
    let uri = req.uri();
    // `*` (OPTIONS) and authority-form have no path to route; CONNECT was refused already.
    if uri.path() == "*" {
        return Ok(());
    }
    let normal = match request_path::normalize(uri.path()) {
        Ok(std::borrow::Cow::Borrowed(_)) => return Ok(()),
        Ok(std::borrow::Cow::Owned(p)) => p,
        Err(_) => return Err(bad()),
    };
    let pq = match uri.query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().map_err(|_| bad())?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| bad())?;
    Ok(())
}

/// Whether every protocol an `Upgrade` value offers is one sluice tunnels (`websocket` unless
/// `--allowed-upgrades` says more). Anything else — `h2c` above all, which would turn the
/// upstream connection into an HTTP/2 connection sluice no longer routes — is not tunnelled:
/// the `Upgrade` field is dropped as hop-by-hop and the request goes on as a plain one.
fn upgrade_allowed(value: &[u8], allowed: &[String]) -> bool {
    let mut any = false;
    for offer in value.split(|b| *b == b',') {
        let offer = offer.trim_ascii();
        let name = offer.split(|b| *b == b'/').next().unwrap_or_default();
        if name.is_empty() {
            continue;
        }
        any = true;
        if !allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(name))
        {
            return false;
        }
    }
    any
}

/// Requests no route may see: `CONNECT` (an ingress is not a forward proxy, and a 2xx to it
/// would turn the upstream connection into a tunnel), and HTTP/1 requests whose target host is
/// ambiguous — several `Host` fields, or none in HTTP/1.1 (RFC 9112 §3.2 requires a 400), since
/// routing and the upstream could otherwise disagree on the host.
fn refuse_early<B>(req: &Request<B>) -> Option<Local<'static>> {
    if req.method() == http::Method::CONNECT {
        return Some(Local::Connect);
    }
    if req.version() <= Version::HTTP_11 {
        let mut hosts = req.headers().get_all(header::HOST).iter();
        let first = hosts.next();
        let missing =
            first.is_none() && req.version() == Version::HTTP_11 && req.uri().authority().is_none();
        if hosts.next().is_some() || missing {
            return Some(Local::HostCount);
        }
    } else {
        // HTTP/2: routed on `:authority`; a `host` field must agree with it, and there may be
        // only one (RFC 9113 §8.3.1), or the backend could read a different host.
        let mut hosts = req.headers().get_all(header::HOST).iter();
        let first = hosts.next();
        let disagrees = match (first, req.uri().authority()) {
            (Some(h), Some(a)) => !h.as_bytes().eq_ignore_ascii_case(a.as_str().as_bytes()),
            _ => false,
        };
        if hosts.next().is_some() || disagrees {
            return Some(Local::AuthorityDisagrees);
        }
    }
    None
}

/// Handles one request end to end. Loads the route table exactly once.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future; an async block once"
)]
pub fn handle(
    dp: Arc<DataPlane>,
    conn: Arc<ConnInfo>,
    mut req: Request<Option<Incoming>>,
) -> impl Future<Output = Response<RespBody>> {
    async move {
        let table = dp.routes();
        let started = Instant::now();
        let Some(log) = dp.access_log() else {
            return handle_in(&table, &dp, &conn, req, started).await;
        };
        let seen = access_log::Seen::of(
            &req.method().clone(),
            &req.uri().clone(),
            req.version(),
            req.headers_mut(),
        );
        let resp = handle_in(&table, &dp, &conn, req, started).await;
        log.record(
            conn.remote.ip(),
            &seen,
            &access_log::Answered::of(&resp),
            started,
        );
        resp
    }
}

/// [`handle`] with the route table already loaded (by the fast path, which looked the request
/// up before deciding it needs the general handler) and the time the request started.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future; an async block once"
)]
pub(crate) fn handle_in(
    table: &RouteTable,
    dp: &DataPlane,
    conn: &ConnInfo,
    mut req: Request<Option<Incoming>>,
    started: Instant,
) -> impl Future<Output = Response<RespBody>> {
    async move {
        if let Some(refusal) = refuse_early(&req) {
            return respond_local(dp, refusal, req.version());
        }
        if let Err(refusal) = normalize_path(&mut req) {
            return respond_local(dp, refusal, req.version());
        }
        // `block-cidrs`: refused whatever the route, by the address the trusted-proxy rules
        // give the client (nginx's `deny` reads `$remote_addr` after the real-IP module).
        if table.blocks_any()
            && table.blocks(forwarded::client_ip(
                conn.remote.ip(),
                req.headers(),
                |ip| dp.settings.trusts(ip),
            ))
        {
            return respond_local(dp, Local::Forbidden, req.version());
        }
        let raw_host = request_host(&req).unwrap_or("");
        if !raw_host.is_empty() && !valid_request_host(raw_host) {
            return respond_local(dp, Local::InvalidHost, req.version());
        }
        if conn.gateway {
            // Boxed: only Gateway sockets take it, and unboxed it would size every request's
            // future.
            return Box::pin(gateway::serve(table, dp, conn, req, started)).await;
        }
        // In a block: the host buffer is not kept across the await below. Routed, and so
        // checked, on the path's route view (encoded separators read, `;` parameters dropped).
        let found = {
            let mut buf = HostBuf::default();
            let host = normalize_request_host(raw_host, &mut buf);
            let path = req.uri().path();
            match request_path::route_view(path) {
                std::borrow::Cow::Borrowed(view) => Some(table.lookup(host, view)),
                // The path read literally (separators and parameters as data, as a backend
                // that does not decode them reads it) must not belong to another route: no
                // single reading is every backend's, so a request whose route depends on the
                // reading is refused rather than checked by the rules of one route and served
                // as another's.
                std::borrow::Cow::Owned(view) => {
                    let routed = table.lookup(host, &view);
                    match (routed, table.lookup(host, path)) {
                        (Some(a), Some(b)) if !std::ptr::eq(a, b) => None,
                        _ => Some(routed),
                    }
                }
            }
        };
        let Some(found) = found else {
            return respond_local(dp, Local::InvalidPath, req.version());
        };
        let Some(action) = found else {
            return respond_local(dp, Local::NoRoute, req.version());
        };
        let http1 = req.version() <= Version::HTTP_11;
        let action = action.choose(req.headers());
        let resp = route(table, dp, conn, action, req).await;
        finish(dp, conn, action, resp, http1, started)
    }
}

/// A local answer before any route was chosen, with the response rules every answer gets.
pub(crate) fn respond_local(
    dp: &DataPlane,
    local: Local<'_>,
    version: Version,
) -> Response<RespBody> {
    let mut r = local.response();
    ResponseRules::unrouted(dp, version <= Version::HTTP_11).apply(r.headers_mut());
    r
}

/// What every routed response gets: the response rules ([`ResponseRules`]: `Server`, HSTS on
/// TLS, `Connection: close` while draining) and the route's request metrics.
pub(crate) fn finish(
    dp: &DataPlane,
    conn: &ConnInfo,
    action: &Action,
    mut resp: Response<RespBody>,
    http1: bool,
    started: Instant,
) -> Response<RespBody> {
    ResponseRules::routed(dp, conn, action, http1).apply(resp.headers_mut());
    action
        .stats
        .record(resp.status().as_u16(), started.elapsed());
    if dp.access_log().is_some() {
        resp.extensions_mut().insert(action.names.clone());
    }
    resp
}

/// The host a request names: its target's authority (absolute-form, HTTP/2 `:authority`),
/// else its `Host` field.
pub(crate) fn request_host<B>(req: &Request<B>) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| {
        req.headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
    })
}

/// The request's host, normalised (lower case, no port), as the route table matched it.
fn host_of<B>(req: &Request<B>) -> Option<String> {
    let mut buf = HostBuf::default();
    normalize_request_host(request_host(req)?, &mut buf).map(str::to_string)
}

/// The answers a route's edits give instead of proxying, in nginx's order: `app-root` (a
/// server-level rewrite, first), then the route's own redirect.
fn edits_answer<B>(edits: &Edits, conn: &ConnInfo, req: &Request<B>) -> Option<Response<RespBody>> {
    let scheme = if conn.tls { "https" } else { "http" };
    let (status, location) = match (&edits.app_root, &edits.host_redirect) {
        // `return 302 $scheme://$http_host<app-root>`: the client's host, port included.
        (Some(root), _) if req.uri().path() == "/" => {
            let host = request_host(req).unwrap_or("localhost");
            (StatusCode::FOUND, format!("{scheme}://{host}{root}"))
        }
        // `from-to-www-redirect`: `return 308 $scheme://<host>$request_uri`.
        (_, Some(target)) => {
            let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
            (
                StatusCode::PERMANENT_REDIRECT,
                format!("{scheme}://{target}{pq}"),
            )
        }
        _ => {
            let (status, location) = edits.redirect.as_ref()?;
            let status = *status;
            return Some(Local::Redirect { status, location }.response());
        }
    };
    let location = HeaderValue::from_str(&location).ok()?;
    Some(
        Local::Redirect {
            status,
            location: &location,
        }
        .response(),
    )
}

#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its future; an async block once"
)]
pub(crate) fn route(
    table: &RouteTable,
    dp: &DataPlane,
    conn: &ConnInfo,
    action: &Action,
    req: Request<Option<Incoming>>,
) -> impl Future<Output = Response<RespBody>> {
    async move {
        let admitted = match admit::admit(table, dp, conn, action, &req).await {
            Ok(a) => a,
            Err(answer) => return answer,
        };
        // The route's pool, or the Ingress's default backend when that pool is gone or empty.
        let Some(cluster) = errors::pool_for(action) else {
            let why: &(dyn std::fmt::Display + Sync) = match &action.target {
                Target::Unavailable(why) => why,
                Target::Cluster(_) => &"no pool",
            };
            return Local::Failed {
                status: StatusCode::SERVICE_UNAVAILABLE,
                pool: "-",
                why,
            }
            .response();
        };
        let s = &dp.settings;
        let edits = action.edits.as_deref();
        let max_body_size = action.max_body_size.unwrap_or(s.max_body_size);
        let request_timeout = action.request_timeout.unwrap_or(s.request_timeout);
        if let Some(len) = length::of_map(req.headers())
            && len > max_body_size
        {
            return Local::BodyTooLarge(max_body_size).response();
        }
        let original = edits
            .filter(|e| !e.custom_errors.is_empty() && action.fallback.is_some())
            .map(|_| errors::Original::of(req.headers(), req.uri()));
        let (mut parts, body) = req.into_parts();
        let client_upgrade = rewrite::upstream_parts(dp, action, cluster, &admitted, &mut parts);
        // `affinity: cookie`: a client without the session cookie gets a new one, and this very
        // request is placed by it, so its next requests land where this one did.
        let session = edits
            .and_then(|e| e.affinity.as_ref())
            .filter(|a| !a.present(&parts.headers))
            .map(|_| crate::policy::edits::SessionCookie::new_value());
        let key = hash_key(&cluster.balance, &parts, conn, session.as_deref());
        let plan = Plan::new(&parts.method, &action.next_upstream, s.upstream_tries, key);
        let up_req = Request::from_parts(parts, ReqBody::new(body, max_body_size));
        let mut fwd = conn.proxy_headers();
        fwd.underscores = action.underscores_in_headers;
        // One clock read serves the deadline, the first attempt and the upstream's duration.
        let sent = Instant::now();
        let deadline = tokio::time::Instant::from_std(sent + request_timeout);
        let sending = retry::send(cluster, up_req, plan, &fwd, sent);
        let delivered = match tokio::time::timeout_at(deadline, sending).await {
            Err(_) => return timed_out(&cluster.name, request_timeout),
            Ok(Err(e)) => return error_response(&cluster.name, &e),
            Ok(Ok(d)) => d,
        };
        let retry::Delivered {
            response,
            upgrade,
            endpoint,
            retries,
            answered,
        } = delivered;
        let (mut rparts, rbody) = response.into_parts();
        let took = answered.saturating_duration_since(sent);
        cluster.stats.response_duration.observe(took);
        if dp.access_log().is_some() {
            rparts.extensions.insert(UpstreamSeen {
                addr: endpoint.addr,
                status: rparts.status.as_u16(),
                duration: took,
                retries,
            });
        }
        if rparts.status == StatusCode::SWITCHING_PROTOCOLS {
            // The connection now belongs to the tunnel; it never goes back to the pool.
            let (Some(client), Some(up)) = (client_upgrade, upgrade) else {
                // A switch nobody asked for: passing it on would leave the client speaking a
                // protocol we do not tunnel.
                return unasked_switch(&cluster.name);
            };
            let guard = conn.slot.as_ref().map(crate::handler::Slot::tunnel);
            tokio::spawn(tunnel(client, up, dp.settings.tunnel_idle_timeout, guard));
            return Response::from_parts(rparts, RespBody::empty());
        }
        if let Some(original) = original
            && errors::intercepts(action, cluster, rparts.status)
        {
            // `custom-http-errors`: the default backend's page replaces the answer.
            // Boxed: a rare answer's 2.9 KB future stays out of every request's.
            return Box::pin(errors::page(
                action,
                conn,
                rparts.status,
                original,
                request_timeout,
            ))
            .await;
        }
        rewrite::answer(edits, admitted, session, rparts, rbody)
    }
}

/// The request's hash for a hashing pool: its key as [`request_hash`] reads it (a cookie is
/// looked for in every `Cookie` field: HTTP/2 clients split them), or the new session value
/// when sluice is about to set the session cookie.
fn hash_key(
    balance: &BalancePolicy,
    parts: &http::request::Parts,
    conn: &ConnInfo,
    new_session: Option<&str>,
) -> Option<u64> {
    let BalancePolicy::Hash(k) = balance else {
        return None;
    };
    if let (HashKey::Cookie(_), Some(v)) = (k, new_session) {
        return Some(cookie_key(v.as_bytes()));
    }
    let headers = &parts.headers;
    let lookup = |name: &str| match k {
        HashKey::Cookie(c) if name == "cookie" => headers
            .get_all(header::COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .find(|v| cookie(v, c).is_some()),
        _ => headers.get(name).map(HeaderValue::as_bytes),
    };
    request_hash(
        k,
        &KeySource {
            client_ip: conn.remote.ip(),
            uri: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
            header: &lookup,
        },
    )
}

/// Joins the client's upgraded connection with the upstream socket: first the bytes the
/// upstream sent right after its 101, then both directions until either side closes.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    up: retry::UpstreamUpgrade,
    idle: std::time::Duration,
    mut guard: Option<crate::handler::TunnelGuard>,
) {
    let retry::UpstreamUpgrade {
        io: mut upstream,
        leftover,
        in_flight: _in_flight,
    } = up;
    let client = match client.await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade failed");
            return;
        }
    };
    let activity = Activity::new();
    let mut client = Watched::new(TokioIo::new(client), Arc::clone(&activity));
    if !leftover.is_empty()
        && let Err(e) = client.write_all(&leftover).await
    {
        tracing::debug!(error = %e, "tunnel closed with an error");
        return;
    }
    // Every byte either way crosses `client`, so its activity is the tunnel's.
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "tunnel closed with an error");
            }
        }
        why = activity.watch(std::time::Duration::MAX, idle) => {
            tracing::debug!(why, "tunnel closed");
        }
        () = async {
            match guard.as_mut() {
                Some(g) => g.deadline().await,
                None => std::future::pending().await,
            }
        } => {
            tracing::debug!("tunnel closed at the drain deadline");
        }
    }
}
