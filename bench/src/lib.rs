//! `sluice-bench`: the load generator, pod-like backends, peer launchers and scenarios.
#![forbid(unsafe_code)]

pub mod backend;
