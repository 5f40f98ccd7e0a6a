//! The single rebuild loop. Every change lands in one [`World`]; changes are coalesced (a short
//! quiet period, a hard maximum delay) into full rebuilds, except EndpointSlice changes, which
//! take a fast path that recomputes only the affected pools and swaps their endpoint sets — no
//! translation of the other Ingresses, no route-table rebuild.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_config::translate::cluster_endpoints;
use sluice_config::world::{Key, key_of};
use sluice_config::{ClusterKey, Problem, Snapshot, TranslateOptions, World, translate};
use sluice_proxy::{ApplyOutcome, DataPlane};
use tokio::sync::{mpsc, watch};

use super::watch::{ALL_KINDS, Change, KindId, Obj, Seen};

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
}

/// State of the loop.
#[derive(Debug)]
pub struct Rebuilder {
    world: World,
    opts: TranslateOptions,
    dp: Arc<DataPlane>,
    listing: HashMap<KindId, Vec<Obj>>,
    synced: HashSet<KindId>,
    dirty_since: Option<Instant>,
    last_change: Instant,
    pending_seen: Vec<Instant>,
    by_service: HashMap<Key, Vec<ClusterKey>>,
    published: watch::Sender<Published>,
    ingress_changed: watch::Sender<u64>,
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
        }
    }

    /// Whether every kind has finished its initial list.
    pub fn all_synced(&self) -> bool {
        ALL_KINDS.iter().all(|k| self.synced.contains(k))
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
                    .is_some_and(|eps| self.dp.update_endpoints(key, &eps, Some(seen)));
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
        let started = Instant::now();
        let snapshot = translate(&self.world, &self.opts);
        let translate_time = started.elapsed();
        let mut by_service: HashMap<Key, Vec<ClusterKey>> = HashMap::new();
        for key in snapshot.clusters().keys() {
            by_service
                .entry((key.namespace.clone(), key.service.clone()))
                .or_default()
                .push(key.clone());
        }
        self.by_service = by_service;
        let problems = snapshot.problems().to_vec();
        let outcome = self.dp.apply(snapshot);
        for seen in self.pending_seen.drain(..) {
            if !matches!(outcome, ApplyOutcome::Unchanged) {
                self.dp.record_propagation(seen);
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
                        let waiting: BTreeSet<_> = ALL_KINDS.iter().filter(|k| !r.synced.contains(k)).collect();
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
        tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await;
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
