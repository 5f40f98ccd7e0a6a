//! The data plane's state and its swap points: the route table ([`routes`], one `ArcSwap`),
//! each pool's endpoint set (in [`crate::upstream::cluster`]), and the certificate store
//! ([`certs`]). [`dataplane::DataPlane`] applies a snapshot to all three. Each route's compiled
//! policy (auth, edits, limits) lives in [`crate::policy`].

pub mod certs;
pub mod changes;
pub mod dataplane;
mod pools;
pub mod routes;
pub mod settings;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_gateway;
