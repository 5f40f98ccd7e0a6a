//! The HTTP/1 fast path through real sockets: pipelining across the hand-over to hyper,
//! `Connection: close`, `HEAD`, and the header-read deadline against a slow client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One response read off `s`: status, head text (lowercase), body. `head_request` responses
/// carry no body.
async fn read_response(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> Option<(u16, String, Vec<u8>)> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let status = head[9..12].parse().unwrap();
    let len: usize = if head_request {
        0
    } else {
        head.lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    while buf.len() < end + len {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[end..end + len].to_vec();
    buf.drain(..end + len);
    Some((status, head, body))
}

/// `sluice serve` with one route (`fast.test` → backend `a`); keep all four alive.
async fn start(
    extra: &[&str],
) -> (
    Serving,
    SocketAddr,
    sluice_bench::backend::Backend,
    Manifests,
) {
    let b = backend("a").await;
    let m = Manifests::new();
    for (name, yaml) in one_service("fast.test", "svc", &[b.addr])
        .iter()
        .enumerate()
    {
        m.write(&format!("{name}.yaml"), yaml);
    }
    let s = serve(m.dir.path(), extra).await;
    let http = s.running.http_addr.unwrap();
    (s, http, b, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_survive_the_hand_over_to_hyper() {
    let (_s, http, _b, _m) = start(&[]).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    // A fast-path GET, a POST with a body (served by hyper from here on), then a GET,
    // all in one write.
    c.write_all(
        b"GET /echo HTTP/1.1\r\nHost: fast.test\r\n\r\n\
          POST /echo HTTP/1.1\r\nHost: fast.test\r\nContent-Length: 5\r\n\r\nhello\
          HEAD /echo HTTP/1.1\r\nHost: fast.test\r\n\r\n\
          GET /echo HTTP/1.1\r\nHost: fast.test\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let (st, head, body) = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!(st, 200);
    assert!(
        head.contains("\r\nserver: sluice\r\n") && head.contains("\r\ndate: "),
        "{head}"
    );
    assert!(String::from_utf8_lossy(&body).contains("method=GET"));
    let (st, _, body) = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!(st, 200);
    let body = String::from_utf8_lossy(&body).to_string();
    assert!(
        body.contains("method=POST") && body.contains("body-bytes=5"),
        "{body}"
    );
    let (st, head, body) = read_response(&mut c, &mut buf, true).await.unwrap();
    assert_eq!(st, 200);
    assert!(
        head.contains("content-length: "),
        "HEAD keeps the length: {head}"
    );
    assert!(body.is_empty());
    let (st, _, body) = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&body).contains("method=GET"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_and_keep_alive_are_honoured() {
    let (_s, http, _b, _m) = start(&[]).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..3 {
        c.write_all(b"GET / HTTP/1.1\r\nHost: fast.test\r\n\r\n")
            .await
            .unwrap();
        let (st, _, body) = read_response(&mut c, &mut buf, false).await.unwrap();
        assert_eq!((st, body.len()), (200, 1024), "keep-alive: same connection");
    }
    c.write_all(b"GET / HTTP/1.1\r\nHost: fast.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (st, head, _) = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!(st, 200);
    assert!(head.contains("connection: close"), "{head}");
    let mut rest = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the server closed after the response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_gets_one_deadline_per_head() {
    let (_s, http, _b, _m) = start(&["--header-read-timeout", "1"]).await;
    // A client trickling one byte every 200 ms never completes its head; the deadline is not
    // pushed back by each byte, so it is closed about a second after it started.
    let mut c = TcpStream::connect(http).await.unwrap();
    let started = Instant::now();
    let head = b"GET / HTTP/1.1\r\nHost: fast.test\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut closed_at = None;
    for &b in head.iter() {
        if c.write_all(&[b]).await.is_err() {
            closed_at = Some(started.elapsed());
            break;
        }
        let mut probe = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(200), c.read(&mut probe)).await
        {
            closed_at = Some(started.elapsed());
            break;
        }
    }
    let closed_at = closed_at.expect("the slow client was never disconnected");
    assert!(
        closed_at >= Duration::from_millis(900) && closed_at < Duration::from_secs(4),
        "closed after {closed_at:?}"
    );
    // Everybody else is still served.
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: fast.test\r\n\r\n")
        .await
        .unwrap();
    let (st, _, _) = read_response(&mut c, &mut Vec::new(), false).await.unwrap();
    assert_eq!(st, 200);
}

/// The request deadline (`--request-timeout`, 504 after) on the fast path, which runs it on the
/// connection's own timer: an answer slower than the idle wait that brought the request but
/// within the deadline is served; a slower one is a 504 at the deadline, also when the timer was
/// last set for a longer wait (a head that came in pieces, under the 60 s head deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_holds_whatever_the_connection_waited_for_before() {
    let (_s, http, _b, _m) = start(&["--request-timeout", "2"]).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    let mut buf = Vec::new();
    let get = |q: &str| format!("GET /{q} HTTP/1.1\r\nHost: fast.test\r\n\r\n");
    c.write_all(get("").as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut c, &mut buf, false).await.unwrap().0, 200);
    // Idle for half a second (the wait's timer is then about half a second from firing), then
    // an answer that takes 1.5 s: past that timer, within the deadline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    c.write_all(get("?delay_ms=1500").as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut c, &mut buf, false).await.unwrap().0, 200);
    assert!(t.elapsed() >= Duration::from_millis(1500));
    // An answer that takes 3 s: 504 at the 2 s deadline.
    let t = Instant::now();
    c.write_all(get("?delay_ms=3000").as_bytes()).await.unwrap();
    let (st, _, _) = read_response(&mut c, &mut buf, false).await.unwrap();
    let took = t.elapsed();
    assert_eq!(st, 504);
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(2800),
        "{took:?}"
    );

    // A head in two pieces: the timer is set to the head deadline (60 s) while it comes in;
    // the request's 2 s deadline still holds.
    let mut c = TcpStream::connect(http).await.unwrap();
    let mut buf = Vec::new();
    let t = Instant::now();
    c.write_all(b"GET /?delay_ms=3000 HTTP/1.1\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.write_all(b"Host: fast.test\r\n\r\n").await.unwrap();
    let (st, _, _) = read_response(&mut c, &mut buf, false).await.unwrap();
    let took = t.elapsed();
    assert_eq!(st, 504);
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(2900),
        "{took:?}"
    );
}
