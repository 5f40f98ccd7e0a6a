//! Sending a request to a pool: pick, connect (or reuse), send, and retry where it is safe.
//!
//! Retry rules — nginx's `proxy_next_upstream error` made explicit (no request fails because a
//! pod went away, and nothing is ever sent twice that must not be):
//! - connect failures (refused, reset, timeout) happen before any byte is sent: retry on a
//!   *different* endpoint, any method, up to `tries` endpoints; the failed endpoint is
//!   ejected for a short, growing time;
//! - a pooled connection that turns out closed before the request was written hands the request
//!   back (our HTTP/1 client's `Unsent`, hyper's `try_send_request` for h2c): retry, any method;
//! - a request that may be replayed ([`Plan::replay`]: idempotent, or `non_idempotent` allowed
//!   by the route; body-less; retries not `off`) whose connection broke after it was written
//!   but before any byte of the response head arrived (reset, close, I/O error):
//!   - on a *reused* connection (the pod closed its idle connection as we sent): replayed on a
//!     new connection, which may be to the same pod;
//!   - on a *new* connection (the pod died under the request): the endpoint is ejected and the
//!     request replayed on a *different* endpoint;
//! - after any of the above, the next attempt opens a *new* connection instead of taking
//!   another idle one: a pod that is shutting down closes all its idle connections at once, so
//!   its other pooled connections are likely dead too. `tries` bounds the endpoints tried and
//!   `2 × tries + 2` the attempts; the caller's request deadline bounds the time;
//! - anything else (an answer the upstream gave, however malformed; a request body that
//!   failed on the client's side) is final: 502, or the client's error.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body::Body as _;
use sluice_config::{NextUpstream, UpstreamProtocol};

use crate::error::{Error, Kind, Retry, Side};
use crate::upstream::body::{ReqBody, RespBody};
use crate::upstream::cluster::{Cluster, RetryReason, Tried};
use crate::upstream::endpoint::{Endpoint, EndpointSet, InFlight};
use crate::upstream::h1::{self, H1Body, H1Conn, SendError, UpIo, Upload};
use crate::upstream::pool::PooledH1;
use crate::wire::forwarded::ProxyHeaders;
use crate::wire::{self, ReqFraming};

/// An HTTP/1 connection taken over by a protocol switch (101): the socket, and any bytes the
/// upstream sent after its response head.
#[derive(Debug)]
pub struct UpstreamUpgrade {
    /// The upstream socket.
    pub io: UpIo,
    /// Bytes already read past the 101 head, to pass to the client first.
    pub leftover: Bytes,
    /// The endpoint's in-flight mark, held for as long as the tunnel lasts.
    pub in_flight: InFlight,
}

/// A response from upstream (body still streaming).
#[derive(Debug)]
pub struct Delivered {
    /// The response; its body ends the in-flight mark and returns the connection.
    pub response: Response<RespBody>,
    /// For a 101 answer from an HTTP/1 upstream: the connection, now a tunnel.
    pub upgrade: Option<UpstreamUpgrade>,
    /// The endpoint that answered.
    pub endpoint: Arc<Endpoint>,
    /// Attempts before the one that answered.
    pub retries: u32,
    /// When the response head arrived (the clock read the endpoint's latency estimate took).
    pub answered: Instant,
}

/// Whether a request with this method may be sent twice (RFC 9110 §9.2.2).
pub fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// How one request may be tried: decided by the caller from the route and the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Endpoints to try at most.
    pub tries: u32,
    /// Whether the request may be sent again after its connection broke under it (it must
    /// also be body-less; the HTTP/1 and h2 clients check that).
    pub replay: bool,
    /// The request's hash for a hashing pool.
    pub key: Option<u64>,
}

impl Plan {
    /// The plan for a request with `method` on a route with these retry rules; `global_tries`
    /// is `--upstream-tries`.
    pub fn new(method: &Method, next: &NextUpstream, global_tries: u32, key: Option<u64>) -> Self {
        Self {
            tries: next.tries.unwrap_or(global_tries).max(1),
            replay: next.on_error && (idempotent(method) || next.non_idempotent),
            key,
        }
    }
}

/// Sends `req` to `cluster`, following the retry rules in the module docs.
/// `fwd` are the proxy headers to add (see [`crate::wire::forwarded`]).
/// `sent`: the caller's clock read for when the request left for the upstream, used for the
/// first attempt (one clock read fewer per request).
pub async fn send(
    cluster: &Cluster,
    req: Request<ReqBody>,
    plan: Plan,
    fwd: &ProxyHeaders<'_>,
    sent: Instant,
) -> Result<Delivered, Error> {
    match cluster.protocol {
        UpstreamProtocol::H2c | UpstreamProtocol::H2Tls => {
            let mut req = req;
            fwd.apply(req.headers_mut());
            // Boxed so that the HTTP/1 path's future does not carry the HTTP/2 one.
            Box::pin(send_h2(cluster, req, plan, sent)).await
        }
        UpstreamProtocol::Http1 | UpstreamProtocol::Https => {
            send_h1(cluster, req, plan, fwd, sent).await
        }
    }
}

/// The bookkeeping shared by both protocols: which endpoints were tried, whether the next
/// attempt must use a new connection, and the bound on attempts.
struct Attempts<'a> {
    cluster: &'a Cluster,
    set: Arc<EndpointSet>,
    tried: Tried,
    tries: usize,
    key: Option<u64>,
    attempt: usize,
    fresh: bool,
    why: Option<RetryReason>,
    /// The latest failure: what the request ends with if no attempt succeeds.
    last: Option<Error>,
}

impl<'a> Attempts<'a> {
    fn new(cluster: &'a Cluster, plan: Plan) -> Self {
        Self {
            cluster,
            set: cluster.endpoints.load_full(),
            tried: Tried::default(),
            tries: plan.tries.max(1) as usize,
            key: plan.key,
            attempt: 0,
            fresh: false,
            why: None,
            last: None,
        }
    }

    /// The time for the next attempt: the caller's read of the clock (`started`) for the first,
    /// a fresh read for a retry.
    fn now(&self, started: Instant) -> Instant {
        if self.attempt == 0 {
            started
        } else {
            Instant::now()
        }
    }

    /// The endpoint for the attempt made at `now`, if another attempt is allowed.
    fn next_at(&mut self, now: Instant) -> Option<Arc<Endpoint>> {
        if self.attempt >= 2 * self.tries + 2 || self.tried.len() >= self.tries {
            return None;
        }
        let ep = self
            .cluster
            .pick_at(&self.set, &self.tried, now, self.key)?;
        if let Some(why) = self.why.take() {
            self.cluster.stats.retries[why as usize].inc();
        }
        self.attempt += 1;
        Some(ep)
    }

    /// Attempts made before the current one.
    fn retries(&self) -> u32 {
        u32::try_from(self.attempt.saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Another attempt follows for this reason; `fresh`: on a new connection.
    fn again(&mut self, why: RetryReason) {
        self.why = Some(why);
        self.fresh = true;
    }

    /// Connecting to `ep` failed before anything was sent: eject it, try another.
    fn connect_failed(&mut self, ep: &Endpoint, e: Error) {
        tracing::debug!(endpoint = %ep.addr, pool = %self.cluster.name, error = %e, "connect failed; trying another endpoint");
        self.eject(ep);
        self.cluster.stats.connect_errors.inc();
        self.why = Some(RetryReason::ConnectFailed);
        self.last = Some(e.at(ep.addr));
    }

    /// A new connection to `ep` broke under a request that may be replayed: the pod is likely
    /// gone; eject it and replay elsewhere.
    fn broke_after_send(&mut self, ep: &Endpoint, e: Error) {
        tracing::debug!(endpoint = %ep.addr, pool = %self.cluster.name, error = %e, "connection broke before the response; replaying on another endpoint");
        self.eject(ep);
        self.again(RetryReason::BrokeAfterSend);
        self.last = Some(e.at(ep.addr));
    }

    fn eject(&mut self, ep: &Endpoint) {
        let d = ep.fail_and_eject();
        tracing::debug!(endpoint = %ep.addr, ejected_for = ?d, "endpoint ejected");
        self.cluster.stats.ejections.inc();
        self.tried.push(ep.addr);
    }

    /// Why no attempt succeeded: the last failure, or that there was nothing to try.
    fn exhausted(self) -> Error {
        let tried = u32::try_from(self.tried.len()).unwrap_or(u32::MAX);
        let none = if self.set.members.is_empty() || self.cluster.max_in_flight().is_none() {
            Kind::NoEndpoints
        } else {
            Kind::EndpointsAtLimit
        };
        self.last
            .unwrap_or_else(|| Error::new(none))
            .after(&self.cluster.name, tried)
    }
}

/// Counts a failed exchange against `ep` when the failure was the upstream's doing (a client
/// whose body broke or ran over the limit says nothing about the endpoint). The callers that
/// give up on a request decide this; building the error never does.
pub fn count_against(ep: &Endpoint, e: &Error) {
    if e.side() == Side::Upstream {
        ep.count_failure();
    }
}

/// HTTP/1.1 (cleartext or TLS) through sluice's own client. The head is encoded once; the
/// same bytes are what a replay sends.
async fn send_h1(
    cluster: &Cluster,
    req: Request<ReqBody>,
    plan: Plan,
    fwd: &ProxyHeaders<'_>,
    sent: Instant,
) -> Result<Delivered, Error> {
    let (mut parts, body) = req.into_parts();
    let framing = wire::request_framing(&parts.method, &mut parts.headers, &body);
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let head = wire::encode_head(&parts.method, target, &parts.headers, framing, fwd);
    let head_request = parts.method == Method::HEAD;
    let answer = exchange_h1(cluster, &head, body, framing, plan, H1Conn::poll_head, sent).await?;
    let H1Answer {
        head: mut rhead,
        conn,
        upload,
        in_flight,
        endpoint,
        retries,
        answered,
    } = answer;
    let (rframing, keep_alive) = wire::response_framing(&mut rhead, head_request).map_err(|e| {
        count_against(&endpoint, &e);
        e.at(endpoint.addr)
    })?;
    let mut response = Response::new(RespBody::empty());
    *response.status_mut() = rhead.status;
    *response.headers_mut() = rhead.headers;
    let upgrade = if rhead.status == StatusCode::SWITCHING_PROTOCOLS {
        let (io, leftover) = conn.conn.into_parts();
        Some(UpstreamUpgrade {
            io,
            leftover,
            in_flight,
        })
    } else {
        *response.body_mut() =
            RespBody::H1(H1Body::new(conn, rframing, keep_alive, in_flight, upload));
        None
    };
    Ok(Delivered {
        response,
        upgrade,
        endpoint,
        retries,
        answered,
    })
}

/// What an HTTP/1 upstream answered: the response head (as the head reader gave it), the
/// connection its body is read from, the rest of an upload the answer overtook, the in-flight
/// mark and the endpoint.
#[derive(Debug)]
pub struct H1Answer<H> {
    /// The response head.
    pub head: H,
    /// The connection, positioned at the start of the body.
    pub conn: PooledH1,
    /// The unsent rest of the request, if the answer came first.
    pub upload: Option<Box<Upload>>,
    /// The endpoint's in-flight mark (responded already).
    pub in_flight: InFlight,
    /// The endpoint that answered.
    pub endpoint: Arc<Endpoint>,
    /// When the response head arrived.
    pub answered: Instant,
    /// Attempts before the one that answered.
    pub retries: u32,
}

/// Sends an encoded request head (and `body`) to `cluster` over HTTP/1, following the retry
/// rules in the module docs, and reads the answer's head with `read_head`. `started`: when the
/// request started (read once by the caller, used for the first attempt).
pub async fn exchange_h1<H>(
    cluster: &Cluster,
    head: &Bytes,
    body: ReqBody,
    framing: ReqFraming,
    plan: Plan,
    mut read_head: impl FnMut(&mut H1Conn, &mut Context<'_>) -> Poll<Result<H, Error>>,
    started: Instant,
) -> Result<H1Answer<H>, Error> {
    // A body is streamed, not kept: only a body-less request can be written twice.
    let replayable = plan.replay && framing == ReqFraming::Empty;
    let mut att = Attempts::new(cluster, plan);
    let mut body = Some(body);
    while let Some(b) = body.take() {
        let now = att.now(started);
        let Some(ep) = att.next_at(now) else { break };
        let flight = ep.start_at(now);
        let fresh = std::mem::take(&mut att.fresh);
        let mut checkout = match ep.pool.checkout_h1(fresh, now).await {
            Ok(c) => c,
            Err(e) => {
                att.connect_failed(&ep, e);
                body = Some(b);
                continue;
            }
        };
        match h1::send_with(&mut checkout.conn.conn, head, b, framing, &mut read_head).await {
            Ok((rhead, upload)) => {
                let answered = flight.responded();
                return Ok(H1Answer {
                    head: rhead,
                    conn: checkout.conn,
                    upload,
                    in_flight: flight,
                    endpoint: ep,
                    answered,
                    retries: att.retries(),
                });
            }
            Err(SendError::Unsent { body: b, error }) => {
                // Nothing was written: safe for any method. A new connection that cannot take
                // a write counts against the endpoint.
                tracing::debug!(endpoint = %ep.addr, reused = checkout.reused, %error, "request not sent; retrying");
                if !checkout.reused {
                    att.tried.push(ep.addr);
                }
                att.again(RetryReason::NotSent);
                body = Some(b);
            }
            Err(SendError::Failed(e)) if replayable && e.retry() == Retry::IfReplayable => {
                if checkout.reused {
                    tracing::debug!(endpoint = %ep.addr, error = %e, "reused connection broke; replaying");
                    att.again(RetryReason::IdleClosed);
                } else {
                    att.broke_after_send(&ep, e);
                }
                body = Some(ReqBody::empty());
            }
            Err(SendError::Failed(e)) => {
                count_against(&ep, &e);
                return Err(e.at(ep.addr));
            }
        }
    }
    Err(att.exhausted())
}

/// Copies a body-less request so it can be replayed.
fn copy_head(parts: &Parts) -> Request<ReqBody> {
    let mut r = Request::new(ReqBody::empty());
    *r.method_mut() = parts.method.clone();
    *r.uri_mut() = parts.uri.clone();
    *r.version_mut() = parts.version;
    *r.headers_mut() = parts.headers.clone();
    r
}

/// HTTP/2 cleartext through hyper's client on the pool's shared connection.
async fn send_h2(
    cluster: &Cluster,
    req: Request<ReqBody>,
    plan: Plan,
    sent: Instant,
) -> Result<Delivered, Error> {
    let mut att = Attempts::new(cluster, plan);
    let mut pending = Some(req);
    while let Some(req) = pending.take() {
        let now = att.now(sent);
        let Some(ep) = att.next_at(now) else { break };
        let flight = ep.start_at(now);
        let (mut sender, reused) = match ep.pool.checkout_h2().await {
            Ok(c) => c,
            Err(e) => {
                att.connect_failed(&ep, e);
                pending = Some(req);
                continue;
            }
        };
        let can_replay = plan.replay && req.body().is_end_stream();
        let (parts, body) = req.into_parts();
        let replay = can_replay.then(|| copy_head(&parts));
        match sender
            .try_send_request(Request::from_parts(parts, body))
            .await
        {
            Ok(response) => {
                let answered = flight.responded();
                let (rparts, inner) = response.into_parts();
                let in_flight = (!inner.is_end_stream()).then_some(flight);
                return Ok(Delivered {
                    response: Response::from_parts(rparts, RespBody::H2 { inner, in_flight }),
                    upgrade: None,
                    endpoint: ep,
                    retries: att.retries(),
                    answered,
                });
            }
            Err(mut e) => {
                if let Some(back) = e.take_message() {
                    tracing::debug!(endpoint = %ep.addr, "h2 connection was closed; retrying");
                    att.again(RetryReason::NotSent);
                    pending = Some(back);
                    continue;
                }
                if let Some(r) = replay {
                    if reused {
                        tracing::debug!(endpoint = %ep.addr, error = %e.error(), "reused connection broke; replaying");
                        att.again(RetryReason::IdleClosed);
                    } else {
                        att.broke_after_send(&ep, Error::caused(Kind::UpstreamH2, e.into_error()));
                    }
                    pending = Some(r);
                    continue;
                }
                let e = Error::caused(Kind::UpstreamH2, e.into_error());
                count_against(&ep, &e);
                return Err(e.at(ep.addr));
            }
        }
    }
    Err(att.exhausted())
}

#[cfg(test)]
mod tests;
