//! The operator's page as a person uses it: `sluice serve` with real traffic, the page open in
//! headless Chromium, the numbers it shows read back and compared with the JSON API, an
//! endpoint added and seen arriving on the page, hostile Ingress content shown as text, no
//! credential on it, and a screenshot kept in the test output (ignored, with the reason, where
//! Chromium is not installed: see `build.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use sluice_tests::cdp::Browser;
use sluice_tests::*;

/// The script's-eye view of one table row's figures: `{k: [data-v, text]}`.
const READ_PAGE: &str = r#"(() => {
  const figs = (root) => root ? Object.fromEntries([...root.querySelectorAll('[data-k]')]
      .map(e => [e.dataset.k, [e.dataset.v, e.textContent]])) : null;
  const pool = document.querySelector('.pool[data-pool="default/web:80"]');
  return {
    refreshes: Number(document.body.dataset.refreshes || 0),
    sampledAt: Number(document.body.dataset.sampledAt || 0),
    summary: figs(document.getElementById('summary')),
    totals: figs(document.getElementById('totals')),
    route: figs(document.querySelector('#traffic tr[data-route="default/web"][data-service="default/web:80"]')),
    endpoints: pool ? [...pool.querySelectorAll('tr[data-address]')].map(r => ({address: r.dataset.address, ...figs(r)})) : [],
    problems: [...document.querySelectorAll('#problems li:not(.none)')].map(li => li.textContent),
    cert: figs(document.querySelector('#certificates tr[data-host="app.test"]')),
    changes: [...document.querySelectorAll('#changes tr')].map(r => r.textContent),
    annotations: [...document.querySelectorAll('#annotations tr[data-annotation]')].map(r => [r.dataset.annotation, r.children[2].textContent, r.children[3].textContent]),
    text: document.body.innerText,
    updated: document.getElementById('updated').textContent,
    scripts: document.scripts.length,
    pwned: window.pwned === undefined ? null : window.pwned,
  };
})()"#;

async fn api(admin: SocketAddr, path: &str) -> Value {
    let r = get(&client(), admin, "127.0.0.1", path).await.unwrap();
    assert_eq!(r.status, 200, "{path}");
    serde_json::from_slice(&r.body).unwrap()
}

/// A figure the page shows equals the API's value: its `data-v` and its text.
fn same(page: &Value, k: &str, api: &Value, what: &str) {
    let [v, text] = [&page[k][0], &page[k][1]].map(|x| x.as_str().unwrap_or("").to_string());
    match api {
        Value::Null => {
            assert_eq!((v.as_str(), text.as_str()), ("", "–"), "{what} {k}");
        }
        Value::Number(n) => {
            let want = n.as_f64().unwrap();
            let got: f64 = v.parse().unwrap_or(f64::NAN);
            let shown: f64 = text.parse().unwrap_or(f64::NAN);
            assert!(
                (got - want).abs() < 1e-9,
                "{what} {k}: page {v}, API {want}"
            );
            assert!(
                (shown - want).abs() < 1e-3,
                "{what} {k}: page shows {text}, API {want}"
            );
        }
        other => assert_eq!(v, other.to_string().trim_matches('"'), "{what} {k}"),
    }
}

/// The element of a JSON array whose `key` is `value`.
fn find<'a>(list: &'a Value, key: &str, value: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x[key] == value)
        .unwrap_or_else(|| panic!("no {key} = {value} in {list}"))
}

async fn read(b: &mut Browser) -> Value {
    b.eval(READ_PAGE).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_chromium,
    ignore = "needs Chromium (apt-get install chromium); see tests/build.rs"
)]
async fn the_page_shows_what_the_api_returns_and_follows_a_change() {
    let (a1, a2) = (backend("a1").await, backend("a2").await);
    let m = Manifests::new();
    let (crt, key) = self_signed(&["app.test"]);
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &[service("web"), service("auth")].join("---\n"));
    m.write("eps.yaml", &endpoint_slices("web", &[a1.addr]));
    m.write("secret.yaml", &tls_secret("app-cert", &crt, &key));
    m.write(
        "ing.yaml",
        &[
            tls_ingress(
                "web",
                "app.test",
                "app-cert",
                "web",
                &[("nginx.ingress.kubernetes.io/ssl-redirect", "false")],
            ),
            // What an Ingress author could write to attack the operator's browser, and a
            // credential that must never reach the page.
            annotated_ingress(
                "odd",
                "odd.test",
                &[("/", "Prefix", "web")],
                &[
                    (
                        "nginx.ingress.kubernetes.io/configuration-snippet",
                        "<script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\">",
                    ),
                    (
                        "nginx.ingress.kubernetes.io/auth-url",
                        "https://admin:hunter2@auth.example/check?token=s3cret",
                    ),
                ],
            ),
            ingress("ghost", "ghost.test", &[("/", "Prefix", "no-such-service")]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let (http, admin) = (s.running.http_addr.unwrap(), s.running.admin_addr);

    // Real traffic through sluice for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
        tokio::spawn(async move {
            let c = client();
            while !stop.load(Ordering::Relaxed) {
                let r = get(&c, http, "app.test", "/").await.unwrap();
                assert_eq!(r.status, 200);
                sent.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let url = format!("http://{admin}/");
    let mut b = Browser::open(&url, 1400, 2200).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while b
        .eval("Number((document.body && document.body.dataset.refreshes) || 0)")
        .await
        .unwrap()
        .as_u64()
        < Some(1)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page never drew"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 1. The traffic figures: wait for a sample with this route's requests in it, then compare
    //    the page with the API at the same sample.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
    let (page, traffic) = loop {
        let page = read(&mut b).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "no sample with traffic on the page: {}",
            page["updated"]
        );
        let t = api(admin, "/api/v1/traffic").await;
        let route = t["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["route"] == "default/web" && r["service"] == "default/web:80")
            .cloned();
        let busy = route
            .as_ref()
            .is_some_and(|r| r["last_minute"]["requests"].as_u64() > Some(0));
        if busy && page["sampledAt"].as_u64() == t["sampled_at_unix_ms"].as_u64() {
            break (page, t);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let route = find(&traffic["routes"], "route", "default/web");
    for k in ["rps", "errors", "p50_ms", "p99_ms"] {
        same(&page["route"], k, &route["last_minute"][k], "route");
    }
    for k in [
        "rps",
        "requests",
        "errors",
        "error_ratio",
        "p50_ms",
        "p99_ms",
    ] {
        same(
            &page["totals"],
            k,
            &traffic["total_last_minute"][k],
            "totals",
        );
    }
    assert!(route["last_minute"]["rps"].as_f64().unwrap() > 1.0);

    // 2. Certificates, problems and the annotations in force.
    let certs = api(admin, "/api/v1/certificates").await;
    let cert = find(&certs, "host", "app.test");
    same(
        &page["cert"],
        "days_left",
        &cert["days_left"],
        "certificate",
    );
    let status = api(admin, "/api/v1/status").await;
    assert_eq!(page["problems"], status["problems"]);
    assert!(
        page["problems"].to_string().contains("no-such-service"),
        "{}",
        page["problems"]
    );
    let notes = page["annotations"].to_string();
    assert!(
        notes.contains("configuration-snippet") && notes.contains("refused"),
        "{notes}"
    );
    assert!(notes.contains("https://…@auth.example/check?…"), "{notes}");

    // 3. Hostile content is text, and no credential or key is anywhere on the page.
    assert_eq!(
        page["pwned"],
        Value::Null,
        "an Ingress ran script on the page"
    );
    assert_eq!(page["scripts"], 1, "only the page's own script");
    let text = page["text"].as_str().unwrap();
    assert!(
        text.contains("<script>window.pwned=1</script>"),
        "shown as text"
    );
    for secret in ["hunter2", "s3cret", "PRIVATE KEY", "BEGIN CERTIFICATE"] {
        assert!(!text.contains(secret), "{secret} on the page:\n{text}");
    }
    let routes = api(admin, "/api/v1/routes").await.to_string();
    assert!(!routes.contains("hunter2") && !routes.contains("s3cret"));

    // 4. Pools: stop the traffic, let the page refresh, and every endpoint figure is the API's.
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let refreshed = read(&mut b).await["refreshes"].as_u64().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let page = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p = read(&mut b).await;
        if p["refreshes"].as_u64().unwrap() >= refreshed + 2 {
            break p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page stopped refreshing: {}",
            p["updated"]
        );
    };
    let pools = api(admin, "/api/v1/upstreams").await;
    let pool = find(&pools, "name", "default/web:80");
    let eps = pool["endpoints"].as_array().unwrap();
    assert_eq!(page["endpoints"].as_array().unwrap().len(), eps.len());
    for (shown, e) in page["endpoints"].as_array().unwrap().iter().zip(eps) {
        assert_eq!(shown["address"], e["address"]);
        for k in ["state", "in_flight", "requests", "failures", "ewma_ms"] {
            same(shown, k, &e[k], "endpoint");
        }
    }
    let served: u64 = eps.iter().map(|e| e["requests"].as_u64().unwrap()).sum();
    assert_eq!(
        served,
        sent.load(Ordering::Relaxed),
        "every request sent was counted"
    );
    same(
        &page["summary"],
        "generation",
        &status["generation"],
        "status",
    );
    same(
        &page["summary"],
        "endpoints",
        &status["endpoints"],
        "status",
    );

    // 5. An endpoint arrives: the page shows it, and the timeline says what changed.
    m.write("eps.yaml", &endpoint_slices("web", &[a1.addr, a2.addr]));
    let a2_addr = a2.addr.to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let page = loop {
        let p = read(&mut b).await;
        let arrived = p["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["address"] == a2_addr.as_str());
        if arrived {
            break p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new endpoint never reached the page"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let timeline = page["changes"].to_string();
    assert!(
        timeline.contains(&format!("+{a2_addr}")) && timeline.contains("1 → 2 endpoints"),
        "{timeline}"
    );

    // 6. The screenshot, kept with the test output.
    let png = b.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("operator-page.png");
    std::fs::write(&out, &png).unwrap();
    println!("screenshot: {}", out.display());
    // `docs/operator-page.png` is made this way.
    if let Some(also) = std::env::var_os("SLUICE_PAGE_SCREENSHOT") {
        std::fs::write(also, &png).unwrap();
    }
    drop(b);
    s.shutdown(Duration::from_secs(3)).await;
}
