//! Ingress status (leader only) and Kubernetes Events for reported problems.
//!
//! The leader writes `status.loadBalancer.ingress` of our Ingresses — only when it differs, so a
//! write's own MODIFIED event changes nothing — and clears it on Ingresses that stop being ours
//! (when they still carry exactly our addresses).
//!
//! The reflector store that decides "differs" can lag behind our own write (the MODIFIED event
//! is still on its way when the next change wakes the writer). So the writer remembers, per
//! Ingress, the `resourceVersion` it based its last write on, and never writes again from that
//! same version: it waits until the store has seen a newer one.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use serde_json::json;
use sluice_config::world::{Key, key_of};
use sluice_config::{Problem, Severity};
use tokio::sync::watch;

use super::rebuild::Published;

/// Where the published addresses come from.
#[derive(Debug, Clone)]
pub enum AddressSource {
    /// `--publish-status-address`.
    Fixed(Vec<String>),
    /// Node addresses of the pods of our DaemonSet (found through our own pod's labels).
    Nodes {
        /// `POD_NAMESPACE`.
        namespace: String,
        /// `POD_NAME`.
        pod: String,
    },
    /// Nothing known: no status is written.
    None,
}

fn entry(a: &str) -> IngressLoadBalancerIngress {
    if a.parse::<IpAddr>().is_ok() {
        IngressLoadBalancerIngress {
            ip: Some(a.to_string()),
            ..Default::default()
        }
    } else {
        IngressLoadBalancerIngress {
            hostname: Some(a.to_string()),
            ..Default::default()
        }
    }
}

fn current(i: &Ingress) -> Vec<IngressLoadBalancerIngress> {
    i.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.clone())
        .unwrap_or_default()
}

/// Resolves the addresses to publish.
pub async fn addresses(client: &Client, src: &AddressSource) -> Vec<String> {
    match src {
        AddressSource::Fixed(v) => v.clone(),
        AddressSource::None => Vec::new(),
        AddressSource::Nodes { namespace, pod } => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let Ok(me) = pods.get(pod).await else {
                return Vec::new();
            };
            let selector = me
                .metadata
                .labels
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "controller-revision-hash"
                            | "pod-template-generation"
                            | "pod-template-hash"
                    )
                })
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
                return Vec::new();
            };
            let nodes: Api<Node> = Api::all(client.clone());
            let mut out = BTreeSet::new();
            for p in list.items {
                let Some(node) = p.spec.and_then(|s| s.node_name) else {
                    continue;
                };
                let Ok(n) = nodes.get(&node).await else {
                    continue;
                };
                let addrs = n.status.and_then(|s| s.addresses).unwrap_or_default();
                let pick = addrs
                    .iter()
                    .find(|a| a.type_ == "ExternalIP")
                    .or_else(|| addrs.iter().find(|a| a.type_ == "InternalIP"));
                if let Some(a) = pick {
                    out.insert(a.address.clone());
                }
            }
            out.into_iter().collect()
        }
    }
}

/// Per Ingress (namespace, name): the `resourceVersion` a successful status write was decided on.
pub type Written = HashMap<(String, String), String>;

/// Writes status for every Ingress that needs it; returns how many writes were made.
///
/// `written` carries what earlier calls wrote: an Ingress whose stored version is still the one a
/// write was decided on is skipped (the store has not caught up with that write yet).
///
/// Which Ingresses are owed an address is translation's verdict (`admitted`, from the last
/// rebuild), not decided again here: an Ingress translation dropped or shut out gets none.
pub async fn reconcile(
    client: &Client,
    ingresses: &Store<Ingress>,
    admitted: &BTreeSet<Key>,
    addrs: &[String],
    written: &mut Written,
) -> usize {
    let desired: Vec<IngressLoadBalancerIngress> = addrs.iter().map(|a| entry(a)).collect();
    let mut writes = 0;
    let state = ingresses.state();
    // Forget Ingresses that are gone. A set, not a scan per entry: with 10,000 Ingresses the
    // scan was 10^8 comparisons (1.4 s with the runtime's only thread held, measured by
    // `sluice-bench churn --source api --ingresses 10000` as a 1.4 s stall of every request).
    let present: std::collections::HashSet<(&str, &str)> = state
        .iter()
        .filter_map(|i| {
            Some((
                i.metadata.namespace.as_deref()?,
                i.metadata.name.as_deref()?,
            ))
        })
        .collect();
    written.retain(|(ns, name), _| present.contains(&(ns.as_str(), name.as_str())));
    drop(present);
    for ing in state {
        let ours = admitted.contains(&key_of(&ing.metadata));
        let cur = current(&ing);
        let target = if ours {
            if cur == desired || desired.is_empty() {
                continue;
            }
            json!({"status": {"loadBalancer": {"ingress": desired}}})
        } else {
            if cur.is_empty() || cur != desired {
                continue;
            }
            json!({"status": {"loadBalancer": {"ingress": null}}})
        };
        let (Some(ns), Some(name)) = (
            ing.metadata.namespace.as_deref(),
            ing.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let key = (ns.to_string(), name.to_string());
        let seen_rv = ing.metadata.resource_version.clone().unwrap_or_default();
        if written.get(&key).is_some_and(|rv| *rv == seen_rv) {
            // Decided on this very version already; its MODIFIED event has not arrived yet.
            continue;
        }
        let api: Api<Ingress> = Api::namespaced(client.clone(), ns);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&target))
            .await
        {
            Ok(_) => {
                writes += 1;
                written.insert(key, seen_rv);
                tracing::info!(ingress = %format!("{ns}/{name}"), ours, "ingress status written");
            }
            Err(e) => {
                tracing::warn!(ingress = %format!("{ns}/{name}"), error = %e, "writing ingress status failed; will retry")
            }
        }
    }
    writes
}

/// Runs status reconciliation while leader: after each rebuild (whose verdict says which
/// Ingresses are owed an address), on Ingress changes (a status someone else changed), on
/// becoming leader, and every `resync`. Nothing is written before the first rebuild: an empty
/// verdict then would clear every Ingress's status.
pub async fn run(
    client: Client,
    ingresses: Store<Ingress>,
    mut published: watch::Receiver<Published>,
    src: AddressSource,
    mut leader: watch::Receiver<bool>,
    mut changed: watch::Receiver<u64>,
    resync: Duration,
) {
    if matches!(src, AddressSource::None) {
        tracing::warn!(
            "no --publish-status-address and no POD_NAME/POD_NAMESPACE: Ingress status will not be written"
        );
    }
    if ingresses.wait_until_ready().await.is_err() {
        return;
    }
    let mut written = Written::new();
    loop {
        let verdict = {
            let p = published.borrow_and_update();
            (p.applies > 0).then(|| p.ingresses.clone())
        };
        let is_leader = *leader.borrow_and_update();
        match (is_leader, verdict) {
            (true, Some(admitted)) => {
                let addrs = addresses(&client, &src).await;
                reconcile(&client, &ingresses, &admitted, &addrs, &mut written).await;
            }
            (true, None) => {}
            // A new term starts from what the store says, not from an old term's memory.
            (false, _) => written.clear(),
        }
        tokio::select! {
            r = leader.changed() => if r.is_err() { return },
            r = changed.changed() => if r.is_err() { return },
            r = published.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(resync) => {}
        }
        // Let a burst of changes settle.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn emit_event(client: &Client, p: &Problem, reporting_pod: &str) {
    let ns = if p.object.namespace.is_empty() {
        "default".to_string()
    } else {
        p.object.namespace.clone()
    };
    let api_version = match p.object.kind {
        "Ingress" | "IngressClass" => "networking.k8s.io/v1",
        "GatewayClass" | "Gateway" | "HTTPRoute" => "gateway.networking.k8s.io/v1",
        "ReferenceGrant" => "gateway.networking.k8s.io/v1beta1",
        _ => "v1",
    };
    let now = Time(Timestamp::now());
    let ev = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", p.object.name)),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some(p.object.kind.to_string()),
            api_version: Some(api_version.to_string()),
            namespace: (!p.object.namespace.is_empty()).then(|| p.object.namespace.clone()),
            name: Some(p.object.name.clone()),
            field_path: (!p.field.is_empty()).then(|| p.field.clone()),
            ..ObjectReference::default()
        },
        reason: Some(p.reason.to_string()),
        message: Some(if p.field.is_empty() {
            p.message.clone()
        } else {
            format!("{}: {}", p.field, p.message)
        }),
        type_: Some(
            if p.severity == Severity::Error {
                "Warning"
            } else {
                "Normal"
            }
            .to_string(),
        ),
        source: Some(EventSource {
            component: Some("sluice".to_string()),
            host: None,
        }),
        reporting_component: Some("sluice.dev/ingress-controller".to_string()),
        reporting_instance: Some(reporting_pod.to_string()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api.create(&PostParams::default(), &ev).await {
        tracing::debug!(error = %e, "could not create an event");
    }
}
