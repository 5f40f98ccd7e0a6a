//! Translation of the ingress-nginx traffic annotations: canaries attached to their main
//! route, regex hosts, edits carried on routes, and the one review Warning per Ingress.

use super::tests::{base_world, hit, opts, simple};
use super::*;
use crate::model::{PathKind, RouteAction};
use crate::route_policy::HeaderRule;

/// The Ingress with these ingress-nginx annotations (names without the prefix).
pub(super) fn annotated(mut ing: Ingress, pairs: &[(&str, &str)]) -> Ingress {
    ing.metadata.annotations = Some(
        pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect(),
    );
    ing
}

fn reasons(s: &Snapshot) -> Vec<&'static str> {
    s.problems().iter().map(|p| p.reason).collect()
}

#[test]
fn a_canary_attaches_to_the_main_route_of_its_host_and_path() {
    let mut w = base_world();
    w.put_ingress(simple("main", "app.test", &[("/", "Prefix", "a")]));
    w.put_ingress(annotated(
        simple("canary", "app.test", &[("/", "Prefix", "b")]),
        &[
            ("canary", "true"),
            ("canary-weight", "20"),
            ("canary-by-header", "X-Canary"),
        ],
    ));
    // A canary for a path nobody else serves is ignored, with a warning.
    w.put_ingress(annotated(
        simple("stray", "app.test", &[("/other", "Prefix", "c")]),
        &[("canary", "true")],
    ));
    let s = translate(&w, &opts());
    let route = s.route("app.test", "/x").unwrap();
    assert_eq!(hit(&s, "app.test", "/other"), Some("a".to_string()));
    let c = route.canary.as_ref().unwrap();
    assert!(matches!(&c.action, RouteAction::Cluster(k) if k.service == "b"));
    assert_eq!((c.weight, c.weight_total), (20, 100));
    assert_eq!(
        c.header,
        Some(("x-canary".to_string(), HeaderRule::AlwaysNever))
    );
    assert_eq!(c.source.name, "canary");
    assert!(reasons(&s).contains(&"CanaryWithoutMain"));
    assert!(s.clusters().keys().any(|k| k.service == "b"));

    // A canary with unreadable rules takes nothing.
    w.put_ingress(annotated(
        simple("canary", "app.test", &[("/", "Prefix", "b")]),
        &[("canary", "true"), ("canary-weight", "much")],
    ));
    let s = translate(&w, &opts());
    assert!(s.route("app.test", "/").unwrap().canary.is_none());
    assert!(reasons(&s).contains(&"InvalidCanary"));
}

#[test]
fn rewrite_target_makes_every_path_of_the_host_a_regex() {
    let mut w = base_world();
    w.put_ingress(annotated(
        simple(
            "rw",
            "app.test",
            &[("/something(/|$)(.*)", "ImplementationSpecific", "a")],
        ),
        &[("rewrite-target", "/$2")],
    ));
    // Another Ingress on the same host without annotations: its paths become regexes too.
    w.put_ingress(simple("plain", "app.test", &[("/exact", "Exact", "b")]));
    w.put_ingress(simple("other", "other.test", &[("/exact", "Exact", "b")]));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "app.test", "/SOMETHING/else"), Some("a".into()));
    assert_eq!(hit(&s, "app.test", "/something"), Some("a".into()));
    // `^/exact` matches longer paths in regex mode, as nginx's `~* "^/exact"` does.
    assert_eq!(hit(&s, "app.test", "/exactly"), Some("b".into()));
    assert_eq!(hit(&s, "other.test", "/exactly"), None);
    let r = s.route("app.test", "/something/x").unwrap();
    assert_eq!(r.path.kind, PathKind::Regex);
    assert_eq!(r.options.edits.rewrite_target.as_deref(), Some("/$2"));
    assert!(s.problems().is_empty(), "{:?}", s.problems());

    // A path the regex crate cannot run is an error on that path; the rest keeps serving.
    w.put_ingress(annotated(
        simple(
            "bad",
            "app.test",
            &[("/(?!admin)", "ImplementationSpecific", "c")],
        ),
        &[("use-regex", "true")],
    ));
    let s = translate(&w, &opts());
    assert!(
        s.problems()
            .iter()
            .any(|p| p.reason == "InvalidPath" && p.message.contains("look-around"))
    );
    assert_eq!(hit(&s, "app.test", "/something/x"), Some("a".into()));
}

#[test]
fn edits_and_the_review_warning() {
    let mut w = base_world();
    w.put_ingress(annotated(
        simple("edits", "app.test", &[("/", "Prefix", "a")]),
        &[
            ("permanent-redirect", "https://new.test/"),
            ("app-root", "/app"),
            ("upstream-vhost", "internal.test"),
            ("x-forwarded-prefix", "/edge"),
            ("proxy-body-size", "8k"),
            ("proxy-read-timeout", "3"),
            ("force-ssl-redirect", "true"),
            ("proxy-buffering", "on"),
            ("mirror-target", "https://m.test/"),
            ("server-snippet", "return 200;"),
            ("proxy-send-timeout", "later"),
        ],
    ));
    let s = translate(&w, &opts());
    let r = s.route("app.test", "/").unwrap();
    let e = &r.options.edits;
    assert_eq!(
        e.redirect.as_ref().map(|r| (r.code, r.location.as_str())),
        Some((301, "https://new.test/"))
    );
    assert_eq!(e.app_root.as_deref(), Some("/app"));
    assert_eq!(e.upstream_vhost.as_deref(), Some("internal.test"));
    assert_eq!(e.forwarded_prefix.as_deref(), Some("/edge"));
    assert_eq!(r.options.limits.max_body_size, Some(8192));
    assert_eq!(
        r.options.limits.read_timeout,
        Some(std::time::Duration::from_secs(3))
    );
    assert!(r.options.force_ssl_redirect);
    let review: Vec<&Problem> = s
        .problems()
        .iter()
        .filter(|p| p.reason == "AnnotationsNotHonoured")
        .collect();
    assert_eq!(review.len(), 1, "one warning per Ingress");
    let m = &review[0].message;
    for part in [
        "proxy-buffering differs",
        "mirror-target unsupported",
        "server-snippet refused",
    ] {
        assert!(m.contains(part), "{part} in {m}");
    }
    assert!(
        s.problems()
            .iter()
            .any(|p| p.reason == "InvalidAnnotation" && p.message.contains("later"))
    );
}

/// Annotation beats ConfigMap beats flag, and a ConfigMap change is just another snapshot.
#[test]
fn the_controller_configmap_sits_between_flags_and_annotations() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let mut w = base_world();
    w.put_ingress(simple("plain", "plain.test", &[("/", "Prefix", "a")]));
    w.put_ingress(annotated(
        simple("own", "own.test", &[("/", "Prefix", "a")]),
        &[("proxy-body-size", "2k"), ("ssl-redirect", "true")],
    ));
    let mut o = opts();
    o.configmap = Some(ObjectRef::new("ConfigMap", "sluice-system", "sluice"));
    // Missing: the flags apply, with a warning.
    let s = translate(&w, &o);
    assert!(reasons(&s).contains(&"ConfigMapNotFound"));
    assert_eq!(
        s.route("plain.test", "/")
            .unwrap()
            .options
            .limits
            .max_body_size,
        None
    );
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "sluice-system", "name": "sluice"},
        "data": {"proxy-body-size": "1m", "ssl-redirect": "false", "hsts": "true",
                 "proxy-read-timeout": "soon", "use-proxy-protocol": "true"}
    }))
    .unwrap();
    w.put_config_map(cm);
    let s = translate(&w, &o);
    let plain = &s.route("plain.test", "/").unwrap().options;
    assert_eq!(plain.limits.max_body_size, Some(1 << 20));
    assert_eq!(
        plain.limits.read_timeout, None,
        "invalid value: the flag stays"
    );
    assert_eq!(plain.hsts.map(|h| h.max_age), Some(31_536_000));
    assert!(!s.settings().ssl_redirect);
    let own = &s.route("own.test", "/").unwrap().options;
    assert_eq!(own.limits.max_body_size, Some(2048));
    let problems: Vec<(&str, &str)> = s
        .problems()
        .iter()
        .map(|p| (p.reason, p.field.as_str()))
        .collect();
    assert!(problems.contains(&("InvalidConfigMapValue", "data[proxy-read-timeout]")));
    assert!(problems.contains(&("ConfigMapKeysNotHonoured", "data")));
}

/// `service-upstream`: the pool's one endpoint is the ClusterIP and the Service port; a
/// headless Service keeps its pod endpoints, with a warning.
#[test]
fn service_upstream_uses_the_cluster_ip() {
    use super::tests::{service, slice};
    let mut w = base_world();
    let mut svc = service(
        "default",
        "vip",
        serde_json::json!([{"port": 8080, "name": "http"}]),
    );
    if let Some(spec) = svc.spec.as_mut() {
        spec.cluster_ip = Some("10.96.0.10".into());
    }
    w.put_service(svc);
    w.put_service(service(
        "default",
        "headless",
        serde_json::json!([{"port": 80, "name": "http"}]),
    ));
    for name in ["vip", "headless"] {
        w.put_endpoint_slice(slice(
            "default",
            name,
            name,
            serde_json::json!([{"name": "http", "port": 9000}]),
            serde_json::json!([{"addresses": ["10.1.0.1"]}]),
        ));
    }
    let mut vip = simple("vip", "vip.test", &[("/", "Prefix", "vip")]);
    vip.spec.as_mut().unwrap().rules.as_mut().unwrap()[0]
        .http
        .as_mut()
        .unwrap()
        .paths[0]
        .backend
        .service
        .as_mut()
        .unwrap()
        .port
        .as_mut()
        .unwrap()
        .number = Some(8080);
    w.put_ingress(annotated(vip, &[("service-upstream", "true")]));
    w.put_ingress(annotated(
        simple("headless", "headless.test", &[("/", "Prefix", "headless")]),
        &[("service-upstream", "true")],
    ));
    let s = translate(&w, &opts());
    let eps = |svc: &str| -> Vec<String> {
        let c = s
            .clusters()
            .values()
            .find(|c| c.key.service == svc)
            .unwrap();
        c.endpoints.iter().map(|e| e.addr.to_string()).collect()
    };
    assert_eq!(eps("vip"), ["10.96.0.10:8080"]);
    assert!(
        s.clusters()
            .values()
            .any(|c| c.key.service == "vip" && c.service_upstream)
    );
    assert_eq!(eps("headless"), ["10.1.0.1:9000"]);
    assert!(reasons(&s).contains(&"NoClusterIP"));
}

/// `server-alias`: the alias serves the host's routes (regex ones as they match), unless an
/// Ingress defines the alias host.
#[test]
fn server_aliases_serve_the_same_routes() {
    let mut w = base_world();
    w.put_ingress(annotated(
        simple(
            "main",
            "main.test",
            &[("/api(/|$)(.*)", "ImplementationSpecific", "a")],
        ),
        &[
            ("server-alias", "alias.test, taken.test"),
            ("use-regex", "true"),
        ],
    ));
    w.put_ingress(simple("taken", "taken.test", &[("/", "Prefix", "b")]));
    let s = translate(&w, &opts());
    assert_eq!(hit(&s, "alias.test", "/API/x"), Some("a".into()));
    assert_eq!(hit(&s, "main.test", "/api"), Some("a".into()));
    assert_eq!(hit(&s, "taken.test", "/api/x"), Some("b".into()));
    assert_eq!(hit(&s, "alias.test", "/other"), None);
}

/// The ConfigMap's `custom-http-errors` serves Ingresses that have a default backend and no
/// list of their own; routes without a default backend keep no list (and the direct path).
#[test]
fn configmap_custom_errors_fill_in_for_ingresses_with_a_default_backend() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let mut w = base_world();
    w.put_ingress(annotated(
        simple("fallback", "fallback.test", &[("/", "Prefix", "a")]),
        &[("default-backend", "b")],
    ));
    w.put_ingress(annotated(
        simple("own", "own.test", &[("/", "Prefix", "a")]),
        &[("default-backend", "b"), ("custom-http-errors", "404")],
    ));
    w.put_ingress(simple("plain", "plain.test", &[("/", "Prefix", "a")]));
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "sluice-system", "name": "sluice"},
        "data": {"custom-http-errors": "503,502"},
    }))
    .unwrap();
    w.put_config_map(cm);
    let mut o = opts();
    o.configmap = Some(ObjectRef::new("ConfigMap", "sluice-system", "sluice"));
    let s = translate(&w, &o);
    let errors = |host: &str| {
        s.route(host, "/")
            .unwrap()
            .options
            .edits
            .custom_errors
            .clone()
    };
    assert_eq!(errors("fallback.test"), [502, 503]);
    assert_eq!(errors("own.test"), [404]);
    assert_eq!(errors("plain.test"), Vec::<u16>::new());
    assert!(
        !reasons(&s).contains(&"CustomErrorsWithoutBackend"),
        "the ConfigMap's list is no Ingress's mistake"
    );
}
