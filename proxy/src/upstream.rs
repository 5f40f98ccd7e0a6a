//! Sending a request to a pool: pick, connect (or reuse), send, and retry where it is safe.
//!
//! Retry rules (no request fails because a pod went away):
//! - connect failures (refused, reset, timeout) happen before any byte is sent: retry on a
//!   *different* endpoint, any method, up to `upstream_tries` endpoints; the failed endpoint is
//!   ejected for a short, growing time;
//! - a pooled connection that turns out closed before the request was written hands the request
//!   back (hyper's `try_send_request`): retry, any method;
//! - an idempotent, body-less request on a *reused* connection that broke after it was written
//!   (the peer closed its idle connection as we sent) is replayed on a fresh pick;
//! - after either of the two above, the next attempt opens a *new* connection instead of taking
//!   another idle one: a pod that is shutting down closes all its idle connections at once, so
//!   its other pooled connections are likely dead too, and a new connect to it is refused and
//!   moves on to a different endpoint. A break on a new connection is never replayed, which
//!   bounds the replays (and `2 × tries + 2` bounds the attempts);
//! - anything else is a 502.

use std::sync::Arc;

use http::request::Parts;
use http::{Method, Request, Response};
use http_body::Body as _;
use hyper::body::Incoming;

use crate::body::{Completion, ReqBody};
use crate::cluster::{Cluster, Tried};
use crate::endpoint::Endpoint;
use crate::pool::{Conn, ConnectError};

/// Why a request could not be delivered.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The pool has no endpoints at all.
    #[error("no endpoints available for {0}")]
    NoEndpoints(String),
    /// Every endpoint tried refused or timed out.
    #[error("could not connect to {pool} after {tries} tries: {last}")]
    ConnectFailed {
        /// Pool name.
        pool: String,
        /// Endpoints tried.
        tries: usize,
        /// The last connect error.
        last: ConnectError,
    },
    /// The exchange broke after the request was sent.
    #[error("upstream {addr} failed during the exchange: {source}")]
    Broken {
        /// Endpoint address.
        addr: std::net::SocketAddr,
        /// hyper's error.
        source: hyper::Error,
    },
}

/// A response head from upstream plus what to finish when its body ends.
#[derive(Debug)]
pub struct Delivered {
    /// The response (body still streaming).
    pub response: Response<Incoming>,
    /// End-of-body bookkeeping.
    pub completion: Completion,
    /// The endpoint that answered.
    pub endpoint: Arc<Endpoint>,
}

fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
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

/// Sends `req` to `cluster`, following the retry rules in the module docs.
pub async fn send(
    cluster: &Cluster,
    req: Request<ReqBody>,
    tries: u32,
) -> Result<Delivered, UpstreamError> {
    let set = cluster.endpoints.load_full();
    let mut tried = Tried::default();
    let mut pending = Some(req);
    let mut fresh = false;
    let mut last_connect: Option<ConnectError> = None;
    let max_attempts = 2 * tries.max(1) as usize + 2;
    for attempt in 0..max_attempts {
        let Some(req) = pending.take() else { break };
        if tried.len() >= tries.max(1) as usize {
            break;
        }
        let Some(ep) = cluster.pick(&set, &tried) else {
            break;
        };
        if attempt > 0 {
            cluster.stats.retries.inc();
        }
        let flight = ep.start();
        let checkout = match ep.pool.checkout(std::mem::take(&mut fresh)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(endpoint = %ep.addr, pool = %cluster.name, error = %e, "connect failed; trying another endpoint");
                let d = ep.fail_and_eject();
                tracing::debug!(endpoint = %ep.addr, ejected_for = ?d, "endpoint ejected");
                cluster.stats.connect_errors.inc();
                cluster.stats.ejections.inc();
                tried.push(ep.addr);
                last_connect = Some(e);
                pending = Some(req);
                continue;
            }
        };
        let can_replay = checkout.reused && idempotent(req.method()) && req.body().is_end_stream();
        let (parts, body) = req.into_parts();
        let replay = can_replay.then(|| copy_head(&parts));
        let req = Request::from_parts(parts, body);
        let (result, pooled) = match checkout.conn {
            Conn::H1(mut p) => {
                let r = p.sender.try_send_request(req).await;
                (r, Some(p))
            }
            Conn::H2(mut s) => (s.try_send_request(req).await, None),
        };
        match result {
            Ok(response) => {
                flight.responded();
                return Ok(Delivered {
                    response,
                    completion: Completion {
                        in_flight: flight,
                        conn: pooled,
                    },
                    endpoint: ep,
                });
            }
            Err(mut e) => {
                if let Some(back) = e.take_message() {
                    // Never written: the pooled connection was already dead. Safe for any method.
                    tracing::debug!(endpoint = %ep.addr, "pooled connection was closed; retrying");
                    fresh = true;
                    pending = Some(back);
                    continue;
                }
                if let Some(r) = replay {
                    tracing::debug!(endpoint = %ep.addr, error = %e.error(), "reused connection broke; replaying idempotent request");
                    fresh = true;
                    pending = Some(r);
                    continue;
                }
                ep.count_failure();
                return Err(UpstreamError::Broken {
                    addr: ep.addr,
                    source: e.into_error(),
                });
            }
        }
    }
    match last_connect {
        Some(last) => Err(UpstreamError::ConnectFailed {
            pool: cluster.name.clone(),
            tries: tried.len(),
            last,
        }),
        None => Err(UpstreamError::NoEndpoints(cluster.name.clone())),
    }
}
