//! The headline promise: steady load through `sluice serve` while the EndpointSlice file flips
//! between 5 and 7 backends and the removed backends really stop — zero failed requests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_bench::backend::Backend;
use sluice_tests::*;

/// How a removed backend goes away, in the orders Kubernetes allows.
#[derive(Debug, Clone, Copy)]
enum Removal {
    /// Endpoint removed, then the pod gets SIGTERM (graceful).
    RemoveThenTerm,
    /// SIGTERM first (listener closes at once), endpoint removed a little later.
    TermThenRemove,
    /// Endpoint removed and the pod killed at the same moment (abrupt).
    AbruptKill,
}

async fn churn(removal: Removal) {
    let m = Manifests::new();
    let mut pods: Vec<Backend> = Vec::new();
    for i in 0..5 {
        pods.push(backend(&format!("pod-{i}")).await);
    }
    let write_slices = |pods: &[Backend]| {
        let addrs: Vec<_> = pods.iter().map(|p| p.addr).collect();
        m.write("eps.yaml", &endpoint_slices("web", &addrs));
    };
    m.write(
        "base.yaml",
        &[
            ingress_class(),
            service("web"),
            ingress("web", "web.test", &[("/", "Prefix", "web")]),
        ]
        .join("---\n"),
    );
    write_slices(&pods);
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&client(), http, "web.test", "/")
                .await
                .map(|r| r.status == 200)
                .unwrap_or(false)
        })
        .await
    );

    let load = Load::start(http, "web.test", 16, Duration::from_millis(1));
    let mut next = 5;
    for _cycle in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Scale 5 → 7: two new pods.
        for _ in 0..2 {
            pods.push(backend(&format!("pod-{next}")).await);
            next += 1;
        }
        write_slices(&pods);
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Scale 7 → 5: the two oldest pods go away.
        let gone: Vec<Backend> = pods.drain(..2).collect();
        match removal {
            Removal::RemoveThenTerm => {
                write_slices(&pods);
                tokio::time::sleep(Duration::from_millis(100)).await;
                for p in gone {
                    p.stop_graceful().await;
                }
            }
            Removal::TermThenRemove => {
                for p in &gone {
                    p.begin_stop();
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
                write_slices(&pods);
                for p in gone {
                    p.stop_graceful().await;
                }
            }
            Removal::AbruptKill => {
                write_slices(&pods);
                for p in gone {
                    p.kill();
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = load.finish().await;
    s.shutdown(Duration::from_secs(5)).await;
    assert!(st.ok > 500, "too little load to mean anything: {st:?}");
    assert!(
        st.failures.is_empty(),
        "{removal:?}: {} failed of {}: {:?}",
        st.failures.len(),
        st.ok + st.failures.len() as u64,
        &st.failures[..st.failures.len().min(10)]
    );
    assert!(
        st.by_backend.len() >= 9,
        "traffic should have reached old and new pods: {:?}",
        st.by_backend
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_remove_then_sigterm() {
    churn(Removal::RemoveThenTerm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_sigterm_then_remove() {
    churn(Removal::TermThenRemove).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_abrupt_kill() {
    churn(Removal::AbruptKill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_under_load_loses_nothing() {
    let a = backend("a").await;
    let r = data_plane(&[]).await;
    let http = r.http_addr.unwrap();
    r.dp.apply(snapshot(&one_service("app.test", "svc", &[a.addr])));
    let load = Load::start(http, "app.test", 8, Duration::ZERO);
    let slow: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                get(&client(), http, "app.test", "/?delay_ms=600")
                    .await
                    .unwrap()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dp = std::sync::Arc::clone(&r.dp);
    let admin = r.admin_addr;
    let shutdown = tokio::spawn(r.shutdown(Duration::from_secs(5)));
    // Readiness turns false at once.
    assert!(eventually(Duration::from_secs(2), || async { dp.is_draining() }).await);
    let _ = admin;
    for s in slow {
        let g = s.await.unwrap();
        assert_eq!(g.status, 200, "in-flight request finished during shutdown");
    }
    assert!(
        shutdown.await.unwrap(),
        "all connections drained within the deadline"
    );
    let st = load.finish().await;
    // Keep-alive clients see their connection closed after a response; requests that then
    // find the listener closed are connect errors, never a broken request.
    let broken: Vec<_> = st
        .failures
        .iter()
        .filter(|f| !f.contains("Connect"))
        .collect();
    assert!(broken.is_empty(), "requests broken by shutdown: {broken:?}");
    assert!(st.ok > 50);
    assert!(
        tokio::net::TcpStream::connect(http).await.is_err(),
        "listener closed"
    );
}
