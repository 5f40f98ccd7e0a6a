//! Authentication annotations through `sluice serve` over real sockets: `auth-type: basic`
//! (every htpasswd scheme, `auth-map`, a Secret changed without a restart, a missing Secret
//! failing closed), `auth-url` against a real external auth service answering 200, 401, 403,
//! 502 and too late, `auth-signin`, `auth-response-headers` (a client's forged copy removed),
//! `satisfy`, and an auth service whose pod is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sluice_tests::*;

const N: &str = "nginx.ingress.kubernetes.io/";

/// `s3cret` in every scheme `htpasswd` writes (and nginx reads), for one user each.
const HTPASSWD: &str = "\
# one user per scheme, all with the password s3cret
apr:$apr1$Kx9sQ2aZ$VILXK2vA.T/e/KqPV2DQI.
md5:$1$ab12$uS0uGTebbG2iGzL0r4Xeb0
sha256:$5$saltsalt$i1q2ZQzc.tl/BQ6CHiENAcVDvEY6nJ1OWlWXKh94b1.
des:abhWCwoTZY2c6
sha:{SHA}/vNB+F2HQ559kaLUZbmHHvZrXpg=
ssha:{SSHA}rSC6FONm6jhcU0alALdYRKUMvgBOYUNsMTIzNA==
plain:{PLAIN}s3cret
bcrypt:$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW
";

/// An htdigest line: `user:realm:` and the hex MD5 of `user:realm:password`.
fn htdigest(user: &str, realm: &str, pass: &str) -> String {
    use md5::Digest;
    let ha1: String = md5::Md5::digest(format!("{user}:{realm}:{pass}"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{user}:{realm}:{ha1}\n")
}

/// Runs curl (a client sluice did not write) against `url` through `addr`; its status code, or
/// `None` when curl is not installed.
fn curl(addr: SocketAddr, host: &str, args: &[&str]) -> Option<u16> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--connect-to", &format!("{host}:80:{addr}")])
        .args(args)
        .arg(format!("http://{host}/echo?x=1"))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// `htpasswd -nb` with `flag` (the Apache tool users have), or `None` when not installed.
fn htpasswd(flag: &str, user: &str, pass: &str) -> Option<String> {
    let out = std::process::Command::new("htpasswd")
        .args(["-nb", flag, user, pass])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn basic(user: &str, pass: &str) -> String {
    use std::fmt::Write;
    // Base64 by hand: the test must not trust the code under test to encode.
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = format!("{user}:{pass}");
    let mut out = String::from("Basic ");
    for chunk in raw.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let _ = write!(out, "{}", T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn send(addr: SocketAddr, host: &str, path: &str, headers: &[(&str, &str)]) -> Got {
    request(addr, "GET", host, path, headers).await
}

/// What the auth service saw of each subrequest: method, path, and the fields it checks.
type Seen = Arc<Mutex<Vec<String>>>;

/// A real external auth service on loopback, deciding by the `Authorization` it is sent.
async fn auth_service() -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let log = Arc::clone(&log);
                    async move {
                        let h = req.headers();
                        let field = |n: &str| {
                            h.get(n)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-")
                                .to_string()
                        };
                        log.lock().unwrap().push(format!(
                            "{} {} host={} url={} method={} redirect={} user={}",
                            req.method(),
                            req.uri(),
                            field("host"),
                            field("x-original-url"),
                            field("x-original-method"),
                            field("x-auth-request-redirect"),
                            field("x-auth-request-user"),
                        ));
                        let auth = field("authorization");
                        let mut r = Response::new(Full::new(Bytes::from_static(b"auth says")));
                        match auth.as_str() {
                            "Bearer good" => {
                                r.headers_mut()
                                    .insert("x-auth-request-user", "alice".parse().unwrap());
                                r.headers_mut()
                                    .insert("set-cookie", "session=fresh".parse().unwrap());
                            }
                            "Bearer plain-ok" => {}
                            "Bearer nobody" => *r.status_mut() = StatusCode::UNAUTHORIZED,
                            "Bearer forbidden" => *r.status_mut() = StatusCode::FORBIDDEN,
                            "Bearer broken" => *r.status_mut() = StatusCode::BAD_GATEWAY,
                            "Bearer slow" => tokio::time::sleep(Duration::from_secs(4)).await,
                            // The auth pod dies mid-request: the connection drops, no answer.
                            "Bearer crash" => return Err(std::io::Error::other("crash")),
                            _ => {
                                *r.status_mut() = StatusCode::UNAUTHORIZED;
                                r.headers_mut().insert(
                                    "www-authenticate",
                                    "Bearer realm=\"test\"".parse().unwrap(),
                                );
                                r.headers_mut()
                                    .insert("set-cookie", "csrf=1".parse().unwrap());
                            }
                        }
                        Ok::<_, std::io::Error>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn in_namespace(yaml: &str, ns: &str) -> String {
    yaml.replace("namespace: default", &format!("namespace: {ns}"))
}

struct Setup {
    s: Serving,
    m: Manifests,
    seen: Seen,
    _app: sluice_bench::backend::Backend,
}

async fn setup() -> Setup {
    let app = backend("app").await;
    let (auth, seen) = auth_service().await;
    // A port nothing listens on: the "gone" auth Service's only endpoint.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[
            service("svc"),
            in_namespace(&service("oauth"), "auth"),
            in_namespace(&service("gone"), "auth"),
        ]
        .join("---\n"),
    );
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("svc", &[app.addr]),
            in_namespace(&endpoint_slices("oauth", &[auth]), "auth"),
            in_namespace(&endpoint_slices("gone", &[gone]), "auth"),
        ]
        .join("---\n"),
    );
    m.write(
        "secrets.yaml",
        &[
            opaque_secret("users", &[("auth", HTPASSWD)]),
            opaque_secret(
                "map",
                &[("carol", "{PLAIN}map-pass"), ("dave", "not a hash")],
            ),
            opaque_secret(
                "digest-users",
                &[("auth", &htdigest("alice", "staff", "s3cret"))],
            ),
        ]
        .join("---\n"),
    );
    let ext = "http://oauth.auth.svc.cluster.local/check?from=sluice";
    let rows = [
        nginx_ingress(
            "basic",
            "svc",
            &[
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("auth-realm", "staff only"),
            ],
        ),
        nginx_ingress(
            "map",
            "svc",
            &[
                ("auth-type", "basic"),
                ("auth-secret", "default/map"),
                ("auth-secret-type", "auth-map"),
            ],
        ),
        // Closed: its default backend must not serve in its place either.
        nginx_ingress(
            "missing",
            "svc",
            &[
                ("auth-type", "basic"),
                ("auth-secret", "nope"),
                ("default-backend", "svc"),
            ],
        ),
        nginx_ingress(
            "any-ext",
            "svc",
            &[
                ("whitelist-source-range", "127.0.0.0/8"),
                (
                    "auth-url",
                    "http://oauth.auth.svc.cluster.local/check?from=sluice",
                ),
                ("auth-response-headers", "X-Auth-Request-User"),
                ("satisfy", "any"),
            ],
        ),
        nginx_ingress(
            "digest",
            "svc",
            &[
                ("auth-type", "digest"),
                ("auth-secret", "digest-users"),
                ("auth-realm", "staff"),
            ],
        ),
        nginx_ingress(
            "digest-map",
            "svc",
            &[
                ("auth-type", "digest"),
                ("auth-secret", "map"),
                ("auth-secret-type", "auth-map"),
            ],
        ),
        nginx_ingress(
            "ext",
            "svc",
            &[
                ("auth-url", ext),
                ("auth-response-headers", "X-Auth-Request-User"),
                ("proxy-read-timeout", "1"),
            ],
        ),
        nginx_ingress(
            "signin",
            "svc",
            &[
                ("auth-url", ext),
                ("auth-signin", "https://login.test/start"),
                ("auth-method", "POST"),
                ("auth-always-set-cookie", "true"),
            ],
        ),
        nginx_ingress(
            "gone",
            "svc",
            &[("auth-url", "http://gone.auth.svc:80/check")],
        ),
        nginx_ingress(
            "param",
            "svc",
            &[
                ("auth-url", ext),
                ("auth-signin", "https://login.test/start?x=1"),
                ("auth-signin-redirect-param", "next"),
                ("auth-request-redirect", "https://app.test/back"),
            ],
        ),
        nginx_ingress(
            "always",
            "svc",
            &[("auth-url", ext), ("auth-always-set-cookie", "true")],
        ),
        nginx_ingress(
            "snippet",
            "svc",
            &[("auth-url", ext), ("auth-snippet", "proxy_set_header X 1;")],
        ),
        nginx_ingress(
            "cached",
            "svc",
            &[
                ("auth-url", ext),
                ("auth-cache-key", "$http_authorization"),
                ("auth-cache-duration", "200 401 1m"),
            ],
        ),
        nginx_ingress(
            "any-outside",
            "svc",
            &[
                ("whitelist-source-range", "10.0.0.0/8"),
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("satisfy", "any"),
            ],
        ),
        nginx_ingress(
            "any-inside",
            "svc",
            &[
                ("whitelist-source-range", "127.0.0.0/8"),
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("satisfy", "any"),
            ],
        ),
        nginx_ingress(
            "all-outside",
            "svc",
            &[
                ("whitelist-source-range", "10.0.0.0/8"),
                ("auth-type", "basic"),
                ("auth-secret", "users"),
            ],
        ),
    ];
    m.write("ing.yaml", &rows.join("---\n"));
    let s = serve(m.dir.path(), &[]).await;
    Setup {
        s,
        m,
        seen,
        _app: app,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_checks_every_htpasswd_scheme_and_fails_closed() {
    let Setup { s, m, _app: _a, .. } = setup().await;
    let http = s.running.http_addr.unwrap();
    let r = send(http, "basic.test", "/", &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.headers["www-authenticate"], "Basic realm=\"staff only\"");
    assert_eq!(r.backend(), None, "nothing reached the app");
    for user in ["apr", "md5", "sha256", "des", "sha", "ssha", "plain"] {
        let ok = basic(user, "s3cret");
        let r = send(http, "basic.test", "/", &[("authorization", ok.as_str())]).await;
        assert_eq!(r.status, 200, "{user}");
        assert_eq!(r.backend(), Some("app"));
        let bad = basic(user, "s3creT");
        let r = send(http, "basic.test", "/", &[("authorization", bad.as_str())]).await;
        assert_eq!(r.status, 401, "{user} with a wrong password");
    }
    let bcrypt = basic("bcrypt", "U*U");
    for _ in 0..3 {
        let r = send(
            http,
            "basic.test",
            "/",
            &[("authorization", bcrypt.as_str())],
        )
        .await;
        assert_eq!(r.status, 200, "bcrypt (then remembered)");
    }
    for bad in [
        basic("nobody", "s3cret"),
        basic("plain", ""),
        "Basic !!!".to_string(),
        "Bearer s3cret".to_string(),
    ] {
        let r = send(http, "basic.test", "/", &[("authorization", bad.as_str())]).await;
        assert_eq!(r.status, 401, "{bad}");
    }
    // auth-map: one user per key; the unreadable entry is reported, not fatal.
    let carol = basic("carol", "map-pass");
    assert_eq!(
        send(http, "map.test", "/", &[("authorization", carol.as_str())])
            .await
            .status,
        200
    );
    let r = send(http, "map.test", "/", &[]).await;
    assert_eq!(
        r.headers["www-authenticate"],
        "Basic realm=\"Authentication Required\""
    );
    // A missing Secret, and digest, keep the route closed.
    let plain = basic("plain", "s3cret");
    for host in ["missing.test", "digest-map.test"] {
        let r = send(http, host, "/", &[("authorization", plain.as_str())]).await;
        assert_eq!(r.status, 503, "{host}");
    }
    let problems = status_text(&s).await;
    assert!(
        problems.contains("Secret default/nope not found"),
        "{problems}"
    );
    assert!(
        problems.contains("dave"),
        "the bad map entry is named: {problems}"
    );
    assert!(
        problems.contains("digest reads an htdigest file"),
        "{problems}"
    );
    // The Secret changes: the new password works and the old one stops, without a restart.
    m.write(
        "secrets.yaml",
        &opaque_secret("users", &[("auth", "plain:{PLAIN}rotated\n")]),
    );
    let rotated = basic("plain", "rotated");
    let ok = eventually(Duration::from_secs(10), || async {
        send(
            http,
            "basic.test",
            "/",
            &[("authorization", rotated.as_str())],
        )
        .await
        .status
            == 200
    })
    .await;
    assert!(ok, "the rotated password was never accepted");
    let r = send(
        http,
        "basic.test",
        "/",
        &[("authorization", plain.as_str())],
    )
    .await;
    assert_eq!(r.status, 401, "the old password is remembered no longer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_auth_answers_as_the_auth_service_decides() {
    let Setup {
        s, seen, _app: _a, ..
    } = setup().await;
    let http = s.running.http_addr.unwrap();
    // 2xx: through, with the auth service's header (a client's forged one removed) and cookie.
    let r = send(
        http,
        "ext.test",
        "/echo?q=1",
        &[
            ("authorization", "Bearer good"),
            ("x-auth-request-user", "mallory"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let body = r.text();
    assert!(body.contains("x-auth-request-user=alice\n"), "{body}");
    assert!(!body.contains("mallory"), "{body}");
    assert_eq!(r.headers["set-cookie"], "session=fresh");
    let sub = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        sub,
        "GET /check?from=sluice host=oauth.auth.svc.cluster.local url=http://ext.test/echo?q=1 method=GET redirect=/echo?q=1 user=mallory",
        "the subrequest carries the original request's fields"
    );
    // 401: answered with the auth service's challenge; nothing reaches the app.
    let r = send(http, "ext.test", "/", &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.headers["www-authenticate"], "Bearer realm=\"test\"");
    assert_eq!(r.backend(), None);
    // 403, and a status the auth service should not give (500, as nginx).
    let status = |token: &'static str| async move {
        send(http, "ext.test", "/", &[("authorization", token)])
            .await
            .status
            .as_u16()
    };
    assert_eq!(status("Bearer forbidden").await, 403);
    assert_eq!(status("Bearer broken").await, 500);
    assert_eq!(
        status("Bearer crash").await,
        500,
        "the auth pod died mid-request"
    );
    assert_eq!(
        status("Bearer good").await,
        200,
        "and the next request is served"
    );
    // Too late (proxy-read-timeout 1 s): 500, in about a second.
    let t = std::time::Instant::now();
    assert_eq!(status("Bearer slow").await, 500);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // auth-signin: a 401 becomes a redirect carrying the original URL; auth-method is used.
    let r = send(http, "signin.test", "/a%20b?c=d", &[]).await;
    assert_eq!(r.status, 302);
    assert_eq!(
        r.headers["location"],
        "https://login.test/start?rd=http://signin.test%2Fa%2520b%3Fc%3Dd"
    );
    assert_eq!(r.headers["set-cookie"], "csrf=1");
    let sub = seen.lock().unwrap().last().cloned().unwrap();
    assert!(sub.starts_with("POST /check?from=sluice "), "{sub}");
    assert_eq!(status_of(http, "signin.test", "Bearer good").await, 200);
    // The auth Service's pod is gone: 500 at once, never the app.
    let t = std::time::Instant::now();
    let r = send(http, "gone.test", "/", &[("authorization", "Bearer good")]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.backend(), None);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

async fn status_of(http: SocketAddr, host: &str, token: &str) -> u16 {
    send(http, host, "/", &[("authorization", token)])
        .await
        .status
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn satisfy_any_or_all_combines_source_ranges_and_credentials() {
    let Setup { s, _app: _a, .. } = setup().await;
    let http = s.running.http_addr.unwrap();
    let good = basic("plain", "s3cret");
    let good = good.as_str();
    // any: outside the range, credentials let the client in; inside, none are needed.
    assert_eq!(send(http, "any-outside.test", "/", &[]).await.status, 401);
    assert_eq!(status_of(http, "any-outside.test", good).await, 200);
    assert_eq!(send(http, "any-inside.test", "/", &[]).await.status, 200);
    // all (the default): outside the range, credentials do not help.
    assert_eq!(status_of(http, "all-outside.test", good).await, 403);
    // Admitted by the ranges without asking the auth service: a client's own copy of the
    // field the auth service would set does not reach the app.
    let r = send(
        http,
        "any-ext.test",
        "/echo",
        &[("x-auth-request-user", "mallory")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("mallory"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_curl,
    ignore = "curl is not installed; digest is checked by unit tests only"
)]
async fn digest_with_curl_as_the_client() {
    let Setup { s, _app: _a, .. } = setup().await;
    let http = s.running.http_addr.unwrap();
    let r = send(http, "digest.test", "/", &[]).await;
    assert_eq!(r.status, 401);
    let challenge = r.headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.starts_with("Digest realm=\"staff\", qop=\"auth\""),
        "{challenge}"
    );
    // curl's own RFC 7616 code, not the test's.
    let right = curl(http, "digest.test", &["--digest", "-u", "alice:s3cret"]);
    assert_eq!(right, Some(200), "curl --digest with the right password");
    let wrong = curl(http, "digest.test", &["--digest", "-u", "alice:nope"]);
    assert_eq!(wrong, Some(401));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_htpasswd, ignore = "htpasswd (apache2-utils) is not installed")]
async fn basic_against_entries_htpasswd_wrote() {
    let Setup { s, m, _app: _a, .. } = setup().await;
    let http = s.running.http_addr.unwrap();
    // bcrypt, MD5 (apr1), SHA-1, crypt: what the Apache tool writes.
    let flags = ["-B", "-m", "-s", "-d"];
    let lines: Vec<String> = flags
        .iter()
        .map(|f| htpasswd(f, &format!("user{}", &f[1..]), "tool-pass").expect("htpasswd runs"))
        .collect();
    m.write(
        "secrets.yaml",
        &opaque_secret("users", &[("auth", &lines.join("\n"))]),
    );
    for f in flags {
        let user = format!("user{}", &f[1..]);
        let good = basic(&user, "tool-pass");
        let ok = eventually(std::time::Duration::from_secs(10), || async {
            send(http, "basic.test", "/", &[("authorization", good.as_str())])
                .await
                .status
                == 200
        })
        .await;
        assert!(ok, "htpasswd {f}: {lines:?}");
        // DES crypt reads 8 characters only (as crypt(3) and nginx): differ early.
        let bad = basic(&user, "Tool-pass");
        let r = send(http, "basic.test", "/", &[("authorization", bad.as_str())]).await;
        assert_eq!(r.status, 401, "htpasswd {f} with a wrong password");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_answers_are_cached_per_key_and_status() {
    let Setup {
        s, seen, _app: _a, ..
    } = setup().await;
    let http = s.running.http_addr.unwrap();
    let asked = || seen.lock().unwrap().len();
    let before = asked();
    for _ in 0..3 {
        assert_eq!(status_of(http, "cached.test", "Bearer plain-ok").await, 200);
    }
    assert_eq!(
        asked() - before,
        1,
        "one subrequest for three requests with one key"
    );

    for _ in 0..2 {
        assert_eq!(status_of(http, "cached.test", "Bearer nobody").await, 401);
    }
    assert_eq!(
        asked() - before,
        2,
        "a 401 is remembered too, under its own key"
    );
    for _ in 0..2 {
        assert_eq!(
            status_of(http, "cached.test", "Bearer forbidden").await,
            403
        );
    }
    assert_eq!(
        asked() - before,
        4,
        "403 is not in auth-cache-duration: asked each time"
    );
    for _ in 0..2 {
        assert_eq!(status_of(http, "cached.test", "Bearer good").await, 200);
    }
    assert_eq!(
        asked() - before,
        6,
        "an answer that sets a cookie is not remembered, as nginx's proxy_cache"
    );
    // Without the cache annotations every request asks.
    let before = asked();
    for _ in 0..2 {
        assert_eq!(status_of(http, "ext.test", "Bearer good").await, 200);
    }
    assert_eq!(asked() - before, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_auth_from_the_configmap_covers_ingresses_that_do_not_opt_out() {
    let app = backend("app").await;
    let (auth, seen) = auth_service().await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[service("svc"), in_namespace(&service("oauth"), "auth")].join("---\n"),
    );
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("svc", &[app.addr]),
            in_namespace(&endpoint_slices("oauth", &[auth]), "auth"),
        ]
        .join("---\n"),
    );
    m.write(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sluice\n  namespace: default\ndata:\n  global-auth-url: http://oauth.auth.svc/global\n",
    );
    m.write(
        "ing.yaml",
        &[
            nginx_ingress("covered", "svc", &[]),
            nginx_ingress("optout", "svc", &[("enable-global-auth", "false")]),
            // What cert-manager's HTTP-01 solver makes: its own Ingress for the token.
            annotated_ingress(
                "solver",
                "covered.test",
                &[("/.well-known/acme-challenge/t", "Exact", "svc")],
                &[],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
    let http = s.running.http_addr.unwrap();
    assert_eq!(send(http, "covered.test", "/", &[]).await.status, 401);
    assert_eq!(status_of(http, "covered.test", "Bearer good").await, 200);
    let sub = seen.lock().unwrap().last().cloned().unwrap();
    assert!(sub.starts_with("GET /global "), "{sub}");
    assert_eq!(send(http, "optout.test", "/", &[]).await.status, 200);
    let acme = send(http, "covered.test", "/.well-known/acme-challenge/t", &[]).await;
    assert_eq!(
        acme.status, 200,
        "no-auth-locations: the ACME solver's path passes"
    );
    let other = send(http, "covered.test", "/.well-known/other", &[]).await;
    assert_eq!(other.status, 401, "the / route still asks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signin_parameter_request_redirect_cookies_and_snippets() {
    let Setup {
        s, seen, _app: _a, ..
    } = setup().await;
    let http = s.running.http_addr.unwrap();
    // auth-signin-redirect-param names the parameter; auth-request-redirect is sent as is.
    let r = send(http, "param.test", "/p", &[]).await;
    assert_eq!(r.status, 302);
    assert_eq!(
        r.headers["location"],
        "https://login.test/start?x=1&next=http://param.test%2Fp"
    );
    let sub = seen.lock().unwrap().last().cloned().unwrap();
    assert!(sub.contains(" redirect=https://app.test/back "), "{sub}");
    // The auth answer's cookie on an upstream error: only with auth-always-set-cookie.
    let good = [("authorization", "Bearer good")];
    let r = send(http, "always.test", "/?status=500", &good).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.headers["set-cookie"], "session=fresh");
    let r = send(http, "ext.test", "/?status=500", &good).await;
    assert_eq!(r.status, 500);
    assert!(r.headers.get("set-cookie").is_none(), "{:?}", r.headers);
    // auth-snippet is never executed: the Ingress stays closed.
    assert_eq!(send(http, "snippet.test", "/", &good).await.status, 503);
}

/// The canonical oauth2-proxy setup from ingress-nginx's documentation: the app's Ingress asks
/// `https://$host/oauth2/auth` and signs in at `https://$host/oauth2/start?rd=...`, and a
/// second Ingress on the same host sends `/oauth2` to oauth2-proxy. sluice looks the auth URL
/// up in its own routes and sends the subrequest to that route's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_url_on_the_request_host_goes_through_sluices_own_routes() {
    let app = backend("app").await;
    let (auth, seen) = auth_service().await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write(
        "svc.yaml",
        &[service("svc"), service("oauth2-proxy")].join("---\n"),
    );
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("svc", &[app.addr]),
            endpoint_slices("oauth2-proxy", &[auth]),
        ]
        .join("---\n"),
    );
    let n = |k: &str| format!("{N}{k}");
    let (url, signin) = (n("auth-url"), n("auth-signin"));
    m.write(
        "ing.yaml",
        &[
            annotated_ingress(
                "app",
                "app.test",
                &[("/", "Prefix", "svc")],
                &[
                    (url.as_str(), "https://$host/oauth2/auth"),
                    (
                        signin.as_str(),
                        "https://$host/oauth2/start?rd=$escaped_request_uri",
                    ),
                ],
            ),
            annotated_ingress(
                "oauth2-proxy",
                "app.test",
                &[("/oauth2", "Prefix", "oauth2-proxy")],
                &[],
            ),
            // An auth URL whose route asks for authentication itself: refused, never a loop.
            annotated_ingress(
                "loop",
                "loop.test",
                &[("/", "Prefix", "svc")],
                &[(url.as_str(), "https://$host/check")],
            ),
            // A host sluice does not serve: nothing to ask, so 500.
            annotated_ingress(
                "nowhere",
                "nowhere.test",
                &[("/", "Prefix", "svc")],
                &[(url.as_str(), "https://auth.elsewhere.test/check")],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let r = send(http, "app.test", "/page?x=1", &[]).await;
    assert_eq!(r.status, 302);
    assert_eq!(
        r.headers["location"],
        "https://app.test/oauth2/start?rd=%2Fpage%3Fx%3D1"
    );
    let sub = seen.lock().unwrap().last().cloned().unwrap();
    assert!(
        sub.starts_with("GET /oauth2/auth host=app.test url=http://app.test/page?x=1 "),
        "{sub}"
    );
    let r = send(
        http,
        "app.test",
        "/page",
        &[("authorization", "Bearer good")],
    )
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, Some("app")));
    // oauth2-proxy's own paths are served without authentication.
    let r = send(http, "app.test", "/oauth2/start", &[]).await;
    assert_eq!(
        r.status, 401,
        "the auth service's own answer, unauthenticated"
    );
    assert_eq!(r.text(), "auth says");
    assert_eq!(status_of(http, "loop.test", "Bearer good").await, 500);
    assert_eq!(status_of(http, "nowhere.test", "Bearer good").await, 500);
}
