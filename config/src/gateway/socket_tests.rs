//! Gateways without addresses of their own share the node's socket per port: one protocol per
//! socket, the oldest Gateway's.

use std::sync::Arc;

use serde_json::json;

use super::tests::{has, meta, parse, world};
use super::{GatewayOptions, translate};
use crate::model::Settings;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

#[test]
fn a_shared_socket_keeps_the_oldest_gateways_protocol() {
    let mut w = world();
    w.put_secret(parse::<k8s_openapi::api::core::v1::Secret>(json!({
        "metadata": {"namespace": "infra", "name": "server"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": CERT, "tls.key": KEY}})));
    let https = |name: &str, port: u16| {
        json!({"name": name, "port": port, "protocol": "HTTPS",
               "tls": {"certificateRefs": [{"name": "server"}]}})
    };
    for (name, age, listeners) in [
        (
            "old",
            0,
            json!([{"name": "http", "port": 8080, "protocol": "HTTP"}, https("tls", 8443)]),
        ),
        ("new", 1, json!([https("https", 8080), https("tls", 8443)])),
        (
            "newest",
            2,
            json!([{"name": "pass", "port": 8443, "protocol": "TLS", "hostname": "p.test",
                    "tls": {"mode": "Passthrough"}}]),
        ),
    ] {
        w.gateways.insert(
            ("infra".into(), name.into()),
            Arc::new(parse(json!({"metadata": meta("infra", name, age),
                "spec": {"gatewayClassName": "sluice", "listeners": listeners}}))),
        );
    }
    let o = translate(&w, &GatewayOptions::default(), &Settings::default());
    let new = &o.status.gateways[&("infra".to_string(), "new".to_string())];
    let conds = |l: &str| {
        new.listeners
            .iter()
            .find(|x| x.name == l)
            .map(|x| x.conditions.clone())
            .unwrap_or_default()
    };
    assert!(has(&conds("https"), "Conflicted", true, "ProtocolConflict"));
    assert!(has(&conds("https"), "Programmed", false, "Invalid"));
    assert!(has(&conds("tls"), "Conflicted", false, "NoConflicts"));
    let newest = &o.status.gateways[&("infra".to_string(), "newest".to_string())];
    assert!(
        has(
            &newest.listeners[0].conditions,
            "Conflicted",
            true,
            "ProtocolConflict"
        ),
        "passthrough beside another Gateway's HTTPS"
    );
    let old = &o.status.gateways[&("infra".to_string(), "old".to_string())];
    assert!(
        old.listeners
            .iter()
            .all(|l| has(&l.conditions, "Programmed", true, "Programmed")),
        "the oldest Gateway keeps its listeners"
    );
    let socket = |port: u16| o.sockets.iter().find(|s| s.port == port);
    let s8080 = socket(8080).unwrap_or_else(|| panic!("8080 served"));
    assert!(!s8080.tls && s8080.listeners.len() == 1, "{s8080:?}");
    let s8443 = socket(8443).unwrap_or_else(|| panic!("8443 served"));
    assert!(s8443.tls && !s8443.passthrough);
    assert_eq!(
        s8443.listeners.len(),
        2,
        "both Gateways' HTTPS listeners share it"
    );
}
