//! Requests at the edges of HTTP/1.1, through real sockets: which host the upstream is told,
//! ambiguous or missing `Host`, `CONNECT`, a client that leaves before its answer, and an
//! upstream that switches protocols unasked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `sluice serve` routing `edge.test` to `addrs`; keep the returned values alive.
async fn start(addrs: &[SocketAddr]) -> (Serving, SocketAddr, Manifests) {
    let m = Manifests::new();
    for (i, yaml) in one_service("edge.test", "svc", addrs).iter().enumerate() {
        m.write(&format!("{i}.yaml"), yaml);
    }
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    (s, http, m)
}

/// Sends `raw` on a new connection and reads until the server closes it (or 5 s pass).
async fn exchange(addr: SocketAddr, raw: &str) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(raw.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_the_host_the_request_was_routed_on() {
    let b = backend("a").await;
    let (_s, http, _m) = start(&[b.addr]).await;

    // Absolute-form: routed on the target's authority, so that is the Host sent on.
    let r = exchange(
        http,
        "GET http://edge.test/echo HTTP/1.1\r\nHost: elsewhere.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("http/1.1 200"), "{r}");
    assert!(r.contains("\nhost=edge.test\n"), "{r}");
    assert!(!r.contains("elsewhere"), "{r}");

    // `Connection: host` does not strip the Host the route was chosen by.
    let r = exchange(
        http,
        "GET /echo HTTP/1.1\r\nHost: edge.test\r\nConnection: host, close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("http/1.1 200"), "{r}");
    assert!(r.contains("\nhost=edge.test\n"), "{r}");
    assert!(r.contains("\nx-forwarded-host=edge.test\n"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_or_missing_host_and_connect_are_refused() {
    let b = backend("a").await;
    let (_s, http, _m) = start(&[b.addr]).await;
    for (raw, status) in [
        // Fast path and hyper path (a body sends it to hyper) alike.
        (
            "GET / HTTP/1.1\r\nHost: edge.test\r\nHost: other.test\r\n\r\n",
            "400",
        ),
        (
            "POST / HTTP/1.1\r\nHost: edge.test\r\nHost: other.test\r\nContent-Length: 1\r\n\r\nx",
            "400",
        ),
        ("GET / HTTP/1.1\r\n\r\n", "400"),
        (
            "CONNECT edge.test:443 HTTP/1.1\r\nHost: edge.test:443\r\n\r\n",
            "405",
        ),
    ] {
        let r = exchange(http, raw).await;
        assert!(
            r.starts_with(&format!("http/1.1 {status}")),
            "{raw:?} → {r}"
        );
        assert!(r.contains("server: sluice"), "{r}");
    }
    assert_eq!(
        b.requests.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "nothing reached the backend"
    );
    // And the route still serves.
    let ok = exchange(
        http,
        "GET / HTTP/1.1\r\nHost: edge.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(ok.starts_with("http/1.1 200"), "{ok}");
}

/// In-flight requests sluice counts for the (single) endpoint, from the admin API.
async fn in_flight(admin: SocketAddr) -> u64 {
    let got = get(&client(), admin, "localhost", "/api/v1/upstreams")
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["endpoints"].as_array().cloned().unwrap_or_default())
        .map(|e| e["in_flight"].as_u64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_cancels_its_request() {
    let b = backend("a").await;
    let (s, http, _m) = start(&[b.addr]).await;
    let admin = s.running.admin_addr;
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(b"GET /?delay_ms=8000 HTTP/1.1\r\nHost: edge.test\r\n\r\n")
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(3), || async {
            in_flight(admin).await == 1
        })
        .await,
        "the slow request is in flight"
    );
    drop(c);
    // The backend would answer only after 8 s; the request is dropped as soon as the client is.
    assert!(
        eventually(Duration::from_secs(3), || async {
            in_flight(admin).await == 0
        })
        .await,
        "the request ended with its client"
    );
    // Pipelined requests sent while the first is served are still answered in order.
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(b"GET /?delay_ms=200 HTTP/1.1\r\nHost: edge.test\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.write_all(b"GET /?size=3 HTTP/1.1\r\nHost: edge.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2, "{text}");
    assert!(text.ends_with("\r\n\r\nxxx"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_nobody_asked_for_is_a_bad_gateway() {
    // An upstream that answers every request with a 101.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n",
                    )
                    .await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            });
        }
    });
    let (_s, http, _m) = start(&[addr]).await;
    let r = exchange(
        http,
        "GET / HTTP/1.1\r\nHost: edge.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("http/1.1 502"), "{r}");
    assert!(!r.contains("upgrade"), "{r}");
}
