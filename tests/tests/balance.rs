//! Balancing through real sockets: the SIG Ingress conformance load-balancing scenario (every
//! replica reached by sequential requests on new connections) run many times over, steering
//! away from a slow pod under concurrency, and the per-Ingress policies (round robin, hashing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use sluice_bench::backend::{Backend, BackendConfig};
use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn backends(n: usize, delay: Duration, slow: Option<(usize, Duration)>) -> Vec<Backend> {
    let mut out = Vec::new();
    for i in 0..n {
        let delay = match slow {
            Some((j, d)) if j == i => d,
            _ => delay,
        };
        out.push(
            Backend::start(
                "127.0.0.1:0".parse().unwrap(),
                BackendConfig {
                    name: format!("pod-{i}"),
                    body_size: 16,
                    http2: false,
                    delay,
                },
            )
            .await
            .unwrap(),
        );
    }
    out
}

/// One GET on a new connection (closed after the answer); returns the answering backend.
async fn once(addr: SocketAddr, host: &str, extra: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET / HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("x-backend: "))
        .unwrap_or_else(|| panic!("no x-backend in {text}"))
        .trim()
        .to_string()
}

fn serve_files(m: &Manifests, addrs: &[SocketAddr], annotations: &str) {
    let mut docs = one_service("lb.test", "svc", addrs);
    if !annotations.is_empty() {
        docs[3] = docs[3].replacen(
            "metadata:\n",
            &format!("metadata:\n  annotations:\n{annotations}"),
            1,
        );
    }
    m.write("all.yaml", &docs.join("---\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_is_reached_by_sequential_requests_every_time() {
    // The SIG conformance scenario: 10 replicas, 100 sequential requests, each on a new
    // connection, must reach all 10. Repeated 200 times against one running sluice, as
    // latency history builds up (peak EWMA failed this in 2 of 3 runs).
    let pods = backends(10, Duration::ZERO, None).await;
    let addrs: Vec<SocketAddr> = pods.iter().map(|b| b.addr).collect();
    let m = Manifests::new();
    serve_files(&m, &addrs, "");
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let mut misses = Vec::new();
    for round in 0..200 {
        let mut seen = BTreeSet::new();
        for _ in 0..100 {
            seen.insert(once(http, "lb.test", "").await);
        }
        if seen.len() != 10 {
            misses.push((round, seen.len()));
        }
    }
    assert!(
        misses.is_empty(),
        "rounds that missed a replica: {misses:?}"
    );
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_replica_gets_few_requests_under_concurrency() {
    // Ten replicas answering in 2 ms, one of them in 40 ms (20× slower); 16 keep-alive clients.
    let pods = backends(
        10,
        Duration::from_millis(2),
        Some((3, Duration::from_millis(40))),
    )
    .await;
    let addrs: Vec<SocketAddr> = pods.iter().map(|b| b.addr).collect();
    let m = Manifests::new();
    serve_files(&m, &addrs, "");
    let s = serve(m.dir.path(), &[]).await;
    let load = Load::start(s.running.http_addr.unwrap(), "lb.test", 16, Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = load.finish().await;
    assert!(st.failures.is_empty(), "{:?}", st.failures);
    let slow = st.by_backend.get("pod-3").copied().unwrap_or(0);
    let share = slow as f64 / st.ok as f64;
    assert!(st.ok > 1000, "{st:?}");
    assert!(
        share < 0.05,
        "the slow pod got {slow} of {} ({share:.3})",
        st.ok
    );
    // Every fast pod is still used.
    assert_eq!(st.by_backend.len(), 10, "{:?}", st.by_backend);
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashing_by_header_keeps_a_key_on_one_replica_and_round_robin_rotates() {
    let pods = backends(5, Duration::ZERO, None).await;
    let addrs: Vec<SocketAddr> = pods.iter().map(|b| b.addr).collect();
    let m = Manifests::new();
    serve_files(
        &m,
        &addrs,
        "    nginx.ingress.kubernetes.io/upstream-hash-by: $http_x_user\n",
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let mut by_user: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for round in 0..5 {
        for user in 0..40 {
            let b = once(http, "lb.test", &format!("X-User: user-{user}\r\n")).await;
            by_user.entry(format!("user-{user}")).or_default().insert(b);
        }
        let _ = round;
    }
    assert!(
        by_user.values().all(|b| b.len() == 1),
        "a key moved: {by_user:?}"
    );
    let used: BTreeSet<&String> = by_user.values().flatten().collect();
    assert!(used.len() >= 4, "keys spread over {used:?}");

    // Switch the same Ingress to round robin: five requests reach five replicas.
    serve_files(
        &m,
        &addrs,
        "    nginx.ingress.kubernetes.io/load-balance: round_robin\n",
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            let mut seen = BTreeSet::new();
            for _ in 0..5 {
                seen.insert(once(http, "lb.test", "X-User: user-1\r\n").await);
            }
            seen.len() == 5
        })
        .await
    );
    s.shutdown(Duration::from_secs(3)).await;
}

/// Status of one GET on a new connection.
async fn status_of(addr: SocketAddr, host: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `--upstream-max-connections` (nginx's max_conns): a request that finds the only endpoint at
/// its limit is answered 503 at once instead of piling onto it; an Ingress may raise its pool's
/// limit with `sluice.dev/upstream-max-connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_at_its_connection_limit_takes_no_more() {
    let pods = backends(1, Duration::from_millis(800), None).await;
    let addrs: Vec<SocketAddr> = pods.iter().map(|b| b.addr).collect();
    for (annotation, expect_busy) in [
        ("", true),
        ("    sluice.dev/upstream-max-connections: \"2\"\n", false),
    ] {
        let m = Manifests::new();
        serve_files(&m, &addrs, annotation);
        let s = serve(m.dir.path(), &["--upstream-max-connections", "1"]).await;
        let http = s.running.http_addr.unwrap();
        let first = tokio::spawn(status_of(http, "lb.test"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let second = status_of(http, "lb.test").await;
        if expect_busy {
            assert!(second.starts_with("HTTP/1.1 503"), "{second}");
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "answered at once"
            );
        } else {
            assert!(second.starts_with("HTTP/1.1 200"), "{annotation}: {second}");
        }
        assert!(first.await.unwrap().starts_with("HTTP/1.1 200"));
        s.shutdown(Duration::from_secs(3)).await;
    }
}
