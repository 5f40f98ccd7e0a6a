//! The controller ConfigMap's connection-level keys through `sluice serve`, applied without a
//! restart: `use-proxy-protocol` (the next connection must start with a PROXY header, whose
//! client address is the one sent upstream) and `enable-underscores-in-headers` (client fields
//! with `_` reach the backend instead of being dropped).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes `bytes` on a fresh connection and reads the whole answer.
async fn exchange(addr: SocketAddr, bytes: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// One backend and one Ingress (`cm.test`), served with the controller ConfigMap `data`.
async fn setup(data: &str) -> (Serving, Manifests, sluice_bench::backend::Backend) {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc"));
    m.write("eps.yaml", &endpoint_slices("svc", &[b.addr]));
    m.write(
        "ing.yaml",
        &ingress("cm", "cm.test", &[("/", "Prefix", "svc")]),
    );
    m.write("cm.yaml", &controller_configmap(data));
    let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
    (s, m, b)
}

const GET: &str = "GET /echo HTTP/1.1\r\nHost: cm.test\r\nX_Custom: 1\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_and_underscores_follow_the_configmap() {
    let (s, m, _b) = setup("  ssl-redirect: \"false\"\n").await;
    let http = s.running.http_addr.unwrap();

    let r = exchange(http, GET).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(!r.contains("x_custom"), "dropped by default: {r}");

    m.write(
        "cm.yaml",
        &controller_configmap(
            "  use-proxy-protocol: \"true\"\n  enable-underscores-in-headers: \"true\"\n",
        ),
    );
    let proxied = format!("PROXY TCP4 10.1.2.3 127.0.0.1 40000 80\r\n{GET}");
    let on = eventually(Duration::from_secs(10), || async {
        exchange(http, &proxied).await.starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(on, "the PROXY header is read once the ConfigMap says so");
    let r = exchange(http, &proxied).await;
    assert!(r.contains("x-real-ip=10.1.2.3\n"), "{r}");
    assert!(r.contains("x_custom=1\n"), "underscores pass: {r}");
    let r = exchange(http, GET).await;
    assert!(
        !r.starts_with("HTTP/1.1 200"),
        "a connection without the header is refused: {r}"
    );

    m.write(
        "cm.yaml",
        &controller_configmap("  use-proxy-protocol: \"false\"\n"),
    );
    let off = eventually(Duration::from_secs(10), || async {
        exchange(http, GET).await.starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(off, "back to plain connections");
}

/// Reads one response (head and `Content-Length` body) from a kept-alive connection.
async fn one_response(s: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return text;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            return String::from_utf8_lossy(&buf).into_owned();
        }
        buf.extend_from_slice(&byte[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_and_keep_alive_requests_bound_client_connections() {
    let (s, _m, _b) = setup("  keep-alive: \"1\"\n  keep-alive-requests: \"2\"\n").await;
    let http = s.running.http_addr.unwrap();
    let get = "GET / HTTP/1.1\r\nHost: cm.test\r\n\r\n";

    // The second request is the last: answered with Connection: close, then the end.
    let mut c = tokio::net::TcpStream::connect(http).await.unwrap();
    c.write_all(get.as_bytes()).await.unwrap();
    let first = one_response(&mut c).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    c.write_all(get.as_bytes()).await.unwrap();
    let second = one_response(&mut c).await;
    assert!(
        second.to_ascii_lowercase().contains("connection: close"),
        "{second}"
    );
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut rest)).await;
    assert!(matches!(end, Ok(Ok(0))), "closed after the last request");

    // An idle connection is closed after keep-alive (1 s).
    let mut c = tokio::net::TcpStream::connect(http).await.unwrap();
    c.write_all(get.as_bytes()).await.unwrap();
    let _ = one_response(&mut c).await;
    let t = std::time::Instant::now();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest)).await;
    assert!(matches!(end, Ok(Ok(0))), "closed while idle");
    assert!(
        t.elapsed() >= Duration::from_millis(700) && t.elapsed() < Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
}
