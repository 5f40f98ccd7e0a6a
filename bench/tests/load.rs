//! The load generator's own tests, all on loopback and each a few seconds at most: rate
//! accuracy, every error class provoked on purpose, and coordinated-omission correction.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_bench::backend::{Backend, BackendConfig};
use sluice_bench::load::{self, Hooks, LoadReport, LoadSpec, Mode, TlsSpec, TlsVersion, Verify};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn backend() -> Backend {
    Backend::start(
        "127.0.0.1:0".parse().unwrap(),
        BackendConfig {
            name: "b1".into(),
            body_size: 1024,
            http2: false,
            delay: std::time::Duration::ZERO,
        },
    )
    .await
    .unwrap()
}

fn spec(addr: SocketAddr, path: &str, rate: Option<f64>, conns: usize, secs: f64) -> LoadSpec {
    LoadSpec {
        addrs: vec![addr],
        host: "bench.local".into(),
        path: path.into(),
        tls: None,
        mode: rate.map_or(Mode::Closed, |rate| Mode::Open { rate }),
        connections: conns,
        duration: Duration::from_secs_f64(secs),
        timeout: Duration::from_millis(500),
        keep_alive: true,
    }
}

async fn run(s: &LoadSpec) -> LoadReport {
    tokio::time::timeout(Duration::from_secs(10), load::run(s, Hooks::default()))
        .await
        .expect("the run is bounded")
        .unwrap()
}

/// Reads one request head (up to the empty line); false on EOF.
async fn read_head(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    true
}

/// A raw server; `each` handles every accepted connection.
async fn raw_server<F, Fut>(each: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let each = Arc::new(each);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(each(s));
        }
    });
    addr
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_the_requested_rate() {
    let b = backend().await;
    let r = run(&spec(b.addr, "/", Some(2000.0), 20, 2.0)).await;
    assert!(
        (r.achieved_rps - 2000.0).abs() < 60.0,
        "achieved {}",
        r.achieved_rps
    );
    assert!(r.rate_kept, "{:?}", r.rate_note);
    assert_eq!(r.requests_failed, 0);
    assert_eq!(r.errors.total(), 0);
    assert_eq!(r.backends_seen["b1"].count, r.responses);
    assert!(r.timeline.len() >= 2);
    assert!(r.latency_ms.p50 < 20.0, "{:?}", r.latency_ms);
    let b2 = b.requests.load(Ordering::Relaxed);
    assert_eq!(b2, r.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_port_is_a_connect_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let r = run(&spec(port, "/", Some(200.0), 2, 1.0)).await;
    assert!(r.requests > 150);
    assert_eq!(r.truth.connect_refused, r.requests);
    assert_eq!(r.errors.connect, r.requests);
    assert_eq!(r.requests_failed, r.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_closing_after_accept_is_a_read_error() {
    let addr = raw_server(|s| async move { drop(s) }).await;
    let r = run(&spec(addr, "/", Some(100.0), 2, 1.0)).await;
    assert!(r.requests > 50);
    // Every request went out on a fresh connection that the server closed: failed after send.
    assert_eq!(
        r.truth.failed_after_send + r.truth.write_failed,
        r.requests,
        "{:?}",
        r.truth
    );
    assert_eq!(r.truth.failed_after_send_retryable, 0);
    assert!(r.errors.read >= r.truth.failed_after_send);
    assert_eq!(r.requests_failed, r.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_close_by_server_is_not_a_failed_request() {
    // Answers one request, then closes the idle connection 30 ms later.
    let addr = raw_server(|mut s| async move {
        if read_head(&mut s).await {
            let _ = s.write_all(OK).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    })
    .await;
    let r = run(&spec(addr, "/", Some(10.0), 1, 1.0)).await;
    assert_eq!(r.requests_failed, 0, "{:?}", r.truth);
    assert!(r.idle_closed_by_server >= r.requests - 1, "{r:?}");
    assert_eq!(r.errors.read, r.idle_closed_by_server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_that_never_answers_times_out() {
    let addr = raw_server(|mut s| async move {
        read_head(&mut s).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let r = run(&spec(addr, "/", Some(20.0), 2, 1.0)).await;
    assert!(r.truth.response_timeout > 0);
    assert_eq!(r.errors.timeout, r.truth.response_timeout);
    assert_eq!(r.requests_failed, r.requests);
    assert_eq!(r.responses, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_503_is_non_2xx() {
    let b = backend().await;
    let r = run(&spec(b.addr, "/?status=503", Some(200.0), 4, 1.0)).await;
    assert!(r.requests > 150);
    assert_eq!(r.errors.status_non2xx, r.requests);
    assert_eq!(r.truth.status_5xx, r.requests);
    assert_eq!(r.status[&503], r.requests);
    assert_eq!(r.requests_failed, r.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_a_plain_server_is_a_handshake_failure() {
    let b = backend().await;
    let mut s = spec(b.addr, "/", Some(100.0), 2, 1.0);
    s.tls = Some(TlsSpec {
        version: TlsVersion::Any,
        verify: Verify::Insecure,
        resumption: true,
        server_name: "bench.local".into(),
    });
    let r = run(&s).await;
    assert!(r.requests > 50);
    assert_eq!(r.truth.handshake_failed, r.requests, "{:?}", r.truth);
    assert_eq!(r.errors.connect, r.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_counts_from_the_schedule_through_a_stall() {
    // The 50th request stalls for 500 ms. At 100 req/s on one connection, the 50 requests
    // scheduled during the stall wait behind it: their latency must show it (no coordinated
    // omission), so well over 1% of requests are slow.
    let n = Arc::new(AtomicU64::new(0));
    let addr = raw_server(move |mut s| {
        let n = Arc::clone(&n);
        async move {
            while read_head(&mut s).await {
                if n.fetch_add(1, Ordering::Relaxed) == 49 {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                if s.write_all(OK).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let mut sp = spec(addr, "/", Some(100.0), 1, 2.0);
    sp.timeout = Duration::from_secs(2);
    let r = run(&sp).await;
    assert_eq!(r.requests_failed, 0);
    assert!(r.latency_ms.p99 >= 400.0, "p99 {:?}", r.latency_ms);
    assert!(r.latency_ms.p90 >= 100.0, "p90 {:?}", r.latency_ms);
    assert!(r.latency_ms.p50 < 20.0, "p50 {:?}", r.latency_ms);
    assert!(r.latency_ms.max >= 490.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_and_connection_per_request() {
    let b = backend().await;
    let r = run(&spec(b.addr, "/", None, 8, 1.0)).await;
    assert!(r.achieved_rps > 1000.0, "{}", r.achieved_rps);
    assert_eq!(r.requests_failed, 0);
    let mut s = spec(b.addr, "/", None, 4, 0.5);
    s.keep_alive = false;
    let r = run(&s).await;
    assert!(r.requests > 100);
    assert_eq!(r.requests_failed, 0);
    assert_eq!(r.idle_closed_by_server, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_and_1_3_against_a_tls_server() {
    // A minimal rustls server answering one request per connection.
    let cert = sluice_bench::certs::rsa2048(&["bench.local"]).unwrap();
    let key: rustls_pki_types::PrivateKeyDer<'static> =
        rustls_pki_types::pem::PemObject::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(sluice_bench::load::conn::provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert_der.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut t) = acceptor.accept(s).await {
                    let mut b = [0u8; 4096];
                    let _ = t.read(&mut b).await;
                    let _ = t
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        )
                        .await;
                    let _ = t.shutdown().await;
                }
            });
        }
    });
    for version in [TlsVersion::V12, TlsVersion::V13] {
        let mut s = spec(addr, "/", Some(100.0), 4, 0.5);
        s.keep_alive = false;
        s.tls = Some(TlsSpec {
            version,
            verify: Verify::Roots(vec![cert.cert_der.clone()]),
            resumption: false,
            server_name: "bench.local".into(),
        });
        let r = run(&s).await;
        assert!(r.requests >= 45, "{version:?}: {}", r.requests);
        assert_eq!(r.requests_failed, 0, "{version:?}: {:?}", r.truth);
    }
}
