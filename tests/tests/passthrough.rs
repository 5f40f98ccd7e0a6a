//! SSL passthrough through `sluice serve --enable-ssl-passthrough` over real sockets: a real
//! TLS backend's certificate reaches the client and the client speaks HTTP with the pod through
//! the tunnel; other hosts on the same listener still get sluice's own TLS; a pod that is gone
//! ends the client's connection at once instead of hanging it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(sluice_proxy::crypto::provider())
}

/// A pod that terminates TLS itself and answers every request with `from-pod`.
async fn tls_pod(crt: &str, key: &str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let certs = vec![CertificateDer::from_pem_slice(crt.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nfrom-pod")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, task)
}

/// A client that trusts only `ca_pem`, sends one request with SNI `host`, returns the answer.
async fn https_get(addr: SocketAddr, host: &str, ca_pem: &str) -> std::io::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from(host.to_string()).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    tls.write_all(
        format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backends_certificate_reaches_the_client() {
    sluice_proxy::crypto::install_default_provider();
    let (pod_crt, pod_key) = self_signed(&["argo.test"]);
    let (pod, pod_task) = tls_pod(&pod_crt, &pod_key).await;
    let plain = backend("plain").await;
    let (edge_crt, edge_key) = self_signed(&["web.test"]);

    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &[service("argo"), service("web")].join("---\n"));
    m.write(
        "eps.yaml",
        &[
            endpoint_slices("argo", &[pod]),
            endpoint_slices("web", &[plain.addr]),
        ]
        .join("---\n"),
    );
    m.write(
        "ing.yaml",
        &[
            annotated_ingress(
                "argo",
                "argo.test",
                &[("/", "Prefix", "argo")],
                &[("nginx.ingress.kubernetes.io/ssl-passthrough", "true")],
            ),
            tls_secret("web-cert", &edge_crt, &edge_key),
            tls_ingress("web", "web.test", "web-cert", "web", &[]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &["--enable-ssl-passthrough"]).await;
    let https = s.running.https_addr.unwrap();

    // The pod's certificate for the passthrough host, sluice's for the other: one listener.
    assert!(
        eventually(Duration::from_secs(5), || async {
            tls_serial(https, "argo.test").await == Some(pem_serial(&pod_crt))
        })
        .await,
        "the pod's certificate reaches the client"
    );
    assert_eq!(
        tls_serial(https, "web.test").await,
        Some(pem_serial(&edge_crt))
    );

    // A client that trusts only the pod completes TLS with it and talks HTTP through sluice.
    let answer = https_get(https, "argo.test", &pod_crt).await.unwrap();
    assert!(answer.ends_with("from-pod"), "{answer}");
    let answer = https_get(https, "web.test", &edge_crt).await.unwrap();
    assert!(answer.contains("x-backend: plain"), "{answer}");

    // The pod is gone: the client's connection ends at once (connect refused), no hang.
    pod_task.abort();
    let _ = pod_task.await;
    let t = Instant::now();
    let r = https_get(https, "argo.test", &pod_crt).await;
    assert!(r.as_deref().map_or(true, str::is_empty), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Bytes that are not TLS at all go to sluice's TLS, which refuses them.
    let mut raw = tokio::net::TcpStream::connect(https).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: argo.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..n]).contains("from-pod"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_the_annotation_is_reported_and_tls_terminated() {
    sluice_proxy::crypto::install_default_provider();
    let plain = backend("plain").await;
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("argo"));
    m.write("eps.yaml", &endpoint_slices("argo", &[plain.addr]));
    m.write(
        "ing.yaml",
        &annotated_ingress(
            "argo",
            "argo.test",
            &[("/", "Prefix", "argo")],
            &[("nginx.ingress.kubernetes.io/ssl-passthrough", "true")],
        ),
    );
    let s = serve(m.dir.path(), &[]).await;
    let status = status_text(&s).await;
    assert!(status.contains("--enable-ssl-passthrough"), "{status}");
    let r = get(&client(), s.running.http_addr.unwrap(), "argo.test", "/")
        .await
        .unwrap();
    assert_eq!(r.backend(), Some("plain"), "plain HTTP is routed as usual");
}

/// The Gateway API's TLS passthrough (`sluice serve` from files): a listener of protocol TLS
/// with `tls.mode: Passthrough` tunnels each connection, untouched, to the backend of the
/// TLSRoute its server name selects — the pod's own certificate reaches the client — and
/// closes a connection whose name no TLSRoute has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_route_passes_connections_through_by_server_name() {
    sluice_proxy::crypto::install_default_provider();
    let (pod_crt, pod_key) = self_signed(&["abc.example.test"]);
    let (pod, _pod_task) = tls_pod(&pod_crt, &pod_key).await;
    let port = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let m = Manifests::new();
    m.write(
        "pod.yaml",
        &[service("tlspod"), endpoint_slices("tlspod", &[pod])].join("---\n"),
    );
    m.write(
        "gw.yaml",
        &format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: sluice.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  gatewayClassName: sluice
  listeners:
  - name: tls
    port: {port}
    protocol: TLS
    hostname: "*.example.test"
    tls: {{mode: Passthrough}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {{name: abc, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: ["abc.example.test"]
  rules:
  - backendRefs: [{{name: tlspod, port: 80}}]
"#
        ),
    );
    let s = serve(m.dir.path(), &[]).await;
    let gw = SocketAddr::from(([127, 0, 0, 1], port));
    let mut answer = Err(std::io::Error::other("not yet"));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        answer = https_get(gw, "abc.example.test", &pod_crt).await;
        if answer.as_ref().is_ok_and(|a| a.ends_with("from-pod")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = answer.unwrap();
    assert!(answer.ends_with("from-pod"), "{answer}");
    // A name no TLSRoute has: nothing to pass to, and no certificate of sluice's to answer.
    assert!(
        https_get(gw, "zzz.example.test", &pod_crt).await.is_err(),
        "an unrouted server name is closed"
    );
    let status = status_text(&s).await;
    assert!(
        !status.contains("TLSRoute"),
        "no problem reported: {status}"
    );
    s.shutdown(Duration::from_secs(2)).await;
}
