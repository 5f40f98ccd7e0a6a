//! Every answer sluice gives itself, without an upstream, in one table ([`Local`]): status,
//! body, the fields it carries and whether the connection ends after it. The fast reader, the
//! direct handler and the general handler all answer through it, and the one HTTP/1 writer
//! ([`crate::handler::respond`]) or hyper renders it, so a refusal reads the same whichever
//! path met it. The 502/503/504 family is logged with its reason and generic in the body
//! (pool, Service and endpoint names are internal).

use std::fmt::Display;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode, Uri};
use sluice_config::host::strip_port;

use crate::error::{Error, Kind};
use crate::telemetry::errlog;
use crate::upstream::body::RespBody;

/// The `Server` value of every response sluice sends, its own and forwarded ones alike.
pub(crate) static SERVER: HeaderValue = HeaderValue::from_static("sluice");

/// What `Allow` says to a refused `CONNECT`.
static ALLOW: HeaderValue =
    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");

/// A local answer. Each variant is one row of the table in [`Local::row`].
#[derive(Clone, Copy)]
pub(crate) enum Local<'a> {
    /// A request head the fast reader could not parse. Empty body, as hyper answers the
    /// connections it serves, so the two paths agree (the differential test checks it).
    MalformedHead,
    /// A request head above `--max-header-size` (or with too many fields).
    HeadTooLarge,
    /// A field a header map cannot hold (a name or value outside the grammar).
    InvalidField,
    /// HTTP/1 with several `Host` fields, or HTTP/1.1 with none (RFC 9112 §3.2).
    HostCount,
    /// HTTP/2 with a `host` field that disagrees with `:authority`, or several (RFC 9113
    /// §8.3.1).
    AuthorityDisagrees,
    /// A `Host` that is not a reg-name or IP literal (it would be reflected into `Location`).
    InvalidHost,
    /// A path that climbs above `/` or is not a path ([`sluice_config::request_path`]).
    InvalidPath,
    /// `CONNECT`: an ingress is not a forward proxy.
    Connect,
    /// No route for this host and path.
    NoRoute,
    /// A declared body above the limit.
    BodyTooLarge(u64),
    /// The route wants HTTPS: a permanent redirect to the same host and target.
    HttpsRedirect {
        /// The request's host (a port is dropped).
        host: &'a str,
        /// The request's target.
        uri: &'a Uri,
        /// The HTTPS listener's port.
        port: u16,
    },
    /// The client's address is not allowed on the route (source ranges), or the auth service
    /// said 403.
    Forbidden,
    /// Authentication is required (`auth-type`, `auth-url`); the caller adds the challenge.
    Unauthorized,
    /// `auth-tls-verify-client: on` and the connection presented no certificate (nginx's 496,
    /// sent as 400).
    CertificateMissing,
    /// The connection's certificate does not verify against the route's CAs (nginx's 495,
    /// sent as 400).
    CertificateInvalid,
    /// A request for a host that asks for client certificates on a connection whose TLS
    /// handshake named another host (HTTP/2 connection reuse, or a client dodging the check):
    /// 421, so a browser retries on a connection of its own.
    Misdirected,
    /// Over an Ingress's request limits (`--limit-req-status-code`).
    Limited(StatusCode),
    /// A CORS preflight answered by sluice (`enable-cors`).
    Preflight,
    /// A redirect the route asks for (`permanent-redirect`, `temporal-redirect`, `app-root`).
    Redirect {
        /// The 3xx status.
        status: StatusCode,
        /// The `Location` value.
        location: &'a HeaderValue,
    },
    /// The request could not be delivered: 502, 503 or 504 (500: the auth service could not
    /// decide), logged with `why`.
    Failed {
        /// 502, 503 or 504.
        status: StatusCode,
        /// The pool (for the log).
        pool: &'a str,
        /// The reason (for the log only).
        why: &'a (dyn Display + Sync),
    },
}

/// One row: status, body, whether the connection ends after the answer.
struct Row {
    status: StatusCode,
    body: Bytes,
    close: bool,
}

impl Local<'_> {
    /// The table.
    fn row(&self) -> Row {
        let row = |status, body: &'static str, close| Row {
            status,
            body: Bytes::from_static(body.as_bytes()),
            close,
        };
        use StatusCode as S;
        match *self {
            Local::MalformedHead => row(S::BAD_REQUEST, "", true),
            Local::HeadTooLarge => row(S::REQUEST_HEADER_FIELDS_TOO_LARGE, "", true),
            Local::InvalidField => row(
                S::BAD_REQUEST,
                "400 Bad Request: invalid header field\n",
                true,
            ),
            Local::HostCount => row(
                S::BAD_REQUEST,
                "400 Bad Request: exactly one Host header is required\n",
                true,
            ),
            Local::AuthorityDisagrees => row(
                S::BAD_REQUEST,
                "400 Bad Request: host and :authority disagree\n",
                false,
            ),
            Local::InvalidHost => row(S::BAD_REQUEST, "400 Bad Request: invalid host\n", true),
            Local::InvalidPath => row(S::BAD_REQUEST, "400 Bad Request: invalid path\n", true),
            Local::Connect => row(
                S::METHOD_NOT_ALLOWED,
                "405 Method Not Allowed: CONNECT is not served\n",
                false,
            ),
            Local::NoRoute => row(
                S::NOT_FOUND,
                "404 Not Found: no route for this host and path\n",
                false,
            ),
            Local::BodyTooLarge(limit) => Row {
                status: S::PAYLOAD_TOO_LARGE,
                body: Bytes::from(format!(
                    "413 Payload Too Large: the limit is {limit} bytes\n"
                )),
                close: false,
            },
            Local::HttpsRedirect { .. } => row(S::PERMANENT_REDIRECT, "", false),
            Local::Redirect { status, .. } => row(status, "", false),
            Local::Forbidden => row(S::FORBIDDEN, "403 Forbidden\n", false),
            Local::Unauthorized => row(S::UNAUTHORIZED, "401 Unauthorized\n", false),
            Local::CertificateMissing => row(
                S::BAD_REQUEST,
                "400 Bad Request: No required SSL certificate was sent\n",
                false,
            ),
            Local::Misdirected => row(S::MISDIRECTED_REQUEST, "421 Misdirected Request\n", false),
            Local::CertificateInvalid => row(
                S::BAD_REQUEST,
                "400 Bad Request: The SSL certificate error\n",
                false,
            ),
            Local::Limited(status) => Row {
                status,
                body: Bytes::from(format!(
                    "{} {}\n",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("Request Limit Reached")
                )),
                close: false,
            },
            Local::Preflight => row(S::NO_CONTENT, "", false),
            Local::Failed { status, .. } => match status {
                S::SERVICE_UNAVAILABLE => row(status, "503 Service Unavailable\n", false),
                S::GATEWAY_TIMEOUT => row(status, "504 Gateway Timeout\n", false),
                S::INTERNAL_SERVER_ERROR => row(status, "500 Internal Server Error\n", false),
                _ => row(S::BAD_GATEWAY, "502 Bad Gateway\n", false),
            },
        }
    }

    /// The status this answer has.
    #[cfg(test)]
    pub(crate) fn status(&self) -> StatusCode {
        self.row().status
    }

    /// The response: the row's status and body, `Content-Type`, `Server`, `Connection: close`
    /// when the row ends the connection, and the fields the variant needs (`Allow`,
    /// `Location`). A [`Local::Failed`] is logged (rate-limited) here.
    pub(crate) fn response(self) -> Response<RespBody> {
        let Row {
            status,
            body,
            close,
        } = self.row();
        let mut r = Response::new(RespBody::full(body));
        *r.status_mut() = status;
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(header::SERVER, SERVER.clone());
        if close {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        match self {
            Local::Connect => {
                h.insert(header::ALLOW, ALLOW.clone());
            }
            Local::HttpsRedirect { host, uri, port } => {
                if let Ok(v) = HeaderValue::from_str(&https_location(host, uri, port)) {
                    h.insert(header::LOCATION, v);
                }
            }
            Local::Redirect { location, .. } => {
                h.insert(header::LOCATION, location.clone());
            }
            Local::Failed { status, pool, why } => errlog::answered(status.as_u16(), pool, why),
            _ => {}
        }
        r
    }
}

/// `https://host[:port]/target` for a redirect.
fn https_location(host: &str, uri: &Uri, port: u16) -> String {
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    let host = strip_port(host);
    if port == 443 {
        format!("https://{host}{pq}")
    } else {
        format!("https://{host}:{port}{pq}")
    }
}

/// The answer to a request over its Ingress's limits, with `--limit-req-status-code`.
pub(crate) fn limited(status: u16) -> Response<RespBody> {
    Local::Limited(StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE))
        .response()
}

/// The local answer for a request that could not be delivered to `pool`: the error's status
/// ([`Error::status`]) through the table.
pub(crate) fn error_response(pool: &str, e: &Error) -> Response<RespBody> {
    match (e.status(), e.kind()) {
        (_, Kind::RequestBodyTooLarge(limit)) => Local::BodyTooLarge(limit).response(),
        (StatusCode::BAD_REQUEST, _) => Local::InvalidField.response(),
        (status, _) => Local::Failed {
            status,
            pool,
            why: e,
        }
        .response(),
    }
}

/// Why a 504 was given: no response head within this time.
struct NoHeadWithin(std::time::Duration);

impl Display for NoHeadWithin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no response head from upstream within {:?} (--request-timeout)",
            self.0
        )
    }
}

/// The upstream did not answer within the request timeout.
pub(crate) fn timed_out(pool: &str, limit: std::time::Duration) -> Response<RespBody> {
    Local::Failed {
        status: StatusCode::GATEWAY_TIMEOUT,
        pool,
        why: &NoHeadWithin(limit),
    }
    .response()
}

/// The upstream answered 101 to a request that did not ask to switch protocols.
pub(crate) fn unasked_switch(pool: &str) -> Response<RespBody> {
    Local::Failed {
        status: StatusCode::BAD_GATEWAY,
        pool,
        why: &"upstream switched protocols (101) for a request that did not ask to",
    }
    .response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_server_and_type_and_says_when_it_closes() {
        let uri: Uri = "/a?b".parse().unwrap();
        let rows = [
            (Local::MalformedHead, 400, true),
            (Local::HeadTooLarge, 431, true),
            (Local::InvalidField, 400, true),
            (Local::HostCount, 400, true),
            (Local::AuthorityDisagrees, 400, false),
            (Local::InvalidHost, 400, true),
            (Local::InvalidPath, 400, true),
            (Local::Connect, 405, false),
            (Local::NoRoute, 404, false),
            (Local::Unauthorized, 401, false),
            (Local::CertificateMissing, 400, false),
            (Local::CertificateInvalid, 400, false),
            (Local::Misdirected, 421, false),
            (
                Local::Failed {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    pool: "auth",
                    why: &"test",
                },
                500,
                false,
            ),
            (Local::BodyTooLarge(10), 413, false),
            (
                Local::HttpsRedirect {
                    host: "a.test:80",
                    uri: &uri,
                    port: 8443,
                },
                308,
                false,
            ),
            (
                Local::Failed {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    pool: "p",
                    why: &"test",
                },
                503,
                false,
            ),
        ];
        for (local, status, close) in rows {
            assert_eq!(local.status().as_u16(), status);
            let r = local.response();
            assert_eq!(r.status().as_u16(), status);
            assert_eq!(r.headers()[header::SERVER], "sluice");
            assert_eq!(
                r.headers().contains_key(header::CONNECTION),
                close,
                "{status}"
            );
            if status == 308 {
                assert_eq!(r.headers()[header::LOCATION], "https://a.test:8443/a?b");
            }
            if status == 405 {
                assert!(r.headers().contains_key(header::ALLOW));
            }
        }
    }
}
