//! Upstream pools ([`Cluster`]): one per Service port, with an endpoint set that is swapped as a
//! whole, and endpoint picking by the pool's policy ([`crate::upstream::balance`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use sluice_config::{BalancePolicy, ClusterKey, ClusterSpec, EndpointSpec, UpstreamProtocol};

use crate::clock::nanos_at;
use crate::telemetry::metrics::{Metrics, RetryLabels, ServiceLabels};
use crate::upstream::endpoint::{Endpoint, EndpointSet, Member};
use crate::upstream::pool::{PoolKey, PoolRegistry};
use crate::upstream::tls::TlsProfile;

/// Counters of one pool, resolved once.
#[derive(Debug, Clone)]
pub struct ClusterStats {
    /// Connect failures.
    pub connect_errors: prometheus_client::metrics::counter::Counter,
    /// Retries, indexed by [`RetryReason`].
    pub retries: [prometheus_client::metrics::counter::Counter; 4],
    /// Ejections.
    pub ejections: prometheus_client::metrics::counter::Counter,
    /// Time from sending to the response head.
    pub response_duration: crate::telemetry::metrics::AtomicHistogram,
}

/// An upstream pool. Kept across snapshots as long as its key, protocol and policy stay; only
/// its endpoint set is swapped.
#[derive(Debug)]
pub struct Cluster {
    /// Which Service port.
    pub key: ClusterKey,
    /// `namespace/service:port`, for labels and error bodies.
    pub name: String,
    /// Protocol to the pods.
    pub protocol: UpstreamProtocol,
    /// Balancing policy.
    pub balance: BalancePolicy,
    /// The current endpoints.
    pub endpoints: ArcSwap<EndpointSet>,
    /// Metric handles.
    pub stats: ClusterStats,
    rr: AtomicUsize,
    /// Most requests in flight per endpoint; 0 for no limit. Changes without a new pool.
    max_in_flight: AtomicU32,
    /// The pool's own upstream TLS (`proxy-ssl-*`).
    tls: Option<Arc<TlsProfile>>,
}

/// Small fixed list of endpoints already tried by one request.
#[derive(Debug, Default)]
pub struct Tried {
    addrs: [Option<SocketAddr>; 8],
    len: usize,
}

impl Tried {
    /// Adds an address (ignored past capacity).
    pub fn push(&mut self, a: SocketAddr) {
        if self.len < self.addrs.len() {
            self.addrs[self.len] = Some(a);
            self.len += 1;
        }
    }

    /// Whether `a` was tried.
    pub fn contains(&self, a: &SocketAddr) -> bool {
        self.addrs[..self.len].iter().any(|x| x.as_ref() == Some(a))
    }

    /// How many were tried.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none was tried.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Cluster {
    /// Creates a pool from its spec.
    pub fn new(spec: &ClusterSpec, pools: &PoolRegistry, metrics: &Metrics) -> Self {
        let name = spec.key.to_string();
        let labels = ServiceLabels {
            service: name.clone(),
        };
        let c = Self {
            key: spec.key.clone(),
            protocol: spec.protocol,
            balance: spec.balance.clone(),
            endpoints: ArcSwap::from_pointee(EndpointSet::default()),
            stats: ClusterStats {
                connect_errors: metrics.connect_errors.get_or_create_owned(&labels),
                retries: RetryReason::ALL.map(|r| {
                    metrics.retries.get_or_create_owned(&RetryLabels {
                        service: name.clone(),
                        reason: r.label(),
                    })
                }),
                ejections: metrics.ejections.get_or_create_owned(&labels),
                response_duration: metrics
                    .upstream_response_duration
                    .get_or_create_owned(&labels),
            },
            name,
            rr: AtomicUsize::new(fastrand::usize(..)),
            max_in_flight: AtomicU32::new(spec.max_in_flight.unwrap_or(0)),
            tls: spec.tls.as_ref().map(|t| Arc::new(TlsProfile::new(t))),
        };
        c.set_endpoints(&spec.endpoints, pools);
        c
    }

    /// Sets the per-endpoint limit of requests in flight (`None`: no limit).
    pub fn set_max_in_flight(&self, max: Option<u32>) {
        self.max_in_flight
            .store(max.unwrap_or(0), Ordering::Relaxed);
    }

    /// The per-endpoint limit of requests in flight, if any.
    pub fn max_in_flight(&self) -> Option<u32> {
        Some(self.max_in_flight.load(Ordering::Relaxed)).filter(|m| *m > 0)
    }

    /// Whether this pool can be kept for `spec` (same identity; endpoints may differ).
    pub fn compatible(&self, spec: &ClusterSpec) -> bool {
        self.protocol == spec.protocol
            && self.balance == spec.balance
            && self.tls.as_ref().map(|t| &t.spec) == spec.tls.as_ref()
    }

    /// Swaps in a new endpoint set when it differs; reuses `Arc<Endpoint>`s by address so their
    /// state survives. Returns whether anything was swapped.
    pub fn set_endpoints(&self, specs: &[EndpointSpec], pools: &PoolRegistry) -> bool {
        let current = self.endpoints.load();
        if current.same_as(specs) {
            return false;
        }
        let mut old: HashMap<SocketAddr, &Arc<Endpoint>> = current
            .members
            .iter()
            .map(|m| (m.endpoint.addr, &m.endpoint))
            .collect();
        let members = specs
            .iter()
            .map(|s| Member {
                endpoint: old.remove(&s.addr).cloned().unwrap_or_else(|| {
                    let key = PoolKey {
                        addr: s.addr,
                        protocol: self.protocol,
                        tls: self.tls.clone(),
                    };
                    Arc::new(Endpoint::new(s.addr, pools.get(key)))
                }),
                state: s.state,
            })
            .collect();
        self.endpoints.store(Arc::new(EndpointSet::new(members)));
        true
    }

    /// Picks an endpoint for a request, avoiding the ones it already tried and, while others
    /// exist, ejected and draining ones (see [`crate::upstream::balance`] for the policies). `key` is the
    /// request's hash for a hashing policy. `None` only when the pool has no endpoint at all
    /// left to try.
    pub fn pick(
        &self,
        set: &EndpointSet,
        tried: &Tried,
        key: Option<u64>,
    ) -> Option<Arc<Endpoint>> {
        self.pick_at(set, tried, Instant::now(), key)
    }

    /// [`Cluster::pick`] with the time already read.
    pub fn pick_at(
        &self,
        set: &EndpointSet,
        tried: &Tried,
        now: Instant,
        key: Option<u64>,
    ) -> Option<Arc<Endpoint>> {
        let now = nanos_at(now);
        for list in [&set.ready, &set.draining] {
            if let Some(e) = self.pick_from(list, tried, now, true, key) {
                return Some(e);
            }
        }
        // Everything left is ejected: trying one beats failing the request outright.
        for list in [&set.ready, &set.draining] {
            if let Some(e) = self.pick_from(list, tried, now, false, key) {
                return Some(e);
            }
        }
        None
    }

    fn pick_from(
        &self,
        list: &[Arc<Endpoint>],
        tried: &Tried,
        now: u64,
        healthy_only: bool,
        key: Option<u64>,
    ) -> Option<Arc<Endpoint>> {
        // An endpoint at its limit is never picked, ejected or not (nginx's max_conns).
        let max = self.max_in_flight.load(Ordering::Relaxed);
        let usable = |e: &Arc<Endpoint>| {
            !(tried.contains(&e.addr)
                || (healthy_only && e.is_ejected(now))
                || (max > 0 && e.in_flight() >= max))
        };
        crate::upstream::balance::pick(&self.balance, list, usable, &self.rr, key)
    }
}

/// Why an attempt was followed by another (the `reason` label of the retries metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// Connecting failed.
    ConnectFailed = 0,
    /// The connection closed before the request was written.
    NotSent = 1,
    /// A reused (idle) connection broke after the request was written.
    IdleClosed = 2,
    /// A new connection broke after the request was written, before any response byte.
    BrokeAfterSend = 3,
}

impl RetryReason {
    /// Every reason, in label order.
    pub const ALL: [RetryReason; 4] = [
        RetryReason::ConnectFailed,
        RetryReason::NotSent,
        RetryReason::IdleClosed,
        RetryReason::BrokeAfterSend,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RetryReason::ConnectFailed => "connect_failed",
            RetryReason::NotSent => "closed_before_send",
            RetryReason::IdleClosed => "idle_connection_closed",
            RetryReason::BrokeAfterSend => "broke_after_send",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::net::SocketAddr;

    use sluice_config::{ClusterKey, EndpointState};

    use super::*;
    use crate::upstream::pool::UpstreamSettings;

    fn spec(eps: &[(u8, EndpointState)]) -> ClusterSpec {
        ClusterSpec {
            key: ClusterKey {
                namespace: "ns".into(),
                service: "svc".into(),
                port: 80,
            },
            protocol: UpstreamProtocol::Http1,
            balance: BalancePolicy::RoundRobin,
            endpoints: eps
                .iter()
                .map(|&(i, state)| EndpointSpec {
                    addr: SocketAddr::from(([10, 0, 0, i], 80)),
                    state,
                })
                .collect(),
            max_in_flight: None,
            service_upstream: false,
            tls: None,
        }
    }

    fn pool(eps: &[(u8, EndpointState)]) -> (Cluster, PoolRegistry) {
        let pools = PoolRegistry::new(UpstreamSettings::default());
        let c = Cluster::new(&spec(eps), &pools, &Metrics::new());
        (c, pools)
    }

    fn last_octet(e: &Endpoint) -> u8 {
        match e.addr {
            SocketAddr::V4(a) => a.ip().octets()[3],
            SocketAddr::V6(_) => 0,
        }
    }

    const R: EndpointState = EndpointState::Ready;
    const D: EndpointState = EndpointState::Draining;

    #[test]
    fn a_pick_skips_what_the_request_tried_and_ejected_endpoints_while_others_are_healthy() {
        let (c, _pools) = pool(&[(1, R), (2, R), (3, R)]);
        let set = c.endpoints.load_full();
        let mut tried = Tried::default();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let e = c.pick(&set, &tried, None).unwrap();
            tried.push(e.addr);
            seen.push(last_octet(&e));
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3], "each endpoint once");
        assert!(c.pick(&set, &tried, None).is_none(), "nothing left to try");

        set.ready[0].fail_and_eject();
        for _ in 0..20 {
            let e = c.pick(&set, &Tried::default(), None).unwrap();
            assert_ne!(e.addr, set.ready[0].addr, "ejected endpoint skipped");
        }
        set.ready[1].fail_and_eject();
        set.ready[2].fail_and_eject();
        assert!(
            c.pick(&set, &Tried::default(), None).is_some(),
            "all ejected: one is still tried rather than failing the request"
        );
    }

    #[test]
    fn an_endpoint_at_its_limit_is_not_picked_and_a_full_pool_has_nothing_to_give() {
        let (c, _pools) = pool(&[(1, R), (2, R)]);
        c.set_max_in_flight(Some(1));
        let set = c.endpoints.load_full();
        let busy = set.ready[0].start();
        for _ in 0..20 {
            let e = c.pick(&set, &Tried::default(), None).unwrap();
            assert_eq!(
                e.addr, set.ready[1].addr,
                "the busy endpoint is at its limit"
            );
        }
        let other = set.ready[1].start();
        assert!(
            c.pick(&set, &Tried::default(), None).is_none(),
            "every endpoint at its limit"
        );
        drop(busy);
        assert_eq!(
            c.pick(&set, &Tried::default(), None).unwrap().addr,
            set.ready[0].addr
        );
        drop(other);
        c.set_max_in_flight(None);
        let _a = set.ready[0].start();
        let _b = set.ready[1].start();
        assert!(c.pick(&set, &Tried::default(), None).is_some(), "no limit");
    }

    #[test]
    fn draining_endpoints_are_picked_only_when_no_ready_one_is_left() {
        let (c, _pools) = pool(&[(1, R), (2, D)]);
        let set = c.endpoints.load_full();
        for _ in 0..20 {
            assert_eq!(
                last_octet(&c.pick(&set, &Tried::default(), None).unwrap()),
                1
            );
        }
        let mut tried = Tried::default();
        tried.push(set.ready[0].addr);
        assert_eq!(last_octet(&c.pick(&set, &tried, None).unwrap()), 2);
    }

    #[test]
    fn a_new_set_reuses_endpoints_by_address_and_an_equal_one_is_not_swapped() {
        let (c, pools) = pool(&[(1, R), (2, R)]);
        let before = c.endpoints.load_full();
        assert!(!c.set_endpoints(&spec(&[(1, R), (2, R)]).endpoints, &pools));
        assert!(
            Arc::ptr_eq(&before, &c.endpoints.load_full()),
            "not swapped"
        );
        assert!(c.set_endpoints(&spec(&[(2, D), (3, R)]).endpoints, &pools));
        let after = c.endpoints.load_full();
        assert!(Arc::ptr_eq(
            &before.members[1].endpoint,
            &after.members[0].endpoint
        ));
        assert_eq!(after.draining.len(), 1);
        assert_eq!(last_octet(&after.ready[0]), 3);
    }
}
