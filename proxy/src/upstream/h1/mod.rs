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
//!
//! Failures are [`crate::Error`]s of the upstream side; a request body that fails is the
//! client's ([`crate::error::Kind::ClientBody`], [`crate::error::Kind::RequestBodyTooLarge`]).

mod body;
mod conn;

pub use body::H1Body;
pub use conn::{H1Conn, SendError, UpIo, Upload, send, send_with};

#[cfg(test)]
mod tests;
