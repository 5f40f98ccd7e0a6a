//! Picking one endpoint from a list, by policy. Pure functions over the list and the endpoints'
//! live counters, so each rule is tested here on its own.
//!
//! - **least request** (default): two candidates, the next in round-robin order and a random
//!   other; fewer requests in flight wins, a tie goes to the round-robin one. With no
//!   concurrency every request is a tie, so it is round robin and reaches every pod (a scaled-up
//!   replica gets its share at once, which P2C over latency does not guarantee: the pod with the
//!   highest estimate never wins a comparison). Under concurrency a slow pod holds its requests
//!   longer, shows more in flight, and loses (by Little's law its share falls with its speed).
//! - **peak EWMA**: two random candidates, lower `ewma × (in-flight + 1)` wins.
//! - **round robin**.
//! - **hash**: rendezvous (highest random weight) hashing of a request key: each endpoint
//!   scores `mix(key, endpoint)` and the highest usable score wins. A key stays on its endpoint
//!   while it exists; when an endpoint goes, only its keys move; a retry takes the next-best
//!   score. Hashes are seedless, so every sluice replica maps a key to the same pod.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_config::{BalancePolicy, HashKey};

use crate::upstream::endpoint::Endpoint;
use crate::upstream::hash::fnv1a;

/// splitmix64's finaliser: spreads the bits of a combined key so scores are uniform.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a request offers for computing its hash key.
#[derive(Clone, Copy)]
pub struct KeySource<'a> {
    /// The client address.
    pub client_ip: IpAddr,
    /// Path and query.
    pub uri: &'a str,
    /// Looks up a request header's value (first field) by lower-case name.
    pub header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

impl std::fmt::Debug for KeySource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySource")
            .field("client_ip", &self.client_ip)
            .field("uri", &self.uri)
            .finish_non_exhaustive()
    }
}

/// The hash of a request's key; `None` when the key is absent (no such header or cookie): such
/// requests are balanced as least-request, as nginx balances a missing key round robin.
pub fn request_hash(key: &HashKey, src: &KeySource<'_>) -> Option<u64> {
    match key {
        HashKey::ClientIp => Some(match src.client_ip {
            IpAddr::V4(v4) => fnv1a(&v4.octets()),
            IpAddr::V6(v6) => fnv1a(&v6.octets()),
        }),
        HashKey::RequestUri => Some(fnv1a(src.uri.as_bytes())),
        HashKey::Header(name) => (src.header)(name).map(fnv1a),
        HashKey::Cookie(name) => (src.header)("cookie")
            .and_then(|v| cookie(v, name))
            .map(cookie_key),
    }
}

/// The hash of a cookie's value (the key a cookie-hashing pool places a request by).
pub fn cookie_key(value: &[u8]) -> u64 {
    fnv1a(value)
}

/// The value of cookie `name` in a `Cookie` header value.
pub(crate) fn cookie<'a>(header: &'a [u8], name: &str) -> Option<&'a [u8]> {
    header.split(|b| *b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|b| *b == b'=')?;
        (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
    })
}

/// Picks from `list` under `policy`; `usable` filters (already tried, ejected). `rr` is the
/// pool's round-robin counter; `key` the request's hash, if its policy hashes.
pub fn pick(
    policy: &BalancePolicy,
    list: &[Arc<Endpoint>],
    usable: impl Fn(&Arc<Endpoint>) -> bool,
    rr: &AtomicUsize,
    key: Option<u64>,
) -> Option<Arc<Endpoint>> {
    let n = list.len();
    if n == 0 {
        return None;
    }
    match (policy, key) {
        (BalancePolicy::Hash(_), Some(k)) => list
            .iter()
            .filter(|e| usable(e))
            .max_by_key(|e| mix(k ^ e.hash_id))
            .cloned(),
        (BalancePolicy::RoundRobin, _) => {
            let start = rr.fetch_add(1, Ordering::Relaxed);
            (0..n)
                .map(|i| &list[(start + i) % n])
                .find(|e| usable(e))
                .cloned()
        }
        (BalancePolicy::PeakEwma, _) => peak_ewma(list, usable),
        (BalancePolicy::LeastRequest | BalancePolicy::Hash(_), _) => {
            let start = rr.fetch_add(1, Ordering::Relaxed);
            let (i, first) = (0..n)
                .map(|i| (start + i) % n)
                .map(|i| (i, &list[i]))
                .find(|(_, e)| usable(e))?;
            if n == 1 {
                return Some(Arc::clone(first));
            }
            let mut j = fastrand::usize(..n - 1);
            if j >= i {
                j += 1;
            }
            let other = &list[j];
            Some(Arc::clone(
                if usable(other) && other.in_flight() < first.in_flight() {
                    other
                } else {
                    first
                },
            ))
        }
    }
}

fn peak_ewma(
    list: &[Arc<Endpoint>],
    usable: impl Fn(&Arc<Endpoint>) -> bool,
) -> Option<Arc<Endpoint>> {
    let n = list.len();
    if n == 1 {
        return usable(&list[0]).then(|| Arc::clone(&list[0]));
    }
    let a = fastrand::usize(..n);
    let mut b = fastrand::usize(..n - 1);
    if b >= a {
        b += 1;
    }
    let (ea, eb) = (&list[a], &list[b]);
    match (usable(ea), usable(eb)) {
        (true, true) => Some(Arc::clone(if ea.cost() <= eb.cost() { ea } else { eb })),
        (true, false) => Some(Arc::clone(ea)),
        (false, true) => Some(Arc::clone(eb)),
        // Both unusable: fall back to a scan from a random start.
        (false, false) => (0..n)
            .map(|i| &list[(a + i) % n])
            .find(|e| usable(e))
            .cloned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashMap;
    use std::net::SocketAddr;

    use super::*;
    use crate::upstream::pool::{PoolRegistry, UpstreamSettings};

    fn endpoints(n: u16) -> Vec<Arc<Endpoint>> {
        let pools = PoolRegistry::new(UpstreamSettings::default());
        (0..n)
            .map(|i| {
                let addr: SocketAddr = format!("10.0.0.{}:80", i + 1).parse().unwrap();
                Arc::new(Endpoint::new(
                    addr,
                    pools.get(crate::upstream::pool::PoolKey {
                        addr,
                        protocol: sluice_config::UpstreamProtocol::Http1,
                        tls: None,
                    }),
                ))
            })
            .collect()
    }

    fn counts(
        policy: &BalancePolicy,
        list: &[Arc<Endpoint>],
        picks: usize,
    ) -> HashMap<SocketAddr, usize> {
        let rr = AtomicUsize::new(fastrand::usize(..));
        let mut out = HashMap::new();
        for _ in 0..picks {
            let e = pick(policy, list, |_| true, &rr, None).unwrap();
            *out.entry(e.addr).or_default() += 1;
        }
        out
    }

    #[test]
    fn least_request_without_concurrency_reaches_every_endpoint_evenly() {
        let list = endpoints(10);
        // Latency history must not matter when nothing is in flight (peak EWMA's failure).
        for (i, e) in list.iter().enumerate() {
            e.set_ewma_for_test(std::time::Duration::from_micros(100 + 500 * i as u64));
        }
        for _ in 0..50 {
            let c = counts(&BalancePolicy::LeastRequest, &list, 100);
            assert_eq!(c.len(), 10, "{c:?}");
            assert!(c.values().all(|n| *n == 10), "{c:?}");
        }
    }

    #[test]
    fn least_request_prefers_fewer_in_flight() {
        let list = endpoints(2);
        let _busy = (0..3).map(|_| list[0].start()).collect::<Vec<_>>();
        let c = counts(&BalancePolicy::LeastRequest, &list, 100);
        assert_eq!(c.get(&list[1].addr), Some(&100), "{c:?}");
    }

    #[test]
    fn unusable_endpoints_are_skipped_by_every_policy() {
        let list = endpoints(3);
        let bad = list[1].addr;
        let rr = AtomicUsize::new(0);
        for policy in [
            BalancePolicy::LeastRequest,
            BalancePolicy::PeakEwma,
            BalancePolicy::RoundRobin,
            BalancePolicy::Hash(HashKey::ClientIp),
        ] {
            for k in 0..200u64 {
                let e = pick(&policy, &list, |e| e.addr != bad, &rr, Some(k)).unwrap();
                assert_ne!(e.addr, bad, "{policy:?}");
            }
            assert!(pick(&policy, &list, |_| false, &rr, Some(1)).is_none());
        }
    }

    #[test]
    fn rendezvous_hashing_is_stable_and_moves_only_the_removed_endpoints_keys() {
        let list = endpoints(5);
        let policy = BalancePolicy::Hash(HashKey::ClientIp);
        let rr = AtomicUsize::new(0);
        let at = |list: &[Arc<Endpoint>], k: u64| {
            pick(&policy, list, |_| true, &rr, Some(k)).unwrap().addr
        };
        let keys: Vec<u64> = (0..2000).map(|i| fnv1a(&u64::to_be_bytes(i))).collect();
        let before: Vec<SocketAddr> = keys.iter().map(|k| at(&list, *k)).collect();
        // Same key, same endpoint, every time.
        assert!(keys.iter().zip(&before).all(|(k, a)| at(&list, *k) == *a));
        // Spread: every endpoint gets a fair share.
        let mut per: HashMap<SocketAddr, usize> = HashMap::new();
        for a in &before {
            *per.entry(*a).or_default() += 1;
        }
        assert!(per.values().all(|n| (300..=500).contains(n)), "{per:?}");
        // Remove one endpoint: only its keys move.
        let gone = list[2].addr;
        let fewer: Vec<Arc<Endpoint>> = list.iter().filter(|e| e.addr != gone).cloned().collect();
        for (k, a) in keys.iter().zip(&before) {
            let now = at(&fewer, *k);
            if *a != gone {
                assert_eq!(now, *a, "a key of a remaining endpoint moved");
            }
        }
        // A retry that excludes the first choice lands on the key's second choice, stably.
        let k = keys[0];
        let first = at(&list, k);
        let second = pick(&policy, &list, |e| e.addr != first, &rr, Some(k))
            .unwrap()
            .addr;
        let again = pick(&policy, &list, |e| e.addr != first, &rr, Some(k))
            .unwrap()
            .addr;
        assert_eq!(second, again);
        assert_ne!(second, first);
    }

    #[test]
    fn request_keys() {
        let headers: HashMap<&str, &[u8]> = HashMap::from([
            ("x-user", b"alice".as_slice()),
            ("cookie", b"a=1; session=abc ; b=2".as_slice()),
        ]);
        let lookup = |n: &str| headers.get(n).copied();
        let src = KeySource {
            client_ip: "192.0.2.7".parse().unwrap(),
            uri: "/x?y=1",
            header: &lookup,
        };
        assert_eq!(
            request_hash(&HashKey::Header("x-user".into()), &src),
            Some(fnv1a(b"alice"))
        );
        assert_eq!(
            request_hash(&HashKey::Cookie("session".into()), &src),
            Some(fnv1a(b"abc"))
        );
        assert_eq!(request_hash(&HashKey::Cookie("nope".into()), &src), None);
        assert_eq!(request_hash(&HashKey::Header("x-none".into()), &src), None);
        assert_eq!(
            request_hash(&HashKey::RequestUri, &src),
            Some(fnv1a(b"/x?y=1"))
        );
        assert_eq!(
            request_hash(&HashKey::ClientIp, &src),
            Some(fnv1a(&[192, 0, 2, 7]))
        );
    }
}
