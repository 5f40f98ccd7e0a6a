//! The `sluice` binary's library: the CLI, the two run modes — [`serve`] (standalone, objects
//! from YAML files) and [`cluster`] (`sluice controller`: objects from the API server, status,
//! leader election) — and the wiring both share to the data plane ([`app`]).
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod cluster;
pub mod logging;
pub mod serve;
