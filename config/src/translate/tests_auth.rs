//! Translation of authentication: the controller ConfigMap's global `auth-url` given to every
//! Ingress that does not opt out or bring its own, skipped on `no-auth-locations`, and closing
//! the Ingresses it would protect when it cannot be honoured.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use super::tests::{base_world, opts, service, simple};
use super::tests_traffic::annotated;
use super::*;
use crate::behaviour::Auth;

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
