//! The one error type of the request path, after pingora's: *what* happened ([`Kind`]), on
//! *which side* ([`Side`]: the client, the upstream, or sluice itself) and whether the request
//! may be tried again ([`Retry`]). Every failure between accepting a request and the last byte
//! of its response is an [`Error`]: connecting, the upstream's HTTP/1 or h2 exchange, either
//! body. The answer a failure becomes is one `match` ([`Error::status`]).
//!
//! Building an error has no side effects. Whether a failure counts against an endpoint (and so
//! towards its ejection) is decided by the caller that knows what the failure means
//! (see [`crate::upstream::retry`]); [`Error::side`] tells it whose fault it was.
//!
//! Configuration errors (a certificate that does not load, an upstream CA bundle) are not
//! request failures and keep their own types next to the code that loads them.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;

/// Which side of the proxy a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client: its request body broke or was too large.
    Client,
    /// The upstream: it refused, timed out, closed, or answered badly.
    Upstream,
    /// sluice itself (no endpoint to send to).
    Internal,
}

/// Whether a failed request may be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing reached the upstream: another endpoint may take it, whatever the method.
    NotSent,
    /// The request was written (or may have been) and no byte of an answer came back: it may
    /// be sent again only if it is replayable (idempotent or allowed by the route, body-less).
    IfReplayable,
    /// Never: the upstream answered, or the failure was the client's.
    Never,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Kind {
    /// The pool has no endpoint to send to.
    #[error("no endpoints available")]
    NoEndpoints,
    /// Every endpoint of the pool is at its limit of requests in flight.
    #[error("every endpoint is at its connection limit")]
    EndpointsAtLimit,
    /// Nothing listens at the endpoint (or the pod is gone).
    #[error("connection refused")]
    ConnectRefused,
    /// No answer to the connect within the connect timeout.
    #[error("connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// Another socket error while connecting.
    #[error("connect failed")]
    Connect,
    /// The TLS handshake with the upstream failed.
    #[error("TLS handshake with upstream failed")]
    UpstreamTls,
    /// The HTTP/2 handshake (preface, settings) with the upstream failed.
    #[error("HTTP handshake with upstream failed")]
    UpstreamHandshake,
    /// The upstream closed the connection before a complete response head.
    #[error("upstream closed the connection before answering")]
    UpstreamClosed,
    /// A socket error on an established upstream connection.
    #[error("upstream I/O error")]
    UpstreamIo,
    /// The upstream's response head was larger than sluice accepts.
    #[error("upstream response head larger than {0} bytes")]
    ResponseHeadTooLarge(usize),
    /// The upstream's response is not valid HTTP/1.x.
    #[error("malformed upstream response: {0}")]
    MalformedResponse(&'static str),
    /// The upstream's response body ended before its declared end.
    #[error("upstream response body ended early")]
    Truncated,
    /// The upstream sent nothing for the read timeout in the middle of its response body.
    #[error("upstream sent nothing for {0:?} in the middle of its response body")]
    UpstreamReadTimeout(Duration),
    /// The HTTP/2 exchange with the upstream failed (hyper's error is the source).
    #[error("upstream HTTP/2 exchange failed")]
    UpstreamH2,
    /// The client's request body went past the size limit.
    #[error("request body larger than {0} bytes")]
    RequestBodyTooLarge(u64),
    /// Reading the client's request body failed (reset, bad framing).
    #[error("reading the client's request body failed")]
    ClientBody,
}

impl Kind {
    /// Whose failure this kind is.
    pub fn side(self) -> Side {
        match self {
            Kind::NoEndpoints | Kind::EndpointsAtLimit => Side::Internal,
            Kind::RequestBodyTooLarge(_) | Kind::ClientBody => Side::Client,
            Kind::ConnectRefused
            | Kind::ConnectTimeout(_)
            | Kind::Connect
            | Kind::UpstreamTls
            | Kind::UpstreamHandshake
            | Kind::UpstreamClosed
            | Kind::UpstreamIo
            | Kind::ResponseHeadTooLarge(_)
            | Kind::MalformedResponse(_)
            | Kind::Truncated
            | Kind::UpstreamReadTimeout(_)
            | Kind::UpstreamH2 => Side::Upstream,
        }
    }

    /// Whether a request that failed this way may be tried again, as far as the kind tells:
    /// connect failures happen before a byte is sent; a closed or broken connection may have
    /// taken the request without answering; an answer, however malformed, is final.
    fn retry(self) -> Retry {
        match self {
            Kind::ConnectRefused
            | Kind::ConnectTimeout(_)
            | Kind::Connect
            | Kind::UpstreamTls
            | Kind::UpstreamHandshake => Retry::NotSent,
            Kind::UpstreamClosed | Kind::UpstreamIo => Retry::IfReplayable,
            _ => Retry::Never,
        }
    }
}

/// A failure on the request path. See the module docs.
#[derive(Debug)]
pub struct Error {
    kind: Kind,
    retry: Retry,
    endpoint: Option<SocketAddr>,
    pool: Option<Box<str>>,
    tries: u32,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.describe(f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl Error {
    /// An error of `kind`, retryable as the kind says.
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            retry: kind.retry(),
            endpoint: None,
            pool: None,
            tries: 0,
            source: None,
        }
    }

    /// An error of `kind` caused by `source`.
    pub fn caused(kind: Kind, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let mut e = Self::new(kind);
        e.source = Some(source.into());
        e
    }

    /// A malformed upstream response.
    pub fn malformed(what: &'static str) -> Self {
        Self::new(Kind::MalformedResponse(what))
    }

    /// A socket error on an established upstream connection.
    pub fn upstream_io(e: std::io::Error) -> Self {
        Self::caused(Kind::UpstreamIo, e)
    }

    /// The same error, at `endpoint`.
    #[must_use]
    pub fn at(mut self, endpoint: SocketAddr) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// The same error, as the last of `tries` attempts on `pool`.
    #[must_use]
    pub fn after(mut self, pool: &str, tries: u32) -> Self {
        self.pool = Some(pool.into());
        self.tries = tries;
        self
    }

    /// The same error, never to be retried (the answer has begun).
    #[must_use]
    pub fn final_(mut self) -> Self {
        self.retry = Retry::Never;
        self
    }

    /// What happened.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Whose failure it was.
    pub fn side(&self) -> Side {
        self.kind.side()
    }

    /// Whether the request may be tried again.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// Attempts made on the pool before giving up (0 when not known).
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The endpoint the failure happened at, if any.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }

    /// The status a request that failed this way is answered with: 503 with nowhere to send
    /// it, 413 for a body over the limit, 400 for a client body that broke (the client rarely
    /// reads it), 502 for anything the upstream did.
    pub fn status(&self) -> StatusCode {
        match self.kind.side() {
            Side::Internal => StatusCode::SERVICE_UNAVAILABLE,
            Side::Client => match self.kind {
                Kind::RequestBodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                _ => StatusCode::BAD_REQUEST,
            },
            Side::Upstream => StatusCode::BAD_GATEWAY,
        }
    }

    fn describe(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.pool, self.endpoint) {
            (Some(pool), Some(addr)) if self.tries > 1 => write!(
                f,
                "{pool}: {} tries failed; the last, at {addr}: {}",
                self.tries, self.kind
            )?,
            (Some(pool), Some(addr)) => write!(f, "{pool}: upstream {addr}: {}", self.kind)?,
            (Some(pool), None) => write!(f, "{pool}: {}", self.kind)?,
            (None, Some(addr)) => write!(f, "upstream {addr}: {}", self.kind)?,
            (None, None) => write!(f, "{}", self.kind)?,
        }
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_retries_and_statuses_follow_the_kind() {
        let refused = Error::new(Kind::ConnectRefused);
        assert_eq!(refused.side(), Side::Upstream);
        assert_eq!(refused.retry(), Retry::NotSent);
        assert_eq!(refused.status(), StatusCode::BAD_GATEWAY);

        let closed = Error::new(Kind::UpstreamClosed);
        assert_eq!(closed.retry(), Retry::IfReplayable);
        assert_eq!(closed.final_().retry(), Retry::Never);

        let bad = Error::new(Kind::MalformedResponse("status code"));
        assert_eq!(bad.retry(), Retry::Never);

        let big = Error::new(Kind::RequestBodyTooLarge(10));
        assert_eq!(big.side(), Side::Client);
        assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            Error::new(Kind::ClientBody).status(),
            StatusCode::BAD_REQUEST
        );

        let none = Error::new(Kind::NoEndpoints);
        assert_eq!(none.side(), Side::Internal);
        assert_eq!(none.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn the_message_names_pool_endpoint_tries_and_cause() {
        let addr: SocketAddr = "10.0.0.7:8080".parse().unwrap_or_else(|_| unreachable!());
        let e = Error::caused(
            Kind::UpstreamIo,
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        )
        .at(addr)
        .after("default/web:80", 3);
        let s = e.to_string();
        assert!(
            s.starts_with(
                "default/web:80: 3 tries failed; the last, at 10.0.0.7:8080: upstream I/O error: "
            ),
            "{s}"
        );
        assert_eq!(
            Error::new(Kind::NoEndpoints)
                .after("ns/svc:80", 0)
                .to_string(),
            "ns/svc:80: no endpoints available"
        );
    }
}
