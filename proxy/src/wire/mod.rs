//! The HTTP/1 wire format both sides share: the head parser, field classification, framing
//! (RFC 9112 §6), chunked coding, the head encoder, and the per-field rules every path applies
//! (hop-by-hop fields, the proxy headers). The fast reader, the direct handler and the upstream
//! HTTP/1 client all use these; this module uses none of them.

pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod field;
pub mod forwarded;
pub mod hop;
pub mod length;

pub use decode::{Framing, Head, RawHead, ResponseFraming, framing_of, response_framing};
pub use encode::{ReqFraming, encode_head, request_framing};
