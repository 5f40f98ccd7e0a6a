//! The single rebuild loop. Every change lands in one [`World`]; changes are coalesced (a short
//! quiet period, a hard maximum delay) into full rebuilds, except EndpointSlice changes, which
//! take a fast path that recomputes only the affected pools and swaps their endpoint sets — no
//! translation of the other Ingresses, no route-table rebuild.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sluice_config::translate::cluster_endpoints;
use sluice_config::translate::translate_all;
use sluice_config::world::{Key, key_of};
use sluice_config::{ClusterKey, Problem, Snapshot, TranslateOptions, World};
use sluice_proxy::{ApplyOutcome, DataPlane};
use tokio::sync::{mpsc, watch};
// tokio's clock, so that a paused test runtime drives the quiet time and the maximum delay.
use tokio::time::Instant;

use super::watch::{Change, KindId, Obj, Seen, kinds};

/// Quiet time that ends a burst of changes.
pub const QUIET: Duration = Duration::from_millis(30);
/// Longest a burst may delay a rebuild.
pub const MAX_DELAY: Duration = Duration::from_millis(300);

/// What the rebuild loop publishes after each apply (for the status writer and events).
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// How many snapshots were applied.
    pub applies: u64,
    /// Problems of the last snapshot.
    pub problems: Vec<Problem>,
    /// The status the Gateway API objects are owed, as of the last rebuild.
    pub gateway: Arc<super::gateway_status::Desired>,
}

/// State of the loop.
#[derive(Debug)]
pub struct Rebuilder {
    world: World,
    opts: TranslateOptions,
    dp: Arc<DataPlane>,
    listing: HashMap<KindId, Vec<Obj>>,
    /// The kinds watched (the ConfigMap only with `--configmap`).
    kinds: Vec<KindId>,
    synced: HashSet<KindId>,
    dirty_since: Option<Instant>,
    last_change: Instant,
    pending_seen: Vec<Instant>,
    by_service: HashMap<Key, Vec<ClusterKey>>,
    published: watch::Sender<Published>,
    ingress_changed: watch::Sender<u64>,
    /// ConfigMaps some Ingress names in `custom-headers` (as of the last rebuild): a change
    /// to any other ConfigMap rebuilds nothing.
    referenced_config_maps: HashSet<Key>,
}

fn same_routing(
    a: &k8s_openapi::api::networking::v1::Ingress,
    b: &k8s_openapi::api::networking::v1::Ingress,
) -> bool {
    a.spec == b.spec
        && a.metadata.annotations == b.metadata.annotations
        && a.metadata.creation_timestamp == b.metadata.creation_timestamp
}

impl Rebuilder {
    /// A loop applying to `dp`.
    pub fn new(
        opts: TranslateOptions,
        dp: Arc<DataPlane>,
        published: watch::Sender<Published>,
        ingress_changed: watch::Sender<u64>,
    ) -> Self {
        Self {
            world: World::new(),
            kinds: kinds(opts.configmap.is_some(), false),
            opts,
            dp,
            listing: HashMap::new(),
            synced: HashSet::new(),
            dirty_since: None,
            last_change: Instant::now(),
            pending_seen: Vec::new(),
            by_service: HashMap::new(),
            published,
            ingress_changed,
            referenced_config_maps: HashSet::new(),
        }
    }

    /// Waits for the Gateway API's kinds too (when the API server serves them).
    pub fn with_gateway_api(mut self, on: bool) -> Self {
        self.kinds = kinds(self.opts.configmap.is_some(), on);
        self
    }

    /// The controller ConfigMap's key, when `--configmap` names one: its own watch (by name)
    /// owns that key, the watch of every ConfigMap all others.
    fn controller_config_map(&self) -> Option<Key> {
        self.opts
            .configmap
            .as_ref()
            .map(|c| (c.namespace.clone(), c.name.clone()))
    }

    /// Whether a change to this ConfigMap can change the snapshot.
    fn config_map_matters(&self, key: &Key) -> bool {
        self.controller_config_map().as_ref() == Some(key)
            || self.referenced_config_maps.contains(key)
    }

    /// Whether every kind has finished its initial list.
    pub fn all_synced(&self) -> bool {
        self.kinds.iter().all(|k| self.synced.contains(k))
    }

    fn mark_dirty(&mut self, seen: Instant) {
        self.dirty_since.get_or_insert(seen);
        self.last_change = Instant::now();
        self.pending_seen.push(seen);
    }

    fn put(&mut self, o: Obj) {
        match o {
            Obj::Ingress(x) => self.world.put_ingress(x),
            Obj::IngressClass(x) => self.world.put_ingress_class(x),
            Obj::Service(x) => self.world.put_service(x),
            Obj::EndpointSlice(x) => {
                self.world.put_endpoint_slice(x);
            }
            Obj::Secret(x) => self.world.put_secret(x),
            Obj::ConfigMap(x) => self.world.put_config_map(x),
            Obj::AnyConfigMap(x) => {
                if self.controller_config_map() != Some(key_of(&x.metadata)) {
                    self.world.put_config_map(x);
                }
            }
            Obj::Gw(x) => {
                super::gateway_watch::put(&mut self.world, x);
            }
            Obj::Namespace(x) => {
                self.world
                    .namespaces
                    .insert(super::gateway_watch::namespace_key(&x), x);
            }
        }
    }

    /// Takes one change into the world; fast-paths endpoint changes.
    pub fn handle(&mut self, change: Change, seen: Instant) {
        match change {
            Change::Init(kind) => {
                self.listing.insert(kind, Vec::new());
            }
            Change::InitApply(o) => {
                let kind = kind_of(&o);
                self.listing.entry(kind).or_default().push(o);
            }
            Change::InitDone(kind) => {
                let objs = self.listing.remove(&kind).unwrap_or_default();
                match kind {
                    KindId::Ingress => self.world.ingresses.clear(),
                    KindId::IngressClass => self.world.ingress_classes.clear(),
                    KindId::Service => self.world.services.clear(),
                    KindId::Secret => self.world.secrets.clear(),
                    KindId::EndpointSlice => self.world.clear_endpoint_slices(),
                    KindId::ConfigMap => {
                        if let Some(k) = self.controller_config_map() {
                            self.world.config_maps.remove(&k);
                        }
                    }
                    KindId::AnyConfigMap => {
                        let own = self.controller_config_map();
                        self.world
                            .config_maps
                            .retain(|k, _| Some(k) == own.as_ref());
                    }
                    KindId::GatewayClass
                    | KindId::Gateway
                    | KindId::HttpRoute
                    | KindId::ReferenceGrant
                    | KindId::Namespace => super::gateway_watch::clear(&mut self.world, kind),
                }
                for o in objs {
                    self.put(o);
                }
                self.synced.insert(kind);
                self.ingress_changed.send_modify(|g| *g += 1);
                self.mark_dirty(seen);
            }
            Change::Apply(Obj::EndpointSlice(s)) if self.all_synced() && self.dp.is_ready() => {
                let touched = self.world.put_endpoint_slice(s);
                self.fast_path(&touched, seen);
            }
            Change::Delete(Obj::EndpointSlice(s)) if self.all_synced() && self.dp.is_ready() => {
                let touched = self.world.delete_endpoint_slice(&key_of(&s.metadata));
                self.fast_path(&touched, seen);
            }
            Change::Apply(Obj::Ingress(i)) => {
                let key = key_of(&i.metadata);
                let routing_same = self
                    .world
                    .ingresses
                    .get(&key)
                    .is_some_and(|old| same_routing(old, &i));
                self.world.put_ingress(i);
                self.ingress_changed.send_modify(|g| *g += 1);
                if !routing_same {
                    // Status-only updates (our own writes included) never cause a rebuild.
                    self.mark_dirty(seen);
                }
            }
            Change::Apply(Obj::AnyConfigMap(c)) => {
                let key = key_of(&c.metadata);
                let matters = self.config_map_matters(&key);
                self.put(Obj::AnyConfigMap(c));
                if matters {
                    self.mark_dirty(seen);
                }
            }
            Change::Delete(Obj::AnyConfigMap(c)) => {
                let key = key_of(&c.metadata);
                if self.controller_config_map() != Some(key.clone()) {
                    self.world.config_maps.remove(&key);
                }
                if self.config_map_matters(&key) {
                    self.mark_dirty(seen);
                }
            }
            Change::Apply(Obj::Gw(o)) => {
                // Status-only updates (our own writes included) never cause a rebuild.
                if super::gateway_watch::put(&mut self.world, o) {
                    self.mark_dirty(seen);
                }
            }
            Change::Apply(o) => {
                self.put(o);
                self.mark_dirty(seen);
            }
            Change::Delete(o) => {
                match &o {
                    Obj::Ingress(x) => {
                        self.world.ingresses.remove(&key_of(&x.metadata));
                        self.ingress_changed.send_modify(|g| *g += 1);
                    }
                    Obj::IngressClass(x) => {
                        self.world
                            .ingress_classes
                            .remove(&(String::new(), key_of(&x.metadata).1));
                    }
                    Obj::Service(x) => {
                        self.world.services.remove(&key_of(&x.metadata));
                    }
                    Obj::Secret(x) => {
                        self.world.secrets.remove(&key_of(&x.metadata));
                    }
                    Obj::EndpointSlice(x) => {
                        self.world.delete_endpoint_slice(&key_of(&x.metadata));
                    }
                    Obj::ConfigMap(x) => {
                        self.world.config_maps.remove(&key_of(&x.metadata));
                    }
                    // Handled above.
                    Obj::AnyConfigMap(_) => {}
                    Obj::Gw(x) => super::gateway_watch::delete(&mut self.world, x),
                    Obj::Namespace(x) => {
                        self.world
                            .namespaces
                            .remove(&super::gateway_watch::namespace_key(x));
                    }
                }
                self.mark_dirty(seen);
            }
        }
    }

    /// Recomputes and swaps only the pools of the touched Services.
    fn fast_path(&mut self, touched: &[Key], seen: Instant) {
        let mut fallback = false;
        for svc in touched {
            let Some(keys) = self.by_service.get(svc) else {
                continue;
            };
            for key in keys {
                let applied = cluster_endpoints(&self.world, key)
                    .is_some_and(|eps| self.dp.update_endpoints(key, &eps, Some(seen.into_std())));
                fallback |= !applied;
            }
        }
        if fallback {
            // The pool or its Service is gone: let a full rebuild sort it out.
            self.mark_dirty(seen);
        }
    }

    /// When the next rebuild is due, if one is.
    pub fn due(&self) -> Option<Instant> {
        let since = self.dirty_since?;
        if !self.all_synced() {
            return None;
        }
        Some((self.last_change + QUIET).min(since + MAX_DELAY))
    }

    /// Translates the whole world and applies it.
    pub fn rebuild(&mut self) -> Arc<Snapshot> {
        let started = std::time::Instant::now();
        let (snapshot, gateway) = translate_all(&self.world, &self.opts);
        // Each Gateway keeps its address in the next translation, whatever its status shows yet.
        self.opts.gateway.sticky = gateway
            .gateways
            .iter()
            .filter_map(|(k, g)| Some((k.clone(), g.addresses.first()?.parse().ok()?)))
            .collect();
        let gateway = super::gateway_status::Desired::new(gateway, &self.world, &self.opts);
        let translate_time = started.elapsed();
        let mut by_service: HashMap<Key, Vec<ClusterKey>> = HashMap::new();
        // A `service-upstream` pool's one endpoint is the ClusterIP: slices never change it.
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
        self.by_service = by_service;
        self.referenced_config_maps = self
            .world
            .ingresses
            .values()
            .filter_map(|i| sluice_config::translate::headers::reference(i))
            .collect();
        let problems = snapshot.problems().to_vec();
        let outcome = self.dp.apply(snapshot);
        for seen in self.pending_seen.drain(..) {
            if !matches!(outcome, ApplyOutcome::Unchanged) {
                self.dp.record_propagation(seen.into_std());
            }
        }
        self.dirty_since = None;
        if let ApplyOutcome::Applied {
            generation,
            clusters_created,
            clusters_removed,
            endpoint_swaps,
        } = outcome
        {
            tracing::info!(
                generation,
                clusters_created,
                clusters_removed,
                endpoint_swaps,
                ?translate_time,
                ingresses = self.world.ingresses.len(),
                "configuration applied"
            );
        }
        self.published.send_modify(|p| {
            p.applies += 1;
            p.problems = problems;
            p.gateway = Arc::new(gateway);
        });
        self.dp.current().unwrap_or_default()
    }

    /// The world (for tests and status).
    pub fn world(&self) -> &World {
        &self.world
    }
}

fn kind_of(o: &Obj) -> KindId {
    match o {
        Obj::Ingress(_) => KindId::Ingress,
        Obj::IngressClass(_) => KindId::IngressClass,
        Obj::Service(_) => KindId::Service,
        Obj::EndpointSlice(_) => KindId::EndpointSlice,
        Obj::Secret(_) => KindId::Secret,
        Obj::ConfigMap(_) => KindId::ConfigMap,
        Obj::AnyConfigMap(_) => KindId::AnyConfigMap,
        Obj::Gw(g) => g.kind(),
        Obj::Namespace(_) => KindId::Namespace,
    }
}

/// Runs the loop until the channel closes.
pub async fn run(mut r: Rebuilder, mut rx: mpsc::UnboundedReceiver<Seen>) {
    let mut logged_waiting = false;
    loop {
        let due = r.due();
        tokio::select! {
            msg = rx.recv() => match msg {
                Some((change, seen)) => {
                    r.handle(change, seen);
                    // Drain what is already queued before deciding anything.
                    while let Ok((change, seen)) = rx.try_recv() {
                        r.handle(change, seen);
                    }
                    if !r.all_synced() && !logged_waiting {
                        logged_waiting = true;
                        let waiting: BTreeSet<_> = r.kinds.iter().filter(|k| !r.synced.contains(k)).collect();
                        tracing::info!(?waiting, "waiting for the initial list of every kind before serving");
                    }
                }
                None => return,
            },
            _ = sleep_until(due), if due.is_some() => {
                r.rebuild();
            }
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    if let Some(t) = t {
        tokio::time::sleep_until(t).await;
    }
}

/// Problems as a set keyed for "new since last time" comparisons.
pub fn problem_set(p: &[Problem]) -> BTreeMap<(String, String, String), Problem> {
    p.iter()
        .map(|p| {
            (
                (p.object.to_string(), p.field.clone(), p.message.clone()),
                p.clone(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! The loop on tokio's paused clock: how changes are coalesced into rebuilds, and the
    //! EndpointSlice fast path that swaps a pool without one.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::networking::v1::Ingress;
    use serde_json::json;
    use sluice_proxy::ProxySettings;

    use super::*;
    use crate::kube::watch::Obj;

    fn ingress() -> Obj {
        Obj::Ingress(Arc::new(
            serde_json::from_value::<Ingress>(json!({
                "metadata": {"namespace": "ns", "name": "ing",
                    "annotations": {"kubernetes.io/ingress.class": "sluice"}},
                "spec": {"rules": [{"host": "a.example", "http": {"paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "svc", "port": {"number": 80}}}}]}}]}
            }))
            .unwrap(),
        ))
    }

    fn service(name: &str) -> Obj {
        Obj::Service(Arc::new(
            serde_json::from_value::<Service>(json!({
                "metadata": {"namespace": "ns", "name": name},
                "spec": {"ports": [{"port": 80, "targetPort": 8080}]}
            }))
            .unwrap(),
        ))
    }

    fn slice(service: &str, ips: &[&str]) -> Obj {
        let endpoints: Vec<_> = ips
            .iter()
            .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
            .collect();
        Obj::EndpointSlice(Arc::new(
            serde_json::from_value::<EndpointSlice>(json!({
                "metadata": {"namespace": "ns", "name": format!("{service}-1"),
                    "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"port": 8080}],
                "endpoints": endpoints
            }))
            .unwrap(),
        ))
    }

    struct Harness {
        tx: mpsc::UnboundedSender<Seen>,
        dp: Arc<DataPlane>,
        published: watch::Receiver<Published>,
    }

    impl Harness {
        /// A running loop that has listed one Ingress, its Service and a slice of one pod,
        /// and applied them once.
        async fn start() -> Self {
            let dp = DataPlane::new(ProxySettings::default(), None).unwrap();
            let (published_tx, published) = watch::channel(Published::default());
            let (ingress_tx, _) = watch::channel(0);
            let r = Rebuilder::new(
                TranslateOptions::default(),
                Arc::clone(&dp),
                published_tx,
                ingress_tx,
            );
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(r, rx));
            let h = Self { tx, dp, published };
            for kind in kinds(false, false) {
                h.send(Change::Init(kind));
                let objs = match kind {
                    KindId::Ingress => vec![ingress()],
                    KindId::Service => vec![service("svc")],
                    KindId::EndpointSlice => vec![slice("svc", &["10.0.0.1"])],
                    _ => vec![],
                };
                for o in objs {
                    h.send(Change::InitApply(o));
                }
                h.send(Change::InitDone(kind));
            }
            tokio::time::sleep(MAX_DELAY).await;
            assert_eq!(h.applies(), 1, "the initial lists make one snapshot");
            h.dp.set_listening();
            h
        }

        fn send(&self, c: Change) {
            self.tx.send((c, Instant::now())).unwrap();
        }

        fn applies(&self) -> u64 {
            self.published.borrow().applies
        }

        fn endpoints(&self) -> usize {
            self.dp
                .clusters()
                .first()
                .map_or(0, |c| c.endpoints.load().members.len())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_change_is_applied_after_the_quiet_time() {
        let h = Harness::start().await;
        h.send(Change::Apply(service("other")));
        tokio::time::sleep(QUIET - Duration::from_millis(1)).await;
        assert_eq!(h.applies(), 1, "not before the quiet time");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(h.applies(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_coalesced_and_never_delayed_past_the_maximum() {
        let h = Harness::start().await;
        // A change every 20 ms for one second: the quiet time never passes, so only the
        // maximum delay (300 ms) ends a batch.
        let mut first_apply = None;
        let started = Instant::now();
        for _ in 0..50 {
            h.send(Change::Apply(service("other")));
            tokio::time::sleep(Duration::from_millis(20)).await;
            if first_apply.is_none() && h.applies() > 1 {
                first_apply = Some(started.elapsed());
            }
        }
        tokio::time::sleep(QUIET + Duration::from_millis(1)).await;
        let rebuilds = h.applies() - 1;
        assert!(
            (3..=5).contains(&rebuilds),
            "50 changes made {rebuilds} rebuilds"
        );
        let first = first_apply.unwrap();
        assert!(
            first <= MAX_DELAY + Duration::from_millis(20),
            "first batch at {first:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_change_swaps_the_pool_without_a_rebuild() {
        let h = Harness::start().await;
        assert_eq!(h.endpoints(), 1);
        h.send(Change::Apply(slice("svc", &["10.0.0.1", "10.0.0.2"])));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.endpoints(), 2, "swapped at once");
        tokio::time::sleep(MAX_DELAY * 2).await;
        assert_eq!(h.applies(), 1, "no rebuild");

        // A slice of a Service no pool uses changes nothing routable: no rebuild either.
        h.send(Change::Apply(slice("unused", &["10.0.0.9"])));
        tokio::time::sleep(MAX_DELAY * 2).await;
        assert_eq!(h.applies(), 1);

        // Deleting the slice empties the pool, again without a rebuild.
        h.send(Change::Delete(slice("svc", &[])));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.endpoints(), 0);
        assert_eq!(h.applies(), 1);
    }
}
