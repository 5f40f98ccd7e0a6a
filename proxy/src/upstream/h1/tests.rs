//! The HTTP/1 client against hand-written upstreams on 127.0.0.1: what it writes, how it reads
//! each kind of response, and when a connection goes back to the pool.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use http_body_util::BodyExt;
use sluice_config::UpstreamProtocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::error::Kind;
use crate::upstream::body::ReqBody;
use crate::upstream::endpoint::Endpoint;
use crate::upstream::pool::{PoolKey, PoolRegistry, UpstreamSettings};
use crate::wire::{Framing, Head, ReqFraming, encode_head, request_framing, response_framing};

/// Reads one request head (up to the blank line) plus `body` more bytes.
async fn read_request(s: &mut TcpStream, body: usize) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.ok()? == 0 {
            return None;
        }
        got.push(b[0]);
    }
    let mut rest = vec![0u8; body];
    s.read_exact(&mut rest).await.ok()?;
    got.extend_from_slice(&rest);
    Some(got)
}

/// An upstream that answers every request on every connection with `answer`, counting
/// connections and recording requests.
async fn upstream(
    answer: &'static [u8],
) -> (
    SocketAddr,
    Arc<AtomicUsize>,
    tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let c = Arc::clone(&conns);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(req) = read_request(&mut s, 0).await {
                    let _ = tx.send(req);
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns, rx)
}

/// An upstream that answers the first request on every connection with `answer` and then
/// closes it (after `linger`); counts connections.
async fn answer_once(answer: &'static [u8], linger: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&conns);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = read_request(&mut s, 0).await;
                let _ = s.write_all(answer).await;
                tokio::time::sleep(linger).await;
            });
        }
    });
    (addr, conns)
}

fn endpoint(addr: SocketAddr) -> Arc<Endpoint> {
    endpoint_with(addr, UpstreamSettings::default())
}

fn endpoint_with(addr: SocketAddr, settings: UpstreamSettings) -> Arc<Endpoint> {
    let reg = PoolRegistry::new(settings);
    let pool = reg.get(PoolKey {
        addr,
        protocol: UpstreamProtocol::Http1,
        tls: None,
    });
    Arc::new(Endpoint::new(addr, pool))
}

/// A body-less request sent on a checked-out connection: the connection (its response body
/// not read yet), the response head, its framing and whether the connection may be reused.
async fn send_bodyless(
    ep: &Arc<Endpoint>,
    method: &Method,
) -> (crate::upstream::pool::Checkout, Head, Framing, bool) {
    let mut headers = HeaderMap::new();
    headers.insert("host", "up.example".parse().unwrap());
    let body = ReqBody::empty();
    let framing = request_framing(method, &mut headers, &body);
    let head = encode_head(
        method,
        "/x",
        &headers,
        framing,
        &crate::wire::encode::tests::fwd(),
    );
    let mut co = ep
        .pool
        .checkout_h1(false, std::time::Instant::now())
        .await
        .unwrap();
    let (mut h, upload) = send(&mut co.conn.conn, &head, body, framing).await.unwrap();
    assert!(upload.is_none(), "the request was written completely");
    let (fr, ka) = response_framing(&mut h, *method == Method::HEAD).unwrap();
    (co, h, fr, ka)
}

/// One request through checkout → send → body; returns status, headers, body and trailers.
async fn get(
    ep: &Arc<Endpoint>,
    method: Method,
) -> (http::StatusCode, HeaderMap, Bytes, Option<HeaderMap>) {
    let (co, h, fr, ka) = send_bodyless(ep, &method).await;
    let b = H1Body::new(co.conn, fr, ka, ep.start(), None);
    let collected = b.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (h.status, h.headers, collected.to_bytes(), trailers)
}

#[tokio::test]
async fn keep_alive_reuses_one_connection() {
    let (addr, conns, mut reqs) =
        upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").await;
    let ep = endpoint(addr);
    for _ in 0..5 {
        let (status, _, body, _) = get(&ep, Method::GET).await;
        assert_eq!(status, 200);
        assert_eq!(&body[..], b"hello");
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "five requests, one connection"
    );
    let first = reqs.recv().await.unwrap();
    assert_eq!(
        crate::wire::encode::tests::without_id(&first),
        "GET /x HTTP/1.1\r\nhost: up.example\r\nx-forwarded-for: 127.0.0.1\r\nx-real-ip: 127.0.0.1\r\n\
         x-forwarded-proto: http\r\nx-forwarded-host: up.example\r\nx-forwarded-port: 80\r\n\r\n"
    );
    assert_eq!(ep.in_flight(), 0);
}

#[tokio::test]
async fn chunked_responses_and_trailers_are_decoded_and_reused() {
    let (addr, conns, _r) = upstream(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n",
    )
    .await;
    let ep = endpoint(addr);
    for _ in 0..3 {
        let (_, _, body, trailers) = get(&ep, Method::GET).await;
        assert_eq!(&body[..], b"abcde");
        assert_eq!(trailers.unwrap()["x-t"], "1");
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn head_and_interim_responses_carry_no_body() {
    let (addr, conns, _r) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n").await;
    let ep = endpoint(addr);
    for _ in 0..3 {
        let (status, h, body, _) = get(&ep, Method::HEAD).await;
        assert_eq!(status, 200);
        assert_eq!(
            h["content-length"], "1000",
            "HEAD keeps the length it announced"
        );
        assert!(body.is_empty());
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let (addr, _, _r) = upstream(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n").await;
    let (status, h, body, _) = get(&endpoint(addr), Method::GET).await;
    assert_eq!(status, 204);
    assert!(!h.contains_key("link"), "interim heads are skipped");
    assert!(body.is_empty());
}

#[tokio::test]
async fn close_delimited_and_connection_close_responses_are_not_reused() {
    let (addr, conns) = answer_once(b"HTTP/1.1 200 OK\r\n\r\nuntil close", Duration::ZERO).await;
    let ep = endpoint(addr);
    for _ in 0..2 {
        let (_, _, body, _) = get(&ep, Method::GET).await;
        assert_eq!(&body[..], b"until close");
    }
    assert_eq!(conns.load(Ordering::SeqCst), 2);
    assert_eq!(ep.pool.idle_count(), 0);
}

#[tokio::test]
async fn a_truncated_body_is_an_error_and_the_connection_is_dropped() {
    let (addr, _) = answer_once(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        Duration::ZERO,
    )
    .await;
    let ep = endpoint(addr);
    let (co, _, fr, ka) = send_bodyless(&ep, &Method::GET).await;
    let err = H1Body::new(co.conn, fr, ka, ep.start(), None)
        .collect()
        .await;
    assert!(
        matches!(&err, Err(e) if e.kind() == Kind::Truncated),
        "{err:?}"
    );
    assert_eq!(ep.pool.idle_count(), 0);
    assert_eq!(ep.in_flight(), 0);
}

#[tokio::test]
async fn an_upstream_silent_mid_body_times_out_and_the_connection_is_dropped() {
    // Half the body, then silence (the connection stays open).
    let (addr, _) = answer_once(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.",
        Duration::from_secs(10),
    )
    .await;
    let ep = endpoint_with(
        addr,
        UpstreamSettings {
            read_timeout: Duration::from_millis(300),
            ..UpstreamSettings::default()
        },
    );
    let (co, _, fr, ka) = send_bodyless(&ep, &Method::GET).await;
    let started = std::time::Instant::now();
    let mut b = H1Body::new(co.conn, fr, ka, ep.start(), None);
    let first = b.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "half.");
    let err = tokio::time::timeout(Duration::from_secs(5), b.frame())
        .await
        .expect("the read timeout ends the wait")
        .unwrap();
    assert!(
        matches!(&err, Err(e) if matches!(e.kind(), Kind::UpstreamReadTimeout(_))),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(ep.pool.idle_count(), 0);
    assert_eq!(ep.in_flight(), 0);
}

#[tokio::test]
async fn an_idle_connection_closed_by_the_peer_is_not_handed_out() {
    // Answers one request, then closes the idle connection.
    let (addr, conns) = answer_once(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        Duration::ZERO,
    )
    .await;
    let ep = endpoint(addr);
    get(&ep, Method::GET).await;
    assert_eq!(ep.pool.idle_count(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let co = ep
        .pool
        .checkout_h1(false, std::time::Instant::now())
        .await
        .unwrap();
    assert!(!co.reused, "the closed idle connection was skipped");
    assert_eq!(ep.pool.idle_count(), 0, "and dropped");
    drop(co);
    // The new connection works.
    let (status, _, body, _) = get(&ep, Method::GET).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
    assert!(conns.load(Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn the_sweep_sheds_an_idle_connections_buffers_and_the_connection_still_serves() {
    let (live, conns, _reqs) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let ep = endpoint(live);
    get(&ep, Method::GET).await;
    let now = std::time::Instant::now;
    let co = ep.pool.checkout_h1(false, now()).await.unwrap();
    assert!(co.reused);
    assert!(
        co.conn.conn.buffered_capacity() >= 8 * 1024,
        "a connection that has read a response keeps its buffer while it is busy"
    );
    co.conn.release();
    assert_eq!(ep.pool.sweep_idle(), 0, "a live idle connection stays");
    let co = ep.pool.checkout_h1(false, now()).await.unwrap();
    assert!(co.reused, "the shed connection is still handed out");
    assert_eq!(
        co.conn.conn.buffered_capacity(),
        0,
        "the sweep gave the buffers back, and checking the connection did not regrow them"
    );
    co.conn.release();
    // The shed connection reads the next answer whole, into a buffer it allocates again.
    let (status, _, body, _) = get(&ep, Method::GET).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "one connection served both"
    );
    let co = ep.pool.checkout_h1(false, now()).await.unwrap();
    assert!(co.reused && co.conn.conn.buffered_capacity() >= 8 * 1024);
}

#[tokio::test]
async fn the_sweep_closes_idle_connections_the_peer_closed_and_keeps_live_ones() {
    let (closing, _) = answer_once(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        Duration::ZERO,
    )
    .await;
    let (live, _, _reqs) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let (a, b) = (endpoint(closing), endpoint(live));
    get(&a, Method::GET).await;
    get(&b, Method::GET).await;
    assert_eq!((a.pool.idle_count(), b.pool.idle_count()), (1, 1));
    // The peer's FIN arrives; without a sweep the socket would sit in CLOSE_WAIT until the
    // next checkout.
    let swept = async {
        loop {
            if a.pool.sweep_idle() == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), swept)
        .await
        .expect("the closed connection is swept");
    assert_eq!(a.pool.idle_count(), 0);
    assert_eq!(b.pool.sweep_idle(), 0, "a live idle connection stays");
    assert_eq!(b.pool.idle_count(), 1);
    let co = b
        .pool
        .checkout_h1(false, std::time::Instant::now())
        .await
        .unwrap();
    assert!(co.reused, "and is reused afterwards");
}

#[tokio::test]
async fn request_bodies_are_framed_by_length_or_chunked() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // Read until the chunked terminator arrives, then answer.
        while !all.ends_with(b"0\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            all.extend_from_slice(&buf[..n]);
        }
        tx.send(all).unwrap();
        s.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
    });
    // A streamed request body of unknown length, the way a chunked client upload arrives.
    let (incoming, _client) =
        client_body(b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n").await;
    let (body, framing, head) = upload_of(Method::POST, "/up", incoming);
    assert_eq!(framing, ReqFraming::Chunked);
    let ep = endpoint(addr);
    let mut co = ep
        .pool
        .checkout_h1(false, std::time::Instant::now())
        .await
        .unwrap();
    let (h, upload) = send(&mut co.conn.conn, &head, body, framing).await.unwrap();
    assert_eq!(h.status, 201);
    assert!(upload.is_none());
    let got = String::from_utf8(rx.recv().await.unwrap()).unwrap();
    assert!(got.starts_with("POST /up HTTP/1.1\r\n"), "{got}");
    assert!(got.contains("\r\ntransfer-encoding: chunked\r\n"), "{got}");
    assert!(
        got.ends_with("4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n"),
        "{got}"
    );
}

/// A client request body as our server hands it over: `raw` is written to a hyper HTTP/1
/// server over an in-memory pipe, and the request's `Incoming` body is returned with the
/// client end of the pipe (keep it alive for a body that has not finished).
async fn client_body(raw: &'static [u8]) -> (hyper::body::Incoming, tokio::io::DuplexStream) {
    let (mut client_side, server_side) = tokio::io::duplex(4096);
    let (req_tx, req_rx) = tokio::sync::oneshot::channel();
    let hold = std::sync::Mutex::new(Some(req_tx));
    tokio::spawn(async move {
        let svc = hyper::service::service_fn(move |r: http::Request<hyper::body::Incoming>| {
            if let Some(tx) = hold.lock().ok().and_then(|mut h| h.take()) {
                let _ = tx.send(r.into_body());
            }
            async {
                Ok::<_, std::convert::Infallible>(http::Response::new(
                    http_body_util::Empty::<Bytes>::new(),
                ))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(server_side), svc)
            .await;
    });
    client_side.write_all(raw).await.unwrap();
    (req_rx.await.unwrap(), client_side)
}

/// The pieces of an upload of `incoming` as `method target`: body, framing, encoded head.
fn upload_of(
    method: Method,
    target: &str,
    incoming: hyper::body::Incoming,
) -> (ReqBody, ReqFraming, Bytes) {
    let mut headers = HeaderMap::new();
    let body = ReqBody::new(Some(incoming), 1 << 20);
    let framing = request_framing(&method, &mut headers, &body);
    let head = encode_head(
        &method,
        target,
        &headers,
        framing,
        &crate::wire::encode::tests::fwd(),
    );
    (body, framing, head)
}

#[tokio::test]
async fn an_early_answer_stops_the_upload_and_the_connection_is_not_reused() {
    // Answers without reading the body, and keeps the connection open.
    let (addr, _) = answer_once(
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    // A body that never ends: only the early answer can finish the exchange.
    let (incoming, _client) =
        client_body(b"PUT / HTTP/1.1\r\nhost: a\r\ncontent-length: 100000\r\n\r\npartial").await;
    let (body, framing, head) = upload_of(Method::PUT, "/", incoming);
    assert_eq!(framing, ReqFraming::Length(100_000));
    let ep = endpoint(addr);
    let mut co = ep
        .pool
        .checkout_h1(false, std::time::Instant::now())
        .await
        .unwrap();
    let (mut h, upload) = tokio::time::timeout(
        Duration::from_secs(3),
        send(&mut co.conn.conn, &head, body, framing),
    )
    .await
    .expect("the early answer ends the exchange")
    .unwrap();
    assert_eq!(h.status, 413);
    let (fr, ka) = response_framing(&mut h, false).unwrap();
    let body = H1Body::new(co.conn, fr, ka, ep.start(), upload);
    tokio::time::timeout(Duration::from_secs(3), body.collect())
        .await
        .expect("the answer ends although the upload never does")
        .unwrap();
    assert_eq!(
        ep.pool.idle_count(),
        0,
        "the body was cut short, so the connection cannot be reused"
    );
}

#[tokio::test]
async fn a_full_duplex_answer_streams_while_the_upload_goes_on() {
    // Answers at once with the length of the request body, then echoes the body as it reads it.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let end = loop {
            let mut chunk = [0u8; 1024];
            let n = s.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
            .await
            .unwrap();
        let mut seen = buf.len() - end;
        s.write_all(&buf[end..]).await.unwrap();
        while seen < 10 {
            let mut chunk = [0u8; 1024];
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                return;
            }
            seen += n;
            s.write_all(&chunk[..n]).await.unwrap();
        }
        // Keep the connection open: it goes back to sluice's pool.
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let (incoming, mut client) =
        client_body(b"PUT / HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\nfirst").await;
    let (body, framing, head) = upload_of(Method::PUT, "/", incoming);
    let ep = endpoint(addr);
    let mut co = ep
        .pool
        .checkout_h1(false, std::time::Instant::now())
        .await
        .unwrap();
    let (mut h, upload) = send(&mut co.conn.conn, &head, body, framing).await.unwrap();
    assert_eq!(h.status, 200);
    assert!(
        upload.is_some(),
        "the answer came before the body was complete"
    );
    let (fr, ka) = response_framing(&mut h, false).unwrap();
    let mut body = H1Body::new(co.conn, fr, ka, ep.start(), upload);
    // The first half comes back before the client has sent the second.
    let first = tokio::time::timeout(Duration::from_secs(3), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    client.write_all(b"later").await.unwrap();
    let rest = tokio::time::timeout(Duration::from_secs(3), body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "later");
    assert_eq!(
        ep.pool.idle_count(),
        1,
        "both directions completed: the connection is reused"
    );
}

#[tokio::test]
async fn connections_a_burst_left_are_closed_once_unneeded_for_an_idle_timeout_under_steady_use() {
    let (live, conns, _reqs) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let settings = UpstreamSettings {
        idle_timeout: Duration::from_millis(600),
        ..UpstreamSettings::default()
    };
    let ep = endpoint_with(live, settings);
    let now = std::time::Instant::now;
    // A burst: three requests at once, three connections, all back in the pool.
    let burst = [
        ep.pool.checkout_h1(true, now()).await.unwrap(),
        ep.pool.checkout_h1(true, now()).await.unwrap(),
        ep.pool.checkout_h1(true, now()).await.unwrap(),
    ];
    for co in burst {
        co.conn.release();
    }
    assert_eq!(ep.pool.idle_count(), 3);
    // Then steady traffic, one request at a time: each checkout takes the oldest, so every
    // connection is used in turn (every 60 ms or so) and none gets old; a sweep every 20 ms.
    // The first window (600 ms) starts the count; the second closes the surplus.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(2000) {
        let co = ep.pool.checkout_h1(false, now()).await.unwrap();
        assert!(co.reused);
        co.conn.release();
        ep.pool.sweep_idle();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ep.pool.idle_count(),
        1,
        "the two connections one request at a time never needed were closed"
    );
    let (status, _, body, _) = get(&ep, Method::GET).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
    assert_eq!(conns.load(Ordering::SeqCst), 3, "the one kept still serves");
}
