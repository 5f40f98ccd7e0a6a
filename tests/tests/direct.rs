//! The fast path's direct forwarding (raw request and response heads, no header maps) keeps
//! the general path's rules, checked through real sockets against a scripted upstream:
//! hop-by-hop fields dropped both ways (also those a `Connection` header names), the proxy
//! headers, `Server` replaced, framing re-decided, and a connection whose framing was
//! confused never reused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// An upstream that answers the n-th request it reads with `answers[n]` (the last one
/// repeated), keeping connections open; sends every request head it reads on the channel and
/// counts accepted connections.
async fn scripted(
    answers: Vec<&'static str>,
) -> (
    SocketAddr,
    mpsc::UnboundedReceiver<String>,
    Arc<AtomicUsize>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let accepted = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (tx, answers, served) = (tx.clone(), answers.clone(), Arc::clone(&served));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head: Vec<u8> = buf.drain(..end + 4).collect();
                    let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                    let n = served.fetch_add(1, Ordering::SeqCst);
                    let answer = answers[n.min(answers.len() - 1)];
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx, accepted)
}

/// `sluice serve` routing `direct.test` to `addr`; keep the returned values alive.
async fn start(addr: SocketAddr) -> (Serving, SocketAddr, Manifests) {
    let m = Manifests::new();
    for (i, yaml) in one_service("direct.test", "svc", &[addr])
        .iter()
        .enumerate()
    {
        m.write(&format!("{i}.yaml"), yaml);
    }
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    (s, http, m)
}

/// Reads from `c` until `done` says the text so far is complete (or 5 s pass).
async fn read_until(c: &mut TcpStream, done: impl Fn(&str) -> bool) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 4096];
        while !done(&String::from_utf8_lossy(&out)) {
            match c.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends `raw` on `c` and reads the answer until `done`.
async fn ask(c: &mut TcpStream, raw: &[u8], done: impl Fn(&str) -> bool) -> String {
    c.write_all(raw).await.unwrap();
    read_until(c, done).await
}

/// The head's lines, lowercased, without the request or status line.
fn fields(head: &str) -> Vec<String> {
    head.split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(str::to_lowercase)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_and_proxy_headers_follow_the_general_rules() {
    let (up, mut heads, accepted) = scripted(vec![
        "HTTP/1.1 200 OK\r\nServer: upstream\r\nConnection: keep-alive, X-Private\r\n\
         X-Private: secret\r\nKeep-Alive: timeout=5\r\nProxy-Connection: x\r\n\
         Transfer-Encoding: chunked\r\nContent-Length: 99\r\nX-Kept: yes\r\n\r\n\
         5\r\nhello\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ])
    .await;
    let (_s, http, _m) = start(up).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(
        b"GET /p?q=1 HTTP/1.1\r\nHost: direct.test\r\nKeep-Alive: 300\r\n\
          Proxy-Authorization: Basic x\r\nTE: gzip\r\nX-Forwarded-For: 1.2.3.4\r\n\
          X-Forwarded-Proto: spoofed\r\nContent-Length: 0\r\nX-Request-ID: abc\r\n\
          User-Agent: t\r\n\r\n",
    )
    .await
    .unwrap();
    let r = read_until(&mut c, |t| t.ends_with("\r\n0\r\n\r\n")).await;

    let sent = heads.recv().await.unwrap();
    assert!(sent.starts_with("GET /p?q=1 HTTP/1.1\r\n"), "{sent}");
    let mut got = fields(&sent);
    got.sort();
    assert_eq!(
        got,
        [
            "content-length: 0",
            "host: direct.test",
            "user-agent: t",
            // Not a trusted proxy: the client's X-Forwarded-For is replaced, not extended.
            "x-forwarded-for: 127.0.0.1",
            "x-forwarded-host: direct.test",
            "x-forwarded-port: 80",
            "x-forwarded-proto: http",
            "x-real-ip: 127.0.0.1",
            "x-request-id: abc",
        ]
        .map(|f| f.replace(": 80", &format!(": {}", http.port()))),
        "{sent}"
    );

    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    let got = fields(head);
    for gone in [
        "x-private",
        "keep-alive",
        "proxy-connection",
        "connection",
        "content-length",
    ] {
        assert!(
            !got.iter().any(|f| f.starts_with(&format!("{gone}:"))),
            "{gone} in {r}"
        );
    }
    for kept in [
        "server: sluice",
        "x-kept: yes",
        "transfer-encoding: chunked",
    ] {
        assert!(got.iter().any(|f| f == kept), "no {kept} in {r}");
    }
    assert!(got.iter().any(|f| f.starts_with("date: ")), "{r}");
    assert_eq!(body, "5\r\nhello\r\n0\r\n\r\n");

    // Same client connection, next request. The upstream announced both a coding and a
    // length, so its connection was not reused: the answer comes over a new one.
    let r = ask(
        &mut c,
        b"GET / HTTP/1.1\r\nHost: direct.test\r\n\r\n",
        |t| t.ends_with("\r\n\r\nok"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("\r\ncontent-length: 2\r\n"), "{r}");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// Heads whose lines end in a bare LF (which the parsers tolerate) are forwarded field by
/// field, so what leaves sluice has CRLF line ends either way; repeated or listed
/// `Content-Length` values become one field and a `Date` is never doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_line_feeds_and_repeated_lengths_leave_as_clean_heads() {
    let (up, mut heads, _accepted) = scripted(vec![
        "HTTP/1.1 200 OK\nX-A: 1\nContent-Length: 2\nDate: Sat, 05 Dec 2026 00:00:00 GMT\n\nok",
        "HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\
         Date: Sat, 05 Dec 2026 00:00:00 GMT\r\nX-B: 2\r\n\r\nok",
    ])
    .await;
    let (_s, http, _m) = start(up).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    for raw in [
        "GET / HTTP/1.1\nHost: direct.test\nX-Request-ID: r\nConnection: keep-alive\n\n",
        "GET / HTTP/1.1\r\nHost: direct.test\r\nX-Request-ID: r\r\n\r\n",
    ] {
        let r = ask(&mut c, raw.as_bytes(), |t| t.ends_with("\r\n\r\nok")).await;
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(!head.replace("\r\n", "").contains('\n'), "bare LF in {r:?}");
        let got = fields(head);
        let lengths: Vec<_> = got
            .iter()
            .filter(|f| f.starts_with("content-length:"))
            .collect();
        assert_eq!(lengths, ["content-length: 2"], "{r:?}");
        assert_eq!(got.iter().filter(|f| f.starts_with("date:")).count(), 1);
        assert!(got.iter().any(|f| f == "x-a: 1"), "{r:?}");
        assert_eq!(body, "ok");

        let sent = heads.recv().await.unwrap();
        assert!(!sent.replace("\r\n", "").contains('\n'), "{sent:?}");
        let mut sent = fields(&sent);
        sent.retain(|f| !f.starts_with("x-forwarded-"));
        assert_eq!(
            sent,
            [
                "host: direct.test",
                "x-request-id: r",
                "x-real-ip: 127.0.0.1"
            ]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodyless_answers_keep_their_length_and_the_connection_is_reused() {
    let (up, _heads, accepted) = scripted(vec![
        "HTTP/1.1 200 OK\r\nContent-Length: 42\r\nETag: \"a\"\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 42\r\nETag: \"a\"\r\n\r\n",
        "HTTP/1.1 204 No Content\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc",
    ])
    .await;
    let (_s, http, _m) = start(up).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    let r = ask(
        &mut c,
        b"HEAD / HTTP/1.1\r\nHost: direct.test\r\n\r\n",
        |t| t.contains("\r\n\r\n"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("\r\ncontent-length: 42\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\n"), "no body after a HEAD answer: {r}");

    let r = ask(
        &mut c,
        b"GET / HTTP/1.1\r\nHost: direct.test\r\nIf-None-Match: \"a\"\r\n\r\n",
        |t| t.contains("\r\n\r\n"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 304 Not Modified\r\n"), "{r}");
    assert!(r.contains("\r\ncontent-length: 42\r\n"), "{r}");

    let r = ask(
        &mut c,
        b"DELETE /x HTTP/1.1\r\nHost: direct.test\r\n\r\n",
        |t| t.contains("\r\n\r\n"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 204 No Content\r\n"), "{r}");
    assert!(!r.to_lowercase().contains("content-length"), "{r}");
    assert!(!r.to_lowercase().contains("transfer-encoding"), "{r}");

    let r = ask(
        &mut c,
        b"GET / HTTP/1.1\r\nHost: direct.test\r\n\r\n",
        |t| t.ends_with("abc"),
    )
    .await;
    assert_eq!(r.matches("content-length").count(), 1, "{r}");
    assert!(r.contains("\r\ncontent-length: 3\r\n"), "{r}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one upstream connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_is_a_bad_gateway_and_the_client_connection_goes_on() {
    let (up, _heads, _accepted) = scripted(vec![
        "HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ])
    .await;
    let (_s, http, _m) = start(up).await;
    let mut c = TcpStream::connect(http).await.unwrap();
    let r = ask(
        &mut c,
        b"GET / HTTP/1.1\r\nHost: direct.test\r\n\r\n",
        |t| t.ends_with("failed\n"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{r}");
    let r = ask(
        &mut c,
        b"GET / HTTP/1.1\r\nHost: direct.test\r\n\r\n",
        |t| t.ends_with("ok"),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
}
