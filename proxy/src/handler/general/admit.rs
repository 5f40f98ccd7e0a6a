//! The access phase of a routed request, in the order ingress-nginx runs it: the route's own
//! answers (`app-root`, a host redirect), the HTTPS redirect, the host's client-certificate
//! rule, source ranges, limits, a CORS preflight, then authentication. What passes comes back
//! as [`Admitted`]: the fields to hand upstream and what the answer needs later.

use http::header::{self, HeaderValue};
use http::{Request, Response};

use super::{edits_answer, host_of, request_host};
use crate::handler::local::{Local, limited};
use crate::handler::{ConnInfo, auth};
use crate::policy::auth::external::Passed;
use crate::policy::limits::InFlight;
use crate::state::dataplane::DataPlane;
use crate::state::routes::{Action, RouteTable};
use crate::upstream::body::RespBody;
use crate::wire::forwarded;

/// A request the route's gates let through.
pub(super) struct Admitted<'a> {
    /// The client certificate's fields (`ssl-client-*`), when the host asks for one.
    pub cert_fields: Option<Passed>,
    /// What a passed (or skipped) `auth-url` check hands to the request and its answer.
    pub passed: Option<Passed>,
    /// The `Access-Control-Allow-Origin` the answer gets, when CORS admits the origin.
    pub cors_origin: Option<HeaderValue>,
    /// Held until the response head is back: `limit-connections` counts requests in flight.
    pub _in_flight: Option<InFlight<'a>>,
}

/// Runs the gates; `Err` is the answer the client gets instead.
pub(super) async fn admit<'a, B>(
    table: &RouteTable,
    dp: &DataPlane,
    conn: &ConnInfo,
    action: &'a Action,
    req: &Request<B>,
) -> Result<Admitted<'a>, Response<RespBody>> {
    if let Some(edits) = &action.edits
        && let Some(resp) = edits_answer(edits, conn, req)
    {
        return Err(resp);
    }
    if action.ssl_redirect && !conn.tls {
        let host = request_host(req).unwrap_or_default().to_string();
        return Err(Local::HttpsRedirect {
            host: &host,
            uri: req.uri(),
            port: dp.https_port(),
        }
        .response());
    }
    let cert_fields = match &action.client_cert {
        Some(rules) => match auth::client_cert(rules, conn, host_of(req).as_deref()) {
            auth::Verdict::Pass(fields) => fields,
            auth::Verdict::Answer(answer) => return Err(answer),
        },
        None => None,
    };
    let client =
        || forwarded::client_ip(conn.remote.ip(), req.headers(), |ip| dp.settings.trusts(ip));
    // `satisfy: any` lets a client the ranges refuse in with credentials, and one they admit in
    // without; `all` (the default) needs both.
    let satisfy_any = action.edits.as_ref().is_some_and(|e| e.satisfy_any) && action.auth.is_some();
    let in_range = action
        .edits
        .as_ref()
        .and_then(|e| e.source_ranges.as_ref())
        .map(|r| r.admits(client()));
    if in_range == Some(false) && !satisfy_any {
        return Err(Local::Forbidden.response());
    }
    let in_flight = if action.limiter.is_some() {
        match action.admit(client()) {
            Ok(admitted) => admitted,
            Err(_) => return Err(limited(dp.settings.limit_status)),
        }
    } else {
        None
    };
    let mut cors_origin = None;
    if let Some(cors) = action.edits.as_ref().and_then(|e| e.cors.as_ref()) {
        cors_origin = cors.allow_origin(req.headers().get(header::ORIGIN));
        if let Some(origin) = &cors_origin
            && req.method() == http::Method::OPTIONS
        {
            let mut r = Local::Preflight.response();
            cors.apply(r.headers_mut(), origin.clone(), true);
            return Err(r);
        }
    }
    let passed = match &action.auth {
        Some(gate) if !(satisfy_any && in_range == Some(true)) => {
            let cx = auth::Asking {
                conn,
                host: request_host(req).unwrap_or_default(),
                timeout: action
                    .request_timeout
                    .unwrap_or(dp.settings.request_timeout),
                tries: dp.settings.upstream_tries,
                client: client(),
                table,
                vhost: action.vhost,
            };
            // Boxed, like the error page: only routes with external auth wait on it, and
            // unboxed it would size every request's future (2.7 KB more, copied into each
            // HTTP/2 stream's box).
            match Box::pin(auth::check(gate, req, &cx)).await {
                auth::Verdict::Pass(passed) => passed,
                auth::Verdict::Answer(answer) => return Err(answer),
            }
        }
        // Admitted by the ranges alone: the fields the auth service would set are still the
        // auth service's, so a client's own copies go.
        Some(gate) => auth::skipped(gate),
        None => None,
    };
    Ok(Admitted {
        cert_fields,
        passed,
        cors_origin,
        _in_flight: in_flight,
    })
}
