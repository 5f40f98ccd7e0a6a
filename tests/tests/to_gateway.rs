//! `sluice check --to-gateway` proven with traffic: the ingress-nginx annotation cases run once
//! as Ingresses and once as the HTTPRoutes the converter printed for them, in one `sluice
//! serve` (the Ingresses on its Ingress listeners, the routes on the generated Gateway's own
//! ports), and the same requests go to both. Every answer (status, backend, the target and
//! headers the pod saw, Location, CORS and HSTS headers) must be the same, or the difference
//! must be one the converter's report listed (approximated or without equivalent) before the
//! run. Cases expected to convert exactly must answer the same.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::echo::{self, Echo, field};
use sluice_tests::*;

/// A free port on loopback (bound and released).
async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// A pod that takes 3 s to answer (for the timeout case).
async fn slow_pod() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                tokio::time::sleep(Duration::from_secs(3)).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nx-backend: slow\r\n\r\nslow",
                    )
                    .await;
            });
        }
    });
    addr
}

/// What the test compares of one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Facts {
    status: u16,
    backend: Option<String>,
    /// What the pod saw: target, Host, X-Forwarded-Prefix.
    seen: Option<(String, String, String)>,
    /// Location without its port (each side redirects to its own listener's).
    location: Option<String>,
    cors: Option<String>,
    hsts: Option<String>,
}

async fn facts(addr: SocketAddr, method: &str, host: &str, target: &str, extra: &str) -> Facts {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req =
        format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let location = headers.get("location").map(|l| {
        // scheme://host:port/path → scheme://host/path
        match l.split_once("://") {
            Some((scheme, rest)) => {
                let (auth, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let host = auth.rsplit_once(':').map_or(auth, |(h, _)| h);
                format!("{scheme}://{host}{path}")
            }
            None => l.clone(),
        }
    });
    let seen = field(body, "target").map(|t| {
        (
            t.to_string(),
            field(body, "host").unwrap_or_default().to_string(),
            field(body, "x-forwarded-prefix")
                .unwrap_or_default()
                .to_string(),
        )
    });
    Facts {
        status,
        backend: headers.get("x-backend").cloned(),
        seen,
        location,
        cors: headers.get("access-control-allow-origin").cloned(),
        hsts: headers.get("strict-transport-security").cloned(),
    }
}

/// One annotation case: its Ingresses' YAML, the requests, whether it must convert exactly,
/// and the Ingress whose report lines explain a difference.
struct Case {
    ingress: &'static str,
    yaml: String,
    requests: Vec<(&'static str, &'static str, &'static str, &'static str)>,
    exact: bool,
}

fn ing(name: &str, host: &str, paths: &[(&str, &str, &str)], ann: &[(&str, &str)]) -> String {
    echo::dated_ingress(name, host, paths, ann, "2024-01-01T00:00:00Z")
}

fn cases() -> Vec<Case> {
    let c = |ingress, yaml, requests, exact| Case {
        ingress,
        yaml,
        requests,
        exact,
    };
    vec![
        c(
            "plain",
            ing(
                "plain",
                "plain.test",
                &[
                    ("/", "Prefix", "a"),
                    ("/exact", "Exact", "b"),
                    ("/p", "ImplementationSpecific", "b"),
                ],
                &[],
            ),
            vec![
                ("GET", "plain.test", "/", ""),
                ("GET", "plain.test", "/x?y=1", ""),
                ("GET", "plain.test", "/exact", ""),
                ("GET", "plain.test", "/exact/more", ""),
                ("GET", "plain.test", "/p/q", ""),
                ("GET", "plain.test", "/pq", ""),
                ("GET", "other.test", "/", ""),
            ],
            true,
        ),
        c(
            "rewrite",
            ing(
                "rewrite",
                "rw.test",
                &[("/app(/|$)(.*)", "ImplementationSpecific", "a")],
                &[("use-regex", "true"), ("rewrite-target", "/$2")],
            ),
            vec![
                ("GET", "rw.test", "/app/x/y?q=1", ""),
                ("GET", "rw.test", "/app", ""),
                ("GET", "rw.test", "/application", ""),
                // Case: ingress-nginx's regex ignores it, a PathPrefix does not (listed).
                ("GET", "rw.test", "/APP/x", ""),
            ],
            false,
        ),
        c(
            "full-rewrite",
            ing(
                "full-rewrite",
                "full.test",
                &[("/old", "Prefix", "a")],
                &[("rewrite-target", "/fixed")],
            ),
            vec![
                ("GET", "full.test", "/old/x?y=1", ""),
                ("GET", "full.test", "/OLD", ""),
                ("GET", "full.test", "/new", ""),
            ],
            true,
        ),
        c(
            "moved",
            ing(
                "moved",
                "moved.test",
                &[("/", "Prefix", "a")],
                &[
                    ("permanent-redirect", "https://new.test/landing"),
                    ("permanent-redirect-code", "308"),
                ],
            ),
            vec![("GET", "moved.test", "/anything", "")],
            // Exact without a query; a request's query is kept by the Gateway API (listed).
            false,
        ),
        c(
            "root",
            ing(
                "root",
                "root.test",
                &[("/", "Prefix", "a")],
                &[("app-root", "/home")],
            ),
            vec![
                ("GET", "root.test", "/", ""),
                ("GET", "root.test", "/home", ""),
            ],
            true,
        ),
        c(
            "canary-main",
            [
                ing("canary-main", "canary.test", &[("/", "Prefix", "a")], &[]),
                ing(
                    "canary-b",
                    "canary.test",
                    &[("/", "Prefix", "b")],
                    &[
                        ("canary", "true"),
                        ("canary-by-header", "X-Canary"),
                        ("canary-weight", "0"),
                    ],
                ),
            ]
            .join("---\n"),
            vec![
                ("GET", "canary.test", "/", ""),
                ("GET", "canary.test", "/", "X-Canary: always\r\n"),
                ("GET", "canary.test", "/", "X-Canary: never\r\n"),
                ("GET", "canary.test", "/", "X-Canary: maybe\r\n"),
            ],
            true,
        ),
        c(
            "weight-main",
            [
                ing("weight-main", "weight.test", &[("/", "Prefix", "a")], &[]),
                ing(
                    "weight-b",
                    "weight.test",
                    &[("/", "Prefix", "b")],
                    &[("canary", "true"), ("canary-weight", "100")],
                ),
            ]
            .join("---\n"),
            vec![
                ("GET", "weight.test", "/", ""),
                ("GET", "weight.test", "/w", ""),
            ],
            true,
        ),
        c(
            "value-main",
            [
                ing("value-main", "value.test", &[("/", "Prefix", "a")], &[]),
                ing(
                    "value-b",
                    "value.test",
                    &[("/", "Prefix", "b")],
                    &[
                        ("canary", "true"),
                        ("canary-by-header", "X-Env"),
                        ("canary-by-header-value", "beta"),
                    ],
                ),
            ]
            .join("---\n"),
            vec![
                ("GET", "value.test", "/", "X-Env: beta\r\n"),
                ("GET", "value.test", "/", "X-Env: prod\r\n"),
                ("GET", "value.test", "/", ""),
            ],
            true,
        ),
        c(
            "vhost",
            ing(
                "vhost",
                "vhost.test",
                &[("/", "Prefix", "a")],
                &[
                    ("upstream-vhost", "internal.test"),
                    ("x-forwarded-prefix", "/pre"),
                ],
            ),
            vec![("GET", "vhost.test", "/v", "")],
            true,
        ),
        c(
            "timeout",
            ing(
                "timeout",
                "slow.test",
                &[("/", "Prefix", "slow")],
                &[("proxy-read-timeout", "1")],
            ),
            vec![("GET", "slow.test", "/", "")],
            false,
        ),
        c(
            "cors",
            ing(
                "cors",
                "cors.test",
                &[("/", "Prefix", "a")],
                &[("enable-cors", "true")],
            ),
            vec![
                ("GET", "cors.test", "/", "Origin: https://site.test\r\n"),
                (
                    "OPTIONS",
                    "cors.test",
                    "/",
                    "Origin: https://site.test\r\nAccess-Control-Request-Method: PUT\r\n",
                ),
            ],
            false,
        ),
        c(
            "auth",
            ing(
                "auth",
                "auth.test",
                &[("/", "Prefix", "a")],
                &[("auth-type", "basic"), ("auth-secret", "users")],
            ),
            vec![("GET", "auth.test", "/", "")],
            false,
        ),
        c(
            "tls",
            tls_ingress("tls", "tls.test", "tls-cert", "a", &[]),
            vec![("GET", "tls.test", "/x?y=1", "")],
            true,
        ),
    ]
}

/// `(object, item) → word` from the report on stderr.
fn parse_report(text: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let mut object = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("  ") {
            let Some((item, tail)) = rest.split_once("  ") else {
                continue;
            };
            let word = tail.split(':').next().unwrap_or_default().to_string();
            out.insert((object.clone(), item.to_string()), word);
        } else if !line.is_empty() {
            object = line.to_string();
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converted_routes_answer_as_the_ingresses_did_or_the_report_said_why_not() {
    let (a, b): (Echo, Echo) = (echo::start("a", 200).await, echo::start("b", 200).await);
    let slow = slow_pod().await;
    let m = Manifests::new();
    echo::write_services(&m, &[("a", &a), ("b", &b)]);
    m.write(
        "slow.yaml",
        &[service("slow"), endpoint_slices("slow", &[slow])].join("---\n"),
    );
    m.write(
        "users.yaml",
        &opaque_secret("users", &[("auth", "alice:{PLAIN}s3cret\n")]),
    );
    let (crt, key) = self_signed(&["tls.test"]);
    m.write("tls.yaml", &tls_secret("tls-cert", &crt, &key));
    let cases = cases();
    let all: Vec<&str> = cases.iter().map(|c| c.yaml.as_str()).collect();
    m.write("ingresses.yaml", &all.join("---\n"));

    // Convert the Ingresses as a user would, before anything runs.
    let (http_port, https_port) = (free_port().await, free_port().await);
    let argv = [
        "sluice".to_string(),
        "check".into(),
        "--to-gateway".into(),
        m.dir.path().display().to_string(),
        "--http-port".into(),
        http_port.to_string(),
        "--https-port".into(),
        https_port.to_string(),
    ];
    let cli = <sluice::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap();
    let sluice::cli::Command::Check(args) = cli.command else {
        panic!("not check")
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = sluice::to_gateway::run(&args, &mut out, &mut err).await;
    let report = String::from_utf8(err).unwrap();
    assert_eq!(code, 1, "some cases have no exact equivalent:\n{report}");
    let listed = parse_report(&report);
    let manifests = String::from_utf8(out).unwrap();
    m.write(
        "zz-gateway.yaml",
        &format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: sluice\nspec:\n  controllerName: sluice.dev/gateway-controller\n{manifests}"
        ),
    );

    let s = serve(m.dir.path(), &[]).await;
    let ingress = s.running.http_addr.unwrap();
    let gateway = SocketAddr::from(([127, 0, 0, 1], http_port));
    assert!(
        eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(gateway).await.is_ok()
        })
        .await,
        "the generated Gateway's http listener opens"
    );
    let problems = status_text(&s).await;
    let mut differences = Vec::new();
    for case in &cases {
        let mut case_differs = false;
        for (method, host, target, extra) in &case.requests {
            let via_ingress = facts(ingress, method, host, target, extra).await;
            let via_route = facts(gateway, method, host, target, extra).await;
            if via_ingress == via_route {
                continue;
            }
            case_differs = true;
            let why: Vec<String> = listed
                .iter()
                .filter(|((o, _), w)| {
                    o.starts_with(&format!("Ingress default/{}", case.ingress))
                        && w.as_str() != "converted"
                })
                .map(|((_, i), w)| format!("{i} {w}"))
                .collect();
            assert!(
                !case.exact && !why.is_empty(),
                "{method} {host}{target}: Ingress {via_ingress:?} vs HTTPRoute {via_route:?}, and the report listed nothing for Ingress {}\nreport:\n{report}\nmanifests:\n{manifests}\nproblems:\n{problems}",
                case.ingress
            );
            differences.push(format!(
                "{method} {host}{target}: Ingress {via_ingress:?} / HTTPRoute {via_route:?} (listed: {})",
                why.join(", ")
            ));
        }
        if !case.exact && !case_differs {
            eprintln!(
                "case {}: answered the same despite the listed approximation",
                case.ingress
            );
        }
    }
    eprintln!(
        "differences, each listed by the report:\n{}",
        differences.join("\n")
    );
    // The listed differences that must show (the test would not notice a case going wrong
    // on both sides otherwise).
    for must in ["rw.test/APP/x", "cors.test/", "auth.test/"] {
        assert!(
            differences.iter().any(|d| d.contains(must)),
            "{must} should differ: {differences:#?}"
        );
    }
    // Authentication the Gateway API cannot say closes the converted route; never opens it.
    let closed = facts(gateway, "GET", "auth.test", "/", "").await;
    assert_eq!(
        (closed.status, closed.backend.as_deref()),
        (500, None),
        "{closed:?}"
    );
    s.shutdown(Duration::from_secs(2)).await;
}

/// Input that cannot be read is an error (exit 2), never a partial conversion; a flag that
/// makes no sense is refused before anything is read.
#[tokio::test]
async fn unreadable_input_converts_nothing() {
    let m = Manifests::new();
    m.write(
        "bad.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: x}\nspec: {rules: 7}\n",
    );
    let run = |extra: &[&str]| {
        let mut argv = vec![
            "sluice".to_string(),
            "check".into(),
            "--to-gateway".into(),
            m.dir.path().display().to_string(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        let cli = <sluice::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let sluice::cli::Command::Check(args) = cli.command else {
            panic!("not check")
        };
        args
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = sluice::to_gateway::run(&run(&[]), &mut out, &mut err).await;
    assert_eq!(code, 2, "{}", String::from_utf8_lossy(&err));
    assert!(out.is_empty(), "nothing printed on stdout");
    assert!(String::from_utf8_lossy(&err).contains("bad.yaml"));
    std::fs::remove_file(m.path("bad.yaml")).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code =
        sluice::to_gateway::run(&run(&["--configmap", "no-slash"]), &mut out, &mut err).await;
    assert_eq!(code, 2);
    assert!(String::from_utf8_lossy(&err).contains("NAMESPACE/NAME"));
}
