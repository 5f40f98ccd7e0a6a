//! The single rebuild loop. Every change lands in one [`World`]; changes are coalesced (a short
//! quiet period, a hard maximum delay) into full rebuilds, except EndpointSlice changes, which
//! take a fast path that recomputes only the affected pools and swaps their endpoint sets — no
//! translation of the other Ingresses, no route-table rebuild.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sluice_config::translate::translate_all_with;
use sluice_config::world::{Key, Kind, Object, key_of};
use sluice_config::{Problem, Snapshot, TranslateOptions, World};
use sluice_proxy::{ApplyOutcome, DataPlane};
use tokio::sync::{mpsc, watch};
// tokio's clock, so that a paused test runtime drives the quiet time and the maximum delay.
use tokio::time::Instant;

use super::watch::{Change, KindId, Seen, kinds};

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
    /// The Ingresses owed a status address, as of the last rebuild (translation's verdict:
    /// see [`sluice_config::translate::Translation::ingresses`]).
    pub ingresses: Arc<BTreeSet<Key>>,
}

/// State of the loop.
#[derive(Debug)]
pub struct Rebuilder {
    world: World,
    opts: TranslateOptions,
    dp: Arc<DataPlane>,
    listing: HashMap<KindId, Vec<Object>>,
    /// The kinds watched (the ConfigMap only with `--configmap`).
    kinds: Vec<KindId>,
    synced: HashSet<KindId>,
    dirty_since: Option<Instant>,
    last_change: Instant,
    pending_seen: Vec<Instant>,
    pools: crate::endpoints::Pools,
    published: watch::Sender<Published>,
    ingress_changed: watch::Sender<u64>,
    /// ConfigMaps some Ingress names in `custom-headers` or some Gateway as a frontend CA (as
    /// of the last rebuild): a change to any other ConfigMap rebuilds nothing.
    referenced_config_maps: HashSet<Key>,
    /// Watches failing now, and why (shown in `/api/v1/status` while they fail).
    failing: std::collections::BTreeMap<KindId, String>,
    /// The Gateway API routes compiled by earlier rebuilds, reused while unchanged.
    memo: sluice_config::gateway::RouteMemo,
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
            pools: crate::endpoints::Pools::default(),
            published,
            ingress_changed,
            referenced_config_maps: HashSet::new(),
            failing: std::collections::BTreeMap::new(),
            memo: sluice_config::gateway::RouteMemo::new(),
        }
    }

    /// Waits for the Gateway API's kinds too (when the API server serves them).
    pub fn with_gateway_api(mut self, on: bool) -> Self {
        self.kinds = kinds(self.opts.configmap.is_some(), on);
        self
    }

    /// Waits for the initial list of a route kind watched only when served (GRPCRoute,
    /// TLSRoute) too.
    pub fn with_route_kind(mut self, kind: sluice_config::world::Kind, on: bool) -> Self {
        let kind = super::watch::KindId::Of(kind);
        if on && !self.kinds.contains(&kind) {
            self.kinds.push(kind);
        }
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

    /// Puts an object into the world; returns whether translation may see a difference. The
    /// controller ConfigMap is its own watch's: the watch of every ConfigMap (which trims them)
    /// leaves it alone.
    fn put(&mut self, watch: KindId, o: Object) -> bool {
        if watch == KindId::Of(Kind::ConfigMap) && self.controller_config_map() == Some(o.key()) {
            return false;
        }
        self.world.put(o)
    }

    /// Forgets what a watch listed, before its re-list replaces it.
    fn clear(&mut self, watch: KindId) {
        let own = self.controller_config_map();
        match watch {
            KindId::ControllerConfigMap => {
                if let Some(k) = own {
                    self.world.config_maps.remove(&k);
                }
            }
            KindId::Of(Kind::ConfigMap) => self
                .world
                .config_maps
                .retain(|k, _| Some(k) == own.as_ref()),
            _ => self.world.clear(watch.kind()),
        }
    }

    /// Whether a change to this object can change the snapshot (a ConfigMap only when it is
    /// the controller's or an Ingress names it).
    fn matters(&self, o: &Object) -> bool {
        match o {
            Object::ConfigMap(_) => self.config_map_matters(&o.key()),
            _ => true,
        }
    }

    /// Lists the failing watches among the data plane's problems.
    fn show_failing(&self) {
        self.dp.set_source_problems(
            self.failing
                .iter()
                .map(|(watch, why)| {
                    format!(
                        "watch of {:?} failing, retrying; the last good configuration serves: {why}",
                        watch.kind()
                    )
                })
                .collect(),
        );
    }

    /// Takes one change into the world; fast-paths endpoint changes.
    pub fn handle(&mut self, change: Change, seen: Instant) {
        let fast = self.all_synced() && self.dp.is_ready();
        match change {
            Change::Init(watch) => {
                self.listing.insert(watch, Vec::new());
            }
            Change::Failing(watch, why) => {
                self.failing.insert(watch, why);
                self.show_failing();
            }
            Change::Recovered(watch) => {
                self.failing.remove(&watch);
                self.show_failing();
            }
            Change::InitApply(watch, o) => {
                self.listing.entry(watch).or_default().push(o);
            }
            Change::InitDone(watch) => {
                let objs = self.listing.remove(&watch).unwrap_or_default();
                self.clear(watch);
                for o in objs {
                    self.put(watch, o);
                }
                self.synced.insert(watch);
                self.ingress_changed.send_modify(|g| *g += 1);
                self.mark_dirty(seen);
            }
            Change::Apply(_, Object::EndpointSlice(s)) if fast => {
                let touched = self.world.put_endpoint_slice(s);
                self.fast_path(&touched, seen);
            }
            Change::Delete(_, Object::EndpointSlice(s)) if fast => {
                let touched = self.world.delete_endpoint_slice(&key_of(&s.metadata));
                self.fast_path(&touched, seen);
            }
            Change::Apply(watch, o) => {
                let kind = o.kind();
                let matters = self.matters(&o);
                // Status-only updates (our own writes included) never cause a rebuild.
                let changed = self.put(watch, o);
                if kind == Kind::Ingress {
                    self.ingress_changed.send_modify(|g| *g += 1);
                }
                if changed && matters {
                    self.mark_dirty(seen);
                }
            }
            Change::Delete(watch, o) => {
                let (kind, key) = (o.kind(), o.key());
                let matters = self.matters(&o);
                if watch != KindId::Of(Kind::ConfigMap)
                    || self.controller_config_map() != Some(key.clone())
                {
                    self.world.remove(kind, &key);
                }
                if kind == Kind::Ingress {
                    self.ingress_changed.send_modify(|g| *g += 1);
                }
                if matters {
                    self.mark_dirty(seen);
                }
            }
        }
    }

    /// Swaps only the pools of the touched Services (see [`crate::endpoints`]).
    fn fast_path(&mut self, touched: &[Key], seen: Instant) {
        if !self
            .pools
            .swap(&self.dp, &self.world, touched, seen.into_std())
        {
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
        let translation = translate_all_with(&self.world, &self.opts, Some(&mut self.memo));
        // Each Gateway keeps its address in the next translation, whatever its status shows yet.
        self.opts.gateway.sticky = translation
            .gateway
            .gateways
            .iter()
            .filter_map(|(k, g)| Some((k.clone(), g.addresses.first()?.parse().ok()?)))
            .collect();
        let gateway =
            super::gateway_status::Desired::new(translation.gateway, &self.world, &self.opts);
        let ingresses = Arc::new(translation.ingresses);
        let translate_time = started.elapsed();
        self.pools = crate::endpoints::Pools::of(&translation.snapshot);
        self.referenced_config_maps = self
            .world
            .ingresses
            .values()
            .filter_map(|i| sluice_config::translate::headers::reference(i))
            .chain(sluice_config::gateway::frontend::config_maps(&self.world))
            .collect();
        let problems = translation.snapshot.problems().to_vec();
        let outcome = self.dp.apply(translation.snapshot);
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
            p.ingresses = ingresses;
        });
        self.dp.current().unwrap_or_default()
    }

    /// The world (for tests and status).
    pub fn world(&self) -> &World {
        &self.world
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

    fn ingress() -> Object {
        Object::Ingress(Arc::new(
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

    fn service(name: &str) -> Object {
        Object::Service(Arc::new(
            serde_json::from_value::<Service>(json!({
                "metadata": {"namespace": "ns", "name": name},
                "spec": {"ports": [{"port": 80, "targetPort": 8080}]}
            }))
            .unwrap(),
        ))
    }

    fn slice(service: &str, ips: &[&str]) -> Object {
        let endpoints: Vec<_> = ips
            .iter()
            .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
            .collect();
        Object::EndpointSlice(Arc::new(
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
                    KindId::Of(Kind::Ingress) => vec![ingress()],
                    KindId::Of(Kind::Service) => vec![service("svc")],
                    KindId::Of(Kind::EndpointSlice) => vec![slice("svc", &["10.0.0.1"])],
                    _ => vec![],
                };
                for o in objs {
                    h.send(Change::InitApply(kind, o));
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
        h.send(Change::Apply(KindId::Of(Kind::Service), service("other")));
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
            h.send(Change::Apply(KindId::Of(Kind::Service), service("other")));
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
        h.send(Change::Apply(
            KindId::Of(Kind::EndpointSlice),
            slice("svc", &["10.0.0.1", "10.0.0.2"]),
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.endpoints(), 2, "swapped at once");
        tokio::time::sleep(MAX_DELAY * 2).await;
        assert_eq!(h.applies(), 1, "no rebuild");

        // A slice of a Service no pool uses changes nothing routable: no rebuild either.
        h.send(Change::Apply(
            KindId::Of(Kind::EndpointSlice),
            slice("unused", &["10.0.0.9"]),
        ));
        tokio::time::sleep(MAX_DELAY * 2).await;
        assert_eq!(h.applies(), 1);

        // Deleting the slice empties the pool, again without a rebuild.
        h.send(Change::Delete(
            KindId::Of(Kind::EndpointSlice),
            slice("svc", &[]),
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.endpoints(), 0);
        assert_eq!(h.applies(), 1);
    }
}
