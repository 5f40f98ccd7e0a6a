//! The endpoints fast path, one for both run modes: an EndpointSlice change (a watch event, or
//! a manifest file whose only changes are slices) swaps the endpoint sets of the pools of the
//! Services it touched, with no translation and no route-table rebuild.

use std::collections::HashMap;
use std::time::Instant;

use sluice_config::merge::{Merged, merge};
use sluice_config::translate::cluster_endpoints;
use sluice_config::world::Key;
use sluice_config::{ClusterKey, Snapshot, World};
use sluice_proxy::DataPlane;

/// The pools of each Service in the snapshot last applied. A `service-upstream` pool is left
/// out: its one endpoint is the ClusterIP, which slices never change.
#[derive(Debug, Default)]
pub struct Pools {
    by_service: HashMap<Key, Vec<ClusterKey>>,
}

impl Pools {
    /// The pools of `snapshot`, by Service.
    pub fn of(snapshot: &Snapshot) -> Self {
        let mut by_service: HashMap<Key, Vec<ClusterKey>> = HashMap::new();
        for key in snapshot
            .clusters()
            .values()
            .filter(|c| !c.service_upstream)
            .map(|c| &c.key)
        {
            by_service
                .entry((key.namespace.clone(), key.service.clone()))
                .or_default()
                .push(key.clone());
        }
        Self { by_service }
    }

    /// Moves from the pools of `before` (what `self` was made of) to those of `after`: only
    /// the pools that came or went are looked at (both snapshots keep their pools in key
    /// order), so a route change at 10,000 routes does not index every pool again.
    pub fn update(&mut self, before: Option<&Snapshot>, after: &Snapshot) {
        let Some(before) = before else {
            *self = Self::of(after);
            return;
        };
        if std::ptr::eq(before, after) {
            return;
        }
        let indexed = |c: &&std::sync::Arc<sluice_config::ClusterSpec>| !c.service_upstream;
        let was = before.clusters().values().filter(indexed);
        let now = after.clusters().values().filter(indexed);
        for step in merge(was, now, |a, b| a.key.cmp(&b.key)) {
            match step {
                Merged::Both(..) => {}
                Merged::Left(a) => self.remove(&a.key),
                Merged::Right(b) => self
                    .by_service
                    .entry((b.key.namespace.clone(), b.key.service.clone()))
                    .or_default()
                    .push(b.key.clone()),
            }
        }
    }

    fn remove(&mut self, key: &ClusterKey) {
        let service = (key.namespace.clone(), key.service.clone());
        if let Some(keys) = self.by_service.get_mut(&service) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_service.remove(&service);
            }
        }
    }

    /// Gives the pools of `services` their endpoints as `world` has them now. `false` when a
    /// pool could not take them (it or its Service is gone): the caller then rebuilds in full.
    /// A Service no pool uses changes nothing.
    pub fn swap<'k>(
        &self,
        dp: &DataPlane,
        world: &World,
        services: impl IntoIterator<Item = &'k Key>,
        seen: Instant,
    ) -> bool {
        let mut all = true;
        for key in services
            .into_iter()
            .filter_map(|s| self.by_service.get(s))
            .flatten()
        {
            all &= cluster_endpoints(world, key)
                .is_some_and(|eps| dp.update_endpoints(key, &eps, Some(seen)));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sluice_config::snapshot::SnapshotParts;
    use sluice_config::{BalancePolicy, ClusterSpec, UpstreamProtocol};

    use super::*;

    fn snapshot(pools: &[(&str, u16, bool)]) -> Snapshot {
        let clusters: BTreeMap<ClusterKey, std::sync::Arc<ClusterSpec>> = pools
            .iter()
            .map(|&(svc, port, service_upstream)| {
                let key = ClusterKey {
                    namespace: "ns".into(),
                    service: svc.into(),
                    port,
                };
                let spec = ClusterSpec {
                    key: key.clone(),
                    protocol: UpstreamProtocol::Http1,
                    balance: BalancePolicy::default(),
                    endpoints: Vec::new(),
                    max_in_flight: None,
                    service_upstream,
                    tls: None,
                };
                (key, std::sync::Arc::new(spec))
            })
            .collect();
        Snapshot::new(SnapshotParts {
            clusters,
            ..SnapshotParts::default()
        })
    }

    fn sorted(p: &Pools) -> BTreeMap<Key, Vec<ClusterKey>> {
        p.by_service
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                v.sort();
                (k.clone(), v)
            })
            .collect()
    }

    #[test]
    fn an_update_indexes_what_indexing_the_new_snapshot_would() {
        let steps = [
            vec![("a", 80, false), ("b", 80, false), ("b", 81, false)],
            vec![("a", 80, false), ("b", 81, false), ("c", 80, false)],
            vec![
                ("0", 80, false),
                ("a", 80, true),
                ("b", 81, false),
                ("c", 80, false),
            ],
            vec![
                ("a", 80, false),
                ("b", 80, false),
                ("b", 81, false),
                ("z", 1, false),
            ],
            vec![],
            vec![("a", 80, false)],
        ];
        let mut pools = Pools::default();
        let mut before: Option<Snapshot> = None;
        for (i, s) in steps.iter().enumerate() {
            let after = snapshot(s);
            pools.update(before.as_ref(), &after);
            assert_eq!(sorted(&pools), sorted(&Pools::of(&after)), "step {i}");
            before = Some(after);
        }
    }
}
