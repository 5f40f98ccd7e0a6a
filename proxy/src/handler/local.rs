//! Answers sluice gives itself, without an upstream: plain-text errors with `Server: sluice`,
//! the 502/503/504 family (logged with their reason, generic in the body), and the HTTPS
//! redirect.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode, Uri};
use sluice_config::host::strip_port;

use crate::error::{Error, Kind};
use crate::telemetry::errlog;
use crate::upstream::body::RespBody;

pub(crate) static SERVER: HeaderValue = HeaderValue::from_static("sluice");

/// A small local response with `Server: sluice`.
pub fn local(status: StatusCode, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut r = Response::new(RespBody::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(header::SERVER, SERVER.clone());
    r
}

pub(crate) fn redirect(host: &str, uri: &Uri, https_port: u16) -> Response<RespBody> {
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    let host = strip_port(host);
    let location = if https_port == 443 {
        format!("https://{host}{pq}")
    } else {
        format!("https://{host}:{https_port}{pq}")
    };
    let mut r = local(StatusCode::PERMANENT_REDIRECT, Bytes::new());
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The local answer for a request that could not be delivered to `pool`. The body is generic
/// (pool, Service and endpoint names are internal); the reason goes to the log.
pub(crate) fn error_response(pool: &str, e: &Error) -> Response<RespBody> {
    match (e.status(), e.kind()) {
        (status, Kind::RequestBodyTooLarge(limit)) => local(
            status,
            format!("413 Payload Too Large: the limit is {limit} bytes\n"),
        ),
        (StatusCode::BAD_REQUEST, _) => local(StatusCode::BAD_REQUEST, "400 Bad Request\n"),
        (status, _) => failed(status, pool, e),
    }
}

/// A 502/503/504 that sluice generates: logged (rate-limited) with its reason, answered with
/// the status line as the only body.
pub(crate) fn failed(
    status: StatusCode,
    pool: &str,
    why: &dyn std::fmt::Display,
) -> Response<RespBody> {
    errlog::answered(status.as_u16(), pool, why);
    let body = match status {
        StatusCode::SERVICE_UNAVAILABLE => "503 Service Unavailable\n",
        StatusCode::GATEWAY_TIMEOUT => "504 Gateway Timeout\n",
        _ => "502 Bad Gateway\n",
    };
    local(status, body)
}

/// The upstream did not answer within the request timeout.
pub(crate) fn timed_out(pool: &str, limit: std::time::Duration) -> Response<RespBody> {
    failed(
        StatusCode::GATEWAY_TIMEOUT,
        pool,
        &format_args!("no response head from upstream within {limit:?} (--request-timeout)"),
    )
}

/// The upstream answered 101 to a request that did not ask to switch protocols.
pub(crate) fn unasked_switch(pool: &str) -> Response<RespBody> {
    failed(
        StatusCode::BAD_GATEWAY,
        pool,
        &"upstream switched protocols (101) for a request that did not ask to",
    )
}
