//! Backend resolution: Ingress backend → Service port → EndpointSlices → upstream pool.
//! Follows kube-proxy's policy: slices joined by the `kubernetes.io/service-name` label, the
//! slice port matched by the Service port's name, FQDN slices skipped, `addresses[0]` used,
//! duplicates removed, ready endpoints used and serving+terminating ones kept as draining.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};

use crate::annotations;
use crate::model::{
    BalancePolicy, ClusterKey, ClusterSpec, EndpointSpec, EndpointState, ObjectRef, RouteAction,
    Severity, UpstreamProtocol,
};
use crate::resolve::resolve_endpoints;
use crate::world::World;

use super::Problems;

/// Protocol from a Service port's `appProtocol`.
fn app_protocol(port: &ServicePort) -> UpstreamProtocol {
    match port
        .app_protocol
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("kubernetes.io/h2c") | Some("h2c") => UpstreamProtocol::H2c,
        Some("https") | Some("kubernetes.io/https") => UpstreamProtocol::Https,
        _ => UpstreamProtocol::Http1,
    }
}

/// What an Ingress's annotations ask of the pools its backends use. A pool is shared by every
/// Ingress that names its Service port, so the oldest Ingress that sets a value wins and a
/// younger one that disagrees gets a `Conflict` warning.
#[derive(Debug, Default)]
pub(super) struct PoolAnnotations {
    /// `proxy-ssl-*`, resolved against its Secret (`translate::upstream_tls`).
    pub(super) tls: Option<crate::model::UpstreamTlsSpec>,
    protocol: Option<UpstreamProtocol>,
    balance: Option<BalancePolicy>,
    max_in_flight: Option<u32>,
    service_upstream: Option<bool>,
}

impl PoolAnnotations {
    /// Reads them; invalid values are reported and ignored.
    pub(super) fn read(ing: &Ingress, src: &ObjectRef, p: &mut Problems) -> Self {
        let empty = BTreeMap::new();
        let ann = ing.metadata.annotations.as_ref().unwrap_or(&empty);
        let mut invalid = |e: annotations::AnnotationError| p.invalid_annotation(src, &e);
        let protocol = annotations::backend_protocol(ann).unwrap_or_else(|e| {
            invalid(e);
            None
        });
        let balance = annotations::balance(ann).unwrap_or_else(|e| {
            invalid(e);
            None
        });
        // `affinity: cookie` wins over the other policies, as in ingress-nginx: the pool hashes
        // the session cookie (its errors are reported with the route's options).
        let balance = match annotations::backends::affinity(ann) {
            Ok(Some(c)) => Some(BalancePolicy::Hash(crate::model::HashKey::Cookie(c.name))),
            _ => balance,
        };
        let max_in_flight = annotations::max_in_flight(ann).unwrap_or_else(|e| {
            invalid(e);
            None
        });
        let service_upstream = annotations::traffic::flag(
            ann,
            &[
                "sluice.dev/service-upstream",
                "nginx.ingress.kubernetes.io/service-upstream",
            ],
        )
        .unwrap_or_else(|e| {
            invalid(e);
            None
        });
        Self {
            tls: None,
            protocol,
            balance,
            max_in_flight,
            service_upstream,
        }
    }
}

/// Builds the pools referenced by routes, once per key.
pub(super) struct Resolver<'w> {
    world: &'w World,
    balance: BalancePolicy,
    clusters: BTreeMap<ClusterKey, ClusterSpec>,
    /// Which Ingress set a cluster's protocol by annotation (the oldest wins).
    protocol_set_by: BTreeMap<ClusterKey, ObjectRef>,
    /// Which Ingress set a cluster's balancing policy by annotation (the oldest wins).
    balance_set_by: BTreeMap<ClusterKey, ObjectRef>,
    /// Which Ingress set a cluster's connection limit by annotation (the oldest wins).
    max_set_by: BTreeMap<ClusterKey, ObjectRef>,
    /// Which Ingress set `service-upstream` on a cluster (the oldest wins).
    via_cluster_ip_set_by: BTreeMap<ClusterKey, ObjectRef>,
    /// Which Ingress set `proxy-ssl-*` on a cluster (the oldest wins).
    tls_set_by: BTreeMap<ClusterKey, ObjectRef>,
    /// `--upstream-max-connections`.
    max_in_flight: Option<u32>,
}

impl<'w> Resolver<'w> {
    pub(super) fn new(
        world: &'w World,
        balance: BalancePolicy,
        max_in_flight: Option<u32>,
    ) -> Self {
        Self {
            world,
            balance,
            clusters: BTreeMap::new(),
            protocol_set_by: BTreeMap::new(),
            balance_set_by: BTreeMap::new(),
            max_set_by: BTreeMap::new(),
            via_cluster_ip_set_by: BTreeMap::new(),
            tls_set_by: BTreeMap::new(),
            max_in_flight,
        }
    }

    pub(super) fn finish(self) -> BTreeMap<ClusterKey, ClusterSpec> {
        self.clusters
    }

    /// Resolves one Ingress backend. Problems become a 503 action plus a report.
    pub(super) fn resolve(
        &mut self,
        src: &ObjectRef,
        field: &str,
        backend: &IngressBackend,
        pool: &PoolAnnotations,
        p: &mut Problems,
    ) -> RouteAction {
        let ns = src.namespace.clone();
        self.resolve_in(&ns, src, field, backend, pool, p)
    }

    /// [`Self::resolve`] for a Service in namespace `ns` (`auth-url` may name another
    /// namespace's Service, as its DNS name does in ingress-nginx).
    pub(super) fn resolve_in(
        &mut self,
        ns: &str,
        src: &ObjectRef,
        field: &str,
        backend: &IngressBackend,
        pool: &PoolAnnotations,
        p: &mut Problems,
    ) -> RouteAction {
        let (svc, port, port_num) = match self.service_port(ns, field, backend) {
            Ok(found) => found,
            Err(Unusable(reason, field, msg)) => {
                let message = format!("{msg}; requests answer 503");
                p.report(Severity::Error, reason, src, field, message);
                return RouteAction::Unavailable(msg);
            }
        };
        let key = ClusterKey {
            namespace: ns.to_string(),
            service: svc.metadata.name.clone().unwrap_or_default(),
            port: port_num,
        };
        let world = self.world;
        let balance = &self.balance;
        let default_max = self.max_in_flight;
        self.clusters
            .entry(key.clone())
            .or_insert_with(|| ClusterSpec {
                key: key.clone(),
                protocol: app_protocol(port),
                balance: balance.clone(),
                endpoints: resolve_endpoints(world, ns, svc, port),
                max_in_flight: default_max,
                service_upstream: false,
                tls: None,
            });
        self.pool_annotations(&key, svc, pool, src, p);
        RouteAction::Cluster(key)
    }

    /// The Service and port a backend names, or why it cannot be used.
    fn service_port(
        &self,
        ns: &str,
        field: &str,
        backend: &IngressBackend,
    ) -> Result<(&'w Service, &'w ServicePort, u16), Unusable> {
        if backend.resource.is_some() {
            let msg = "resource backends are not supported".to_string();
            return Err(Unusable(
                "UnsupportedBackend",
                format!("{field}.resource"),
                msg,
            ));
        }
        let Some(sb) = &backend.service else {
            let msg = "backend names no service".to_string();
            return Err(Unusable("InvalidBackend", field.to_string(), msg));
        };
        let name_field = || format!("{field}.service.name");
        let port_field = || format!("{field}.service.port");
        let world: &'w World = self.world;
        let Some(svc) = world.services.get(&(ns.to_string(), sb.name.clone())) else {
            let msg = format!("Service {ns}/{} not found", sb.name);
            return Err(Unusable("ServiceNotFound", name_field(), msg));
        };
        let spec = svc.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            let msg = format!(
                "Service {ns}/{} is of type ExternalName, which is not supported",
                sb.name
            );
            return Err(Unusable("UnsupportedBackend", name_field(), msg));
        }
        let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
        let want = sb.port.as_ref();
        let port = match (
            want.and_then(|w| w.number),
            want.and_then(|w| w.name.as_deref()),
        ) {
            (Some(n), _) => ports
                .iter()
                .find(|sp| sp.port == n)
                .ok_or_else(|| format!("Service {ns}/{} has no port {n}", sb.name)),
            (None, Some(name)) => ports
                .iter()
                .find(|sp| sp.name.as_deref() == Some(name))
                .ok_or_else(|| format!("Service {ns}/{} has no port named {name:?}", sb.name)),
            (None, None) => Err("backend.service.port needs a number or a name".to_string()),
        };
        let port = port.map_err(|msg| Unusable("ServicePortNotFound", port_field(), msg))?;
        let Ok(port_num) = u16::try_from(port.port) else {
            let msg = format!(
                "Service {ns}/{} port {} is out of range",
                sb.name, port.port
            );
            return Err(Unusable("ServicePortNotFound", port_field(), msg));
        };
        Ok((svc.as_ref(), port, port_num))
    }

    /// The pool-wide annotations of the Ingress on the pool `key` (the oldest Ingress that sets
    /// one wins it; the others are told).
    fn pool_annotations(
        &mut self,
        key: &ClusterKey,
        svc: &Service,
        pool: &PoolAnnotations,
        src: &ObjectRef,
        p: &mut Problems,
    ) {
        let Some(cluster) = self.clusters.get_mut(key) else {
            return;
        };
        if let Some(proto) = pool.protocol {
            first_wins(
                (&mut cluster.protocol, proto),
                (&mut self.protocol_set_by, key, src),
                "backend-protocol",
                p,
            );
        }
        if let Some(balance) = &pool.balance {
            first_wins(
                (&mut cluster.balance, balance.clone()),
                (&mut self.balance_set_by, key, src),
                "load-balance/upstream-hash-by",
                p,
            );
        }
        if let Some(max) = pool.max_in_flight {
            first_wins(
                (&mut cluster.max_in_flight, (max > 0).then_some(max)),
                (&mut self.max_set_by, key, src),
                "upstream-max-connections",
                p,
            );
        }
        if let Some(tls) = &pool.tls {
            first_wins(
                (&mut cluster.tls, Some(tls.clone())),
                (&mut self.tls_set_by, key, src),
                "proxy-ssl-secret",
                p,
            );
        }
        if let Some(via) = pool.service_upstream {
            first_wins(
                (&mut cluster.service_upstream, via),
                (&mut self.via_cluster_ip_set_by, key, src),
                "service-upstream",
                p,
            );
            if cluster.service_upstream {
                match cluster_ip(svc, key.port) {
                    Some(ep) => cluster.endpoints = vec![ep],
                    None => {
                        cluster.service_upstream = false;
                        p.report(
                            Severity::Warning,
                            "NoClusterIP",
                            src,
                            "metadata.annotations[nginx.ingress.kubernetes.io/service-upstream]",
                            format!(
                                "Service {}/{} has no ClusterIP (headless?); its endpoints are used",
                                key.namespace, key.service
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// Why a backend cannot be used: the reason, the field, the message.
struct Unusable(&'static str, String, String);

/// The Service's ClusterIP and port as the pool's one endpoint (`service-upstream`).
fn cluster_ip(svc: &Service, port: u16) -> Option<EndpointSpec> {
    let ip = svc.spec.as_ref()?.cluster_ip.as_deref()?;
    let ip: IpAddr = ip.parse().ok()?;
    Some(EndpointSpec {
        addr: SocketAddr::new(ip, port),
        state: EndpointState::Ready,
    })
}

/// The Ingress's `default-backend` annotation resolved to a pool (the Service's first port);
/// `None` without the annotation. Problems are reported and give `None`.
pub(super) fn fallback(
    backends: &mut Resolver<'_>,
    ing: &Ingress,
    src: &ObjectRef,
    pool: &PoolAnnotations,
    p: &mut Problems,
) -> Option<RouteAction> {
    use k8s_openapi::api::networking::v1::{IngressServiceBackend, ServiceBackendPort};
    let empty = BTreeMap::new();
    let ann = ing.metadata.annotations.as_ref().unwrap_or(&empty);
    let name = match annotations::traffic::default_backend(ann) {
        Ok(n) => n?,
        Err(e) => {
            p.invalid_annotation(src, &e);
            return None;
        }
    };
    let field = "metadata.annotations[nginx.ingress.kubernetes.io/default-backend]";
    let port = backends
        .world
        .services
        .get(&(src.namespace.clone(), name.clone()))
        .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first().map(|p| p.port));
    let Some(port) = port else {
        p.report(
            Severity::Warning,
            "ServiceNotFound",
            src,
            field,
            format!(
                "default-backend: Service {}/{name} not found or without ports; ignored",
                src.namespace
            ),
        );
        return None;
    };
    let backend = IngressBackend {
        resource: None,
        service: Some(IngressServiceBackend {
            name,
            port: Some(ServiceBackendPort {
                name: None,
                number: Some(port),
            }),
        }),
    };
    match backends.resolve(src, field, &backend, pool, p) {
        RouteAction::Cluster(k) => Some(RouteAction::Cluster(k)),
        RouteAction::Unavailable(_) => None,
    }
}

/// Sets a pool's value from the first (oldest) Ingress that asks for it; a later Ingress that
/// asks for something else is told it was ignored.
fn first_wins<T: PartialEq + std::fmt::Debug>(
    (current, wanted): (&mut T, T),
    (set_by, key, src): (
        &mut BTreeMap<ClusterKey, ObjectRef>,
        &ClusterKey,
        &ObjectRef,
    ),
    annotation: &str,
    p: &mut Problems,
) {
    match set_by.get(key) {
        None => {
            *current = wanted;
            set_by.insert(key.clone(), src.clone());
        }
        Some(first) if *current != wanted => p.report(
            Severity::Warning,
            "Conflict",
            src,
            format!("metadata.annotations[sluice.dev/{annotation}]"),
            format!("ignored for {key}: the older {first} sets {current:?}"),
        ),
        Some(_) => {}
    }
}
