//! `--host-ownership namespace`: a host belongs to the namespace of the oldest of our Ingresses
//! that names it (in a rule or a TLS section). Ingresses in other namespaces cannot add paths to
//! it or bind a certificate to it: their rules for that host are ignored, with an Error (so a
//! Warning Event) naming the owner, and an Ingress left with nothing of its own gets no status.
//! Without the option (`shared`, the default) rules for one host merge across namespaces, as the
//! Ingress API specifies; in a cluster shared by teams that lets any namespace take over paths of
//! another's host.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::Ingress;

use crate::host::parse_rule_host;
use crate::model::HostMatch;

/// Who may define routes for a host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HostOwnership {
    /// Rules merge across namespaces (the Ingress API's semantics).
    #[default]
    Shared,
    /// The first namespace to claim a host keeps it.
    Namespace,
}

/// Host → owning namespace, from Ingresses already filtered to ours and sorted oldest first.
#[derive(Debug, Default)]
pub struct Owners(BTreeMap<HostMatch, String>);

impl Owners {
    /// Claims in age order: each host goes to the first Ingress that names it.
    pub fn claim(oldest_first: &[&Ingress]) -> Self {
        let mut owners = BTreeMap::new();
        for ing in oldest_first {
            let ns = ing.metadata.namespace.clone().unwrap_or_default();
            for host in hosts_named(ing) {
                owners.entry(host).or_insert_with(|| ns.clone());
            }
        }
        Self(owners)
    }

    /// The namespace that owns `host`, when another than `namespace` does.
    pub fn other_owner(&self, host: &HostMatch, namespace: &str) -> Option<&str> {
        self.0
            .get(host)
            .map(String::as_str)
            .filter(|owner| *owner != namespace)
    }

    /// Whether every host `ing` names belongs to another namespace (and it has no default
    /// backend): nothing of it is served, so it gets no status.
    pub fn shuts_out(&self, ing: &Ingress) -> bool {
        let ns = ing.metadata.namespace.as_deref().unwrap_or_default();
        let has_default = ing
            .spec
            .as_ref()
            .is_some_and(|s| s.default_backend.is_some());
        let hosts = hosts_named(ing);
        !has_default && !hosts.is_empty() && hosts.iter().all(|h| self.other_owner(h, ns).is_some())
    }
}

/// The specific hosts an Ingress names in its rules and TLS sections (not `*` alone: a rule
/// without a host matches every request and is owned by nobody).
fn hosts_named(ing: &Ingress) -> Vec<HostMatch> {
    let Some(spec) = &ing.spec else {
        return Vec::new();
    };
    let rules = spec
        .rules
        .iter()
        .flatten()
        .filter_map(|r| r.host.as_deref());
    let tls = spec
        .tls
        .iter()
        .flatten()
        .flat_map(|t| t.hosts.iter().flatten().map(String::as_str));
    rules
        .chain(tls)
        .filter_map(|h| parse_rule_host(h).ok())
        .filter(|h| *h != HostMatch::Any)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::model::RouteAction;
    use crate::translate::{TranslateOptions, translate};
    use crate::world::World;

    fn ing(ns: &str, name: &str, ts: &str, host: &str, path: &str, tls: bool) -> Ingress {
        let mut spec = json!({"ingressClassName": "sluice", "rules": [{"host": host, "http": {"paths": [
            {"path": path, "pathType": "Prefix", "backend": {"service": {"name": "svc", "port": {"number": 80}}}}]}}]});
        if tls {
            spec["tls"] = json!([{"hosts": [host], "secretName": "cert"}]);
        }
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name, "creationTimestamp": ts}, "spec": spec}))
            .unwrap()
    }

    fn world(ingresses: Vec<Ingress>) -> World {
        let mut w = World::new();
        w.put_ingress_class(
            serde_json::from_value::<k8s_openapi::api::networking::v1::IngressClass>(
                json!({"metadata": {"name": "sluice"},
                "spec": {"controller": crate::translate::DEFAULT_CONTROLLER_NAME}}),
            )
            .unwrap(),
        );
        for ns in ["team-a", "team-b"] {
            w.put_service(
                serde_json::from_value::<k8s_openapi::api::core::v1::Service>(
                    json!({"metadata": {"namespace": ns, "name": "svc"},
                    "spec": {"ports": [{"port": 80}]}}),
                )
                .unwrap(),
            );
        }
        for i in ingresses {
            w.put_ingress(i);
        }
        w
    }

    fn served_by(s: &crate::snapshot::Snapshot, host: &str, path: &str) -> Option<String> {
        s.route(host, path).map(|r| match &r.action {
            RouteAction::Cluster(k) => k.namespace.clone(),
            RouteAction::Unavailable(m) => m.clone(),
        })
    }

    #[test]
    fn the_first_namespace_keeps_its_host_and_others_are_told_why() {
        let w = world(vec![
            ing(
                "team-a",
                "shop",
                "2026-01-01T00:00:00Z",
                "shop.example",
                "/",
                true,
            ),
            ing(
                "team-b",
                "grab",
                "2026-02-01T00:00:00Z",
                "shop.example",
                "/admin",
                true,
            ),
            ing(
                "team-b",
                "own",
                "2026-02-01T00:00:00Z",
                "b.example",
                "/",
                false,
            ),
            ing(
                "team-a",
                "more",
                "2026-03-01T00:00:00Z",
                "shop.example",
                "/more",
                false,
            ),
        ]);
        // Shared (the Ingress API): team-b's newer /admin rule joins team-a's host.
        let shared = translate(&w, &TranslateOptions::default());
        assert_eq!(
            served_by(&shared, "shop.example", "/admin").as_deref(),
            Some("team-b")
        );

        let opts = TranslateOptions {
            host_ownership: HostOwnership::Namespace,
            ..TranslateOptions::default()
        };
        let s = translate(&w, &opts);
        assert_eq!(
            served_by(&s, "shop.example", "/admin").as_deref(),
            Some("team-a"),
            "falls to team-a's /"
        );
        assert_eq!(
            served_by(&s, "shop.example", "/more").as_deref(),
            Some("team-a"),
            "the owner adds paths"
        );
        assert_eq!(
            served_by(&s, "b.example", "/").as_deref(),
            Some("team-b"),
            "its own host"
        );
        let refused: Vec<_> = s
            .problems()
            .iter()
            .filter(|p| p.reason == "HostOwnedByAnotherNamespace")
            .collect();
        assert_eq!(refused.len(), 2, "the rule and the TLS host: {refused:?}");
        assert!(
            refused
                .iter()
                .all(|p| p.object.name == "grab" && p.message.contains("team-a"))
        );
        assert!(
            s.tls().iter().all(|b| b.secret.namespace == "team-a"),
            "team-b cannot bind its certificate to team-a's host: {:?}",
            s.tls()
        );

        let grab = w
            .ingresses
            .values()
            .find(|i| i.metadata.name.as_deref() == Some("grab"))
            .unwrap();
        let own = w
            .ingresses
            .values()
            .find(|i| i.metadata.name.as_deref() == Some("own"))
            .unwrap();
        let owners =
            crate::translate::host_owners(&w, w.ingresses.values().map(|i| i.as_ref()), &opts)
                .unwrap();
        assert!(owners.shuts_out(grab), "nothing of it is served: no status");
        assert!(!owners.shuts_out(own));
        assert!(
            crate::translate::host_owners(
                &w,
                w.ingresses.values().map(|i| i.as_ref()),
                &TranslateOptions::default()
            )
            .is_none()
        );
    }
}
