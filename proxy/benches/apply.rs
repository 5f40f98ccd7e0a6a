//! Cost of applying configuration at 10,000 Ingresses: the endpoints-only fast path (one pool
//! swapped) against a full `apply` of a snapshot that differs in one pool's endpoints.
//! Run: `cargo bench -p sluice-proxy --bench apply`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde_json::json;
use sluice_config::{ClusterKey, EndpointSpec, EndpointState, TranslateOptions, World, translate};
use sluice_proxy::{DataPlane, ProxySettings};

/// `n` Ingresses, each with its own Service of 5 endpoints.
fn world(n: usize, extra_port: u16) -> World {
    let mut w = World::new();
    w.put_ingress_class(serde_json::from_value::<IngressClass>(json!({"metadata": {"name": "sluice"}, "spec": {"controller": "sluice.dev/ingress-controller"}})).unwrap());
    for i in 0..n {
        let svc = format!("svc{i}");
        w.put_service(serde_json::from_value::<Service>(json!({"metadata": {"namespace": "default", "name": svc}, "spec": {"ports": [{"port": 80, "name": "http"}]}})).unwrap());
        let port = if i == 0 { extra_port } else { 8080 };
        let eps: Vec<_> = (0..5)
            .map(|e| json!({"addresses": [format!("10.{}.{}.{}", i / 250, i % 250, e + 1)]}))
            .collect();
        w.put_endpoint_slice(serde_json::from_value::<EndpointSlice>(json!({"metadata": {"namespace": "default", "name": format!("{svc}-x"), "labels": {"kubernetes.io/service-name": svc}}, "addressType": "IPv4", "ports": [{"name": "http", "port": port}], "endpoints": eps})).unwrap());
        let ing = json!({"metadata": {"namespace": "default", "name": format!("i{i}")}, "spec": {"ingressClassName": "sluice", "rules": [
            {"host": format!("h{i}.example.com"), "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": svc, "port": {"number": 80}}}}]}}]}});
        w.put_ingress(serde_json::from_value::<Ingress>(ing).unwrap());
    }
    w
}

fn benches(c: &mut Criterion) {
    sluice_proxy::crypto::install_default_provider();
    let opts = TranslateOptions::default();
    let dp = DataPlane::new(ProxySettings::default(), None).unwrap();
    let (a, b) = (
        translate(&world(10_000, 8080), &opts),
        translate(&world(10_000, 9090), &opts),
    );
    dp.apply(a.clone());
    let key = ClusterKey {
        namespace: "default".into(),
        service: "svc0".into(),
        port: 80,
    };
    let eps = |port: u16| -> Vec<EndpointSpec> {
        (1..=5)
            .map(|e| EndpointSpec {
                addr: SocketAddr::from(([10, 0, 0, e], port)),
                state: EndpointState::Ready,
            })
            .collect()
    };
    let (e1, e2) = (eps(8080), eps(9090));
    let mut flip = false;
    c.bench_function("update_endpoints one pool (10k ingresses)", |bch| {
        bch.iter(|| {
            flip = !flip;
            black_box(dp.update_endpoints(&key, if flip { &e2 } else { &e1 }, None))
        })
    });
    let mut g = c.benchmark_group("apply");
    g.sample_size(10);
    let mut flip = false;
    g.bench_function("full apply, one pool changed (10k ingresses)", |bch| {
        // The snapshot clone is setup, not part of the measured apply.
        bch.iter_batched(
            || {
                flip = !flip;
                if flip { b.clone() } else { a.clone() }
            },
            |s| black_box(dp.apply(s)),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("apply of an equal snapshot (skipped)", |bch| {
        bch.iter_batched(
            || a.clone(),
            |s| black_box(dp.apply(s)),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(apply, benches);
criterion_main!(apply);
