//! A Gateway's client-certificate validation (`spec.tls.frontend`) through `sluice serve`, with
//! real TLS handshakes: under `AllowValidOnly` a client certificate the ConfigMap's CA signed
//! (directly or through an intermediate it sends) gets through and a stranger's or none fails
//! the handshake; `AllowInsecureFallback` on another port lets every client through; a second
//! Gateway's listener on the same socket asks for nothing, and a client that names that
//! listener's host in its ClientHello to skip the check gets 421 for the validated host; a
//! per-port configuration whose CA cannot be found keeps its listener closed, and the CA
//! ConfigMap's later arrival opens it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_tests::mtls::{client_config, fetch, pki};
use sluice_tests::*;

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: sluice\nspec:\n  controllerName: sluice.dev/gateway-controller\n";

/// An HTTPS listener of `host` on `port` with the `server-tls` certificate.
fn listener(name: &str, host: &str, port: u16) -> String {
    format!(
        "  - name: {name}\n    port: {port}\n    protocol: HTTPS\n    hostname: {host}\n    tls:\n      certificateRefs: [{{name: server-tls}}]\n"
    )
}

/// Gateway `strict`: port `p1` validated by `client-ca` (the default), `p2` in insecure-fallback
/// mode (per port), `p3` by the missing ConfigMap `late-ca` (per port). Gateway `open`: a listener
/// on `p1` too, asking for nothing.
fn gateways(p1: u16, p2: u16, p3: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: strict\n  namespace: default\nspec:\n  gatewayClassName: sluice\n  tls:\n    frontend:\n      default:\n        validation:\n          caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: client-ca}}]\n      perPort:\n      - port: {p2}\n        tls:\n          validation:\n            mode: AllowInsecureFallback\n            caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: client-ca}}]\n      - port: {p3}\n        tls:\n          validation:\n            caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: late-ca}}]\n  listeners:\n{}{}{}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: open\n  namespace: default\nspec:\n  gatewayClassName: sluice\n  listeners:\n{}",
        listener("strict", "strict.test", p1),
        listener("lenient", "lenient.test", p2),
        listener("late", "late.test", p3),
        listener("open", "open.test", p1),
    )
}

fn route(name: &str, gateway: &str, hosts: &str, svc: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  parentRefs: [{{name: {gateway}}}]\n  hostnames: [{hosts}]\n  rules:\n  - backendRefs: [{{name: {svc}, port: 80}}]\n"
    )
}

fn ca_config_map(name: &str, ca_pem: &str) -> String {
    let indent: String = ca_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  ca.crt: |\n{indent}"
    )
}

async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

async fn answers(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_listeners_validate_client_certificates_in_the_handshake() {
    let pki = pki();
    let (server_cert, server_key) =
        self_signed(&["strict.test", "lenient.test", "late.test", "open.test"]);
    let (a, b) = (backend("a").await, backend("b").await);
    let (p1, p2, p3) = (free_port().await, free_port().await, free_port().await);
    let at = |p: u16| -> SocketAddr { format!("127.0.0.1:{p}").parse().unwrap() };
    let m = Manifests::new();
    m.write(
        "svc.yaml",
        &format!("{}---\n{}", service("a"), service("b")),
    );
    m.write(
        "eps.yaml",
        &format!(
            "{}---\n{}",
            endpoint_slices("a", &[a.addr]),
            endpoint_slices("b", &[b.addr])
        ),
    );
    m.write(
        "secret.yaml",
        &tls_secret("server-tls", &server_cert, &server_key),
    );
    m.write("ca.yaml", &ca_config_map("client-ca", &pki.ca_pem));
    m.write("gw.yaml", &format!("{CLASS}---\n{}", gateways(p1, p2, p3)));
    m.write(
        "routes.yaml",
        &format!(
            "{}---\n{}",
            route(
                "validated",
                "strict",
                "strict.test, lenient.test, late.test",
                "a"
            ),
            route("open", "open", "open.test", "b"),
        ),
    );
    let s = serve(m.dir.path(), &[]).await;
    assert!(
        eventually(Duration::from_secs(10), || answers(at(p1))).await
            && eventually(Duration::from_secs(10), || answers(at(p2))).await,
        "the Gateway sockets open"
    );
    let member = client_config(&server_cert, Some(&pki.member));
    let nephew = client_config(&server_cert, Some(&pki.nephew));
    let stranger = client_config(&server_cert, Some(&pki.stranger));
    let anonymous = client_config(&server_cert, None);

    // AllowValidOnly (the default's): the handshake decides.
    let (status, body) = fetch(at(p1), &member, "strict.test", "strict.test", "").await;
    assert_eq!(status, Some(200), "{body}");
    assert!(body.to_ascii_lowercase().contains("x-backend: a"), "{body}");
    let (status, _) = fetch(at(p1), &nephew, "strict.test", "strict.test", "").await;
    assert_eq!(
        status,
        Some(200),
        "a chain through an intermediate verifies"
    );
    let (status, body) = fetch(at(p1), &stranger, "strict.test", "strict.test", "").await;
    assert_eq!(
        status, None,
        "a stranger's certificate fails the handshake: {body}"
    );
    let (status, body) = fetch(at(p1), &anonymous, "strict.test", "strict.test", "").await;
    assert_eq!(status, None, "no certificate fails the handshake: {body}");

    // The other Gateway's listener on the same socket asks for nothing...
    let (status, body) = fetch(at(p1), &anonymous, "open.test", "open.test", "").await;
    assert_eq!(status, Some(200), "{body}");
    assert!(body.to_ascii_lowercase().contains("x-backend: b"), "{body}");
    // ...and naming it in the ClientHello does not open the validated host.
    let (status, body) = fetch(at(p1), &anonymous, "open.test", "strict.test", "").await;
    assert_eq!(status, Some(421), "{body}");
    let (status, body) = fetch(at(p1), &stranger, "open.test", "strict.test", "").await;
    assert_eq!(status, Some(421), "{body}");

    // AllowInsecureFallback (per port): asked for, never required.
    for (who, cfg) in [
        ("member", &member),
        ("stranger", &stranger),
        ("nobody", &anonymous),
    ] {
        let (status, body) = fetch(at(p2), cfg, "lenient.test", "lenient.test", "").await;
        assert_eq!(status, Some(200), "{who}: {body}");
    }
    let status = status_text(&s).await;
    assert!(
        status.contains("NoValidCACertificate")
            && status.contains("ConfigMap default/late-ca not found"),
        "the listener whose CA is missing says why: {status}"
    );
    assert!(
        !answers(at(p3)).await,
        "a listener without a usable CA is not served at all"
    );

    // The listeners' certificates are in the admin API's certificates document.
    let certs = get(
        &client(),
        s.running.admin_addr,
        "localhost",
        "/api/v1/certificates",
    )
    .await
    .unwrap()
    .text();
    let docs: serde_json::Value = serde_json::from_str(&certs).unwrap();
    let row = docs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["host"] == "strict.test (Gateway default/strict listener strict)")
        .unwrap_or_else(|| panic!("no row for the strict listener: {certs}"));
    assert_eq!(row["secret"], "default/server-tls");
    assert_eq!(
        row["serial"].as_str().map(str::to_ascii_lowercase),
        Some(
            pem_serial(&server_cert)
                .replace(':', "")
                .to_ascii_lowercase()
        )
    );

    // The CA arrives: the listener opens, validated.
    m.write("late.yaml", &ca_config_map("late-ca", &pki.ca_pem));
    assert!(
        eventually(Duration::from_secs(10), || answers(at(p3))).await,
        "the listener opens once its CA ConfigMap exists"
    );
    let (status, _) = fetch(at(p3), &member, "late.test", "late.test", "").await;
    assert_eq!(status, Some(200));
    let (status, _) = fetch(at(p3), &anonymous, "late.test", "late.test", "").await;
    assert_eq!(status, None);
    assert!(s.shutdown(Duration::from_secs(5)).await);
}
