//! Translation of authentication: the controller ConfigMap's global `auth-url` given to every
//! Ingress that does not opt out or bring its own, skipped on `no-auth-locations`, and closing
//! the Ingresses it would protect when it cannot be honoured.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use super::tests::{base_world, opts, service, simple};
use super::tests_traffic::annotated;
use super::*;
use crate::route_policy::Auth;

fn world_with_global(data: serde_json::Value) -> (World, TranslateOptions) {
    let mut w = base_world();
    w.put_service(service(
        "auth",
        "oauth",
        json!([{"port": 80, "name": "http"}]),
    ));
    w.put_ingress(simple(
        "plain",
        "plain.test",
        &[
            ("/", "Prefix", "a"),
            ("/.well-known/acme-challenge", "Prefix", "b"),
        ],
    ));
    w.put_ingress(annotated(
        simple("optout", "optout.test", &[("/", "Prefix", "a")]),
        &[("enable-global-auth", "false")],
    ));
    w.put_ingress(annotated(
        simple("own", "own.test", &[("/", "Prefix", "a")]),
        &[("auth-url", "http://oauth.auth.svc/own")],
    ));
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"namespace": "sluice-system", "name": "sluice"},
        "data": data,
    }))
    .unwrap_or_default();
    w.put_config_map(cm);
    let mut o = opts();
    o.configmap = Some(ObjectRef::new("ConfigMap", "sluice-system", "sluice"));
    (w, o)
}

fn auth_path(s: &Snapshot, host: &str, path: &str) -> Option<String> {
    let r = s.route(host, path)?;
    match &r.options.edits.auth {
        Some(Auth::External(e)) => Some(e.path.clone()),
        _ => None,
    }
}

#[test]
fn global_auth_covers_every_ingress_that_does_not_opt_out() {
    let (w, o) = world_with_global(json!({
        "global-auth-url": "http://oauth.auth.svc/global",
        "global-auth-response-headers": "X-User",
    }));
    let s = translate(&w, &o);
    assert_eq!(auth_path(&s, "plain.test", "/").as_deref(), Some("/global"));
    assert_eq!(
        auth_path(&s, "plain.test", "/.well-known/acme-challenge/x"),
        None,
        "no-auth-locations (default: ACME challenges) skips it"
    );
    assert_eq!(auth_path(&s, "optout.test", "/"), None);
    assert_eq!(auth_path(&s, "own.test", "/").as_deref(), Some("/own"));
    let Some(Auth::External(e)) = &s
        .route("plain.test", "/")
        .and_then(|r| r.options.edits.auth.clone())
    else {
        panic!("no global auth");
    };
    assert_eq!(e.options.response_headers, ["x-user"]);
}

#[test]
fn global_auth_that_cannot_be_honoured_closes_what_it_would_protect() {
    for data in [
        json!({"global-auth-url": "https://oauth.auth.svc/"}),
        json!({"global-auth-url": "http://oauth.auth.svc/", "global-auth-snippet": "return 200;"}),
    ] {
        let (w, o) = world_with_global(data.clone());
        let s = translate(&w, &o);
        let plain = s.route("plain.test", "/").map(|r| r.action.clone());
        assert!(
            matches!(plain, Some(crate::model::RouteAction::Unavailable(_))),
            "{data}: {plain:?}"
        );
        let optout = s.route("optout.test", "/").map(|r| r.action.clone());
        assert!(
            matches!(optout, Some(crate::model::RouteAction::Cluster(_))),
            "{data}: opted out, so served"
        );
    }
    // The other keys without the URL: reported, nothing applied.
    let (w, o) = world_with_global(json!({"global-auth-signin": "https://login.test/"}));
    let s = translate(&w, &o);
    assert_eq!(auth_path(&s, "plain.test", "/"), None);
    assert!(
        s.problems()
            .iter()
            .any(|p| p.field == "data[global-auth-url]")
    );
}

/// Ingresses naming objects of another namespace: a Secret, a Service for `auth-url`, a
/// ConfigMap for `custom-headers`.
fn cross_namespace_world() -> World {
    let mut w = base_world();
    w.put_service(service(
        "auth",
        "oauth",
        json!([{"port": 80, "name": "http"}]),
    ));
    w.put_ingress(annotated(
        simple("ext", "ext.test", &[("/", "Prefix", "a")]),
        &[("auth-url", "http://oauth.auth.svc/check")],
    ));
    w.put_ingress(annotated(
        simple("hdr", "hdr.test", &[("/", "Prefix", "a")]),
        &[("custom-headers", "other/fields")],
    ));
    w.put_ingress(annotated(
        simple("sec", "sec.test", &[("/", "Prefix", "a")]),
        &[("auth-type", "basic"), ("auth-secret", "other/users")],
    ));
    w
}

fn closed(s: &Snapshot, host: &str) -> bool {
    matches!(
        s.route(host, "/").map(|r| &r.action),
        Some(crate::model::RouteAction::Unavailable(_))
    )
}

#[test]
fn under_namespace_ownership_nothing_of_another_namespace_is_read() {
    let w = cross_namespace_world();
    let mut o = opts();
    o.host_ownership = HostOwnership::Namespace;
    let s = translate(&w, &o);
    for host in ["ext.test", "hdr.test", "sec.test"] {
        assert!(closed(&s, host), "{host}");
    }
    let refusals: Vec<&str> = s
        .problems()
        .iter()
        .filter(|p| p.reason == "CrossNamespaceReference")
        .map(|p| p.message.as_str())
        .collect();
    assert_eq!(refusals.len(), 3, "{refusals:?}");
    assert!(
        refusals
            .iter()
            .all(|m| m.contains("namespaces own their hosts")),
        "{refusals:?}"
    );
    // Decided before any lookup: a Secret that does not exist is not told apart from one that
    // does.
    assert!(
        !s.problems().iter().any(|p| p.message.contains("not found")),
        "{:?}",
        s.problems()
    );
}

#[test]
fn shared_hosts_reach_other_services_but_not_other_secrets_unless_allowed() {
    let w = cross_namespace_world();
    let s = translate(&w, &opts());
    assert!(
        !closed(&s, "ext.test"),
        "an auth Service of another namespace"
    );
    assert!(closed(&s, "sec.test"), "a Secret of another namespace");
    assert!(
        s.problems()
            .iter()
            .any(|p| p.reason == "CrossNamespaceReference"
                && p.message.contains("allow-cross-namespace-resources")),
        "{:?}",
        s.problems()
    );
    let mut w = w;
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"namespace": "sluice-system", "name": "sluice"},
        "data": {"allow-cross-namespace-resources": "true"},
    }))
    .unwrap_or_default();
    w.put_config_map(cm);
    let mut o = opts();
    o.configmap = Some(ObjectRef::new("ConfigMap", "sluice-system", "sluice"));
    let s = translate(&w, &o);
    assert!(
        !s.problems()
            .iter()
            .any(|p| p.reason == "CrossNamespaceReference"),
        "{:?}",
        s.problems()
    );
    // Allowed, the Secret is looked up (and is missing here): still closed, for that reason.
    assert!(closed(&s, "sec.test"));
}

#[test]
fn the_configmaps_source_ranges_are_each_ingresses_default_list() {
    let mut w = base_world();
    w.put_ingress(simple("plain", "plain.test", &[("/", "Prefix", "a")]));
    w.put_ingress(annotated(
        simple("own", "own.test", &[("/", "Prefix", "a")]),
        &[("whitelist-source-range", "192.0.2.0/24")],
    ));
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"namespace": "sluice-system", "name": "sluice"},
        "data": {
            "whitelist-source-range": "10.0.0.0/8",
            "denylist-source-range": "10.1.0.0/16",
            "block-cidrs": "198.51.100.0/24",
        },
    }))
    .unwrap_or_default();
    w.put_config_map(cm);
    let mut o = opts();
    o.configmap = Some(ObjectRef::new("ConfigMap", "sluice-system", "sluice"));
    let s = translate(&w, &o);
    let ranges = |host: &str| {
        s.route(host, "/")
            .and_then(|r| r.options.edits.source_ranges.clone())
            .map(|r| {
                (
                    r.allow.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    r.deny.iter().map(ToString::to_string).collect::<Vec<_>>(),
                )
            })
    };
    assert_eq!(
        ranges("plain.test"),
        Some((vec!["10.0.0.0/8".into()], vec!["10.1.0.0/16".into()]))
    );
    assert_eq!(
        ranges("own.test"),
        Some((vec!["192.0.2.0/24".into()], vec!["10.1.0.0/16".into()])),
        "the Ingress's own allowlist, the ConfigMap's denylist"
    );
    assert_eq!(s.settings().block_cidrs.len(), 1);
    assert!(
        !s.problems()
            .iter()
            .any(|p| p.message.contains("sluice does not know")),
        "{:?}",
        s.problems()
    );
}
