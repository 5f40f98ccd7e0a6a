#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::Ingress;
use serde_json::{Value, json};

use super::*;

fn ingress(ns: &str, name: &str, ann: &[(&str, &str)], spec: Value) -> Ingress {
    let a: BTreeMap<String, String> = ann
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": a},
        "spec": spec,
    }))
    .unwrap()
}

fn path(p: &str, t: &str, svc: &str, port: Value) -> Value {
    json!({"path": p, "pathType": t, "backend": {"service": {"name": svc, "port": port}}})
}

fn world() -> World {
    let mut w = World::new();
    w.put_ingress(ingress(
        "app",
        "web",
        &[("proxy-read-timeout", "5"), ("limit-rps", "10")],
        json!({
            "tls": [{"hosts": ["a.test"], "secretName": "a-tls"}],
            "rules": [{"host": "a.test", "http": {"paths": [
                path("/", "Prefix", "web", json!({"number": 80})),
                path("/api", "Exact", "api", json!({"name": "http"})),
            ]}}],
        }),
    ));
    w.put_ingress(ingress(
        "app",
        "web-canary",
        &[
            ("canary", "true"),
            ("canary-weight", "20"),
            ("canary-by-header", "X-Canary"),
        ],
        json!({"rules": [{"host": "a.test", "http": {"paths": [
            path("/", "Prefix", "web-v2", json!({"number": 80})),
        ]}}]}),
    ));
    w.put_ingress(ingress(
        "app",
        "old",
        &[("use-regex", "true"), ("rewrite-target", "/$2")],
        json!({
            "defaultBackend": {"service": {"name": "fallback", "port": {"number": 80}}},
            "rules": [{"host": "b.test", "http": {"paths": [
                path("/app(/|$)(.*)", "ImplementationSpecific", "web", json!({"number": 80})),
            ]}}],
        }),
    ));
    w.put_service(
        serde_json::from_value::<Service>(json!({
            "metadata": {"name": "api", "namespace": "app"},
            "spec": {"ports": [{"name": "http", "port": 8080}]},
        }))
        .unwrap(),
    );
    w.put_config_map(
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": {"name": "sluice", "namespace": "sluice-system"},
            "data": {"hsts": "true", "hsts-max-age": "600", "keep-alive": "30"},
        }))
        .unwrap(),
    );
    w
}

fn opts() -> ConvertOptions {
    ConvertOptions {
        config_map: Some(("sluice-system".into(), "sluice".into())),
        ..ConvertOptions::default()
    }
}

fn find(c: &Conversion, kind: &str, ns: &str, name: &str) -> Value {
    c.objects
        .iter()
        .find(|o| o.to_string() == format!("{kind} {ns}/{name}"))
        .map(GatewayObject::to_value)
        .unwrap_or_else(|| {
            let all: Vec<String> = c.objects.iter().map(ToString::to_string).collect();
            panic!("no {kind} {ns}/{name} in {all:?}")
        })
}

fn note<'a>(c: &'a Conversion, object: &str, item: &str) -> &'a Outcome {
    &c.notes
        .iter()
        .find(|n| n.object == object && n.item == item)
        .unwrap_or_else(|| panic!("no note for {object} {item}: {:#?}", c.notes))
        .outcome
}

#[test]
fn the_gateway_listens_for_every_tls_host_with_a_grant_for_each_secret() {
    let c = convert(&world(), &opts());
    let gw = find(&c, "Gateway", "sluice-system", "sluice");
    assert_eq!(gw["spec"]["gatewayClassName"], "sluice");
    let listeners = gw["spec"]["listeners"].as_array().unwrap();
    assert_eq!(listeners.len(), 2, "{listeners:#?}");
    assert_eq!(listeners[0]["name"], "http");
    assert_eq!(listeners[1]["name"], "https-a.test");
    assert_eq!(listeners[1]["hostname"], "a.test");
    assert_eq!(
        listeners[1]["tls"]["certificateRefs"][0],
        json!({"kind": "Secret", "name": "a-tls", "namespace": "app"})
    );
    let grant = find(
        &c,
        "ReferenceGrant",
        "app",
        "sluice-system-sluice-certificates",
    );
    assert_eq!(
        grant["spec"]["to"],
        json!([{"group": "", "kind": "Secret", "name": "a-tls"}])
    );
    assert_eq!(grant["spec"]["from"][0]["namespace"], "sluice-system");
}

#[test]
fn routes_carry_paths_canaries_timeouts_redirects_and_hsts() {
    let c = convert(&world(), &opts());
    let web = find(&c, "HTTPRoute", "app", "web");
    assert_eq!(web["spec"]["hostnames"], json!(["a.test"]));
    assert_eq!(web["spec"]["parentRefs"][0]["sectionName"], "https-a.test");
    let rules = web["spec"]["rules"].as_array().unwrap();
    // "/" with its canary: header always, header never, then the weights; then "/api".
    assert_eq!(rules.len(), 4, "{rules:#?}");
    assert_eq!(
        rules[0]["matches"][0]["headers"][0],
        json!({"type": "Exact", "name": "x-canary", "value": "always"})
    );
    assert_eq!(rules[0]["backendRefs"][0]["name"], "web-v2");
    assert_eq!(rules[1]["backendRefs"][0]["name"], "web");
    assert_eq!(
        rules[2]["backendRefs"],
        json!([{"name": "web", "port": 80, "weight": 80}, {"name": "web-v2", "port": 80, "weight": 20}])
    );
    assert_eq!(
        rules[3]["matches"][0]["path"],
        json!({"type": "Exact", "value": "/api"})
    );
    assert_eq!(
        rules[3]["backendRefs"][0]["port"], 8080,
        "named port resolved"
    );
    assert_eq!(rules[3]["timeouts"]["backendRequest"], "5s");
    assert_eq!(
        rules[3]["filters"][0]["responseHeaderModifier"]["set"][0]["value"],
        "max-age=600; includeSubDomains"
    );
    let http = find(&c, "HTTPRoute", "app", "web-http");
    assert_eq!(http["spec"]["parentRefs"][0]["sectionName"], "http");
    assert_eq!(
        http["spec"]["rules"][0]["filters"][0]["requestRedirect"],
        json!({"scheme": "https", "statusCode": 308})
    );
    let old = find(&c, "HTTPRoute", "app", "old");
    assert_eq!(
        old["spec"]["rules"][0]["matches"][0]["path"],
        json!({"type": "PathPrefix", "value": "/app"})
    );
    assert_eq!(
        old["spec"]["rules"][0]["filters"][0]["urlRewrite"]["path"],
        json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"})
    );
    let db = find(&c, "HTTPRoute", "app", "old-default-backend");
    assert!(db["spec"].get("hostnames").is_none());
    assert!(db["spec"]["parentRefs"][0].get("sectionName").is_none());
}

#[test]
fn the_report_says_what_has_no_equivalent_and_why() {
    let c = convert(&world(), &opts());
    assert!(!c.lossless());
    let web = "Ingress app/web";
    let limit = note(&c, web, "nginx.ingress.kubernetes.io/limit-rps");
    assert!(
        matches!(limit, Outcome::NoEquivalent(w) if w.contains("no Gateway API equivalent")),
        "{limit:?}"
    );
    assert!(matches!(
        note(&c, web, "nginx.ingress.kubernetes.io/proxy-read-timeout"),
        Outcome::Converted(_)
    ));
    assert!(matches!(
        note(&c, "Ingress app/web-canary", "nginx.ingress.kubernetes.io/canary-weight"),
        Outcome::Converted(w) if w.contains("HTTPRoute app/web")
    ));
    let cm = "ConfigMap sluice-system/sluice";
    assert!(matches!(note(&c, cm, "hsts"), Outcome::Converted(_)));
    assert!(matches!(
        note(&c, cm, "keep-alive"),
        Outcome::NoEquivalent(_)
    ));
}

#[test]
fn converting_the_output_again_gives_the_output() {
    let first = convert(&world(), &opts());
    let mut again = World::new();
    for o in &first.objects {
        match o.clone() {
            GatewayObject::Gateway(g) => {
                again
                    .gateways
                    .insert(crate::world::key_of(&g.metadata), (*g).into());
            }
            GatewayObject::ReferenceGrant(g) => {
                again
                    .reference_grants
                    .insert(crate::world::key_of(&g.metadata), (*g).into());
            }
            GatewayObject::HttpRoute(r) => {
                again
                    .http_routes
                    .insert(crate::world::key_of(&r.metadata), (*r).into());
            }
        }
    }
    let second = convert(&again, &ConvertOptions::default());
    assert_eq!(second.objects, first.objects);
    assert!(second.notes.is_empty(), "{:#?}", second.notes);
    // And with the Ingresses still there: the same objects, nothing doubled.
    let mut both = world();
    both.gateways = again.gateways.clone();
    both.http_routes = again.http_routes.clone();
    both.reference_grants = again.reference_grants.clone();
    assert_eq!(convert(&both, &opts()).objects, first.objects);
}

#[test]
fn redirect_annotations_become_request_redirects() {
    let mut w = World::new();
    w.put_ingress(ingress(
        "app",
        "moved",
        &[("permanent-redirect", "https://new.test:8443/x"), ("permanent-redirect-code", "308")],
        json!({"rules": [{"host": "m.test", "http": {"paths": [path("/", "Prefix", "web", json!({"number": 80}))]}}]}),
    ));
    w.put_ingress(ingress(
        "app",
        "odd",
        &[("temporal-redirect", "https://x.test/?a=1")],
        json!({"rules": [{"host": "o.test", "http": {"paths": [path("/", "Prefix", "web", json!({"number": 80}))]}}]}),
    ));
    let c = convert(&w, &ConvertOptions::default());
    let r = find(&c, "HTTPRoute", "app", "moved");
    assert_eq!(
        r["spec"]["rules"][0]["filters"][0]["requestRedirect"],
        json!({"statusCode": 308, "scheme": "https", "hostname": "new.test", "port": 8443, "path": {"type": "ReplaceFullPath", "replaceFullPath": "/x"}})
    );
    assert!(matches!(
        note(&c, "Ingress app/odd", "nginx.ingress.kubernetes.io/temporal-redirect"),
        Outcome::NoEquivalent(w) if w.contains("query")
    ));
}

#[test]
fn access_control_that_cannot_convert_closes_the_route_never_opens_it() {
    let mut w = World::new();
    let p = json!({"rules": [{"host": "x.test", "http": {"paths": [path("/", "Prefix", "web", json!({"number": 80}))]}}]});
    w.put_ingress(ingress(
        "app",
        "basic",
        &[("auth-type", "basic"), ("auth-secret", "users")],
        p.clone(),
    ));
    w.put_ingress(ingress(
        "app",
        "allow",
        &[("whitelist-source-range", "10.0.0.0/8")],
        p.clone(),
    ));
    w.put_ingress(ingress("app", "free", &[], json!({"rules": [{"host": "y.test", "http": {"paths": [path("/", "Prefix", "web", json!({"number": 80}))]}}]})));
    let c = convert(&w, &ConvertOptions::default());
    for name in ["basic", "allow"] {
        let r = find(&c, "HTTPRoute", "app", name);
        let rule = &r["spec"]["rules"][0];
        assert!(rule.get("backendRefs").is_none(), "{name}: {r:#}");
        assert!(rule.get("filters").is_none(), "{name}: {r:#}");
    }
    assert!(matches!(
        note(&c, "Ingress app/basic", "nginx.ingress.kubernetes.io/auth-type"),
        Outcome::NoEquivalent(w) if w.contains("closed")
    ));
    assert!(
        find(&c, "HTTPRoute", "app", "free")["spec"]["rules"][0]
            .get("backendRefs")
            .is_some()
    );

    // Global authentication from the ConfigMap closes every route that does not opt out.
    w.put_config_map(
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": {"name": "c", "namespace": "s"},
            "data": {"global-auth-url": "http://auth.test/check"},
        }))
        .unwrap(),
    );
    w.put_ingress(ingress("app", "optout", &[("enable-global-auth", "false")], json!({"rules": [{"host": "z.test", "http": {"paths": [path("/", "Prefix", "web", json!({"number": 80}))]}}]})));
    let o = ConvertOptions {
        config_map: Some(("s".into(), "c".into())),
        ..ConvertOptions::default()
    };
    let c = convert(&w, &o);
    assert!(
        find(&c, "HTTPRoute", "app", "free")["spec"]["rules"][0]
            .get("backendRefs")
            .is_none()
    );
    assert!(
        find(&c, "HTTPRoute", "app", "optout")["spec"]["rules"][0]
            .get("backendRefs")
            .is_some()
    );
    assert!(matches!(
        note(&c, "ConfigMap s/c", "global-auth-url"),
        Outcome::NoEquivalent(_)
    ));
}

#[test]
fn wildcard_hosts_and_unresolvable_ports_are_reported() {
    let mut w = World::new();
    w.put_ingress(ingress(
        "app",
        "wild",
        &[],
        json!({"rules": [{"host": "*.w.test", "http": {"paths": [
            path("/", "Prefix", "web", json!({"number": 80})),
            path("/named", "Prefix", "missing", json!({"name": "http"})),
        ]}}]}),
    ));
    let c = convert(&w, &ConvertOptions::default());
    assert!(matches!(
        note(&c, "Ingress app/wild", "host *.w.test"),
        Outcome::Approximated(_)
    ));
    assert!(matches!(
        note(&c, "Ingress app/wild", "spec.rules[0].http.paths[1]"),
        Outcome::NoEquivalent(w) if w.contains("by number")
    ));
    let r = find(&c, "HTTPRoute", "app", "wild");
    assert_eq!(r["spec"]["rules"].as_array().unwrap().len(), 1);
}
