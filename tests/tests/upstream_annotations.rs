//! The ingress-nginx annotations about how sluice talks to pods, end to end through
//! `sluice serve` over real sockets: `use-regex`, `proxy-next-upstream(-tries)` against a pod
//! that is gone, the timeouts sluice checks but bounds its own way, bodies streamed both ways
//! whatever `proxy-buffering`/`proxy-request-buffering` say, the session cookie's attributes
//! and `affinity-mode`, `service-upstream`, and `server-snippet` refused (never executed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An address on which nothing listens (a pod that is gone: connections are refused).
async fn gone_pod() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

fn service_and_slices(name: &str, addrs: &[SocketAddr]) -> String {
    [service(name), endpoint_slices(name, addrs)].join("---\n")
}

async fn status_of(addr: SocketAddr, host: &str, path: &str) -> u16 {
    get(&client(), addr, host, path)
        .await
        .map(|r| r.status.as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_paths_match_case_insensitively_from_the_start() {
    let a = backend("pod-a").await;
    let m = Manifests::new();
    let write = |annotations: &[(&str, &str)]| {
        m.write(
            "all.yaml",
            &[
                ingress_class(),
                service_and_slices("web", &[a.addr]),
                annotated_ingress(
                    "rx",
                    "rx.test",
                    &[("/api/v[0-9]+/items", "ImplementationSpecific", "web")],
                    annotations,
                ),
            ]
            .join("---\n"),
        );
    };
    write(&[("nginx.ingress.kubernetes.io/use-regex", "true")]);
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    for (path, want) in [
        ("/api/v2/items", 200),
        ("/API/V17/Items/42", 200),
        ("/api/vx/items", 404),
        ("/x/api/v2/items", 404),
    ] {
        assert_eq!(status_of(http, "rx.test", path).await, want, "{path}");
    }
    // Without use-regex the same path is a literal prefix.
    write(&[]);
    assert!(
        eventually(Duration::from_secs(5), || async {
            status_of(http, "rx.test", "/api/v2/items").await == 404
        })
        .await
    );
}

/// A pod that dies under every request: it reads the request and closes without answering.
async fn dying_pod() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_upstream_moves_past_a_dying_pod_only_when_allowed() {
    let a = backend("pod-a").await;
    let dying = dying_pod().await;
    let gone = gone_pod().await;
    let m = Manifests::new();
    // One Service per Ingress, so that each has its own pool and its own view of the pods.
    let with = |name: &str, pods: &[SocketAddr], ann: &[(&str, &str)]| {
        let keys: Vec<(String, String)> = ann
            .iter()
            .chain([("load-balance", "round_robin")].iter())
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect();
        let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        [
            service_and_slices(name, pods),
            annotated_ingress(
                name,
                &format!("{name}.test"),
                &[("/", "Prefix", name)],
                &pairs,
            ),
        ]
        .join("---\n")
    };
    m.write(
        "all.yaml",
        &[
            ingress_class(),
            with(
                "retry",
                &[a.addr, dying],
                &[
                    ("proxy-next-upstream", "error timeout"),
                    ("proxy-next-upstream-tries", "2"),
                ],
            ),
            with("off", &[a.addr, dying], &[("proxy-next-upstream", "off")]),
            with(
                "once",
                &[a.addr, dying],
                &[("proxy-next-upstream-tries", "1")],
            ),
            // sluice differs here: a refused connection sent nothing, so it is tried elsewhere.
            with(
                "refused",
                &[a.addr, gone],
                &[("proxy-next-upstream", "off")],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let mut failed = std::collections::BTreeMap::new();
    for host in ["retry.test", "off.test", "once.test", "refused.test"] {
        let mut n = 0;
        for _ in 0..10 {
            if status_of(http, host, "/").await == 502 {
                n += 1;
            }
        }
        failed.insert(host, n);
    }
    assert_eq!(failed["retry.test"], 0, "{failed:?}");
    assert!(failed["off.test"] >= 1, "{failed:?}");
    assert!(failed["once.test"] >= 1, "{failed:?}");
    assert_eq!(failed["refused.test"], 0, "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_send_timeouts_are_checked_and_the_route_serves() {
    let a = backend("pod-a").await;
    let m = Manifests::new();
    let ing = |connect: &str, send: &str| {
        [
            ingress_class(),
            service_and_slices("web", &[a.addr]),
            nginx_ingress(
                "t",
                "web",
                &[
                    ("proxy-connect-timeout", connect),
                    ("proxy-send-timeout", send),
                ],
            ),
        ]
        .join("---\n")
    };
    m.write("all.yaml", &ing("5", "30"));
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    assert_eq!(status_of(http, "t.test", "/").await, 200);
    let status = status_text(&s).await;
    assert!(status.contains("proxy-connect-timeout differs"), "{status}");
    assert!(status.contains("proxy-send-timeout differs"), "{status}");

    m.write("all.yaml", &ing("soon", "30"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            status_text(&s).await.contains("proxy-connect-timeout")
                && status_text(&s).await.contains("soon")
        })
        .await,
        "an unreadable value is reported"
    );
    assert_eq!(
        status_of(http, "t.test", "/").await,
        200,
        "and the route serves"
    );
}

/// A pod that reports when the first half of a request body arrives, and answers with a
/// chunked body whose second chunk waits for `release`.
async fn streaming_pod() -> (
    SocketAddr,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (first_half_tx, first_half_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The head and the first 100 body bytes.
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "sluice closed before the body's first half");
            got.extend_from_slice(&buf[..n]);
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n")
                && got.len() - (end + 4) >= 100
            {
                break;
            }
        }
        let _ = first_half_tx.send(());
        // The rest of the 200 bytes.
        let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut body = got.len() - end;
        while body < 200 {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            body += n;
        }
        s.write_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-backend: stream\r\n\r\n5\r\nfirst\r\n",
        )
        .await
        .unwrap();
        let _ = release_rx.await;
        s.write_all(b"6\r\nsecond\r\n0\r\n\r\n").await.unwrap();
        let _ = s.read(&mut buf).await;
    });
    (addr, first_half_rx, release_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_whatever_buffering_says() {
    let (pod, first_half, release) = streaming_pod().await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &[
            ingress_class(),
            service_and_slices("web", &[pod]),
            nginx_ingress(
                "buf",
                "web",
                &[("proxy-buffering", "on"), ("proxy-request-buffering", "on")],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(b"POST /up HTTP/1.1\r\nHost: buf.test\r\nContent-Length: 200\r\n\r\n")
        .await
        .unwrap();
    c.write_all(&[b'x'; 100]).await.unwrap();
    // The pod sees the first half while the client still holds the second.
    tokio::time::timeout(Duration::from_secs(5), first_half)
        .await
        .expect("the request body is streamed, not buffered")
        .unwrap();
    c.write_all(&[b'y'; 100]).await.unwrap();
    // The client reads the first chunk while the pod still holds the second.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_first = async {
        while !String::from_utf8_lossy(&got).contains("first") {
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read_first)
        .await
        .expect("the response is streamed, not buffered");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(!String::from_utf8_lossy(&got).contains("second"));
    release.send(()).unwrap();
    let rest = async {
        while !String::from_utf8_lossy(&got).contains("second") {
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), rest)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_cookie_attributes_and_affinity_mode() {
    let pods = [backend("p1").await, backend("p2").await];
    let addrs: Vec<SocketAddr> = pods.iter().map(|p| p.addr).collect();
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &[
            ingress_class(),
            service_and_slices("svc", &addrs),
            annotated_ingress(
                "sticky",
                "sticky.test",
                &[("/app", "Prefix", "svc")],
                &[
                    ("nginx.ingress.kubernetes.io/affinity", "cookie"),
                    ("nginx.ingress.kubernetes.io/affinity-mode", "persistent"),
                    (
                        "nginx.ingress.kubernetes.io/session-cookie-expires",
                        "172800",
                    ),
                    ("nginx.ingress.kubernetes.io/session-cookie-path", "/app/"),
                    ("nginx.ingress.kubernetes.io/session-cookie-secure", "true"),
                ],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let first = request(http, "GET", "sticky.test", "/app/x", &[]).await;
    let set = first.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(set.starts_with("INGRESSCOOKIE="), "{set}");
    assert!(set.contains("; Path=/app/"), "{set}");
    assert!(set.contains("; Expires="), "{set}");
    assert!(set.contains("; Secure"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    let pod = first.backend().unwrap().to_string();
    for _ in 0..10 {
        let r = request(http, "GET", "sticky.test", "/app/x", &[("cookie", &cookie)]).await;
        assert_eq!(r.backend(), Some(pod.as_str()), "the session stays");
        assert!(r.headers.get("set-cookie").is_none());
    }
    let status = status_text(&s).await;
    assert!(status.contains("affinity-mode differs"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_upstream_sends_to_the_cluster_ip() {
    // The "ClusterIP" is 127.0.0.1 on pod-a's port; the endpoints name pod-b.
    let a = backend("pod-a").await;
    let b = backend("pod-b").await;
    let m = Manifests::new();
    let svc = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n  clusterIP: 127.0.0.1\n  ports:\n  - name: http\n    port: {}\n",
        a.addr.port()
    );
    let ing = |name: &str, ann: &[(&str, &str)]| {
        let keys: Vec<(String, String)> = ann
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
            .collect();
        let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        annotated_ingress(
            name,
            &format!("{name}.test"),
            &[("/", "Prefix", "web")],
            &pairs,
        )
        .replace(" number: 80", &format!(" number: {}", a.addr.port()))
    };
    let write = |annotations: &[(&str, &str)]| {
        m.write(
            "all.yaml",
            &[
                ingress_class(),
                svc.clone(),
                endpoint_slices("web", &[b.addr]),
                ing("upstream", annotations),
            ]
            .join("---\n"),
        );
    };
    write(&[("service-upstream", "true")]);
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let via = || async move {
        get(&client(), http, "upstream.test", "/")
            .await
            .ok()
            .and_then(|r| r.backend().map(str::to_string))
    };
    assert_eq!(via().await.as_deref(), Some("pod-a"), "the ClusterIP");
    // Without the annotation the same Service's endpoints (pod-b) serve.
    write(&[]);
    assert!(
        eventually(Duration::from_secs(5), || async {
            via().await.as_deref() == Some("pod-b")
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_snippet_is_refused_with_a_warning_and_the_routes_serve() {
    let a = backend("pod-a").await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &[
            ingress_class(),
            service_and_slices("web", &[a.addr]),
            nginx_ingress(
                "snip",
                "web",
                &[(
                    "server-snippet",
                    "location /evil { return 200 \"owned\"; }\nadd_header X-Evil 1;",
                )],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let r = get(&client(), http, "snip.test", "/evil").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.backend(),
        Some("pod-a"),
        "the pod answers, not the snippet"
    );
    assert!(!r.text().contains("owned"));
    assert!(r.headers.get("x-evil").is_none());
    let status = status_text(&s).await;
    assert!(status.contains("server-snippet refused"), "{status}");
}
