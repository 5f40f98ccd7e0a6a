//! `sluice-bench`: the load generator, pod-like backends, peer launchers and scenarios.
#![forbid(unsafe_code)]

pub mod backend;
pub mod certs;
pub mod load;
pub mod peers;
pub mod pods;
pub mod report;
pub mod scenario;
pub mod sys;
