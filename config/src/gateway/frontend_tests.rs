//! Client-certificate validation of Gateway listeners (`spec.tls.frontend`): which listener
//! gets which CAs, and the conditions the suite's invalid-configuration tests expect.

use std::sync::Arc;

use serde_json::{Value, json};

use super::status::GatewayState;
use super::tests::{has, meta, parse, run, world};
use crate::world::World;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

fn secrets_and_config_maps(w: &mut World) {
    w.put_secret(parse::<k8s_openapi::api::core::v1::Secret>(json!({
        "metadata": {"namespace": "infra", "name": "server"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": CERT, "tls.key": KEY}})));
    for (ns, name, data) in [
        ("infra", "ca", json!({"ca.crt": CERT})),
        (
            "infra",
            "ca-2",
            json!({"ca.crt": CERT.replace("MIIB", "MIIC")}),
        ),
        ("infra", "no-key", json!({"other": CERT})),
        ("infra", "not-pem", json!({"ca.crt": "hello"})),
        ("web", "ca", json!({"ca.crt": CERT})),
    ] {
        w.put_config_map(parse::<k8s_openapi::api::core::v1::ConfigMap>(json!({
            "metadata": {"namespace": ns, "name": name}, "data": data})));
    }
}

fn https(name: &str, port: u16) -> Value {
    json!({"name": name, "port": port, "protocol": "HTTPS",
           "tls": {"certificateRefs": [{"name": "server"}]}})
}

fn refs(names: &[(&str, &str, Option<&str>)]) -> Value {
    Value::Array(
        names
            .iter()
            .map(|(kind, name, ns)| match ns {
                Some(ns) => json!({"group": "", "kind": kind, "name": name, "namespace": ns}),
                None => json!({"group": "", "kind": kind, "name": name}),
            })
            .collect(),
    )
}

fn gateway_with(w: &mut World, listeners: Value, frontend: Value) {
    w.gateways.insert(
        ("infra".into(), "gw".into()),
        Arc::new(parse(json!({"metadata": meta("infra", "gw", 0),
            "spec": {"gatewayClassName": "sluice", "listeners": listeners,
                     "tls": {"frontend": frontend}}}))),
    );
}

fn state(w: &World) -> (Vec<crate::gateway_model::GatewaySocket>, GatewayState) {
    let (sockets, mut st) = run(w);
    let gw = st
        .gateways
        .remove(&("infra".to_string(), "gw".to_string()))
        .unwrap_or_else(|| panic!("no status for infra/gw"));
    (sockets, gw)
}

fn listener<'a>(gw: &'a GatewayState, name: &str) -> &'a [super::status::Cond] {
    gw.listeners
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.conditions.as_slice())
        .unwrap_or_else(|| panic!("no listener {name}"))
}

#[test]
fn the_default_applies_unless_the_port_has_its_own_and_http_is_left_alone() {
    let mut w = world();
    secrets_and_config_maps(&mut w);
    gateway_with(
        &mut w,
        json!([https("a", 443), https("b", 8443), https("c", 9443),
               {"name": "http", "port": 80, "protocol": "HTTP"}]),
        json!({"default": {"validation": {"caCertificateRefs": refs(&[("ConfigMap", "ca", None)])}},
               "perPort": [
                 {"port": 8443, "tls": {"validation": {"mode": "AllowInsecureFallback",
                   "caCertificateRefs": refs(&[("ConfigMap", "ca-2", None)])}}},
                 {"port": 9443, "tls": {}},
                 {"port": 80, "tls": {"validation": {"caCertificateRefs": refs(&[("ConfigMap", "nope", None)])}}}]}),
    );
    let (sockets, gw) = state(&w);
    let validation = |port: u16| {
        sockets
            .iter()
            .find(|s| s.port == port)
            .and_then(|s| s.listeners.first())
            .map(|l| l.client_validation.clone())
            .unwrap_or_else(|| panic!("no socket on {port}"))
    };
    let a = validation(443).unwrap_or_else(|| panic!("443 validates"));
    assert_eq!(
        (a.ca_pem.as_slice(), a.insecure_fallback),
        (CERT.as_bytes(), false)
    );
    assert_eq!(a.sources[0].to_string(), "ConfigMap infra/ca");
    let b = validation(8443).unwrap_or_else(|| panic!("8443 validates"));
    assert!(b.insecure_fallback && b.ca_pem != a.ca_pem, "{b:?}");
    assert_eq!(
        validation(9443),
        None,
        "a port entry without validation turns it off"
    );
    assert_eq!(validation(80), None, "HTTP listeners are not validated");
    for l in ["a", "b", "c", "http"] {
        assert!(
            has(listener(&gw, l), "ResolvedRefs", true, "ResolvedRefs"),
            "{l}"
        );
        assert!(
            has(listener(&gw, l), "Programmed", true, "Programmed"),
            "{l}"
        );
    }
    assert!(has(
        &gw.conditions,
        "InsecureFrontendValidationMode",
        true,
        "ConfigurationChanged"
    ));
}

#[test]
fn unusable_references_say_why_and_close_the_listener() {
    let mut w = world();
    secrets_and_config_maps(&mut w);
    let cases = [
        (
            6443,
            ("ConfigMap", "missing", None),
            "InvalidCACertificateRef",
        ),
        (
            6444,
            ("ConfigMap", "no-key", None),
            "InvalidCACertificateRef",
        ),
        (
            6445,
            ("ConfigMap", "not-pem", None),
            "InvalidCACertificateRef",
        ),
        (6446, ("Service", "v1", None), "InvalidCACertificateKind"),
        (6447, ("ConfigMap", "ca", Some("web")), "RefNotPermitted"),
    ];
    let listeners: Vec<Value> = cases
        .iter()
        .map(|(port, _, _)| https(&format!("l{port}"), *port))
        .chain([https("good", 443)])
        .collect();
    let per_port: Vec<Value> = cases
        .iter()
        .map(|(port, r, _)| json!({"port": port, "tls": {"validation": {"caCertificateRefs": refs(&[*r])}}}))
        .collect();
    gateway_with(
        &mut w,
        Value::Array(listeners),
        json!({"default": {"validation": {"caCertificateRefs": refs(&[("ConfigMap", "ca", None)])}},
               "perPort": per_port}),
    );
    let (sockets, gw) = state(&w);
    for (port, _, reason) in &cases {
        let c = listener(&gw, &format!("l{port}"));
        assert!(has(c, "ResolvedRefs", false, reason), "{port}: {c:?}");
        assert!(
            has(c, "Accepted", false, "NoValidCACertificate"),
            "{port}: {c:?}"
        );
        assert!(has(c, "Programmed", false, "Invalid"), "{port}: {c:?}");
        assert!(
            sockets.iter().all(|s| s.port != *port),
            "{port} is not served"
        );
    }
    assert!(has(listener(&gw, "good"), "Programmed", true, "Programmed"));
    assert!(
        !gw.conditions
            .iter()
            .any(|c| c.kind == "InsecureFrontendValidationMode"),
        "no insecure mode asked"
    );

    // A ReferenceGrant lets the Gateway use the other namespace's ConfigMap.
    w.reference_grants.insert(
        ("web".into(), "ca".into()),
        Arc::new(parse(json!({"metadata": {"namespace": "web", "name": "ca"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "infra"}],
                     "to": [{"group": "", "kind": "ConfigMap"}]}}))),
    );
    let (sockets, gw) = state(&w);
    assert!(has(
        listener(&gw, "l6447"),
        "Programmed",
        true,
        "Programmed"
    ));
    assert!(sockets.iter().any(|s| s.port == 6447));
}

#[test]
fn some_usable_references_serve_with_those_and_say_which_are_not() {
    let mut w = world();
    secrets_and_config_maps(&mut w);
    gateway_with(
        &mut w,
        json!([https("a", 443)]),
        json!({"default": {"validation": {"caCertificateRefs":
            refs(&[("ConfigMap", "missing", None), ("ConfigMap", "ca", None)])}}}),
    );
    let (sockets, gw) = state(&w);
    let c = listener(&gw, "a");
    assert!(
        has(c, "ResolvedRefs", false, "InvalidCACertificateRef"),
        "{c:?}"
    );
    assert!(has(c, "Accepted", true, "Accepted"), "{c:?}");
    let v = sockets
        .first()
        .and_then(|s| s.listeners.first())
        .and_then(|l| l.client_validation.clone())
        .unwrap_or_else(|| panic!("served with the usable CA"));
    assert_eq!(v.ca_pem, CERT.as_bytes());
}
