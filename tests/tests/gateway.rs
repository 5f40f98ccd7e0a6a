//! The Gateway API end to end on `sluice serve` (YAML files, no cluster): a Gateway's socket
//! opens when it appears and closes when it goes, requests are routed by its HTTPRoutes'
//! rules (path, header and method matches, weights), the filters act (redirect, header
//! modifiers, URL rewrite), an unusable backend answers 500 and an unmatched host 404 — real
//! sockets on 127.0.0.1, real echo pods.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::echo::{self, Echo, field, get};
use sluice_tests::*;

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: sluice\nspec:\n  controllerName: sluice.dev/gateway-controller\n";

fn gateway(port: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: default\nspec:\n  gatewayClassName: sluice\n  listeners:\n  - name: http\n    port: {port}\n    protocol: HTTP\n    hostname: \"*.gw.test\"\n"
    )
}

const ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: r
  namespace: default
spec:
  parentRefs: [{name: gw}]
  hostnames: ["app.gw.test"]
  rules:
  - matches: [{path: {type: PathPrefix, value: /v1}}]
    backendRefs: [{name: a, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /v1}, headers: [{name: x-env, value: canary}]}]
    backendRefs: [{name: b, port: 80}]
  - matches: [{path: {type: Exact, value: /both}}]
    backendRefs: [{name: a, port: 80, weight: 1}, {name: b, port: 80, weight: 1}]
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: rewritten.test, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-set, value: "1"}], add: [{name: x-add, value: "2"}], remove: [x-drop]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-answer, value: "yes"}]}
    backendRefs: [{name: a, port: 80}]
  - matches: [{path: {type: Exact, value: /moved}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, statusCode: 301}
  - matches: [{path: {type: Exact, value: /missing}}]
    backendRefs: [{name: nonexistent, port: 80}]
  - matches: [{path: {type: Exact, value: /none}}]
  - matches: [{path: {type: Exact, value: /post}, method: POST}]
    backendRefs: [{name: b, port: 80}]
  - matches: [{path: {type: Exact, value: "/v1;x"}}]
    backendRefs: [{name: b, port: 80}]
  - matches: [{path: {type: Exact, value: /mirror}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: b, port: 80}}
    backendRefs: [{name: a, port: 80}]
"#;

/// A free port on loopback (bound and released).
async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// The whole answer to a raw request (which should ask for `Connection: close`).
async fn whole(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut got = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut got)).await;
    got
}

async fn answers(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

#[tokio::test]
async fn gateway_sockets_and_httproute_rules_serve_and_follow_changes() {
    let (a, b): (Echo, Echo) = (echo::start("a", 200).await, echo::start("b", 200).await);
    let m = Manifests::new();
    echo::write_services(&m, &[("a", &a), ("b", &b)]);
    let port = free_port().await;
    let gw: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    m.write("route.yaml", ROUTE);
    m.write("gw.yaml", &format!("{CLASS}---\n{}", gateway(port)));
    let s = serve(m.dir.path(), &[]).await;
    assert!(
        eventually(Duration::from_secs(10), || answers(gw)).await,
        "the Gateway's socket opens"
    );
    let host = "app.gw.test";
    let (code, body) = get(gw, host, "/v1/x", "").await;
    assert_eq!((code, field(&body, "name")), (200, Some("a")), "{body}");
    let (code, body) = get(gw, host, "/v1/x", "x-env: canary\r\n").await;
    assert_eq!(
        (code, field(&body, "name")),
        (200, Some("b")),
        "more header matches win"
    );
    let (code, body) = get(gw, "APP.gw.test:1234", "/v1", "").await;
    assert_eq!(code, 200, "host case and port do not matter");
    assert_eq!(
        field(&body, "host"),
        Some("APP.gw.test:1234"),
        "the pod sees Host unchanged"
    );
    assert_eq!(
        get(gw, "other.gw.test", "/v1", "").await.0,
        404,
        "not the route's host"
    );
    assert_eq!(
        get(gw, "app.elsewhere.test", "/v1", "").await.0,
        404,
        "not the listener's host"
    );
    assert_eq!(get(gw, host, "/nothing", "").await.0, 404);

    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let (_, body) = get(gw, host, "/both", "").await;
        seen.insert(field(&body, "name").unwrap_or_default().to_string());
    }
    assert_eq!(seen.len(), 2, "both weighted backends answer: {seen:?}");

    let (code, body) = get(gw, host, "/old/rest?q=1", "x-drop: 1\r\nx-add: 1\r\n").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(field(&body, "target"), Some("/new/rest?q=1"));
    assert_eq!(field(&body, "host"), Some("rewritten.test"));
    assert_eq!(field(&body, "x-set"), Some("1"));
    assert!(
        body.contains("x-add=1\n") && body.contains("x-add=2\n"),
        "{body}"
    );
    assert_eq!(field(&body, "x-drop"), None);
    let resp = whole(
        gw,
        &format!("GET /old HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(
        resp.to_ascii_lowercase().contains("x-answer: yes"),
        "{resp}"
    );

    let resp = whole(
        gw,
        &format!("GET /moved?a=b HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 301"), "{resp}");
    assert!(
        resp.contains(&format!("location: https://{host}/moved?a=b")),
        "{resp}"
    );
    assert_eq!(
        get(gw, host, "/missing", "").await.0,
        500,
        "an unusable backend answers 500"
    );
    assert_eq!(
        get(gw, host, "/none", "").await.0,
        500,
        "a rule without backends answers 500"
    );
    assert_eq!(
        get(gw, host, "/post", "").await.0,
        404,
        "GET is not the rule's method"
    );
    let (code, body) = echo::raw(
        gw,
        &format!(
            "POST /post HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!((code, field(&body, "name")), (200, Some("b")));

    // Paths are matched on the route view, as Ingress paths are: an encoded separator is a
    // separator, and a path whose literal reading is another rule's is refused.
    let (code, body) = get(gw, host, "/v1%2Fx", "").await;
    assert_eq!((code, field(&body, "name")), (200, Some("a")), "{body}");
    assert_eq!(
        get(gw, host, "/v1;x", "").await.0,
        400,
        "read as /v1 it is one rule's, read literally another's"
    );
    let (code, body) = get(gw, host, "/old%2Frest", "").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        field(&body, "target"),
        Some("/new/rest"),
        "the prefix is replaced on the view: {body}"
    );

    // A mirrored request: the client gets the backend's answer, the mirror gets a copy.
    let (code, body) = get(gw, host, "/mirror?m=1", "x-env: copy\r\n").await;
    assert_eq!((code, field(&body, "name")), (200, Some("a")));
    assert!(
        eventually(Duration::from_secs(5), || async {
            b.seen
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.contains("target=/mirror?m=1\n") && r.contains("x-env=copy\n"))
        })
        .await,
        "the mirror got a copy"
    );

    // The Ingress listeners never route by the Gateway's rules.
    assert_eq!(
        get(s.running.http_addr.unwrap(), host, "/v1", "").await.0,
        404
    );

    // A changed route reaches traffic on the same socket (an open connection stays open).
    let mut kept = tokio::net::TcpStream::connect(gw).await.unwrap();
    m.write("route.yaml", &ROUTE.replace("backendRefs: [{name: a, port: 80}]\n  - matches: [{path: {type: PathPrefix, value: /v1}, headers", "backendRefs: [{name: b, port: 80}]\n  - matches: [{path: {type: PathPrefix, value: /v1}, headers"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            field(&get(gw, host, "/v1", "").await.1, "name") == Some("b")
        })
        .await,
        "the changed rule serves"
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    kept.write_all(
        format!("GET /v1 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut got = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), kept.read_to_string(&mut got)).await;
    assert!(
        got.starts_with("HTTP/1.1 200"),
        "a connection opened before the change is served: {got}"
    );

    // The Gateway goes: its socket closes.
    m.write("gw.yaml", CLASS);
    assert!(
        eventually(Duration::from_secs(10), || async { !answers(gw).await }).await,
        "the Gateway's socket closes"
    );

    // With a Gateway socket open, a shutdown still drains within its deadline (the sockets'
    // manager and accept loops let go of the drain's counter when the server stops).
    m.write("gw.yaml", &format!("{CLASS}---\n{}", gateway(port)));
    assert!(eventually(Duration::from_secs(10), || answers(gw)).await);
    let started = std::time::Instant::now();
    assert!(s.shutdown(Duration::from_secs(5)).await, "drained in time");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        !answers(gw).await,
        "the Gateway's socket is closed by the shutdown"
    );
}

/// The features the GatewayClass status claims are exactly those the conformance run is given.
#[test]
fn claimed_features_are_the_conformance_runs() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway-api/features.txt"),
    )
    .unwrap();
    let mut listed: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    listed.sort_unstable();
    let claimed = sluice_config::gateway::SUPPORTED_FEATURES;
    assert_eq!(
        listed, claimed,
        "tests/gateway-api/features.txt and SUPPORTED_FEATURES differ"
    );
    assert!(
        claimed.windows(2).all(|w| w[0] < w[1]),
        "supportedFeatures must be sorted"
    );
}

/// The README's feature table shows every feature of the published report with the report's
/// verdict: claimed ones "passed" (the profile's extended result must then be success), the
/// others "not claimed".
#[test]
fn the_readme_table_shows_the_reports_verdict_for_every_feature() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let report = std::fs::read_to_string(root.join("docs/conformance/sluice-v1.6.3.yaml")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .split("## The Gateway API")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    let verdict = |feature: &str| -> Option<String> {
        let quoted = format!("`{feature}`");
        section
            .lines()
            .filter(|l| l.starts_with('|'))
            .find(|l| {
                l.split('|')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|f| f.trim() == quoted))
            })
            .and_then(|l| l.trim_end_matches('|').rsplit('|').next())
            .map(|c| c.trim().to_string())
    };
    assert!(
        report.contains("  extended:\n    result: success\n"),
        "the report's extended result is success"
    );
    let (mut supported, mut unsupported, mut list) = (Vec::new(), Vec::new(), None);
    for line in report.lines() {
        let t = line.trim();
        match t {
            "supportedFeatures:" => list = Some(true),
            "unsupportedFeatures:" => list = Some(false),
            _ if t.starts_with("- ") && list.is_some() => {
                let f = t.trim_start_matches("- ").to_string();
                if list == Some(true) {
                    supported.push(f);
                } else {
                    unsupported.push(f);
                }
            }
            _ => list = None,
        }
    }
    assert!(supported.len() >= 25, "{supported:?}");
    for f in &supported {
        assert_eq!(verdict(f).as_deref(), Some("passed"), "README row for {f}");
    }
    for f in &unsupported {
        assert_eq!(
            verdict(f).as_deref(),
            Some("not claimed"),
            "README row for {f}"
        );
    }
}

/// A Service whose port speaks h2c (`appProtocol: kubernetes.io/h2c`), with `pod` behind it.
fn h2c_service(name: &str, pod: &Echo) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ports:\n  - name: grpc\n    port: 80\n    appProtocol: kubernetes.io/h2c\n---\n{}",
        endpoint_slices(name, &[pod.addr]).replace("name: http", "name: grpc")
    )
}

const GRPC_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: rpc
  namespace: default
spec:
  parentRefs: [{name: gw}]
  hostnames: ["rpc.gw.test"]
  rules:
  - name: one
    matches: [{method: {service: pkg.Echo, method: One}}]
    backendRefs: [{name: ga, port: 80}]
  - matches: [{method: {service: pkg.Echo}, headers: [{name: x-pick, value: b}]}]
    backendRefs: [{name: gb, port: 80}]
  - matches: [{method: {type: RegularExpression, service: "pkg\\.E.*", method: "T.*"}}]
    backendRefs: [{name: gb, port: 80}]
"#;

/// GRPCRoutes from files: calls routed by service, method and header over h2c, to pods
/// spoken to in HTTP/2; a call no rule matches is not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_routes_from_files_route_calls_by_service_method_and_header() {
    use http_body_util::{BodyExt, Empty};
    let (a, b): (Echo, Echo) = (echo::start("a", 200).await, echo::start("b", 200).await);
    let m = Manifests::new();
    m.write(
        "svc.yaml",
        &[h2c_service("ga", &a), h2c_service("gb", &b)].join("---\n"),
    );
    let port = free_port().await;
    let gw: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    m.write("gw.yaml", &format!("{CLASS}---\n{}", gateway(port)));
    m.write("grpc.yaml", GRPC_ROUTE);
    let s = serve(m.dir.path(), &[]).await;
    assert!(
        eventually(Duration::from_secs(10), || answers(gw)).await,
        "the Gateway's socket opens"
    );
    let mut send = echo::h2c(gw).await;
    for (path, pick, want) in [
        ("/pkg.Echo/One", None, Some("a")),
        ("/pkg.Echo/One", Some("b"), Some("a")),
        ("/pkg.Echo/Other", Some("b"), Some("b")),
        ("/pkg.Echo/Three", None, Some("b")),
        ("/pkg.Echo/Other", None, None),
        ("/other.Svc/One", None, None),
    ] {
        let mut req = http::Request::post(format!("http://rpc.gw.test{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(p) = pick {
            req = req.header("x-pick", p);
        }
        let resp = send
            .send_request(req.body(Empty::<bytes::Bytes>::new()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        match want {
            Some(name) => {
                assert_eq!(
                    (status, field(&body, "name")),
                    (200, Some(name)),
                    "{path} {pick:?}: {body}"
                );
                // An HTTP/2 pod sees the whole URI (`:scheme`, `:authority`, `:path`).
                assert_eq!(
                    field(&body, "target"),
                    Some(format!("http://rpc.gw.test{path}").as_str())
                );
            }
            None => assert_eq!(status, 404, "{path} {pick:?}: {body}"),
        }
    }
    let status = status_text(&s).await;
    assert!(
        !status.contains("GRPCRoute"),
        "no problem reported: {status}"
    );
    s.shutdown(Duration::from_secs(2)).await;
}
