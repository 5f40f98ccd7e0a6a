//! Route lookup and translation cost at 10,000 Ingresses.
//! Run: `cargo bench -p sluice-config --bench route_lookup`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde_json::json;
use sluice_config::{TranslateOptions, World, translate};

/// 10,000 Ingresses, each with its own host and three paths, plus a wildcard and a catch-all.
pub fn world(n: usize) -> World {
    let mut w = World::new();
    w.put_ingress_class(serde_json::from_value::<IngressClass>(json!({"metadata": {"name": "sluice"}, "spec": {"controller": "sluice.dev/ingress-controller"}})).unwrap());
    w.put_service(serde_json::from_value::<Service>(json!({"metadata": {"namespace": "default", "name": "svc"}, "spec": {"ports": [{"port": 80}]}})).unwrap());
    let path = |p: &str, t: &str| json!({"path": p, "pathType": t, "backend": {"service": {"name": "svc", "port": {"number": 80}}}});
    for i in 0..n {
        let host = if i == 0 {
            "*.wild.example.com".to_string()
        } else {
            format!("h{i}.example.com")
        };
        let ing = json!({"metadata": {"namespace": "default", "name": format!("i{i}")}, "spec": {"ingressClassName": "sluice", "rules": [
            {"host": host, "http": {"paths": [path("/", "Prefix"), path("/api", "Prefix"), path("/api/v1/exact", "Exact")]}}]}});
        w.put_ingress(serde_json::from_value::<Ingress>(ing).unwrap());
    }
    w
}

fn benches(c: &mut Criterion) {
    let w = world(10_000);
    let opts = TranslateOptions::default();
    let s = translate(&w, &opts);
    assert!(s.route("h5000.example.com", "/api/users/1").is_some());
    c.bench_function("route/exact-host prefix (10k ingresses)", |b| {
        b.iter(|| {
            black_box(s.route(
                black_box("h5000.example.com"),
                black_box("/api/users/1?x=1"),
            ))
        })
    });
    c.bench_function("route/exact path (10k ingresses)", |b| {
        b.iter(|| {
            black_box(s.route(
                black_box("h9999.example.com:443"),
                black_box("/api/v1/exact"),
            ))
        })
    });
    c.bench_function("route/upper-case host (10k ingresses)", |b| {
        b.iter(|| black_box(s.route(black_box("H42.Example.COM"), black_box("/"))))
    });
    c.bench_function("route/wildcard host (10k ingresses)", |b| {
        b.iter(|| black_box(s.route(black_box("x.wild.example.com"), black_box("/a/b/c"))))
    });
    c.bench_function("route/miss (10k ingresses)", |b| {
        b.iter(|| black_box(s.route(black_box("nope.example.com"), black_box("/"))))
    });
    let mut g = c.benchmark_group("translate");
    g.sample_size(10);
    g.bench_function("translate 10k ingresses", |b| {
        b.iter(|| black_box(translate(&w, &opts)))
    });
    g.finish();
}

criterion_group!(route, benches);
criterion_main!(route);
