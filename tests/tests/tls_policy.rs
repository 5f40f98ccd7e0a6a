//! The controller ConfigMap's `ssl-protocols` and `ssl-ciphers` on the HTTPS listener, through
//! `sluice serve` with real handshakes: a version or TLS 1.2 suite the ConfigMap leaves out is
//! refused, one it names is served, and a change applies to the next connection without a
//! restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use sluice_tests::*;

/// Whether a handshake with only this version (and, for TLS 1.2, only this suite) succeeds.
async fn handshake(addr: SocketAddr, cert: &str, tls13: bool, suite: Option<&str>) -> bool {
    let mut provider = sluice_proxy::crypto::provider();
    if let Some(name) = suite {
        provider
            .cipher_suites
            .retain(|s| s.suite().as_str() == Some(name));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(cert.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let version = if tls13 {
        &rustls::version::TLS13
    } else {
        &rustls::version::TLS12
    };
    let cfg = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("policy.test").unwrap(), tcp)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocols_and_ciphers_follow_the_configmap_without_a_restart() {
    let (cert, key) = self_signed(&["policy.test"]);
    let b = backend("b").await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc"));
    m.write("eps.yaml", &endpoint_slices("svc", &[b.addr]));
    m.write("secret.yaml", &tls_secret("policy-tls", &cert, &key));
    m.write(
        "ing.yaml",
        &tls_ingress("policy", "policy.test", "policy-tls", "svc", &[]),
    );
    m.write(
        "cm.yaml",
        &controller_configmap("  ssl-protocols: TLSv1.3\n"),
    );
    let s = serve(m.dir.path(), &["--configmap", "default/sluice"]).await;
    let https = s.running.https_addr.unwrap();
    let aes128 = Some("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
    let aes256 = Some("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384");

    assert!(
        handshake(https, &cert, true, None).await,
        "TLS 1.3 is offered"
    );
    assert!(
        !handshake(https, &cert, false, None).await,
        "TLS 1.2 is not"
    );

    // Both versions, and TLS 1.2 with AES-256 only (ingress-nginx's DHE names are skipped).
    m.write(
        "cm.yaml",
        &controller_configmap(
            "  ssl-protocols: TLSv1.2 TLSv1.3\n  ssl-ciphers: ECDHE-ECDSA-AES256-GCM-SHA384:DHE-RSA-AES256-GCM-SHA384\n",
        ),
    );
    let applied = eventually(Duration::from_secs(10), || async {
        handshake(https, &cert, false, aes256).await
    })
    .await;
    assert!(applied, "the change reached the listener");
    assert!(
        !handshake(https, &cert, false, aes128).await,
        "a suite left out"
    );
    assert!(
        handshake(https, &cert, true, None).await,
        "TLS 1.3 suites all stay"
    );

    // An unknown name leaves the value invalid: the defaults serve again, with a Warning.
    m.write(
        "cm.yaml",
        &controller_configmap("  ssl-ciphers: HIGH:!aNULL\n"),
    );
    let back = eventually(Duration::from_secs(10), || async {
        handshake(https, &cert, false, aes128).await
    })
    .await;
    assert!(back, "the defaults serve");
    let problems = status_text(&s).await;
    assert!(problems.contains("ssl-ciphers"), "{problems}");
}
