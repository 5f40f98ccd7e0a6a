//! One test per reconfiguration verb: the request in flight completes across the change, and
//! the next request sees the new configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_proxy::ApplyOutcome;
use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Starts a slow request (the backend waits `ms` before answering).
fn slow(addr: std::net::SocketAddr, host: &str, ms: u64) -> tokio::task::JoinHandle<Got> {
    let host = host.to_string();
    tokio::spawn(async move {
        get(&client(), addr, &host, &format!("/slow?delay_ms={ms}"))
            .await
            .unwrap()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_added() {
    let (a, b) = (backend("a").await, backend("b").await);
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr])));
    let inflight = slow(http, "app.test", 400);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr, b.addr]))),
        ApplyOutcome::Applied {
            clusters_created: 0,
            endpoint_swaps: 1,
            ..
        }
    ));
    let c = client();
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&c, http, "app.test", "/").await.unwrap().backend() == Some("b")
        })
        .await,
        "new endpoint gets traffic"
    );
    let done = inflight.await.unwrap();
    assert_eq!((done.status.as_u16(), done.backend()), (200, Some("a")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_removed_while_a_slow_request_runs_on_it() {
    let (a, b) = (backend("a").await, backend("b").await);
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr])));
    let inflight = slow(http, "app.test", 500);
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.dp.apply(snapshot(&one_service("app.test", "svc", &[b.addr])));
    let c = client();
    for _ in 0..20 {
        assert_eq!(
            get(&c, http, "app.test", "/").await.unwrap().backend(),
            Some("b"),
            "removed endpoint gets nothing new"
        );
    }
    let done = inflight.await.unwrap();
    assert_eq!(
        (done.status.as_u16(), done.backend()),
        (200, Some("a")),
        "in-flight request finished on the removed endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_added_and_removed() {
    let (a, b) = (backend("a").await, backend("b").await);
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    let base = one_service("app.test", "svc", &[a.addr]);
    r.dp.apply(snapshot(&base));
    let c = client();
    assert_eq!(get(&c, http, "new.test", "/").await.unwrap().status, 404);
    let mut more = base.clone();
    more.extend([
        service("other"),
        endpoint_slices("other", &[b.addr]),
        ingress("ing-new", "new.test", &[("/", "Prefix", "other")]),
    ]);
    let inflight = slow(http, "app.test", 400);
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.dp.apply(snapshot(&more));
    assert_eq!(
        get(&c, http, "new.test", "/").await.unwrap().backend(),
        Some("b"),
        "route added"
    );
    assert_eq!(inflight.await.unwrap().status, 200);
    // Remove it again while a request on it is in flight.
    let inflight = slow(http, "new.test", 400);
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.dp.apply(snapshot(&base));
    assert_eq!(
        get(&c, http, "new.test", "/").await.unwrap().status,
        404,
        "route removed"
    );
    let done = inflight.await.unwrap();
    assert_eq!((done.status.as_u16(), done.backend()), (200, Some("b")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_snapshot_replaced_and_equal_snapshot_skipped() {
    let (a, b) = (backend("a").await, backend("b").await);
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    let first = one_service("app.test", "svc", &[a.addr]);
    assert!(matches!(
        r.dp.apply(snapshot(&first)),
        ApplyOutcome::Applied { .. }
    ));
    let generation = r.dp.generation();
    assert_eq!(r.dp.apply(snapshot(&first)), ApplyOutcome::Unchanged);
    assert_eq!(
        r.dp.generation(),
        generation,
        "an equal snapshot is skipped"
    );
    let inflight = slow(http, "app.test", 400);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome =
        r.dp.apply(snapshot(&one_service("other.test", "svc2", &[b.addr])));
    assert!(
        matches!(
            outcome,
            ApplyOutcome::Applied {
                clusters_created: 1,
                clusters_removed: 1,
                ..
            }
        ),
        "{outcome:?}"
    );
    let c = client();
    assert_eq!(get(&c, http, "app.test", "/").await.unwrap().status, 404);
    assert_eq!(
        get(&c, http, "other.test", "/").await.unwrap().backend(),
        Some("b")
    );
    assert_eq!(inflight.await.unwrap().backend(), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_only_fast_path_swaps_one_pool() {
    let (a, b) = (backend("a").await, backend("b").await);
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr])));
    let key = sluice_config::ClusterKey {
        namespace: "default".into(),
        service: "svc".into(),
        port: 80,
    };
    let spec = vec![sluice_config::EndpointSpec {
        addr: b.addr,
        state: sluice_config::EndpointState::Ready,
    }];
    let gen_before = r.dp.generation();
    assert!(r.dp.update_endpoints(&key, &spec, Some(std::time::Instant::now())));
    assert_eq!(r.dp.generation(), gen_before, "routes were not rebuilt");
    assert_eq!(
        get(&client(), http, "app.test", "/")
            .await
            .unwrap()
            .backend(),
        Some("b")
    );
    // Going back to the first snapshot must not be skipped: the pool diverged from it.
    assert!(matches!(
        r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr]))),
        ApplyOutcome::Applied { .. }
    ));
    assert_eq!(
        get(&client(), http, "app.test", "/")
            .await
            .unwrap()
            .backend(),
        Some("a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_stays_open_across_an_unrelated_route_change() {
    let (a, b) = (backend("a").await, backend("b").await);
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    let base = one_service("app.test", "svc", &[a.addr]);
    r.dp.apply(snapshot(&base));
    let mut s = tokio::net::TcpStream::connect(http).await.unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    async fn echo(s: &mut tokio::net::TcpStream, msg: &[u8]) {
        s.write_all(msg).await.unwrap();
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, msg);
    }
    echo(&mut s, b"before the change").await;
    let mut more = base.clone();
    more.extend([
        service("other"),
        endpoint_slices("other", &[b.addr]),
        ingress("ing-new", "new.test", &[("/", "Prefix", "other")]),
    ]);
    r.dp.apply(snapshot(&more));
    echo(&mut s, b"after the change").await;
    r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr, b.addr])));
    echo(&mut s, b"after an endpoint change").await;
}
