//! `sluice-proxy`: the data plane.
//!
//! Three swap points (see `docs/ARCHITECTURE.md`): the route table
//! ([`state::routes::RouteTable`] in one `ArcSwap`), each pool's endpoint set
//! ([`upstream::cluster::Cluster::endpoints`]), and the certificate store
//! ([`state::certs::CertStore`]). The upstream connection pool, metric families and listeners
//! are never swapped. A request loads the route table once and finishes on what it loaded.
//!
//! Folders by role, each importing only those listed after it:
//! - [`server`]: listeners, TLS termination, the HTTP/1 fast reader, the hand-over to hyper;
//! - [`handler`]: routing a request — the direct and the general handler, local answers, the
//!   response writer;
//! - [`admin`]: the admin API, probes and `/metrics`;
//! - [`state`]: the data plane, its swap points, the route table, the certificate store;
//! - [`upstream`]: clusters, endpoints, balancing, the pool, the HTTP/1 and h2 clients, retries;
//! - [`telemetry`]: metric families, the access log, the error log;
//! - [`wire`]: the HTTP/1 codec and the per-field rules both sides share;
//! - [`io`]: stream adapters (activity and deadlines, replayed prefixes);
//! - [`error`], [`clock`], [`crypto`]: one error type, one clock, one crypto provider.
#![forbid(unsafe_code)]

pub mod admin;
pub mod clock;
pub mod crypto;
pub mod error;
pub mod handler;
pub mod io;
pub mod policy;
pub mod server;
pub mod state;
pub mod telemetry;
pub mod upstream;
pub mod wire;

pub use error::{Error, Kind, Retry, Side};
pub use server::{Server, ServerOptions};
pub use state::dataplane::{ApplyOutcome, DataPlane};
pub use state::settings::ProxySettings;
