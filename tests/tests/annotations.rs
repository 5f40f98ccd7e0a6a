//! The ingress-nginx traffic annotations end to end through `sluice serve` over real sockets:
//! redirects, app-root, rewrite-target with regex paths, upstream-vhost, x-forwarded-prefix,
//! proxy-body-size, proxy-read-timeout, force-ssl-redirect, snippets refused, and canaries
//! (header, cookie, weight; a weight changed under load with no failed request, and the split
//! measured over 10,000 requests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use sluice_tests::*;

const N: &str = "nginx.ingress.kubernetes.io/";

fn k(name: &str) -> String {
    format!("{N}{name}")
}

/// GET with extra request headers.
async fn get_with(
    c: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let mut req = Request::get(format!("http://{addr}{path}")).header("host", host);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = c.request(req.body(Empty::new()).unwrap()).await.unwrap();
    let (parts, body) = resp.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn echo_field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
}

async fn base(m: &Manifests, svcs: &[(&str, SocketAddr)]) {
    m.write("class.yaml", &ingress_class());
    let services: Vec<String> = svcs.iter().map(|(n, _)| service(n)).collect();
    m.write("svc.yaml", &services.join("---\n"));
    let slices: Vec<String> = svcs
        .iter()
        .map(|(n, a)| endpoint_slices(n, &[*a]))
        .collect();
    m.write("eps.yaml", &slices.join("---\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_rewrites_and_request_edits() {
    let a = backend("a").await;
    let m = Manifests::new();
    base(&m, &[("svc-a", a.addr)]).await;
    // (name and host, path, annotations without the nginx prefix)
    type Row<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);
    let rows: &[Row] = &[
        (
            "perm",
            "/",
            &[("permanent-redirect", "https://new.test/landing")],
        ),
        (
            "perm-code",
            "/",
            &[
                ("permanent-redirect", "https://new.test/"),
                ("permanent-redirect-code", "308"),
            ],
        ),
        (
            "temp",
            "/",
            &[("temporal-redirect", "http://elsewhere.test/")],
        ),
        (
            "temp-code",
            "/",
            &[
                ("temporal-redirect", "http://elsewhere.test/"),
                ("temporal-redirect-code", "307"),
            ],
        ),
        ("approot", "/", &[("app-root", "/foo")]),
        (
            "rewrite",
            "/something(/|$)(.*)",
            &[("rewrite-target", "/echo?rest=$2")],
        ),
        (
            "edits",
            "/",
            &[
                ("upstream-vhost", "internal.svc.test"),
                ("x-forwarded-prefix", "/edge"),
                ("proxy-body-size", "1k"),
                ("proxy-read-timeout", "1"),
                ("configuration-snippet", "more_set_headers \"X-Evil: 1\";"),
            ],
        ),
        ("force", "/", &[("force-ssl-redirect", "true")]),
        ("aliased", "/", &[("server-alias", "nickname.test")]),
        ("www.twin", "/", &[("from-to-www-redirect", "true")]),
        ("www.plain", "/", &[("from-to-www-redirect", "true")]),
        ("plain", "/", &[]),
    ];
    let ings: Vec<String> = rows
        .iter()
        .map(|(name, path, ann)| {
            let keys: Vec<String> = ann.iter().map(|(a, _)| k(a)).collect();
            let ann: Vec<(&str, &str)> = keys
                .iter()
                .zip(ann.iter())
                .map(|(key, (_, v))| (key.as_str(), *v))
                .collect();
            let host = format!("{name}.test");
            annotated_ingress(
                name,
                &host,
                &[(path, "ImplementationSpecific", "svc-a")],
                &ann,
            )
        })
        .collect();
    m.write("ing.yaml", &ings.join("---\n"));
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();

    let r = get(&c, http, "perm.test", "/any/path?q=1").await.unwrap();
    assert_eq!(r.status, 301);
    assert_eq!(r.headers["location"], "https://new.test/landing");
    assert_eq!(
        a.requests.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "a redirect never reaches the backend"
    );
    let r = get(&c, http, "perm-code.test", "/").await.unwrap();
    assert_eq!(
        (r.status.as_u16(), &r.headers["location"]),
        (
            308,
            &"https://new.test/".parse::<http::HeaderValue>().unwrap()
        )
    );
    let r = get(&c, http, "temp.test", "/x").await.unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(r.headers["location"], "http://elsewhere.test/");
    let r = get(&c, http, "temp-code.test", "/x").await.unwrap();
    assert_eq!(r.status, 307);

    // app-root: only `/` is redirected, with the client's host and port, as ingress-nginx's
    // `return 302 $scheme://$http_host/foo`.
    let r = get(&c, http, "approot.test:8080", "/").await.unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(r.headers["location"], "http://approot.test:8080/foo");
    let r = get(&c, http, "approot.test", "/other").await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("a")));

    // rewrite-target: the path is replaced, the captures expanded, the query kept after the
    // template's; matching is case-insensitive.
    let r = get(&c, http, "rewrite.test", "/SOMETHING/deep/er?x=1")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        echo_field(&r.text(), "path"),
        Some("/echo?rest=deep/er&x=1")
    );
    let r = get(&c, http, "rewrite.test", "/something").await.unwrap();
    assert_eq!(echo_field(&r.text(), "path"), Some("/echo?rest="));
    let r = get(&c, http, "rewrite.test", "/nothing").await.unwrap();
    assert_eq!(r.status, 404);

    // upstream-vhost and x-forwarded-prefix reach the backend; the snippet is not executed.
    let r = get(&c, http, "edits.test", "/echo").await.unwrap();
    let body = r.text();
    assert_eq!(
        echo_field(&body, "host"),
        Some("internal.svc.test"),
        "{body}"
    );
    assert_eq!(echo_field(&body, "x-forwarded-prefix"), Some("/edge"));
    assert!(!r.headers.contains_key("x-evil"));

    // proxy-body-size: 1k here, the global default elsewhere.
    let post = |host: &str, len: usize| {
        format!(
            "POST /echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{}",
            "x".repeat(len)
        )
    };
    assert!(
        raw_status(http, &post("edits.test", 2000))
            .await
            .contains(" 413 ")
    );
    assert!(
        raw_status(http, &post("edits.test", 1000))
            .await
            .contains(" 200 ")
    );
    assert!(
        raw_status(http, &post("plain.test", 2000))
            .await
            .contains(" 200 ")
    );

    // proxy-read-timeout 1 s: a 3 s answer is a 504 after about a second.
    let t = Instant::now();
    let r = get(&c, http, "edits.test", "/?delay_ms=3000")
        .await
        .unwrap();
    assert_eq!(r.status, 504);
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    let r = get(&c, http, "plain.test", "/?delay_ms=1500")
        .await
        .unwrap();
    assert_eq!(r.status, 200);

    // force-ssl-redirect redirects even without a TLS section; ssl-redirect alone would not.
    let r = get(&c, http, "force.test", "/p?q=1").await.unwrap();
    assert_eq!(r.status, 308);
    let https = s.running.https_addr.unwrap();
    assert_eq!(
        r.headers["location"],
        format!("https://force.test:{}/p?q=1", https.port()).as_str()
    );
    let r = get(&c, http, "plain.test", "/").await.unwrap();
    assert_eq!(r.status, 200);

    // server-alias: the alias serves the Ingress's rules.
    let r = get(&c, http, "nickname.test", "/x").await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("a")));

    // from-to-www-redirect: the bare twin redirects to the Ingress's host, unless another
    // Ingress defines the twin (plain.test is served, not redirected).
    let r = get(&c, http, "twin.test", "/a?b=c").await.unwrap();
    assert_eq!(r.status, 308);
    assert_eq!(r.headers["location"], "http://www.twin.test/a?b=c");
    assert_eq!(
        get(&c, http, "www.twin.test", "/").await.unwrap().status,
        200
    );
    assert_eq!(get(&c, http, "plain.test", "/x").await.unwrap().status, 200);

    // The refused snippet is reported, once, in the status API's problems.
    let admin = s.running.admin_addr;
    let status = get(&c, admin, "localhost", "/api/v1/status").await.unwrap();
    let text = status.text();
    assert!(
        text.contains("configuration-snippet refused"),
        "status problems: {text}"
    );
}

/// Counts backends over `n` requests from `workers` concurrent keep-alive clients.
async fn split(addr: SocketAddr, host: &str, n: usize, workers: usize) -> (u64, u64, Vec<String>) {
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let host = host.to_string();
            tokio::spawn(async move {
                let c = client();
                let (mut main, mut canary, mut failed) = (0, 0, Vec::new());
                for _ in 0..n / workers {
                    match get(&c, addr, &host, "/").await {
                        Ok(r) if r.status == 200 && r.backend() == Some("main") => main += 1,
                        Ok(r) if r.status == 200 && r.backend() == Some("canary") => canary += 1,
                        Ok(r) => failed.push(format!("{} {}", r.status, r.text())),
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (main, canary, failed)
            })
        })
        .collect();
    let mut out = (0, 0, Vec::new());
    for t in tasks {
        let (m, c, f) = t.await.unwrap();
        out.0 += m;
        out.1 += c;
        out.2.extend(f);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_by_header_cookie_and_weight_and_a_weight_changed_under_load() {
    let (main, canary) = (backend("main").await, backend("canary").await);
    let m = Manifests::new();
    base(&m, &[("svc-main", main.addr), ("svc-canary", canary.addr)]).await;
    m.write(
        "main.yaml",
        &ingress("main", "app.test", &[("/", "Prefix", "svc-main")]),
    );
    let canary_yaml = |weight: &str| {
        annotated_ingress(
            "canary",
            "app.test",
            &[("/", "Prefix", "svc-canary")],
            &[
                (&k("canary"), "true"),
                (&k("canary-by-header"), "X-Canary"),
                (&k("canary-by-cookie"), "use_canary"),
                (&k("canary-weight"), weight),
            ],
        )
    };
    m.write("canary.yaml", &canary_yaml("0"));
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();

    // ingress-nginx's order: header (always/never), then cookie, then weight (0 here).
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "main"),
        (&[("x-canary", "always")], "canary"),
        (
            &[("x-canary", "never"), ("cookie", "use_canary=always")],
            "main",
        ),
        (&[("cookie", "a=b; use_canary=always")], "canary"),
        (
            &[("x-canary", "other"), ("cookie", "use_canary=always")],
            "canary",
        ),
    ];
    for (headers, want) in cases {
        let r = get_with(&c, http, "app.test", "/", headers).await;
        assert_eq!(r.backend(), Some(*want), "{headers:?}");
    }

    // Weights changed under load: no request fails while the snapshot is swapped.
    let load = Load::start(http, "app.test", 4, Duration::ZERO);
    for w in ["50", "100", "30"] {
        tokio::time::sleep(Duration::from_millis(400)).await;
        m.write("canary.yaml", &canary_yaml(w));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen = load.finish().await;
    assert!(
        seen.failures.is_empty(),
        "{:?}",
        &seen.failures[..seen.failures.len().min(5)]
    );
    assert!(seen.ok > 200, "load ran: {seen:?}");
    assert!(seen.by_backend.get("canary").copied().unwrap_or(0) > 0);

    // The last weight (30) is in force: the split over 10,000 requests is within ±3 points.
    let (to_main, to_canary, failed) = split(http, "app.test", 10_000, 8).await;
    assert!(failed.is_empty(), "{:?}", &failed[..failed.len().min(5)]);
    let share = to_canary as f64 * 100.0 / (to_main + to_canary) as f64;
    eprintln!(
        "canary-weight 30: {to_canary} of {} requests = {share:.2}%",
        to_main + to_canary
    );
    assert!((27.0..=33.0).contains(&share), "canary share {share:.2}%");

    // By header value, then by header pattern (other values fall through to the weight, 0 of
    // a total of 1,000 here); weight-total 1,000 with weight 1,000 sends everything.
    let rules = |extra: &[(&str, &str)]| {
        let keys: Vec<(String, String)> =
            extra.iter().map(|(a, v)| (k(a), v.to_string())).collect();
        let mut ann: Vec<(&str, &str)> =
            keys.iter().map(|(a, v)| (a.as_str(), v.as_str())).collect();
        let canary = k("canary");
        ann.push((&canary, "true"));
        annotated_ingress("canary", "app.test", &[("/", "Prefix", "svc-canary")], &ann)
    };
    let to = |headers: &'static [(&'static str, &'static str)], want: &'static str| async move {
        // Twenty in a row, so that the weight of the previous rules (30%) cannot pass it.
        eventually(Duration::from_secs(5), || async {
            let c = client();
            for _ in 0..20 {
                if get_with(&c, http, "app.test", "/", headers).await.backend() != Some(want) {
                    return false;
                }
            }
            true
        })
        .await
    };
    m.write(
        "canary.yaml",
        &rules(&[
            ("canary-by-header", "X-Version"),
            ("canary-by-header-value", "v2"),
            ("canary-weight", "0"),
            ("canary-weight-total", "1000"),
        ]),
    );
    assert!(to(&[("x-version", "v2")], "canary").await);
    assert!(to(&[("x-version", "v3")], "main").await);
    m.write(
        "canary.yaml",
        &rules(&[
            ("canary-by-header", "X-User"),
            ("canary-by-header-pattern", "^beta-"),
        ]),
    );
    assert!(to(&[("x-user", "beta-7")], "canary").await);
    assert!(to(&[("x-user", "gamma")], "main").await);
    m.write(
        "canary.yaml",
        &rules(&[("canary-weight", "1000"), ("canary-weight-total", "1000")]),
    );
    assert!(to(&[], "canary").await);
}

/// In `serve` mode the controller ConfigMap is one of the manifests; editing its file applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reads_the_configmap_from_the_manifests() {
    let a = backend("a").await;
    let m = Manifests::new();
    base(&m, &[("svc-a", a.addr)]).await;
    m.write(
        "ing.yaml",
        &ingress("plain", "plain.test", &[("/", "Prefix", "svc-a")]),
    );
    let cm = |size: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sluice\n  namespace: default\ndata:\n  proxy-body-size: {size}\n"
        )
    };
    m.write("cm.yaml", &cm("1k"));
    let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
    let http = s.running.http_addr.unwrap();
    let post = format!(
        "POST /echo HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 2000\r\nConnection: close\r\n\r\n{}",
        "x".repeat(2000)
    );
    assert!(raw_status(http, &post).await.contains(" 413 "));
    m.write("cm.yaml", &cm("2k"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            raw_status(http, &post).await.contains(" 200 ")
        })
        .await
    );
}

/// `affinity: cookie`: a new client gets the session cookie and keeps its pod; sessions spread
/// over the pods; a session whose pod goes moves to another pod and stays there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_affinity_by_cookie() {
    let pods = [
        backend("p1").await,
        backend("p2").await,
        backend("p3").await,
    ];
    let addrs: Vec<SocketAddr> = pods.iter().map(|p| p.addr).collect();
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc"));
    m.write("eps.yaml", &endpoint_slices("svc", &addrs));
    m.write(
        "ing.yaml",
        &annotated_ingress(
            "sticky",
            "sticky.test",
            &[("/app", "Prefix", "svc")],
            &[
                (&k("affinity"), "cookie"),
                (&k("session-cookie-name"), "route"),
                (&k("session-cookie-max-age"), "3600"),
                (&k("session-cookie-samesite"), "Lax"),
            ],
        ),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();

    let mut sessions = Vec::new();
    for _ in 0..30 {
        let r = get_with(&c, http, "sticky.test", "/app/x", &[]).await;
        let set = r.headers["set-cookie"].to_str().unwrap().to_string();
        assert!(
            set.ends_with("; Path=/app; Max-Age=3600; HttpOnly; SameSite=Lax"),
            "{set}"
        );
        let value = set.split(';').next().unwrap().to_string();
        sessions.push((value, r.backend().unwrap().to_string()));
    }
    let spread: std::collections::BTreeSet<&str> =
        sessions.iter().map(|(_, b)| b.as_str()).collect();
    assert_eq!(spread.len(), 3, "30 sessions over 3 pods: {sessions:?}");
    // Each session keeps its pod, whatever else is in the Cookie fields.
    for (cookie, pod) in &sessions {
        for _ in 0..5 {
            let r = get_with(
                &c,
                http,
                "sticky.test",
                "/app/y",
                &[("cookie", "other=1"), ("cookie", cookie)],
            )
            .await;
            assert_eq!(r.backend(), Some(pod.as_str()));
            assert!(!r.headers.contains_key("set-cookie"), "no new cookie");
        }
    }
    // p1 goes: its sessions move (each to one pod, consistently); the others stay.
    m.write("eps.yaml", &endpoint_slices("svc", &addrs[1..]));
    assert!(
        eventually(Duration::from_secs(5), || async {
            let (cookie, _) = sessions.iter().find(|(_, p)| p == "p1").unwrap();
            get_with(
                &client(),
                http,
                "sticky.test",
                "/app",
                &[("cookie", cookie)],
            )
            .await
            .backend()
                != Some("p1")
        })
        .await
    );
    for (cookie, pod) in &sessions {
        let first = get_with(&c, http, "sticky.test", "/app", &[("cookie", cookie)]).await;
        let again = get_with(&c, http, "sticky.test", "/app", &[("cookie", cookie)]).await;
        assert_eq!(first.backend(), again.backend());
        if pod != "p1" {
            assert_eq!(
                first.backend(),
                Some(pod.as_str()),
                "only p1's sessions move"
            );
        }
    }
}

/// `default-backend` takes a route whose pool has no endpoint; `custom-http-errors` replaces
/// the listed statuses with the default backend's page, asked for with ingress-nginx's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_backend_and_custom_errors() {
    let (main, errors) = (backend("main").await, backend("errors").await);
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[
            service("svc-main"),
            service("svc-errors"),
            service("nobody"),
        ]
        .join("---\n"),
    );
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("svc-main", &[main.addr]),
            endpoint_slices("svc-errors", &[errors.addr]),
        ]
        .join("---\n"),
    );
    m.write(
        "ing.yaml",
        &[
            annotated_ingress(
                "pages",
                "pages.test",
                &[("/", "Prefix", "svc-main")],
                &[
                    (&k("default-backend"), "svc-errors"),
                    (&k("custom-http-errors"), "404,503"),
                ],
            ),
            annotated_ingress(
                "empty",
                "empty.test",
                &[("/", "Prefix", "nobody")],
                &[(&k("default-backend"), "svc-errors")],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();

    let r = get(&c, http, "pages.test", "/").await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("main")));
    let r = get_with(
        &c,
        http,
        "pages.test",
        "/echo?status=503",
        &[("accept", "application/json")],
    )
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (503, Some("errors")));
    let body = r.text();
    for (name, want) in [
        ("x-code", "503"),
        ("x-original-uri", "/echo?status=503"),
        ("x-namespace", "default"),
        ("x-ingress-name", "pages"),
        ("x-service-name", "svc-main"),
        ("x-service-port", "80"),
        ("x-format", "application/json"),
        ("method", "GET"),
    ] {
        assert_eq!(echo_field(&body, name), Some(want), "{name} in {body}");
    }
    let r = get(&c, http, "pages.test", "/?status=500").await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.backend()),
        (500, Some("main")),
        "not listed"
    );
    // No endpoint behind the route: the default backend answers.
    let r = get(&c, http, "empty.test", "/").await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("errors")));

    // The default backend's pod is gone: the page request fails at once (502), the route's
    // own answers are unaffected.
    errors.kill();
    let t = std::time::Instant::now();
    let r = get(&c, http, "pages.test", "/echo?status=503")
        .await
        .unwrap();
    assert_eq!(r.status, 502);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(get(&c, http, "empty.test", "/").await.unwrap().status, 502);
    let r = get(&c, http, "pages.test", "/").await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("main")));
}
