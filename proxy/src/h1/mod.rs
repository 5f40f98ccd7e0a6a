//! sluice's own HTTP/1.1 client for upstream connections.
//!
//! Why not hyper's client: hyper runs every upstream connection as a task of its own and hands
//! each request and response across channels, so one proxied request wakes three tasks and
//! crosses threads. Here the request task writes the encoded head straight into the socket,
//! parses the response head with `httparse` out of a per-connection buffer, and the response
//! body reads from that same socket as the client connection asks for it. Nothing is spawned,
//! nothing crosses a channel, and the encoded head (a `Bytes`) doubles as the copy a replay
//! needs. HTTP/2 upstreams (h2c) still use hyper.
//!
//! What it does (RFC 9112): requests are framed by `Content-Length` when the body's length is
//! known and by chunked coding otherwise; responses by the rules of §6.3 (no body for `HEAD`,
//! 1xx, 204 and 304; chunked when it is the final transfer coding; else `Content-Length`; else
//! until close). Interim 1xx responses other than 101 are skipped. A connection goes back to
//! the pool only when the response said nothing against keep-alive and ended exactly where its
//! framing said it would.

mod body;
mod conn;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod field;

pub use body::H1Body;
pub use conn::{H1Conn, SendError, UpIo, Upload, send, send_with};
pub use decode::{Framing, Head, RawHead, ResponseFraming, framing_of, response_framing};
pub use encode::{ReqFraming, encode_head, request_framing};

use crate::body::BodyError;

/// Largest upstream response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;

/// Why an exchange with an upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// A socket error.
    #[error("upstream I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The upstream closed the connection before a complete response head.
    #[error("upstream closed the connection before answering")]
    Closed,
    /// The response head did not fit in [`MAX_HEAD`] bytes.
    #[error("upstream response head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// The response head is not HTTP/1.x.
    #[error("malformed upstream response: {0}")]
    Parse(#[from] httparse::Error),
    /// The response head parsed but is not usable.
    #[error("malformed upstream response: {0}")]
    Malformed(&'static str),
    /// The response body ended before its declared end.
    #[error("upstream response body ended early")]
    Truncated,
    /// The upstream sent nothing for the read timeout while its response body was read.
    #[error("upstream sent nothing for {0:?} in the middle of its response body")]
    ReadTimeout(std::time::Duration),
    /// Reading the request body from the client failed (or it was too large).
    #[error("request body: {0}")]
    RequestBody(#[source] Box<BodyError>),
}

impl H1Error {
    /// Whether the exchange failed on the connection itself before a response head arrived
    /// (reset, close, I/O error): nothing reached the client, and an idempotent request may go
    /// to another endpoint. A malformed answer is the upstream's answer and is final; a failed
    /// request body is the client's.
    pub fn before_response(&self) -> bool {
        matches!(self, H1Error::Io(_) | H1Error::Closed)
    }
}

#[cfg(test)]
mod tests;
