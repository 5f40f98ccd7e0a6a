//! The ways past an access rule an attacker's read found, each reproduced against `sluice
//! serve` over real sockets (raw HTTP/1 heads, so that nothing in a client library tidies the
//! path first, and h2c): an encoded slash, a `;` parameter or a backslash skipping a route's
//! authentication; Basic credentials reaching the pod; a host's client-certificate rule that
//! could not be enforced leaving the host's other paths open; the controller ConfigMap's
//! source ranges ignored; an unreadable `limit-whitelist` dropping the limit; an
//! `auth-cache-duration` that overflowed the clock; the default backend serving an empty pool
//! without ingress-nginx's `X-Code`. The authentication holes are in `auth_holes.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use sluice_tests::echo::{
    self, dated_ingress as ing, field, get as get_raw, service_of as pod_service,
};
use sluice_tests::*;

/// `alice:s3cret`, plain, as htpasswd's `{PLAIN}` scheme reads it.
const USERS: &str = "alice:{PLAIN}s3cret\n";
/// `Basic base64(alice:s3cret)`.
const ALICE: &str = "Basic YWxpY2U6czNjcmV0";

struct Site {
    s: Serving,
    _m: Manifests,
}

impl Site {
    fn http(&self) -> SocketAddr {
        self.s.running.http_addr.unwrap()
    }
}

/// `app.test`: `/admin` behind Basic auth (Service `admin`), `/` open (Service `public`).
async fn admin_site() -> Site {
    let admin = echo::start("admin", 200).await;
    let public = echo::start("public", 200).await;
    let m = Manifests::new();
    echo::write_services(&m, &[("admin", &admin), ("public", &public)]);
    m.write("users.yaml", &opaque_secret("users", &[("auth", USERS)]));
    m.write(
        "ing.yaml",
        &[
            ing(
                "admin",
                "app.test",
                &[("/admin", "Prefix", "admin")],
                &[("auth-type", "basic"), ("auth-secret", "users")],
                "2024-01-01T00:00:00Z",
            ),
            ing(
                "public",
                "app.test",
                &[("/", "Prefix", "public")],
                &[],
                "2024-01-02T00:00:00Z",
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    Site { s, _m: m }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_slash_a_parameter_or_a_backslash_never_skips_a_routes_auth() {
    let site = admin_site().await;
    let http = site.http();
    assert_eq!(
        get_raw(http, "app.test", "/admin/secret.txt", "").await.0,
        401
    );
    for target in [
        "/admin%2Fsecret.txt",
        "/admin%2fsecret.txt",
        "/admin%5Csecret.txt",
        "/admin;x=1/secret.txt",
        "/admin;/secret.txt",
        "/ADMIN/../admin%2Fsecret.txt",
        "//admin%2fsecret.txt",
    ] {
        // Read with its separators and parameters, the path is `/admin`'s; read literally, as a
        // backend that decodes nothing reads it, it is `/`'s: the route must not depend on the
        // reading, so it is refused — and it never reaches the open route.
        let (status, body) = get_raw(http, "app.test", target, "").await;
        assert_eq!(status, 400, "{target} must be refused: {body}");
    }
    // Where both readings are the same route, the route's rule applies.
    for target in [
        "/admin/x%2Fsecret.txt",
        "/admin/x;v=1/secret.txt",
        "/admin/a%5Cb",
    ] {
        let (status, body) = get_raw(http, "app.test", target, "").await;
        assert_eq!(status, 401, "{target} must ask for credentials: {body}");
    }
    // Decoded, these climb out of the segment the route saw: refused outright.
    for target in [
        "/public/..%2Fadmin/secret.txt",
        "/public/..%2fadmin/secret.txt",
        "/public%2F..%2Fadmin/secret.txt",
        "/public/..;/admin/secret.txt",
        "/public/..%5Cadmin/secret.txt",
        "/public%2F%2Fadmin",
        // A parameter hiding separators, and escapes that a bad `%` would glue together.
        "/public;%2F..%2Fadmin/secret.txt",
        "/public;x%5C..%5Cadmin/secret.txt",
        "/admin%2%66secret.txt",
        "/public/..%2%66admin/secret.txt",
        "/admin%%35%63secret.txt",
    ] {
        let (status, body) = get_raw(http, "app.test", target, "").await;
        assert_eq!(status, 400, "{target}: {body}");
    }
    // A bare backslash: http's parser may refuse it, but it never reaches the open route.
    let (status, body) = get_raw(http, "app.test", "/admin\\secret.txt", "").await;
    assert!(matches!(status, 400 | 401), "{status}: {body}");
    // With credentials the pod gets the path as the client encoded it, and no password.
    let (status, body) = get_raw(
        http,
        "app.test",
        "/admin/x%2Fsecret.txt?x=1",
        &format!("Authorization: {ALICE}\r\n"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(field(&body, "name"), Some("admin"));
    assert_eq!(field(&body, "target"), Some("/admin/x%2Fsecret.txt?x=1"));
    assert_eq!(
        field(&body, "authorization"),
        None,
        "ingress-nginx clears Authorization behind Basic auth"
    );
    // Open paths with encoded slashes still work, and keep them.
    let (status, body) = get_raw(http, "app.test", "/api/group%2Fproject", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(field(&body, "target"), Some("/api/group%2Fproject"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_h2c_an_encoded_slash_is_routed_as_a_slash_too() {
    use http_body_util::{BodyExt, Empty};
    let site = admin_site().await;
    let mut send = echo::h2c(site.http()).await;
    for (target, auth, want) in [
        ("/admin/secret.txt", None, 401),
        ("/admin%2Fsecret.txt", None, 400),
        ("/admin;x/secret.txt", None, 400),
        ("/admin/x%2Fsecret.txt", None, 401),
        ("/public/..%2Fadmin/secret.txt", None, 400),
        ("/public/x", None, 200),
        ("/admin/x%2Fsecret.txt", Some(ALICE), 200),
    ] {
        // Routed on `:authority`, as every HTTP/2 request is.
        let mut req = http::Request::get(format!("http://app.test{target}"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = send
            .send_request(req.body(Empty::<bytes::Bytes>::new()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, want, "{target}: {body}");
        if auth.is_some() {
            assert_eq!(field(&body, "name"), Some("admin"));
            assert_eq!(field(&body, "authorization"), None, "{body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_client_certificate_rule_cannot_be_enforced_closes_every_path() {
    let pod = echo::start("pod", 200).await;
    let m = Manifests::new();
    echo::write_services(&m, &[("svc", &pod)]);
    m.write(
        "ing.yaml",
        &[
            ing(
                "mtls-a",
                "mtls.test",
                &[("/", "Prefix", "svc")],
                &[("auth-tls-secret", "default/missing-ca")],
                "2024-01-01T00:00:00Z",
            ),
            ing(
                "mtls-b",
                "mtls.test",
                &[("/api", "Prefix", "svc")],
                &[],
                "2024-01-02T00:00:00Z",
            ),
            ing(
                "other",
                "other.test",
                &[("/", "Prefix", "svc")],
                &[],
                "2024-01-03T00:00:00Z",
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    assert_eq!(get_raw(http, "mtls.test", "/", "").await.0, 503);
    assert_eq!(get_raw(http, "mtls.test", "/api/x", "").await.0, 503);
    assert_eq!(get_raw(http, "other.test", "/", "").await.0, 200);
    let status = status_text(&s).await;
    assert!(
        status.contains("Ingress default/mtls-b: metadata.annotations: host mtls.test: the client-certificate rule of Ingress default/mtls-a, which covers the whole host, cannot be enforced"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configmaps_source_ranges_and_block_cidrs_are_enforced() {
    let pod = echo::start("pod", 200).await;
    let rows = |cm: &str| {
        let m = Manifests::new();
        m.write("class.yaml", &ingress_class());
        m.write("svc.yaml", &pod_service("svc", "default", pod.addr));
        m.write("cm.yaml", &controller_configmap(cm));
        m.write(
            "ing.yaml",
            &[
                ing(
                    "plain",
                    "plain.test",
                    &[("/", "Prefix", "svc")],
                    &[],
                    "2024-01-01T00:00:00Z",
                ),
                ing(
                    "own",
                    "own.test",
                    &[("/", "Prefix", "svc")],
                    &[("whitelist-source-range", "127.0.0.0/8")],
                    "2024-01-02T00:00:00Z",
                ),
            ]
            .join("---\n"),
        );
        m
    };
    let cases: [(&str, u16, u16); 5] = [
        // (ConfigMap data, plain.test, own.test)
        ("  whitelist-source-range: 10.0.0.0/8\n", 403, 200),
        ("  denylist-source-range: 127.0.0.1/32\n", 403, 403),
        ("  block-cidrs: 127.0.0.0/8\n", 403, 403),
        ("  whitelist-source-range: 10.0.0.0/8,bogus\n", 403, 403),
        ("  block-cidrs: 10.0.0.0/8\n", 200, 200),
    ];
    for (cm, plain, own) in cases {
        let m = rows(cm);
        let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
        let http = s.running.http_addr.unwrap();
        assert_eq!(get_raw(http, "plain.test", "/", "").await.0, plain, "{cm}");
        assert_eq!(get_raw(http, "own.test", "/", "").await.0, own, "{cm}");
        // The direct path (keep-alive, body-less) decides the same.
        let r = get(&client(), http, "plain.test", "/").await.unwrap();
        assert_eq!(r.status.as_u16(), plain, "{cm} (keep-alive)");
        let status = status_text(&s).await;
        assert!(
            !status.contains("sluice does not know this key"),
            "{cm}: {status}"
        );
        if cm.contains("bogus") {
            assert!(
                status.contains("data[whitelist-source-range]")
                    && status.contains("every client is refused"),
                "{status}"
            );
        }
        s.running.shutdown(std::time::Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limit_and_cache_annotations_close_their_routes_and_are_reported() {
    let pod = echo::start("pod", 200).await;
    let auth = echo::start("auth", 200).await;
    let m = Manifests::new();
    echo::write_services(&m, &[("svc", &pod), ("auth", &auth)]);
    m.write(
        "cm.yaml",
        &controller_configmap("  global-auth-cache-duration: \"200 18446744073709551615s\"\n"),
    );
    m.write(
        "ing.yaml",
        &[
            nginx_ingress(
                "limited",
                "svc",
                &[("limit-rps", "1"), ("limit-whitelist", "10.0.0.0/8,bogus")],
            ),
            nginx_ingress(
                "cached",
                "svc",
                &[
                    ("auth-url", "http://auth.default.svc.cluster.local/check"),
                    ("auth-cache-key", "$remote_addr"),
                    ("auth-cache-duration", "200 18446744073709551615s"),
                ],
            ),
            nginx_ingress("fine", "svc", &[]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
    let http = s.running.http_addr.unwrap();
    for _ in 0..3 {
        assert_eq!(get_raw(http, "limited.test", "/", "").await.0, 503);
        assert_eq!(get_raw(http, "cached.test", "/", "").await.0, 503);
    }
    assert_eq!(get_raw(http, "fine.test", "/", "").await.0, 200);
    let status = status_text(&s).await;
    assert!(status.contains("limit-whitelist"), "{status}");
    assert!(status.contains("longer than a year"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_backend_serving_an_empty_pool_gets_the_error_fields() {
    let fallback = echo::start("fallback", 200).await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[
            service("empty"),
            pod_service("errors", "default", fallback.addr),
        ]
        .join("---\n"),
    );
    m.write(
        "ing.yaml",
        &nginx_ingress("app", "empty", &[("default-backend", "errors")]),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let (status, body) = get_raw(
        http,
        "app.test",
        "/some/page?q=1",
        "Accept: application/json\r\nX-Code: 200\r\n",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(field(&body, "name"), Some("fallback"));
    assert_eq!(field(&body, "x-code"), Some("503"), "{body}");
    assert_eq!(field(&body, "x-format"), Some("application/json"));
    assert_eq!(field(&body, "x-original-uri"), Some("/some/page?q=1"));
    assert_eq!(field(&body, "x-namespace"), Some("default"));
    assert_eq!(field(&body, "x-ingress-name"), Some("app"));
    assert_eq!(field(&body, "x-service-name"), Some("empty"));
    assert_eq!(field(&body, "x-service-port"), Some("80"));
}
