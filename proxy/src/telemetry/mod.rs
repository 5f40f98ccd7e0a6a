//! What sluice tells its operators: Prometheus metric families ([`metrics`]), the access log
//! ([`access`]) and the rate-limited error log of the answers it gives itself ([`errlog`]).

pub mod access;
pub mod errlog;
pub mod metrics;
