//! Byte-stream adapters the server and the handlers share: a stream that records activity and
//! enforces the idle and send deadlines ([`activity`]), and one that replays bytes already read
//! ([`prefixed`]).

pub mod activity;
pub mod prefixed;
