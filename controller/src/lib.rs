//! The `sluice` binary's library: CLI, the standalone file provider (`serve`), the Kubernetes
//! controller (`controller`), and the wiring to the data plane.
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod controller;
pub mod logging;
pub mod manifests;
pub mod serve;
