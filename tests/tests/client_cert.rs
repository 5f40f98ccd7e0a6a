//! Client certificates (`auth-tls-*`) through `sluice serve` with real TLS handshakes: a client
//! certificate the CA signed passes and its names reach the upstream, a stranger's or none is
//! refused per `auth-tls-verify-client`, `auth-tls-match-cn` and `auth-tls-error-page` apply,
//! a client cannot dodge the check by naming another host in its ClientHello or forge the
//! `ssl-client-*` fields, and a CA Secret that is missing or carries a revocation list keeps the
//! route closed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_tests::mtls::{client_config, fetch, pki};
use sluice_tests::*;

const N: &str = "nginx.ingress.kubernetes.io/";

const HOSTS: [&str; 11] = [
    "off.test",
    "shallow.test",
    "deep.test",
    "on.test",
    "optional.test",
    "noca.test",
    "named.test",
    "page.test",
    "open.test",
    "missing.test",
    "crl.test",
];

fn row(name: &str, ann: &[(&str, &str)]) -> String {
    let keys: Vec<(String, String)> = ann
        .iter()
        .map(|(k, v)| (format!("{N}{k}"), v.to_string()))
        .collect();
    let ann: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    tls_ingress(name, &format!("{name}.test"), "server-tls", "svc", &ann)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_checked_and_passed_on() {
    let pki = pki();
    let (server_cert, server_key) = self_signed(&HOSTS);
    let app = backend("app").await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc"));
    m.write("eps.yaml", &endpoint_slices("svc", &[app.addr]));
    m.write(
        "secrets.yaml",
        &[
            tls_secret("server-tls", &server_cert, &server_key),
            opaque_secret("client-ca", &[("ca.crt", &pki.ca_pem)]),
            opaque_secret(
                "with-crl",
                &[
                    ("ca.crt", &pki.ca_pem),
                    ("ca.crl", "-----BEGIN X509 CRL-----"),
                ],
            ),
        ]
        .join("---\n"),
    );
    let ca = ("auth-tls-secret", "default/client-ca");
    m.write(
        "ing.yaml",
        &[
            row(
                "on",
                &[ca, ("auth-tls-pass-certificate-to-upstream", "true")],
            ),
            row("optional", &[ca, ("auth-tls-verify-client", "optional")]),
            row("noca", &[ca, ("auth-tls-verify-client", "optional_no_ca")]),
            row("named", &[ca, ("auth-tls-match-cn", "CN=admin")]),
            row(
                "page",
                &[ca, ("auth-tls-error-page", "https://errors.test/cert")],
            ),
            row("open", &[]),
            // Another Ingress on a host with client-certificate rules: they cover it too.
            annotated_ingress("other-path", "on.test", &[("/other", "Prefix", "svc")], &[]),
            row("off", &[ca, ("auth-tls-verify-client", "off")]),
            row("shallow", &[ca]),
            row("deep", &[ca, ("auth-tls-verify-depth", "2")]),
            row("missing", &[("auth-tls-secret", "default/nope")]),
            row("crl", &[("auth-tls-secret", "default/with-crl")]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let https = s.running.https_addr.unwrap();
    let member = client_config(&server_cert, Some(&pki.member));
    let stranger = client_config(&server_cert, Some(&pki.stranger));
    let anonymous = client_config(&server_cert, None);

    // on: the CA's client passes; its names and certificate reach the app, a forged field
    // does not.
    let (status, body) = fetch(
        https,
        &member,
        "on.test",
        "on.test",
        "ssl-client-verify: SUCCESS-forged\r\nssl-client-subject-dn: CN=admin\r\n",
    )
    .await;
    assert_eq!(status, Some(200), "{body}");
    assert!(body.contains("ssl-client-verify=SUCCESS\n"), "{body}");
    assert!(
        body.contains("ssl-client-subject-dn=CN=client-1\n"),
        "{body}"
    );
    assert!(
        body.contains("ssl-client-issuer-dn=CN=Test Client CA\n"),
        "{body}"
    );
    assert!(
        body.contains("ssl-client-cert=-----BEGIN%20CERTIFICATE-----%0A"),
        "{body}"
    );
    assert!(
        !body.contains("forged") && !body.contains("CN=admin"),
        "{body}"
    );
    // No certificate: 400 as nginx; a stranger's: the handshake fails.
    let (status, body) = fetch(https, &anonymous, "on.test", "on.test", "").await;
    assert_eq!(status, Some(400), "{body}");
    assert!(
        body.contains("No required SSL certificate was sent"),
        "{body}"
    );
    let (status, body) = fetch(https, &stranger, "on.test", "on.test", "").await;
    assert_eq!(
        status,
        Some(400),
        "a certificate the CA did not sign: {body}"
    );
    assert!(body.contains("The SSL certificate error"), "{body}");
    // Naming another host in the ClientHello (no certificate asked), or reusing another host's
    // connection, does not get past the route: 421, so a browser opens a connection of its own.
    let (status, _) = fetch(https, &anonymous, "open.test", "on.test", "").await;
    assert_eq!(status, Some(421));
    let (status, _) = fetch(https, &member, "optional.test", "on.test", "").await;
    assert_eq!(status, Some(421), "verified for another host's rules");
    let (status, _) = fetch(https, &anonymous, "open.test", "open.test", "").await;
    assert_eq!(status, Some(200), "a host without auth-tls is untouched");

    // The host's rules cover another Ingress's path on it, as ingress-nginx's server-level
    // ssl_verify_client does.
    let (status, _) = fetch(https, &anonymous, "on.test", "on.test/other", "").await;
    assert_eq!(status, Some(400));
    let (status, _) = fetch(https, &member, "on.test", "on.test/other?size=3", "").await;
    assert_eq!(status, Some(200));

    // off: as if the annotations were not there.
    let (status, body) = fetch(https, &anonymous, "off.test", "off.test", "").await;
    assert_eq!(status, Some(200));
    assert!(!body.contains("ssl-client-verify"), "{body}");

    // optional: none is fine (NONE), the CA's passes, a stranger's fails the handshake.
    let (status, body) = fetch(https, &anonymous, "optional.test", "optional.test", "").await;
    assert_eq!(status, Some(200));
    assert!(body.contains("ssl-client-verify=NONE\n"), "{body}");
    assert!(
        !body.contains("ssl-client-cert="),
        "not passed without the annotation"
    );
    let (status, _) = fetch(https, &stranger, "optional.test", "optional.test", "").await;
    assert_eq!(status, Some(400));
    // optional_no_ca: a stranger's is let through and marked.
    let (status, body) = fetch(https, &stranger, "noca.test", "noca.test", "").await;
    assert_eq!(status, Some(200));
    assert!(body.contains("ssl-client-verify=FAILED:"), "{body}");
    let (_, body) = fetch(https, &member, "noca.test", "noca.test", "").await;
    assert!(body.contains("ssl-client-verify=SUCCESS\n"), "{body}");

    // verify-depth: a certificate issued by an intermediate needs depth 2.
    let nephew = client_config(&server_cert, Some(&pki.nephew));
    let (status, _) = fetch(https, &nephew, "shallow.test", "shallow.test", "").await;
    assert_eq!(
        status,
        Some(400),
        "depth 1: the intermediate is one too many"
    );
    let (status, body) = fetch(https, &nephew, "deep.test", "deep.test", "").await;
    assert_eq!(status, Some(200), "{body}");
    assert!(
        body.contains("ssl-client-issuer-dn=CN=Test Intermediate\n"),
        "{body}"
    );

    // match-cn: a valid certificate with another name is 403.
    let (status, _) = fetch(https, &member, "named.test", "named.test", "").await;
    assert_eq!(status, Some(403));
    // error-page: the client without a certificate is redirected.
    let (status, body) = fetch(https, &anonymous, "page.test", "page.test", "").await;
    assert_eq!(status, Some(302));
    let (status, _) = fetch(https, &stranger, "page.test", "page.test", "").await;
    assert_eq!(
        status,
        Some(302),
        "an unverified certificate is redirected too"
    );
    assert!(
        body.contains("location: https://errors.test/cert\r\n"),
        "{body}"
    );
    // A missing CA Secret, or one with a revocation list, keeps the route closed.
    for host in ["missing.test", "crl.test"] {
        let (status, _) = fetch(https, &member, host, host, "").await;
        assert_eq!(status, Some(503), "{host}");
    }
    let problems = status_text(&s).await;
    assert!(
        problems.contains("Secret default/nope not found"),
        "{problems}"
    );
    assert!(problems.contains("revocation"), "{problems}");
    // Plain HTTP to an `on` route: the redirect to HTTPS comes first (ssl-redirect), so no
    // request reaches the app without a certificate.
    let http = s.running.http_addr.unwrap();
    let r = get(&client(), http, "on.test", "/echo").await.unwrap();
    assert_eq!(r.status, 308);
}
