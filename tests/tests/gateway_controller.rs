//! `sluice controller` and the Gateway API on a real kube-apiserver (the pinned CRDs of
//! `manifests/gateway-api/` installed, the controller as the shipped ServiceAccount and RBAC):
//! status written by the leader, traffic on the Gateway's own address, and how fast a change
//! behind an HTTPRoute reaches traffic beside the same change behind an Ingress, measured in
//! one run (printed; the figures are reported, not asserted).
//!
//! The wider proof is the official suite (`tests/gateway-api/conformance.sh`); this test runs
//! in the ordinary test suite wherever the second tier's API server does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::apis::TestApi;
use sluice_tests::real_only;
use sluice_tests::*;

const GATEWAY_IP: &str = "198.18.0.41";

async fn install_crds(api: &TestApi) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/gateway-api");
    for kind in [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "referencegrants",
    ] {
        let yaml =
            std::fs::read_to_string(dir.join(format!("gateway.networking.k8s.io_{kind}.yaml")))
                .unwrap();
        api.apply_yaml(&yaml).await;
        let name = format!("{kind}.gateway.networking.k8s.io");
        assert!(
            eventually(Duration::from_secs(20), || async {
                api.get("CustomResourceDefinition", "", &name)
                    .await
                    .is_some_and(|c| {
                        c["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    })
            })
            .await,
            "CRD {name} established"
        );
    }
}

fn objects(svc: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: sluice.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  gatewayClassName: sluice
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [route.test]
  rules: [{{backendRefs: [{{name: {svc}, port: 80}}]}}]
"#
    )
}

fn condition(conds: &Value, kind: &str) -> Option<(String, String, i64)> {
    conds
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["observedGeneration"].as_i64().unwrap_or(-1),
            )
        })
}

async fn backend_of(addr: SocketAddr, host: &str) -> Option<String> {
    let r = get(&client(), addr, host, "/").await.ok()?;
    Some(if r.status == 200 {
        r.backend()?.to_string()
    } else {
        r.status.to_string()
    })
}

/// Polls both paths until each answers `want`; returns how long each took from `t0`.
async fn until_both(
    ingress: (SocketAddr, &str),
    gateway: (SocketAddr, &str),
    want: &str,
    t0: Instant,
) -> (Duration, Duration) {
    let (mut i, mut g) = (None, None);
    while (i.is_none() || g.is_none()) && t0.elapsed() < Duration::from_secs(10) {
        if i.is_none() && backend_of(ingress.0, ingress.1).await.as_deref() == Some(want) {
            i = Some(t0.elapsed());
        }
        if g.is_none() && backend_of(gateway.0, gateway.1).await.as_deref() == Some(want) {
            g = Some(t0.elapsed());
        }
    }
    (
        i.expect("the Ingress path follows"),
        g.expect("the HTTPRoute path follows"),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

real_only!(@then gateway_api, gateway_api_real, sluice_tests::apis::assert_no_denials);

async fn gateway_api(api: &TestApi) {
    install_crds(api).await;
    let a = backend_at("a", api.backend_addr()).await;
    let b = backend_at("b", api.backend_addr()).await;
    api.apply_yaml(
        &[
            ingress_class(),
            service("web"),
            endpoint_slices("web", &[a.addr]),
            service("web2"),
            endpoint_slices("web2", &[b.addr]),
        ]
        .join("---\n"),
    )
    .await;
    api.apply_yaml(&ingress("ing", "ingress.test", &[("/", "Prefix", "web")]))
        .await;
    api.apply_yaml(&objects("web")).await;
    let c = api
        .controller("gw-leader", &["--gateway-addresses", GATEWAY_IP])
        .await;

    // Status, as the leader writes it.
    assert!(
        eventually(Duration::from_secs(20), || async {
            let gw = api
                .get("Gateway", "default", "gw")
                .await
                .unwrap_or_default();
            let class = api
                .get("GatewayClass", "", "sluice")
                .await
                .unwrap_or_default();
            let route = api
                .get("HTTPRoute", "default", "r")
                .await
                .unwrap_or_default();
            condition(&class["status"]["conditions"], "Accepted")
                == Some(("True".into(), "Accepted".into(), 1))
                && condition(&gw["status"]["conditions"], "Programmed")
                    == Some(("True".into(), "Programmed".into(), 1))
                && gw["status"]["addresses"][0]["value"] == GATEWAY_IP
                && gw["status"]["listeners"][0]["attachedRoutes"] == 1
                && condition(&route["status"]["parents"][0]["conditions"], "Accepted")
                    == Some(("True".into(), "Accepted".into(), 1))
                && route["status"]["parents"][0]["controllerName"]
                    == "sluice.dev/gateway-controller"
        })
        .await,
        "GatewayClass, Gateway and HTTPRoute status: {:#?}",
        (
            api.get("Gateway", "default", "gw").await,
            api.get("HTTPRoute", "default", "r").await
        )
    );
    let features =
        api.get("GatewayClass", "", "sluice").await.unwrap()["status"]["supportedFeatures"].clone();
    assert!(
        features
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x["name"] == "HTTPRoute")),
        "{features}"
    );

    let ingress_at = (c.running.http_addr.unwrap(), "ingress.test");
    let gateway_addr: SocketAddr = format!("{GATEWAY_IP}:80").parse().unwrap();
    let gateway_at = (gateway_addr, "route.test");
    assert_eq!(
        backend_of(gateway_addr, "route.test").await.as_deref(),
        Some("a"),
        "served on the Gateway's address"
    );
    assert_eq!(
        backend_of(gateway_addr, "ingress.test").await.as_deref(),
        Some("404 Not Found"),
        "the Gateway serves no Ingress"
    );
    assert_eq!(
        backend_of(ingress_at.0, "route.test").await.as_deref(),
        Some("404 Not Found"),
        "the Ingress listener serves no HTTPRoute"
    );

    // The same change behind both, measured in one run: endpoint moves (the fast path), then
    // route changes (a rebuild), alternating directions.
    let (mut ep, mut rt) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let (to, name) = if round % 2 == 0 { (&b, "b") } else { (&a, "a") };
        let t0 = Instant::now();
        api.apply_yaml(&endpoint_slices("web", &[to.addr])).await;
        ep.push(until_both(ingress_at, gateway_at, name, t0).await);
    }
    api.apply_yaml(&endpoint_slices("web", &[a.addr])).await;
    let _ = until_both(ingress_at, gateway_at, "a", Instant::now()).await;
    for round in 0..5 {
        let (svc, want) = if round % 2 == 0 {
            ("web2", "b")
        } else {
            ("web", "a")
        };
        let t0 = Instant::now();
        api.apply_yaml(
            &[
                ingress("ing", "ingress.test", &[("/", "Prefix", svc)]),
                objects(svc),
            ]
            .join("---\n"),
        )
        .await;
        rt.push(until_both(ingress_at, gateway_at, want, t0).await);
    }
    let med = |v: &[(Duration, Duration)], f: fn(&(Duration, Duration)) -> Duration| {
        median(v.iter().map(f).collect())
    };
    println!(
        "propagation (5 rounds each, median from the API server's answer to the first request served the new way): endpoint change: Ingress {:?}, HTTPRoute {:?}; route change: Ingress {:?}, HTTPRoute {:?}",
        med(&ep, |x| x.0),
        med(&ep, |x| x.1),
        med(&rt, |x| x.0),
        med(&rt, |x| x.1),
    );

    // A route deleted and made again under its name is a new object: its status is written
    // again although it is the same as the old one's.
    api.delete("HTTPRoute", "default", "r").await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            api.get("HTTPRoute", "default", "r").await.is_none()
        })
        .await
    );
    api.apply_yaml(&objects("web")).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            let route = api
                .get("HTTPRoute", "default", "r")
                .await
                .unwrap_or_default();
            condition(&route["status"]["parents"][0]["conditions"], "Accepted")
                .is_some_and(|c| c.0 == "True")
        })
        .await,
        "the recreated route's status is written"
    );

    // A Gateway that goes closes its socket.
    api.delete("Gateway", "default", "gw").await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(gateway_addr).await.is_err()
        })
        .await,
        "the deleted Gateway's socket closes"
    );
    c.shutdown(Duration::from_secs(3)).await;
}
