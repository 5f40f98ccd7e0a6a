//! A pod that says what it was sent: its name, the request target exactly as it arrived, and
//! every field, one per line, so that a test can check what the pod behind a route sees (the
//! path a backend that decodes it would serve, whether a password reached it). It answers with
//! a fixed status, so one can stand in for a strict or a permissive auth service too. Beside
//! it, the manifests and raw requests the access tests write around such pods.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};

/// A running echo pod.
#[derive(Debug, Clone)]
pub struct Echo {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it answered to each request it was sent, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl Echo {
    /// What it answered to its last request.
    pub fn last(&self) -> Option<String> {
        self.seen.lock().ok()?.last().cloned()
    }
}

/// Starts an echo pod named `name` on a free loopback port, answering `status` (HTTP/1.1 and
/// h2c).
pub async fn start(name: &str, status: u16) -> Echo {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let name: Arc<str> = Arc::from(name);
    let status = StatusCode::from_u16(status).unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let name = Arc::clone(&name);
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let name = Arc::clone(&name);
                    let log = Arc::clone(&log);
                    async move {
                        let mut body = format!("name={name}\ntarget={}\n", req.uri());
                        for (n, v) in req.headers() {
                            body.push_str(&format!(
                                "{n}={}\n",
                                String::from_utf8_lossy(v.as_bytes())
                            ));
                        }
                        log.lock().unwrap().push(body.clone());
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        *r.status_mut() = status;
                        r.headers_mut().insert("x-backend", name.parse().unwrap());
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
            });
        }
    });
    Echo { addr, seen }
}

/// The value of `field` in an echo pod's body (`target` for the request target, `name` for
/// the pod's name, a lower-case field name otherwise).
pub fn field<'a>(body: &'a str, field: &str) -> Option<&'a str> {
    body.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix('='))
}

/// Sends `request` (raw bytes, which should ask for `Connection: close`) to `addr` and reads
/// the whole answer: status code and body (after the head).
pub async fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A raw GET with `Connection: close` and these extra header lines (each ending in CRLF):
/// status and body.
pub async fn get(addr: SocketAddr, host: &str, target: &str, extra: &str) -> (u16, String) {
    raw(
        addr,
        &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
    )
    .await
}

/// YAML for a Service named `svc` in `ns` with `addr` as its one endpoint.
pub fn service_of(svc: &str, ns: &str, addr: SocketAddr) -> String {
    [crate::service(svc), crate::endpoint_slices(svc, &[addr])]
        .join("---\n")
        .replace("namespace: default", &format!("namespace: {ns}"))
}

/// YAML for an Ingress `name` with paths `(path, type, service)` on `host`, ingress-nginx
/// annotations (names without the `nginx.ingress.kubernetes.io/` prefix), created at
/// `created` (RFC 3339; the older Ingress wins a conflict).
pub fn dated_ingress(
    name: &str,
    host: &str,
    paths: &[(&str, &str, &str)],
    ann: &[(&str, &str)],
    created: &str,
) -> String {
    let keys: Vec<(String, String)> = ann
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string()))
        .collect();
    let ann: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    crate::annotated_ingress(name, host, paths, &ann).replacen(
        "  namespace: default\n",
        &format!("  namespace: default\n  creationTimestamp: \"{created}\"\n"),
        1,
    )
}

/// Writes the IngressClass and, for each `(name, pod)`, a Service of that name in `default`
/// with the pod as its endpoint.
pub fn write_services(m: &crate::Manifests, pods: &[(&str, &Echo)]) {
    m.write("class.yaml", &crate::ingress_class());
    let svcs: Vec<String> = pods
        .iter()
        .map(|(name, pod)| service_of(name, "default", pod.addr))
        .collect();
    m.write("svc.yaml", &svcs.join("---\n"));
}

/// An HTTP/2 connection with prior knowledge (h2c) to `addr`, its connection task spawned:
/// requests go out routed on their URI's authority (`:authority`), as every HTTP/2 request is.
pub async fn h2c(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}
