//! The `sluice` binary's library: the CLI, the two run modes — [`serve`] (standalone, objects
//! from YAML files) and [`mod@kube`] (`sluice controller`: objects from the API server, status,
//! leader election) — the wiring both share to the data plane ([`app`]), and the migration
//! report [`check`].
#![forbid(unsafe_code)]

pub mod app;
pub mod check;
pub mod cli;
pub mod endpoints;
pub mod handover;
pub mod kube;
pub mod logging;
pub mod serve;
pub mod to_gateway;
