//! The idle-connection benchmark's client (`sluice-bench idle`) against a real sluice: every
//! connection, HTTP/1.1, HTTPS and HTTP/2, gets its one request answered through a route and
//! is then held open and silent; and the check that counts open connections sees the ones the
//! server closed (EOF, or GOAWAY on HTTP/2), so a peer that drops idle clients cannot pass for
//! a cheap one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use sluice_bench::load::{Connector, TlsSpec, TlsVersion, Verify};
use sluice_bench::peers::HOST;
use sluice_bench::scenario::idle::{Variant, hold};
use sluice_tests::*;

/// Connections per variant: enough to open many at once, few enough for a test.
const N: usize = 60;

fn tls() -> TlsSpec {
    TlsSpec {
        version: TlsVersion::Any,
        verify: Verify::Insecure,
        resumption: false,
        server_name: HOST.into(),
    }
}

fn connector(addr: std::net::SocketAddr, v: Variant) -> Arc<Connector> {
    let alpn: &[&[u8]] = match v {
        Variant::H2 => &[b"h2"],
        _ => &[b"http/1.1"],
    };
    let tls = (v != Variant::Http).then(tls);
    Arc::new(Connector::with_alpn(vec![addr], tls.as_ref(), alpn).unwrap())
}

/// sluice serving `HOST` over HTTP and HTTPS to one backend; `keep_alive` seconds for idle
/// client connections (the ConfigMap's `keep-alive` and `--client-idle-timeout`).
async fn sluice(keep_alive: u64) -> (Serving, Manifests, sluice_bench::backend::Backend) {
    let b = backend("pod").await;
    let m = Manifests::new();
    tls_site(&m, HOST, b.addr);
    m.write(
        "cm.yaml",
        &controller_configmap(&format!("  keep-alive: \"{keep_alive}\"\n")),
    );
    let idle = keep_alive.to_string();
    let s = serve(
        m.dir.path(),
        &[
            "--configmap",
            "default/sluice",
            "--client-idle-timeout",
            &idle,
        ],
    )
    .await;
    let http = s.running.http_addr.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&client(), http, HOST, "/")
                .await
                .map(|r| r.status == 200)
                .unwrap_or(false)
        })
        .await
    );
    (s, m, b)
}

fn addr_for(s: &Serving, v: Variant) -> std::net::SocketAddr {
    match v {
        Variant::Http => s.running.http_addr.unwrap(),
        _ => s.running.https_addr.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_variant_is_answered_through_the_route_and_stays_open() {
    let (s, _m, _b) = sluice(75).await;
    for v in [Variant::Http, Variant::Https, Variant::H2] {
        let mut held = hold(connector(addr_for(&s, v), v), v, N).await;
        assert!(held.errors.is_empty(), "{v:?}: {:?}", held.errors);
        assert_eq!(held.streams.len(), N, "{v:?}: every connection answered");
        assert_eq!(held.non_2xx, 0, "{v:?}: through the route, not a local 404");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(held.count_open().await, N, "{v:?}: all still open");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closed_while_idle_are_not_counted_open() {
    let (s, _m, _b) = sluice(1).await;
    for v in [Variant::Http, Variant::Https, Variant::H2] {
        let mut held = hold(connector(addr_for(&s, v), v), v, 10).await;
        assert_eq!(held.streams.len(), 10, "{v:?}: {:?}", held.errors);
        assert_eq!(held.count_open().await, 10, "{v:?}: open right after");
        // Past the one-second keep-alive (and the idle watchdog's granularity).
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(held.count_open().await, 0, "{v:?}: every one closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_does_not_match_is_counted_as_not_2xx() {
    // No Ingress for the host the client names: sluice answers 404 itself.
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    let s = serve(m.dir.path(), &[]).await;
    let v = Variant::Http;
    let held = hold(connector(addr_for(&s, v), v), v, 5).await;
    assert_eq!(held.streams.len(), 5, "{:?}", held.errors);
    assert_eq!(held.non_2xx, 5);
}
