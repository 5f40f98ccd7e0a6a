//! Routing a request and answering it: the direct handler (body-less HTTP/1 requests to HTTP/1
//! upstreams, straight from the fast reader's bytes), the general handler (everything else, on
//! hyper's request types), the local answers, and the HTTP/1 response writer the fast path
//! shares with the direct handler.
//!
//! The server calls in here; nothing here calls the server.

pub mod auth;
mod conn;
pub(crate) mod direct;
mod errors;
pub mod general;
pub(crate) mod local;
pub(crate) mod respond;
pub(crate) mod rules;

pub use conn::{ConnInfo, Slot, TunnelGuard};
pub use general::handle;
