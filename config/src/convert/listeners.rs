//! The Gateway (an `http` listener and an HTTPS listener per TLS host) and the
//! ReferenceGrants that let it read the Ingresses' Secrets.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::notes::{Note, Outcome};
use super::routes::{Plan, TlsHost, host_part};
use super::{ConvertOptions, GatewayObject, metadata, typed};

/// Most listeners a Gateway may have (the CRD's `maxItems`).
const MAX_LISTENERS: usize = 64;

/// The HTTPS listener of a TLS host.
pub(super) fn listener_name(host: &str) -> String {
    format!("https-{}", host_part(host))
}

/// Whether a wildcard Ingress host `*.s` covers `host` (one label, as Ingress wildcards).
fn wildcard_covers(pattern: &str, host: &str) -> bool {
    let (Some(suffix), Some((label, rest))) = (pattern.strip_prefix("*."), host.split_once('.'))
    else {
        return false;
    };
    !label.is_empty() && !label.contains('*') && rest.eq_ignore_ascii_case(suffix)
}

/// The HTTPS listener serving `host`: its own, else a wildcard's.
pub(super) fn covering(tls: &[TlsHost], host: &str) -> Option<String> {
    tls.iter()
        .find(|t| t.host.eq_ignore_ascii_case(host))
        .or_else(|| tls.iter().find(|t| wildcard_covers(&t.host, host)))
        .map(|t| listener_name(&t.host))
}

/// The Gateway and the ReferenceGrants of the Secrets in other namespaces.
pub(super) fn gateway_objects(
    plan: &Plan,
    opts: &ConvertOptions,
    notes: &mut Vec<Note>,
) -> Vec<GatewayObject> {
    let all = json!({"namespaces": {"from": "All"}});
    let mut listeners = vec![json!({
        "name": "http",
        "port": opts.http_port,
        "protocol": "HTTP",
        "allowedRoutes": all,
    })];
    let mut grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut tls = plan.tls.clone();
    tls.sort_by(|a, b| a.host.cmp(&b.host));
    let gw = format!("Gateway {}/{}", opts.gateway_namespace, opts.gateway_name);
    for t in &tls {
        if listeners.len() == MAX_LISTENERS {
            notes.push(Note::new(
                &gw,
                &format!("TLS host {}", t.host),
                Outcome::NoEquivalent(format!(
                    "a Gateway holds at most {MAX_LISTENERS} listeners: give this host a second Gateway (with an address of its own)"
                )),
            ));
            continue;
        }
        let (ns, secret) = &t.secret;
        let mut cert = json!({"kind": "Secret", "name": secret});
        if *ns != opts.gateway_namespace {
            cert["namespace"] = json!(ns);
            let names = grants.entry(ns.clone()).or_default();
            if !names.contains(secret) {
                names.push(secret.clone());
            }
        }
        listeners.push(json!({
            "name": listener_name(&t.host),
            "port": opts.https_port,
            "protocol": "HTTPS",
            "hostname": t.host,
            "tls": {"mode": "Terminate", "certificateRefs": [cert]},
            "allowedRoutes": all,
        }));
    }
    let mut out = Vec::new();
    let v = json!({
        "metadata": metadata(&opts.gateway_namespace, &opts.gateway_name, "Ingresses"),
        "spec": {"gatewayClassName": opts.gateway_class, "listeners": listeners},
    });
    if let Some(g) = typed(v, notes, &gw) {
        out.push(GatewayObject::Gateway(Box::new(g)));
    }
    for (ns, mut names) in grants {
        names.sort();
        let to: Vec<Value> = names
            .iter()
            .map(|n| json!({"group": "", "kind": "Secret", "name": n}))
            .collect();
        let v = json!({
            "metadata": metadata(&ns, &format!("{}-{}-certificates", opts.gateway_namespace, opts.gateway_name), "Ingresses"),
            "spec": {
                "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": opts.gateway_namespace}],
                "to": to,
            },
        });
        if let Some(g) = typed(v, notes, &gw) {
            out.push(GatewayObject::ReferenceGrant(Box::new(g)));
        }
    }
    out
}
