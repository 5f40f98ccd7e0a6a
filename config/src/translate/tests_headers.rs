//! Translation of `custom-headers`: the ConfigMap found in the Ingress's namespace or the one
//! named, every field checked against `global-allowed-response-headers`, and the Ingress
//! closed (503, an Error) when the fields cannot be set.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use super::tests::{base_world, opts, simple};
use super::tests_traffic::annotated;
use super::*;
use crate::model::RouteAction;

fn config_map(ns: &str, name: &str, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "data": data,
    }))
    .unwrap_or_default()
}

/// A world with the controller ConfigMap allowing `allowed`, and one Ingress per reference.
fn world(allowed: &str, refs: &[(&str, &str)]) -> (World, TranslateOptions) {
    let mut w = base_world();
    w.put_config_map(config_map(
        "sluice-system",
        "sluice",
        json!({"global-allowed-response-headers": allowed}),
    ));
    for (name, r) in refs {
        w.put_ingress(annotated(
            simple(name, &format!("{name}.test"), &[("/", "Prefix", "a")]),
            &[("custom-headers", r)],
        ));
    }
    let mut o = opts();
    o.configmap = Some(ObjectRef::new("ConfigMap", "sluice-system", "sluice"));
    (w, o)
}

fn fields(s: &Snapshot, host: &str) -> Result<Vec<(String, String)>, String> {
    let r = s.route(host, "/").ok_or("no route")?;
    match &r.action {
        RouteAction::Unavailable(why) => Err(why.clone()),
        _ => Ok(r.options.edits.response_headers.clone()),
    }
}

#[test]
fn fields_come_from_the_named_config_map_when_all_are_allowed() {
    let (mut w, o) = world(
        "X-Frame-Options,My-Custom-Header-Dollar",
        &[("own", "security"), ("other", "shared/security")],
    );
    w.put_config_map(config_map(
        "default",
        "security",
        json!({"X-Frame-Options": "DENY", "My-Custom-Header-Dollar": "$remote_addr"}),
    ));
    w.put_config_map(config_map(
        "shared",
        "security",
        json!({"X-Frame-Options": "SAMEORIGIN"}),
    ));
    let s = translate(&w, &o);
    // Values are literal, as ingress-nginx's e2e test checks (`$remote_addr` is not expanded).
    assert_eq!(
        fields(&s, "own.test").unwrap(),
        [
            ("My-Custom-Header-Dollar".into(), "$remote_addr".into()),
            ("X-Frame-Options".into(), "DENY".into())
        ]
    );
    assert_eq!(
        fields(&s, "other.test").unwrap(),
        [("X-Frame-Options".into(), "SAMEORIGIN".into())]
    );
    assert!(s.problems().iter().all(|p| p.severity != Severity::Error));
}

#[test]
fn what_cannot_be_set_closes_the_ingress_with_an_error() {
    let (mut w, o) = world(
        "X-Frame-Options,Content-Length",
        &[
            ("missing", "nowhere"),
            ("notallowed", "extra"),
            ("framing", "framing"),
            ("unreadable", "a/b/c"),
            ("huge", "huge"),
            ("fine", "fine"),
        ],
    );
    w.put_config_map(config_map(
        "default",
        "extra",
        json!({"X-Frame-Options": "DENY", "X-Powered-By": "me"}),
    ));
    w.put_config_map(config_map(
        "default",
        "framing",
        json!({"Content-Length": "0"}),
    ));
    let mut huge = config_map("default", "huge", json!({}));
    huge.metadata.annotations = Some(
        [(
            crate::world::DROPPED_BYTES.to_string(),
            "900000".to_string(),
        )]
        .into_iter()
        .collect(),
    );
    w.put_config_map(huge);
    w.put_config_map(config_map(
        "default",
        "fine",
        json!({"x-frame-options": "DENY"}),
    ));
    let s = translate(&w, &o);
    let why = |h: &str| fields(&s, h).unwrap_err();
    assert!(why("missing.test").contains("ConfigMap default/nowhere not found"));
    assert!(why("notallowed.test").contains("X-Powered-By is not in"));
    assert!(why("framing.test").contains("frames the response"));
    assert!(why("unreadable.test").contains("NAMESPACE/NAME"));
    assert!(why("huge.test").contains("900000 bytes"));
    assert_eq!(fields(&s, "fine.test").unwrap().len(), 1);
    let errors: Vec<&str> = s
        .problems()
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .map(|p| p.reason)
        .collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(errors.contains(&"CustomHeadersNotFound"));
    assert!(errors.contains(&"InvalidCustomHeaders"));

    // Without the controller ConfigMap's list nothing may be set (ingress-nginx 1.12+).
    let mut w2 = w.clone();
    w2.config_maps
        .remove(&("sluice-system".to_string(), "sluice".to_string()));
    let s = translate(&w2, &o);
    assert!(
        fields(&s, "fine.test")
            .unwrap_err()
            .contains("global-allowed-response-headers")
    );
}

#[test]
fn the_reference_is_what_the_controller_watches_for() {
    let ing = annotated(
        simple("own", "own.test", &[("/", "Prefix", "a")]),
        &[("custom-headers", "security")],
    );
    assert_eq!(
        headers::reference(&ing),
        Some(("default".to_string(), "security".to_string()))
    );
    let none = simple("plain", "plain.test", &[("/", "Prefix", "a")]);
    assert_eq!(headers::reference(&none), None);
}
