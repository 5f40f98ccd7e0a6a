//! [`World`]: the Kubernetes objects translation reads, keyed so that the order they arrived in
//! cannot matter, with an index of EndpointSlices by Service for the endpoints-only fast path.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gateway_api::{GRPCRoute, Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TLSRoute};
use crate::refs::ObjectRef;

/// The label EndpointSlices carry to name their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Set by a controller on a ConfigMap whose data it did not keep (too large to be a set of
/// response fields), with the size it had; `custom-headers` refuses such a ConfigMap.
pub const DROPPED_BYTES: &str = "sluice.dev/dropped-data-bytes";

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
pub type Key = (String, String);

/// The key of an object from its metadata.
pub fn key_of(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// All objects translation may read. Objects are shared (`Arc`) so that a controller can hand
/// over its stores without deep copies.
#[derive(Debug, Default, Clone)]
pub struct World {
    /// Ingresses by key.
    pub ingresses: BTreeMap<Key, Arc<Ingress>>,
    /// IngressClasses by name (empty namespace).
    pub ingress_classes: BTreeMap<Key, Arc<IngressClass>>,
    /// Services by key.
    pub services: BTreeMap<Key, Arc<Service>>,
    /// Secrets by key.
    pub secrets: BTreeMap<Key, Arc<Secret>>,
    /// ConfigMaps by key (the controller ConfigMap is looked up here).
    pub config_maps: BTreeMap<Key, Arc<ConfigMap>>,
    /// GatewayClasses by name (empty namespace).
    pub gateway_classes: BTreeMap<Key, Arc<GatewayClass>>,
    /// Gateways by key.
    pub gateways: BTreeMap<Key, Arc<Gateway>>,
    /// HTTPRoutes by key.
    pub http_routes: BTreeMap<Key, Arc<HTTPRoute>>,
    /// GRPCRoutes by key.
    pub grpc_routes: BTreeMap<Key, Arc<GRPCRoute>>,
    /// TLSRoutes by key.
    pub tls_routes: BTreeMap<Key, Arc<TLSRoute>>,
    /// ReferenceGrants by key.
    pub reference_grants: BTreeMap<Key, Arc<ReferenceGrant>>,
    /// Namespaces by name (empty namespace): a listener's `allowedRoutes` selector reads
    /// their labels. Watched only with the Gateway API.
    pub namespaces: BTreeMap<Key, Arc<Namespace>>,
    /// Gateway API objects this version cannot read (a newer bundle's field values), with
    /// why: each is reported and left out, the others keep working.
    pub unreadable: BTreeMap<ObjectRef, String>,
    endpoint_slices: BTreeMap<Key, Arc<EndpointSlice>>,
    slices_by_service: BTreeMap<Key, BTreeSet<String>>,
}

pub(crate) fn service_of(slice: &EndpointSlice) -> Option<Key> {
    let svc = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((
        slice.metadata.namespace.clone().unwrap_or_default(),
        svc.clone(),
    ))
}

impl World {
    /// An empty world.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces a ConfigMap.
    pub fn put_config_map(&mut self, o: impl Into<Arc<ConfigMap>>) {
        let o = o.into();
        self.config_maps.insert(key_of(&o.metadata), o);
    }

    /// Inserts or replaces an Ingress.
    pub fn put_ingress(&mut self, o: impl Into<Arc<Ingress>>) {
        let o = o.into();
        self.ingresses.insert(key_of(&o.metadata), o);
    }

    /// Inserts or replaces an IngressClass.
    pub fn put_ingress_class(&mut self, o: impl Into<Arc<IngressClass>>) {
        let o = o.into();
        let (_, name) = key_of(&o.metadata);
        self.ingress_classes.insert((String::new(), name), o);
    }

    /// Inserts or replaces a Service.
    pub fn put_service(&mut self, o: impl Into<Arc<Service>>) {
        let o = o.into();
        self.services.insert(key_of(&o.metadata), o);
    }

    /// Inserts or replaces a Secret.
    pub fn put_secret(&mut self, o: impl Into<Arc<Secret>>) {
        let o = o.into();
        self.secrets.insert(key_of(&o.metadata), o);
    }

    /// Inserts or replaces an EndpointSlice; returns the Service keys whose endpoints may have
    /// changed (the old and the new owner when the label moved).
    pub fn put_endpoint_slice(&mut self, o: impl Into<Arc<EndpointSlice>>) -> Vec<Key> {
        let o = o.into();
        let key = key_of(&o.metadata);
        let mut touched = self.delete_endpoint_slice(&key);
        if let Some(svc) = service_of(&o) {
            self.slices_by_service
                .entry(svc.clone())
                .or_default()
                .insert(key.1.clone());
            if !touched.contains(&svc) {
                touched.push(svc);
            }
        }
        self.endpoint_slices.insert(key, o);
        touched
    }

    /// Removes an EndpointSlice; returns the Service key it belonged to, if any.
    pub fn delete_endpoint_slice(&mut self, key: &Key) -> Vec<Key> {
        let Some(old) = self.endpoint_slices.remove(key) else {
            return Vec::new();
        };
        let Some(svc) = service_of(&old) else {
            return Vec::new();
        };
        if let Some(set) = self.slices_by_service.get_mut(&svc) {
            set.remove(&key.1);
            if set.is_empty() {
                self.slices_by_service.remove(&svc);
            }
        }
        vec![svc]
    }

    /// Removes every EndpointSlice (before a re-list replaces them all).
    pub fn clear_endpoint_slices(&mut self) {
        self.endpoint_slices.clear();
        self.slices_by_service.clear();
    }

    /// The EndpointSlices of a Service, in name order.
    pub fn slices_for<'a>(
        &'a self,
        namespace: &'a str,
        service: &str,
    ) -> impl Iterator<Item = &'a Arc<EndpointSlice>> + 'a {
        self.slices_by_service
            .get(&(namespace.to_string(), service.to_string()))
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                self.endpoint_slices
                    .get(&(namespace.to_string(), name.clone()))
            })
    }

    /// All EndpointSlices.
    pub fn endpoint_slices(&self) -> impl Iterator<Item = &Arc<EndpointSlice>> {
        self.endpoint_slices.values()
    }
}

mod object;
pub use object::{Kind, Object};
