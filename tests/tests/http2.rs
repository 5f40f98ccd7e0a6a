//! HTTP/2 from the client over TLS (ALPN h2) and in cleartext by prior knowledge (h2c), end to
//! end with a real hyper client: many streams on one connection each get their own answer
//! while the answers that are ready together are written together; an upload runs beside
//! downloads; and a client that stops reading cannot make the proxy hold its answers without
//! bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_bench::load::{Connector, TlsSpec, TlsVersion, Verify};
use sluice_bench::peers::HOST;
use sluice_tests::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// sluice serving `HOST` over HTTPS to one backend, with `extra` flags.
async fn sluice(extra: &[&str]) -> (Serving, Manifests, sluice_bench::backend::Backend) {
    let b = backend("pod").await;
    let m = Manifests::new();
    tls_site(&m, HOST, b.addr);
    let s = serve(m.dir.path(), extra).await;
    (s, m, b)
}

/// A TLS connection to `s`'s HTTPS listener that chose h2 in the handshake.
async fn tls_h2(s: &Serving) -> sluice_bench::load::conn::Stream {
    let tls = TlsSpec {
        version: TlsVersion::Any,
        verify: Verify::Insecure,
        resumption: false,
        server_name: HOST.into(),
    };
    let c =
        Connector::with_alpn(vec![s.running.https_addr.unwrap()], Some(&tls), &[b"h2"]).unwrap();
    c.connect(tokio::time::Instant::now() + Duration::from_secs(5))
        .await
        .unwrap()
}

/// An HTTP/2 client on `io`, its connection driven by a task of its own.
async fn h2_client<I>(io: I, b: &mut Builder<TokioExecutor>) -> SendRequest<Full<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = b.handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    send
}

/// An HTTP/2 client over TLS (ALPN h2) to `s`, with hyper's default settings.
async fn tls_client(s: &Serving) -> SendRequest<Full<Bytes>> {
    h2_client(tls_h2(s).await, &mut Builder::new(TokioExecutor::new())).await
}

/// An HTTP/2 client in cleartext by prior knowledge (h2c) to `s`, with hyper's defaults.
async fn clear_client(s: &Serving) -> SendRequest<Full<Bytes>> {
    h2_client(h2c(s).await, &mut Builder::new(TokioExecutor::new())).await
}

/// `GET`s `path` and returns the status and the whole body, within 10 seconds.
async fn fetch(mut send: SendRequest<Full<Bytes>>, path: String) -> (u16, Bytes) {
    let req = http::Request::get(format!("https://{HOST}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = async {
        let r = send.send_request(req).await.unwrap();
        assert_eq!(r.version(), http::Version::HTTP_2);
        let status = r.status().as_u16();
        (status, r.into_body().collect().await.unwrap().to_bytes())
    };
    tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .unwrap_or_else(|_| panic!("{path}: no whole answer within 10 s"))
}

/// A cleartext connection to `s`'s HTTP listener, for HTTP/2 by prior knowledge.
async fn h2c(s: &Serving) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(s.running.http_addr.unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_gets_its_own_answer_when_many_are_ready_together() {
    let (s, _m, _b) = sluice(&[]).await;
    let tls = tls_client(&s).await;
    many_streams(tls).await;
    let clear = clear_client(&s).await;
    many_streams(clear).await;
    s.shutdown(Duration::from_secs(3)).await;
}

/// Five requests one at a time, then 240 at once, on the connection `send` drives.
async fn many_streams(send: SendRequest<Full<Bytes>>) {
    // One at a time, with nothing else to push an answer out: each must leave on its own.
    for i in 0..5 {
        let one = fetch(send.clone(), format!("/echo?alone={i}"));
        let (status, _) = tokio::time::timeout(Duration::from_secs(2), one)
            .await
            .expect("an answer held on an otherwise idle connection");
        assert_eq!(status, 200);
    }
    // 240 streams on one connection: echoes (some delayed, so answers come ready in every
    // grouping), small bodies, and bodies larger than the write bound and the stream window.
    let mut all = tokio::task::JoinSet::new();
    for i in 0..240usize {
        let path = match i % 4 {
            0 => format!("/echo?i={i}"),
            1 => format!("/echo?i={i}&delay_ms={}", i % 7),
            2 => format!("/?size={}", 900 + i),
            _ => format!("/?size={}", 90_000 + i),
        };
        let send = send.clone();
        all.spawn(async move { (i, path.clone(), fetch(send, path).await) });
    }
    let mut answered = 0;
    while let Some(r) = all.join_next().await {
        let (i, path, (status, body)) = r.unwrap();
        assert_eq!(status, 200, "{path}");
        match i % 4 {
            0 | 1 => {
                let text = String::from_utf8(body.to_vec()).unwrap();
                assert!(
                    text.contains(&format!("path={path}\n")),
                    "{path} got another stream's answer: {text}"
                );
            }
            2 => assert_eq!(body.len(), 900 + i, "{path}"),
            _ => {
                assert_eq!(body.len(), 90_000 + i, "{path}");
                assert!(body.iter().all(|b| *b == b'x'));
            }
        }
        answered += 1;
    }
    assert_eq!(answered, 240);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_beside_downloads_on_one_connection() {
    let (s, _m, _b) = sluice(&[]).await;
    let send = tls_client(&s).await;
    let mut all = tokio::task::JoinSet::new();
    for i in 0..20usize {
        let send = send.clone();
        all.spawn(async move {
            let (status, body) = fetch(send, format!("/?size={}", 200_000 + i)).await;
            assert_eq!((status, body.len()), (200, 200_000 + i));
        });
    }
    let upload = vec![b'u'; 3 << 20];
    let req = http::Request::post(format!("https://{HOST}/echo"))
        .body(Full::new(Bytes::from(upload)))
        .unwrap();
    let r = send.clone().send_request(req).await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains(&format!("body-bytes={}\n", 3 << 20)),
        "{text}"
    );
    while let Some(r) = all.join_next().await {
        r.unwrap();
    }
    s.shutdown(Duration::from_secs(3)).await;
}

/// A stream that reads until `left` bytes are used up, then never again: a client that stops
/// reading while its socket stays open.
struct StopsReading<S> {
    inner: S,
    left: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for StopsReading<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Pending;
        }
        let mut mem = vec![0u8; this.left.min(buf.remaining())];
        let mut part = ReadBuf::new(&mut mem);
        let r = Pin::new(&mut this.inner).poll_read(cx, &mut part);
        let n = part.filled().len();
        buf.put_slice(&mem[..n]);
        this.left -= n;
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StopsReading<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The client opens its flow-control windows to the maximum, so only the proxy's own bound
/// and its send timeout stand between a 64 MB answer and the proxy's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_stops_reading_is_dropped_at_the_send_timeout() {
    let (s, _m, _b) = sluice(&["--client-send-timeout", "1"]).await;
    let admin = s.running.admin_addr;
    let io = StopsReading {
        inner: tls_h2(&s).await,
        left: 64 * 1024,
    };
    let mut b = Builder::new(TokioExecutor::new());
    b.initial_stream_window_size(i32::MAX as u32)
        .initial_connection_window_size(i32::MAX as u32);
    let mut send = h2_client(io, &mut b).await;
    let req = http::Request::get(format!("https://{HOST}/?size=67108864"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    // The answer's head arrives; its body is never read, and the client stays connected.
    let held = send.send_request(req).await.unwrap();
    assert_eq!(held.status(), 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(active_connections(admin).await, 1);
    let dropped = eventually(Duration::from_secs(10), || async {
        active_connections(admin).await == 0
    })
    .await;
    assert!(
        dropped,
        "an HTTP/2 client that reads nothing kept its connection"
    );
    // Everyone else is still served, on a new connection.
    let other = tls_client(&s).await;
    assert_eq!(fetch(other, "/?size=5000".into()).await.1.len(), 5000);
    drop((held, send));
    s.shutdown(Duration::from_secs(3)).await;
}

/// Answers held for the next turn are not lost when the server shuts down: a graceful stop
/// with streams in flight delivers every answer before the GOAWAY closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_delivers_the_answers_in_flight() {
    let (s, _m, _b) = sluice(&[]).await;
    let send = tls_client(&s).await;
    let mut all = tokio::task::JoinSet::new();
    for i in 0..30usize {
        let send = send.clone();
        all.spawn(fetch(send, format!("/echo?i={i}&delay_ms=300")));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stop = tokio::spawn(s.shutdown(Duration::from_secs(5)));
    let mut answered = 0;
    while let Some(r) = all.join_next().await {
        let (status, body) = r.unwrap();
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&body).contains("path=/echo?i="));
        answered += 1;
    }
    assert_eq!(answered, 30);
    stop.await.unwrap();
}

/// A client that chose h2 in the TLS handshake and then speaks HTTP/1.1 is answered in
/// HTTP/1.1 (hyper reads the protocol from the first bytes), with its writes not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_chose_h2_but_speaks_http1_is_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, _m, _b) = sluice(&[]).await;
    let mut c = tls_h2(&s).await;
    let req = format!("GET /?size=3000 HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    for _ in 0..3 {
        c.write_all(req.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let whole = tokio::time::timeout(Duration::from_secs(2), async {
            while !got.ends_with(&[b'x'; 3000][..]) {
                let n = c.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        assert!(
            whole.is_ok(),
            "no whole answer: {}",
            String::from_utf8_lossy(&got)
        );
        assert!(got.starts_with(b"HTTP/1.1 200"));
    }
    s.shutdown(Duration::from_secs(3)).await;
}

/// A pod that dies mid-answer (every connection reset) ends that stream with an error, not a
/// clean end the client could take for the whole body; the client's connection stays up, and
/// its next request gets an answer at once (a 5xx: the only pod is gone), over TLS and h2c.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_dies_mid_answer_cuts_only_that_stream() {
    let (s, _m, b) = sluice(&[]).await;
    let tls = tls_client(&s).await;
    let clear = clear_client(&s).await;
    let mut bodies = Vec::new();
    for mut send in [tls.clone(), clear.clone()] {
        // 256 MB: far more than the flow-control windows let through before the pod dies.
        let req = http::Request::get(format!("https://{HOST}/?size=268435456"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let r = send.send_request(req).await.unwrap();
        assert_eq!(r.status(), 200);
        let mut body = r.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
        bodies.push(body);
    }
    b.reset().await;
    for mut body in bodies {
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match body.frame().await {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e),
                    None => return Ok(()),
                }
            }
        })
        .await
        .expect("the cut stream neither ended nor failed");
        assert!(end.is_err(), "a cut answer ended as if whole");
    }
    for send in [tls, clear] {
        let (status, _) = fetch(send, "/echo".into()).await;
        assert!((500..600).contains(&status), "{status}");
    }
    s.shutdown(Duration::from_secs(3)).await;
}

/// The streams of one connection run in its task (`server/streams.rs`): a stream waiting on a
/// slow pod must not hold back the others. Twenty quick requests started after a slow one on
/// the same connection are all answered while the slow one is still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_does_not_hold_back_the_others_on_its_connection() {
    let (s, _m, _b) = sluice(&[]).await;
    let send = tls_client(&s).await;
    let slow = tokio::spawn(fetch(send.clone(), "/echo?delay_ms=2500".into()));
    // Let the slow request reach the pod first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut quick = tokio::task::JoinSet::new();
    for i in 0..20 {
        quick.spawn(fetch(send.clone(), format!("/echo?quick={i}")));
    }
    while let Some(r) = quick.join_next().await {
        assert_eq!(r.unwrap().0, 200);
        assert!(
            !slow.is_finished(),
            "a quick answer waited for the slow one"
        );
    }
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("delay_ms=2500"));
    s.shutdown(Duration::from_secs(3)).await;
}
