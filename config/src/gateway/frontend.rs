//! Client-certificate validation of a Gateway's HTTPS listeners (`spec.tls.frontend`): which
//! configuration applies to a listener (its port's, else the default), its CA ConfigMaps
//! resolved (across namespaces only with a ReferenceGrant), and the listener's conditions
//! when they cannot be: `ResolvedRefs` False with the spec's reason for any reference that
//! cannot be used, and `Accepted` False (`NoValidCACertificate`) when none can — such a
//! listener is not served at all, so no connection gets through unchecked.

use super::refs::{From, granted};
use super::status::Cond;
use crate::gateway_api::gateways::{
    GatewayTlsFrontendDefaultValidationMode as DefaultMode,
    GatewayTlsFrontendPerPortTlsValidationMode as PortMode,
};
use crate::gateway_api::{GROUP, Gateway};
use crate::gateway_model::ClientValidation;
use crate::model::ObjectRef;
use crate::world::{DROPPED_BYTES, Key, World};

/// One CA reference, whichever of the two generated types (default, per port) it came from.
#[derive(Debug, Clone, Copy)]
struct CaRef<'a> {
    group: &'a str,
    kind: &'a str,
    name: &'a str,
    namespace: Option<&'a str>,
}

/// A validation configuration as the spec gives it.
#[derive(Debug)]
struct Spec<'a> {
    refs: Vec<CaRef<'a>>,
    insecure: bool,
}

/// A validation's references, whichever generated type they are.
macro_rules! ca_refs {
    ($v:expr) => {
        $v.ca_certificate_refs
            .iter()
            .map(|r| CaRef {
                group: &r.group,
                kind: &r.kind,
                name: &r.name,
                namespace: r.namespace.as_deref(),
            })
            .collect()
    };
}

/// The configuration for listeners on `port`: the port's own entry (one without `validation`
/// turns validation off for the port), else the default's.
fn spec_for(g: &Gateway, port: u16) -> Option<Spec<'_>> {
    let f = g.spec.tls.as_ref()?.frontend.as_ref()?;
    if let Some(p) = f
        .per_port
        .iter()
        .flatten()
        .find(|p| p.port == i32::from(port))
    {
        let v = p.tls.validation.as_ref()?;
        return Some(Spec {
            refs: ca_refs!(v),
            insecure: v.mode == Some(PortMode::AllowInsecureFallback),
        });
    }
    let v = f.default.validation.as_ref()?;
    Some(Spec {
        refs: ca_refs!(v),
        insecure: v.mode == Some(DefaultMode::AllowInsecureFallback),
    })
}

/// Whether the Gateway asks, anywhere, for `AllowInsecureFallback` (its
/// `InsecureFrontendValidationMode` condition).
pub(super) fn insecure(g: &Gateway) -> bool {
    let Some(f) = g.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
        return false;
    };
    f.default
        .validation
        .as_ref()
        .is_some_and(|v| v.mode == Some(DefaultMode::AllowInsecureFallback))
        || f.per_port.iter().flatten().any(|p| {
            p.tls
                .validation
                .as_ref()
                .is_some_and(|v| v.mode == Some(PortMode::AllowInsecureFallback))
        })
}

/// Why a CA reference cannot be used: `(reason, message)`.
type Refused = (&'static str, String);

/// One reference's `ca.crt`, or why it cannot be used.
fn resolve(world: &World, gw_ns: &str, r: CaRef<'_>) -> Result<(ObjectRef, Vec<u8>), Refused> {
    if !r.group.is_empty() || r.kind != "ConfigMap" {
        return Err((
            "InvalidCACertificateKind",
            format!(
                "caCertificateRef {} is a {} of group {:?}; only core ConfigMaps (key ca.crt) are supported",
                r.name, r.kind, r.group
            ),
        ));
    }
    let ns = r.namespace.unwrap_or(gw_ns);
    let from = From {
        group: GROUP,
        kind: "Gateway",
        namespace: gw_ns,
    };
    if !granted(world, from, "", "ConfigMap", ns, r.name) {
        return Err((
            "RefNotPermitted",
            format!(
                "no ReferenceGrant in namespace {ns} lets Gateways of {gw_ns} use ConfigMap {}",
                r.name
            ),
        ));
    }
    let bad = |msg: String| Err(("InvalidCACertificateRef", msg));
    let Some(cm) = world.config_maps.get(&(ns.to_string(), r.name.to_string())) else {
        return bad(format!("ConfigMap {ns}/{} not found", r.name));
    };
    if let Some(size) = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DROPPED_BYTES))
    {
        return bad(format!(
            "ConfigMap {ns}/{} holds {size} bytes, more than sluice keeps of a ConfigMap (64 KiB)",
            r.name
        ));
    }
    let Some(ca) = cm
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .filter(|c| !c.is_empty())
    else {
        return bad(format!("ConfigMap {ns}/{} has no key ca.crt", r.name));
    };
    if let Err(e) = crate::pem::check_certificates(ca.as_bytes()) {
        return bad(format!("ConfigMap {ns}/{}: ca.crt: {e}", r.name));
    }
    Ok((
        ObjectRef::new("ConfigMap", ns, r.name),
        ca.as_bytes().to_vec(),
    ))
}

/// What a Gateway's `spec.tls.frontend` makes of an HTTPS listener on a port.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The validation it serves with (`None`: no reference could be used).
    pub validation: Option<ClientValidation>,
    /// `ResolvedRefs` False with the first unusable reference's reason, and all of them said.
    pub refused: Option<Cond>,
    /// `Accepted` False (`NoValidCACertificate`) when no reference could be used.
    pub unusable: Option<Cond>,
}

/// The client-certificate validation of `g`'s HTTPS listeners on `port` (`None`: none asked).
/// Only HTTPS listeners take it: validation is for HTTPS traffic.
pub(super) fn for_port(world: &World, g: &Gateway, port: u16) -> Option<Outcome> {
    let spec = spec_for(g, port)?;
    let gw_ns = g.metadata.namespace.as_deref().unwrap_or_default();
    let mut validation = ClientValidation {
        ca_pem: Vec::new(),
        sources: Vec::new(),
        insecure_fallback: spec.insecure,
    };
    let mut refused: Vec<Refused> = Vec::new();
    for r in &spec.refs {
        match resolve(world, gw_ns, *r) {
            Ok((source, pem)) => {
                validation.ca_pem.extend_from_slice(&pem);
                if !pem.ends_with(b"\n") {
                    validation.ca_pem.push(b'\n');
                }
                validation.sources.push(source);
            }
            Err(why) => refused.push(why),
        }
    }
    let refused_cond = refused.first().map(|(reason, _)| {
        let message = refused
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        Cond::new("ResolvedRefs", false, reason, message)
    });
    if validation.sources.is_empty() {
        let message = if spec.refs.is_empty() {
            "frontend validation names no CA certificate"
        } else {
            "no caCertificateRef of the frontend validation can be used"
        };
        return Some(Outcome {
            validation: None,
            refused: refused_cond,
            unusable: Some(Cond::new(
                "Accepted",
                false,
                "NoValidCACertificate",
                message,
            )),
        });
    }
    Some(Outcome {
        validation: Some(validation),
        refused: refused_cond,
        unusable: None,
    })
}

/// The ConfigMaps some Gateway names as a frontend CA (whatever its class): a change to one
/// of them must rebuild.
pub fn config_maps(world: &World) -> impl Iterator<Item = Key> + '_ {
    world.gateways.values().flat_map(|g| {
        let ns = g.metadata.namespace.clone().unwrap_or_default();
        let f = g.spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
        let default = f
            .and_then(|f| f.default.validation.as_ref())
            .into_iter()
            .flat_map(|v| &v.ca_certificate_refs)
            .map(|r| (r.namespace.clone(), r.name.clone()));
        let per_port = f
            .and_then(|f| f.per_port.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.tls.validation.as_ref())
            .flat_map(|v| &v.ca_certificate_refs)
            .map(|r| (r.namespace.clone(), r.name.clone()));
        default
            .chain(per_port)
            .map(move |(n, name)| (n.unwrap_or_else(|| ns.clone()), name))
            .collect::<Vec<_>>()
    })
}
