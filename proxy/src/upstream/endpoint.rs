//! Upstream endpoints and their live state (in-flight requests, peak-EWMA latency, passive
//! health). An [`Endpoint`] outlives endpoint-set swaps: a new set reuses the `Arc<Endpoint>` of
//! every address it keeps, so this state survives churn.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_config::EndpointState;

use crate::clock::{nanos_at, now_nanos};
use crate::upstream::pool::HostPool;

/// Latency assumed for an endpoint that has not answered yet.
const DEFAULT_RTT_NANOS: f64 = 1_000_000.0;
/// Decay time constant of the EWMA.
const EWMA_TAU_NANOS: f64 = 10_000_000_000.0;
/// First ejection length; doubles on each consecutive failure up to [`MAX_EJECTION`].
const BASE_EJECTION: Duration = Duration::from_millis(250);
const MAX_EJECTION: Duration = Duration::from_secs(30);

/// One upstream address with its live statistics.
#[derive(Debug)]
pub struct Endpoint {
    /// Pod address.
    pub addr: SocketAddr,
    /// Idle connections to this address (shared by identity with any other user of it).
    pub pool: Arc<HostPool>,
    /// Stable hash of `addr`, for rendezvous hashing (computed once).
    pub hash_id: u64,
    in_flight: AtomicU32,
    requests: AtomicU64,
    failures: AtomicU64,
    ewma_bits: AtomicU64,
    ewma_stamp: AtomicU64,
    ejected_until: AtomicU64,
    consecutive_failures: AtomicU32,
}

impl Endpoint {
    /// A fresh endpoint with no history.
    pub fn new(addr: SocketAddr, pool: Arc<HostPool>) -> Self {
        Self {
            addr,
            pool,
            hash_id: crate::upstream::hash::endpoint_hash(&addr),
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            ewma_bits: AtomicU64::new(DEFAULT_RTT_NANOS.to_bits()),
            ewma_stamp: AtomicU64::new(now_nanos()),
            ejected_until: AtomicU64::new(0),
            consecutive_failures: AtomicU32::new(0),
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests started on this endpoint.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Failures (connect errors and broken exchanges).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Current peak-EWMA latency estimate.
    pub fn ewma(&self) -> Duration {
        Duration::from_nanos(f64::from_bits(self.ewma_bits.load(Ordering::Relaxed)) as u64)
    }

    /// Whether passive health has taken this endpoint out for now.
    pub fn is_ejected(&self, now: u64) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now
    }

    /// Load score for P2C: latency estimate times (in-flight + 1). Lower is better.
    pub fn cost(&self) -> f64 {
        let ewma = f64::from_bits(self.ewma_bits.load(Ordering::Relaxed));
        ewma * f64::from(self.in_flight() + 1)
    }

    /// Marks a request started; the guard ends it.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.start_at(Instant::now())
    }

    /// Marks a request started at `started`; the guard ends it.
    pub fn start_at(self: &Arc<Self>, started: Instant) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        InFlight {
            endpoint: Arc::clone(self),
            started,
        }
    }

    /// Records a latency sample (peak-EWMA: a higher sample replaces the estimate at once,
    /// lower ones decay into it).
    fn observe(&self, rtt: Duration, now: u64) {
        let rtt = rtt.as_nanos() as f64;
        let prev = f64::from_bits(self.ewma_bits.load(Ordering::Relaxed));
        let last = self.ewma_stamp.swap(now, Ordering::Relaxed);
        let next = if rtt > prev {
            rtt
        } else {
            let elapsed = now.saturating_sub(last) as f64;
            let w = (-elapsed / EWMA_TAU_NANOS).exp();
            prev * w + rtt * (1.0 - w)
        };
        self.ewma_bits.store(next.to_bits(), Ordering::Relaxed);
    }

    /// Records a failure and ejects the endpoint for a short time that grows with consecutive
    /// failures. Returns the ejection length.
    pub fn fail_and_eject(&self) -> Duration {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let n = self
            .consecutive_failures
            .fetch_add(1, Ordering::Relaxed)
            .min(7);
        let d = (BASE_EJECTION * 2u32.pow(n)).min(MAX_EJECTION);
        let until = now_nanos().saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.ejected_until.fetch_max(until, Ordering::Relaxed);
        d
    }

    /// Sets the latency estimate (tests of the balancing rules).
    #[cfg(test)]
    pub(crate) fn set_ewma_for_test(&self, d: Duration) {
        self.ewma_bits
            .store((d.as_nanos() as f64).to_bits(), Ordering::Relaxed);
    }

    /// Records a failure that says nothing about the endpoint's health (e.g. a broken exchange).
    pub fn count_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    fn succeed(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }
}

/// An in-flight request on an endpoint; dropping it ends the request.
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<Endpoint>,
    started: Instant,
}

impl InFlight {
    /// The endpoint this request went to.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The response head arrived: feed the latency estimate and clear the failure streak.
    /// Returns when (the one clock read this takes, for the caller's own timing).
    pub fn responded(&self) -> Instant {
        let now = Instant::now();
        self.endpoint
            .observe(now.saturating_duration_since(self.started), nanos_at(now));
        self.endpoint.succeed();
        now
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One entry of an endpoint set.
#[derive(Debug, Clone)]
pub struct Member {
    /// The shared endpoint.
    pub endpoint: Arc<Endpoint>,
    /// Ready or draining in this set.
    pub state: EndpointState,
}

/// An immutable endpoint list plus what picking needs, published as one pointer.
#[derive(Debug, Default)]
pub struct EndpointSet {
    /// All members in address order.
    pub members: Vec<Member>,
    /// Ready endpoints (picked normally).
    pub ready: Vec<Arc<Endpoint>>,
    /// Draining endpoints (picked only when no ready one is left).
    pub draining: Vec<Arc<Endpoint>>,
}

impl EndpointSet {
    /// Builds a set from members.
    pub fn new(members: Vec<Member>) -> Self {
        let pick = |s: EndpointState| {
            members
                .iter()
                .filter(|m| m.state == s)
                .map(|m| Arc::clone(&m.endpoint))
                .collect()
        };
        Self {
            ready: pick(EndpointState::Ready),
            draining: pick(EndpointState::Draining),
            members,
        }
    }

    /// Whether the set is the same list of addresses and states as `specs`.
    pub fn same_as(&self, specs: &[sluice_config::EndpointSpec]) -> bool {
        self.members.len() == specs.len()
            && self
                .members
                .iter()
                .zip(specs)
                .all(|(m, s)| m.endpoint.addr == s.addr && m.state == s.state)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::upstream::pool::{PoolKey, PoolRegistry, UpstreamSettings};

    fn endpoint() -> Arc<Endpoint> {
        let addr = SocketAddr::from(([10, 0, 0, 1], 80));
        let pools = PoolRegistry::new(UpstreamSettings::default());
        let pool = pools.get(PoolKey {
            addr,
            protocol: sluice_config::UpstreamProtocol::Http1,
            tls: None,
        });
        Arc::new(Endpoint::new(addr, pool))
    }

    #[test]
    fn ejection_doubles_with_each_consecutive_failure_up_to_the_cap() {
        let e = endpoint();
        let got: Vec<Duration> = (0..10).map(|_| e.fail_and_eject()).collect();
        assert_eq!(got[0], BASE_EJECTION);
        assert_eq!(got[1], BASE_EJECTION * 2);
        assert_eq!(got[2], BASE_EJECTION * 4);
        assert!(got.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*got.last().unwrap(), MAX_EJECTION);
        assert!(e.is_ejected(now_nanos()));
        assert!(
            !e.is_ejected(now_nanos() + 31_000_000_000),
            "over after the cap"
        );
        assert_eq!(e.failures(), 10);
    }

    #[test]
    fn an_answer_ends_the_failure_streak_and_a_counted_failure_does_not_eject() {
        let e = endpoint();
        e.fail_and_eject();
        e.fail_and_eject();
        e.start().responded();
        assert_eq!(
            e.fail_and_eject(),
            BASE_EJECTION,
            "streak cleared by the answer"
        );
        let fresh = endpoint();
        fresh.count_failure();
        assert_eq!(fresh.failures(), 1);
        assert!(!fresh.is_ejected(now_nanos()));
    }

    #[test]
    fn in_flight_counts_what_is_open_and_requests_what_was_started() {
        let e = endpoint();
        let a = e.start();
        let b = e.start();
        assert_eq!((e.in_flight(), e.requests()), (2, 2));
        drop(a);
        assert_eq!(e.in_flight(), 1);
        drop(b);
        assert_eq!((e.in_flight(), e.requests()), (0, 2));
    }
}
