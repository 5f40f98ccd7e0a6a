//! Test backends that behave like pods: fixed-size responses naming the backend, a graceful stop
//! (close the listener, finish in-flight requests, close idle keep-alive connections), a fast
//! one (every connection reset at once, in flight or idle: a server that exits without
//! draining), and a kill (the process is gone: the kernel closes every socket).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(crate) mod lean;

/// How a backend answers.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// Name put in the `x-backend` response header.
    pub name: String,
    /// Response body size in bytes (`?size=N` overrides per request).
    pub body_size: usize,
    /// Serve HTTP/2 prior knowledge too (h2c).
    pub http2: bool,
    /// Added to every answer (a slow pod); `?delay_ms=N` adds more per request.
    pub delay: Duration,
}

/// A running backend.
#[derive(Debug)]
pub struct Backend {
    /// Bound address.
    pub addr: SocketAddr,
    /// Requests answered.
    pub requests: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    reset: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The stream and a duplicate descriptor of its socket (`dup(2)`).
fn with_dup(stream: tokio::net::TcpStream) -> Option<(tokio::net::TcpStream, std::net::TcpStream)> {
    let std = stream.into_std().ok()?;
    let dup = std.try_clone().ok()?;
    let stream = tokio::net::TcpStream::from_std(std).ok()?;
    Some((stream, dup))
}

fn query_param<'a>(q: Option<&'a str>, key: &str) -> Option<&'a str> {
    q?.split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// `GET /ws` with `Upgrade`: answers 101 and echoes every byte on the upgraded connection.
fn upgrade_echo(cfg: &BackendConfig, mut req: Request<Incoming>) -> Response<Full<Bytes>> {
    let proto = req.headers().get(http::header::UPGRADE).cloned();
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(up) = on.await {
            let (mut r, mut w) = tokio::io::split(TokioIo::new(up));
            let _ = tokio::io::copy(&mut r, &mut w).await;
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut().insert(
        http::header::CONNECTION,
        HeaderValue::from_static("upgrade"),
    );
    if let Some(p) = proto {
        r.headers_mut().insert(http::header::UPGRADE, p);
    }
    if let Ok(v) = HeaderValue::from_str(&cfg.name) {
        r.headers_mut().insert("x-backend", v);
    }
    r
}

async fn answer(
    cfg: Arc<BackendConfig>,
    body: Arc<Bytes>,
    count: Arc<AtomicU64>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    count.fetch_add(1, Ordering::Relaxed);
    if req.uri().path() == "/ws" && req.headers().contains_key(http::header::UPGRADE) {
        return upgrade_echo(&cfg, req);
    }
    let q = req.uri().query();
    let extra = query_param(q, "delay_ms").and_then(|v| v.parse::<u64>().ok());
    let delay = cfg.delay + Duration::from_millis(extra.unwrap_or(0));
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let status = query_param(q, "status")
        .and_then(|v| v.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let payload = match query_param(q, "size").and_then(|v| v.parse::<usize>().ok()) {
        Some(n) => Bytes::from(vec![b'x'; n]),
        None if req.uri().path() == "/echo" => {
            // Echo the request head (and body size) as text: used by conformance tests.
            let mut s = format!(
                "method={}\npath={}\nversion={:?}\n",
                req.method(),
                req.uri(),
                req.version()
            );
            for (k, v) in req.headers() {
                s.push_str(&format!("{}={}\n", k, v.to_str().unwrap_or("?")));
            }
            let n = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            s.push_str(&format!("body-bytes={n}\n"));
            Bytes::from(s)
        }
        None => (*body).clone(),
    };
    let mut r = Response::new(Full::new(payload));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&cfg.name) {
        r.headers_mut().insert("x-backend", v);
    }
    r
}

impl Backend {
    /// Starts a backend on `addr` (port 0 picks one).
    pub async fn start(addr: SocketAddr, cfg: BackendConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Self::from_listener(listener, cfg))
    }

    /// Starts a backend on a bound listener.
    pub fn from_listener(listener: TcpListener, cfg: BackendConfig) -> Self {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let requests = Arc::new(AtomicU64::new(0));
        let (stop, mut stop_rx) = watch::channel(false);
        let (reset, mut reset_rx) = watch::channel(false);
        let count = Arc::clone(&requests);
        let body = Arc::new(Bytes::from(vec![b'x'; cfg.body_size]));
        // A pod that delays every answer always goes through hyper (the lean path answers at
        // once).
        let canned = cfg
            .delay
            .is_zero()
            .then(|| Arc::new(lean::Canned::new(&cfg.name, (*body).clone())));
        let cfg = Arc::new(cfg);
        let task = tokio::spawn(async move {
            let graceful = GracefulShutdown::new();
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).keep_alive(true);
            let builder = Arc::new(if cfg.http2 {
                builder
            } else {
                builder.http1_only()
            });
            // Connection tasks live in this set so that aborting the backend cuts them all.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                while conns.try_join_next().is_some() {}
                tokio::select! {
                    a = listener.accept() => {
                        let Ok((stream, _)) = a else { continue };
                        let _ = stream.set_nodelay(true);
                        // A second descriptor of the same socket, kept by the connection task:
                        // on a reset it sets SO_LINGER 0, so the close sends RST.
                        let Some((stream, dup)) = with_dup(stream) else { continue };
                        let mut reset_conn = reset_rx.clone();
                        let mut stop_conn = stop_rx.clone();
                        // Taken now, before any stop: a connection hyper takes over later is
                        // still told of the stop, and the stop waits for it.
                        let watcher = graceful.watcher();
                        let (cfg, body, count) = (Arc::clone(&cfg), Arc::clone(&body), Arc::clone(&count));
                        let (canned, builder) = (canned.clone(), Arc::clone(&builder));
                        conns.spawn(async move {
                            let served = async move {
                                let mut stream = stream;
                                let prefix = match canned {
                                    Some(c) => match lean::serve(&mut stream, &c, &count, &mut stop_conn).await {
                                        lean::Outcome::Closed => return,
                                        lean::Outcome::HandOver(b) => b,
                                    },
                                    None => Bytes::new(),
                                };
                                let svc = service_fn(move |req| {
                                    let (cfg, body, count) = (Arc::clone(&cfg), Arc::clone(&body), Arc::clone(&count));
                                    async move { Ok::<_, Infallible>(answer(cfg, body, count, req).await) }
                                });
                                let io = TokioIo::new(lean::Rewound::new(prefix, stream));
                                let conn = builder.serve_connection_with_upgrades(io, svc).into_owned();
                                let _ = watcher.watch(conn).await;
                            };
                            tokio::select! {
                                _ = served => {}
                                _ = async { let _ = reset_conn.wait_for(|r| *r).await; } => {
                                    let _ = socket2::SockRef::from(&dup).set_linger(Some(Duration::ZERO));
                                }
                            }
                        });
                    }
                    _ = stop_rx.changed() => break,
                    _ = async { let _ = reset_rx.wait_for(|r| *r).await; } => {
                        drop(listener);
                        while conns.join_next().await.is_some() {}
                        return;
                    }
                }
            }
            // Like a pod on SIGTERM: the listener is closed (dropped) first, then connections
            // finish their current request and close.
            drop(listener);
            let _ = tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await;
            while conns.join_next().await.is_some() {}
        });
        Self {
            addr,
            requests,
            stop,
            reset,
            task,
        }
    }

    /// Fast stop: the listener closes and every connection, in flight or idle, is reset (RST).
    pub async fn reset(self) {
        let _ = self.reset.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }

    /// Graceful stop: listener closed, in-flight requests finish, keep-alive connections close.
    pub async fn stop_graceful(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// Starts a graceful stop without waiting for it.
    pub fn begin_stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Abrupt stop: the accept loop is aborted and every connection task dropped with it is cut.
    pub fn kill(self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn start(delay: Duration) -> Backend {
        Backend::start(
            "127.0.0.1:0".parse().unwrap(),
            BackendConfig {
                name: "b".into(),
                body_size: 4,
                http2: false,
                delay,
            },
        )
        .await
        .unwrap()
    }

    /// Reads one answer with a 4-byte body: its head (the `date` value blanked) and body.
    async fn answer(s: &mut TcpStream, pending: &mut Vec<u8>) -> (String, String) {
        loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n")
                && pending.len() >= end + 8
            {
                let rest = pending.split_off(end + 8);
                let all = std::mem::replace(pending, rest);
                let head = String::from_utf8_lossy(&all[..end]).to_string();
                let head = head
                    .lines()
                    .map(|l| {
                        if l.starts_with("date: ") {
                            "date: D"
                        } else {
                            l
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                return (head, String::from_utf8_lossy(&all[end + 4..]).to_string());
            }
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early");
            pending.extend_from_slice(&buf[..n]);
        }
    }

    #[tokio::test]
    async fn the_lean_answer_is_hypers_and_hyper_takes_over_mid_connection() {
        let b = start(Duration::ZERO).await;
        let mut s = TcpStream::connect(b.addr).await.unwrap();
        let mut pending = Vec::new();
        // Lean; then `?status=200`, which only hyper answers (the same answer); then lean
        // again, now served by hyper because it owns the connection.
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let lean = answer(&mut s, &mut pending).await;
        s.write_all(b"GET /?status=200 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let hyper = answer(&mut s, &mut pending).await;
        assert_eq!(lean, hyper);
        assert_eq!(
            lean.0,
            "HTTP/1.1 200 OK\nx-backend: b\ncontent-length: 4\ndate: D"
        );
        assert_eq!(lean.1, "xxxx");
        // Pipelined, split mid-head: both answered, in order.
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHo")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(b"st: x\r\n\r\n").await.unwrap();
        assert_eq!(answer(&mut s, &mut pending).await, lean);
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_millis(300), s.read_to_end(&mut rest)).await;
        pending.extend_from_slice(&rest);
        let echo = String::from_utf8_lossy(&pending).to_string();
        assert!(echo.contains("method=GET\npath=/echo"), "{echo}");
        assert_eq!(b.requests.load(Ordering::Relaxed), 4);
        b.stop_graceful().await;
    }

    #[tokio::test]
    async fn the_lean_path_closes_on_request_and_on_a_graceful_stop() {
        let b = start(Duration::ZERO).await;
        let mut closing = TcpStream::connect(b.addr).await.unwrap();
        closing
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut all = Vec::new();
        closing.read_to_end(&mut all).await.unwrap();
        let text = String::from_utf8_lossy(&all);
        assert!(
            text.contains("connection: close\r\n") && text.ends_with("xxxx"),
            "{text}"
        );
        // An idle keep-alive connection is closed by a graceful stop, which then returns.
        let mut idle = TcpStream::connect(b.addr).await.unwrap();
        let mut pending = Vec::new();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        answer(&mut idle, &mut pending).await;
        tokio::time::timeout(Duration::from_secs(5), b.stop_graceful())
            .await
            .unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(idle.read(&mut buf).await.unwrap(), 0, "closed cleanly");
    }

    #[tokio::test]
    async fn a_fast_stop_resets_connections_in_flight_and_idle() {
        let b = Backend::start(
            "127.0.0.1:0".parse().unwrap(),
            BackendConfig {
                name: "b".into(),
                body_size: 4,
                http2: false,
                delay: Duration::ZERO,
            },
        )
        .await
        .unwrap();
        let mut idle = TcpStream::connect(b.addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        assert!(idle.read(&mut buf).await.unwrap() > 0, "answered");
        let mut busy = TcpStream::connect(b.addr).await.unwrap();
        busy.write_all(b"GET /?delay_ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let addr = b.addr;
        b.reset().await;
        for mut s in [idle, busy] {
            let e = s.read(&mut buf).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
        }
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }
}
