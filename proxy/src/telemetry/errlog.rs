//! One `warn` line for every error answer sluice generates itself (502, 503, 504), saying why
//! and which pool or endpoint — the detail that the client-facing body deliberately leaves out
//! (internal names must not leak to whoever sent the request).
//!
//! Lines are rate-limited process-wide: a flood of failures (a dead pool under load, an attacker
//! hammering a route without endpoints) must not flood the log or cost the proxy its CPU. Up to
//! [`LINES_PER_SECOND`] lines are written each second; the first line after a suppressed stretch
//! says how many were left out. The limiter is one atomic word, so the hot path takes no lock.

use std::fmt::Display;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Most error lines written in one second.
pub const LINES_PER_SECOND: u32 = 20;

/// A per-second line budget: the high 32 bits hold the second (since `start`), the low 32 bits
/// the lines written in it.
#[derive(Debug)]
pub struct RateLimit {
    start: Instant,
    per_second: u32,
    window: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    /// A budget of `per_second` lines each second.
    pub fn new(per_second: u32) -> Self {
        Self {
            start: Instant::now(),
            per_second,
            window: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were suppressed since the
    /// last written one; `None` when this second's budget is spent (the line is counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let second = now.saturating_duration_since(self.start).as_secs() & 0xffff_ffff;
        let mut cur = self.window.load(Ordering::Relaxed);
        loop {
            let (win, used) = (cur >> 32, cur & 0xffff_ffff);
            let next = if win == second {
                if used >= u64::from(self.per_second) {
                    self.suppressed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                cur + 1
            } else {
                (second << 32) | 1
            };
            match self
                .window
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(self.suppressed.swap(0, Ordering::Relaxed)),
                Err(seen) => cur = seen,
            }
        }
    }
}

static LIMIT: LazyLock<RateLimit> = LazyLock::new(|| RateLimit::new(LINES_PER_SECOND));

/// Logs one locally generated error answer: its status, the pool (`namespace/service:port`, or
/// the Ingress for a route without a usable backend), and why.
pub fn answered(status: u16, pool: &str, why: &dyn Display) {
    if let Some(suppressed) = LIMIT.admit(Instant::now()) {
        if suppressed > 0 {
            tracing::warn!(status, pool, suppressed, "{why}");
        } else {
            tracing::warn!(status, pool, "{why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn budget_per_second_and_suppressed_count() {
        let l = RateLimit::new(3);
        let t0 = l.start;
        assert_eq!(l.admit(t0), Some(0));
        assert_eq!(l.admit(t0), Some(0));
        assert_eq!(l.admit(t0 + Duration::from_millis(900)), Some(0));
        assert_eq!(l.admit(t0 + Duration::from_millis(950)), None);
        assert_eq!(l.admit(t0 + Duration::from_millis(990)), None);
        // The next second: a fresh budget, and the first line reports the two left out.
        assert_eq!(l.admit(t0 + Duration::from_millis(1000)), Some(2));
        assert_eq!(l.admit(t0 + Duration::from_millis(1001)), Some(0));
        // A quiet stretch and then a burst: the budget is per second, not cumulative.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(l.admit(later).is_some());
        }
        assert_eq!(l.admit(later), None);
    }

    #[test]
    fn concurrent_callers_never_exceed_the_budget() {
        let l = std::sync::Arc::new(RateLimit::new(50));
        let t = l.start;
        let admitted: usize = (0..4)
            .map(|_| {
                let l = std::sync::Arc::clone(&l);
                std::thread::spawn(move || (0..1000).filter(|_| l.admit(t).is_some()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .sum();
        assert_eq!(admitted, 50);
        assert_eq!(l.suppressed.load(Ordering::Relaxed), 4000 - 50);
    }
}
