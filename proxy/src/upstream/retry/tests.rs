//! The retry rules, each on its own, against endpoints that misbehave in one way each (real
//! loopback sockets: refuse, reset or close after reading the request, half a head, garbage,
//! or answer well). Every endpoint counts the connections it accepted, so a test can say not
//! only whether a request succeeded but how many times it was sent where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Method, Request};
use sluice_config::{
    BalancePolicy, ClusterKey, ClusterSpec, EndpointSpec, EndpointState, NextUpstream,
    UpstreamProtocol,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::error::{Error, Kind, Side};
use crate::handler::ConnInfo;
use crate::telemetry::metrics::Metrics;
use crate::upstream::pool::{PoolRegistry, UpstreamSettings};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pod {
    /// Nothing listens: connect is refused.
    Refuse,
    /// Reads the request, then resets the connection (a pod killed mid-request).
    ResetAfterRequest,
    /// Reads the request, then closes the connection cleanly without answering.
    CloseAfterRequest,
    /// Reads the request, sends half a response head, closes.
    HalfHead,
    /// Answers with bytes that are not HTTP.
    Garbage,
    /// Answers 200.
    Good,
}

struct Fake {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

async fn read_head(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

async fn fake(pod: Pod) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    if pod == Pod::Refuse {
        drop(listener);
        return Fake { addr, accepted };
    }
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                while read_head(&mut s).await {
                    match pod {
                        Pod::ResetAfterRequest => {
                            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                            return;
                        }
                        Pod::CloseAfterRequest => return,
                        Pod::HalfHead => {
                            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nx-backend: ha").await;
                            return;
                        }
                        Pod::Garbage => {
                            let _ = s.write_all(b"HELLO THERE\r\n\r\n").await;
                            return;
                        }
                        Pod::Good => {
                            let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-backend: good\r\n\r\nok";
                            if s.write_all(r).await.is_err() {
                                return;
                            }
                        }
                        Pod::Refuse => return,
                    }
                }
            });
        }
    });
    Fake { addr, accepted }
}

fn cluster(fakes: &[&Fake]) -> Cluster {
    let spec = ClusterSpec {
        key: ClusterKey {
            namespace: "ns".into(),
            service: "svc".into(),
            port: 80,
        },
        protocol: UpstreamProtocol::Http1,
        balance: BalancePolicy::RoundRobin,
        endpoints: fakes
            .iter()
            .map(|f| EndpointSpec {
                addr: f.addr,
                state: EndpointState::Ready,
            })
            .collect(),
        max_in_flight: None,
        service_upstream: false,
        tls: None,
    };
    let pools = PoolRegistry::new(UpstreamSettings::default());
    Cluster::new(&spec, &pools, &Metrics::new())
}

async fn send_one(c: &Cluster, method: Method, plan: Plan) -> Result<Delivered, Error> {
    let req = Request::builder()
        .method(method)
        .uri("/x")
        .header("host", "app.test")
        .body(ReqBody::empty())
        .unwrap();
    let conn = ConnInfo::new(
        "127.0.0.1:40000".parse().unwrap(),
        "127.0.0.1:80".parse().unwrap(),
        false,
        false,
    );
    tokio::time::timeout(
        Duration::from_secs(10),
        send(c, req, plan, &conn.proxy_headers(), Instant::now()),
    )
    .await
    .expect("the request finished in time")
}

fn plan(tries: u32, method: &Method, next: NextUpstream) -> Plan {
    Plan::new(method, &next, tries, None)
}

fn retries(c: &Cluster, why: RetryReason) -> u64 {
    c.stats.retries[why as usize].get()
}

fn accepted(f: &Fake) -> usize {
    f.accepted.load(Ordering::SeqCst)
}

#[tokio::test]
async fn an_idempotent_request_moves_on_when_its_new_connection_breaks_before_the_answer() {
    for bad in [
        Pod::ResetAfterRequest,
        Pod::CloseAfterRequest,
        Pod::HalfHead,
    ] {
        let (a, b, good) = (fake(bad).await, fake(bad).await, fake(Pod::Good).await);
        let c = cluster(&[&a, &b, &good]);
        let get = Method::GET;
        let d = send_one(&c, get.clone(), plan(3, &get, NextUpstream::default()))
            .await
            .unwrap_or_else(|e| panic!("{bad:?}: {e}"));
        assert_eq!(d.endpoint.addr, good.addr, "{bad:?}");
        // Each broken pod saw the request at most once: it was ejected, not tried again.
        assert!(accepted(&a) <= 1 && accepted(&b) <= 1, "{bad:?}");
        let broke = (accepted(&a) + accepted(&b)) as u64;
        assert_eq!(retries(&c, RetryReason::BrokeAfterSend), broke, "{bad:?}");
        for f in [&a, &b] {
            let ep = c
                .endpoints
                .load()
                .members
                .iter()
                .find(|m| m.endpoint.addr == f.addr)
                .map(|m| Arc::clone(&m.endpoint))
                .unwrap();
            assert_eq!(
                ep.is_ejected(crate::clock::now_nanos()),
                accepted(f) == 1,
                "{bad:?}: a pod that broke a request is ejected"
            );
        }
    }
}

#[tokio::test]
async fn a_non_idempotent_request_is_never_sent_twice_unless_the_route_allows_it() {
    let post = Method::POST;
    let bad = fake(Pod::ResetAfterRequest).await;
    let c = cluster(&[&bad]);
    let e = send_one(&c, post.clone(), plan(3, &post, NextUpstream::default()))
        .await
        .unwrap_err();
    assert_eq!(e.side(), Side::Upstream, "{e}");
    assert_eq!(e.status(), http::StatusCode::BAD_GATEWAY, "{e}");
    assert_eq!(accepted(&bad), 1, "sent once");

    // `proxy-next-upstream: error non_idempotent` allows it.
    let (bad, good) = (fake(Pod::ResetAfterRequest).await, fake(Pod::Good).await);
    let c = cluster(&[&bad, &good]);
    let allow = NextUpstream {
        non_idempotent: true,
        ..NextUpstream::default()
    };
    for _ in 0..4 {
        let d = send_one(&c, post.clone(), plan(3, &post, allow))
            .await
            .unwrap();
        assert_eq!(d.endpoint.addr, good.addr);
    }
}

#[tokio::test]
async fn off_turns_replays_off_but_connect_failures_still_move_on() {
    let get = Method::GET;
    let off = NextUpstream {
        on_error: false,
        ..NextUpstream::default()
    };
    let bad = fake(Pod::ResetAfterRequest).await;
    let c = cluster(&[&bad]);
    assert!(send_one(&c, get.clone(), plan(3, &get, off)).await.is_err());
    assert_eq!(accepted(&bad), 1);

    // Nothing was sent to a refusing pod: safe for any method, whatever the route says.
    let (refuse, good) = (fake(Pod::Refuse).await, fake(Pod::Good).await);
    let c = cluster(&[&refuse, &good]);
    let post = Method::POST;
    for _ in 0..4 {
        let d = send_one(&c, post.clone(), plan(3, &post, off))
            .await
            .unwrap();
        assert_eq!(d.endpoint.addr, good.addr);
    }
}

#[tokio::test]
async fn an_answer_is_final_however_malformed() {
    let get = Method::GET;
    let (garbage, good) = (fake(Pod::Garbage).await, fake(Pod::Good).await);
    let c = cluster(&[&garbage, &good]);
    let mut failures = 0;
    for _ in 0..6 {
        if send_one(&c, get.clone(), plan(3, &get, NextUpstream::default()))
            .await
            .is_err()
        {
            failures += 1;
        }
    }
    // Round robin sends half of them to the garbage pod, and those are not retried.
    assert_eq!(failures, accepted(&garbage));
    assert!(failures > 0);
    assert_eq!(retries(&c, RetryReason::BrokeAfterSend), 0);
}

#[tokio::test]
async fn tries_bound_the_endpoints_a_request_reaches() {
    let get = Method::GET;
    let mut pods = Vec::new();
    for _ in 0..5 {
        pods.push(fake(Pod::ResetAfterRequest).await);
    }
    let c = cluster(&pods.iter().collect::<Vec<_>>());
    let e = send_one(&c, get.clone(), plan(3, &get, NextUpstream::default()))
        .await
        .unwrap_err();
    assert_eq!(e.side(), Side::Upstream, "{e}");
    assert_eq!(e.status(), http::StatusCode::BAD_GATEWAY, "{e}");
    let total: usize = pods.iter().map(accepted).sum();
    assert_eq!(total, 3, "three endpoints tried, no more");
    assert!(pods.iter().all(|p| accepted(p) <= 1));

    // The route's own tries win over the global setting.
    let mut pods = Vec::new();
    for _ in 0..5 {
        pods.push(fake(Pod::Refuse).await);
    }
    let c = cluster(&pods.iter().collect::<Vec<_>>());
    let two = NextUpstream {
        tries: Some(2),
        ..NextUpstream::default()
    };
    match send_one(&c, get.clone(), plan(5, &get, two)).await {
        Err(e) if e.kind() == Kind::ConnectRefused => assert_eq!(e.tries(), 2, "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(retries(&c, RetryReason::ConnectFailed), 1);
}

/// A listening port whose accept queue is full and never drained: the kernel drops further
/// SYNs, so a connect to it hangs, as to a node that went away without a word. The returned
/// sockets keep it that way while held.
fn blackhole() -> (SocketAddr, socket2::Socket, Vec<std::net::TcpStream>) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    s.listen(0).unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    let queued = (0..4)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
        })
        .collect();
    (addr, s, queued)
}

/// The connect timeout on tokio's paused clock: a pod whose connect never completes is
/// abandoned after `connect_timeout` of the runtime's time (not of the test's), ejected, and the
/// request goes to another endpoint; the next request does not try it again.
#[tokio::test(start_paused = true)]
async fn a_connect_that_hangs_is_abandoned_at_the_timeout_and_the_request_moves_on() {
    let (hole, _listener, _queued) = blackhole();
    let good = fake(Pod::Good).await;
    let hole = Fake {
        addr: hole,
        accepted: Arc::new(AtomicUsize::new(0)),
    };
    let c = cluster(&[&hole, &good]);
    let get = Method::GET;
    let conn = ConnInfo::new(
        "127.0.0.1:40000".parse().unwrap(),
        "127.0.0.1:80".parse().unwrap(),
        false,
        false,
    );
    let (wall, clock) = (std::time::Instant::now(), tokio::time::Instant::now());
    for _ in 0..3 {
        let req = Request::builder()
            .uri("/x")
            .header("host", "app.test")
            .body(ReqBody::empty())
            .unwrap();
        // No outer timeout here: on a paused clock it would fire whenever the runtime waits
        // for a socket.
        let d = send(
            &c,
            req,
            plan(3, &get, NextUpstream::default()),
            &conn.proxy_headers(),
            Instant::now(),
        )
        .await
        .unwrap();
        assert_eq!(d.endpoint.addr, good.addr);
    }
    assert_eq!(
        retries(&c, RetryReason::ConnectFailed),
        1,
        "the hanging endpoint was tried once, then ejected"
    );
    let timeout = UpstreamSettings::default().connect_timeout;
    assert!(clock.elapsed() >= timeout, "{:?}", clock.elapsed());
    assert!(
        wall.elapsed() < timeout,
        "the timeout passed on the paused clock, not the wall clock: {:?}",
        wall.elapsed()
    );
}
