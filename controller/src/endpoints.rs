//! The endpoints fast path, one for both run modes: an EndpointSlice change (a watch event, or
//! a manifest file whose only changes are slices) swaps the endpoint sets of the pools of the
//! Services it touched, with no translation and no route-table rebuild.

use std::collections::HashMap;
use std::time::Instant;

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
