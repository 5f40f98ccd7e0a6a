//! Gateway API status (leader only): GatewayClasses, Gateways, HTTPRoutes and GRPCRoutes get the status
//! translation computed for them (`sluice_config::gateway::status`), with `observedGeneration`
//! on every condition and `lastTransitionTime` kept while a condition's status stays.
//!
//! The writer remembers what it last wrote per object and writes only what differs, so its own
//! writes (whose MODIFIED events change no spec and cause no rebuild) end there. A new leader
//! forgets and writes everything once. An HTTPRoute's entries for other controllers' parents
//! are written back as they were.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use sluice_config::TranslateOptions;
use sluice_config::gateway::status::{Cond, GatewayStatuses};
use sluice_config::gateway_api::{GRPCRoute, Gateway, GatewayClass, HTTPRoute, TLSRoute};
use sluice_config::world::{Key, World};
use tokio::sync::watch;

use super::rebuild::Published;

/// What the leader should write, as of the last rebuild.
#[derive(Debug, Default)]
pub struct Desired {
    /// Computed by translation.
    pub statuses: GatewayStatuses,
    /// Our `controllerName` (route parent entries carry it).
    pub controller: String,
    /// Per route (by kind and key), the parent entries other controllers wrote, kept as
    /// they are.
    pub others: BTreeMap<(&'static str, Key), Vec<Value>>,
    /// Each object's `metadata.uid` by kind and key: an object deleted and made again under
    /// its name is another object, whose status must be written afresh.
    pub uids: BTreeMap<(&'static str, Key), String>,
}

impl Desired {
    /// Takes translation's status and the world it read.
    pub fn new(statuses: GatewayStatuses, world: &World, opts: &TranslateOptions) -> Self {
        let controller = opts.gateway.controller_name.clone();
        let theirs = |parents: Vec<Value>| -> Vec<Value> {
            parents
                .into_iter()
                .filter(|p| p.get("controllerName").and_then(Value::as_str) != Some(&controller))
                .collect()
        };
        let parents_of = |status: Option<Value>| -> Vec<Value> {
            status
                .and_then(|s| s.get("parents").cloned())
                .and_then(|p| p.as_array().cloned())
                .unwrap_or_default()
        };
        let mut others = BTreeMap::new();
        for k in statuses.routes.keys() {
            if let Some(r) = world.http_routes.get(k) {
                let status = r.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
                others.insert(("HTTPRoute", k.clone()), theirs(parents_of(status)));
            }
        }
        for k in statuses.grpc_routes.keys() {
            if let Some(r) = world.grpc_routes.get(k) {
                let status = r.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
                others.insert(("GRPCRoute", k.clone()), theirs(parents_of(status)));
            }
        }
        for k in statuses.tls_routes.keys() {
            if let Some(r) = world.tls_routes.get(k) {
                let status = r.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
                others.insert(("TLSRoute", k.clone()), theirs(parents_of(status)));
            }
        }
        let uid = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.uid.clone().unwrap_or_default()
        };
        let mut uids = BTreeMap::new();
        for name in statuses.classes.keys() {
            let key = (String::new(), name.clone());
            if let Some(o) = world.gateway_classes.get(&key) {
                uids.insert(("GatewayClass", key), uid(&o.metadata));
            }
        }
        for key in statuses.gateways.keys() {
            if let Some(o) = world.gateways.get(key) {
                uids.insert(("Gateway", key.clone()), uid(&o.metadata));
            }
        }
        for key in statuses.routes.keys() {
            if let Some(o) = world.http_routes.get(key) {
                uids.insert(("HTTPRoute", key.clone()), uid(&o.metadata));
            }
        }
        for key in statuses.grpc_routes.keys() {
            if let Some(o) = world.grpc_routes.get(key) {
                uids.insert(("GRPCRoute", key.clone()), uid(&o.metadata));
            }
        }
        for key in statuses.tls_routes.keys() {
            if let Some(o) = world.tls_routes.get(key) {
                uids.insert(("TLSRoute", key.clone()), uid(&o.metadata));
            }
        }
        Self {
            statuses,
            controller,
            others,
            uids,
        }
    }
}

/// Which object a write is for: kind, key, and `metadata.uid`.
type Target = (&'static str, Key, String);

/// The last write per object: its body, and each condition's status and transition time by
/// the path of the condition list and its type.
#[derive(Debug, Default)]
struct Memory {
    bodies: HashMap<Target, Value>,
    times: HashMap<(Target, String, &'static str), (bool, String)>,
}

impl Memory {
    fn conditions(
        &mut self,
        t: &Target,
        list: &str,
        conds: &[Cond],
        generation: i64,
        now: &str,
    ) -> Value {
        Value::Array(
            conds
                .iter()
                .map(|c| {
                    let slot = self
                        .times
                        .entry((t.clone(), list.to_string(), c.kind))
                        .or_insert((c.status, now.to_string()));
                    if slot.0 != c.status {
                        *slot = (c.status, now.to_string());
                    }
                    json!({
                        "type": c.kind,
                        "status": if c.status { "True" } else { "False" },
                        "reason": c.reason,
                        "message": c.message,
                        "observedGeneration": generation,
                        "lastTransitionTime": slot.1,
                    })
                })
                .collect(),
        )
    }
}

fn target(d: &Desired, kind: &'static str, key: Key) -> Target {
    let uid = d
        .uids
        .get(&(kind, key.clone()))
        .cloned()
        .unwrap_or_default();
    (kind, key, uid)
}

fn bodies(d: &Desired, mem: &mut Memory, now: &str) -> Vec<(Target, Value)> {
    let mut out = Vec::new();
    for (name, c) in &d.statuses.classes {
        let t = target(d, "GatewayClass", (String::new(), name.clone()));
        let conditions = mem.conditions(&t, "", &c.conditions, c.generation, now);
        let features: Vec<Value> = c.features.iter().map(|f| json!({"name": f})).collect();
        out.push((
            t,
            json!({"conditions": conditions, "supportedFeatures": features}),
        ));
    }
    for (key, g) in &d.statuses.gateways {
        let t = target(d, "Gateway", key.clone());
        let conditions = mem.conditions(&t, "", &g.conditions, g.generation, now);
        let listeners: Vec<Value> = g
            .listeners
            .iter()
            .map(|l| {
                let kinds: Vec<Value> = l
                    .supported_kinds
                    .iter()
                    .map(|(g, k)| json!({"group": g, "kind": k}))
                    .collect();
                json!({
                    "name": l.name,
                    "supportedKinds": kinds,
                    "attachedRoutes": l.attached_routes,
                    "conditions": mem.conditions(&t, &l.name, &l.conditions, g.generation, now),
                })
            })
            .collect();
        let addresses: Vec<Value> = g
            .addresses
            .iter()
            .map(|a| json!({"type": "IPAddress", "value": a}))
            .collect();
        out.push((
            t,
            json!({"addresses": addresses, "conditions": conditions, "listeners": listeners}),
        ));
    }
    let routes = d
        .statuses
        .routes
        .iter()
        .map(|r| ("HTTPRoute", r))
        .chain(d.statuses.grpc_routes.iter().map(|r| ("GRPCRoute", r)))
        .chain(d.statuses.tls_routes.iter().map(|r| ("TLSRoute", r)));
    for (kind, (key, r)) in routes {
        let t = target(d, kind, key.clone());
        let mut parents: Vec<Value> = d
            .others
            .get(&(kind, key.clone()))
            .cloned()
            .unwrap_or_default();
        for (i, p) in r.parents.iter().enumerate() {
            let mut parent = json!({
                "group": p.parent.group,
                "kind": p.parent.kind,
                "namespace": p.parent.namespace,
                "name": p.parent.name,
            });
            if let Some(s) = &p.parent.section_name {
                parent["sectionName"] = json!(s);
            }
            if let Some(port) = p.parent.port {
                parent["port"] = json!(port);
            }
            parents.push(json!({
                "parentRef": parent,
                "controllerName": d.controller,
                "conditions": mem.conditions(&t, &i.to_string(), &p.conditions, r.generation, now),
            }));
        }
        out.push((t, json!({"parents": parents})));
    }
    out
}

async fn write(
    client: &Client,
    (kind, (ns, name), _): &Target,
    body: &Value,
) -> Result<(), kube::Error> {
    let ar = match *kind {
        "GatewayClass" => ApiResource::erase::<GatewayClass>(&()),
        "Gateway" => ApiResource::erase::<Gateway>(&()),
        "GRPCRoute" => ApiResource::erase::<GRPCRoute>(&()),
        "TLSRoute" => ApiResource::erase::<TLSRoute>(&()),
        _ => ApiResource::erase::<HTTPRoute>(&()),
    };
    let api: Api<DynamicObject> = if ns.is_empty() {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), ns, &ar)
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": body})),
    )
    .await
    .map(|_| ())
}

/// Writes what differs from the last write; returns whether every write succeeded.
async fn write_changed(client: &Client, d: &Desired, mem: &mut Memory) -> bool {
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut ok = true;
    let all = bodies(d, mem, &now);
    // Forget the objects that are gone (or were made again under their names).
    let current: std::collections::HashSet<&Target> = all.iter().map(|(t, _)| t).collect();
    mem.bodies.retain(|t, _| current.contains(t));
    mem.times.retain(|(t, _, _), _| current.contains(t));
    for (t, body) in all {
        if mem.bodies.get(&t) == Some(&body) {
            continue;
        }
        match write(client, &t, &body).await {
            Ok(()) => {
                mem.bodies.insert(t, body);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                ok = false;
                tracing::warn!(kind = t.0, namespace = %t.1.0, name = %t.1.1, error = %e, "writing Gateway API status failed; retrying");
            }
        }
    }
    ok
}

/// Runs the writer: after each rebuild and on gaining leadership; failed writes are retried
/// every few seconds.
pub async fn run(
    client: Client,
    mut published: watch::Receiver<Published>,
    mut leader: watch::Receiver<bool>,
) {
    let mut mem = Memory::default();
    let mut retry = false;
    loop {
        tokio::select! {
            r = published.changed() => if r.is_err() { return },
            r = leader.changed() => {
                if r.is_err() {
                    return;
                }
                mem = Memory::default();
            }
            _ = tokio::time::sleep(Duration::from_secs(5)), if retry => {}
        }
        if !*leader.borrow() {
            retry = false;
            continue;
        }
        let desired: Arc<Desired> = published.borrow().gateway.clone();
        retry = !write_changed(&client, &desired, &mut mem).await;
    }
}
