//! The timeline of configuration changes the operator's page shows and
//! `GET /api/v1/changes` returns: each applied snapshot and each endpoints-only swap, what it
//! changed in words, how long the apply took and, when the provider knows when the change was
//! first seen, how long it took to reach traffic. Kept in a bounded ring on the control path;
//! no request reads it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;

use serde::Serialize;
use sluice_config::merge::{Merged, merge};
use sluice_config::{EndpointSpec, EndpointState, ObjectRef, Snapshot};

/// Changes kept (the oldest go first).
pub const KEPT: usize = 200;
/// Names listed in one description before "and N more".
const LISTED: usize = 4;

/// One change in the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// When it was applied (Unix ms).
    pub at_unix_ms: u64,
    /// The snapshot generation in force after it.
    pub generation: u64,
    /// `snapshot` (routes, pools, certificates) or `endpoints` (one pool's endpoint set).
    pub kind: &'static str,
    /// What changed, in words.
    pub what: String,
    /// Time spent applying it (ms).
    pub apply_ms: f64,
    /// From the change being seen by the provider to its taking traffic (ms), when known.
    pub reached_traffic_ms: Option<f64>,
}

/// The ring of recent changes.
#[derive(Debug, Default)]
pub struct Changes {
    ring: Mutex<VecDeque<Change>>,
}

impl Changes {
    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<Change>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a change.
    pub fn push(&self, c: Change) {
        let mut r = self.ring();
        r.push_back(c);
        while r.len() > KEPT {
            r.pop_front();
        }
    }

    /// Sets how long the newest snapshot change took to reach traffic (the provider learns
    /// it after `apply` returns).
    pub fn reached_traffic(&self, generation: u64, ms: f64) {
        if let Some(c) = self
            .ring()
            .iter_mut()
            .rev()
            .find(|c| c.kind == "snapshot" && c.generation == generation)
        {
            c.reached_traffic_ms.get_or_insert(ms);
        }
    }

    /// The kept changes, newest first.
    pub fn newest_first(&self) -> Vec<Change> {
        self.ring().iter().rev().cloned().collect()
    }
}

/// Names, the first few of them and how many more.
fn listed<'a>(sign: &str, names: impl Iterator<Item = &'a str>) -> Option<String> {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        return None;
    }
    let mut s: Vec<String> = names
        .iter()
        .take(LISTED)
        .map(|n| format!("{sign}{n}"))
        .collect();
    if names.len() > LISTED {
        s.push(format!("and {} more", names.len() - LISTED));
    }
    Some(s.join(" "))
}

fn set_diff<'a>(
    what: &str,
    before: &'a BTreeSet<String>,
    after: &'a BTreeSet<String>,
) -> Option<String> {
    let added = listed("+", after.difference(before).map(String::as_str));
    let removed = listed("−", before.difference(after).map(String::as_str));
    let parts: Vec<String> = added.into_iter().chain(removed).collect();
    (!parts.is_empty()).then(|| format!("{what} {}", parts.join(" ")))
}

/// What `after` adds to `before` and takes from it, formatted (`display`): both sides are
/// put in order (a snapshot keeps its hosts and pools in order already) and walked once, so
/// only what differs is formatted (formatting every pool of both snapshots cost milliseconds
/// per change at 10,000 routes).
fn changed<T: Ord>(
    mut before: Vec<&T>,
    mut after: Vec<&T>,
    display: impl Fn(&T) -> String,
) -> (BTreeSet<String>, BTreeSet<String>) {
    before.sort_unstable();
    after.sort_unstable();
    let (mut added, mut removed) = (BTreeSet::new(), BTreeSet::new());
    for step in merge(before, after, |a, b| a.cmp(b)) {
        match step {
            Merged::Both(..) => {}
            Merged::Left(b) => {
                removed.insert(display(b));
            }
            Merged::Right(a) => {
                added.insert(display(a));
            }
        }
    }
    (added, removed)
}

fn diff_words(
    what: &str,
    (added, removed): (BTreeSet<String>, BTreeSet<String>),
) -> Option<String> {
    let parts: Vec<String> = listed("+", added.iter().map(String::as_str))
        .into_iter()
        .chain(listed("−", removed.iter().map(String::as_str)))
        .collect();
    (!parts.is_empty()).then(|| format!("{what} {}", parts.join(" ")))
}

/// What differs between two snapshots, in words: hosts, routes, pools, endpoint sets,
/// certificates, Gateway listeners and problems.
pub fn describe(before: Option<&Snapshot>, after: &Snapshot, endpoint_swaps: usize) -> String {
    let empty = Snapshot::default();
    let before = before.unwrap_or(&empty);
    let hosts = {
        fn vhosts(s: &Snapshot) -> Vec<&sluice_config::HostMatch> {
            s.virtual_hosts().iter().map(|v| &v.host).collect()
        }
        fn through(s: &Snapshot) -> Vec<&String> {
            s.passthrough().iter().map(|p| &p.host).collect()
        }
        let (mut added, mut removed) = changed(vhosts(before), vhosts(after), ToString::to_string);
        let (a, r) = changed(through(before), through(after), |h| {
            format!("{h} (passthrough)")
        });
        added.extend(a);
        removed.extend(r);
        (added, removed)
    };
    let routes = |s: &Snapshot| -> usize {
        s.virtual_hosts()
            .iter()
            .map(|v| v.routes.len())
            .sum::<usize>()
            + s.gateway_sockets()
                .iter()
                .flat_map(|g| &g.listeners)
                .flat_map(|l| &l.hosts)
                .map(|h| h.rules.len())
                .sum::<usize>()
    };
    fn pools(s: &Snapshot) -> Vec<&sluice_config::ClusterKey> {
        s.clusters().keys().collect()
    }
    let certs = |s: &Snapshot| -> BTreeMap<String, ObjectRef> {
        s.tls()
            .iter()
            .map(|t| (t.host.clone(), t.secret.clone()))
            .collect()
    };
    let listeners = |s: &Snapshot| -> BTreeSet<String> {
        s.gateway_sockets()
            .iter()
            .flat_map(|g| {
                g.listeners
                    .iter()
                    .map(move |l| format!("{}/{}:{}", l.gateway, l.name, g.port))
            })
            .collect()
    };
    let mut parts: Vec<String> = Vec::new();
    parts.extend(diff_words("hosts", hosts));
    let (r0, r1) = (routes(before), routes(after));
    if r0 != r1 {
        parts.push(format!("routes {r0} → {r1}"));
    }
    parts.extend(diff_words(
        "pools",
        changed(pools(before), pools(after), ToString::to_string),
    ));
    if endpoint_swaps > 0 {
        parts.push(format!("{endpoint_swaps} endpoint set(s) swapped"));
    }
    let (c0, c1) = (certs(before), certs(after));
    let changed_certs: BTreeSet<String> = c0
        .keys()
        .chain(c1.keys())
        .filter(|h| c0.get(*h) != c1.get(*h))
        .cloned()
        .collect();
    // Same Secret, new content: a renewal.
    let rotated: BTreeSet<String> = c1
        .iter()
        .filter(|(h, secret)| {
            c0.get(*h) == Some(*secret)
                && before.certificates().get(*secret) != after.certificates().get(*secret)
        })
        .map(|(h, _)| h.clone())
        .collect();
    if let Some(l) = listed("", changed_certs.iter().map(String::as_str)) {
        parts.push(format!("TLS hosts changed: {l}"));
    }
    if let Some(l) = listed("", rotated.iter().map(String::as_str)) {
        parts.push(format!("certificates renewed: {l}"));
    }
    parts.extend(set_diff(
        "Gateway listeners",
        &listeners(before),
        &listeners(after),
    ));
    let (p0, p1) = (before.problems().len(), after.problems().len());
    if p0 != p1 {
        parts.push(format!("problems {p0} → {p1}"));
    }
    if parts.is_empty() {
        "route options or settings changed".to_string()
    } else {
        parts.join("; ")
    }
}

/// One pool's endpoint change in words: `ns/svc:80: 5 → 6 endpoints (+10.0.0.6:80)`.
pub fn describe_endpoints(
    pool: &str,
    before: &[(SocketAddr, EndpointState)],
    after: &[EndpointSpec],
) -> String {
    let old: BTreeMap<SocketAddr, EndpointState> = before.iter().copied().collect();
    let new: BTreeMap<SocketAddr, EndpointState> =
        after.iter().map(|e| (e.addr, e.state)).collect();
    let added: Vec<String> = new
        .keys()
        .filter(|a| !old.contains_key(a))
        .map(|a| a.to_string())
        .collect();
    let removed: Vec<String> = old
        .keys()
        .filter(|a| !new.contains_key(a))
        .map(|a| a.to_string())
        .collect();
    let terminating: Vec<String> = new
        .iter()
        .filter(|(a, s)| {
            **s == EndpointState::Draining && old.get(a) == Some(&EndpointState::Ready)
        })
        .map(|(a, _)| a.to_string())
        .collect();
    let ready_again: Vec<String> = new
        .iter()
        .filter(|(a, s)| {
            **s == EndpointState::Ready && old.get(a) == Some(&EndpointState::Draining)
        })
        .map(|(a, _)| a.to_string())
        .collect();
    let mut parts: Vec<String> = Vec::new();
    parts.extend(listed("+", added.iter().map(String::as_str)));
    parts.extend(listed("−", removed.iter().map(String::as_str)));
    if let Some(l) = listed("", terminating.iter().map(String::as_str)) {
        parts.push(format!("terminating {l}"));
    }
    if let Some(l) = listed("", ready_again.iter().map(String::as_str)) {
        parts.push(format!("ready {l}"));
    }
    format!(
        "{pool}: {} → {} endpoints ({})",
        old.len(),
        new.len(),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ep(a: &str, state: EndpointState) -> EndpointSpec {
        EndpointSpec {
            addr: a.parse().unwrap(),
            state,
        }
    }

    #[test]
    fn an_endpoint_change_names_what_came_and_went() {
        let before = [
            ("10.0.0.1:80".parse().unwrap(), EndpointState::Ready),
            ("10.0.0.2:80".parse().unwrap(), EndpointState::Ready),
        ];
        let after = [
            ep("10.0.0.2:80", EndpointState::Draining),
            ep("10.0.0.3:80", EndpointState::Ready),
        ];
        assert_eq!(
            describe_endpoints("ns/web:80", &before, &after),
            "ns/web:80: 2 → 2 endpoints (+10.0.0.3:80, −10.0.0.1:80, terminating 10.0.0.2:80)"
        );
    }

    #[test]
    fn long_lists_are_cut() {
        let after: Vec<EndpointSpec> = (1..=9)
            .map(|i| ep(&format!("10.0.0.{i}:80"), EndpointState::Ready))
            .collect();
        let d = describe_endpoints("ns/web:80", &[], &after);
        assert!(d.ends_with("+10.0.0.4:80 and 5 more)"), "{d}");
    }

    #[test]
    fn the_ring_is_bounded_and_newest_first() {
        let c = Changes::default();
        for g in 0..(KEPT as u64 + 5) {
            c.push(Change {
                at_unix_ms: g,
                generation: g,
                kind: "snapshot",
                what: String::new(),
                apply_ms: 0.0,
                reached_traffic_ms: None,
            });
        }
        c.reached_traffic(KEPT as u64 + 4, 1.5);
        let all = c.newest_first();
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0].generation, KEPT as u64 + 4);
        assert_eq!(all[0].reached_traffic_ms, Some(1.5));
        assert_eq!(all[1].reached_traffic_ms, None);
    }

    #[test]
    fn an_empty_change_says_so() {
        let s = Snapshot::default();
        assert_eq!(
            describe(Some(&s), &s, 0),
            "route options or settings changed"
        );
    }
}
