//! Request limits per client address (ingress-nginx's `limit-rps`, `limit-rpm`,
//! `limit-connections`), one [`Limiter`] per limited Ingress, kept across configuration changes
//! while its settings stay.
//!
//! Memory is bounded whatever the number of clients: each limit has a fixed table of
//! [`SLOTS`] entries (4-way sets, 16 bytes an entry: 256 KiB), indexed by a keyed SipHash of the
//! address. A new address takes the stalest entry of its set, so a client pushed out that way
//! starts again with a full allowance; with fewer than about [`SLOTS`] / 4 clients active at
//! once nobody is pushed out. Lookups and updates are atomic operations, no locks.
//!
//! Rates use GCRA (the generic cell rate algorithm): each entry holds the theoretical arrival
//! time of the next request; a request is admitted while that time is at most `burst` emission
//! intervals ahead of now — `burst` extra requests at once, then one per interval, as nginx's
//! `limit_req burst=N nodelay`.

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_config::route_policy::RateLimits;

/// Entries per limit table.
pub const SLOTS: usize = 16 * 1024;
const WAYS: usize = 4;

/// A fixed table of `(tag, value)` entries in 4-way sets.
#[derive(Debug)]
struct Table {
    tags: Box<[AtomicU64]>,
    values: Box<[AtomicU64]>,
}

impl Table {
    fn new() -> Self {
        Self {
            tags: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            values: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The entry of `tag` (non-zero), taking the set's entry with the smallest value (the
    /// stalest arrival time, or the fewest requests in flight) when the tag has none.
    fn slot(&self, hash: u64, evictable: impl Fn(u64) -> bool) -> Option<usize> {
        let tag = hash | 1;
        let base = (hash as usize >> 8) % (SLOTS / WAYS) * WAYS;
        let set = base..base + WAYS;
        if let Some(i) = set
            .clone()
            .find(|&i| self.tags[i].load(Ordering::Acquire) == tag)
        {
            return Some(i);
        }
        let victim = set
            .filter(|&i| evictable(self.values[i].load(Ordering::Relaxed)))
            .min_by_key(|&i| self.values[i].load(Ordering::Relaxed))?;
        let old = self.tags[victim].load(Ordering::Acquire);
        if self.tags[victim]
            .compare_exchange(old, tag, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.values[victim].store(0, Ordering::Release);
            Some(victim)
        } else {
            // Another request took it this instant; its tag may be ours.
            (self.tags[victim].load(Ordering::Acquire) == tag).then_some(victim)
        }
    }
}

/// One rate: its emission interval and the burst tolerance, in nanoseconds.
#[derive(Debug)]
struct Rate {
    interval: u64,
    tolerance: u64,
    table: Table,
}

impl Rate {
    fn new(per: u64, count: u32, burst: u64) -> Self {
        let interval = per / u64::from(count.max(1));
        Self {
            interval,
            tolerance: interval.saturating_mul(burst),
            table: Table::new(),
        }
    }

    fn admit(&self, hash: u64, now: u64) -> bool {
        let Some(i) = self.table.slot(hash, |_| true) else {
            return true;
        };
        let tat = &self.table.values[i];
        let mut current = tat.load(Ordering::Acquire);
        loop {
            let next = current.max(now) + self.interval;
            if next - now > self.interval + self.tolerance {
                return false;
            }
            match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

/// The limits of one Ingress.
#[derive(Debug)]
pub struct Limiter {
    rps: Option<Rate>,
    rpm: Option<Rate>,
    connections: Option<(u32, Table)>,
    exempt: Vec<sluice_config::Cidr>,
    hasher: std::collections::hash_map::RandomState,
}

/// A request over its Ingress's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit;

/// A request's place in `limit-connections`: released when dropped.
#[derive(Debug)]
pub struct InFlight<'a> {
    counter: Option<&'a AtomicU64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.counter {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        }
    }
}

impl Limiter {
    /// The limiter for these settings (tables allocated only for the limits set).
    pub fn new(l: &RateLimits) -> Self {
        const SECOND: u64 = 1_000_000_000;
        let burst = |count: u32| u64::from(count) * u64::from(l.burst_multiplier.max(1));
        Self {
            rps: l.rps.map(|n| Rate::new(SECOND, n, burst(n))),
            rpm: l.rpm.map(|n| Rate::new(60 * SECOND, n, burst(n))),
            connections: l.connections.map(|n| (n, Table::new())),
            exempt: l.exempt.clone(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Whether a request from `ip` at `now` (nanoseconds) is admitted; when it is, the guard
    /// holds its place under `limit-connections` until dropped.
    pub fn admit(&self, ip: IpAddr, now: u64) -> Option<InFlight<'_>> {
        if self.exempt.iter().any(|c| c.contains(ip)) {
            return Some(InFlight { counter: None });
        }
        let hash = self.hasher.hash_one(ip);
        let counter = match &self.connections {
            None => None,
            Some((max, table)) => {
                // An entry with requests in flight is never taken over.
                let i = table.slot(hash, |in_flight| in_flight == 0)?;
                let c = &table.values[i];
                c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    (v < u64::from(*max)).then_some(v + 1)
                })
                .ok()?;
                Some(c)
            }
        };
        let guard = InFlight { counter };
        let ok = self.rps.as_ref().is_none_or(|r| r.admit(hash, now))
            && self.rpm.as_ref().is_none_or(|r| r.admit(hash, now));
        ok.then_some(guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rps: Option<u32>, rpm: Option<u32>, conns: Option<u32>, mult: u32) -> Limiter {
        Limiter::new(&RateLimits {
            rps,
            rpm,
            burst_multiplier: mult,
            connections: conns,
            exempt: vec!["10.0.0.0/8".parse().unwrap()],
        })
    }

    const S: u64 = 1_000_000_000;
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_rate_admits_its_burst_then_one_per_interval() {
        let l = limits(Some(10), None, None, 2);
        let a = ip("192.0.2.1");
        let t0 = 1000 * S;
        // 1 + burst (20) at once.
        let admitted = (0..100).filter(|_| l.admit(a, t0).is_some()).count();
        assert_eq!(admitted, 21);
        // Then 10 a second.
        let later = (1..=100)
            .filter(|i| l.admit(a, t0 + i * S / 100).is_some())
            .count();
        assert_eq!(later, 10);
        // Another client has its own allowance; an exempt one has none.
        assert!(l.admit(ip("192.0.2.2"), t0).is_some());
        assert!((0..1000).all(|_| l.admit(ip("10.1.1.1"), t0).is_some()));
    }

    #[test]
    fn per_minute_and_in_flight() {
        let l = limits(None, Some(60), Some(2), 1);
        let a = ip("2001:db8::1");
        let t = 50 * S;
        let g1 = l.admit(a, t).unwrap();
        let g2 = l.admit(a, t).unwrap();
        assert!(l.admit(a, t).is_none(), "two in flight");
        drop(g1);
        drop(g2);
        // The rate (60/min, burst 60) is far from spent; the in-flight cap released.
        assert!(l.admit(a, t + S).is_some());
    }

    #[test]
    fn many_clients_stay_in_bounded_memory() {
        let l = limits(Some(1), None, None, 1);
        let t = 5 * S;
        // Far more clients than entries: every new one starts with a full allowance and the
        // table never grows.
        for i in 0..(SLOTS as u32 * 4) {
            let a = IpAddr::from(std::net::Ipv4Addr::from(0xC000_0000 | i));
            assert!(l.admit(a, t).is_some());
        }
        // A client active among few others keeps its state: its burst is spent.
        let l = limits(Some(1), None, None, 1);
        let a = ip("198.51.100.7");
        assert!(l.admit(a, t).is_some() && l.admit(a, t).is_some());
        assert!(l.admit(a, t).is_none());
    }
}
