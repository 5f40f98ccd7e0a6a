//! Table tests for the Ingress v1 semantics and property tests for translation.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::host::host_matches;
use crate::model::HostMatch;
use crate::model::{ClusterKey, EndpointState, RouteAction};
use crate::path::{match_rank, path_matches};

type Row<'a> = (&'a [(&'a str, &'a str, &'a str)], &'a str, Option<&'a str>);

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

pub(crate) fn class(name: &str, controller: &str, default: bool) -> IngressClass {
    let mut v = json!({"metadata": {"name": name}, "spec": {"controller": controller}});
    if default {
        v["metadata"]["annotations"] =
            json!({"ingressclass.kubernetes.io/is-default-class": "true"});
    }
    from(v)
}

pub(crate) fn ingress(ns: &str, name: &str, spec: Value) -> Ingress {
    from(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}))
}

fn ingress_at(ns: &str, name: &str, ts: &str, spec: Value) -> Ingress {
    from(
        json!({"metadata": {"namespace": ns, "name": name, "creationTimestamp": ts}, "spec": spec}),
    )
}

/// An Ingress of class `sluice` with one rule.
pub(crate) fn simple(name: &str, host: &str, paths: &[(&str, &str, &str)]) -> Ingress {
    let paths: Vec<Value> = paths
        .iter()
        .map(|(path, ty, svc)| json!({"path": path, "pathType": ty, "backend": {"service": {"name": svc, "port": {"number": 80}}}}))
        .collect();
    ingress(
        "default",
        name,
        json!({"ingressClassName": "sluice", "rules": [{"host": host, "http": {"paths": paths}}]}),
    )
}

pub(crate) fn service(ns: &str, name: &str, ports: Value) -> Service {
    from(json!({"metadata": {"namespace": ns, "name": name}, "spec": {"ports": ports}}))
}

pub(crate) fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    ports: Value,
    endpoints: Value,
) -> EndpointSlice {
    from(json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
    }))
}

pub(crate) fn base_world() -> World {
    let mut w = World::new();
    w.put_ingress_class(class("sluice", DEFAULT_CONTROLLER_NAME, false));
    for svc in ["a", "b", "c", "d"] {
        w.put_service(service(
            "default",
            svc,
            json!([{"port": 80, "name": "http"}]),
        ));
    }
    w
}

pub(crate) fn opts() -> TranslateOptions {
    TranslateOptions::default()
}

/// Which Service answers, `None` for 404.
pub(crate) fn hit(s: &Snapshot, host: &str, path: &str) -> Option<String> {
    s.route(host, path).map(|r| match &r.action {
        RouteAction::Cluster(k) => k.service.clone(),
        RouteAction::Unavailable(m) => format!("503:{m}"),
    })
}

/// Every row of the path-matching examples table of the Kubernetes Ingress documentation.
#[test]
fn kubernetes_path_matching_table() {
    // (rules as (path, type, service), request path, expected service or None)
    let rows: &[Row] = &[
        (&[("/", "Prefix", "a")], "/anything/at/all", Some("a")),
        (&[("/foo", "Exact", "a")], "/foo", Some("a")),
        (&[("/foo", "Exact", "a")], "/bar", None),
        (&[("/foo", "Exact", "a")], "/foo/", None),
        (&[("/foo/", "Exact", "a")], "/foo", None),
        (&[("/foo", "Prefix", "a")], "/foo", Some("a")),
        (&[("/foo", "Prefix", "a")], "/foo/", Some("a")),
        (&[("/foo/", "Prefix", "a")], "/foo", Some("a")),
        (&[("/foo/", "Prefix", "a")], "/foo/", Some("a")),
        (&[("/aaa/bb", "Prefix", "a")], "/aaa/bbb", None),
        (&[("/aaa/bbb", "Prefix", "a")], "/aaa/bbb", Some("a")),
        (&[("/aaa/bbb/", "Prefix", "a")], "/aaa/bbb", Some("a")),
        (&[("/aaa/bbb", "Prefix", "a")], "/aaa/bbb/", Some("a")),
        (&[("/aaa/bbb", "Prefix", "a")], "/aaa/bbb/ccc", Some("a")),
        (&[("/aaa/bbb", "Prefix", "a")], "/aaa/bbbxyz", None),
        (
            &[("/", "Prefix", "a"), ("/aaa", "Prefix", "b")],
            "/aaa/ccc",
            Some("b"),
        ),
        (
            &[
                ("/", "Prefix", "a"),
                ("/aaa", "Prefix", "b"),
                ("/aaa/bbb", "Prefix", "c"),
            ],
            "/aaa/bbb",
            Some("c"),
        ),
        (
            &[
                ("/", "Prefix", "a"),
                ("/aaa", "Prefix", "b"),
                ("/aaa/bbb", "Prefix", "c"),
            ],
            "/ccc",
            Some("a"),
        ),
        (&[("/aaa", "Prefix", "a")], "/ccc", None),
        (
            &[("/foo", "Prefix", "a"), ("/foo", "Exact", "b")],
            "/foo",
            Some("b"),
        ),
        // Not in the table but stated by the spec: ImplementationSpecific behaves as Prefix here.
        (
            &[("/foo", "ImplementationSpecific", "a")],
            "/foo/bar",
            Some("a"),
        ),
        (&[("/foo", "ImplementationSpecific", "a")], "/foobar", None),
    ];
    for (i, (rules, req, want)) in rows.iter().enumerate() {
        let mut w = base_world();
        w.put_ingress(simple("t", "", rules));
        let s = translate(&w, &opts());
        assert_eq!(
            hit(&s, "example.com", req).as_deref(),
            *want,
            "row {i}: {rules:?} with {req}"
        );
        // Same answer with the rules in reverse order.
        let mut rev: Vec<_> = rules.to_vec();
        rev.reverse();
        let mut w = base_world();
        w.put_ingress(simple("t", "", &rev));
        let s = translate(&w, &opts());
        assert_eq!(
            hit(&s, "example.com", req).as_deref(),
            *want,
            "row {i} reversed"
        );
    }
}

#[test]
fn wildcard_and_exact_hosts() {
    let mut w = base_world();
    w.put_ingress(simple("wild", "*.foo.com", &[("/", "Prefix", "a")]));
    w.put_ingress(simple("exact", "bar.foo.com", &[("/", "Prefix", "b")]));
    let s = translate(&w, &opts());
    assert_eq!(
        hit(&s, "bar.foo.com", "/").as_deref(),
        Some("b"),
        "exact beats wildcard"
    );
    assert_eq!(hit(&s, "baz.foo.com", "/").as_deref(), Some("a"));
    assert_eq!(
        hit(&s, "baz.bar.foo.com", "/"),
        None,
        "wildcard covers one label only"
    );
    assert_eq!(hit(&s, "foo.com", "/"), None);
    assert_eq!(
        hit(&s, "BAZ.Foo.COM:8443", "/").as_deref(),
        Some("a"),
        "case and port ignored"
    );
}

#[test]
fn host_with_port_upper_case_and_query_strings() {
    let mut w = base_world();
    w.put_ingress(simple(
        "t",
        "Example.com",
        &[("/app", "Prefix", "a"), ("/exact", "Exact", "b")],
    ));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "example.com:8080", "/app/x").as_deref(), Some("a"));
    assert_eq!(hit(&s, "EXAMPLE.COM", "/app?x=/y").as_deref(), Some("a"));
    assert_eq!(hit(&s, "example.com", "/exact?q=1").as_deref(), Some("b"));
    assert_eq!(
        hit(&s, "example.com.", "/exact").as_deref(),
        Some("b"),
        "trailing dot"
    );
    assert_eq!(hit(&s, "other.com", "/app"), None);
}

#[test]
fn host_less_rules_serve_every_host_and_catch_fallthrough() {
    let mut w = base_world();
    w.put_ingress(simple("any", "", &[("/", "Prefix", "a")]));
    w.put_ingress(simple("api", "api.example.com", &[("/api", "Prefix", "b")]));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "whatever.test", "/x").as_deref(), Some("a"));
    assert_eq!(hit(&s, "", "/x").as_deref(), Some("a"), "no Host at all");
    assert_eq!(hit(&s, "api.example.com", "/api/v1").as_deref(), Some("b"));
    assert_eq!(
        hit(&s, "api.example.com", "/other").as_deref(),
        Some("a"),
        "falls through to host-less"
    );
}

#[test]
fn rules_merge_across_ingresses_and_conflicts_pick_the_oldest() {
    let mut w = base_world();
    let rule = |svc: &str, path: &str| json!({"ingressClassName": "sluice", "rules": [{"host": "m.example.com", "http": {"paths": [{"path": path, "pathType": "Prefix", "backend": {"service": {"name": svc, "port": {"number": 80}}}}]}}]});
    w.put_ingress(ingress_at(
        "default",
        "young",
        "2024-02-01T00:00:00Z",
        rule("b", "/"),
    ));
    w.put_ingress(ingress_at(
        "default",
        "old",
        "2024-01-01T00:00:00Z",
        rule("a", "/"),
    ));
    w.put_ingress(ingress_at(
        "default",
        "other",
        "2024-03-01T00:00:00Z",
        rule("c", "/c"),
    ));
    let s = translate(&w, &opts());
    assert_eq!(
        hit(&s, "m.example.com", "/").as_deref(),
        Some("a"),
        "oldest wins"
    );
    assert_eq!(
        hit(&s, "m.example.com", "/c/d").as_deref(),
        Some("c"),
        "merged from a third Ingress"
    );
    let conflicts: Vec<_> = s
        .problems()
        .iter()
        .filter(|p| p.reason == "Conflict")
        .collect();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].object.name, "young");
    // Same timestamps: namespace/name decides.
    let mut w = base_world();
    w.put_ingress(ingress("default", "zz", rule("b", "/")));
    w.put_ingress(ingress("default", "aa", rule("a", "/")));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "m.example.com", "/").as_deref(), Some("a"));
}

#[test]
fn ingress_class_selection() {
    let paths = json!([{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]);
    let with = |host: &str, extra: Value| {
        let mut spec = json!({"rules": [{"host": host, "http": {"paths": paths.clone()}}]});
        if let Some(c) = extra.get("class") {
            spec["ingressClassName"] = c.clone();
        }
        let mut v = json!({"metadata": {"namespace": "default", "name": host}, "spec": spec});
        if let Some(a) = extra.get("annotation") {
            v["metadata"]["annotations"] = json!({"kubernetes.io/ingress.class": a});
        }
        from::<Ingress>(v)
    };
    let mut w = World::new();
    w.put_service(service("default", "a", json!([{"port": 80}])));
    w.put_ingress_class(class("sluice", DEFAULT_CONTROLLER_NAME, false));
    w.put_ingress_class(class("nginx", "k8s.io/ingress-nginx", true));
    w.put_ingress(with("field.test", json!({"class": "sluice"})));
    w.put_ingress(with("foreign.test", json!({"class": "nginx"})));
    w.put_ingress(with("missing-class.test", json!({"class": "nope"})));
    w.put_ingress(with("annotation.test", json!({"annotation": "sluice"})));
    w.put_ingress(with(
        "foreign-annotation.test",
        json!({"annotation": "nginx"}),
    ));
    w.put_ingress(with("classless.test", json!({})));
    let s = translate(&w, &opts());
    assert!(hit(&s, "field.test", "/").is_some());
    assert!(hit(&s, "annotation.test", "/").is_some());
    assert!(hit(&s, "foreign.test", "/").is_none());
    assert!(hit(&s, "missing-class.test", "/").is_none());
    assert!(hit(&s, "foreign-annotation.test", "/").is_none());
    assert!(
        hit(&s, "classless.test", "/").is_none(),
        "the default class is not ours"
    );
    // Make ours the default: class-less Ingresses become ours, annotated foreign ones stay foreign.
    w.put_ingress_class(class("nginx", "k8s.io/ingress-nginx", false));
    w.put_ingress_class(class("sluice", DEFAULT_CONTROLLER_NAME, true));
    let s = translate(&w, &opts());
    assert!(hit(&s, "classless.test", "/").is_some());
    assert!(hit(&s, "foreign-annotation.test", "/").is_none());
    assert!(hit(&s, "foreign.test", "/").is_none());
}

fn two_port_world() -> World {
    let mut w = base_world();
    w.put_service(service("default", "web", json!([{"name": "http", "port": 80}, {"name": "admin", "port": 9000, "appProtocol": "kubernetes.io/h2c"}])));
    w.put_endpoint_slice(slice("default", "web-1", "web",
        json!([{"name": "http", "port": 8080}, {"name": "admin", "port": 9090}]),
        json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}])));
    // A second slice repeats 10.0.0.2 and adds 10.0.0.3 with a different target port number.
    w.put_endpoint_slice(slice(
        "default",
        "web-2",
        "web",
        json!([{"name": "http", "port": 8080}]),
        json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.3", "10.9.9.9"]}]),
    ));
    w.put_endpoint_slice(slice(
        "default",
        "web-fqdn",
        "web",
        json!([{"name": "http", "port": 8080}]),
        json!([{"addresses": ["pod.example"]}]),
    ));
    w
}

fn addrs(s: &Snapshot, svc: &str, port: u16) -> Vec<(String, EndpointState)> {
    let key = ClusterKey {
        namespace: "default".into(),
        service: svc.into(),
        port,
    };
    s.clusters()[&key]
        .endpoints
        .iter()
        .map(|e| (e.addr.to_string(), e.state))
        .collect()
}

#[test]
fn ports_by_name_and_number_share_a_pool_and_slices_join() {
    let mut w = two_port_world();
    w.put_ingress(ingress("default", "p", json!({"ingressClassName": "sluice", "rules": [{"host": "p.test", "http": {"paths": [
        {"path": "/num", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
        {"path": "/name", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "http"}}}},
        {"path": "/admin", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "admin"}}}},
        {"path": "/bad", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 81}}}},
    ]}}]})));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "p.test", "/num").as_deref(), Some("web"));
    assert_eq!(hit(&s, "p.test", "/name").as_deref(), Some("web"));
    assert_eq!(
        s.clusters().len(),
        2,
        "number 80 and name http are one pool; admin another"
    );
    use EndpointState::Ready;
    assert_eq!(
        addrs(&s, "web", 80),
        vec![
            ("10.0.0.1:8080".into(), Ready),
            ("10.0.0.2:8080".into(), Ready),
            ("10.0.0.3:8080".into(), Ready)
        ]
    );
    assert_eq!(
        addrs(&s, "web", 9000),
        vec![
            ("10.0.0.1:9090".into(), Ready),
            ("10.0.0.2:9090".into(), Ready)
        ],
        "port matched per slice by name"
    );
    let key = ClusterKey {
        namespace: "default".into(),
        service: "web".into(),
        port: 9000,
    };
    assert_eq!(
        s.clusters()[&key].protocol,
        crate::model::UpstreamProtocol::H2c
    );
    assert!(hit(&s, "p.test", "/bad").is_some_and(|h| h.starts_with("503:")));
    assert!(
        s.problems()
            .iter()
            .any(|p| p.reason == "ServicePortNotFound" && p.field.contains("paths[3]"))
    );
    // The fast path computes the same endpoint list.
    assert_eq!(
        cluster_endpoints(&w, &key).unwrap(),
        s.clusters()[&key].endpoints
    );
}

#[test]
fn ready_serving_terminating_fallback() {
    let mut w = base_world();
    w.put_service(service("default", "t", json!([{"port": 80}])));
    let eps = json!([
        {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": true}},
        {"addresses": ["10.0.0.4"], "conditions": {"ready": false}},
    ]);
    w.put_endpoint_slice(slice("default", "t-1", "t", json!([{"port": 8080}]), eps));
    w.put_ingress(simple("t", "t.test", &[("/", "Prefix", "t")]));
    let s = translate(&w, &opts());
    use EndpointState::{Draining, Ready};
    assert_eq!(
        addrs(&s, "t", 80),
        vec![
            ("10.0.0.1:8080".into(), Ready),
            ("10.0.0.2:8080".into(), Draining)
        ]
    );
}

#[test]
fn missing_service_answers_503_and_is_reported() {
    let mut w = base_world();
    w.put_ingress(simple(
        "m",
        "m.test",
        &[("/", "Prefix", "ghost"), ("/ok", "Prefix", "a")],
    ));
    let s = translate(&w, &opts());
    assert!(hit(&s, "m.test", "/").is_some_and(|h| h.starts_with("503:")));
    assert_eq!(
        hit(&s, "m.test", "/ok").as_deref(),
        Some("a"),
        "the rest keeps serving"
    );
    let p = s
        .problems()
        .iter()
        .find(|p| p.reason == "ServiceNotFound")
        .unwrap();
    assert_eq!(p.object.name, "m");
    assert!(p.to_string().contains("default/ghost"), "{p}");
}

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

fn secret(name: &str, ty: &str, crt: &str, key: &str) -> Secret {
    from(
        json!({"metadata": {"namespace": "default", "name": name}, "type": ty, "stringData": {"tls.crt": crt, "tls.key": key}}),
    )
}

#[test]
fn tls_bindings_and_bad_secrets() {
    let mut w = base_world();
    w.put_secret(secret("good", "kubernetes.io/tls", CERT, KEY));
    w.put_secret(secret("nokey", "kubernetes.io/tls", CERT, ""));
    w.put_secret(secret("opaque", "Opaque", CERT, KEY));
    w.put_secret(secret(
        "garbage",
        "kubernetes.io/tls",
        "not pem at all",
        KEY,
    ));
    let tls_ing = |name: &str, host: &str, secret: &str| {
        ingress(
            "default",
            name,
            json!({"ingressClassName": "sluice",
        "tls": [{"hosts": [host], "secretName": secret}],
        "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}}]}),
        )
    };
    w.put_ingress(tls_ing("g", "good.test", "good"));
    w.put_ingress(tls_ing("n", "nokey.test", "nokey"));
    w.put_ingress(tls_ing("o", "opaque.test", "opaque"));
    w.put_ingress(tls_ing("x", "garbage.test", "garbage"));
    w.put_ingress(tls_ing("m", "missing.test", "missing"));
    let s = translate(&w, &opts());
    assert_eq!(s.tls().len(), 5);
    assert_eq!(s.certificates().len(), 1);
    assert!(s.certificates().keys().all(|k| k.name == "good"));
    for name in ["nokey", "opaque", "garbage"] {
        assert!(
            s.problems()
                .iter()
                .any(|p| p.reason == "InvalidSecret" && p.object.name == name),
            "{name}: {:?}",
            s.problems()
        );
    }
    assert!(s.problems().iter().any(|p| p.reason == "SecretNotFound"));
    // Routing goes on for every host; TLS hosts redirect by default.
    for h in ["good.test", "nokey.test", "missing.test"] {
        let r = s.route(h, "/").unwrap();
        assert!(r.options.ssl_redirect, "{h}");
    }
}

#[test]
fn one_ingress_may_name_a_second_secret_for_a_host() {
    let mut w = base_world();
    for name in ["rsa", "ecdsa", "third", "other"] {
        w.put_secret(secret(name, "kubernetes.io/tls", CERT, KEY));
    }
    let rule = json!([{"host": "two.test", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}}]);
    w.put_ingress(ingress_at(
        "default",
        "two",
        "2020-01-01T00:00:00Z",
        json!({"ingressClassName": "sluice", "rules": rule, "tls": [
            {"hosts": ["two.test"], "secretName": "rsa"},
            {"hosts": ["two.test"], "secretName": "ecdsa"},
            {"hosts": ["two.test"], "secretName": "third"},
        ]}),
    ));
    // A younger Ingress naming another Secret for the host is a conflict, as before.
    w.put_ingress(ingress_at(
        "default",
        "younger",
        "2030-01-01T00:00:00Z",
        json!({"ingressClassName": "sluice", "rules": rule, "tls": [{"hosts": ["two.test"], "secretName": "other"}]}),
    ));
    let s = translate(&w, &opts());
    let b = s.tls().iter().find(|b| b.host == "two.test").unwrap();
    assert_eq!(b.secret.name, "rsa");
    assert_eq!(b.also.as_ref().map(|s| s.name.as_str()), Some("ecdsa"));
    let names: Vec<&str> = s.certificates().keys().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["ecdsa", "rsa"]);
    let conflicts: Vec<String> = s
        .problems()
        .iter()
        .filter(|p| p.reason == "Conflict" && p.message.contains("TLS for host"))
        .map(|p| p.object.name.clone())
        .collect();
    assert_eq!(
        conflicts,
        ["two", "younger"],
        "the third Secret, the other Ingress"
    );
}

#[test]
fn ssl_redirect_annotation_and_default_backend() {
    let mut w = base_world();
    let v = json!({"metadata": {"namespace": "default", "name": "r", "annotations": {"nginx.ingress.kubernetes.io/ssl-redirect": "false", "sluice.dev/hsts": "max-age=60"}},
        "spec": {"ingressClassName": "sluice", "defaultBackend": {"service": {"name": "d", "port": {"number": 80}}},
            "tls": [{"hosts": ["r.test"]}],
            "rules": [{"host": "r.test", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}}]}});
    w.put_ingress(from::<Ingress>(v));
    let s = translate(&w, &opts());
    let r = s.route("r.test", "/").unwrap();
    assert!(!r.options.ssl_redirect);
    assert_eq!(r.options.hsts.map(|h| h.max_age), Some(60));
    assert_eq!(
        hit(&s, "unknown.test", "/x").as_deref(),
        Some("d"),
        "defaultBackend"
    );
}

#[test]
fn invalid_pieces_are_dropped_and_reported() {
    let mut w = base_world();
    w.put_ingress(ingress("default", "bad", json!({"ingressClassName": "sluice", "rules": [
        {"host": "foo.*.com", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}},
        {"host": "ok.test", "http": {"paths": [
            {"path": "relative", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}},
            {"path": "/r", "pathType": "Regex", "backend": {"service": {"name": "a", "port": {"number": 80}}}},
            {"path": "/good", "pathType": "Exact", "backend": {"service": {"name": "b", "port": {"number": 80}}}},
        ]}},
    ]})));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "ok.test", "/good").as_deref(), Some("b"));
    let reasons: Vec<_> = s.problems().iter().map(|p| p.reason).collect();
    assert!(
        reasons.contains(&"InvalidHost") && reasons.contains(&"InvalidPath"),
        "{reasons:?}"
    );
    assert_eq!(
        s.problems()
            .iter()
            .filter(|p| p.reason == "InvalidPath")
            .count(),
        2
    );
}

// ---- property tests ----

fn arb_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "aa", "ab", ""]), 0..4)
        .prop_map(|segs| format!("/{}", segs.join("/")))
}

fn arb_rule() -> impl Strategy<Value = (String, String, String, String)> {
    (
        prop::sample::select(vec!["", "x.test", "*.test", "y.x.test", "*.x.test"]),
        arb_path(),
        prop::sample::select(vec!["Exact", "Prefix", "ImplementationSpecific"]),
        prop::sample::select(vec!["a", "b", "c", "d"]),
    )
        .prop_map(|(h, p, t, s)| (h.to_string(), p, t.to_string(), s.to_string()))
}

fn world_of(rules: &[(String, String, String, String)]) -> Vec<Ingress> {
    rules
        .iter()
        .enumerate()
        .map(|(i, (h, p, t, s))| {
            ingress("default", &format!("i{i}"), json!({"ingressClassName": "sluice", "rules": [{"host": h, "http": {"paths": [
                {"path": p, "pathType": t, "backend": {"service": {"name": s, "port": {"number": 80}}}}]}}]}))
        })
        .collect()
}

/// A deliberately naive matcher: scan every rule of every Ingress in age order.
fn reference(rules: &[(String, String, String, String)], host: &str, path: &str) -> Option<String> {
    let mut names: Vec<(String, usize)> = (0..rules.len()).map(|i| (format!("i{i}"), i)).collect();
    names.sort();
    // Rules in conflict order, first definition of (host, path match) wins.
    let mut defined: Vec<(HostMatch, PathMatch, String)> = Vec::new();
    for (_, i) in names {
        let (h, p, t, s) = &rules[i];
        let hm = crate::host::parse_rule_host(h).unwrap();
        let pm = crate::path::parse_path(Some(p), t).unwrap();
        if !defined.iter().any(|(dh, dp, _)| dh == &hm && dp == &pm) {
            defined.push((hm, pm, s.clone()));
        }
    }
    let level = |hm: &HostMatch| match hm {
        HostMatch::Exact(_) => 0,
        HostMatch::Wildcard(_) => 1,
        HostMatch::Any => 2,
    };
    for lvl in 0..3 {
        let best = defined
            .iter()
            .filter(|(hm, pm, _)| {
                level(hm) == lvl && host_matches(hm, host) && path_matches(pm, path)
            })
            .max_by_key(|(_, pm, _)| match_rank(pm));
        if let Some((_, _, s)) = best {
            return Some(s.clone());
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn translation_ignores_arrival_order(rules in prop::collection::vec(arb_rule(), 1..12), seed in any::<u64>()) {
        let ings = world_of(&rules);
        let mut w1 = base_world();
        for i in &ings { w1.put_ingress(i.clone()); }
        let mut shuffled = ings.clone();
        let mut rng = seed;
        for i in (1..shuffled.len()).rev() {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (rng >> 33) as usize % (i + 1));
        }
        let mut w2 = World::new();
        for i in &shuffled { w2.put_ingress(i.clone()); }
        for svc in ["d", "c", "b", "a"] { w2.put_service(service("default", svc, json!([{"port": 80, "name": "http"}]))); }
        w2.put_ingress_class(class("sluice", DEFAULT_CONTROLLER_NAME, false));
        let (s1, s2) = (translate(&w1, &opts()), translate(&w2, &opts()));
        prop_assert_eq!(s1.hash(), s2.hash());
        prop_assert!(s1 == s2);
    }

    #[test]
    fn matching_agrees_with_reference(rules in prop::collection::vec(arb_rule(), 1..12),
                                      host in prop::sample::select(vec!["x.test", "y.x.test", "z.x.test", "q.test", "test", "other"]),
                                      path in arb_path()) {
        let mut w = base_world();
        for i in world_of(&rules) { w.put_ingress(i); }
        let s = translate(&w, &opts());
        prop_assert_eq!(hit(&s, host, &path), reference(&rules, host, &path));
    }
}

#[test]
fn equal_input_gives_equal_snapshot_and_changes_are_seen() {
    let build = |port: i32| {
        let mut w = two_port_world();
        w.put_ingress(simple("e", "e.test", &[("/", "Prefix", "web")]));
        w.put_endpoint_slice(slice(
            "default",
            "web-3",
            "web",
            json!([{"name": "http", "port": port}]),
            json!([{"addresses": ["10.1.1.1"]}]),
        ));
        translate(&w, &opts())
    };
    assert!(build(8080) == build(8080));
    assert_eq!(build(8080).hash(), build(8080).hash());
    assert!(build(8080) != build(8081));
    let s = build(8080);
    let a: SocketAddr = "10.1.1.1:8080".parse().unwrap();
    assert!(
        s.clusters()
            .values()
            .any(|c| c.endpoints.iter().any(|e| e.addr == a))
    );
}

/// The status verdict comes from the same collect step as the routes: an Ingress dropped whole
/// (unreadable canary rules), shut out by host ownership, or not ours gets no address.
#[test]
fn the_ingresses_owed_status_are_those_translation_admitted() {
    let mut w = base_world();
    w.put_ingress(ingress_at(
        "default",
        "served",
        "2024-01-01T00:00:00Z",
        json!({"ingressClassName": "sluice", "rules": [{"host": "shop.test", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}}]}),
    ));
    let mut broken = simple("broken", "x.test", &[("/", "Prefix", "a")]);
    broken.metadata.annotations = Some(
        [
            ("nginx.ingress.kubernetes.io/canary", "true"),
            ("nginx.ingress.kubernetes.io/canary-weight", "ten"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    w.put_ingress(broken);
    let mut foreign = simple("foreign", "y.test", &[("/", "Prefix", "a")]);
    foreign.spec.as_mut().unwrap().ingress_class_name = Some("other".into());
    w.put_ingress(foreign);
    let mut grab = simple("grab", "shop.test", &[("/admin", "Prefix", "a")]);
    grab.metadata.namespace = Some("team-b".into());
    grab.metadata.creation_timestamp = Some(from(json!("2024-02-01T00:00:00Z")));
    w.put_ingress(grab);
    let key = |ns: &str, n: &str| (ns.to_string(), n.to_string());

    let t = translate_all(&w, &opts());
    let shared: Vec<_> = t.ingresses.iter().cloned().collect();
    assert_eq!(
        shared,
        vec![key("default", "served"), key("team-b", "grab")],
        "hosts shared: the newer namespace's Ingress adds its path"
    );
    assert!(t.snapshot.route("shop.test", "/").is_some());

    let mut o = opts();
    o.host_ownership = HostOwnership::Namespace;
    let t = translate_all(&w, &o);
    let owned: Vec<_> = t.ingresses.iter().cloned().collect();
    assert_eq!(owned, vec![key("default", "served")], "grab owns nothing");
}
