//! `sluice serve` end to end: conformance through real sockets, bad input, hot changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use sluice_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_forwards_like_an_ingress_controller() {
    let (a, b) = (backend("a").await, backend("b").await);
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[service("svc-a"), service("svc-b")].join("---\n"),
    );
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("svc-a", &[a.addr]),
            endpoint_slices("svc-b", &[b.addr]),
        ]
        .join("---\n"),
    );
    m.write(
        "ing.yaml",
        &[
            ingress(
                "one",
                "app.test",
                &[
                    ("/", "Prefix", "svc-a"),
                    ("/b", "Prefix", "svc-b"),
                    ("/exact", "Exact", "svc-b"),
                ],
            ),
            ingress("two", "*.wild.test", &[("/", "Prefix", "svc-b")]),
            ingress("ghost", "ghost.test", &[("/", "Prefix", "no-such-service")]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();

    let r = get(&c, http, "app.test", "/x?q=1").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.backend(), Some("a"));
    assert_eq!(r.headers.get("server").unwrap(), "sluice");
    assert!(r.headers.contains_key("date"));
    assert_eq!(r.headers.get("content-length").unwrap(), "1024");
    assert_eq!(
        get(&c, http, "APP.test:8080", "/b/c")
            .await
            .unwrap()
            .backend(),
        Some("b")
    );
    assert_eq!(
        get(&c, http, "app.test", "/bb").await.unwrap().backend(),
        Some("a"),
        "element-wise prefix"
    );
    assert_eq!(
        get(&c, http, "app.test", "/exact").await.unwrap().backend(),
        Some("b")
    );
    assert_eq!(
        get(&c, http, "x.wild.test", "/").await.unwrap().backend(),
        Some("b")
    );
    assert_eq!(
        get(&c, http, "y.x.wild.test", "/").await.unwrap().status,
        404
    );
    let r = get(&c, http, "unknown.test", "/").await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.headers.get("server").unwrap(), "sluice");
    let r = get(&c, http, "ghost.test", "/").await.unwrap();
    assert_eq!(r.status, 503);
    // Internal names (Service, namespace, Ingress) never reach the client: the reason is in
    // the log and in /api/v1/status.
    assert_eq!(r.text(), "503 Service Unavailable\n");
    assert_eq!(r.headers.get("server").unwrap(), "sluice");

    // What the backend saw: Host, path, method, User-Agent preserved; proxy headers added;
    // HTTP/1.1 to the backend.
    let req = http::Request::post(format!("http://{http}/echo?x=1"))
        .header("host", "app.test")
        .header("user-agent", "conformance/1.0")
        .header("x-request-id", "keep-me")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "drop-me")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"hello",
        )))
        .unwrap();
    let c2: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let resp = c2.request(req).await.unwrap();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let echo = String::from_utf8_lossy(&body);
    for want in [
        "method=POST",
        "path=/echo?x=1",
        "version=HTTP/1.1",
        "host=app.test",
        "user-agent=conformance/1.0",
        "x-request-id=keep-me",
        "x-forwarded-for=127.0.0.1",
        "x-forwarded-proto=http",
        "x-forwarded-host=app.test",
        &format!("x-forwarded-port={}", http.port()),
        "body-bytes=5",
    ] {
        assert!(
            echo.lines().any(|l| l == want),
            "missing {want:?} in:\n{echo}"
        );
    }
    assert!(
        !echo.contains("x-hop"),
        "hop-by-hop header named in Connection leaked:\n{echo}"
    );
    s.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_reported_and_the_rest_keeps_serving() {
    let a = backend("a").await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc-a"));
    m.write("eps.yaml", &endpoint_slices("svc-a", &[a.addr]));
    m.write(
        "ing.yaml",
        &ingress("one", "app.test", &[("/", "Prefix", "svc-a")]),
    );
    let s = serve(m.dir.path(), &["--max-header-size", "8192"]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();
    assert_eq!(get(&c, http, "app.test", "/").await.unwrap().status, 200);

    // An unparsable edit of ing.yaml keeps its last good objects.
    m.write(
        "ing.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: one\n",
    );
    // A new, valid file alongside still takes effect.
    m.write(
        "more.yaml",
        &ingress("two", "more.test", &[("/", "Prefix", "svc-a")]),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&c, http, "more.test", "/")
                .await
                .map(|r| r.status == 200)
                .unwrap_or(false)
        })
        .await
    );
    assert_eq!(
        get(&c, http, "app.test", "/").await.unwrap().status,
        200,
        "last good objects of the broken file stay"
    );
    // The broken file is named under `problems` and counted in the metric, and stays named
    // while other files change.
    let problems = status_problems(&c, s.running.admin_addr).await;
    assert!(
        problems
            .iter()
            .any(|p| p.contains("ing.yaml: document 1: -: YAML:")),
        "{problems:?}"
    );
    assert_eq!(
        problems_metric(&c, s.running.admin_addr).await,
        problems.len()
    );

    // Unknown fields are ignored, as the API server's default field validation does, but
    // reported per file, document and field.
    m.write(
        "svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: svc-a, namespace: default}\nspec_: {x: 1}\nspec:\n  bogusField: 1\n  portz: 81\n  ports: [{name: http, port: 80}]\n",
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            status_problems(&c, s.running.admin_addr).await.len() == 4
        })
        .await,
        "{:?}",
        status_problems(&c, s.running.admin_addr).await
    );
    let problems = status_problems(&c, s.running.admin_addr).await;
    for field in ["spec.bogusField", "spec.portz", "spec_"] {
        assert!(
            problems.iter().any(|p| p.contains(&format!(
                "svc.yaml: document 1: {field}: Service default/svc-a: unknown field"
            ))),
            "{field}: {problems:?}"
        );
    }
    assert_eq!(problems_metric(&c, s.running.admin_addr).await, 4);
    assert_eq!(get(&c, http, "app.test", "/").await.unwrap().status, 200);
    // Fixing both files clears their problems.
    m.write("svc.yaml", &service("svc-a"));
    m.write(
        "ing.yaml",
        &ingress("one", "app.test", &[("/", "Prefix", "svc-a")]),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            status_problems(&c, s.running.admin_addr).await.is_empty()
        })
        .await
    );
    assert_eq!(problems_metric(&c, s.running.admin_addr).await, 0);

    // An oversized request head gets 431 and the server keeps serving.
    let big = "x".repeat(16 * 1024);
    let req = http::Request::get(format!("http://{http}/"))
        .header("host", "app.test")
        .header("x-big", big)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let r = client().request(req).await.unwrap();
    assert_eq!(r.status(), 431);
    assert_eq!(get(&c, http, "app.test", "/").await.unwrap().status, 200);

    let status: serde_json::Value = {
        let r = get(&c, s.running.admin_addr, "localhost", "/api/v1/status")
            .await
            .unwrap();
        serde_json::from_slice(&r.body).unwrap()
    };
    assert_eq!(status["ready"], true);
    s.shutdown(Duration::from_secs(5)).await;
}

/// The README's standalone walkthrough serves `examples/`: it must load with no problems and
/// produce the routes, pools and endpoints it describes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_load_cleanly() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let s = serve(&examples, &[]).await;
    let c = client();
    let r = get(&c, s.running.admin_addr, "localhost", "/api/v1/status")
        .await
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(status["ready"], true);
    assert_eq!(status["problems"], serde_json::json!([]), "{status}");
    assert_eq!(status["virtual_hosts"], 2, "{status}");
    assert_eq!(status["upstreams"], 1, "{status}");
    assert_eq!(status["endpoints"], 3, "{status}");
    // An unknown host is a 404 from sluice itself, not a backend's answer.
    let r = get(&c, s.running.http_addr.unwrap(), "nope.localhost", "/")
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    s.shutdown(Duration::from_secs(5)).await;
}

async fn status_problems(
    c: &Client<HttpConnector, Empty<Bytes>>,
    admin: SocketAddr,
) -> Vec<String> {
    let r = get(c, admin, "localhost", "/api/v1/status").await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

async fn problems_metric(c: &Client<HttpConnector, Empty<Bytes>>, admin: SocketAddr) -> usize {
    let r = get(c, admin, "localhost", "/metrics").await.unwrap();
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix("sluice_config_problems "))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// An EndpointSlice-only file change in `serve` mode takes the endpoints fast path: the new
/// pod gets traffic, no translation runs (the generation stays), and a load across the change
/// sees no failure; a change to anything else still applies in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_file_changes_take_the_fast_path() {
    let (a, b) = (backend("a").await, backend("b").await);
    let m = Manifests::new();
    m.write(
        "app.yaml",
        &[
            ingress_class(),
            service("svc"),
            ingress("web", "fast.test", &[("/", "Prefix", "svc")]),
        ]
        .join("---\n"),
    );
    m.write("eps.yaml", &endpoint_slices("svc", &[a.addr]));
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let generation = s.running.dp.generation();
    let load = Load::start(http, "fast.test", 4, Duration::from_millis(2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    m.write("eps.yaml", &endpoint_slices("svc", &[b.addr]));
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&client(), http, "fast.test", "/")
                .await
                .is_ok_and(|r| r.backend() == Some("b"))
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = load.finish().await;
    assert!(seen.failures.is_empty(), "{:?}", seen.failures);
    assert_eq!(
        s.running.dp.generation(),
        generation,
        "an endpoints-only change applies without a translation"
    );
    // A Service change is not endpoints-only: a full apply.
    m.write(
        "app.yaml",
        &[
            ingress_class(),
            service("svc"),
            ingress("web", "other.test", &[("/", "Prefix", "svc")]),
        ]
        .join("---\n"),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            get(&client(), http, "other.test", "/")
                .await
                .is_ok_and(|r| r.backend() == Some("b"))
        })
        .await
    );
    assert!(s.running.dp.generation() > generation);
}
