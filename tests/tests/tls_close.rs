//! How an HTTPS connection ends, end to end with real rustls clients: an answer followed by
//! the close (`Connection: close`) ends with a TLS `close_notify`, on the fast path and on the
//! general path, TLS 1.2 and 1.3, small and large, and so does the refusal of a malformed
//! head; an answer cut short by a pod that dies mid-body ends without one, so that the client
//! can tell it was cut; a client that stops reading is dropped at the send timeout, its
//! close (itself a write over TLS) included; and an idle keep-alive connection that sluice
//! ends (keep-alive time over, shutdown) ends with `close_notify` too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use sluice_bench::load::conn::Stream;
use sluice_bench::load::{Connector, TlsSpec, TlsVersion, Verify};
use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// sluice serving `host` over HTTPS to `pod`.
async fn sluice(host: &str, pod: SocketAddr) -> (Serving, Manifests) {
    let m = Manifests::new();
    tls_site(&m, host, pod);
    let s = serve(m.dir.path(), &[]).await;
    (s, m)
}

/// A TLS connection to `s` for `host`, with `version`.
async fn connect(s: &Serving, host: &str, version: TlsVersion) -> Stream {
    let spec = TlsSpec {
        version,
        verify: Verify::Insecure,
        resumption: false,
        server_name: host.into(),
    };
    let c = Connector::new(vec![s.running.https_addr.unwrap()], Some(&spec)).unwrap();
    c.connect(tokio::time::Instant::now() + Duration::from_secs(5))
        .await
        .unwrap()
}

/// Sends `request` and reads until the connection ends: the bytes, and whether it ended with
/// `close_notify` (a clean end) rather than a bare TCP close.
async fn exchange(mut c: Stream, request: &str) -> (Vec<u8>, bool) {
    c.write_all(request.as_bytes()).await.unwrap();
    c.flush().await.unwrap();
    let mut got = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got))
        .await
        .expect("the connection did not end within 10 s");
    match ended {
        Ok(_) => (got, true),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => (got, false),
        Err(e) => panic!("the connection ended with {e}"),
    }
}

/// A GET (fast path) or a POST with a body (general path), asking for `size` bytes, closing.
fn closing(post: bool, host: &str, size: usize) -> String {
    if post {
        format!(
            "POST /?size={size} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi"
        )
    } else {
        format!("GET /?size={size} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_then_close_ends_with_close_notify() {
    let pod = backend("pod").await;
    let (s, _m) = sluice("close.test", pod.addr).await;
    for version in [TlsVersion::V12, TlsVersion::V13] {
        for post in [false, true] {
            // Small (head and body in one record) and larger than rustls keeps unsent.
            for size in [100, 300_000] {
                let c = connect(&s, "close.test", version).await;
                let (got, clean) = exchange(c, &closing(post, "close.test", size)).await;
                let case = format!("{version:?} post={post} size={size}");
                let text = String::from_utf8_lossy(&got);
                assert!(text.starts_with("HTTP/1.1 200"), "{case}: {text:.80}");
                let head = text.find("\r\n\r\n").expect("a head") + 4;
                assert_eq!(got.len() - head, size, "{case}: the whole body");
                assert!(clean, "{case}: no close_notify after a whole answer");
            }
        }
        // A request refused on the fast path (a malformed head) closes the same way.
        let c = connect(&s, "close.test", version).await;
        let bad = "GET / HTTP/1.1\r\nHost: close.test\r\nno colon here\r\n\r\n";
        let (got, clean) = exchange(c, bad).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 400"), "{version:?}: {text:.80}");
        assert!(clean, "{version:?}: no close_notify after a refusal");
    }
    s.shutdown(Duration::from_secs(3)).await;
}

/// A pod that answers the head and 1,000 of 100,000 promised bytes, then closes (dies).
async fn dying_pod() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n";
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp.write_all(&[b'x'; 1000]).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                // Dropped: the connection closes 99,000 bytes short.
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_short_ends_without_close_notify() {
    let (s, _m) = sluice("cut.test", dying_pod().await).await;
    for version in [TlsVersion::V12, TlsVersion::V13] {
        for post in [false, true] {
            // Closing and keep-alive: neither may look like a clean end.
            for close in [true, false] {
                let mut request = closing(post, "cut.test", 0);
                if !close {
                    request = request.replace("Connection: close\r\n", "");
                }
                let c = connect(&s, "cut.test", version).await;
                let (got, clean) = exchange(c, &request).await;
                let case = format!("{version:?} post={post} close={close}");
                let text = String::from_utf8_lossy(&got);
                assert!(text.starts_with("HTTP/1.1 200"), "{case}: {text:.80}");
                assert!(got.len() < 100_000, "{case}: {} bytes", got.len());
                assert!(!clean, "{case}: a cut answer ended with close_notify");
            }
        }
    }
    s.shutdown(Duration::from_secs(3)).await;
}

/// Over TLS, ending a connection is itself a write (`close_notify`): after the send timeout,
/// closing must not wait on the client that stopped reading. (Here every connection's write
/// fails mid-body; a close that blocks on its own is `SendDeadline`'s unit test in
/// `proxy/src/io/activity.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_stops_reading_is_dropped_at_the_send_timeout() {
    let pod = backend("pod").await;
    let m = Manifests::new();
    tls_site(&m, "slow.test", pod.addr);
    let s = serve(m.dir.path(), &["--client-send-timeout", "1"]).await;
    // Fast path and general path, each keep-alive and closing: ask for 64 MB, read nothing.
    let mut held = Vec::new();
    for post in [false, true] {
        for close in [true, false] {
            let mut request = closing(post, "slow.test", 64 << 20);
            if !close {
                request = request.replace("Connection: close\r\n", "");
            }
            let mut c = connect(&s, "slow.test", TlsVersion::Any).await;
            c.write_all(request.as_bytes()).await.unwrap();
            c.flush().await.unwrap();
            held.push(c);
        }
    }
    let admin = s.running.admin_addr;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(active_connections(admin).await, 4);
    let gone = eventually(Duration::from_secs(10), || async {
        active_connections(admin).await == 0
    })
    .await;
    assert!(
        gone,
        "a TLS client that reads nothing kept its connection ({} still open)",
        active_connections(admin).await
    );
    drop(held);
    s.shutdown(Duration::from_secs(3)).await;
}

/// Reads one answer with a `Content-Length` body from `c`: its head.
async fn read_answer(c: &mut Stream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end + 4]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .expect("a content-length");
            if got.len() >= end + 4 + len {
                return head;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        assert!(n > 0, "closed before the whole answer");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Waits (up to 10 s) for the server to end `c`: whether it ended with `close_notify`.
async fn ended_cleanly(mut c: Stream) -> bool {
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest))
        .await
        .expect("the connection did not end within 10 s");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    match ended {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => false,
        Err(e) => panic!("the connection ended with {e}"),
    }
}

/// A connection to `s` for `idle.test` with `request` sent and its 200 answer read.
async fn answered(s: &Serving, version: TlsVersion, request: &str) -> Stream {
    let mut c = connect(s, "idle.test", version).await;
    c.write_all(request.as_bytes()).await.unwrap();
    c.flush().await.unwrap();
    let head = read_answer(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{version:?}: {head}");
    c
}

/// Waits for the server to end the idle `c`: whether it ended cleanly, after at least 0.8 s
/// (the idle time under test is 1 s).
async fn ended_cleanly_after_idle(c: Stream) -> bool {
    let t0 = std::time::Instant::now();
    let clean = ended_cleanly(c).await;
    assert!(t0.elapsed() >= Duration::from_millis(800), "closed early");
    clean
}

/// An idle keep-alive connection that sluice ends — its keep-alive time over, or shutdown —
/// ends with `close_notify`, as nginx ends them; one whose head stalled midway (a slow client)
/// is closed quietly when the head deadline passes, as nginx closes timed-out connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_that_sluice_ends_get_close_notify() {
    let pod = backend("pod").await;
    let m = Manifests::new();
    tls_site(&m, "idle.test", pod.addr);
    // No ConfigMap keep-alive: the idle wait runs under the head timeout, 1 s here.
    let s = serve(m.dir.path(), &["--header-read-timeout", "1"]).await;
    let get = "GET /?size=100 HTTP/1.1\r\nHost: idle.test\r\n\r\n";
    for version in [TlsVersion::V12, TlsVersion::V13] {
        let c = answered(&s, version, get).await;
        assert!(
            ended_cleanly_after_idle(c).await,
            "{version:?}: the keep-alive time ended without close_notify"
        );

        let mut c = connect(&s, "idle.test", version).await;
        c.write_all(b"GET / HTTP/1.1\r\nHost: idle.te")
            .await
            .unwrap();
        c.flush().await.unwrap();
        assert!(
            !ended_cleanly(c).await,
            "{version:?}: a stalled head was closed with close_notify"
        );
    }
    s.shutdown(Duration::from_secs(3)).await;
    // Shutdown ends idle connections (after its lame-duck period, 0.75 s here), each with
    // close_notify: on a server whose keep-alive time (10 s) cannot be what ends them.
    let s = serve(m.dir.path(), &["--header-read-timeout", "10"]).await;
    let mut idle = Vec::new();
    for version in [TlsVersion::V12, TlsVersion::V13] {
        idle.push(answered(&s, version, get).await);
    }
    let t0 = std::time::Instant::now();
    let ends = tokio::spawn(async move {
        let mut clean = Vec::new();
        for c in idle {
            clean.push(ended_cleanly(c).await);
        }
        (clean, t0.elapsed())
    });
    s.shutdown(Duration::from_secs(3)).await;
    let (clean, took) = ends.await.unwrap();
    assert_eq!(clean, [true, true], "shutdown without close_notify");
    // Ended by the shutdown, not by the keep-alive time.
    assert!(took < Duration::from_secs(5), "ended after {took:?}");
}

/// A connection that hyper serves (here after a request with a body) and that stays idle past
/// `--client-idle-timeout` is asked to end like at shutdown, so over TLS it ends with
/// `close_notify` rather than a bare close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_general_path_connection_ends_with_close_notify() {
    let pod = backend("pod").await;
    let m = Manifests::new();
    tls_site(&m, "idle.test", pod.addr);
    let s = serve(m.dir.path(), &["--client-idle-timeout", "1"]).await;
    let post = "POST /?size=100 HTTP/1.1\r\nHost: idle.test\r\nContent-Length: 2\r\n\r\nhi";
    for version in [TlsVersion::V12, TlsVersion::V13] {
        let c = answered(&s, version, post).await;
        assert!(
            ended_cleanly_after_idle(c).await,
            "{version:?}: the idle timeout ended a hyper-served connection without close_notify"
        );
    }
    s.shutdown(Duration::from_secs(3)).await;
}

/// An HTTP/2 client over TLS that speaks raw frames, sends no request and acknowledges
/// SETTINGS (and PINGs, if `ack_pings`), until the server ends the connection: whether a
/// `GOAWAY` came, whether the end was clean (`close_notify`), and how long it took.
async fn idle_h2(s: &Serving, ack_pings: bool) -> (bool, bool, Duration) {
    let spec = TlsSpec {
        version: TlsVersion::Any,
        verify: Verify::Insecure,
        resumption: false,
        server_name: "idle.test".into(),
    };
    let connector =
        Connector::with_alpn(vec![s.running.https_addr.unwrap()], Some(&spec), &[b"h2"]).unwrap();
    let mut c = connector
        .connect(tokio::time::Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    c.flush().await.unwrap();
    let t0 = std::time::Instant::now();
    let (mut goaway, mut buf, mut chunk) = (false, Vec::new(), [0u8; 4096]);
    let clean = loop {
        let n = match tokio::time::timeout(Duration::from_secs(10), c.read(&mut chunk))
            .await
            .expect("the connection did not end within 10 s")
        {
            Ok(0) => break true,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => break false,
            Err(e) => panic!("the connection ended with {e}"),
        };
        buf.extend_from_slice(&chunk[..n]);
        // Whole frames: 9-byte header (length, type, flags, stream), then the payload.
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            let reply: Option<Vec<u8>> = match kind {
                // SETTINGS, not an ack: acknowledge.
                0x4 if flags & 1 == 0 => Some(b"\0\0\0\x04\x01\0\0\0\0".to_vec()),
                // PING, not an ack: echo it back as one.
                0x6 if flags & 1 == 0 && ack_pings => {
                    let mut p = b"\0\0\x08\x06\x01\0\0\0\0".to_vec();
                    p.extend_from_slice(&buf[9..17]);
                    Some(p)
                }
                0x7 => {
                    goaway = true;
                    None
                }
                _ => None,
            };
            if let Some(r) = reply {
                // The server may already have closed; what matters is what it sent.
                let _ = c.write_all(&r).await;
                let _ = c.flush().await;
            }
            buf.drain(..9 + len);
        }
    };
    (goaway, clean, t0.elapsed())
}

/// An idle HTTP/2 connection past `--client-idle-timeout` gets `GOAWAY` (a client racing a
/// request against the close learns it was not taken), then `close_notify`; one that never
/// answers the ping that confirms the `GOAWAY` (a dead or hostile client) is dropped after the
/// grace of two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_gets_goaway_then_close_notify() {
    let pod = backend("pod").await;
    let m = Manifests::new();
    tls_site(&m, "idle.test", pod.addr);
    let s = serve(m.dir.path(), &["--client-idle-timeout", "1"]).await;
    let (goaway, clean, took) = idle_h2(&s, true).await;
    assert!(goaway, "no GOAWAY before the close");
    assert!(clean, "no close_notify after the GOAWAY");
    assert!(took >= Duration::from_millis(800), "closed early");
    let (goaway, _, took) = idle_h2(&s, false).await;
    assert!(goaway, "no GOAWAY before the close");
    assert!(
        took < Duration::from_millis(4500),
        "a client that ignores the ping held the close for {took:?}"
    );
    s.shutdown(Duration::from_secs(3)).await;
}
