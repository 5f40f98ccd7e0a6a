//! `sluice-proxy`: the data plane.
//!
//! Three swap points (see ARCHITECTURE §3): the route table ([`routes::RouteTable`] in one
//! `ArcSwap`), each pool's endpoint set ([`cluster::Cluster::endpoints`]), and the certificate
//! store ([`tls::CertStore`]). The upstream connection pool, metric families and listeners are
//! never swapped. A request loads the route table once and finishes on what it loaded.
#![forbid(unsafe_code)]

pub mod access;
pub mod activity;
pub mod admin;
pub mod balance;
pub mod body;
pub mod cluster;
pub mod dataplane;
mod direct;
pub mod endpoint;
pub mod errlog;
pub mod fastpath;
pub mod forward;
pub mod forwarded;
pub mod h1;
pub mod hop;
pub mod listener;
pub mod metrics;
pub mod pool;
pub mod prefixed;
mod respond;
pub mod routes;
pub mod server;
pub mod settings;
pub mod tls;
pub mod upstream;
pub mod upstream_tls;

pub use dataplane::{ApplyOutcome, DataPlane};
pub use server::{Server, ServerOptions};
pub use settings::ProxySettings;
