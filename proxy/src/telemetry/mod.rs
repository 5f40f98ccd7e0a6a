//! What sluice tells its operators: Prometheus metric families ([`metrics`]), the access log
//! ([`access_log`]) and the rate-limited error log of the answers it gives itself ([`errlog`]).

pub mod access_log;
pub mod errlog;
pub mod histogram;
pub mod metrics;
pub mod traffic;
