//! Gateway API translation and status, as the conformance suite's core tests expect them.

use std::sync::Arc;

use serde_json::{Value, json};

use super::status::{Cond, GatewayStatuses};
use super::{GatewayOptions, translate};
use crate::gateway_model::{BackendTarget, GatewaySocket, RequestFacts};
use crate::model::Settings;
use crate::world::World;

pub(super) fn parse<T: serde::de::DeserializeOwned>(v: Value) -> T {
    match serde_json::from_value(v) {
        Ok(t) => t,
        Err(e) => panic!("test object: {e}"),
    }
}

pub(super) fn meta(ns: &str, name: &str, age: i64) -> Value {
    json!({"namespace": ns, "name": name, "generation": 1,
           "creationTimestamp": format!("2026-01-01T00:00:{:02}Z", age)})
}

pub(super) fn world() -> World {
    let mut w = World::new();
    w.gateway_classes.insert(
        (String::new(), "sluice".into()),
        Arc::new(parse(
            json!({"metadata": {"name": "sluice", "generation": 3},
            "spec": {"controllerName": "sluice.dev/gateway-controller"}}),
        )),
    );
    for (ns, svc) in [
        ("infra", "v1"),
        ("infra", "v2"),
        ("infra", "v3"),
        ("web", "web"),
    ] {
        w.put_service(parse::<k8s_openapi::api::core::v1::Service>(json!({
            "metadata": {"namespace": ns, "name": svc},
            "spec": {"ports": [{"port": 8080, "targetPort": 3000}]}})));
        w.put_endpoint_slice(parse::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
            "metadata": {"namespace": ns, "name": format!("{svc}-x"), "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "ports": [{"port": 3000}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]})));
    }
    w
}

pub(super) fn gateway(w: &mut World, ns: &str, name: &str, age: i64, listeners: Value) {
    w.gateways.insert(
        (ns.into(), name.into()),
        Arc::new(parse(json!({"metadata": meta(ns, name, age),
            "spec": {"gatewayClassName": "sluice", "listeners": listeners}}))),
    );
}

pub(super) fn route(w: &mut World, ns: &str, name: &str, age: i64, spec: Value) {
    w.http_routes.insert(
        (ns.into(), name.into()),
        Arc::new(parse(
            json!({"metadata": meta(ns, name, age), "spec": spec}),
        )),
    );
}

pub(super) fn opts() -> GatewayOptions {
    GatewayOptions {
        addresses: vec![
            "198.18.0.16"
                .parse()
                .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
            "198.18.0.17"
                .parse()
                .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
        ],
        ..GatewayOptions::default()
    }
}

pub(super) fn run(w: &World) -> (Vec<GatewaySocket>, GatewayStatuses) {
    let o = translate(w, &opts(), &Settings::default());
    (o.sockets, o.status)
}

pub(super) fn has(conds: &[Cond], kind: &str, status: bool, reason: &str) -> bool {
    conds
        .iter()
        .any(|c| c.kind == kind && c.status == status && c.reason == reason)
}

/// Which Service answers `host` + `path` on the socket at `port` (`None`: 404; `500`: no
/// usable backend).
fn serve(sockets: &[GatewaySocket], port: u16, host: &str, path: &str) -> Option<String> {
    let s = sockets.iter().find(|s| s.port == port)?;
    let facts = RequestFacts {
        path,
        method: "GET",
        query: None,
        header: &|_| None,
    };
    let l = s.listener_for(Some(host))?;
    let rule = l.find(Some(host), &facts)?;
    Some(match rule.backends.first().map(|b| &b.target) {
        Some(BackendTarget::Cluster(k)) => k.service.clone(),
        _ => "500".into(),
    })
}

#[test]
fn hostname_intersection_attaches_counts_and_routes_like_the_suite() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([
        {"name": "listener-1", "port": 80, "protocol": "HTTP", "hostname": "very.specific.com"},
        {"name": "listener-2", "port": 80, "protocol": "HTTP", "hostname": "*.wildcard.io"},
        {"name": "listener-3", "port": 80, "protocol": "HTTP", "hostname": "*.anotherwildcard.io"}]),
    );
    let parent = json!([{"name": "gw", "namespace": "infra"}]);
    let rule = |p: &str, svc: &str| {
        json!([{"matches": [{"path": {"type": "PathPrefix", "value": p}}],
                                           "backendRefs": [{"name": svc, "port": 8080}]}])
    };
    route(
        &mut w,
        "infra",
        "r1",
        1,
        json!({"parentRefs": parent, "rules": rule("/s1", "v1"),
        "hostnames": ["non.matching.com", "*.nonmatchingwildcard.io", "very.specific.com"]}),
    );
    route(
        &mut w,
        "infra",
        "r2",
        2,
        json!({"parentRefs": parent, "rules": rule("/s2", "v2"),
        "hostnames": ["non.matching.com", "wildcard.io", "foo.wildcard.io", "bar.wildcard.io", "foo.bar.wildcard.io"]}),
    );
    route(
        &mut w,
        "infra",
        "r3",
        3,
        json!({"parentRefs": parent, "rules": rule("/s3", "v3"),
        "hostnames": ["non.matching.com", "*.specific.com"]}),
    );
    route(
        &mut w,
        "infra",
        "r4",
        4,
        json!({"parentRefs": parent, "rules": rule("/s4", "v1"),
        "hostnames": ["*.anotherwildcard.io"]}),
    );
    route(
        &mut w,
        "infra",
        "r5",
        5,
        json!({"parentRefs": parent, "rules": rule("/s5", "v2"),
        "hostnames": ["specific.but.wrong.com", "wildcard.io"]}),
    );
    let (sockets, st) = run(&w);
    let gw = &st.gateways[&("infra".to_string(), "gw".to_string())];
    let attached: Vec<i32> = gw.listeners.iter().map(|l| l.attached_routes).collect();
    assert_eq!(attached, vec![2, 1, 1]);
    assert!(has(&gw.conditions, "Accepted", true, "Accepted"));
    assert!(has(&gw.conditions, "Programmed", true, "Programmed"));
    assert_eq!(gw.addresses, vec!["198.18.0.16".to_string()]);
    let r5 = &st.routes[&("infra".to_string(), "r5".to_string())];
    assert!(has(
        &r5.parents[0].conditions,
        "Accepted",
        false,
        "NoMatchingListenerHostname"
    ));
    let r1 = &st.routes[&("infra".to_string(), "r1".to_string())];
    assert!(has(&r1.parents[0].conditions, "Accepted", true, "Accepted"));
    assert!(has(
        &r1.parents[0].conditions,
        "ResolvedRefs",
        true,
        "ResolvedRefs"
    ));
    for (host, path, want) in [
        ("very.specific.com", "/s1", Some("v1")),
        ("non.matching.com", "/s1", None),
        ("foo.wildcard.io", "/s1", None),
        ("very.specific.com", "/non-matching-prefix", None),
        ("foo.bar.wildcard.io", "/s2", Some("v2")),
        ("wildcard.io", "/s2", None),
        ("very.specific.com", "/s3", Some("v3")),
        ("foo.specific.com", "/s3", None),
        ("foo.bar.anotherwildcard.io", "/s4", Some("v1")),
        ("anotherwildcard.io", "/s4", None),
        ("wildcard.io", "/s5", None),
    ] {
        assert_eq!(
            serve(&sockets, 80, host, path).as_deref(),
            want,
            "{host}{path}"
        );
    }
}

#[test]
fn unsupported_protocols_leave_the_gateway_accepted_with_listeners_not_valid() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "mixed",
        0,
        json!([
        {"name": "http", "port": 80, "protocol": "HTTP"},
        {"name": "invalid", "port": 1111, "protocol": "INVALID"}]),
    );
    gateway(
        &mut w,
        "infra",
        "only",
        1,
        json!([{"name": "invalid", "port": 1111, "protocol": "INVALID"}]),
    );
    let (_, st) = run(&w);
    let mixed = &st.gateways[&("infra".to_string(), "mixed".to_string())];
    assert!(has(
        &mixed.conditions,
        "Accepted",
        true,
        "ListenersNotValid"
    ));
    assert!(has(&mixed.conditions, "Programmed", true, "Programmed"));
    assert!(has(
        &mixed.listeners[0].conditions,
        "Accepted",
        true,
        "Accepted"
    ));
    assert!(has(
        &mixed.listeners[1].conditions,
        "Accepted",
        false,
        "UnsupportedProtocol"
    ));
    assert!(mixed.listeners[1].supported_kinds.is_empty());
    let only = &st.gateways[&("infra".to_string(), "only".to_string())];
    assert!(has(
        &only.conditions,
        "Accepted",
        false,
        "ListenersNotValid"
    ));
}

#[test]
fn bad_backends_get_their_reason_and_answer_500_while_the_rest_serves() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    route(
        &mut w,
        "infra",
        "r",
        1,
        json!({"parentRefs": [{"name": "gw"}], "rules": [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
         "backendRefs": [{"name": "web", "namespace": "web", "port": 8080}]},
        {"backendRefs": [{"name": "v1", "port": 8080}]},
        {"matches": [{"path": {"type": "Exact", "value": "/none"}}]}]}),
    );
    let (sockets, st) = run(&w);
    let r = &st.routes[&("infra".to_string(), "r".to_string())];
    assert!(has(&r.parents[0].conditions, "Accepted", true, "Accepted"));
    assert!(has(
        &r.parents[0].conditions,
        "ResolvedRefs",
        false,
        "RefNotPermitted"
    ));
    assert_eq!(serve(&sockets, 80, "a.com", "/v2").as_deref(), Some("500"));
    assert_eq!(
        serve(&sockets, 80, "a.com", "/none").as_deref(),
        Some("500")
    );
    assert_eq!(serve(&sockets, 80, "a.com", "/").as_deref(), Some("v1"));

    // A ReferenceGrant in the target namespace opens the way.
    w.reference_grants.insert(("web".into(), "g".into()), Arc::new(parse(json!({
        "metadata": {"namespace": "web", "name": "g"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "infra"}],
                 "to": [{"group": "", "kind": "Service"}]}}))));
    let (sockets, st) = run(&w);
    let r = &st.routes[&("infra".to_string(), "r".to_string())];
    assert!(has(
        &r.parents[0].conditions,
        "ResolvedRefs",
        true,
        "ResolvedRefs"
    ));
    assert_eq!(serve(&sockets, 80, "a.com", "/v2").as_deref(), Some("web"));
}

#[test]
fn parent_refs_that_select_nothing_say_why() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    route(
        &mut w,
        "web",
        "cross",
        1,
        json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}),
    );
    route(
        &mut w,
        "infra",
        "section",
        2,
        json!({"parentRefs": [{"name": "gw", "sectionName": "http1", "port": 80}],
        "rules": [{"backendRefs": [{"name": "v1", "port": 8080}]}]}),
    );
    let (_, st) = run(&w);
    let cross = &st.routes[&("web".to_string(), "cross".to_string())];
    assert!(has(
        &cross.parents[0].conditions,
        "Accepted",
        false,
        "NotAllowedByListeners"
    ));
    assert!(has(
        &cross.parents[0].conditions,
        "ResolvedRefs",
        true,
        "ResolvedRefs"
    ));
    let section = &st.routes[&("infra".to_string(), "section".to_string())];
    assert!(has(
        &section.parents[0].conditions,
        "Accepted",
        false,
        "NoMatchingParent"
    ));
    assert_eq!(
        st.gateways[&("infra".to_string(), "gw".to_string())].listeners[0].attached_routes,
        0
    );
}

#[test]
fn each_gateway_keeps_its_own_address_and_rules() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "a",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    gateway(
        &mut w,
        "infra",
        "b",
        1,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    route(
        &mut w,
        "infra",
        "shared",
        2,
        json!({"parentRefs": [{"name": "a"}, {"name": "b"}],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/shared"}}], "backendRefs": [{"name": "v1", "port": 8080}]}]}),
    );
    route(
        &mut w,
        "infra",
        "ra",
        3,
        json!({"parentRefs": [{"name": "a"}], "rules": [{"backendRefs": [{"name": "v2", "port": 8080}]}]}),
    );
    route(
        &mut w,
        "infra",
        "rb",
        4,
        json!({"parentRefs": [{"name": "b"}], "rules": [{"backendRefs": [{"name": "v3", "port": 8080}]}]}),
    );
    let (sockets, st) = run(&w);
    assert_eq!(sockets.len(), 2);
    let on = |ip: &str, path: &str| {
        let s = sockets
            .iter()
            .find(|s| s.addr.map(|a| a.to_string()).as_deref() == Some(ip));
        s.and_then(|s| serve(std::slice::from_ref(s), 80, "x", path))
    };
    assert_eq!(on("198.18.0.16", "/shared").as_deref(), Some("v1"));
    assert_eq!(on("198.18.0.16", "/").as_deref(), Some("v2"));
    assert_eq!(on("198.18.0.17", "/shared").as_deref(), Some("v1"));
    assert_eq!(on("198.18.0.17", "/").as_deref(), Some("v3"));
    assert_eq!(
        st.routes[&("infra".to_string(), "shared".to_string())]
            .parents
            .len(),
        2
    );

    // Deleting the older Gateway does not move the younger one's address (it is in its status).
    let b = &st.gateways[&("infra".to_string(), "b".to_string())];
    let mut gb: crate::gateway_api::Gateway =
        (*w.gateways[&("infra".to_string(), "b".to_string())]).clone();
    gb.status = Some(parse(
        json!({"addresses": [{"type": "IPAddress", "value": b.addresses[0]}]}),
    ));
    w.gateways
        .insert(("infra".into(), "b".into()), Arc::new(gb));
    w.gateways.remove(&("infra".to_string(), "a".to_string()));
    let (_, st) = run(&w);
    assert_eq!(
        st.gateways[&("infra".to_string(), "b".to_string())].addresses,
        vec!["198.18.0.17".to_string()]
    );
}

#[test]
fn precedence_exact_then_longest_prefix_then_more_conditions_then_age() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    route(
        &mut w,
        "infra",
        "young",
        5,
        json!({"parentRefs": [{"name": "gw"}], "rules": [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "v3", "port": 8080}]}]}),
    );
    route(
        &mut w,
        "infra",
        "old",
        1,
        json!({"parentRefs": [{"name": "gw"}], "rules": [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "v1", "port": 8080}]},
        {"matches": [{"path": {"type": "Exact", "value": "/a"}}], "backendRefs": [{"name": "v2", "port": 8080}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/a/b/"}}], "backendRefs": [{"name": "v3", "port": 8080}]}]}),
    );
    let (sockets, _) = run(&w);
    assert_eq!(
        serve(&sockets, 80, "h", "/").as_deref(),
        Some("v1"),
        "the older route wins a tie"
    );
    assert_eq!(serve(&sockets, 80, "h", "/a").as_deref(), Some("v2"));
    assert_eq!(serve(&sockets, 80, "h", "/a/b").as_deref(), Some("v3"));
    assert_eq!(
        serve(&sockets, 80, "h", "/a/bc").as_deref(),
        Some("v1"),
        "prefixes match whole elements"
    );
}

#[test]
fn https_listeners_need_a_valid_permitted_certificate() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "https", "port": 443, "protocol": "HTTPS",
        "tls": {"certificateRefs": [{"name": "certificate", "namespace": "web"}]}}]),
    );
    let (sockets, st) = run(&w);
    let gw = &st.gateways[&("infra".to_string(), "gw".to_string())];
    assert!(has(
        &gw.listeners[0].conditions,
        "ResolvedRefs",
        false,
        "RefNotPermitted"
    ));
    assert!(has(&gw.conditions, "Accepted", true, "ListenersNotValid"));
    assert!(has(&gw.conditions, "Programmed", true, "Programmed"));
    assert!(
        sockets.is_empty(),
        "a listener without its certificate is not served"
    );
}

#[test]
fn a_port_the_ingress_listeners_hold_is_unavailable_to_gateways() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([
        {"name": "http", "port": 80, "protocol": "HTTP"},
        {"name": "alt", "port": 8080, "protocol": "HTTP"}]),
    );
    let mut o = opts();
    o.ingress_listeners = vec![
        "0.0.0.0:80"
            .parse()
            .unwrap_or(std::net::SocketAddr::from(([0, 0, 0, 0], 80))),
    ];
    let out = translate(&w, &o, &Settings::default());
    let gw = &out.status.gateways[&("infra".to_string(), "gw".to_string())];
    assert!(has(
        &gw.listeners[0].conditions,
        "Accepted",
        false,
        "PortUnavailable"
    ));
    assert!(has(
        &gw.listeners[1].conditions,
        "Accepted",
        true,
        "Accepted"
    ));
    assert_eq!(
        out.sockets.iter().map(|s| s.port).collect::<Vec<_>>(),
        vec![8080]
    );

    // Ingress listeners on the node's own address leave the Gateway's address free.
    o.ingress_listeners = vec![std::net::SocketAddr::from(([127, 0, 0, 1], 80))];
    let out = translate(&w, &o, &Settings::default());
    assert_eq!(out.sockets.len(), 2);
}

#[test]
fn rejected_objects_become_problems_with_the_spec_reason() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([
        {"name": "http", "port": 80, "protocol": "HTTP"},
        {"name": "bad", "port": 1111, "protocol": "INVALID"}]),
    );
    route(
        &mut w,
        "web",
        "cross",
        1,
        json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": [{"backendRefs": [{"name": "nonexistent", "port": 8080}]}]}),
    );
    route(
        &mut w,
        "infra",
        "fine",
        2,
        json!({"parentRefs": [{"name": "gw"}],
        "rules": [{"backendRefs": [{"name": "v1", "port": 8080}]}]}),
    );
    let out = translate(&w, &opts(), &Settings::default());
    let problems = super::status_problems(&out.status);
    let reasons: Vec<(String, &str)> = problems
        .iter()
        .map(|p| (p.object.to_string(), p.reason))
        .collect();
    assert!(
        reasons.contains(&("Gateway infra/gw".into(), "UnsupportedProtocol")),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("HTTPRoute web/cross".into(), "NotAllowedByListeners")),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("HTTPRoute web/cross".into(), "BackendNotFound")),
        "{reasons:?}"
    );
    assert!(
        !reasons.iter().any(|(o, _)| o == "HTTPRoute infra/fine"),
        "a good route reports nothing"
    );
    assert_eq!(
        serve(&out.sockets, 80, "x", "/").as_deref(),
        Some("v1"),
        "the rest keeps serving"
    );
}

#[test]
fn requested_addresses_unsupported_unusable_usable_and_empty() {
    let spec_addresses = |w: &mut World, addrs: Value| {
        let key = ("infra".to_string(), "gw".to_string());
        let mut g: super::super::gateway_api::Gateway = (*w.gateways[&key]).clone();
        g.spec.addresses = Some(parse(addrs));
        w.gateways.insert(key, Arc::new(g));
    };
    let state = |w: &World| {
        let out = translate(w, &opts(), &Settings::default());
        out.status.gateways[&("infra".to_string(), "gw".to_string())].clone()
    };
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "http", "port": 8080, "protocol": "HTTP"}]),
    );
    spec_addresses(
        &mut w,
        json!([{"type": "test/fake", "value": "x"}, {"value": "203.0.113.9"}, {"value": "198.18.0.17"}]),
    );
    assert!(has(
        &state(&w).conditions,
        "Accepted",
        false,
        "UnsupportedAddress"
    ));
    spec_addresses(
        &mut w,
        json!([{"value": "203.0.113.9"}, {"value": "198.18.0.17"}]),
    );
    let s = state(&w);
    assert!(has(&s.conditions, "Accepted", true, "Accepted"));
    assert!(has(&s.conditions, "Programmed", false, "AddressNotUsable"));
    spec_addresses(
        &mut w,
        json!([{"type": "IPAddress", "value": "198.18.0.17"}]),
    );
    let s = state(&w);
    assert!(has(&s.conditions, "Programmed", true, "Programmed"));
    assert_eq!(s.addresses, vec!["198.18.0.17".to_string()]);
    spec_addresses(&mut w, json!([{"type": "IPAddress"}]));
    let s = state(&w);
    assert!(
        has(&s.conditions, "Programmed", true, "Programmed"),
        "an empty value is any address"
    );
    assert_eq!(s.addresses.len(), 1);
}

#[test]
fn addresses_stay_put_while_status_lags() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "a",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    gateway(
        &mut w,
        "infra",
        "b",
        1,
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    );
    let mut o = opts();
    let out = translate(&w, &o, &Settings::default());
    let b = ("infra".to_string(), "b".to_string());
    assert_eq!(
        out.status.gateways[&b].addresses,
        vec!["198.18.0.17".to_string()]
    );
    // The controller hands the last assignment back; b's status is not written yet when the
    // older Gateway goes.
    o.sticky = out
        .status
        .gateways
        .iter()
        .filter_map(|(k, g)| Some((k.clone(), g.addresses.first()?.parse().ok()?)))
        .collect();
    w.gateways.remove(&("infra".to_string(), "a".to_string()));
    let out = translate(&w, &o, &Settings::default());
    assert_eq!(
        out.status.gateways[&b].addresses,
        vec!["198.18.0.17".to_string()],
        "b keeps its address"
    );
}
