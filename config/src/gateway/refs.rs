//! References across objects: ReferenceGrants (the only way across namespaces), backendRefs
//! to Services, certificateRefs to Secrets.

use k8s_openapi::api::core::v1::ServicePort;

use crate::gateway_api::GROUP;
use crate::model::{ClusterKey, ClusterSpec, EndpointSpec, UpstreamProtocol};
use crate::world::World;

/// The referring side of a cross-namespace reference.
#[derive(Debug, Clone, Copy)]
pub struct From<'a> {
    /// The referring object's group (`gateway.networking.k8s.io`).
    pub group: &'a str,
    /// Its kind (`Gateway`, `HTTPRoute`).
    pub kind: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
}

/// Whether a ReferenceGrant in `to_ns` lets `from` refer to the object `(to_group, to_kind,
/// name)` there. A reference within one namespace needs none.
pub fn granted(
    world: &World,
    from: From<'_>,
    to_group: &str,
    to_kind: &str,
    to_ns: &str,
    name: &str,
) -> bool {
    if from.namespace == to_ns {
        return true;
    }
    world
        .reference_grants
        .iter()
        .filter(|((ns, _), _)| ns == to_ns)
        .any(|(_, g)| {
            g.spec.from.iter().any(|f| {
                f.group == from.group && f.kind == from.kind && f.namespace == from.namespace
            }) && g.spec.to.iter().any(|t| {
                t.group == to_group
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n.is_empty() || n == name)
            })
        })
}

/// Why a backendRef cannot be used, as the route's `ResolvedRefs` reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefError {
    /// `InvalidKind`, `RefNotPermitted`, `BackendNotFound`, `UnsupportedProtocol`.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

/// A backendRef as the route spells it (its filters apart).
#[derive(Debug, Clone, Copy)]
pub struct BackendRef<'a> {
    /// `group` (`None` or empty: core).
    pub group: Option<&'a str>,
    /// `kind` (`None`: Service).
    pub kind: Option<&'a str>,
    /// `name`.
    pub name: &'a str,
    /// `namespace` (`None`: the route's).
    pub namespace: Option<&'a str>,
    /// `port`.
    pub port: Option<i32>,
}

/// Resolves a backendRef of a route (its kind and namespace) to a Service port's pool.
pub fn resolve_backend(
    world: &World,
    (route_kind, route_ns): (&'static str, &str),
    r: BackendRef<'_>,
    balance: &crate::model::BalancePolicy,
    max_in_flight: Option<u32>,
) -> Result<ClusterSpec, RefError> {
    let group = r.group.unwrap_or_default();
    let kind = r.kind.unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Err(RefError {
            reason: "InvalidKind",
            message: format!(
                "backendRef {name} is a {kind} of group {group:?}; only core Services are supported",
                name = r.name
            ),
        });
    }
    let ns = r.namespace.unwrap_or(route_ns);
    let from = From {
        group: GROUP,
        kind: route_kind,
        namespace: route_ns,
    };
    if !granted(world, from, "", "Service", ns, r.name) {
        return Err(RefError {
            reason: "RefNotPermitted",
            message: format!(
                "no ReferenceGrant in namespace {ns} lets {route_kind}s of {route_ns} refer to Service {}",
                r.name
            ),
        });
    }
    let not_found = |message: String| RefError {
        reason: "BackendNotFound",
        message,
    };
    let svc = world
        .services
        .get(&(ns.to_string(), r.name.to_string()))
        .ok_or_else(|| not_found(format!("Service {ns}/{} not found", r.name)))?;
    let Some(want) = r.port else {
        return Err(not_found(format!(
            "backendRef to Service {ns}/{} names no port",
            r.name
        )));
    };
    let spec = svc.spec.as_ref();
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        return Err(not_found(format!(
            "Service {ns}/{} is of type ExternalName, which is not supported",
            r.name
        )));
    }
    let port: &ServicePort = spec
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|p| p.port == want)
        .ok_or_else(|| not_found(format!("Service {ns}/{} has no port {want}", r.name)))?;
    let port_num = u16::try_from(port.port).map_err(|_| {
        not_found(format!(
            "Service {ns}/{} port {} is out of range",
            r.name, port.port
        ))
    })?;
    let endpoints: Vec<EndpointSpec> = crate::resolve::resolve_endpoints(world, ns, svc, port);
    Ok(ClusterSpec {
        key: ClusterKey {
            namespace: ns.to_string(),
            service: r.name.to_string(),
            port: port_num,
        },
        protocol: app_protocol(port),
        balance: balance.clone(),
        endpoints,
        max_in_flight,
        service_upstream: false,
        tls: None,
    })
}

/// The protocol a Service port's `appProtocol` asks for (`kubernetes.io/ws` is HTTP/1.1:
/// WebSocket upgrades travel over it).
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
