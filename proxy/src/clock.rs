//! A cheap monotonic clock in nanoseconds, for timestamps kept in atomics (endpoint ejection,
//! connection activity, EWMA stamps) where an `Instant` cannot be stored.

use std::time::Instant;

/// Process-wide monotonic epoch for atomically stored instants.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since the process epoch.
pub fn now_nanos() -> u64 {
    nanos_at(Instant::now())
}

/// Nanoseconds from the process epoch to `t` (no clock read: a request reads the clock a few
/// times and passes the instant along, rather than each step reading it again).
pub fn nanos_at(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}
