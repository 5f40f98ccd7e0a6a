//! The proxies compared, each started by the benchmark on loopback in its own temporary
//! directory, with the same backends, worker count, CPU pinning, timeouts, backlog and upstream
//! keep-alive, and each changed the way its ingress controller changes it.

mod caddy;
pub mod floor;
mod haproxy;
mod nginx;
pub mod proc;
pub mod sluice;
pub mod sluice_api;
pub mod traefik;
mod upgrade;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::certs::Cert;
use crate::load::{self, TlsSpec, TlsVersion, Verify};
pub use nginx::{args as nginx_args, open_for_workers as nginx_open_dir};
use proc::Proc;

/// Host name every peer routes (Host header and SNI).
pub const HOST: &str = "bench.local";
/// Listen backlog declared for every peer that lets us set it.
pub const BACKLOG: u32 = 4096;
/// Proxy → backend connect timeout, for every peer.
pub const CONNECT_TIMEOUT_S: u64 = 2;
/// Proxy → backend response timeout, for every peer.
pub const READ_TIMEOUT_S: u64 = 60;
/// Client keep-alive idle timeout, for every peer.
pub const CLIENT_IDLE_S: u64 = 75;
/// Tries per request when connecting to a backend fails (first try included).
pub const TRIES: u32 = 3;
/// Idle upstream keep-alive connections kept per worker where a peer needs a number.
pub const UPSTREAM_KEEPALIVE: u32 = 320;

/// A peer's name on the command line and in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum PeerKind {
    /// sluice serve, changed through its manifest files.
    Sluice,
    /// nginx, upstream block rewritten + `nginx -s reload`.
    NginxReload,
    /// nginx + balancer_by_lua, endpoint list posted to a Lua endpoint (ingress-nginx's way).
    NginxLua,
    /// HAProxy master-worker, config rewritten + reload (USR2).
    HaproxyReload,
    /// HAProxy, server slots changed through the runtime API.
    HaproxyRuntime,
    /// Caddy, config swapped through the admin API (`POST /load`).
    Caddy,
    /// Traefik v3 (built from Go modules), its file provider watching a rewritten file.
    Traefik,
    /// No proxy: load straight at one backend (the ceiling).
    Direct,
    /// sluice controller against a real kube-apiserver, changed through EndpointSlices written
    /// to the API (`--source api`, which puts it in place of `sluice`).
    SluiceApi,
    /// Traefik's Kubernetes Ingress provider against the same API server (`--source api`, in
    /// place of `traefik`).
    TraefikApi,
    /// No proxy: sluice-bench's own TLS server answers every request itself, the least any
    /// TLS server pays per request on this host (named explicitly; not part of `all`).
    Floor,
}

impl PeerKind {
    /// Every peer, in report order.
    pub const ALL: [PeerKind; 8] = [
        PeerKind::Sluice,
        PeerKind::NginxReload,
        PeerKind::NginxLua,
        PeerKind::HaproxyReload,
        PeerKind::HaproxyRuntime,
        PeerKind::Caddy,
        PeerKind::Traefik,
        PeerKind::Direct,
    ];

    /// Command-line / report name.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Sluice => "sluice",
            PeerKind::NginxReload => "nginx-reload",
            PeerKind::NginxLua => "nginx-lua",
            PeerKind::HaproxyReload => "haproxy-reload",
            PeerKind::HaproxyRuntime => "haproxy-runtime",
            PeerKind::Caddy => "caddy",
            PeerKind::Traefik => "traefik",
            PeerKind::Direct => "direct",
            PeerKind::SluiceApi => "sluice-api",
            PeerKind::TraefikApi => "traefik-api",
            PeerKind::Floor => "floor",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([PeerKind::SluiceApi, PeerKind::TraefikApi, PeerKind::Floor])
            .find(|k| k.name() == s)
    }

    /// `None` when the peer can run here, else why not.
    pub fn unavailable(self, env: &PeerEnv) -> Option<String> {
        match self {
            PeerKind::Sluice => (!env.sluice_bin.exists()).then(|| {
                format!(
                    "sluice binary not found at {} (cargo build --release -p sluice, or --sluice-bin)",
                    env.sluice_bin.display()
                )
            }),
            PeerKind::NginxReload => nginx::unavailable(false),
            PeerKind::NginxLua => nginx::unavailable(true),
            PeerKind::HaproxyReload | PeerKind::HaproxyRuntime => haproxy::unavailable(),
            PeerKind::Caddy => caddy::unavailable(),
            PeerKind::Traefik => traefik::unavailable(env),
            PeerKind::Direct => None,
            PeerKind::Floor => env
                .http2
                .then(|| "floor speaks HTTP/1.1 only (no ALPN h2)".to_string()),
            PeerKind::SluiceApi => sluice_api::unavailable(env, sluice_api::Controller::Sluice),
            PeerKind::TraefikApi => sluice_api::unavailable(env, sluice_api::Controller::Traefik),
        }
    }
}

/// Plain HTTP or HTTPS between client and proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Proto {
    /// HTTP/1.1 over TCP.
    Http,
    /// HTTP/1.1 over TLS.
    Https,
}

/// What every peer is started with.
#[derive(Debug, Clone)]
pub struct PeerEnv {
    /// Client-side protocol.
    pub proto: Proto,
    /// The certificate served.
    pub cert: Arc<Cert>,
    /// CPU list the proxy is pinned to (taskset), if pinning.
    pub cpus: Option<String>,
    /// Worker processes/threads.
    pub workers: usize,
    /// The sluice binary.
    pub sluice_bin: PathBuf,
    /// sluice's `--log-level` (warn; debug to see every retry).
    pub sluice_log_level: String,
    /// Where each peer's own log files are copied when it stops.
    pub log_dir: Option<PathBuf>,
    /// The test kube-apiserver (`--source api`).
    pub kube_apiserver: PathBuf,
    /// Ingresses in the API server (`--source api`; each with its Service and slice).
    pub api_ingresses: usize,
    /// HTTP/2 offered on the TLS listener (ALPN `h2`) besides HTTP/1.1: the abuse scenario's
    /// HTTP/2 attacks need it; the other scenarios compare HTTP/1.1 only.
    pub http2: bool,
    /// Response body size of the run (the `floor` peer answers with it; proxies get it from
    /// the backends).
    pub body_size: usize,
    /// sluice also serves `mtls.bench.local`, a host that asks for client certificates (the
    /// abuse scenario's `cert-subject` attack); off elsewhere, since a host with client
    /// certificates makes sluice read every ClientHello first.
    pub client_cert_host: bool,
    /// sluice runs with `--handover` (the upgrade scenario replaces it that way).
    pub handover: bool,
    /// HAProxy's stats socket has `expose-fd listeners` (its seamless reload); the upgrade
    /// scenario also runs it without.
    pub haproxy_expose_fd: bool,
    /// Client connections the peer must hold at once, when more than the other scenarios'
    /// limits (nginx 8,192 per worker, HAProxy 8,000, sluice 50,000): the idle scenario's.
    pub max_connections: Option<usize>,
    /// More `sluice serve` flags (the soak's `--configmap`).
    pub sluice_extra_args: Vec<String>,
}

/// Starting or changing a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The process did not start.
    #[error(transparent)]
    Spawn(#[from] proc::SpawnError),
    /// File I/O in its directory.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// It started but never answered through the proxy.
    #[error("{0}")]
    NotReady(String),
    /// A configuration change was refused.
    #[error("change failed: {0}")]
    Change(String),
}

/// Per-peer state.
#[derive(Debug)]
enum State {
    Sluice(sluice::Sluice),
    SluiceApi(Box<sluice_api::SluiceApi>),
    Nginx(nginx::Nginx),
    Haproxy(haproxy::Haproxy),
    Caddy(caddy::Caddy),
    Traefik(traefik::Traefik),
    Direct,
    Floor,
}

/// A running peer.
#[derive(Debug)]
pub struct Peer {
    /// Which peer.
    pub kind: PeerKind,
    /// Where the load goes.
    pub target: SocketAddr,
    /// Client protocol actually used (direct is always plain HTTP).
    pub proto: Proto,
    /// Settings that differ from the peer's defaults or matter for the comparison.
    pub settings: BTreeMap<String, String>,
    /// Configuration changes applied so far.
    pub changes: u64,
    proc: Option<Proc>,
    state: State,
    log_dir: Option<PathBuf>,
    dir: tempfile::TempDir,
}

/// A free loopback port (bound and released; the race with other binders is negligible here).
pub fn free_port() -> Result<u16, PeerError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| PeerError::Io("free port".into(), e))
}

fn write(path: &std::path::Path, content: &str) -> Result<(), PeerError> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| PeerError::Io(path.display().to_string(), e))
}

impl Peer {
    /// Starts `kind` routing to `endpoints` and waits until it answers through to a backend.
    pub async fn start(
        kind: PeerKind,
        env: &PeerEnv,
        endpoints: &[SocketAddr],
    ) -> Result<Self, PeerError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("sluice-bench-{}-", kind.name()))
            .tempdir()
            .map_err(|e| PeerError::Io("temp dir".into(), e))?;
        let port = free_port()?;
        let target = SocketAddr::from(([127, 0, 0, 1], port));
        let d = dir.path();
        let (proc, state, settings) = match kind {
            PeerKind::Sluice => sluice::start(env, d, port, endpoints).await?,
            PeerKind::SluiceApi => {
                let how = (env.api_ingresses, sluice_api::Controller::Sluice);
                sluice_api::start(env, d, port, endpoints, how).await?
            }
            PeerKind::TraefikApi => {
                let how = (env.api_ingresses, sluice_api::Controller::Traefik);
                sluice_api::start(env, d, port, endpoints, how).await?
            }
            PeerKind::NginxReload | PeerKind::NginxLua => {
                nginx::start(env, d, port, endpoints, kind == PeerKind::NginxLua).await?
            }
            PeerKind::HaproxyReload | PeerKind::HaproxyRuntime => {
                haproxy::start(env, d, port, endpoints, kind == PeerKind::HaproxyRuntime).await?
            }
            PeerKind::Caddy => caddy::start(env, d, port, endpoints).await?,
            PeerKind::Traefik => traefik::start(env, d, port, endpoints).await?,
            PeerKind::Floor => floor::start(env, d, port, env.body_size).await?,
            PeerKind::Direct => {
                let mut s = BTreeMap::new();
                s.insert(
                    "proxy".into(),
                    "none: load straight at one backend, plain HTTP, no changes".into(),
                );
                (None, State::Direct, s)
            }
        };
        let (target, proto) = match kind {
            PeerKind::Direct => (
                *endpoints
                    .first()
                    .ok_or_else(|| PeerError::NotReady("no backend".into()))?,
                Proto::Http,
            ),
            _ => (target, env.proto),
        };
        let mut peer = Self {
            kind,
            target,
            proto,
            settings,
            changes: 0,
            proc,
            state,
            log_dir: env.log_dir.clone(),
            dir,
        };
        if let Err(e) = peer.wait_ready(Duration::from_secs(20)).await {
            peer.stop().await;
            return Err(e);
        }
        Ok(peer)
    }

    /// sluice's manifest directory and admin address (the soak rewrites Ingresses, Secrets and
    /// its ConfigMap there); `None` for every other peer.
    pub fn sluice_files(&self) -> Option<(&std::path::Path, SocketAddr)> {
        match &self.state {
            State::Sluice(s) => Some((s.manifests.as_path(), s.admin)),
            _ => None,
        }
    }

    /// The main process id (None for direct).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.pid)
    }

    /// TLS settings a client needs for this peer (None for plain HTTP).
    pub fn tls(&self, version: TlsVersion, resumption: bool) -> Option<TlsSpec> {
        (self.proto == Proto::Https).then(|| TlsSpec {
            version,
            verify: Verify::Insecure,
            resumption,
            server_name: HOST.into(),
        })
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<(), PeerError> {
        let end = Instant::now() + within;
        let tls = self.tls(TlsVersion::Any, false);
        let mut last = String::from("no answer");
        while Instant::now() < end {
            if let Some(p) = self.proc.as_mut()
                && let Some(st) = p.exited()
            {
                return Err(PeerError::NotReady(format!(
                    "{} exited ({st}) at start:\n{}",
                    self.kind.name(),
                    p.log_tail()
                )));
            }
            match load::probe(self.target, HOST, "/", tls.as_ref(), Duration::from_secs(2)).await {
                Ok(r) if r.status == 200 && r.backend.as_str().is_some() => return Ok(()),
                Ok(r) => last = format!("status {}", r.status),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(PeerError::NotReady(format!(
            "{} did not answer 200 from a backend within {within:?} (last: {last}); log:\n{}",
            self.kind.name(),
            self.proc.as_ref().map(Proc::log_tail).unwrap_or_default()
        )))
    }

    /// Applies a new endpoint list the way this peer's controller would. Returns once the
    /// change has been handed over (file written, reload signalled, API answered); see
    /// [`Peer::applied`] for when it took effect.
    pub async fn set_endpoints(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        match &mut self.state {
            State::Sluice(s) => s.set(eps)?,
            State::SluiceApi(s) => s.set(eps).await?,
            State::Nginx(n) => n.set(eps).await?,
            State::Haproxy(h) => h.set(eps).await?,
            State::Caddy(c) => c.set(eps).await?,
            State::Traefik(t) => t.set(eps)?,
            State::Direct | State::Floor => return Ok(()),
        }
        self.changes += 1;
        Ok(())
    }

    /// Waits (up to `within`) until the peer reports `eps` as its endpoints, where it can tell
    /// (sluice's admin API; synchronous APIs are applied on return). `None`: cannot tell.
    pub async fn applied(&self, eps: &[SocketAddr], within: Duration) -> Option<bool> {
        match &self.state {
            State::Sluice(s) => Some(s.wait_applied(eps, within).await),
            State::SluiceApi(s) => Some(s.wait_applied(eps, within).await),
            State::Haproxy(h) if h.runtime => Some(true),
            State::Caddy(_) => Some(true),
            State::Traefik(t) => Some(t.wait_applied(eps, within).await),
            _ => None,
        }
    }

    /// Stops the peer and every process it started, then keeps its log files (if a log
    /// directory was given) as `<peer>-<pid>-<file>`.
    pub async fn stop(mut self) {
        let pid = self.pid().unwrap_or(0);
        if let Some(p) = self.proc.take() {
            p.stop(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(3))
                .await;
        }
        if let State::SluiceApi(s) = std::mem::replace(&mut self.state, State::Direct) {
            s.stop().await;
        }
        let (Some(to), Ok(rd)) = (&self.log_dir, std::fs::read_dir(self.dir.path())) else {
            return;
        };
        let _ = std::fs::create_dir_all(to);
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".log") {
                let _ = std::fs::copy(
                    e.path(),
                    to.join(format!("{}-{pid}-{name}", self.kind.name())),
                );
            }
        }
    }
}

/// Sends one HTTP/1.1 request with `Connection: close` and reads the whole answer: for admin
/// APIs (sluice, Caddy, the nginx-lua endpoint). Returns status and body.
pub async fn admin_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let io = async {
        let mut s = TcpStream::connect(addr).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .map_err(|_| format!("{addr}{path}: timed out"))?
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: no status line"))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n =
            usize::from_str_radix(size.split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
