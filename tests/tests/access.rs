//! Access annotations through `sluice serve` over real sockets: source ranges (the client
//! address as the trusted-proxy rules resolve it, never a header a client chose), CORS
//! (preflight answered, fields on responses, origins matched), an unreadable list failing
//! closed, and an access annotation sluice does not enforce failing closed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use sluice_tests::*;

const N: &str = "nginx.ingress.kubernetes.io/";

async fn send(addr: SocketAddr, method: &str, host: &str, headers: &[(&str, &str)]) -> Got {
    request(addr, method, host, "/", headers).await
}

/// One Service and one Ingress per `(name, annotations)` row (host `NAME.test`, annotations
/// without the ingress-nginx prefix), served with `extra` flags.
async fn serve_rows(
    rows: &[(&str, &[(&str, &str)])],
    extra: &[&str],
) -> (Serving, Manifests, sluice_bench::backend::Backend) {
    let a = backend("a").await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc"));
    m.write("eps.yaml", &endpoint_slices("svc", &[a.addr]));
    let docs: Vec<String> = rows
        .iter()
        .map(|(name, ann)| {
            let keys: Vec<(String, String)> = ann
                .iter()
                .map(|(k, v)| (format!("{N}{k}"), v.to_string()))
                .collect();
            let ann: Vec<(&str, &str)> =
                keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            annotated_ingress(
                name,
                &format!("{name}.test"),
                &[("/", "Prefix", "svc")],
                &ann,
            )
        })
        .collect();
    m.write("ing.yaml", &docs.join("---\n"));
    let s = serve(m.dir.path(), extra).await;
    (s, m, a)
}

async fn setup(extra: &[&str]) -> (Serving, Manifests, sluice_bench::backend::Backend) {
    serve_rows(
        &[
            (
                "loopback-only",
                &[("whitelist-source-range", "127.0.0.0/8, ::1")],
            ),
            ("office-only", &[("allowlist-source-range", "10.0.0.0/8")]),
            ("no-loopback", &[("denylist-source-range", "127.0.0.1/32")]),
            ("typo", &[("whitelist-source-range", "10.0.0.0/88")]),
            // An access annotation sluice does not know (a future ingress-nginx one).
            ("auth", &[("auth-tomorrow", "on")]),
            ("cors-any", &[("enable-cors", "true")]),
            (
                "cors-list",
                &[
                    ("enable-cors", "true"),
                    (
                        "cors-allow-origin",
                        "https://app.test, https://*.example.test",
                    ),
                    ("cors-allow-credentials", "false"),
                    ("cors-max-age", "600"),
                    ("cors-allow-methods", "GET, POST"),
                    ("cors-allow-headers", "X-Token, Content-Type"),
                    ("cors-expose-headers", "X-Trace"),
                ],
            ),
        ],
        extra,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_ranges_judge_the_resolved_client() {
    let (s, _m, _a) = setup(&[]).await;
    let http = s.running.http_addr.unwrap();
    let status = |host: &'static str, headers: &'static [(&'static str, &'static str)]| async move {
        send(http, "GET", host, headers).await.status.as_u16()
    };
    assert_eq!(status("loopback-only.test", &[]).await, 200);
    assert_eq!(status("office-only.test", &[]).await, 403);
    assert_eq!(status("no-loopback.test", &[]).await, 403);
    // Without --trusted-proxies a client cannot claim an address.
    assert_eq!(
        status("office-only.test", &[("x-forwarded-for", "10.1.2.3")]).await,
        403
    );
    // An unreadable list fails closed, as does access control sluice does not enforce.
    assert_eq!(status("typo.test", &[]).await, 503);
    assert_eq!(status("auth.test", &[]).await, 503);
    let problems = status_text(&s).await;
    assert!(problems.contains("10.0.0.0/88"), "{problems}");
    assert!(problems.contains("auth-tomorrow"), "{problems}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_forwarded_client_is_judged() {
    let (s, _m, _a) = setup(&["--trusted-proxies", "127.0.0.1/32"]).await;
    let http = s.running.http_addr.unwrap();
    let get = |headers: &'static [(&'static str, &'static str)]| async move {
        send(http, "GET", "office-only.test", headers)
            .await
            .status
            .as_u16()
    };
    assert_eq!(get(&[("x-forwarded-for", "10.1.2.3")]).await, 200);
    assert_eq!(
        get(&[("x-forwarded-for", "10.1.2.3, 192.0.2.7")]).await,
        403
    );
    assert_eq!(get(&[("x-forwarded-for", "not-an-address")]).await, 403);
    assert_eq!(get(&[]).await, 403, "the proxy itself is not in the list");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflights_and_responses() {
    let (s, _m, a) = setup(&[]).await;
    let http = s.running.http_addr.unwrap();
    let before = a.requests.load(std::sync::atomic::Ordering::Relaxed);
    let pre = send(
        http,
        "OPTIONS",
        "cors-any.test",
        &[
            ("origin", "https://anyone.test"),
            ("access-control-request-method", "PUT"),
        ],
    )
    .await;
    assert_eq!(pre.status, 204);
    assert_eq!(pre.headers["access-control-allow-origin"], "*");
    assert_eq!(pre.headers["access-control-allow-credentials"], "true");
    assert_eq!(
        pre.headers["access-control-allow-methods"],
        "GET, PUT, POST, DELETE, PATCH, OPTIONS"
    );
    assert_eq!(pre.headers["access-control-max-age"], "1728000");
    assert_eq!(
        a.requests.load(std::sync::atomic::Ordering::Relaxed),
        before,
        "the preflight never reaches the pod"
    );
    let r = send(
        http,
        "GET",
        "cors-any.test",
        &[("origin", "https://x.test")],
    )
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("a")));
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    assert!(!r.headers.contains_key("access-control-max-age"));

    // A listed origin is echoed; an unlisted one gets no CORS fields (and its OPTIONS goes to
    // the pod like any request).
    let ok = send(
        http,
        "OPTIONS",
        "cors-list.test",
        &[("origin", "https://api.example.test")],
    )
    .await;
    assert_eq!(ok.status, 204);
    assert_eq!(
        ok.headers["access-control-allow-origin"],
        "https://api.example.test"
    );
    assert!(!ok.headers.contains_key("access-control-allow-credentials"));
    assert_eq!(ok.headers["access-control-max-age"], "600");
    assert_eq!(ok.headers["access-control-allow-methods"], "GET, POST");
    assert_eq!(
        ok.headers["access-control-allow-headers"],
        "X-Token, Content-Type"
    );
    let listed = send(
        http,
        "GET",
        "cors-list.test",
        &[("origin", "https://app.test")],
    )
    .await;
    assert_eq!(listed.headers["access-control-expose-headers"], "X-Trace");
    let no = send(
        http,
        "GET",
        "cors-list.test",
        &[("origin", "https://evil.test")],
    )
    .await;
    assert_eq!(no.status, 200);
    assert!(!no.headers.contains_key("access-control-allow-origin"));
    let no = send(
        http,
        "OPTIONS",
        "cors-list.test",
        &[("origin", "https://app.test.evil")],
    )
    .await;
    assert_eq!(no.backend(), Some("a"));
}

/// `limit-rps` at twice the limit: the admitted count is the rate times the time plus the
/// burst (within ±5%); `limit-connections` caps requests in flight; `limit-whitelist` exempts;
/// `--limit-req-status-code` sets the refusal's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_per_client() {
    let (s, _m, _a) = serve_rows(
        &[
            (
                "rps",
                &[("limit-rps", "50"), ("limit-burst-multiplier", "1")],
            ),
            ("conns", &[("limit-connections", "2")]),
            (
                "exempt",
                &[("limit-rps", "1"), ("limit-whitelist", "127.0.0.0/8")],
            ),
        ],
        &["--limit-req-status-code", "429"],
    )
    .await;
    let http = s.running.http_addr.unwrap();

    // 100 requests a second for 3 s against 50/s with a burst of 50.
    let c = client();
    let start = tokio::time::Instant::now();
    let (mut ok, mut limited) = (0u32, 0u32);
    for i in 0..300u32 {
        tokio::time::sleep_until(start + std::time::Duration::from_millis(u64::from(i) * 10)).await;
        match get(&c, http, "rps.test", "/")
            .await
            .unwrap()
            .status
            .as_u16()
        {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("status {other}"),
        }
    }
    let want = 50.0 * start.elapsed().as_secs_f64() + 51.0;
    eprintln!("limit-rps 50 at 100/s: {ok} admitted, {limited} refused, expected {want:.0}");
    assert!(
        (f64::from(ok) - want).abs() <= want * 0.05,
        "{ok} admitted, expected {want:.0}"
    );

    // Two in flight at once; the others are refused while they last.
    let slow: Vec<_> = (0..5)
        .map(|_| {
            tokio::spawn(async move {
                get(&client(), http, "conns.test", "/?delay_ms=500")
                    .await
                    .unwrap()
                    .status
                    .as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in slow {
        statuses.push(t.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(get(&c, http, "conns.test", "/").await.unwrap().status, 200);

    // An exempt client is never limited.
    for _ in 0..20 {
        assert_eq!(get(&c, http, "exempt.test", "/").await.unwrap().status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_rate_paces_each_response_after_its_first_bytes() {
    use http_body_util::BodyExt;
    let (s, _m, _a) = serve_rows(
        &[
            (
                "paced",
                &[("limit-rate", "100"), ("limit-rate-after", "50")],
            ),
            ("free", &[]),
        ],
        &[],
    )
    .await;
    let http = s.running.http_addr.unwrap();
    // 200 KiB: 50 KiB at once, then 150 KiB at 100 KiB/s = 1.5 s.
    let fetch = |host: &'static str| async move {
        let req = http::Request::get(format!("http://{http}/?size=204800"))
            .header("host", host)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let started = std::time::Instant::now();
        let resp = client().request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let (mut got, mut first_50k) = (0usize, None);
        while let Some(frame) = body.frame().await {
            got += frame.unwrap().into_data().map_or(0, |d| d.len());
            if got >= 50 * 1024 && first_50k.is_none() {
                first_50k = Some(started.elapsed());
            }
        }
        assert_eq!(got, 204_800);
        (first_50k.unwrap(), started.elapsed())
    };
    let (head, total) = fetch("paced.test").await;
    eprintln!("paced: first 50 KiB after {head:?}, 200 KiB after {total:?}");
    assert!(head < std::time::Duration::from_millis(500), "{head:?}");
    assert!(
        total >= std::time::Duration::from_millis(1_300)
            && total <= std::time::Duration::from_millis(3_000),
        "{total:?}"
    );
    let (_, free) = fetch("free.test").await;
    assert!(free < std::time::Duration::from_millis(500), "{free:?}");
}

/// `limit-connections` counts requests in flight; a request whose pod is gone ends with a 502
/// and gives its place back, so failures never lock a client out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_connections_places_come_back_after_upstream_errors() {
    // A port nothing listens on: the pod is gone.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc"));
    m.write("eps.yaml", &endpoint_slices("svc", &[gone]));
    m.write(
        "ing.yaml",
        &nginx_ingress("one", "svc", &[("limit-connections", "1")]),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    for i in 0..5 {
        let r = request(http, "GET", "one.test", "/", &[]).await;
        assert_eq!(r.status, 502, "request {i}: the place was given back");
    }
}

/// `limit-rpm`: requests per minute, the burst a multiple of it (`limit-burst-multiplier`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_rpm_counts_per_minute() {
    let (s, _m, _a) = serve_rows(
        &[(
            "per-minute",
            &[("limit-rpm", "2"), ("limit-burst-multiplier", "1")],
        )],
        &[],
    )
    .await;
    let http = s.running.http_addr.unwrap();
    let mut ok = 0;
    for _ in 0..10 {
        if send(http, "GET", "per-minute.test", &[]).await.status == 200 {
            ok += 1;
        }
    }
    // nginx's `limit_req rate=2r/m burst=2 nodelay`: the first, plus the burst of 2, at once.
    assert!((1..=3).contains(&ok), "{ok} of 10 admitted at 2 a minute");
}
