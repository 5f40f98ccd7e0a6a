//! The ways past an authentication rule an attacker's read found, each reproduced against
//! `sluice serve` over real sockets: an `auth-url` naming `$host` answered by another host's
//! route; a Basic `auth-secret` of another namespace; the client's own `X-Forwarded-Uri`
//! reaching the auth service; an `auth-url` to a host outside the cluster, called only when
//! the operator allows it (`--auth-url-allow`). The path, client-certificate, ConfigMap and
//! default-backend holes are in `access_holes.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_tests::echo::{
    self, dated_ingress as ing, field, get as get_raw, service_of as pod_service,
};
use sluice_tests::*;

/// `alice:s3cret`, plain, as htpasswd's `{PLAIN}` scheme reads it.
const USERS: &str = "alice:{PLAIN}s3cret\n";
/// `Basic base64(alice:s3cret)`.
const ALICE: &str = "Basic YWxpY2U6czNjcmV0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_url_naming_host_is_resolved_in_the_virtual_host_of_the_protected_route() {
    let strict = echo::start("strict", 401).await;
    let permissive = echo::start("permissive", 200).await;
    let secret = echo::start("secret", 200).await;
    let wiki = echo::start("wiki", 200).await;
    let m = Manifests::new();
    echo::write_services(
        &m,
        &[
            ("strict", &strict),
            ("permissive", &permissive),
            ("secret", &secret),
            ("wiki", &wiki),
        ],
    );
    m.write(
        "ing.yaml",
        &[
            ing(
                "corp",
                "*.corp.test",
                &[("/", "Prefix", "secret")],
                &[("auth-url", "http://$host/auth")],
                "2024-01-01T00:00:00Z",
            ),
            ing(
                "corp-auth",
                "*.corp.test",
                &[("/auth", "Prefix", "strict")],
                &[],
                "2024-01-02T00:00:00Z",
            ),
            ing(
                "wiki",
                "wiki.corp.test",
                &[
                    ("/auth", "Prefix", "permissive"),
                    ("/wiki", "Prefix", "wiki"),
                ],
                &[],
                "2024-01-03T00:00:00Z",
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    // wiki.corp.test has no /admin: the request falls through to *.corp.test's protected
    // route, whose auth route is *.corp.test's strict one, never wiki's permissive one.
    let (status, body) = get_raw(http, "wiki.corp.test", "/admin/secret.txt", "").await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = get_raw(http, "hr.corp.test", "/admin/secret.txt", "").await;
    assert_eq!(status, 401);
    let (status, body) = get_raw(http, "wiki.corp.test", "/wiki/page", "").await;
    assert_eq!((status, field(&body, "name")), (200, Some("wiki")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_secret_of_another_namespace_is_refused_unless_the_operator_allows_it() {
    let pod = echo::start("pod", 200).await;
    for (allow, want) in [(false, 503), (true, 401)] {
        let m = Manifests::new();
        m.write("class.yaml", &ingress_class());
        m.write("svc.yaml", &pod_service("svc", "default", pod.addr));
        m.write(
            "users.yaml",
            &opaque_secret("users", &[("auth", USERS)])
                .replace("namespace: default", "namespace: other"),
        );
        m.write(
            "cm.yaml",
            &controller_configmap(&format!("  allow-cross-namespace-resources: \"{allow}\"\n")),
        );
        m.write(
            "ing.yaml",
            &nginx_ingress(
                "cross",
                "svc",
                &[("auth-type", "basic"), ("auth-secret", "other/users")],
            ),
        );
        let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
        let http = s.running.http_addr.unwrap();
        assert_eq!(
            get_raw(http, "cross.test", "/", "").await.0,
            want,
            "allow={allow}"
        );
        let status = status_text(&s).await;
        assert_eq!(
            status.contains("Secret other/users is in another namespace than the Ingress"),
            !allow,
            "{status}"
        );
        if allow {
            let (code, _) = get_raw(
                http,
                "cross.test",
                "/",
                &format!("Authorization: {ALICE}\r\n"),
            )
            .await;
            assert_eq!(code, 200);
        }
        s.running.shutdown(std::time::Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_service_sees_sluices_forwarded_uri_and_method_never_the_clients() {
    let auth = echo::start("auth", 200).await;
    let pod = echo::start("pod", 200).await;
    let m = Manifests::new();
    echo::write_services(&m, &[("svc", &pod), ("auth", &auth)]);
    m.write(
        "ing.yaml",
        &nginx_ingress(
            "ext",
            "svc",
            &[
                ("auth-url", "http://auth.default.svc.cluster.local/check"),
                // The auth service's answer is the echo of its request: copy what it saw.
                ("auth-response-headers", "X-Seen"),
            ],
        ),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let (status, _) = get_raw(
        http,
        "ext.test",
        "/private/doc?a=1",
        "X-Forwarded-Uri: /public\r\nX-Forwarded-Method: OPTIONS\r\n",
    )
    .await;
    assert_eq!(status, 200);
    let sub = auth.last().unwrap();
    assert_eq!(
        field(&sub, "x-forwarded-uri"),
        Some("/private/doc?a=1"),
        "{sub}"
    );
    assert_eq!(field(&sub, "x-forwarded-method"), Some("GET"), "{sub}");
    assert_eq!(field(&sub, "x-original-method"), Some("GET"), "{sub}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_url_outside_the_cluster_is_called_only_when_the_operator_allows_its_host() {
    let pod = echo::start("pod", 200).await;
    let yes = echo::start("yes", 200).await;
    let no = echo::start("no", 401).await;
    let write = |m: &Manifests| {
        m.write("class.yaml", &ingress_class());
        m.write("svc.yaml", &pod_service("svc", "default", pod.addr));
        m.write(
            "ing.yaml",
            &[
                nginx_ingress(
                    "by-ip",
                    "svc",
                    &[(
                        "auth-url",
                        &format!("http://127.0.0.1:{}/check", yes.addr.port()),
                    )],
                ),
                nginx_ingress(
                    "by-name",
                    "svc",
                    &[(
                        "auth-url",
                        &format!("http://localhost:{}/check", yes.addr.port()),
                    )],
                ),
                nginx_ingress(
                    "signin",
                    "svc",
                    &[
                        (
                            "auth-url",
                            &format!("http://127.0.0.1:{}/check", no.addr.port()),
                        ),
                        ("auth-signin", "https://login.example.com/start"),
                    ],
                ),
            ]
            .join("---\n"),
        );
    };
    // (flag, by-ip, by-name, signin)
    let cases: [(&[&str], u16, u16, u16); 4] = [
        (&[], 500, 500, 500),
        (&["--auth-url-allow", "127.0.0.0/8"], 200, 200, 302),
        (&["--auth-url-allow", "localhost"], 500, 200, 500),
        (
            &["--auth-url-allow", "10.0.0.0/8,auth.example.com"],
            500,
            500,
            500,
        ),
    ];
    for (flags, by_ip, by_name, signin) in cases {
        let m = Manifests::new();
        write(&m);
        let s = serve(m.dir.path(), flags).await;
        let http = s.running.http_addr.unwrap();
        assert_eq!(
            get_raw(http, "by-ip.test", "/", "").await.0,
            by_ip,
            "{flags:?}"
        );
        assert_eq!(
            get_raw(http, "by-name.test", "/", "").await.0,
            by_name,
            "{flags:?}"
        );
        let (status, _) = get_raw(http, "signin.test", "/p?q=1", "").await;
        assert_eq!(status, signin, "{flags:?}");
        s.running.shutdown(std::time::Duration::from_secs(1)).await;
    }
    // What the outside auth service was sent: the proxy headers and the original request.
    let sub = yes.last().unwrap();
    assert_eq!(field(&sub, "target"), Some("/check"), "{sub}");
    assert_eq!(
        field(&sub, "x-original-url"),
        Some("http://by-name.test/"),
        "{sub}"
    );
    assert!(field(&sub, "x-forwarded-for").is_some(), "{sub}");
    // The signin redirect carries the original URL.
    let m = Manifests::new();
    write(&m);
    let s = serve(m.dir.path(), &["--auth-url-allow", "127.0.0.1"]).await;
    let r = request(
        s.running.http_addr.unwrap(),
        "GET",
        "signin.test",
        "/p?q=1",
        &[],
    )
    .await;
    assert_eq!(r.status, 302);
    assert_eq!(
        r.headers["location"],
        "https://login.example.com/start?rd=http://signin.test%2Fp%3Fq%3D1"
    );
}

#[test]
fn a_bad_auth_url_allow_list_is_refused_at_start() {
    use clap::Parser;
    for bad in ["not a host!", "*.", "single"] {
        let argv = [
            "sluice",
            "serve",
            "--manifests",
            ".",
            "--auth-url-allow",
            bad,
        ];
        assert!(sluice::cli::Cli::try_parse_from(argv).is_err(), "{bad}");
    }
    let argv = [
        "sluice",
        "serve",
        "--manifests",
        ".",
        "--auth-url-allow",
        "auth.example.com,*.corp.example,192.0.2.0/24,localhost",
    ];
    assert!(sluice::cli::Cli::try_parse_from(argv).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_auth_host_is_answered_by_its_own_rules_never_by_a_host_less_one() {
    let pod = echo::start("pod", 200).await;
    let permissive = echo::start("permissive", 200).await;
    let m = Manifests::new();
    echo::write_services(&m, &[("svc", &pod), ("permissive", &permissive)]);
    let catch_all = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: catch-all\n  namespace: default\nspec:\n  ingressClassName: sluice\n  defaultBackend:\n    service:\n      name: permissive\n      port:\n        number: 80\n  rules:\n  - http:\n      paths:\n      - path: /verify\n        pathType: Exact\n        backend:\n          service:\n            name: permissive\n            port:\n              number: 80\n      - path: /auth\n        pathType: Exact\n        backend:\n          service:\n            name: permissive\n            port:\n              number: 80\n";
    m.write(
        "ing.yaml",
        &[
            // A named auth host sluice does not route, not allowed outside: no host-less rule
            // and no default backend may answer for it.
            nginx_ingress(
                "named",
                "svc",
                &[("auth-url", "https://auth.example.com/verify")],
            ),
            // `$host` on the default backend's route: it belongs to no virtual host, so the
            // host-less `/auth` must not answer either.
            ing(
                "fallback",
                "",
                &[],
                &[("auth-url", "http://$host/auth")],
                "2024-01-01T00:00:00Z",
            )
            .replace(
                "spec:\n  ingressClassName: sluice\n  rules:\n  - host: \"\"\n    http:\n      paths:\n",
                "spec:\n  ingressClassName: sluice\n  defaultBackend:\n    service:\n      name: svc\n      port:\n        number: 80\n",
            ),
            catch_all.to_string(),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let (status, body) = get_raw(http, "named.test", "/", "").await;
    assert_eq!(status, 500, "{body}");
    // A host nothing routes: the default backend (the older Ingress's, `svc`) answers, and its
    // `$host` auth finds no route of its own.
    let (status, body) = get_raw(http, "nomatch.test", "/x", "").await;
    assert_eq!(status, 500, "{body}");
    assert!(permissive.last().is_none(), "{:?}", permissive.last());
    // The host-less rules themselves still serve.
    let (status, body) = get_raw(http, "nomatch.test", "/verify", "").await;
    assert_eq!((status, field(&body, "name")), (200, Some("permissive")));
}
