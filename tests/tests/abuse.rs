//! What a hostile client sends, as raw bytes over real sockets, with a legitimate request
//! succeeding while (or right after) the attack: paths that climb out of a route, forged
//! client identity, header names with `_`, paths built to make route lookup slow, and access
//! control sluice does not enforce (the route must fail closed, never serve open).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends raw bytes on a new connection and reads until the server closes (or 10 s).
async fn raw(addr: SocketAddr, bytes: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn get_raw(path: &str, host: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
}

fn echo_lines(resp: &str) -> Vec<String> {
    resp.split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `public.test`: `/public` → backend `pub`, `/admin` → backend `adm` (so a climb out of
/// `/public` is visible by which backend answers).
async fn two_routes() -> (Serving, Manifests, Vec<sluice_bench::backend::Backend>) {
    let (p, a) = (backend("pub").await, backend("adm").await);
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[service("svc-pub"), service("svc-adm")].join("---\n"),
    );
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("svc-pub", &[p.addr]),
            endpoint_slices("svc-adm", &[a.addr]),
        ]
        .join("---\n"),
    );
    m.write(
        "ing.yaml",
        &[
            ingress("pub", "public.test", &[("/public", "Prefix", "svc-pub")]),
            ingress("adm", "admin.test", &[("/admin", "Prefix", "svc-adm")]),
            ingress(
                "both",
                "both.test",
                &[
                    ("/public", "Prefix", "svc-pub"),
                    ("/admin", "Prefix", "svc-adm"),
                ],
            ),
            ingress("root", "root.test", &[("/", "Prefix", "svc-pub")]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    (s, m, vec![p, a])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_cannot_climb_out_of_the_route_that_matched_it() {
    let (s, _m, _b) = two_routes().await;
    let http = s.running.http_addr.unwrap();
    for path in [
        "/public/../admin",
        "/public/%2e%2e/admin",
        "/public/%2E%2e/admin",
        "/public/./../admin",
        "/public//../admin",
    ] {
        // Only /public exists on public.test: the normalised /admin matches nothing.
        let r = raw(http, &get_raw(path, "public.test", "")).await;
        assert!(r.starts_with("HTTP/1.1 404"), "{path}: {r}");
        // Where /admin exists, the request goes to /admin's backend with the normalised path —
        // never to /public's backend with a path that its framework would resolve to /admin.
        let r = raw(http, &get_raw(path, "both.test", "")).await;
        assert!(r.contains("x-backend: adm"), "{path}: {r}");
    }
    // An encoded slash is read as a separator for routing (as a backend that decodes it would
    // read it); one that would make a dot segment of `..` is refused (request_path.rs).
    let r = raw(http, &get_raw("/public/..%2f..%2fadmin", "public.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    for above in ["/..", "/public/../../admin", "/%2e%2e/x"] {
        let r = raw(http, &get_raw(above, "public.test", "")).await;
        assert!(r.starts_with("HTTP/1.1 400"), "{above}: {r}");
    }
    // What the backend is sent is the normalised path, query kept as it came.
    let r = raw(
        http,
        &get_raw("//a/./b/../../echo?x=1&y=/../", "root.test", ""),
    )
    .await;
    assert!(
        echo_lines(&r).iter().any(|l| l == "path=/echo?x=1&y=/../"),
        "{r}"
    );
    // A legitimate request is unaffected.
    let r = raw(http, &get_raw("/echo?z=%2e%2e", "root.test", "")).await;
    assert!(
        echo_lines(&r).iter().any(|l| l == "path=/echo?z=%2e%2e"),
        "{r}"
    );
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_path_of_slashes_is_answered_and_the_server_keeps_serving() {
    let (s, _m, _b) = two_routes().await;
    let http = s.running.http_addr.unwrap();
    let path = format!("/public{}", "/a".repeat(3000));
    let r = raw(http, &get_raw(&path, "public.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(200)]);
    let r = raw(http, &get_raw("/public/echo", "public.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_choose_the_address_the_backend_is_told() {
    let b = backend("b").await;
    for trusted in [false, true] {
        let m = Manifests::new();
        for (i, doc) in one_service("id.test", "svc", &[b.addr]).iter().enumerate() {
            m.write(&format!("{i}.yaml"), doc);
        }
        let flags: &[&str] = if trusted {
            &["--trusted-proxies", "127.0.0.0/8"]
        } else {
            &[]
        };
        let s = serve(m.dir.path(), flags).await;
        let http = s.running.http_addr.unwrap();
        let forged = "X-Forwarded-For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX_Forwarded_For: 6.6.6.6\r\nX-Custom_Name: x\r\n";
        // The fast path (a plain GET) and the general handler (a body) alike.
        for req in [
            get_raw("/echo", "id.test", forged),
            format!(
                "POST /echo HTTP/1.1\r\nHost: id.test\r\n{forged}Content-Length: 1\r\nConnection: close\r\n\r\nx"
            ),
        ] {
            let r = raw(http, &req).await;
            let seen = echo_lines(&r);
            let has = |l: &str| seen.iter().any(|x| x == l);
            if trusted {
                assert!(has("x-forwarded-for=6.6.6.6, 127.0.0.1"), "{seen:?}");
                assert!(has("x-real-ip=6.6.6.6"), "{seen:?}");
                assert!(has("forwarded=for=6.6.6.6"), "{seen:?}");
            } else {
                assert!(has("x-forwarded-for=127.0.0.1"), "{seen:?}");
                assert!(has("x-real-ip=127.0.0.1"), "{seen:?}");
                assert!(
                    !seen.iter().any(|l| l.starts_with("forwarded=")),
                    "{seen:?}"
                );
            }
            assert!(
                !seen
                    .iter()
                    .any(|l| l.contains('_') && l.contains("6.6.6.6")),
                "an underscore name passed: {seen:?}"
            );
            assert!(
                !seen.iter().any(|l| l.starts_with("x-custom_name")),
                "{seen:?}"
            );
        }
        s.shutdown(Duration::from_secs(3)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_sluice_does_not_enforce_fails_closed() {
    let b = backend("b").await;
    let m = Manifests::new();
    let mut docs = one_service("locked.test", "svc", &[b.addr]);
    docs[3] = docs[3].replacen(
        "metadata:\n",
        "metadata:\n  annotations:\n    nginx.ingress.kubernetes.io/auth-proxy-set-headers: default/auth-headers\n",
        1,
    );
    docs.push(ingress("open", "open.test", &[("/", "Prefix", "svc")]));
    m.write("all.yaml", &docs.join("---\n"));
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let r = raw(http, &get_raw("/", "locked.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(!r.contains("x-backend"), "{r}");
    assert!(
        !r.contains("auth-proxy-set-headers"),
        "no internals in the body: {r}"
    );
    let r = raw(http, &get_raw("/", "open.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "the rest keeps serving: {r}");
    let st = get(
        &client(),
        s.running.admin_addr,
        "localhost",
        "/api/v1/status",
    )
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&st.body).unwrap();
    let problems = v["problems"].to_string();
    assert!(
        problems.contains("auth-proxy-set-headers") && problems.contains("503"),
        "{problems}"
    );
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_preface_holds_and_idle_connections_do_not_keep_their_slots() {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &one_service("h2.test", "svc", &[b.addr]).join("---\n"),
    );
    let s = serve(
        m.dir.path(),
        &[
            "--max-connections",
            "20",
            "--header-read-timeout",
            "1",
            "--client-idle-timeout",
            "2",
        ],
    )
    .await;
    let http = s.running.http_addr.unwrap();
    // Twenty connections send the HTTP/2 preface (or half of it) and wait.
    let mut held = Vec::new();
    for i in 0..20 {
        let mut c = TcpStream::connect(http).await.unwrap();
        let preface: &[u8] = if i % 2 == 0 {
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        } else {
            b"PRI * HTTP/2.0\r\n"
        };
        c.write_all(preface).await.unwrap();
        held.push(c);
    }
    // A legitimate request gets through once the holders are cut at the header timeout.
    let t = std::time::Instant::now();
    let r = raw(http, &get_raw("/", "h2.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    for mut c in held {
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a preface holder was not closed");
    }

    // A real HTTP/2 connection that goes idle after a request is closed at the idle timeout.
    let tcp = TcpStream::connect(http).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://h2.test/")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let ended = tokio::time::timeout(Duration::from_secs(8), conn).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection stayed open");
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_cannot_hold_the_admin_listener() {
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    let s = serve(m.dir.path(), &[]).await;
    let admin = s.running.admin_addr;
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut c = TcpStream::connect(admin).await.unwrap();
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await;
        held.push(c);
    }
    // Past the admin header timeout (5 s) the holders are gone and probes answer.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let r = raw(
        admin,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let mut open = 0;
    for mut c in held {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(_)) | Err(_) => open += 1,
        }
    }
    assert_eq!(open, 0, "half-sent requests answered or still open");
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_that_are_not_hosts_are_refused_not_reflected() {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write("all.yaml", &one_service("", "svc", &[b.addr]).join("---\n"));
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    for host in ["evil.com/x", "a@evil.com", "a\\b", "x:80x"] {
        let r = raw(http, &get_raw("/", host, "")).await;
        assert!(r.starts_with("HTTP/1.1 400"), "{host}: {r}");
        assert!(!r.contains("evil"), "{host}: reflected: {r}");
    }
    let r = raw(http, &get_raw("/", "fine.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_host_field_must_agree_with_the_authority() {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &one_service("a.test", "svc", &[b.addr]).join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let mut send = sluice_tests::echo::h2c(s.running.http_addr.unwrap()).await;
    let ask = |host: Option<&str>| {
        let mut r = http::Request::get("http://a.test/");
        if let Some(h) = host {
            r = r.header("host", h);
        }
        r.body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let r = send.send_request(ask(Some("other.test"))).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = send.send_request(ask(Some("A.test"))).await.unwrap();
    assert_eq!(r.status(), 200, "the same host in another case agrees");
    let r = send.send_request(ask(None)).await.unwrap();
    assert_eq!(r.status(), 200);
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_websocket_upgrades_are_tunnelled() {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &one_service("ws.test", "svc", &[b.addr]).join("---\n"),
    );
    let s = serve(m.dir.path(), &["--tunnel-idle-timeout", "1"]).await;
    let http = s.running.http_addr.unwrap();
    // h2c (request smuggling past the router) and unknown protocols go on as plain requests.
    for offer in ["h2c", "foo/1", "websocket, h2c"] {
        let r = raw(
            http,
            &format!("GET /ws HTTP/1.1\r\nHost: ws.test\r\nUpgrade: {offer}\r\nConnection: Upgrade, HTTP2-Settings, close\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200"), "{offer}: {r}");
    }
    // A WebSocket upgrade tunnels, and a silent tunnel is closed at the idle timeout.
    let mut c = open_tunnel(http).await;
    let mut buf = vec![0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the idle tunnel stayed open"
    );
    s.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_at_the_send_timeout() {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &one_service("slow.test", "svc", &[b.addr]).join("---\n"),
    );
    let s = serve(m.dir.path(), &["--client-send-timeout", "1"]).await;
    let http = s.running.http_addr.unwrap();
    // Fast path and hyper path: ask for 64 MB, read nothing.
    let mut held = Vec::new();
    for req in [
        get_raw("/?size=67108864", "slow.test", ""),
        "POST /?size=67108864 HTTP/1.1\r\nHost: slow.test\r\nContent-Length: 1\r\n\r\nx"
            .to_string(),
    ] {
        let mut c = TcpStream::connect(http).await.unwrap();
        c.write_all(req.as_bytes()).await.unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(active_connections(s.running.admin_addr).await, 2);
    let ok = tokio::time::timeout(Duration::from_secs(10), async {
        while active_connections(s.running.admin_addr).await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ok.is_ok(),
        "a client that reads nothing kept its connection"
    );
    let r = raw(http, &get_raw("/", "slow.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(100)]);
    drop(held);
    s.shutdown(Duration::from_secs(3)).await;
}

/// `--proxy-protocol`: the client a PROXY header (v1 or v2) names is the client the backend is
/// told about, on the fast path and in the general handler; a connection without a header, or with a
/// malformed one, is closed before a byte of HTTP is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_protocol_names_the_client_and_nothing_else_gets_in() {
    let b = backend("b").await;
    let m = Manifests::new();
    for (i, doc) in one_service("id.test", "svc", &[b.addr]).iter().enumerate() {
        m.write(&format!("{i}.yaml"), doc);
    }
    let s = serve(m.dir.path(), &["--proxy-protocol"]).await;
    let http = s.running.http_addr.unwrap();
    let forged = "X-Forwarded-For: 6.6.6.6\r\n";

    let v1 = format!(
        "PROXY TCP4 203.0.113.9 10.0.0.1 40000 80\r\n{}",
        get_raw("/echo", "id.test", forged)
    );
    let seen = echo_lines(&raw(http, &v1).await);
    assert!(
        seen.iter().any(|l| l == "x-forwarded-for=203.0.113.9"),
        "v1: {seen:?}"
    );
    assert!(
        seen.iter().any(|l| l == "x-real-ip=203.0.113.9"),
        "{seen:?}"
    );

    // v2, IPv6 client, and a request with a body (the general handler).
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21\x21\x00\x24".to_vec();
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    src[15] = 7;
    v2.extend_from_slice(&src);
    v2.extend_from_slice(&[0u8; 16]);
    v2.extend_from_slice(&1234u16.to_be_bytes());
    v2.extend_from_slice(&80u16.to_be_bytes());
    v2.extend_from_slice(
        b"POST /echo HTTP/1.1\r\nHost: id.test\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
    );
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(&v2).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
    let seen = echo_lines(&String::from_utf8_lossy(&out));
    assert!(
        seen.iter().any(|l| l == "x-forwarded-for=2001:db8::7"),
        "v2: {seen:?}"
    );

    // No header, a malformed one, a TLS hello: closed without an answer.
    for bad in [
        get_raw("/echo", "id.test", ""),
        format!(
            "PROXY TCP4 203.0.113.9 10.0.0.1 40000\r\n{}",
            get_raw("/echo", "id.test", "")
        ),
        "\u{16}\u{3}\u{1}\u{0}".to_string(),
    ] {
        assert_eq!(raw(http, &bad).await, "", "{bad:?}");
    }
    // Still serving.
    let seen = echo_lines(&raw(http, &v1).await);
    assert!(seen.iter().any(|l| l == "x-forwarded-for=203.0.113.9"));
    s.shutdown(Duration::from_secs(3)).await;
}

/// Opens a WebSocket tunnel to `ws.test` and checks that it echoes.
async fn open_tunnel(http: SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(http).await.unwrap();
    c.write_all(b"GET /ws HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = c.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    c.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    c.read_exact(&mut echo).await.unwrap();
    c
}

/// Tunnels keep their connection's place under `--max-connections` after the HTTP exchange
/// that opened them ends, and the drain closes them at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_count_against_the_connection_cap_and_close_at_the_drain_deadline() {
    let b = backend("b").await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &one_service("ws.test", "svc", &[b.addr]).join("---\n"),
    );
    let s = serve(m.dir.path(), &["--max-connections", "3"]).await;
    let http = s.running.http_addr.unwrap();
    let mut tunnels = vec![open_tunnel(http).await, open_tunnel(http).await];
    // One slot left: a request gets it.
    let r = raw(http, &get_raw("/", "ws.test", "")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    tunnels.push(open_tunnel(http).await);
    // The cap is reached by tunnels alone: a new request waits for a slot.
    let waited = tokio::time::timeout(
        Duration::from_millis(700),
        raw(http, &get_raw("/", "ws.test", "")),
    )
    .await;
    assert!(waited.is_err(), "served past the cap: {waited:?}");
    // A tunnel that ends gives its slot back.
    drop(tunnels.pop());
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        raw(http, &get_raw("/", "ws.test", "")),
    )
    .await
    .unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");

    // Shutdown with live tunnels: they are closed once the deadline has passed.
    let started = std::time::Instant::now();
    let all_done = s.shutdown(Duration::from_secs(2)).await;
    assert!(!all_done, "tunnels were still open at the deadline");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    for mut t in tunnels {
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(2), t.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "a tunnel outlived the drain: {closed:?}"
        );
    }
}
