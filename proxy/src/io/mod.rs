//! Byte-stream adapters the server and the handlers share: a stream that records activity and
//! enforces the idle and send deadlines ([`activity`]), one that replays bytes already read
//! ([`prefixed`]), and one that writes an HTTP/2 connection's ready answers together
//! ([`coalesce`]), and a connection's last answer sent with its close ([`finish`]).

pub mod activity;
pub mod coalesce;
pub mod finish;
pub mod prefixed;
