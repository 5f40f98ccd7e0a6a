//! Ingress → Gateway API: the manifests `sluice check --to-gateway` prints. Pure: it reads a
//! [`World`] (Ingresses, their Services for named ports, the controller ConfigMap and any
//! Gateway API objects already given) and returns Gateway, HTTPRoute and ReferenceGrant
//! objects plus a report of what each Ingress, annotation and ConfigMap key became.
//!
//! The rules, and why:
//! - One Gateway (`--gateway-name`, in `--gateway-namespace`) holds every listener: `http` on
//!   the HTTP port, and an HTTPS listener per TLS host (its Secret by a cross-namespace
//!   `certificateRef`, allowed by a ReferenceGrant in the Secret's namespace naming exactly
//!   that Secret). Routes from every namespace may attach, as every Ingress could.
//! - An HTTPRoute per Ingress and host (hosts with TLS get one on their HTTPS listener and a
//!   second on `http`: the 308 redirect sluice and ingress-nginx answer there, or the same
//!   rules when `ssl-redirect` is off). Canary Ingresses are folded into the routes of the
//!   Ingress they shadow (weights and header/cookie matches), as ingress-nginx merges them.
//! - Gateway API objects already in the input are printed as they are (status and
//!   server-set metadata dropped) and win over generated ones of the same name, so running the
//!   converter on its own output prints that output again.
//! - Whatever has no equivalent in the Gateway API (or in a sluice policy for HTTPRoutes) is
//!   left out and reported with the reason; what has a near equivalent is converted and the
//!   difference reported. Nothing is dropped silently.

mod emit;
mod ingress;
mod listeners;
mod notes;
mod paths;
mod routes;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::{Value, json};

use crate::gateway_api::{self, Gateway, HTTPRoute, ReferenceGrant};
use crate::world::{Key, World};

pub use notes::{Note, Outcome};

/// Where the generated Gateway lives and what it listens on.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// The Gateway's name.
    pub gateway_name: String,
    /// The Gateway's namespace.
    pub gateway_namespace: String,
    /// Its GatewayClass (sluice's runs `controllerName: sluice.dev/gateway-controller`).
    pub gateway_class: String,
    /// Port of the `http` listener.
    pub http_port: u16,
    /// Port of the HTTPS listeners.
    pub https_port: u16,
    /// The controller ConfigMap (`namespace`, `name`), whose `ssl-redirect` and `hsts` keys
    /// the routes follow; `None`: ingress-nginx's defaults.
    pub config_map: Option<Key>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        Self {
            gateway_name: "sluice".into(),
            gateway_namespace: "sluice-system".into(),
            gateway_class: "sluice".into(),
            http_port: 80,
            https_port: 443,
            config_map: None,
        }
    }
}

/// One object of the output.
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayObject {
    /// A Gateway.
    Gateway(Box<Gateway>),
    /// A ReferenceGrant.
    ReferenceGrant(Box<ReferenceGrant>),
    /// An HTTPRoute.
    HttpRoute(Box<HTTPRoute>),
}

impl GatewayObject {
    fn rank(&self) -> u8 {
        match self {
            GatewayObject::Gateway(_) => 0,
            GatewayObject::ReferenceGrant(_) => 1,
            GatewayObject::HttpRoute(_) => 2,
        }
    }

    fn metadata(&self) -> &ObjectMeta {
        match self {
            GatewayObject::Gateway(o) => &o.metadata,
            GatewayObject::ReferenceGrant(o) => &o.metadata,
            GatewayObject::HttpRoute(o) => &o.metadata,
        }
    }

    /// `(kind rank, namespace, name)`: the output's order.
    fn sort_key(&self) -> (u8, Key) {
        (self.rank(), crate::world::key_of(self.metadata()))
    }

    /// The kind as the API spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayObject::Gateway(_) => "Gateway",
            GatewayObject::ReferenceGrant(_) => "ReferenceGrant",
            GatewayObject::HttpRoute(_) => "HTTPRoute",
        }
    }

    /// The whole object as the API server takes it: `apiVersion`, `kind`, `metadata`,
    /// `spec` (keys sorted, so the printed form is the same every time).
    pub fn to_value(&self) -> Value {
        fn with<T: Serialize>(api_version: &str, kind: &str, o: &T) -> Value {
            let mut v = serde_json::to_value(o).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.insert("apiVersion".into(), Value::String(api_version.into()));
                m.insert("kind".into(), Value::String(kind.into()));
                m.remove("status");
            }
            v
        }
        use k8s_openapi::Resource;
        match self {
            GatewayObject::Gateway(o) => with(Gateway::API_VERSION, Gateway::KIND, o),
            GatewayObject::ReferenceGrant(o) => {
                with(ReferenceGrant::API_VERSION, ReferenceGrant::KIND, o)
            }
            GatewayObject::HttpRoute(o) => with(HTTPRoute::API_VERSION, HTTPRoute::KIND, o),
        }
    }
}

impl fmt::Display for GatewayObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, name) = crate::world::key_of(self.metadata());
        write!(f, "{} {ns}/{name}", self.kind())
    }
}

/// What the conversion gives.
#[derive(Debug, Default)]
pub struct Conversion {
    /// Gateways, then ReferenceGrants, then HTTPRoutes, each by namespace and name.
    pub objects: Vec<GatewayObject>,
    /// Per Ingress (and the ConfigMap), per annotation, key or field: what it became.
    pub notes: Vec<Note>,
}

impl Conversion {
    /// Whether every Ingress, annotation and key converted without a difference.
    pub fn lossless(&self) -> bool {
        self.notes
            .iter()
            .all(|n| matches!(n.outcome, Outcome::Converted(_)))
    }
}

/// Metadata sluice writes on what it generates: name, namespace and an annotation saying
/// what it was converted from.
fn metadata(namespace: &str, name: &str, from: &str) -> Value {
    json!({
        "name": name,
        "namespace": namespace,
        "annotations": {"sluice.dev/converted-from": from},
    })
}

/// A typed object from generated JSON; a shape the types refuse is a converter bug, reported
/// as a note rather than a panic.
fn typed<T: serde::de::DeserializeOwned>(v: Value, notes: &mut Vec<Note>, what: &str) -> Option<T> {
    match gateway_api::parse(v) {
        Ok(o) => Some(o),
        Err(e) => {
            notes.push(Note::new(
                what,
                "(generated object)",
                Outcome::NoEquivalent(format!("could not be built: {e}")),
            ));
            None
        }
    }
}

/// Keeps what a user wrote of an object's metadata, drops what a server set.
fn clean(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone().filter(|l| !l.is_empty()),
        annotations: meta
            .annotations
            .clone()
            .map(|mut a| {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
                a
            })
            .filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    }
}

/// Converts the Ingresses of `world` (and keeps its Gateway API objects).
pub fn convert(world: &World, opts: &ConvertOptions) -> Conversion {
    let mut notes = Vec::new();
    let settings = notes::settings(world, opts, &mut notes);
    let plan = routes::plan(world, &settings, &mut notes);
    // No Ingress, no Gateway: converting the output again (Gateway API objects only) must
    // print it unchanged.
    let mut generated = if world.ingresses.is_empty() {
        Vec::new()
    } else {
        listeners::gateway_objects(&plan, opts, &mut notes)
    };
    generated.extend(emit::objects(&plan, opts, &settings, &mut notes));

    let mut out: BTreeMap<(u8, Key), GatewayObject> = BTreeMap::new();
    for g in world.gateways.values() {
        let mut o = (**g).clone();
        o.metadata = clean(&o.metadata);
        o.status = None;
        let o = GatewayObject::Gateway(Box::new(o));
        out.insert(o.sort_key(), o);
    }
    for g in world.reference_grants.values() {
        let mut o = (**g).clone();
        o.metadata = clean(&o.metadata);
        let o = GatewayObject::ReferenceGrant(Box::new(o));
        out.insert(o.sort_key(), o);
    }
    for r in world.http_routes.values() {
        let mut o = (**r).clone();
        o.metadata = clean(&o.metadata);
        o.status = None;
        let o = GatewayObject::HttpRoute(Box::new(o));
        out.insert(o.sort_key(), o);
    }
    for o in generated {
        let key = o.sort_key();
        if let Some(existing) = out.get(&key) {
            if *existing != o {
                notes.push(Note::new(
                    &o.to_string(),
                    "(generated object)",
                    Outcome::Approximated(format!(
                        "{existing} is in the input already and differs: kept as given, the converted one not printed"
                    )),
                ));
            }
            continue;
        }
        out.insert(key, o);
    }
    Conversion {
        objects: out.into_values().collect(),
        notes,
    }
}
