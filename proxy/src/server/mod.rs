//! Client-facing listeners: accept, optional TLS, HTTP/1.1 + HTTP/2 through hyper-util's auto
//! builder, and graceful shutdown (keep-alive connections close after their current request,
//! HTTP/2 connections get GOAWAY, in-flight requests finish within the deadline).

mod accepted;
pub mod close_idle;
mod ending;
pub mod fastpath;
pub mod gateway;
pub mod listener;
pub mod passthrough;
pub mod proxy_protocol;
pub mod sockets;
mod streams;
pub mod tls;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use bytes::Bytes;
use http::Request;
use hyper::body::Incoming;

use crate::handler::{ConnInfo, handle};
use crate::io::activity::{Activity, IDLE_TIMEOUT, SendDeadline, Watched};
use crate::io::coalesce::Coalesce;
use crate::io::finish::Finish;
use crate::io::prefixed::Prefixed;
use crate::policy::auth::frontend::FrontendAuth;
use crate::state::dataplane::DataPlane;
use accepted::{Accepted, Plain, Tls, connection};
use close_idle::{CloseIdle, IdleWatch};
use ending::Ending;
use fastpath::{FastPath, Outcome};
use sluice_config::ServerTls;
use streams::ConnExec;

/// Listener options.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Serve HTTP/2 (prior knowledge on cleartext, ALPN on TLS).
    pub http2: bool,
    /// Time allowed to receive a request head.
    pub header_read_timeout: Duration,
    /// Largest request head (bytes); larger heads get 431.
    pub max_header_size: usize,
    /// Most client connections open at once.
    pub max_connections: usize,
    /// Time allowed for a TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Longest a write to a client may stay blocked (the client not reading) before the
    /// connection is closed.
    pub client_send_timeout: Duration,
    /// Longest silence on a connection hyper serves (HTTP/2, h2c, HTTP/1 with a body); a
    /// client that sends no more than a preface is dropped at the header timeout.
    pub client_idle_timeout: Duration,
    /// Every connection starts with a PROXY protocol header naming the client
    /// ([`proxy_protocol`]); connections without one are closed.
    pub proxy_protocol: bool,
    /// Read the ClientHello on TLS listeners and tunnel the hosts the route table marks for
    /// SSL passthrough to their backends untouched (`--enable-ssl-passthrough`).
    pub ssl_passthrough: bool,
    /// Serve HTTP/1 on the fast reader (and the direct handler) where it can; off, hyper serves
    /// every connection. A diagnostic switch: the differential test runs the same requests both
    /// ways and compares.
    pub fast_path: bool,
    /// Accept nothing before the first snapshot is applied: a connection waits in the
    /// socket's queue instead of being answered 404. For sockets a predecessor handed over
    /// (`--handover`), whose queue the predecessor still serves meanwhile.
    pub accept_after_first_snapshot: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            http2: true,
            header_read_timeout: Duration::from_secs(30),
            max_header_size: 64 * 1024,
            max_connections: 50_000,
            tls_handshake_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(75),
            client_send_timeout: Duration::from_secs(60),
            proxy_protocol: false,
            ssl_passthrough: false,
            fast_path: true,
            accept_after_first_snapshot: false,
        }
    }
}

/// Runs the accept loops and drains them on shutdown.
#[derive(Debug)]
pub struct Server {
    dp: Arc<DataPlane>,
    opts: ServerOptions,
    graceful: Arc<GracefulShutdown>,
    stop: watch::Sender<bool>,
    /// Tells connections to end: fast-path ones waiting for a request close, and hyper's are
    /// asked to end gracefully (`ending.rs`); `graceful` then counts them down.
    close_idle: Arc<CloseIdle>,
    /// Turns true when the drain deadline has passed: tunnels close then.
    deadline: watch::Sender<bool>,
    /// Open tunnels (they outlive the HTTP connections the graceful shutdown counts).
    tunnels: Arc<AtomicUsize>,
    loops: JoinSet<()>,
    limit: Arc<Semaphore>,
    /// The listening sockets, for a successor (`--handover`).
    sockets: Arc<sockets::ListenerSet>,
}

impl Server {
    /// A server for this data plane.
    pub fn new(dp: Arc<DataPlane>, opts: ServerOptions) -> Self {
        let limit = Arc::new(Semaphore::new(opts.max_connections));
        Self {
            dp,
            opts,
            graceful: Arc::new(GracefulShutdown::new()),
            stop: watch::channel(false).0,
            close_idle: Arc::default(),
            deadline: watch::channel(false).0,
            tunnels: Arc::new(AtomicUsize::new(0)),
            loops: JoinSet::new(),
            limit,
            sockets: Arc::default(),
        }
    }

    /// The listening sockets: bind through it (a socket handed over by a predecessor is
    /// claimed there first) and hand them to a successor from it.
    pub fn sockets(&self) -> &Arc<sockets::ListenerSet> {
        &self.sockets
    }

    /// Starts serving on a bound listener; `tls` makes it an HTTPS listener.
    pub fn serve(&mut self, listener: TcpListener, tls: Option<TlsAcceptor>) {
        let ctx = AcceptCtx {
            dp: Arc::clone(&self.dp),
            opts: self.opts.clone(),
            graceful: Arc::clone(&self.graceful),
            limit: Arc::clone(&self.limit),
            tls,
            client_auth: Arc::default(),
            frontend: Arc::default(),
            policed: Arc::default(),
            builder: Arc::new(builder(&self.opts)),
            close_idle: Arc::clone(&self.close_idle),
            deadline: self.deadline.subscribe(),
            tunnels: Arc::clone(&self.tunnels),
            gateway: false,
            passthrough: false,
        };
        let stop = self.stop.subscribe();
        if self.loops.is_empty() {
            self.loops.spawn(sweep_idle_loop(
                Arc::clone(&self.dp),
                Arc::clone(&self.close_idle),
                self.stop.subscribe(),
            ));
            self.loops
                .spawn(traffic_loop(Arc::clone(&self.dp), self.stop.subscribe()));
        }
        self.loops.spawn(accept_loop(listener, ctx, stop, None));
        self.dp.set_listening();
    }

    /// A handle that serves Gateway sockets while the server runs (see [`gateway::run`]):
    /// their accept loops share this server's connection cap and drain, and end at its stop.
    pub fn gateway_handle(&self) -> GatewayServe {
        GatewayServe {
            ctx: AcceptCtx {
                dp: Arc::clone(&self.dp),
                opts: ServerOptions {
                    fast_path: false,
                    ssl_passthrough: false,
                    ..self.opts.clone()
                },
                graceful: Arc::clone(&self.graceful),
                limit: Arc::clone(&self.limit),
                tls: None,
                client_auth: Arc::default(),
                frontend: Arc::default(),
                policed: Arc::default(),
                builder: Arc::new(builder(&self.opts)),
                close_idle: Arc::clone(&self.close_idle),
                deadline: self.deadline.subscribe(),
                tunnels: Arc::clone(&self.tunnels),
                gateway: true,
                passthrough: false,
            },
            stop: self.stop.subscribe(),
            sockets: Arc::clone(&self.sockets),
        }
    }

    /// Stops accepting, asks every connection to finish, and waits up to `deadline` for them.
    /// Returns whether everything finished in time.
    ///
    /// Order: readiness false and listeners closed; then a short lame-duck period in which every
    /// HTTP/1 response carries `Connection: close` (busy keep-alive clients learn of the close on
    /// a response instead of racing a request against it); then idle connections are closed,
    /// HTTP/2 gets GOAWAY, and in-flight requests finish.
    pub async fn shutdown(self, deadline: Duration) -> bool {
        self.shutdown_then(deadline, || {}).await
    }

    /// [`shutdown`](Self::shutdown), calling `stopped_accepting` once the accept loops have
    /// ended (a successor that took the sockets over is told then).
    pub async fn shutdown_then(
        mut self,
        deadline: Duration,
        stopped_accepting: impl FnOnce(),
    ) -> bool {
        let started = std::time::Instant::now();
        self.dp.start_draining();
        let _ = self.stop.send(true);
        while self.loops.join_next().await.is_some() {}
        // The copies kept for a successor must not hold the sockets open.
        self.sockets.clear();
        stopped_accepting();
        let lame_duck = (deadline / 4).min(Duration::from_secs(1));
        tokio::time::sleep(lame_duck).await;
        let deadline = deadline.saturating_sub(started.elapsed());
        let open = self.graceful.count();
        tracing::info!(open_connections = open, ?deadline, "draining connections");
        self.close_idle.close();
        let end = tokio::time::Instant::now() + deadline;
        // The Gateway sockets' accept loops and their manager hold the drain's counter too;
        // they end on the stop signal, so wait for them (within the deadline) to let go.
        while Arc::strong_count(&self.graceful) > 1 && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut done = match Arc::try_unwrap(self.graceful) {
            Ok(g) => tokio::time::timeout_at(end, g.shutdown()).await.is_ok(),
            Err(_) => false,
        };
        // Tunnels outlive their HTTP connections: they get what is left of the deadline to end
        // on their own, then are closed.
        while self.tunnels.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let open_tunnels = self.tunnels.load(Ordering::Relaxed);
        if open_tunnels > 0 {
            tracing::info!(open_tunnels, "closing tunnels at the drain deadline");
            done = false;
        }
        let _ = self.deadline.send(true);
        done
    }
}

/// How often idle upstream connections are checked for closes and expiry.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Closes dead and expired idle upstream connections every [`SWEEP_EVERY`] until `stop`, and
/// forgets the client connections that have ended since the last sweep (see [`CloseIdle`]).
async fn sweep_idle_loop(
    dp: Arc<DataPlane>,
    close_idle: Arc<CloseIdle>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        close_idle.prune();
        let closed = dp.sweep_idle_connections();
        if closed > 0 {
            tracing::debug!(closed, "idle upstream connections closed");
        }
    }
}

/// Samples each route's counters for the operator's page every
/// [`crate::telemetry::traffic::SAMPLE_EVERY`] until `stop`.
async fn traffic_loop(dp: Arc<DataPlane>, mut stop: watch::Receiver<bool>) {
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    loop {
        dp.metrics.traffic.sample(unix_ms());
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(crate::telemetry::traffic::SAMPLE_EVERY) => {}
        }
    }
}

#[derive(Clone)]
struct AcceptCtx {
    dp: Arc<DataPlane>,
    opts: ServerOptions,
    graceful: Arc<GracefulShutdown>,
    limit: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    client_auth: Arc<tls::ClientAuthAcceptors>,
    frontend: Arc<tls::ClientAuthAcceptors<FrontendAuth>>,
    policed: Arc<tls::PolicyAcceptor>,
    builder: Arc<auto::Builder<ConnExec>>,
    close_idle: Arc<CloseIdle>,
    deadline: watch::Receiver<bool>,
    tunnels: Arc<AtomicUsize>,
    /// A Gateway's socket: routed by the Gateway API's rules, on hyper only.
    gateway: bool,
    /// A Gateway's TLS passthrough socket: tunnelled by server name, never terminated.
    passthrough: bool,
}

fn builder(opts: &ServerOptions) -> auto::Builder<ConnExec> {
    let mut b = auto::Builder::new(ConnExec);
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout)
        .max_buf_size(opts.max_header_size.max(8192))
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(opts.max_header_size).unwrap_or(u32::MAX));
    if opts.http2 { b } else { b.http1_only() }
}

/// Serves Gateway sockets for a [`Server`] (cloned into the task that opens and closes them).
#[derive(Clone)]
pub struct GatewayServe {
    ctx: AcceptCtx,
    stop: watch::Receiver<bool>,
    sockets: Arc<sockets::ListenerSet>,
}

impl std::fmt::Debug for GatewayServe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayServe").finish_non_exhaustive()
    }
}

impl GatewayServe {
    /// Serves a bound Gateway socket until `close` turns true or the server stops; a closed
    /// socket stops accepting and its connections drain as they would at a shutdown's start.
    pub fn serve(
        &self,
        listener: TcpListener,
        (tls, passthrough): (Option<TlsAcceptor>, bool),
        close: watch::Receiver<bool>,
    ) {
        let ctx = AcceptCtx {
            tls,
            passthrough,
            ..self.ctx.clone()
        };
        tokio::spawn(accept_loop(listener, ctx, self.stop.clone(), Some(close)));
    }

    /// The data plane it serves.
    pub fn dataplane(&self) -> &Arc<DataPlane> {
        &self.ctx.dp
    }

    /// The server's listening sockets (see [`Server::sockets`]).
    pub fn sockets(&self) -> &Arc<sockets::ListenerSet> {
        &self.sockets
    }

    /// Whether the server has stopped (no socket may open any more).
    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Resolves when the server stops.
    pub async fn until_stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
    }
}

/// Resolves when `close` turns true (never without one).
async fn closed(close: &mut Option<watch::Receiver<bool>>) {
    match close {
        Some(c) => {
            let _ = c.wait_for(|v| *v).await;
        }
        None => std::future::pending().await,
    }
}

async fn accept_loop(
    listener: TcpListener,
    ctx: AcceptCtx,
    mut stop: watch::Receiver<bool>,
    mut close: Option<watch::Receiver<bool>>,
) {
    let local = listener.local_addr().ok();
    if ctx.opts.accept_after_first_snapshot {
        while ctx.dp.generation() == 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = stop.changed() => return,
            }
        }
    }
    loop {
        // Accept, then wait for a slot before serving: while every slot is taken, this loop
        // holds at most the one connection it accepted and the rest wait in the kernel's
        // backlog. (Taking the slot first would leave one idle slot in the hands of every
        // other listener's loop, short of the cap.)
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
            _ = closed(&mut close) => return,
        };
        // Biased: a connection already taken from the queue is served when a slot is free,
        // even as the loop is told to stop (a successor took the socket over, or a drain
        // began); dropping it would reset a client that did nothing wrong.
        let permit = tokio::select! {
            biased;
            p = Arc::clone(&ctx.limit).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
            _ = closed(&mut close) => return,
        };
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().ok().or(local).unwrap_or(remote);
        let watcher = ctx.graceful.watcher();
        let conn_ctx = ConnCtx {
            dp: Arc::clone(&ctx.dp),
            tls: ctx.tls.clone(),
            client_auth: Arc::clone(&ctx.client_auth),
            frontend: Arc::clone(&ctx.frontend),
            policed: Arc::clone(&ctx.policed),
            builder: Arc::clone(&ctx.builder),
            handshake_timeout: ctx.opts.tls_handshake_timeout,
            header_read_timeout: ctx.opts.header_read_timeout,
            client_idle_timeout: ctx.opts.client_idle_timeout,
            client_send_timeout: ctx.opts.client_send_timeout,
            max_header_size: ctx.opts.max_header_size.max(8192),
            close_idle: Arc::clone(&ctx.close_idle),
            deadline: ctx.deadline.clone(),
            tunnels: Arc::clone(&ctx.tunnels),
            fast_path: ctx.opts.fast_path,
            ssl_passthrough: ctx.opts.ssl_passthrough,
            fresh: Fresh::read(&ctx.dp, ctx.opts.ssl_passthrough, ctx.gateway),
            gateway: ctx.gateway,
            passthrough: ctx.passthrough,
        };
        // The ConfigMap's use-proxy-protocol, else --proxy-protocol: read per connection, so a
        // change applies to the next one.
        let proxy_protocol = conn_ctx
            .fresh
            .proxy_protocol
            .unwrap_or(ctx.opts.proxy_protocol);
        let accepted = Accepted {
            stream,
            remote,
            local,
            permit,
            proxy_protocol,
        };
        // One task type per listener kind, each sized for its own path.
        if conn_ctx.tls.is_some() {
            tokio::spawn(connection::<Tls>(accepted, conn_ctx, watcher));
        } else {
            tokio::spawn(connection::<Plain>(accepted, conn_ctx, watcher));
        }
    }
}

/// What one connection task needs (no reference to the shutdown coordinator itself).
struct ConnCtx {
    dp: Arc<DataPlane>,
    tls: Option<TlsAcceptor>,
    client_auth: Arc<tls::ClientAuthAcceptors>,
    /// Acceptors for Gateway listeners that validate client certificates.
    frontend: Arc<tls::ClientAuthAcceptors<FrontendAuth>>,
    policed: Arc<tls::PolicyAcceptor>,
    builder: Arc<auto::Builder<ConnExec>>,
    handshake_timeout: Duration,
    header_read_timeout: Duration,
    client_idle_timeout: Duration,
    client_send_timeout: Duration,
    max_header_size: usize,
    close_idle: Arc<CloseIdle>,
    deadline: watch::Receiver<bool>,
    tunnels: Arc<AtomicUsize>,
    fast_path: bool,
    ssl_passthrough: bool,
    fresh: Fresh,
    gateway: bool,
    /// A Gateway's TLS passthrough socket.
    passthrough: bool,
}

/// What the route table says about a connection when it is accepted, read with one load of
/// the table: the controller ConfigMap's connection-level keys, and whether the ClientHello is
/// read before TLS.
struct Fresh {
    /// `use-proxy-protocol`.
    proxy_protocol: Option<bool>,
    /// Some host is passed through, or asks for client certificates.
    peek: bool,
    /// `ssl-protocols`, `ssl-ciphers`.
    server_tls: ServerTls,
    /// `keep-alive`.
    keep_alive: Option<Duration>,
    /// `keep-alive-requests`.
    keep_alive_requests: Option<u32>,
}

impl Fresh {
    fn read(dp: &DataPlane, ssl_passthrough: bool, gateway: bool) -> Self {
        let table = dp.routes();
        let s = table.snapshot().settings();
        Self {
            proxy_protocol: s.proxy_protocol,
            // A Gateway socket's handshakes owe nothing to the Ingress hosts' rules.
            peek: !gateway
                && ((ssl_passthrough && table.has_passthrough()) || table.has_client_auth()),
            server_tls: s.server_tls.clone(),
            keep_alive: s.keep_alive,
            keep_alive_requests: s.keep_alive_requests,
        }
    }
}

/// Serves one client connection: on the HTTP/1 fast path while it can (`fast`), then, or
/// from the start, with hyper (HTTP/2, bodies, upgrades and the rest; see [`fastpath`]).
async fn serve_conn<I>(io: I, info: Arc<ConnInfo>, ctx: &ConnCtx, watcher: Watcher, fast: bool)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static,
{
    let io = SendDeadline::new(io, ctx.client_send_timeout);
    // The ConfigMap's keep-alive and keep-alive-requests, as of the connection's start.
    let (keep_alive, max_requests) = (ctx.fresh.keep_alive, ctx.fresh.keep_alive_requests);
    let (io, prefix, served, close_idle) = if fast {
        let mut fp = FastPath {
            dp: Arc::clone(&ctx.dp),
            info: Arc::clone(&info),
            header_read_timeout: ctx.header_read_timeout,
            max_header_size: ctx.max_header_size,
            close_idle: ctx.close_idle.watch(),
            idle_timeout: keep_alive.unwrap_or(ctx.header_read_timeout),
            requests: (0, max_requests),
        };
        match fastpath::serve(io, &mut fp).await {
            // The watcher drops here: shutdown stops waiting for this connection.
            Outcome::Closed => return,
            Outcome::HandOver(io, prefix) => (io, prefix, fp.requests.0, fp.close_idle),
        }
    } else {
        (io, Bytes::new(), 0, ctx.close_idle.watch())
    };
    // Boxed: hyper's connection state (HTTP/1 and HTTP/2) would otherwise be part of every
    // idle fast-path connection's task.
    let watched = (watcher, close_idle);
    Box::pin(serve_hyper(io, prefix, served, info, ctx, watched)).await;
}

/// How long a connection asked to end at its idle timeout gets to end gracefully (HTTP/2's
/// `GOAWAY` and the ping that confirms it, TLS `close_notify`) before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// A connection (or the rest of one, after the fast path handed it over with the bytes it had
/// read) served by hyper.
async fn serve_hyper<I>(
    io: SendDeadline<I>,
    prefix: Bytes,
    served: u32,
    info: Arc<ConnInfo>,
    ctx: &ConnCtx,
    (watcher, shutdown): (Watcher, IdleWatch),
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Held, not watched: shutdown waits for this connection until it ends, and [`Ending`]
    // hears the shutdown itself (with the idle timeout, which the watcher cannot say).
    let _watcher = watcher;
    let (keep_alive, max_requests) = (ctx.fresh.keep_alive, ctx.fresh.keep_alive_requests);
    let dp = Arc::clone(&ctx.dp);
    // Requests counted on from the fast path's: the last one allowed says `Connection: close`
    // (HTTP/1; hyper then closes the connection after it).
    let count = Arc::new(AtomicUsize::new(served as usize));
    let svc = service_fn(move |req: Request<Incoming>| {
        let (dp, info, count) = (Arc::clone(&dp), Arc::clone(&info), Arc::clone(&count));
        async move {
            let http1 = req.version() <= http::Version::HTTP_11;
            let n = count.fetch_add(1, Ordering::Relaxed) + 1;
            // Boxed: hyper boxes each HTTP/2 stream's future into its connection's set
            // (streams.rs), and a small future is cheaper to move there than the whole
            // handler's state.
            let mut resp = Box::pin(handle(dp, info, req.map(Some))).await;
            if http1 && max_requests.is_some_and(|max| n >= max as usize) {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let activity = Activity::new();
    // HTTP/2 clients (over TLS, or h2c) get the answers of one turn written together; the
    // adapter holds writes only once it has read the HTTP/2 preface.
    let io = Coalesce::new(Watched::new(
        Prefixed::new(prefix, io),
        Arc::clone(&activity),
    ));
    let conn = ctx
        .builder
        .serve_connection_with_upgrades(TokioIo::new(io), svc)
        .into_owned();
    let idle = Arc::new(AtomicBool::new(false));
    let run = streams::run(Ending::new(conn, shutdown, Arc::clone(&idle)));
    tokio::pin!(run);
    let ended = |r: Result<(), _>| {
        if let Err(e) = r {
            tracing::debug!(error = %e, "client connection ended with an error");
        }
    };
    tokio::select! {
        r = &mut run => ended(r),
        why = activity.watch(ctx.header_read_timeout, keep_alive.unwrap_or(ctx.client_idle_timeout)) => {
            tracing::debug!(why, "client connection ending");
            if why == IDLE_TIMEOUT {
                // Idle: asked to end as at shutdown (GOAWAY, close_notify), briefly. The other
                // reason (no request within the header timeout) drops it quietly, as nginx
                // closes timed-out connections.
                idle.store(true, Ordering::Relaxed);
                if let Ok(r) = tokio::time::timeout(IDLE_CLOSE_GRACE, &mut run).await {
                    ended(r);
                }
            }
        }
    }
}
