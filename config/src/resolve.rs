//! Reading what backends and certificates resolve to, shared by Ingress and Gateway API
//! translation: a Service port's endpoints from its EndpointSlices (kube-proxy's policy:
//! slices joined by the `kubernetes.io/service-name` label, the slice port matched by the
//! Service port's name, FQDN slices skipped, `addresses[0]` used, duplicates removed, ready
//! endpoints used and serving+terminating ones kept as draining), and a TLS Secret.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Secret, Service, ServicePort};

use crate::model::{ClusterKey, EndpointSpec, EndpointState};
use crate::pem::check_pem;
use crate::world::World;

/// The Secret type sluice reads certificates from.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// Resolves the endpoints of one Service port from the world's EndpointSlices.
pub fn resolve_endpoints(
    world: &World,
    namespace: &str,
    svc: &Service,
    port: &ServicePort,
) -> Vec<EndpointSpec> {
    let svc_name = svc.metadata.name.as_deref().unwrap_or_default();
    let port_name = port.name.as_deref().unwrap_or_default();
    let mut found: BTreeMap<SocketAddr, EndpointState> = BTreeMap::new();
    for slice in world.slices_for(namespace, svc_name) {
        if slice.address_type == "FQDN" {
            continue;
        }
        let Some(target) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let cond = ep.conditions.as_ref();
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
            let state = if ready {
                EndpointState::Ready
            } else if serving && terminating {
                EndpointState::Draining
            } else {
                continue;
            };
            let addr = SocketAddr::new(ip, target);
            // Ready wins over draining when one address shows up in several slices.
            found
                .entry(addr)
                .and_modify(|s| *s = (*s).min(state))
                .or_insert(state);
        }
    }
    found
        .into_iter()
        .map(|(addr, state)| EndpointSpec { addr, state })
        .collect()
}

/// Recomputes the endpoints of one pool (the endpoints-only fast path). `None` when the Service
/// or its port no longer exists (a full rebuild is then needed).
pub fn cluster_endpoints(world: &World, key: &ClusterKey) -> Option<Vec<EndpointSpec>> {
    let svc = world
        .services
        .get(&(key.namespace.clone(), key.service.clone()))?;
    let port = svc
        .spec
        .as_ref()?
        .ports
        .iter()
        .flatten()
        .find(|p| p.port == i32::from(key.port))?;
    Some(resolve_endpoints(world, &key.namespace, svc, port))
}

/// A Secret's value under `key`, from `data` or `stringData`.
pub fn secret_data<'a>(s: &'a Secret, key: &str) -> Option<&'a [u8]> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.as_slice())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| v.as_bytes())
        })
}

/// Reads a Secret as a TLS certificate and key (type `kubernetes.io/tls`, PEM that parses,
/// a key that fits the certificate): the one check both Ingress TLS and Gateway listeners use.
pub fn check_tls_secret(s: &Secret) -> Result<crate::model::CertificatePem, String> {
    let ty = s.type_.as_deref().unwrap_or("Opaque");
    if ty != TLS_SECRET_TYPE {
        return Err(format!("type is {ty:?}, expected {TLS_SECRET_TYPE:?}"));
    }
    check_pem(secret_data(s, "tls.crt"), secret_data(s, "tls.key")).map_err(|e| e.to_string())
}
