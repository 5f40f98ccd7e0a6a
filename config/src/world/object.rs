//! The one list of object kinds sluice reads, shared by both run modes: `serve` parses them
//! from files, `controller` watches them, and both put them into a [`World`] the same way, so a
//! kind added here is read by both (a match on [`Object`] that forgets it does not compile).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Key, World, key_of};
use crate::gateway_api::{GRPCRoute, Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TLSRoute};
use crate::refs::ObjectRef;

/// A kind of object sluice reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// networking.k8s.io/v1 Ingress.
    Ingress,
    /// networking.k8s.io/v1 IngressClass (cluster-scoped).
    IngressClass,
    /// v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// v1 Secret (certificates, basic-auth users, CA bundles).
    Secret,
    /// v1 ConfigMap (the controller ConfigMap, `custom-headers`).
    ConfigMap,
    /// v1 Namespace (cluster-scoped): `allowedRoutes` selectors read its labels.
    Namespace,
    /// gateway.networking.k8s.io GatewayClass (cluster-scoped).
    GatewayClass,
    /// gateway.networking.k8s.io Gateway.
    Gateway,
    /// gateway.networking.k8s.io HTTPRoute.
    HttpRoute,
    /// gateway.networking.k8s.io GRPCRoute.
    GrpcRoute,
    /// gateway.networking.k8s.io TLSRoute.
    TlsRoute,
    /// gateway.networking.k8s.io ReferenceGrant.
    ReferenceGrant,
}

impl Kind {
    /// The kind as the API spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Ingress => "Ingress",
            Kind::IngressClass => "IngressClass",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::Namespace => "Namespace",
            Kind::GatewayClass => "GatewayClass",
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::ReferenceGrant => "ReferenceGrant",
        }
    }

    /// Whether objects of the kind have no namespace (their key's namespace is empty).
    pub const fn cluster_scoped(self) -> bool {
        matches!(
            self,
            Kind::IngressClass | Kind::Namespace | Kind::GatewayClass
        )
    }
}

/// One object of a kind sluice reads, shared: a file's cache, a watch and every world built
/// from them hold the same object.
#[derive(Debug, Clone)]
pub enum Object {
    /// An Ingress.
    Ingress(Arc<Ingress>),
    /// An IngressClass.
    IngressClass(Arc<IngressClass>),
    /// A Service.
    Service(Arc<Service>),
    /// An EndpointSlice.
    EndpointSlice(Arc<EndpointSlice>),
    /// A Secret.
    Secret(Arc<Secret>),
    /// A ConfigMap.
    ConfigMap(Arc<ConfigMap>),
    /// A Namespace (labels only matter).
    Namespace(Arc<Namespace>),
    /// A GatewayClass.
    GatewayClass(Arc<GatewayClass>),
    /// A Gateway.
    Gateway(Arc<Gateway>),
    /// An HTTPRoute.
    HttpRoute(Arc<HTTPRoute>),
    /// A GRPCRoute.
    GrpcRoute(Arc<GRPCRoute>),
    /// A TLSRoute.
    TlsRoute(Arc<TLSRoute>),
    /// A ReferenceGrant.
    ReferenceGrant(Arc<ReferenceGrant>),
    /// An object this version could not read (a newer Gateway API bundle's field values), with
    /// why: reported and left out, while the others keep working.
    Unreadable(Kind, Key, String),
}

impl Object {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Ingress(_) => Kind::Ingress,
            Object::IngressClass(_) => Kind::IngressClass,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Secret(_) => Kind::Secret,
            Object::ConfigMap(_) => Kind::ConfigMap,
            Object::Namespace(_) => Kind::Namespace,
            Object::GatewayClass(_) => Kind::GatewayClass,
            Object::Gateway(_) => Kind::Gateway,
            Object::HttpRoute(_) => Kind::HttpRoute,
            Object::GrpcRoute(_) => Kind::GrpcRoute,
            Object::TlsRoute(_) => Kind::TlsRoute,
            Object::ReferenceGrant(_) => Kind::ReferenceGrant,
            Object::Unreadable(kind, _, _) => *kind,
        }
    }

    /// Its metadata (`None` for an unreadable object).
    pub fn metadata(&self) -> Option<&ObjectMeta> {
        Some(match self {
            Object::Ingress(x) => &x.metadata,
            Object::IngressClass(x) => &x.metadata,
            Object::Service(x) => &x.metadata,
            Object::EndpointSlice(x) => &x.metadata,
            Object::Secret(x) => &x.metadata,
            Object::ConfigMap(x) => &x.metadata,
            Object::Namespace(x) => &x.metadata,
            Object::GatewayClass(x) => &x.metadata,
            Object::Gateway(x) => &x.metadata,
            Object::HttpRoute(x) => &x.metadata,
            Object::GrpcRoute(x) => &x.metadata,
            Object::TlsRoute(x) => &x.metadata,
            Object::ReferenceGrant(x) => &x.metadata,
            Object::Unreadable(..) => return None,
        })
    }

    /// Its key in the world: `(namespace, name)`, the namespace empty for cluster-scoped kinds.
    pub fn key(&self) -> Key {
        match (self, self.metadata()) {
            (Object::Unreadable(_, key, _), _) => key.clone(),
            (_, Some(meta)) if self.kind().cluster_scoped() => {
                (String::new(), meta.name.clone().unwrap_or_default())
            }
            (_, Some(meta)) => key_of(meta),
            (_, None) => Key::default(),
        }
    }

    /// `Kind namespace/name`, for messages.
    pub fn describe(&self) -> String {
        let (ns, name) = self.key();
        match ns.as_str() {
            "" => format!("{} {name}", self.kind().name()),
            _ => format!("{} {ns}/{name}", self.kind().name()),
        }
    }
}

/// Whether two versions of an object route alike: the same spec, generation and age — what a
/// status write changes is none of them.
fn same_spec<S: PartialEq>(old: (&ObjectMeta, &S), new: (&ObjectMeta, &S)) -> bool {
    old.1 == new.1
        && old.0.generation == new.0.generation
        && old.0.creation_timestamp == new.0.creation_timestamp
}

impl World {
    /// Adds or replaces an object; returns whether translation may see a difference (a change
    /// of status alone — our own status writes among them — makes none, so it rebuilds nothing).
    pub fn put(&mut self, o: Object) -> bool {
        let kind = o.kind();
        let key = o.key();
        self.unreadable
            .remove(&ObjectRef::new(kind.name(), key.0.clone(), key.1.clone()));
        match o {
            Object::Ingress(x) => {
                let same = self.ingresses.get(&key).is_some_and(|old| {
                    old.spec == x.spec
                        && old.metadata.annotations == x.metadata.annotations
                        && old.metadata.creation_timestamp == x.metadata.creation_timestamp
                });
                self.ingresses.insert(key, x);
                return !same;
            }
            Object::IngressClass(x) => self.put_ingress_class(x),
            Object::Service(x) => self.put_service(x),
            Object::EndpointSlice(x) => {
                self.put_endpoint_slice(x);
            }
            Object::Secret(x) => self.put_secret(x),
            Object::ConfigMap(x) => self.put_config_map(x),
            Object::Namespace(x) => {
                self.namespaces.insert(key, x);
            }
            Object::GatewayClass(x) => {
                let same = self.gateway_classes.get(&key).is_some_and(|old| {
                    old.spec == x.spec && old.metadata.generation == x.metadata.generation
                });
                self.gateway_classes.insert(key, x);
                return !same;
            }
            Object::Gateway(x) => {
                let same = self.gateways.get(&key).is_some_and(|old| {
                    same_spec((&old.metadata, &old.spec), (&x.metadata, &x.spec))
                });
                self.gateways.insert(key, x);
                return !same;
            }
            Object::HttpRoute(x) => {
                let same = self.http_routes.get(&key).is_some_and(|old| {
                    same_spec((&old.metadata, &old.spec), (&x.metadata, &x.spec))
                });
                self.http_routes.insert(key, x);
                return !same;
            }
            Object::GrpcRoute(x) => {
                let same = self.grpc_routes.get(&key).is_some_and(|old| {
                    same_spec((&old.metadata, &old.spec), (&x.metadata, &x.spec))
                });
                self.grpc_routes.insert(key, x);
                return !same;
            }
            Object::TlsRoute(x) => {
                let same = self.tls_routes.get(&key).is_some_and(|old| {
                    same_spec((&old.metadata, &old.spec), (&x.metadata, &x.spec))
                });
                self.tls_routes.insert(key, x);
                return !same;
            }
            Object::ReferenceGrant(x) => {
                self.reference_grants.insert(key, x);
            }
            Object::Unreadable(kind, key, why) => {
                self.remove(kind, &key);
                self.unreadable
                    .insert(ObjectRef::new(kind.name(), key.0, key.1), why);
            }
        }
        true
    }

    /// Removes the object of a kind with this key (and its unreadable mark).
    pub fn remove(&mut self, kind: Kind, key: &Key) {
        self.unreadable
            .remove(&ObjectRef::new(kind.name(), key.0.clone(), key.1.clone()));
        match kind {
            Kind::Ingress => drop(self.ingresses.remove(key)),
            Kind::IngressClass => drop(self.ingress_classes.remove(key)),
            Kind::Service => drop(self.services.remove(key)),
            Kind::EndpointSlice => drop(self.delete_endpoint_slice(key)),
            Kind::Secret => drop(self.secrets.remove(key)),
            Kind::ConfigMap => drop(self.config_maps.remove(key)),
            Kind::Namespace => drop(self.namespaces.remove(key)),
            Kind::GatewayClass => drop(self.gateway_classes.remove(key)),
            Kind::Gateway => drop(self.gateways.remove(key)),
            Kind::HttpRoute => drop(self.http_routes.remove(key)),
            Kind::GrpcRoute => drop(self.grpc_routes.remove(key)),
            Kind::TlsRoute => drop(self.tls_routes.remove(key)),
            Kind::ReferenceGrant => drop(self.reference_grants.remove(key)),
        }
    }

    /// Forgets every object of a kind (before a re-list replaces them all).
    pub fn clear(&mut self, kind: Kind) {
        self.unreadable.retain(|o, _| o.kind != kind.name());
        match kind {
            Kind::Ingress => self.ingresses.clear(),
            Kind::IngressClass => self.ingress_classes.clear(),
            Kind::Service => self.services.clear(),
            Kind::EndpointSlice => self.clear_endpoint_slices(),
            Kind::Secret => self.secrets.clear(),
            Kind::ConfigMap => self.config_maps.clear(),
            Kind::Namespace => self.namespaces.clear(),
            Kind::GatewayClass => self.gateway_classes.clear(),
            Kind::Gateway => self.gateways.clear(),
            Kind::HttpRoute => self.http_routes.clear(),
            Kind::GrpcRoute => self.grpc_routes.clear(),
            Kind::TlsRoute => self.tls_routes.clear(),
            Kind::ReferenceGrant => self.reference_grants.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::IngressSpec;

    fn ingress(class: &str, status_ip: Option<&str>) -> Object {
        let mut i = Ingress::default();
        i.metadata.namespace = Some("ns".into());
        i.metadata.name = Some("web".into());
        i.spec = Some(IngressSpec {
            ingress_class_name: Some(class.into()),
            ..Default::default()
        });
        if let Some(ip) = status_ip {
            i.status = Some(k8s_openapi::api::networking::v1::IngressStatus {
                load_balancer: Some(Default::default()),
            });
            i.metadata.resource_version = Some(ip.into());
        }
        Object::Ingress(Arc::new(i))
    }

    #[test]
    fn a_status_write_changes_nothing_translation_reads() {
        let mut w = World::new();
        assert!(w.put(ingress("a", None)), "new");
        assert!(!w.put(ingress("a", Some("10.0.0.1"))), "status only");
        assert!(w.put(ingress("b", None)), "spec changed");
        assert_eq!(w.ingresses.len(), 1);
        w.remove(Kind::Ingress, &("ns".into(), "web".into()));
        assert!(w.ingresses.is_empty());
    }

    #[test]
    fn an_unreadable_object_replaces_the_readable_one_and_back() {
        let mut w = World::new();
        let key: Key = ("ns".into(), "web".into());
        assert!(w.put(ingress("a", None)));
        w.put(Object::Unreadable(Kind::Ingress, key.clone(), "bad".into()));
        assert!(w.ingresses.is_empty(), "left out while unreadable");
        assert_eq!(w.unreadable.len(), 1);
        w.put(ingress("a", None));
        assert!(w.unreadable.is_empty(), "readable again");
        w.clear(Kind::Ingress);
        assert!(w.ingresses.is_empty());
    }

    #[test]
    fn cluster_scoped_kinds_key_on_the_name_alone() {
        let mut c = IngressClass::default();
        c.metadata.name = Some("sluice".into());
        c.metadata.namespace = Some("stray".into());
        let o = Object::IngressClass(Arc::new(c));
        assert_eq!(o.key(), (String::new(), "sluice".into()));
        assert_eq!(o.describe(), "IngressClass sluice");
        assert_eq!(ingress("a", None).describe(), "Ingress ns/web");
    }
}
