//! Asking a route's [`Gate`] before forwarding: Basic credentials checked in place, or the
//! `auth-url` subrequest sent through the auth Service's pool and its answer turned into the
//! client's (ingress-nginx's statuses: 2xx passes, 401 answers or redirects to `auth-signin`,
//! 403 answers, anything else is 500).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};

use crate::handler::ConnInfo;
use crate::handler::local::Local;
use crate::policy::auth::Gate;
use crate::policy::auth::basic::{Basic, Checked};
use crate::policy::auth::cache::Answer;
use crate::policy::auth::client_cert::{ClientAuth, Judged};
use crate::policy::auth::digest::Refused;
use crate::policy::auth::external::{External, Passed, Via};
use crate::state::routes::{RouteTable, Target};
use crate::upstream::body::RespBody;
use crate::upstream::cluster::Cluster;
use crate::upstream::remote;
use crate::upstream::retry::{self, Plan};
use sluice_config::host::{HostBuf, normalize_request_host};

/// What a gate said about a request.
pub(crate) enum Verdict {
    /// Go on, with what a passed `auth-url` check hands to the request and its answer.
    Pass(Option<Passed>),
    /// Answer the client with this instead.
    Answer(Response<RespBody>),
}

/// The request's context a gate needs.
pub(crate) struct Asking<'a> {
    /// The client connection.
    pub conn: &'a ConnInfo,
    /// The host the request named.
    pub host: &'a str,
    /// The route's request timeout, which bounds the subrequest.
    pub timeout: Duration,
    /// Endpoints the subrequest may try.
    pub tries: u32,
    /// The client's address, as the trusted-proxy rules resolve it (`$remote_addr`).
    pub client: std::net::IpAddr,
    /// The route table the request was routed by (a routed `auth-url` is looked up in it).
    pub table: &'a RouteTable,
    /// The virtual host the request's route belongs to: an `auth-url` that names the request's
    /// own host (`$host`) is looked up there alone.
    pub vhost: Option<u32>,
}

/// Asks the gate about a request.
pub(crate) async fn check<B>(gate: &Gate, req: &Request<B>, cx: &Asking<'_>) -> Verdict {
    match gate {
        Gate::Basic(b) => match b.check(req.headers()).await {
            Checked::Admitted => Verdict::Pass(skipped(gate)),
            Checked::Refused => Verdict::Answer(challenge(b)),
            // Too many slow password checks wait already: 503 at once, so a flood of wrong
            // passwords cannot queue real logins behind it.
            Checked::Busy => Verdict::Answer(crate::handler::local::limited(503)),
        },
        Gate::Digest(d) => {
            let uri = req.uri().path_and_query().map_or("/", |p| p.as_str());
            match d.check(
                req.method().as_str(),
                uri,
                req.headers().get(header::AUTHORIZATION),
            ) {
                Ok(()) => Verdict::Pass(skipped(gate)),
                Err(why) => {
                    let mut r = Local::Unauthorized.response();
                    if let Some(c) = d.challenge(why == Refused::Stale) {
                        r.headers_mut().insert(header::WWW_AUTHENTICATE, c);
                    }
                    Verdict::Answer(r)
                }
            }
        }
        Gate::External(e) => external(e, req, cx).await,
    }
}

/// What a request carries past a gate that did not hand it fields of its own: admitted
/// without asking (`satisfy: any`), an `auth-url` gate's `auth-response-headers` are removed
/// from it, as nginx's `proxy_set_header` with an empty value does, so a client cannot pose
/// as the auth service; past a Basic or Digest gate, asked or not, the client's
/// `Authorization` is removed, as ingress-nginx's `proxy_set_header Authorization ""` does, so
/// that no pod behind the gate ever sees a user's password.
pub(crate) fn skipped(gate: &Gate) -> Option<Passed> {
    match gate {
        Gate::External(e) => Some(Passed {
            names: e.response_headers.clone(),
            ..Passed::default()
        }),
        Gate::Basic(_) | Gate::Digest(_) => Some(Passed {
            names: vec![header::AUTHORIZATION],
            ..Passed::default()
        }),
    }
}

/// The `ssl-client-*` fields ingress-nginx sends upstream on `auth-tls` routes.
const CERT_FIELDS: [&str; 4] = [
    "ssl-client-verify",
    "ssl-client-subject-dn",
    "ssl-client-issuer-dn",
    "ssl-client-cert",
];

/// Checks the connection's client certificate against the route's rules: the answer (400, or
/// a 302 to `auth-tls-error-page`; 403 for `auth-tls-match-cn`), or the `ssl-client-*` fields
/// to send upstream (a client's own copies are always removed).
pub(crate) fn client_cert(rules: &Arc<ClientAuth>, conn: &ConnInfo, host: Option<&str>) -> Verdict {
    // On TLS, the handshake must have been for this host (whose rules asked for the
    // certificate): another host's connection never carries this route's judgement.
    if conn.tls && conn.sni.as_deref() != host {
        return Verdict::Answer(Local::Misdirected.response());
    }
    let presented = conn.client_cert.as_deref();
    let refuse = |local: Local<'_>| match &rules.error_page {
        Some(location) => Verdict::Answer(
            Local::Redirect {
                status: StatusCode::FOUND,
                location,
            }
            .response(),
        ),
        None => Verdict::Answer(local.response()),
    };
    let status = match rules.judge(presented) {
        Judged::Pass(status) => status,
        Judged::Missing => return refuse(Local::CertificateMissing),
        Judged::Invalid => return refuse(Local::CertificateInvalid),
        Judged::NameRefused => return Verdict::Answer(Local::Forbidden.response()),
    };
    let mut fields = vec![(
        HeaderName::from_static(CERT_FIELDS[0]),
        HeaderValue::from_static(status),
    )];
    if let Some(c) = presented {
        for (name, value) in [(CERT_FIELDS[1], &c.subject), (CERT_FIELDS[2], &c.issuer)] {
            if let Ok(v) = HeaderValue::from_str(value) {
                fields.push((HeaderName::from_static(name), v));
            }
        }
        if rules.pass_certificate
            && let Some(pem) = &c.escaped_pem
        {
            fields.push((HeaderName::from_static(CERT_FIELDS[3]), pem.clone()));
        }
    }
    Verdict::Pass(Some(Passed {
        fields,
        names: CERT_FIELDS.map(HeaderName::from_static).to_vec(),
        cookies: Vec::new(),
        always_set_cookie: false,
    }))
}

/// 401 with the route's `WWW-Authenticate: Basic realm="…"`.
fn challenge(b: &Basic) -> Response<RespBody> {
    let mut r = Local::Unauthorized.response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, b.challenge.clone());
    r
}

/// Asks the auth service about `req`, or its remembered answer (`auth-cache-key`).
async fn external<B>(ext: &External, req: &Request<B>, cx: &Asking<'_>) -> Verdict {
    let scheme = if cx.conn.tls { "https" } else { "http" };
    let key = ext
        .cache
        .as_ref()
        .map(|c| (c, c.key_for(req, cx.client, cx.host)));
    if let Some((c, k)) = &key
        && let Some(hit) = c.get(k)
    {
        return decide(ext, &hit, req, scheme, cx.host);
    }
    let (pool, auth_host) = match where_to(ext, cx) {
        Ok(AuthAt::Pool(pool, host)) => (pool, host),
        Ok(AuthAt::Remote(remote)) => {
            // Boxed: only routes with an allowed outside auth service wait on it.
            return Box::pin(remote_call(ext, remote, req, cx, key)).await;
        }
        Err(why) => return failed("-", &why),
    };
    let sub = ext.subrequest(req, (scheme, cx.host), auth_host);
    let plan = Plan::new(
        sub.method(),
        &sluice_config::NextUpstream::default(),
        cx.tries,
        None,
    );
    let fwd = cx.conn.proxy_headers();
    let sent = retry::send(pool, sub, plan, &fwd, Instant::now());
    let response = match tokio::time::timeout(cx.timeout, sent).await {
        Err(_) => {
            return failed(&pool.name, &"no answer within the request timeout");
        }
        Ok(Err(e)) => return failed(&pool.name, &e),
        Ok(Ok(d)) => d.response,
    };
    let (parts, _body) = response.into_parts();
    let answer = Answer::of(parts.status, &parts.headers, &ext.response_headers);
    if let Some((c, k)) = key {
        c.put(k, &answer);
    }
    decide(ext, &answer, req, scheme, cx.host)
}

/// Asks an auth service outside the cluster that the operator allows (`--auth-url-allow`):
/// the same subrequest, with the proxy headers, under the route's request timeout; its answer
/// decided and remembered as any other.
async fn remote_call<B>(
    ext: &External,
    remote: &sluice_config::route_policy::Remote,
    req: &Request<B>,
    cx: &Asking<'_>,
    key: Option<(&crate::policy::auth::cache::AnswerCache, Vec<u8>)>,
) -> Verdict {
    let scheme = if cx.conn.tls { "https" } else { "http" };
    let o = &remote.origin;
    let Ok(_call) = ext.remote_calls.try_acquire() else {
        return Verdict::Answer(crate::handler::local::limited(503));
    };
    let default_port = if o.https { 443 } else { 80 };
    let authority = if o.port == default_port {
        o.host.clone()
    } else {
        format!("{}:{}", o.host, o.port)
    };
    let Ok(auth_host) = HeaderValue::from_str(&authority) else {
        return failed("auth", &"auth-url: the host cannot be sent");
    };
    let (mut parts, _) = ext
        .subrequest(req, (scheme, cx.host), auth_host)
        .into_parts();
    cx.conn.proxy_headers().apply(&mut parts.headers);
    let sub = Request::from_parts(parts, http_body_util::Empty::<bytes::Bytes>::new());
    let parts = match tokio::time::timeout(cx.timeout, remote::send(remote, sub)).await {
        Err(_) => return failed(&o.host, &"no answer within the request timeout"),
        Ok(Err(e)) => return failed(&o.host, &e),
        Ok(Ok(parts)) => parts,
    };
    let answer = Answer::of(parts.status, &parts.headers, &ext.response_headers);
    if let Some((c, k)) = key {
        c.put(k, &answer);
    }
    decide(ext, &answer, req, scheme, cx.host)
}

/// Where an auth subrequest goes.
enum AuthAt<'a> {
    /// A pool of sluice's, with the `Host` the subrequest carries.
    Pool(&'a Arc<Cluster>, HeaderValue),
    /// A host outside the cluster the operator allows.
    Remote(&'a sluice_config::route_policy::Remote),
}

/// The pool an auth subrequest goes to and the `Host` it carries: the auth Service's, or for a
/// routed URL the pool of the route this table gives its host and path. A URL that names the
/// request's own host (`https://$host/oauth2/auth`) is looked up in the virtual host that
/// matched the protected route, and only there: a request for `wiki.corp.test` that fell
/// through to `*.corp.test`'s protected route is checked by `*.corp.test`'s auth route, never
/// by one that `wiki.corp.test` defines (ingress-nginx's server blocks never mix either). A
/// route that itself asks for authentication or a client certificate is refused, so a
/// subrequest never loops or skips a check.
fn where_to<'a>(ext: &'a External, cx: &Asking<'a>) -> Result<AuthAt<'a>, String> {
    match &ext.via {
        Via::Pool(pool, host) => Ok(AuthAt::Pool(pool, host.clone())),
        Via::Routed(named) => {
            let host = named.as_deref().unwrap_or(cx.host);
            let found = match named {
                // The named host's own rules only: a host-less rule or a default backend,
                // which any tenant may define, never answers for it.
                Some(_) => {
                    let mut buf = HostBuf::default();
                    normalize_request_host(host, &mut buf)
                        .and_then(|h| cx.table.lookup_named(h, ext.path()))
                }
                None => cx.table.lookup_in(cx.vhost, ext.path()),
            };
            let action = match (found, &ext.remote) {
                (Some(action), _) => action,
                // Not one of sluice's routes, but a host the operator allows outside.
                (None, Some(remote)) if named.is_some() => return Ok(AuthAt::Remote(remote)),
                (None, _) => {
                    return Err(format!(
                        "auth-url: no route for {host}{} (a host outside the cluster needs --auth-url-allow)",
                        ext.path()
                    ));
                }
            };
            if action.auth.is_some() || action.client_cert.is_some() {
                return Err(format!(
                    "auth-url: the route for {host}{} asks for authentication itself",
                    ext.path()
                ));
            }
            // The route's own pool only: a default backend answering in its place must never
            // be taken for the auth service.
            let Target::Cluster(pool) = &action.target else {
                return Err(format!(
                    "auth-url: the route for {host}{} has no pool",
                    ext.path()
                ));
            };
            let value = HeaderValue::from_str(host).map_err(|e| e.to_string())?;
            Ok(AuthAt::Pool(pool, value))
        }
    }
}

/// The client's fate by the auth service's answer: 2xx passes, 401 is answered (or
/// redirected to `auth-signin`), 403 is answered, anything else is a 500.
fn decide<B>(
    ext: &External,
    answer: &Answer,
    req: &Request<B>,
    scheme: &str,
    host: &str,
) -> Verdict {
    match answer.status {
        s if s.is_success() => Verdict::Pass(Some(Passed {
            fields: answer.fields.clone(),
            names: ext.response_headers.clone(),
            cookies: answer.cookies.clone(),
            always_set_cookie: ext.always_set_cookie,
        })),
        StatusCode::UNAUTHORIZED => {
            let location = ext
                .signin
                .as_ref()
                .map(|signin| ext.signin_location(signin, scheme, host, req.uri()))
                .and_then(|l| HeaderValue::from_str(&l).ok());
            let mut r = match &location {
                Some(location) => Local::Redirect {
                    status: StatusCode::FOUND,
                    location,
                }
                .response(),
                None => {
                    let mut r = Local::Unauthorized.response();
                    if let Some(c) = &answer.challenge {
                        r.headers_mut().insert(header::WWW_AUTHENTICATE, c.clone());
                    }
                    r
                }
            };
            for c in &answer.cookies {
                r.headers_mut().append(header::SET_COOKIE, c.clone());
            }
            Verdict::Answer(r)
        }
        StatusCode::FORBIDDEN => Verdict::Answer(Local::Forbidden.response()),
        other => failed(
            "auth",
            &format!("the auth service answered {}", other.as_u16()),
        ),
    }
}

/// The auth service failed to decide: 500, as nginx's `auth_request` answers, logged.
fn failed(pool: &str, why: &(dyn std::fmt::Display + Sync)) -> Verdict {
    Verdict::Answer(
        Local::Failed {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            pool,
            why,
        }
        .response(),
    )
}
