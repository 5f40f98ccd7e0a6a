//! Shared helpers for sluice's end-to-end tests: pod-like backends, manifest writers, an
//! in-process `sluice serve`, and a small HTTP client. Everything runs on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
pub use sluice::serve::Serving;
use sluice_bench::backend::{Backend, BackendConfig};

/// Starts a backend named `name` on a free loopback port.
pub async fn backend(name: &str) -> Backend {
    backend_at(name, "127.0.0.1:0".parse().unwrap()).await
}

/// A test backend answering with its name, listening on `addr`.
pub async fn backend_at(name: &str, addr: SocketAddr) -> Backend {
    Backend::start(
        addr,
        BackendConfig {
            name: name.to_string(),
            body_size: 1024,
            http2: true,
            delay: std::time::Duration::ZERO,
        },
    )
    .await
    .unwrap()
}

/// Writes a file atomically (write + rename), as a careful user or a controller would.
pub fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// YAML for the `sluice` IngressClass.
pub fn ingress_class() -> String {
    "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: sluice\nspec:\n  controller: sluice.dev/ingress-controller\n".to_string()
}

/// YAML for an Ingress with one rule of `(path, pathType, service)` entries.
pub fn ingress(name: &str, host: &str, paths: &[(&str, &str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ingressClassName: sluice\n  rules:\n  - host: \"{host}\"\n    http:\n      paths:\n"
    );
    for (p, t, svc) in paths {
        let _ = write!(
            s,
            "      - path: {p}\n        pathType: {t}\n        backend:\n          service:\n            name: {svc}\n            port:\n              number: 80\n"
        );
    }
    s
}

/// YAML for an Ingress like [`ingress`] with these annotations (written as given, keys in
/// full).
pub fn annotated_ingress(
    name: &str,
    host: &str,
    paths: &[(&str, &str, &str)],
    annotations: &[(&str, &str)],
) -> String {
    let mut block = String::from("  annotations:\n");
    for (k, v) in annotations {
        let _ = writeln!(block, "    {k}: {}", serde_json::to_string(v).unwrap());
    }
    ingress(name, host, paths).replacen(
        "  namespace: default\n",
        &format!("  namespace: default\n{block}"),
        1,
    )
}

/// YAML for an Ingress `name` on host `NAME.test` sending `/` to Service `svc`, with these
/// ingress-nginx annotations (names without the `nginx.ingress.kubernetes.io/` prefix).
pub fn nginx_ingress(name: &str, svc: &str, annotations: &[(&str, &str)]) -> String {
    let keys: Vec<(String, String)> = annotations
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
        .collect();
    let ann: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    annotated_ingress(name, &format!("{name}.test"), &[("/", "Prefix", svc)], &ann)
}

/// YAML for the controller ConfigMap `default/sluice` (serve it with `--configmap
/// default/sluice`) with this `data` block (indented key lines).
pub fn controller_configmap(data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sluice\n  namespace: default\ndata:\n{data}"
    )
}

/// YAML for an Opaque Secret with these `stringData` keys.
pub fn opaque_secret(name: &str, data: &[(&str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\ntype: Opaque\nstringData:\n"
    );
    for (k, v) in data {
        let _ = writeln!(s, "  {k}: {}", serde_json::to_string(v).unwrap());
    }
    s
}

/// YAML for a Service with port 80 named `http`.
pub fn service(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n"
    )
}

/// YAML for an EndpointSlice of `svc` with these ready addresses (all on 127.0.0.1, one port
/// each: every address gets its own slice so ports may differ).
pub fn endpoint_slices(svc: &str, addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-{i}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {svc}\naddressType: IPv4\nports:\n- name: http\n  port: {}\nendpoints:\n- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n", a.port(), a.ip())
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// A temporary manifest directory.
#[derive(Debug)]
pub struct Manifests {
    /// Keeps the directory alive.
    pub dir: tempfile::TempDir,
}

impl Manifests {
    /// A new empty directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Path of a file in it.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes (atomically) a file in it.
    pub fn write(&self, name: &str, content: &str) {
        write_atomic(&self.path(name), content);
    }
}

impl Default for Manifests {
    fn default() -> Self {
        Self::new()
    }
}

/// Starts `sluice serve` in-process on free loopback ports with extra flags.
pub async fn serve(dir: &Path, extra: &[&str]) -> Serving {
    let mut argv: Vec<String> = [
        "sluice",
        "serve",
        "--manifests",
        dir.to_str().unwrap(),
        "--http-listen",
        "127.0.0.1:0",
        "--https-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cli = sluice::cli::Cli::try_parse_from(argv).unwrap();
    let sluice::cli::Command::Serve(args) = cli.command else {
        panic!("not serve")
    };
    sluice::serve::start(&args).await.unwrap()
}

/// A keep-alive HTTP/1.1 client.
pub fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http()
}

/// A response, fully read.
#[derive(Debug)]
pub struct Got {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Got {
    /// The `x-backend` header.
    pub fn backend(&self) -> Option<&str> {
        self.headers.get("x-backend").and_then(|v| v.to_str().ok())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// GET `path` on `addr` with a Host header.
pub async fn get(
    c: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> anyhow::Result<Got> {
    let req = Request::get(format!("http://{addr}{path}"))
        .header("host", host)
        .body(Empty::new())?;
    let resp = c.request(req).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Got {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// A body-less request with a Host and these fields, sent on [`client`], fully read.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("host", host);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = client()
        .request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// The admin API's `/api/v1/status` of a `sluice serve` (its problem list among it), as text.
pub async fn status_text(s: &Serving) -> String {
    get(
        &client(),
        s.running.admin_addr,
        "localhost",
        "/api/v1/status",
    )
    .await
    .unwrap()
    .text()
}

/// Writes `host` served over HTTPS (a self-signed certificate) and plain HTTP, not redirected,
/// by the Service `web` with `backend` as its one endpoint.
pub fn tls_site(m: &Manifests, host: &str, backend: SocketAddr) {
    let (crt, key) = self_signed(&[host]);
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("web"));
    m.write("eps.yaml", &endpoint_slices("web", &[backend]));
    m.write("secret.yaml", &tls_secret("cert", &crt, &key));
    // Plain HTTP is served too (a TLS Ingress redirects it by default).
    let no_redirect = [("nginx.ingress.kubernetes.io/ssl-redirect", "false")];
    m.write(
        "ing.yaml",
        &tls_ingress("web", host, "cert", "web", &no_redirect),
    );
}

/// `sluice_connections_active` from the admin listener's `/metrics`.
pub async fn active_connections(admin: SocketAddr) -> u64 {
    let r = get(&client(), admin, "localhost", "/metrics")
        .await
        .unwrap();
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix("sluice_connections_active "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Writes a raw request and returns the status line of the answer.
pub async fn raw_status(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    text.lines().next().unwrap_or_default().to_string()
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Builds a snapshot from YAML documents the way `serve` does.
pub fn snapshot(yamls: &[String]) -> sluice_config::Snapshot {
    let mut w = sluice_config::World::new();
    for (i, y) in yamls.iter().enumerate() {
        for o in sluice::serve::yaml::parse(Path::new(&format!("doc{i}.yaml")), y)
            .unwrap()
            .objects
        {
            w.put(o);
        }
    }
    sluice_config::translate(&w, &sluice_config::TranslateOptions::default())
}

/// Starts the data plane and listeners with no provider: tests apply snapshots themselves.
pub async fn data_plane(extra: &[&str]) -> sluice::app::Running {
    let mut argv: Vec<String> = [
        "sluice",
        "serve",
        "--manifests",
        "/nonexistent",
        "--http-listen",
        "127.0.0.1:0",
        "--https-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cli = sluice::cli::Cli::try_parse_from(argv).unwrap();
    let sluice::cli::Command::Serve(args) = cli.command else {
        panic!("not serve")
    };
    sluice::app::Running::start(&args.common, sluice::serve::DEFAULTS, None)
        .await
        .unwrap()
}

/// The usual objects for one host routed to one service with these backends.
pub fn one_service(host: &str, svc: &str, addrs: &[SocketAddr]) -> Vec<String> {
    vec![
        ingress_class(),
        service(svc),
        endpoint_slices(svc, addrs),
        ingress(&format!("ing-{svc}"), host, &[("/", "Prefix", svc)]),
    ]
}

/// Steady keep-alive load from several workers; counts every outcome.
#[derive(Debug)]
pub struct Load {
    stop: tokio::sync::watch::Sender<bool>,
    workers: Vec<tokio::task::JoinHandle<LoadStats>>,
}

/// What a load run saw.
#[derive(Debug, Default)]
pub struct LoadStats {
    /// 2xx responses.
    pub ok: u64,
    /// Everything else, described.
    pub failures: Vec<String>,
    /// Responses per backend name.
    pub by_backend: std::collections::BTreeMap<String, u64>,
}

impl Load {
    /// Starts `workers` loops of GET requests with `pause` between requests.
    pub fn start(addr: SocketAddr, host: &str, workers: usize, pause: Duration) -> Self {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let workers = (0..workers)
            .map(|_| {
                let rx = rx.clone();
                let host = host.to_string();
                tokio::spawn(async move {
                    let c = client();
                    let mut st = LoadStats::default();
                    while !*rx.borrow() {
                        match get(&c, addr, &host, "/").await {
                            Ok(r) if r.status.is_success() => {
                                st.ok += 1;
                                *st.by_backend
                                    .entry(r.backend().unwrap_or("?").to_string())
                                    .or_default() += 1;
                            }
                            Ok(r) => st.failures.push(format!(
                                "status {}: {}",
                                r.status,
                                r.text().trim()
                            )),
                            Err(e) => st.failures.push(format!("error: {e:#}")),
                        }
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                    st
                })
            })
            .collect();
        Self { stop, workers }
    }

    /// Stops the workers and adds up what they saw.
    pub async fn finish(self) -> LoadStats {
        let _ = self.stop.send(true);
        let mut total = LoadStats::default();
        for w in self.workers {
            let st = w.await.unwrap();
            total.ok += st.ok;
            total.failures.extend(st.failures);
            for (k, v) in st.by_backend {
                *total.by_backend.entry(k).or_default() += v;
            }
        }
        total
    }
}

/// YAML for a `kubernetes.io/tls` Secret.
pub fn tls_secret(name: &str, cert_pem: &str, key_pem: &str) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(cert_pem),
        indent(key_pem)
    )
}

/// YAML for an Ingress with TLS for `host` from `secret` and extra annotations.
pub fn tls_ingress(
    name: &str,
    host: &str,
    secret: &str,
    svc: &str,
    annotations: &[(&str, &str)],
) -> String {
    let mut ann = String::new();
    if !annotations.is_empty() {
        ann.push_str("  annotations:\n");
        for (k, v) in annotations {
            let _ = writeln!(ann, "    {k}: \"{v}\"");
        }
    }
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: default\n{ann}spec:\n  ingressClassName: sluice\n  tls:\n  - hosts: [\"{host}\"]\n    secretName: {secret}\n  rules:\n  - host: \"{host}\"\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: {svc}\n            port:\n              number: 80\n"
    )
}

/// A self-signed certificate and PKCS#8 key (PEM) for these names.
pub fn self_signed(names: &[&str]) -> (String, String) {
    let ck =
        rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    (ck.cert.pem(), ck.signing_key.serialize_pem())
}
pub mod apis;
pub mod cdp;
pub mod echo;
pub mod fake_api;
pub mod mtls;
pub mod real_api;

/// The EndpointSlice `svc-I-abc` of Service `svc-I` with these ready addresses on port 8080
/// (the scale and flood tests).
pub fn numbered_slice(i: u32, addrs: &[std::net::Ipv4Addr]) -> serde_json::Value {
    let eps: Vec<serde_json::Value> = addrs
        .iter()
        .map(|a| serde_json::json!({"addresses": [a.to_string()], "conditions": {"ready": true}}))
        .collect();
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-abc"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": eps,
    })
}

/// Fills the fake with the IngressClass and `n` Services `svc-I`, each with the EndpointSlice
/// `slice(I)` and an Ingress `ing-I` routing `hI.DOMAIN` to it (the scale and flood tests).
pub fn many_services(
    fake: &fake_api::FakeApi,
    n: u32,
    domain: &str,
    slice: impl Fn(u32) -> serde_json::Value,
) {
    for o in yaml_objects(&ingress_class()) {
        fake.apply(o);
    }
    for i in 0..n {
        fake.apply(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80}]},
        }));
        fake.apply(slice(i));
        fake.apply(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": format!("ing-{i}"), "namespace": "default"},
            "spec": {"ingressClassName": "sluice", "rules": [{"host": format!("h{i}.{domain}"), "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}}
            ]}}]},
        }));
    }
}

/// Parses multi-document YAML into JSON values (for the fake API server).
pub fn yaml_objects(yaml: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// A kube client for the fake API server.
pub fn kube_client(fake: &fake_api::FakeApi) -> kube::Client {
    let cfg = kube::Config::new(fake.url().parse().unwrap());
    kube::Client::try_from(cfg).unwrap()
}

/// Starts `sluice controller` in-process against the fake, with fast leader-election timing.
pub async fn controller(
    fake: &fake_api::FakeApi,
    identity: &str,
    extra: &[&str],
) -> sluice::kube::Controlling {
    controller_with(kube_client(fake), identity, extra).await
}

/// Starts `sluice controller` in-process with this client, with fast leader-election timing.
pub async fn controller_with(
    kube: kube::Client,
    identity: &str,
    extra: &[&str],
) -> sluice::kube::Controlling {
    let mut argv: Vec<String> = [
        "sluice",
        "controller",
        "--http-listen",
        "127.0.0.1:0",
        "--https-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--publish-status-address",
        "10.1.2.3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cli = sluice::cli::Cli::try_parse_from(argv).unwrap();
    let sluice::cli::Command::Controller(args) = cli.command else {
        panic!("not controller")
    };
    let timing = sluice::kube::leader::Timing {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    };
    sluice::kube::start(&args, kube, identity.to_string(), timing)
        .await
        .unwrap()
}

/// Serial (hex, as x509-parser prints it) of a PEM certificate.
pub fn pem_serial(pem: &str) -> String {
    let der = rustls_pem_first(pem);
    let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
    c.raw_serial_as_string()
}

fn rustls_pem_first(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Serial of the certificate a TLS server presents for `sni` (no verification).
pub async fn tls_serial(addr: SocketAddr, sni: &str) -> Option<String> {
    use std::sync::Arc;
    #[derive(Debug)]
    struct Any;
    impl rustls::client::danger::ServerCertVerifier for Any {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            sluice_proxy::crypto::provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let cfg =
        rustls::ClientConfig::builder_with_provider(Arc::new(sluice_proxy::crypto::provider()))
            .with_safe_default_protocol_versions()
            .ok()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Any))
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).ok()?;
    let s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .ok()?;
    let der = s.get_ref().1.peer_certificates()?.first()?.clone();
    let (_, c) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(c.raw_serial_as_string())
}
