//! How an HTTPS connection ends, end to end with real rustls clients: an answer followed by
//! the close (`Connection: close`) ends with a TLS `close_notify`, on the fast path and on the
//! general path, TLS 1.2 and 1.3, small and large, and so does the refusal of a malformed
//! head; an answer cut short by a pod that dies mid-body ends without one, so that the client
//! can tell it was cut; and a client that stops reading is dropped at the send timeout, its
//! close (itself a write over TLS) included.
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
