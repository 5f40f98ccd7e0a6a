//! TLS termination end to end with real rustls clients on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use sluice_tests::*;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const RSA_PKCS1_CRT: &str = include_str!("../fixtures/rsa-pkcs1.crt");
const RSA_PKCS1_KEY: &str = include_str!("../fixtures/rsa-pkcs1.key");
const EC_CRT: &str = include_str!("../fixtures/ec.crt");
const EC_KEY: &str = include_str!("../fixtures/ec.key");

/// Accepts any server certificate; with `rsa_only`, offers only RSA signature schemes (a
/// client that cannot verify ECDSA).
#[derive(Debug)]
struct AcceptAny {
    rsa_only: bool,
}

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &sluice_proxy::crypto::provider().signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &sluice_proxy::crypto::provider().signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        let mut all = sluice_proxy::crypto::provider()
            .signature_verification_algorithms
            .supported_schemes();
        if self.rsa_only {
            all.retain(|s| format!("{s:?}").starts_with("RSA"));
        }
        all
    }
}

struct Opts {
    alpn: Vec<&'static [u8]>,
    tls12_suite: Option<rustls::SupportedCipherSuite>,
    rsa_only: bool,
}

fn client_config(o: &Opts) -> Arc<ClientConfig> {
    let mut provider = sluice_proxy::crypto::provider();
    let builder = match o.tls12_suite {
        Some(s) => {
            provider.cipher_suites = vec![s];
            ClientConfig::builder_with_provider(Arc::new(provider))
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
        }
        None => ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap(),
    };
    let mut cfg = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny {
            rsa_only: o.rsa_only,
        }))
        .with_no_client_auth();
    cfg.alpn_protocols = o.alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

async fn connect(addr: SocketAddr, sni: Option<&str>, o: &Opts) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    tokio_rustls::TlsConnector::from(client_config(o))
        .connect(name, tcp)
        .await
        .unwrap()
}

fn first_san(s: &TlsStream<TcpStream>) -> String {
    let der = s.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    match &san.value.general_names[0] {
        x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn serial(s: &TlsStream<TcpStream>) -> String {
    let der = s.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.raw_serial_as_string()
}

fn h13() -> Opts {
    Opts {
        alpn: vec![b"http/1.1"],
        tls12_suite: None,
        rsa_only: false,
    }
}

/// One HTTP/1.1 request over an established TLS stream (keeps the stream for reuse).
async fn h1_request(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
) -> (u16, http::HeaderMap, Bytes) {
    let req = http::Request::get(path)
        .header("host", host)
        .body(Empty::new())
        .unwrap();
    let r = sender.send_request(req).await.unwrap();
    let (p, b) = r.into_parts();
    (
        p.status.as_u16(),
        p.headers,
        b.collect().await.unwrap().to_bytes(),
    )
}

/// One HTTP/2 GET of `uri` over an established TLS stream (ALPN h2).
async fn h2_get(s: TlsStream<TcpStream>, uri: &str) -> http::Response<hyper::body::Incoming> {
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    h2.send_request(http::Request::get(uri).body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap()
}

async fn h1(stream: TlsStream<TcpStream>) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(c);
    s
}

async fn setup(extra: Vec<String>) -> (sluice::app::Running, sluice_bench::backend::Backend) {
    let a = backend("a").await;
    let r = data_plane(&[]).await;
    let mut docs = one_service("plain.test", "svc", &[a.addr]);
    docs.extend(extra);
    r.dp.apply(snapshot(&docs));
    (r, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_by_sni_wildcard_default_and_key_formats() {
    let (sni_crt, sni_key) = self_signed(&["a.test"]);
    let (wild_crt, wild_key) = self_signed(&["*.wild.test"]);
    let (r, _a) = setup(vec![
        tls_secret("a-cert", &sni_crt, &sni_key),
        tls_secret("wild-cert", &wild_crt, &wild_key),
        tls_secret("rsa-cert", RSA_PKCS1_CRT, RSA_PKCS1_KEY),
        tls_secret("ec-cert", EC_CRT, EC_KEY),
        tls_ingress("a", "a.test", "a-cert", "svc", &[]),
        tls_ingress("w", "*.wild.test", "wild-cert", "svc", &[]),
        tls_ingress("r", "rsa.test", "rsa-cert", "svc", &[]),
        tls_ingress("e", "ec.test", "ec-cert", "svc", &[]),
    ])
    .await;
    let https = r.https_addr.unwrap();
    assert!(r.dp.tls_problems().is_empty(), "{:?}", r.dp.tls_problems());
    assert_eq!(
        first_san(&connect(https, Some("a.test"), &h13()).await),
        "a.test"
    );
    assert_eq!(
        first_san(&connect(https, Some("x.wild.test"), &h13()).await),
        "*.wild.test"
    );
    assert_eq!(
        first_san(&connect(https, Some("rsa.test"), &h13()).await),
        "rsa.test",
        "PKCS#1 RSA key"
    );
    assert_eq!(
        first_san(&connect(https, Some("ec.test"), &h13()).await),
        "ec.test",
        "SEC1 EC key"
    );
    // PKCS#8 is what rcgen writes: a.test above already used one.
    assert!(sni_key.starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(
        first_san(&connect(https, Some("unknown.test"), &h13()).await),
        "sluice.invalid",
        "default certificate"
    );
    assert_eq!(
        first_san(&connect(https, Some("a.b.wild.test"), &h13()).await),
        "sluice.invalid",
        "wildcard covers one label"
    );
    // No SNI at all: default certificate, and routing by Host still works.
    let s = connect(https, None, &h13()).await;
    assert_eq!(first_san(&s), "sluice.invalid");
    let (status, _, _) = h1_request(&mut h1(s).await, "a.test", "/").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_h2_and_http1_tls12_and_tls13() {
    let (crt, key) = self_signed(&["a.test"]);
    let (r, _a) = setup(vec![
        tls_secret("a-cert", &crt, &key),
        tls_ingress("a", "a.test", "a-cert", "svc", &[]),
        tls_secret("rsa-cert", RSA_PKCS1_CRT, RSA_PKCS1_KEY),
        tls_ingress("r", "rsa.test", "rsa-cert", "svc", &[]),
    ])
    .await;
    let https = r.https_addr.unwrap();
    // ALPN h2: a real HTTP/2 exchange.
    let s = connect(
        https,
        Some("a.test"),
        &Opts {
            alpn: vec![b"h2", b"http/1.1"],
            tls12_suite: None,
            rsa_only: false,
        },
    )
    .await;
    let resp = h2_get(s, "https://a.test/").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers().get("x-backend").unwrap(), "a");
    // ALPN http/1.1.
    let s = connect(https, Some("a.test"), &h13()).await;
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(
        s.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(h1_request(&mut h1(s).await, "a.test", "/").await.0, 200);
    // TLS 1.2 with the suites of the published benchmarks, RSA and ECDSA.
    use rustls::crypto::aws_lc_rs::cipher_suite::*;
    for suite in [
        TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ] {
        let s = connect(
            https,
            Some("rsa.test"),
            &Opts {
                alpn: vec![b"http/1.1"],
                tls12_suite: Some(suite),
                rsa_only: false,
            },
        )
        .await;
        assert_eq!(
            s.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
        assert_eq!(s.get_ref().1.negotiated_cipher_suite(), Some(suite));
        assert_eq!(h1_request(&mut h1(s).await, "rsa.test", "/").await.0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecdsa_certificates_offer_the_ecdhe_ecdsa_suites() {
    let (r, _a) = setup(vec![
        tls_secret("ec-cert", EC_CRT, EC_KEY),
        tls_ingress("e", "ec.test", "ec-cert", "svc", &[]),
    ])
    .await;
    use rustls::crypto::aws_lc_rs::cipher_suite::*;
    for suite in [
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ] {
        let s = connect(
            r.https_addr.unwrap(),
            Some("ec.test"),
            &Opts {
                alpn: vec![],
                tls12_suite: Some(suite),
                rsa_only: false,
            },
        )
        .await;
        assert_eq!(s.get_ref().1.negotiated_cipher_suite(), Some(suite));
    }
}

/// Two Secrets for one host on one Ingress (RSA and ECDSA): ECDSA for clients that can verify
/// it, RSA for the rest, as nginx with two `ssl_certificate` lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_serves_ecdsa_and_rsa_by_what_the_client_offers() {
    let dual = tls_ingress("d", "dual.test", "rsa-cert", "svc", &[]).replace(
        "    secretName: rsa-cert\n",
        "    secretName: rsa-cert\n  - hosts: [\"dual.test\"]\n    secretName: ec-cert\n",
    );
    let (r, _a) = setup(vec![
        tls_secret("rsa-cert", RSA_PKCS1_CRT, RSA_PKCS1_KEY),
        tls_secret("ec-cert", EC_CRT, EC_KEY),
        dual,
    ])
    .await;
    assert!(r.dp.tls_problems().is_empty(), "{:?}", r.dp.tls_problems());
    let https = r.https_addr.unwrap();
    let (rsa, ec) = (pem_serial(RSA_PKCS1_CRT), pem_serial(EC_CRT));
    use rustls::crypto::aws_lc_rs::cipher_suite::*;
    let cases = [
        ("TLS 1.3, ECDSA offered", h13(), &ec),
        (
            "TLS 1.3, RSA only",
            Opts {
                rsa_only: true,
                ..h13()
            },
            &rsa,
        ),
        (
            "TLS 1.2, ECDHE-ECDSA suite",
            Opts {
                alpn: vec![],
                tls12_suite: Some(TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
                rsa_only: false,
            },
            &ec,
        ),
        (
            "TLS 1.2, ECDHE-RSA suite only",
            Opts {
                alpn: vec![],
                tls12_suite: Some(TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
                rsa_only: false,
            },
            &rsa,
        ),
    ];
    for (what, opts, want) in cases {
        let s = connect(https, Some("dual.test"), &opts).await;
        assert_eq!(&serial(&s), want, "{what}");
        let (status, _, _) = h1_request(&mut h1(s).await, "dual.test", "/").await;
        assert_eq!(status, 200, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_key_is_rejected_with_a_clear_problem() {
    let (crt, _) = self_signed(&["a.test"]);
    let (_, other_key) = self_signed(&["b.test"]);
    let (r, _a) = setup(vec![
        tls_secret("bad", &crt, &other_key),
        tls_ingress("a", "a.test", "bad", "svc", &[]),
    ])
    .await;
    let problems = r.dp.tls_problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].secret.name, "bad");
    assert!(
        problems[0].message.contains("does not match"),
        "{}",
        problems[0].message
    );
    // The host still gets a handshake (with the default certificate) and keeps routing.
    let s = connect(r.https_addr.unwrap(), Some("a.test"), &h13()).await;
    assert_eq!(first_san(&s), "sluice.invalid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_old_connections_and_last_good_certificate() {
    let (crt1, key1) = self_signed(&["a.test"]);
    let (crt2, key2) = self_signed(&["a.test"]);
    let a = backend("a").await;
    let r = data_plane(&[]).await;
    let https = r.https_addr.unwrap();
    let with = |crt: &str, key: &str| {
        let mut d = one_service("plain.test", "svc", &[a.addr]);
        d.extend([
            tls_secret("a-cert", crt, key),
            tls_ingress("a", "a.test", "a-cert", "svc", &[]),
        ]);
        snapshot(&d)
    };
    r.dp.apply(with(&crt1, &key1));
    let before = connect(https, Some("a.test"), &h13()).await;
    let old_serial = serial(&before);
    let mut old_conn = h1(before).await;
    assert_eq!(h1_request(&mut old_conn, "a.test", "/").await.0, 200);

    r.dp.apply(with(&crt2, &key2));
    let after = connect(https, Some("a.test"), &h13()).await;
    let new_serial = serial(&after);
    assert_ne!(
        old_serial, new_serial,
        "a new handshake sees the new certificate"
    );
    assert_eq!(
        h1_request(&mut old_conn, "a.test", "/").await.0,
        200,
        "the connection opened before the swap keeps working"
    );

    // An invalid replacement keeps the last good certificate and reports the problem.
    r.dp.apply(with(&crt1, &key2));
    assert_eq!(
        serial(&connect(https, Some("a.test"), &h13()).await),
        new_serial
    );
    assert!(!r.dp.tls_problems().is_empty());
    let status = sluice_proxy::admin::status(&r.dp);
    assert!(
        status.problems.iter().any(|p| p.contains("does not match")),
        "{:?}",
        status.problems
    );
    let metrics = r.dp.metrics.render();
    assert!(
        metrics.contains("sluice_tls_certificate_expiry_seconds{host=\"a.test\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("serial=\"{}\"", new_serial.replace(':', ""))),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_redirects_to_https_and_hsts() {
    let (crt, key) = self_signed(&["a.test", "b.test"]);
    let (r, _a) = setup(vec![
        tls_secret("cert", &crt, &key),
        tls_ingress(
            "a",
            "a.test",
            "cert",
            "svc",
            &[("sluice.dev/hsts", "max-age=600; includeSubDomains")],
        ),
        tls_ingress(
            "b",
            "b.test",
            "cert",
            "svc",
            &[("nginx.ingress.kubernetes.io/ssl-redirect", "false")],
        ),
    ])
    .await;
    let (http, https) = (r.http_addr.unwrap(), r.https_addr.unwrap());
    let c = client();
    let g = get(&c, http, "a.test", "/path?q=1").await.unwrap();
    assert_eq!(g.status, 308);
    assert_eq!(
        g.headers.get("location").unwrap().to_str().unwrap(),
        format!("https://a.test:{}/path?q=1", https.port())
    );
    assert_eq!(
        get(&c, http, "b.test", "/").await.unwrap().status,
        200,
        "redirect disabled by annotation"
    );
    assert_eq!(
        get(&c, http, "plain.test", "/").await.unwrap().status,
        200,
        "hosts without TLS are not redirected"
    );
    let (status, headers, _) = h1_request(
        &mut h1(connect(https, Some("a.test"), &h13()).await).await,
        "a.test",
        "/",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("strict-transport-security").unwrap(),
        "max-age=600; includeSubDomains"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream() {
    sluice_proxy::crypto::install_default_provider();
    // A backend that speaks only TLS.
    let (crt, key) = self_signed(&["pod.local"]);
    let cert = sluice_proxy::state::certs::load_pem(crt.as_bytes(), key.as_bytes()).unwrap();
    let store = Arc::new(arc_swap_store(cert));
    let cfg = sluice_proxy::server::tls::server_config(
        store,
        &sluice_proxy::server::tls::TlsOptions {
            http2: false,
            session_resumption: false,
        },
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|_req| async {
                    let mut r = http::Response::new(http_body_util::Full::new(Bytes::from_static(
                        b"secure",
                    )));
                    r.headers_mut()
                        .insert("x-backend", http::HeaderValue::from_static("tls-pod"));
                    Ok::<_, std::convert::Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    let r = data_plane(&[]).await;
    let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: secure\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n    appProtocol: https\n".to_string();
    r.dp.apply(snapshot(&[
        ingress_class(),
        svc,
        endpoint_slices("secure", &[addr]),
        ingress("s", "s.test", &[("/", "Prefix", "secure")]),
    ]));
    let g = get(&client(), r.http_addr.unwrap(), "s.test", "/")
        .await
        .unwrap();
    assert_eq!((g.status.as_u16(), g.backend()), (200, Some("tls-pod")));
    assert_eq!(g.text(), "secure");
}

fn arc_swap_store(
    cert: sluice_proxy::state::certs::LoadedCert,
) -> arc_swap::ArcSwap<sluice_proxy::state::certs::CertStore> {
    arc_swap::ArcSwap::from_pointee(sluice_proxy::state::certs::CertStore::new(cert))
}

/// `--proxy-protocol` on the TLS listener: the PROXY header comes before the ClientHello, and
/// the client it names is the one the backend is told about, over HTTP/1.1 (the fast path) and
/// HTTP/2 (hyper); a connection whose first bytes are a ClientHello instead is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_protocol_header_precedes_the_tls_handshake() {
    let a = backend("a").await;
    let r = data_plane(&["--proxy-protocol"]).await;
    let (crt, key) = self_signed(&["pp.test"]);
    let mut docs = one_service("plain.test", "svc", &[a.addr]);
    docs.push(tls_secret("pp-cert", &crt, &key));
    docs.push(tls_ingress("pp", "pp.test", "pp-cert", "svc", &[]));
    r.dp.apply(snapshot(&docs));
    let https = r.https_addr.unwrap();
    let via_proxy = |alpn: &'static [u8]| async move {
        let mut tcp = TcpStream::connect(https).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut tcp,
            b"PROXY TCP4 203.0.113.9 10.0.0.1 40000 443\r\n",
        )
        .await
        .unwrap();
        let o = Opts {
            alpn: vec![alpn],
            ..h13()
        };
        tokio_rustls::TlsConnector::from(client_config(&o))
            .connect(ServerName::try_from("pp.test").unwrap(), tcp)
            .await
            .unwrap()
    };
    let (status, _, body) = h1_request(
        &mut h1(via_proxy(b"http/1.1").await).await,
        "pp.test",
        "/echo",
    )
    .await;
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200);
    assert!(
        body.lines().any(|l| l == "x-forwarded-for=203.0.113.9"),
        "{body}"
    );
    assert!(
        body.lines().any(|l| l == "x-forwarded-proto=https"),
        "{body}"
    );

    let resp = h2_get(via_proxy(b"h2").await, "https://pp.test/echo").await;
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    assert!(
        body.lines().any(|l| l == "x-forwarded-for=203.0.113.9"),
        "{body}"
    );

    // No header: the ClientHello is not a PROXY header, and the handshake fails.
    let tcp = TcpStream::connect(https).await.unwrap();
    let refused = tokio_rustls::TlsConnector::from(client_config(&h13()))
        .connect(ServerName::try_from("pp.test").unwrap(), tcp)
        .await;
    assert!(refused.is_err());
}
