//! Bringing the data plane's pools in line with a new snapshot: each pool the snapshot keeps
//! keeps its `Arc<Cluster>` (and so its connections, in-flight counts and ejections) and only
//! takes new endpoints; a pool whose protocol or TLS changed is made anew; a pool no longer
//! named is dropped (its requests in flight finish on the `Arc`s they hold).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sluice_config::merge::{Merged, merge};
use sluice_config::{ClusterKey, ClusterSpec, Snapshot};

use crate::telemetry::metrics::Metrics;
use crate::upstream::cluster::Cluster;
use crate::upstream::pool::PoolRegistry;

/// What reconciling changed.
#[derive(Debug, Default)]
pub(super) struct PoolChanges {
    /// Pools made.
    pub created: usize,
    /// Pools dropped.
    pub removed: usize,
    /// Pools given new endpoints.
    pub swaps: usize,
    /// Keys of the pools made or dropped (compiled routes naming none of them stay valid).
    pub replaced: HashSet<ClusterKey>,
}

/// Brings `clusters` (the pools of `before`, or of an unknown state when `before` is `None`)
/// in line with `after`.
///
/// With `before`, both snapshots' pools are walked in key order and a pool whose spec is equal
/// in both is not looked at: at 10,000 pools, looking every pool up by key (hashing its
/// namespace and name) and building a new map cost several milliseconds of every route change.
/// Without it (the first snapshot, or after an endpoints-only update changed pools behind the
/// last snapshot's back) every pool is checked.
pub(super) fn reconcile(
    clusters: &mut HashMap<ClusterKey, Arc<Cluster>>,
    before: Option<&Snapshot>,
    after: &Snapshot,
    (registry, metrics): (&PoolRegistry, &Metrics),
) -> PoolChanges {
    let mut out = PoolChanges::default();
    let mut take =
        |clusters: &mut HashMap<ClusterKey, Arc<Cluster>>, spec: &ClusterSpec| match clusters
            .get(&spec.key)
        {
            Some(c) if c.compatible(spec) => {
                if c.set_endpoints(&spec.endpoints, registry) {
                    out.swaps += 1;
                }
                c.set_max_in_flight(spec.max_in_flight);
            }
            _ => {
                out.created += 1;
                out.replaced.insert(spec.key.clone());
                clusters.insert(
                    spec.key.clone(),
                    Arc::new(Cluster::new(spec, registry, metrics)),
                );
            }
        };
    let Some(before) = before else {
        for spec in after.clusters().values() {
            take(clusters, spec);
        }
        let gone: Vec<ClusterKey> = clusters
            .keys()
            .filter(|k| !after.clusters().contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            clusters.remove(&k);
            out.removed += 1;
            out.replaced.insert(k);
        }
        return out;
    };
    let mut gone = Vec::new();
    let walk = merge(before.clusters(), after.clusters(), |a, b| a.0.cmp(b.0));
    for step in walk {
        match step {
            Merged::Both((_, was), (_, now)) if was == now => {}
            Merged::Both(_, (_, now)) | Merged::Right((_, now)) => take(clusters, now),
            Merged::Left((key, _)) => gone.push(key),
        }
    }
    for k in gone {
        if clusters.remove(k).is_some() {
            out.removed += 1;
            out.replaced.insert(k.clone());
        }
    }
    out
}
