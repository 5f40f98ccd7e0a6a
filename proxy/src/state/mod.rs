//! The data plane's state and its swap points: the route table ([`routes`], one `ArcSwap`),
//! each pool's endpoint set (in [`crate::upstream::cluster`]), and the certificate store
//! ([`certs`]). [`dataplane::DataPlane`] applies a snapshot to all three.

pub mod auth;
pub mod certs;
pub mod dataplane;
pub mod edits;
pub mod limits;
pub mod routes;
pub mod settings;

#[cfg(test)]
mod tests;
