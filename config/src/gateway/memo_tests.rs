//! [`super::RouteMemo`]: a translation with the memo gives what one without gives, whatever
//! changed in between, and reuses exactly the routes nothing touched.

use std::sync::Arc;

use serde_json::json;

use super::tests::{gateway, opts as gateway_opts, parse, route, world};
use super::{GatewayOptions, GatewayOutput, RouteMemo, translate, translate_with};
use crate::model::{BalancePolicy, Settings};
use crate::world::World;

/// The options and settings of a translation.
type Opts = (GatewayOptions, Settings);

fn opts() -> Opts {
    (gateway_opts(), Settings::default())
}

/// Translates with the memo and without, asserts both agree, and returns the memo's result.
fn both(w: &World, (o, s): &Opts, memo: &mut RouteMemo) -> GatewayOutput {
    let with = translate_with(w, o, s, Some(memo));
    let without = translate(w, o, s);
    assert_eq!(with.sockets, without.sockets, "sockets differ");
    assert_eq!(with.clusters, without.clusters, "pools differ");
    assert_eq!(with.certificates, without.certificates);
    assert_eq!(with.status, without.status);
    assert_eq!(with.unreadable_routes, without.unreadable_routes);
    with
}

/// The `(compiled, reused)` counts a step added.
fn step(memo: &RouteMemo, before: &mut (u64, u64)) -> (u64, u64) {
    let s = memo.stats();
    let d = (s.compiled - before.0, s.reused - before.1);
    *before = (s.compiled, s.reused);
    d
}

fn rules_of(t: &GatewayOutput) -> Vec<Arc<crate::gateway_model::GatewayRule>> {
    t.sockets
        .iter()
        .flat_map(|s| &s.listeners)
        .flat_map(|l| &l.hosts)
        .flat_map(|h| h.rules.iter().cloned())
        .collect()
}

fn slice(
    ns: &str,
    svc: &str,
    name: &str,
    ip: &str,
) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    parse(json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"port": 3000}],
        "endpoints": [{"addresses": [ip]}]}))
}

#[test]
fn the_memo_reuses_untouched_routes_and_never_changes_the_result() {
    let mut w = world();
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP",
                "allowedRoutes": {"namespaces": {"from": "All"}}}]),
    );
    let parent = json!([{"name": "gw", "namespace": "infra"}]);
    let to = |host: &str, backend: serde_json::Value| json!({"parentRefs": parent, "hostnames": [host], "rules": [{"backendRefs": [backend]}]});
    route(
        &mut w,
        "web",
        "r1",
        1,
        to("one.test", json!({"name": "web", "port": 8080})),
    );
    route(
        &mut w,
        "infra",
        "r2",
        2,
        json!({"parentRefs": parent, "hostnames": ["two.test"], "rules": [{
            "backendRefs": [{"name": "v1", "port": 8080}],
            "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "v2", "port": 8080}}}]}]}),
    );
    route(
        &mut w,
        "web",
        "r3",
        3,
        to(
            "three.test",
            json!({"name": "v3", "namespace": "infra", "port": 8080}),
        ),
    );
    route(
        &mut w,
        "infra",
        "r4",
        4,
        to("four.test", json!({"name": "later", "port": 8080})),
    );
    let rewrite_r1 = |w: &mut World| {
        route(
            w,
            "web",
            "r1",
            1,
            to("one.test", json!({"name": "web", "port": 9999})),
        );
    };
    let o = opts();
    let mut memo = RouteMemo::new();
    let mut seen = (0, 0);

    let first = both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (4, 0));

    // Nothing changed: every route reused, and its rules handed over as the same objects
    // (what lets the data plane keep their compiled backends).
    let attached = memo.stats().attached;
    let again = both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (0, 4));
    assert_eq!(
        memo.stats().attached - attached,
        4,
        "attachments reused too"
    );
    let (a, b) = (rules_of(&first), rules_of(&again));
    assert_eq!(a.len(), 4);
    assert!(a.iter().zip(&b).all(|(x, y)| Arc::ptr_eq(x, y)));

    // The Gateway changes (another listener): every route attaches again, none is compiled
    // again; then a Namespace appears (listeners may select by its labels): the same.
    let attached = memo.stats().attached;
    gateway(
        &mut w,
        "infra",
        "gw",
        0,
        json!([{"name": "http", "port": 80, "protocol": "HTTP",
                "allowedRoutes": {"namespaces": {"from": "All"}}},
               {"name": "other", "port": 81, "protocol": "HTTP"}]),
    );
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (0, 4));
    w.namespaces.insert(
        (String::new(), "web".into()),
        Arc::new(parse(
            json!({"metadata": {"name": "web", "labels": {"team": "a"}}}),
        )),
    );
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (0, 4));
    assert_eq!(memo.stats().attached, attached, "attached again");
    both(&w, &o, &mut memo);
    assert_eq!(memo.stats().attached - attached, 4);
    assert_eq!(step(&memo, &mut seen), (0, 4));

    // One route rewritten: that one alone compiled again.
    rewrite_r1(&mut w);
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (1, 3));

    // The endpoints of a Service only a mirror names: the mirroring route compiled again.
    w.put_endpoint_slice(slice("infra", "v2", "v2-x", "10.0.0.9"));
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (1, 3));

    // A second slice for a Service (an insert in the middle of the map), then gone again.
    w.put_endpoint_slice(slice("infra", "v1", "v1-y", "10.0.0.8"));
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (1, 3));
    w.delete_endpoint_slice(&("infra".into(), "v1-y".into()));
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (1, 3));

    // The missing Service appears: the route naming it compiled again, and now resolved.
    w.put_service(parse::<k8s_openapi::api::core::v1::Service>(json!({
        "metadata": {"namespace": "infra", "name": "later"},
        "spec": {"ports": [{"port": 8080}]}})));
    let t = both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (1, 3));
    let r4 = &t.status.routes[&("infra".to_string(), "r4".to_string())];
    assert!(r4.parents[0].conditions.iter().all(|c| c.status));

    // A ReferenceGrant: every route compiled again (the cross-namespace one now resolves).
    w.reference_grants.insert(
        ("infra".into(), "g".into()),
        Arc::new(parse(json!({
            "metadata": {"namespace": "infra", "name": "g"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "web"}],
                     "to": [{"group": "", "kind": "Service"}]}}))),
    );
    let t = both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (4, 0));
    let r3 = &t.status.routes[&("web".to_string(), "r3".to_string())];
    assert!(r3.parents[0].conditions.iter().all(|c| c.status));

    // The pool settings (every pool carries them): every route compiled again.
    let mut o2 = o.clone();
    o2.1.balance = BalancePolicy::RoundRobin;
    let t = both(&w, &o2, &mut memo);
    assert_eq!(step(&memo, &mut seen), (4, 0));
    assert!(
        t.clusters
            .iter()
            .all(|c| c.balance == BalancePolicy::RoundRobin)
    );
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (4, 0));

    // A route deleted, and one re-created as another object with the same name: the deleted
    // one is gone from the output, the new one compiled.
    w.http_routes.remove(&("infra".into(), "r2".into()));
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (0, 3));
    rewrite_r1(&mut w);
    both(&w, &o, &mut memo);
    assert_eq!(step(&memo, &mut seen), (1, 2));
}
