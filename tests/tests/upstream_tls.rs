//! TLS to backends as ingress-nginx's `proxy-ssl-*` and `backend-protocol: HTTPS|GRPCS` ask
//! for it, through `sluice serve` to real rustls pods: the pod's certificate verified against the
//! Secret's `ca.crt` for `proxy-ssl-name`, SNI sent, sluice's client certificate presented to a
//! pod that requires one, a wrong name refused (502), h2 over TLS with ALPN, and a setting that
//! cannot be honoured keeping the Ingress closed (503).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use sluice_tests::*;

struct Ca {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: rcgen::Issuer::new(params, key),
    }
}

/// A certificate for `names` (or a client CN when `names` is empty) and its key, as PEM.
fn issue(ca: &Ca, cn: &str, names: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    if names.is_empty() {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    }
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A TLS pod: answers `sni=<name> client=<CN>` (the client certificate's subject, `-` without
/// one) over HTTP/1.1 or h2 per ALPN; requires a client certificate from `client_ca` when given.
async fn tls_pod(cert_pem: &str, key_pem: &str, client_ca: Option<&str>, h2: bool) -> SocketAddr {
    let provider = Arc::new(sluice_proxy::crypto::provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap(),
            )
        }
        None => builder.with_no_client_auth(),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let mut cfg = builder
        .with_single_cert(
            chain,
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    cfg.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, conn) = tls.get_ref();
                let sni = conn.server_name().unwrap_or("-").to_string();
                let client = conn
                    .peer_certificates()
                    .and_then(|c| c.first().cloned())
                    .and_then(|der| {
                        let (_, c) = x509_parser::parse_x509_certificate(&der).ok()?;
                        let cn = c.subject().iter_common_name().next()?.as_str().ok()?;
                        Some(cn.to_string())
                    })
                    .unwrap_or_else(|| "-".into());
                let body = format!("sni={sni} client={client}");
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = format!("{body} version={:?}", req.version());
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            body,
                        ))))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(io, svc)
                    .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_reached_over_tls_as_proxy_ssl_asks() {
    let pod_ca = ca("Pod CA");
    let sluice_ca = ca("Sluice Client CA");
    let (pod_cert, pod_key) = issue(&pod_ca, "backend", &["backend.internal"]);
    let (client_cert, client_key) = issue(&sluice_ca, "sluice-edge", &[]);
    let https_pod = tls_pod(&pod_cert, &pod_key, Some(&sluice_ca.pem), false).await;
    let h2_pod = tls_pod(&pod_cert, &pod_key, None, true).await;

    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    let services = ["verified", "wrong-name", "grpcs", "no-ca", "no-client"];
    m.write("svc.yaml", &services.map(service).join("---\n"));
    let slices: Vec<String> = services
        .iter()
        .map(|s| endpoint_slices(s, &[if *s == "grpcs" { h2_pod } else { https_pod }]))
        .collect();
    m.write("eps.yaml", &slices.join("---\n"));
    m.write(
        "secrets.yaml",
        &[
            opaque_secret(
                "pod-tls",
                &[
                    ("ca.crt", &pod_ca.pem),
                    ("tls.crt", &client_cert),
                    ("tls.key", &client_key),
                ],
            ),
            opaque_secret("ca-only", &[("ca.crt", &pod_ca.pem)]),
            opaque_secret(
                "client-only",
                &[("tls.crt", &client_cert), ("tls.key", &client_key)],
            ),
        ]
        .join("---\n"),
    );
    let row = |name: &str, ann: &[(&str, &str)]| nginx_ingress(name, name, ann);
    let https = ("backend-protocol", "HTTPS");
    m.write(
        "ing.yaml",
        &[
            row(
                "verified",
                &[
                    https,
                    ("proxy-ssl-secret", "default/pod-tls"),
                    ("proxy-ssl-verify", "on"),
                    ("proxy-ssl-name", "backend.internal"),
                    ("proxy-ssl-server-name", "on"),
                ],
            ),
            row(
                "wrong-name",
                &[
                    https,
                    ("proxy-ssl-secret", "default/pod-tls"),
                    ("proxy-ssl-verify", "on"),
                    ("proxy-ssl-name", "other.internal"),
                ],
            ),
            row("grpcs", &[("backend-protocol", "GRPCS")]),
            row(
                "no-ca",
                &[
                    https,
                    ("proxy-ssl-secret", "default/client-only"),
                    ("proxy-ssl-verify", "on"),
                ],
            ),
            // The pod requires a client certificate; this Secret has none to give.
            row(
                "no-client",
                &[
                    https,
                    ("proxy-ssl-secret", "default/ca-only"),
                    ("proxy-ssl-verify", "on"),
                    ("proxy-ssl-name", "backend.internal"),
                ],
            ),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();

    let r = get(&c, http, "verified.test", "/").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        "sni=backend.internal client=sluice-edge version=HTTP/1.1"
    );
    let r = get(&c, http, "wrong-name.test", "/").await.unwrap();
    assert_eq!(
        r.status,
        502,
        "a certificate for another name: {}",
        r.text()
    );
    let r = get(&c, http, "no-client.test", "/").await.unwrap();
    assert_eq!(
        r.status, 502,
        "the pod refused sluice without a client certificate"
    );
    let r = get(&c, http, "grpcs.test", "/").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().ends_with("version=HTTP/2.0"), "{}", r.text());
    let r = get(&c, http, "no-ca.test", "/").await.unwrap();
    assert_eq!(
        r.status, 503,
        "verify on without a ca.crt keeps the Ingress closed"
    );
    let problems = status_text(&s).await;
    assert!(
        problems.contains("has no ca.crt to verify against"),
        "{problems}"
    );
}

/// A TLS pod that dies mid-response: it answers the head and the first 1,000 of 100,000
/// promised bytes, then drops the connection (no close_notify, as a killed process).
async fn dying_tls_pod(cert_pem: &str, key_pem: &str) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let provider = Arc::new(sluice_proxy::crypto::provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            chain,
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nx-backend: dying\r\n\r\n",
                    )
                    .await;
                let _ = tls.write_all(&[b'x'; 1000]).await;
                let _ = tls.flush().await;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                // Dropped: the TCP connection closes without a TLS close_notify.
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_pod_dying_mid_response_truncates_that_response_only() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pod_ca = ca("Pod CA");
    let (pod_cert, pod_key) = issue(&pod_ca, "backend", &["backend.internal"]);
    let dying = dying_tls_pod(&pod_cert, &pod_key).await;
    let healthy = tls_pod(&pod_cert, &pod_key, None, false).await;
    let m = Manifests::new();
    m.write(
        "all.yaml",
        &[
            ingress_class(),
            service("dying"),
            endpoint_slices("dying", &[dying]),
            service("healthy"),
            endpoint_slices("healthy", &[healthy]),
            nginx_ingress("dying", "dying", &[("backend-protocol", "HTTPS")]),
            nginx_ingress("healthy", "healthy", &[("backend-protocol", "HTTPS")]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let mut c = tokio::net::TcpStream::connect(http).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: dying.test\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut buf = [0u8; 16384];
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "sluice closes the client's connection, it does not hang"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:.80}");
    let body = got.len() - (text.find("\r\n\r\n").unwrap() + 4);
    assert!(
        (1000..100_000).contains(&body),
        "the client sees a short body and a closed connection, never a complete-looking one: {body}"
    );
    // Another pool, and a new connection to the same one, are unaffected.
    let r = get(&client(), http, "healthy.test", "/").await.unwrap();
    assert_eq!(r.status, 200);
    // The next request to the dying pod: truncated again (a hyper client sees an error), or
    // refused by sluice if it set the pod aside; never a complete-looking answer.
    match get(&client(), http, "dying.test", "/").await {
        Err(_) => {}
        Ok(r) => assert!(r.status.is_server_error(), "{}", r.status),
    }
}
