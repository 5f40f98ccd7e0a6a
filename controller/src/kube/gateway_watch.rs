//! The Gateway API's watches: GatewayClass, Gateway, HTTPRoute, ReferenceGrant and Namespace
//! (for `allowedRoutes` selectors), started only when the API server serves the
//! `gateway.networking.k8s.io` group (the CRDs are installed), found by discovery at start.
//!
//! The four Gateway API kinds are watched as untyped objects and parsed one by one: an object
//! this version of sluice cannot read (a newer bundle's field value) becomes one reported
//! problem, where a typed watch would fail for every object of the kind.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use sluice_config::gateway_api::{self, Gateway, GatewayClass, HTTPRoute, ReferenceGrant};
use sluice_config::world::{Key, key_of};
use sluice_config::{ObjectRef, World};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::watch::{Change, KindId, Obj, Seen};

/// The Gateway API kinds, as watched.
pub const GATEWAY_KINDS: [KindId; 5] = [
    KindId::GatewayClass,
    KindId::Gateway,
    KindId::HttpRoute,
    KindId::ReferenceGrant,
    KindId::Namespace,
];

/// A Gateway API object as read.
#[derive(Debug, Clone)]
pub enum GwObj {
    /// A GatewayClass.
    GatewayClass(Arc<GatewayClass>),
    /// A Gateway.
    Gateway(Arc<Gateway>),
    /// An HTTPRoute.
    HttpRoute(Arc<HTTPRoute>),
    /// A ReferenceGrant.
    ReferenceGrant(Arc<ReferenceGrant>),
    /// An object of that kind this version could not parse, and why.
    Unreadable(KindId, Key, String),
}

impl GwObj {
    /// Its kind.
    pub fn kind(&self) -> KindId {
        match self {
            Self::GatewayClass(_) => KindId::GatewayClass,
            Self::Gateway(_) => KindId::Gateway,
            Self::HttpRoute(_) => KindId::HttpRoute,
            Self::ReferenceGrant(_) => KindId::ReferenceGrant,
            Self::Unreadable(k, _, _) => *k,
        }
    }

    fn key(&self) -> Key {
        match self {
            Self::GatewayClass(o) => (String::new(), key_of(&o.metadata).1),
            Self::Gateway(o) => key_of(&o.metadata),
            Self::HttpRoute(o) => key_of(&o.metadata),
            Self::ReferenceGrant(o) => key_of(&o.metadata),
            Self::Unreadable(_, k, _) => k.clone(),
        }
    }
}

fn kind_name(k: KindId) -> &'static str {
    match k {
        KindId::GatewayClass => "GatewayClass",
        KindId::Gateway => "Gateway",
        KindId::HttpRoute => "HTTPRoute",
        KindId::ReferenceGrant => "ReferenceGrant",
        _ => "Namespace",
    }
}

fn object_ref(kind: KindId, key: &Key) -> ObjectRef {
    ObjectRef::new(kind_name(kind), key.0.clone(), key.1.clone())
}

/// Whether the API server serves the Gateway API (v1 Gateways and HTTPRoutes, v1beta1
/// ReferenceGrants). Any error counts as "no": sluice then serves Ingresses only.
pub async fn served(client: &Client) -> bool {
    let has = |list: &k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList,
               name: &str| { list.resources.iter().any(|r| r.name == name) };
    let v1 = client
        .list_api_group_resources(&format!("{}/v1", gateway_api::GROUP))
        .await;
    let v1beta1 = client
        .list_api_group_resources(&format!("{}/v1beta1", gateway_api::GROUP))
        .await;
    match (v1, v1beta1) {
        (Ok(a), Ok(b)) => {
            has(&a, "gatewayclasses")
                && has(&a, "gateways")
                && has(&a, "httproutes")
                && has(&b, "referencegrants")
        }
        _ => false,
    }
}

fn parse(kind: KindId, o: &DynamicObject) -> GwObj {
    let key = match kind {
        KindId::GatewayClass => (String::new(), o.metadata.name.clone().unwrap_or_default()),
        _ => key_of(&o.metadata),
    };
    let json = match serde_json::to_value(o) {
        Ok(j) => j,
        Err(e) => return GwObj::Unreadable(kind, key, e.to_string()),
    };
    let parsed = match kind {
        KindId::GatewayClass => {
            gateway_api::parse::<GatewayClass>(json).map(|x| GwObj::GatewayClass(Arc::new(x)))
        }
        KindId::Gateway => gateway_api::parse::<Gateway>(json).map(|x| GwObj::Gateway(Arc::new(x))),
        KindId::HttpRoute => {
            gateway_api::parse::<HTTPRoute>(json).map(|x| GwObj::HttpRoute(Arc::new(x)))
        }
        _ => gateway_api::parse::<ReferenceGrant>(json).map(|x| GwObj::ReferenceGrant(Arc::new(x))),
    };
    parsed.unwrap_or_else(|why| GwObj::Unreadable(kind, key, why))
}

fn spawn_untyped(api: Api<DynamicObject>, kind: KindId, tx: mpsc::UnboundedSender<Seen>) {
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None);
        futures::pin_mut!(stream);
        let mut failing = false;
        while let Some(item) = stream.next().await {
            let now = Instant::now();
            let change = match item {
                Err(e) => {
                    if !failing {
                        tracing::warn!(?kind, error = %e, "watch failed; retrying with backoff and serving the last good configuration");
                    }
                    failing = true;
                    continue;
                }
                Ok(ev) => {
                    failing = false;
                    let wrap = |o: &DynamicObject| Obj::Gw(parse(kind, o));
                    match ev {
                        watcher::Event::Apply(o) => Change::Apply(wrap(&o)),
                        watcher::Event::Delete(o) => Change::Delete(wrap(&o)),
                        watcher::Event::Init => Change::Init(kind),
                        watcher::Event::InitApply(o) => Change::InitApply(wrap(&o)),
                        watcher::Event::InitDone => Change::InitDone(kind),
                    }
                }
            };
            if tx.send((change, now)).is_err() {
                return;
            }
        }
    });
}

/// Starts the five watches (`--watch-namespace` limits the namespaced ones).
pub fn start(client: &Client, namespace: Option<&str>, tx: &mpsc::UnboundedSender<Seen>) {
    let untyped = |ar: ApiResource, cluster: bool| match (namespace, cluster) {
        (Some(ns), false) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
        _ => Api::<DynamicObject>::all_with(client.clone(), &ar),
    };
    spawn_untyped(
        untyped(ApiResource::erase::<GatewayClass>(&()), true),
        KindId::GatewayClass,
        tx.clone(),
    );
    spawn_untyped(
        untyped(ApiResource::erase::<Gateway>(&()), false),
        KindId::Gateway,
        tx.clone(),
    );
    spawn_untyped(
        untyped(ApiResource::erase::<HTTPRoute>(&()), false),
        KindId::HttpRoute,
        tx.clone(),
    );
    spawn_untyped(
        untyped(ApiResource::erase::<ReferenceGrant>(&()), false),
        KindId::ReferenceGrant,
        tx.clone(),
    );
    super::watch::spawn_namespaces(client, tx.clone());
}

/// Puts an object into the world; returns whether translation may see a difference (a
/// change of status alone, such as our own write, makes none).
pub fn put(world: &mut World, o: GwObj) -> bool {
    let key = o.key();
    let kind = o.kind();
    world.unreadable.remove(&object_ref(kind, &key));
    match o {
        GwObj::GatewayClass(x) => {
            let same = world.gateway_classes.get(&key).is_some_and(|old| {
                old.spec == x.spec && old.metadata.generation == x.metadata.generation
            });
            world.gateway_classes.insert(key, x);
            !same
        }
        GwObj::Gateway(x) => {
            let same = world.gateways.get(&key).is_some_and(|old| {
                same_routing((&old.metadata, &old.spec), (&x.metadata, &x.spec))
            });
            world.gateways.insert(key, x);
            !same
        }
        GwObj::HttpRoute(x) => {
            let same = world.http_routes.get(&key).is_some_and(|old| {
                same_routing((&old.metadata, &old.spec), (&x.metadata, &x.spec))
            });
            world.http_routes.insert(key, x);
            !same
        }
        GwObj::ReferenceGrant(x) => {
            world.reference_grants.insert(key, x);
            true
        }
        GwObj::Unreadable(kind, key, why) => {
            remove(world, kind, &key);
            world.unreadable.insert(object_ref(kind, &key), why);
            true
        }
    }
}

/// Whether two versions of an object route alike: the same spec, generation and age (what a
/// status write changes is none of them).
fn same_routing<S: PartialEq>(
    (old_meta, old_spec): (&ObjectMeta, &S),
    (meta, spec): (&ObjectMeta, &S),
) -> bool {
    old_spec == spec
        && old_meta.generation == meta.generation
        && old_meta.creation_timestamp == meta.creation_timestamp
}

fn remove(world: &mut World, kind: KindId, key: &Key) {
    match kind {
        KindId::GatewayClass => {
            world.gateway_classes.remove(key);
        }
        KindId::Gateway => {
            world.gateways.remove(key);
        }
        KindId::HttpRoute => {
            world.http_routes.remove(key);
        }
        _ => {
            world.reference_grants.remove(key);
        }
    }
}

/// Removes an object from the world.
pub fn delete(world: &mut World, o: &GwObj) {
    let key = o.key();
    world.unreadable.remove(&object_ref(o.kind(), &key));
    remove(world, o.kind(), &key);
}

/// Forgets every object of a kind (before its re-list replaces them).
pub fn clear(world: &mut World, kind: KindId) {
    let name = kind_name(kind);
    world.unreadable.retain(|o, _| o.kind != name);
    match kind {
        KindId::GatewayClass => world.gateway_classes.clear(),
        KindId::Gateway => world.gateways.clear(),
        KindId::HttpRoute => world.http_routes.clear(),
        KindId::ReferenceGrant => world.reference_grants.clear(),
        _ => world.namespaces.clear(),
    }
}

/// Namespaces by name, as the world keys them.
pub fn namespace_key(n: &Namespace) -> Key {
    (String::new(), n.metadata.name.clone().unwrap_or_default())
}
