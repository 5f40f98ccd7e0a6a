//! The Gateway API's watches: GatewayClass, Gateway, HTTPRoute, GRPCRoute (when served),
//! ReferenceGrant and Namespace
//! (for `allowedRoutes` selectors), started only when the API server serves the
//! `gateway.networking.k8s.io` group (the CRDs are installed), found by discovery at start.
//!
//! The four Gateway API kinds are watched as untyped objects and parsed one by one: an object
//! this version of sluice cannot read (a newer bundle's field value) becomes one reported
//! problem, where a typed watch would fail for every object of the kind.

use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use sluice_config::gateway_api::{
    self, GRPCRoute, Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TLSRoute,
};
use sluice_config::world::{Kind, Object, key_of};
use tokio::sync::mpsc;

use super::watch::{Change, KindId, Seen};

/// The Gateway API kinds, as watched.
pub const GATEWAY_KINDS: [KindId; 5] = [
    KindId::Of(Kind::GatewayClass),
    KindId::Of(Kind::Gateway),
    KindId::Of(Kind::HttpRoute),
    KindId::Of(Kind::ReferenceGrant),
    KindId::Of(Kind::Namespace),
];

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

/// Whether the API server serves `resource` (`grpcroutes`: bundles since v1.1; `tlsroutes`:
/// v1 since v1.5) at `gateway.networking.k8s.io/v1`; without it sluice watches the other
/// kinds only.
pub async fn v1_served(client: &Client, resource: &str) -> bool {
    client
        .list_api_group_resources(&format!("{}/v1", gateway_api::GROUP))
        .await
        .is_ok_and(|l| l.resources.iter().any(|r| r.name == resource))
}

/// The object of a watch's kind, or [`Object::Unreadable`] with why this version cannot
/// read it.
fn parse(kind: KindId, o: &DynamicObject) -> Object {
    let key = match kind {
        KindId::Of(Kind::GatewayClass) => {
            (String::new(), o.metadata.name.clone().unwrap_or_default())
        }
        _ => key_of(&o.metadata),
    };
    let json = match serde_json::to_value(o) {
        Ok(j) => j,
        Err(e) => return Object::Unreadable(kind.kind(), key, e.to_string()),
    };
    let parsed = match kind {
        KindId::Of(Kind::GatewayClass) => {
            gateway_api::parse::<GatewayClass>(json).map(|x| Object::GatewayClass(Arc::new(x)))
        }
        KindId::Of(Kind::Gateway) => {
            gateway_api::parse::<Gateway>(json).map(|x| Object::Gateway(Arc::new(x)))
        }
        KindId::Of(Kind::HttpRoute) => {
            gateway_api::parse::<HTTPRoute>(json).map(|x| Object::HttpRoute(Arc::new(x)))
        }
        KindId::Of(Kind::GrpcRoute) => {
            gateway_api::parse::<GRPCRoute>(json).map(|x| Object::GrpcRoute(Arc::new(x)))
        }
        KindId::Of(Kind::TlsRoute) => {
            gateway_api::parse::<TLSRoute>(json).map(|x| Object::TlsRoute(Arc::new(x)))
        }
        _ => {
            gateway_api::parse::<ReferenceGrant>(json).map(|x| Object::ReferenceGrant(Arc::new(x)))
        }
    };
    parsed.unwrap_or_else(|why| Object::Unreadable(kind.kind(), key, why))
}

fn spawn_untyped(api: Api<DynamicObject>, kind: KindId, tx: mpsc::UnboundedSender<Seen>) {
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .backoff(super::watch::watch_backoff())
            .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None);
        super::watch::pump(stream, kind, tx, |ev| match ev {
            watcher::Event::Apply(o) => Change::Apply(kind, parse(kind, &o)),
            watcher::Event::Delete(o) => Change::Delete(kind, parse(kind, &o)),
            watcher::Event::Init => Change::Init(kind),
            watcher::Event::InitApply(o) => Change::InitApply(kind, parse(kind, &o)),
            watcher::Event::InitDone => Change::InitDone(kind),
        })
        .await;
    });
}

/// Starts the five watches, and GRPCRoutes' and TLSRoutes' where served (`--watch-namespace`
/// limits the namespaced ones).
pub fn start(
    client: &Client,
    namespace: Option<&str>,
    tx: &mpsc::UnboundedSender<Seen>,
    (grpc, tls): (bool, bool),
) {
    let untyped = |ar: ApiResource, cluster: bool| match (namespace, cluster) {
        (Some(ns), false) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
        _ => Api::<DynamicObject>::all_with(client.clone(), &ar),
    };
    spawn_untyped(
        untyped(ApiResource::erase::<GatewayClass>(&()), true),
        KindId::Of(Kind::GatewayClass),
        tx.clone(),
    );
    spawn_untyped(
        untyped(ApiResource::erase::<Gateway>(&()), false),
        KindId::Of(Kind::Gateway),
        tx.clone(),
    );
    spawn_untyped(
        untyped(ApiResource::erase::<HTTPRoute>(&()), false),
        KindId::Of(Kind::HttpRoute),
        tx.clone(),
    );
    if grpc {
        spawn_untyped(
            untyped(ApiResource::erase::<GRPCRoute>(&()), false),
            KindId::Of(Kind::GrpcRoute),
            tx.clone(),
        );
    }
    if tls {
        spawn_untyped(
            untyped(ApiResource::erase::<TLSRoute>(&()), false),
            KindId::Of(Kind::TlsRoute),
            tx.clone(),
        );
    }
    spawn_untyped(
        untyped(ApiResource::erase::<ReferenceGrant>(&()), false),
        KindId::Of(Kind::ReferenceGrant),
        tx.clone(),
    );
    super::watch::spawn_namespaces(client, tx.clone());
}
