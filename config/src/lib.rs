//! `sluice-config`: the pure configuration model of sluice.
//!
//! Kubernetes objects (Ingress, IngressClass, Service, EndpointSlice, Secret) go in, an immutable,
//! comparable [`Snapshot`] comes out. Nothing here does I/O, so "which backend does this request
//! hit?" is answerable in a unit test, and the data plane can compare two snapshots to skip work.
//!
//! The translation follows the Ingress v1 specification (and KEP-1453 for path types and wildcard
//! hosts) exactly; see [`mod@translate`] for the details and the choices made where the specification
//! leaves room.
#![forbid(unsafe_code)]

pub mod annotations;
pub mod cidr;
pub mod configmap;
pub mod convert;
pub mod gateway;
pub mod gateway_api;
pub mod gateway_model;
pub mod host;
pub mod htpasswd;
pub mod matcher;
pub mod merge;
pub mod model;
pub mod path;
pub mod pem;
pub mod refs;
pub mod request_path;
pub mod resolve;
pub mod route_policy;
pub mod snapshot;
pub mod translate;
pub mod world;

pub use cidr::Cidr;
pub use matcher::{RouteIndex, RouteRef};
pub use model::*;
pub use snapshot::Snapshot;
pub use translate::{TranslateOptions, translate};
pub use world::World;
