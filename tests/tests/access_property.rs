//! A test that hunts for the next way past an access rule. It generates Ingresses with access
//! rules (Basic auth, a source range no loopback client is in) over exact, wildcard and
//! host-less hosts, Prefix and Exact paths, each route to a pod of its own that echoes what it
//! received; then it generates requests — percent-encoded bytes and separators, dot segments,
//! `;` parameters, backslashes, case, doubled slashes, HTTP/1 with `Host`, HTTP/1 in absolute
//! form with a decoy `Host`, HTTP/2 with `:authority` — and sends them through `sluice serve`.
//!
//! Routes share their Services (as `/admin` behind auth and `/` open so often share one), so
//! the property is judged by the path the pod received, as three kinds of backend read it (one
//! that decodes every escape, a servlet container that drops `;` parameters first, one that
//! takes `\` for `/`): matched by a deliberately naive reference of Ingress v1 matching, the
//! route that path belongs to, when it is a route of the pod that answered, must have had its
//! rules passed. A request sluice answers from a pod never reaches protected content of that
//! pod without passing the rules that protect it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice_tests::echo::{self, field};
use sluice_tests::*;

const N: &str = "nginx.ingress.kubernetes.io/";
const ALICE: &str = "Basic YWxpY2U6czNjcmV0";

/// What a route asks of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Open,
    /// Basic auth: the request's credentials pass it.
    Basic,
    /// `whitelist-source-range: 10.0.0.0/8`: no loopback client passes.
    Ranges,
}

#[derive(Debug, Clone)]
struct RouteSpec {
    /// `a.test`, `*.w.test`, `b.w.test`, or "" (any host).
    host: &'static str,
    path: &'static str,
    exact: bool,
    rule: Rule,
    /// The Service (and pod) the route sends to: `s0` or `s1`.
    service: &'static str,
}

const HOSTS: [&str; 4] = ["a.test", "*.w.test", "b.w.test", ""];
const PATHS: [&str; 8] = [
    "/",
    "/admin",
    "/admin/panel",
    "/api",
    "/public",
    "/x/admin",
    "/Admin",
    "/pub",
];

/// The routes of one generated world: for every host, a few distinct (path, kind) pairs.
fn world(seed: u64) -> Vec<RouteSpec> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    for host in HOSTS {
        let mut taken = std::collections::BTreeSet::new();
        for _ in 0..rng.usize(2..6) {
            let path = PATHS[rng.usize(..PATHS.len())];
            let exact = rng.u8(..4) == 0;
            if !taken.insert((path, exact)) {
                continue;
            }
            let rule = match rng.u8(..3) {
                0 => Rule::Open,
                1 => Rule::Basic,
                _ => Rule::Ranges,
            };
            out.push(RouteSpec {
                host,
                path,
                exact,
                rule,
                service: ["s0", "s1"][rng.usize(..2)],
            });
        }
    }
    out
}

/// Whether a rule host serves a request host (lower case, no port).
fn host_level(rule: &str, host: &str) -> Option<u8> {
    if rule.is_empty() {
        return Some(2);
    }
    if let Some(suffix) = rule.strip_prefix('*') {
        let label_end = host.find('.')?;
        return (label_end > 0 && &host[label_end..] == suffix).then_some(1);
    }
    (rule == host).then_some(0)
}

/// The route Ingress v1 gives `path` on `host`, as sluice documents it: the exact host's
/// routes, then the wildcard's, then the host-less ones; the longest match wins, Exact before
/// Prefix; Prefix matches whole path elements. A deliberately naive scan.
fn reference(routes: &[RouteSpec], host: &str, path: &str) -> Option<usize> {
    for level in 0..3 {
        let best = routes
            .iter()
            .enumerate()
            .filter(|(_, r)| host_level(r.host, host) == Some(level))
            .filter(|(_, r)| {
                if r.exact {
                    path == r.path
                } else {
                    r.path == "/" || path == r.path || path.starts_with(&format!("{}/", r.path))
                }
            })
            .max_by_key(|(_, r)| (r.path.len(), r.exact));
        if let Some((i, _)) = best {
            return Some(i);
        }
    }
    None
}

/// Percent-decodes every well-formed escape.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Merges slashes and resolves dot segments, clamping at the root (as most servers do).
fn resolve(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let trailing = path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..");
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut s = format!("/{}", out.join("/"));
    if trailing && s != "/" {
        s.push('/');
    }
    s
}

/// The paths three kinds of backend serve for a request target they received.
fn backend_views(target: &str) -> [String; 3] {
    let path = target.split('?').next().unwrap_or(target);
    let decoding = resolve(&decode(path));
    let servlet = resolve(&decode(
        &path
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("/"),
    ));
    let backslash = resolve(&decode(path).replace('\\', "/"));
    [decoding, servlet, backslash]
}

#[derive(Debug, Clone)]
enum Form {
    /// HTTP/1.1 with `Host`.
    Host,
    /// HTTP/1.1 in absolute form, with another host in `Host`.
    Absolute,
    /// HTTP/2 (h2c, prior knowledge) with `:authority`.
    H2,
}

#[derive(Debug, Clone)]
struct Req {
    host: &'static str,
    target: String,
    form: Form,
    credentials: bool,
}

/// A segment: mostly the names routes use (so that requests reach pods), often wrapped in
/// what an attacker wraps them in, sometimes a bare dot segment or escape.
fn segment() -> impl Strategy<Value = String> {
    let name = prop::sample::select(vec![
        "admin", "Admin", "ADMIN", "api", "public", "pub", "panel", "x", "%61dmin", "adm%69n",
    ]);
    let glue = prop::sample::select(vec![
        "",
        "",
        "",
        ";",
        ";p=1",
        "%2F",
        "%2f",
        "%5C",
        "\\",
        "%252F",
        "%3B",
        "%20",
        "~",
        "%",
        "%2%66",
        "%%35%63",
        ";%2F",
        ";\\",
        ";x%2F..%2F",
    ]);
    let lone = prop::sample::select(vec!["", ".", "..", "%2e", "%2E%2e", ".%2e", "%2F", ";"]);
    prop_oneof![
        6 => name.clone().prop_map(str::to_string),
        4 => (name.clone(), glue, name).prop_map(|(a, g, b)| {
            if g.is_empty() { a.to_string() } else { format!("{a}{g}{b}") }
        }),
        2 => lone.prop_map(str::to_string),
    ]
}

fn arb_request() -> impl Strategy<Value = Req> {
    (
        prop::sample::select(vec![
            "a.test",
            "A.TEST",
            "a.test:80",
            "b.w.test",
            "c.w.test",
            "B.W.Test",
            "w.test",
            "other.test",
        ]),
        prop::collection::vec(segment(), 0..5),
        any::<bool>(),
        prop::sample::select(vec![Form::Host, Form::Absolute, Form::H2]),
        any::<bool>(),
    )
        .prop_map(|(host, segments, trailing, form, credentials)| {
            let mut target = format!("/{}", segments.join("/"));
            if trailing && !target.ends_with('/') {
                target.push('/');
            }
            Req {
                host,
                target,
                form,
                credentials,
            }
        })
}

/// What sluice answered: the status, and when a pod answered, its name and what it got.
struct Outcome {
    status: u16,
    pod: Option<(String, String)>,
}

async fn send(addr: SocketAddr, r: &Req) -> Option<Outcome> {
    let auth = if r.credentials {
        format!("Authorization: {ALICE}\r\n")
    } else {
        String::new()
    };
    let (status, body) = match r.form {
        Form::Host => {
            let head = format!(
                "GET {} HTTP/1.1\r\nHost: {}\r\n{auth}Connection: close\r\n\r\n",
                r.target, r.host
            );
            echo::raw(addr, &head).await
        }
        Form::Absolute => {
            let head = format!(
                "GET http://{}{} HTTP/1.1\r\nHost: decoy.test\r\n{auth}Connection: close\r\n\r\n",
                r.host, r.target
            );
            echo::raw(addr, &head).await
        }
        Form::H2 => {
            use http_body_util::{BodyExt, Empty};
            // A target http's URI parser refuses is never sent over HTTP/2.
            let uri: http::Uri = format!("http://{}{}", r.host, r.target).parse().ok()?;
            let mut tx = echo::h2c(addr).await;
            let mut req = http::Request::get(uri);
            if r.credentials {
                req = req.header("authorization", ALICE);
            }
            let resp = tx
                .send_request(req.body(Empty::<bytes::Bytes>::new()).unwrap())
                .await
                .ok()?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let pod = field(&body, "name")
        .zip(field(&body, "target"))
        .map(|(n, t)| (n.to_string(), t.to_string()));
    Some(Outcome { status, pod })
}

/// Whether a request with or without credentials passes a rule.
fn passes(rule: Rule, credentials: bool) -> bool {
    match rule {
        Rule::Open => true,
        Rule::Basic => credentials,
        Rule::Ranges => false,
    }
}

fn check(routes: &[RouteSpec], r: &Req, o: &Outcome) -> Result<(), TestCaseError> {
    let Some((pod, target)) = &o.pod else {
        return Ok(());
    };
    prop_assert!(o.status < 300, "a pod answered {}", o.status);
    let host = r.host.split(':').next().unwrap_or("").to_ascii_lowercase();
    for view in backend_views(target) {
        if let Some(j) = reference(routes, &host, &view)
            && routes[j].service == pod
        {
            let owner = &routes[j];
            prop_assert!(
                passes(owner.rule, r.credentials),
                "{r:?}: pod {pod} got {target}, which a backend reads as {view}, the path of {owner:?}, whose rule was not passed"
            );
        }
    }
    Ok(())
}

/// The manifests of a generated world: a pod, a Service and an Ingress per route.
async fn serve_world(routes: &[RouteSpec]) -> (Serving, Manifests, Vec<echo::Echo>) {
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "users.yaml",
        &opaque_secret("users", &[("auth", "alice:{PLAIN}s3cret\n")]),
    );
    let mut pods = Vec::new();
    let mut docs = Vec::new();
    for svc in ["s0", "s1"] {
        let pod = echo::start(svc, 200).await;
        docs.push(service(svc));
        docs.push(endpoint_slices(svc, &[pod.addr]));
        pods.push(pod);
    }
    for (i, r) in routes.iter().enumerate() {
        let name = format!("r{i}");
        let ann: BTreeMap<String, String> = match r.rule {
            Rule::Open => BTreeMap::new(),
            Rule::Basic => [
                (format!("{N}auth-type"), "basic".to_string()),
                (format!("{N}auth-secret"), "users".to_string()),
            ]
            .into(),
            Rule::Ranges => [(
                format!("{N}whitelist-source-range"),
                "10.0.0.0/8".to_string(),
            )]
            .into(),
        };
        let ann: Vec<(&str, &str)> = ann.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let kind = if r.exact { "Exact" } else { "Prefix" };
        let yaml = annotated_ingress(&name, r.host, &[(r.path, kind, r.service)], &ann);
        // A host-less rule: no `host` key at all.
        docs.push(yaml.replace("  - host: \"\"\n    http:", "  - http:"));
    }
    m.write("world.yaml", &docs.join("---\n"));
    let s = serve(m.dir.path(), &[]).await;
    (s, m, pods)
}

#[test]
fn no_request_reaches_a_protected_route_without_passing_its_rules() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for seed in [7, 11, 42] {
        let routes = world(seed);
        let (s, _m, _pods) = rt.block_on(serve_world(&routes));
        let addr = s.running.http_addr.unwrap();
        let mut runner = TestRunner::new(Config {
            cases: 600,
            failure_persistence: None,
            ..Config::default()
        });
        let served = std::cell::Cell::new(0u32);
        let result = runner.run(&arb_request(), |r| {
            let Some(o) = rt.block_on(send(addr, &r)) else {
                return Ok(());
            };
            served.set(served.get() + u32::from(o.pod.is_some()));
            check(&routes, &r, &o)
        });
        if let Err(e) = result {
            panic!("seed {seed}, routes {routes:#?}: {e}");
        }
        // The generator must reach pods, or the property says nothing.
        let served = served.get();
        eprintln!("seed {seed}: {served} of 600 generated requests reached a pod");
        assert!(
            served > 30,
            "seed {seed}: only {served} requests reached a pod"
        );
        rt.block_on(s.running.shutdown(std::time::Duration::from_secs(1)));
    }
}

#[test]
fn the_reference_and_the_backend_models_agree_with_the_examples() {
    let routes = vec![
        RouteSpec {
            host: "a.test",
            path: "/admin",
            exact: false,
            rule: Rule::Basic,
            service: "s0",
        },
        RouteSpec {
            host: "a.test",
            path: "/",
            exact: false,
            rule: Rule::Open,
            service: "s0",
        },
    ];
    assert_eq!(reference(&routes, "a.test", "/admin/x"), Some(0));
    assert_eq!(reference(&routes, "a.test", "/adminx"), Some(1));
    assert_eq!(reference(&routes, "b.test", "/admin"), None);
    assert_eq!(
        backend_views("/admin%2Fsecret;x/..%2F.?q"),
        ["/admin/", "/admin/", "/admin/"].map(String::from)
    );
    assert_eq!(backend_views("/a\\b")[2], "/a/b");
}
