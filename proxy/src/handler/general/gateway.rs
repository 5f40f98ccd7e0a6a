//! Requests on a Gateway's socket: the Gateway API's rules for that socket pick the rule
//! (listener by host, then the rules in the spec's precedence), its filters act (redirect,
//! header modifiers, URL rewrite), a backend is picked by weight, and the request then takes
//! the same path an Ingress route's does (`general::route`), so retries, draining, timeouts and
//! metrics hold for both.

use std::time::Instant;

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use sluice_config::gateway_model::{
    Filters, HeaderEdits, PathModifier, PathRule, RedirectFilter, RequestFacts,
};
use sluice_config::host::{HostBuf, normalize_request_host};
use sluice_config::request_path;

use super::{finish, request_host, respond_local, route};
use crate::handler::conn::ConnInfo;
use crate::handler::local::Local;
use crate::state::dataplane::DataPlane;
use crate::state::routes::RouteTable;
use crate::state::routes::gateway::{Backend, Found};
use crate::upstream::body::RespBody;

/// Serves one request that came in on a Gateway socket (its path already normalised).
pub(crate) async fn serve(
    table: &RouteTable,
    dp: &DataPlane,
    conn: &ConnInfo,
    mut req: Request<Option<Incoming>>,
    started: Instant,
) -> Response<RespBody> {
    let version = req.version();
    let raw_host = request_host(&req).unwrap_or("").to_string();
    let mut buf = HostBuf::default();
    let host = normalize_request_host(&raw_host, &mut buf);
    // Matched on the path's route view (encoded separators read, `;` parameters dropped), as
    // Ingress routes are; when the view differs, the path read literally must not be another
    // rule's (400), so no backend serves a request matched as another rule's.
    let path = req.uri().path().to_string();
    let view = request_path::route_view(&path);
    let (rule, compiled) = {
        let headers = req.headers();
        let find = |p: &str| {
            let facts = RequestFacts {
                path: p,
                method: req.method().as_str(),
                query: req.uri().query(),
                header: &|name: &str| headers.get(name).and_then(|v| v.to_str().ok()),
            };
            table.gateway().find(
                table.snapshot(),
                (conn.local, conn.frontend.as_deref()),
                host,
                &facts,
            )
        };
        let found = find(&view);
        if *view != *path
            && let (Found::Rule(a, _), Found::Rule(b, _)) = (&found, find(&path))
            && !std::ptr::eq(*a, b)
        {
            return respond_local(dp, Local::InvalidPath, version);
        }
        match found {
            Found::None => return respond_local(dp, Local::NoRoute, version),
            Found::Misdirected => return respond_local(dp, Local::Misdirected, version),
            Found::Rule(rule, compiled) => (rule, compiled),
        }
    };
    if let Some(r) = &rule.filters.redirect {
        let scheme = if conn.tls { "https" } else { "http" };
        return redirect(
            r,
            (&rule.path, &view),
            scheme,
            host.unwrap_or(""),
            conn.local.port(),
            req.uri(),
        );
    }
    let (action, own) = match compiled.pick() {
        Some((Backend::Serve(a), i)) => (a, rule.backends.get(i).map(|b| &b.filters)),
        Some((Backend::Invalid(why), _)) => return failed(dp, version, why),
        None => return failed(dp, version, "the rule has no backend"),
    };
    edit_request(&rule.filters, (&rule.path, &view), &mut req);
    mirror(compiled, conn, &req);
    if let Some(own) = own {
        edit(&own.request_headers, req.headers_mut());
    }
    let http1 = version <= Version::HTTP_11;
    let mut resp = route(table, dp, conn, action, req).await;
    edit(&rule.filters.response_headers, resp.headers_mut());
    if let Some(own) = own {
        edit(&own.response_headers, resp.headers_mut());
    }
    finish(dp, conn, action, resp, http1, started)
}

/// `RequestMirror`: a copy of the request (as the rule's filters made it) to each mirror pool,
/// in the rule's share, in a task of its own; the answer is read and dropped, and the client's
/// request never waits for it. Only requests without a body are mirrored (a body would have
/// to be held for the copy), and only to HTTP/1 pools.
fn mirror(
    c: &crate::state::routes::gateway::CompiledRule,
    conn: &ConnInfo,
    req: &Request<Option<Incoming>>,
) {
    use hyper::body::Body;
    if c.mirrors.is_empty() || req.body().as_ref().is_some_and(|b| !b.is_end_stream()) {
        return;
    }
    for (cluster, numerator, denominator) in &c.mirrors {
        if cluster.protocol.is_h2() || fastrand::u32(0..*denominator) >= *numerator {
            continue;
        }
        let mut headers = req.headers().clone();
        crate::wire::hop::strip(&mut headers, false);
        if let Some(a) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            headers.insert(header::HOST, a);
        }
        let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let Ok(mut copy) = Request::builder()
            .method(req.method().clone())
            .uri(pq)
            .body(crate::upstream::body::ReqBody::empty())
        else {
            continue;
        };
        *copy.headers_mut() = headers;
        let cluster = std::sync::Arc::clone(cluster);
        let (client_ip, port, tls, trusted) = conn.proxy_fields();
        tokio::spawn(async move {
            let fwd = crate::wire::forwarded::ProxyHeaders {
                client_ip: &client_ip,
                tls,
                port: &port,
                request_id: None,
                trusted,
                underscores: false,
            };
            let once = sluice_config::NextUpstream {
                on_error: false,
                non_idempotent: false,
                tries: Some(1),
            };
            let plan = crate::upstream::retry::Plan::new(copy.method(), &once, 1, None);
            let sending =
                crate::upstream::retry::send(&cluster, copy, plan, &fwd, std::time::Instant::now());
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), sending).await;
        });
    }
}

/// 500: the share of a rule's requests whose backend cannot be used, as the spec asks.
fn failed(dp: &DataPlane, version: Version, why: &str) -> Response<RespBody> {
    respond_local(
        dp,
        Local::Failed {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            pool: "-",
            why: &why,
        },
        version,
    )
}

/// Applies a header modifier: set, then add, then remove (names the CRD allows; a value that
/// cannot be a header value is skipped).
fn edit(e: &HeaderEdits, h: &mut HeaderMap) {
    if e.is_empty() {
        return;
    }
    let pairs = |v: &[(String, String)]| -> Vec<(HeaderName, HeaderValue)> {
        v.iter()
            .filter_map(|(n, x)| {
                Some((
                    HeaderName::from_bytes(n.as_bytes()).ok()?,
                    HeaderValue::from_str(x).ok()?,
                ))
            })
            .collect()
    };
    for (n, v) in pairs(&e.set) {
        h.insert(n, v);
    }
    for (n, v) in pairs(&e.add) {
        h.append(n, v);
    }
    for n in &e.remove {
        h.remove(n.as_str());
    }
}

/// The path with a modifier applied: a full replacement, or the matched prefix replaced
/// (`/prefix/one` with prefix `/prefix` and `/` gives `/one`).
fn modify_path(m: &PathModifier, matched: &PathRule, path: &str) -> String {
    match m {
        PathModifier::Full(p) => p.clone(),
        PathModifier::Prefix(repl) => {
            let rest = match matched {
                PathRule::Prefix(p) => path.get(p.len()..).unwrap_or(""),
                _ => path,
            };
            let out = format!("{}{rest}", repl.trim_end_matches('/'));
            if out.is_empty() { "/".to_string() } else { out }
        }
    }
}

/// `seen`: the matched rule's path and the path as it was matched (the route view), from which
/// a prefix is replaced.
fn edit_request(
    f: &Filters,
    (matched, seen): (&PathRule, &str),
    req: &mut Request<Option<Incoming>>,
) {
    edit(&f.request_headers, req.headers_mut());
    let Some(rw) = &f.rewrite else {
        return;
    };
    let mut parts = req.uri().clone().into_parts();
    if let Some(p) = &rw.path {
        let path = modify_path(p, matched, seen);
        let pq = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        if let Ok(pq) = pq.parse() {
            parts.path_and_query = Some(pq);
        }
    }
    if let Some(h) = &rw.hostname {
        if parts.authority.is_some()
            && let Ok(a) = h.parse()
        {
            parts.authority = Some(a);
        }
        if let Ok(v) = HeaderValue::from_str(h) {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}

/// A `RequestRedirect` answer. The port: the filter's; else none for a changed scheme (its
/// well-known port); else the listener's. A port that is the scheme's well-known one is left
/// out of `Location`, as the spec asks.
fn redirect(
    r: &RedirectFilter,
    (matched, seen): (&PathRule, &str),
    scheme: &str,
    host: &str,
    listener_port: u16,
    uri: &Uri,
) -> Response<RespBody> {
    let to_scheme = r.scheme.as_deref().unwrap_or(scheme);
    let port = match (r.port, &r.scheme) {
        (Some(p), _) => Some(p),
        (None, Some(_)) => None,
        (None, None) => Some(listener_port),
    };
    let port = port.filter(|p| !matches!((to_scheme, p), ("http", 80) | ("https", 443)));
    let host = r.hostname.as_deref().unwrap_or(host);
    let path = match &r.path {
        Some(m) => modify_path(m, matched, seen),
        None => uri.path().to_string(),
    };
    let mut location = format!("{to_scheme}://{host}");
    if let Some(p) = port {
        location.push_str(&format!(":{p}"));
    }
    location.push_str(&path);
    if let Some(q) = uri.query() {
        location.push('?');
        location.push_str(q);
    }
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FOUND);
    match HeaderValue::from_str(&location) {
        Ok(location) => Local::Redirect {
            status,
            location: &location,
        }
        .response(),
        Err(_) => Local::Failed {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            pool: "-",
            why: &"the redirect's Location is not a valid header value",
        }
        .response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_replacement_keeps_the_rest_and_never_doubles_a_slash() {
        let m = PathRule::Prefix("/prefix".into());
        let r = |repl: &str, path: &str| modify_path(&PathModifier::Prefix(repl.into()), &m, path);
        assert_eq!(r("/one", "/prefix/two"), "/one/two");
        assert_eq!(r("/", "/prefix/two"), "/two");
        assert_eq!(r("/", "/prefix"), "/");
        assert_eq!(r("/one/", "/prefix/"), "/one/");
        assert_eq!(
            modify_path(&PathModifier::Full("/x".into()), &m, "/prefix/y"),
            "/x"
        );
    }

    #[test]
    fn redirect_ports_follow_the_spec() {
        let uri: Uri = "/a?b=c".parse().unwrap_or_default();
        let m = PathRule::Prefix(String::new());
        let loc = |r: RedirectFilter, scheme: &str, port: u16| {
            redirect(&r, (&m, uri.path()), scheme, "h.com", port, &uri)
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let base = RedirectFilter {
            scheme: None,
            hostname: None,
            port: None,
            path: None,
            status: 302,
        };
        assert_eq!(
            loc(base.clone(), "http", 80).as_deref(),
            Some("http://h.com/a?b=c")
        );
        assert_eq!(
            loc(base.clone(), "http", 8080).as_deref(),
            Some("http://h.com:8080/a?b=c")
        );
        let https = RedirectFilter {
            scheme: Some("https".into()),
            ..base.clone()
        };
        assert_eq!(
            loc(https, "http", 8080).as_deref(),
            Some("https://h.com/a?b=c")
        );
        let port = RedirectFilter {
            port: Some(8443),
            hostname: Some("x.org".into()),
            ..base
        };
        assert_eq!(
            loc(port, "http", 80).as_deref(),
            Some("http://x.org:8443/a?b=c")
        );
    }
}
