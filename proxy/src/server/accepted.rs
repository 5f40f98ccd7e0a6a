//! An accepted connection's task: its slot and gauges, the PROXY header, and then, per listener
//! kind, cleartext straight to [`serve_conn`] or TLS first (the ClientHello read where SSL
//! passthrough or client certificates need it, the handshake, then [`serve_conn`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;

use super::{ConnCtx, passthrough, proxy_protocol, serve_conn};
use crate::handler::{ConnInfo, Slot};
use crate::io::finish::Finish;
use crate::io::prefixed::Prefixed;
use crate::policy::auth::client_cert::{ClientAuth, ClientCert};
use sluice_config::ServerTls;

/// An accepted connection, before its PROXY header (if the listener expects one).
pub(super) struct Accepted {
    pub(super) stream: tokio::net::TcpStream,
    pub(super) remote: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) permit: tokio::sync::OwnedSemaphorePermit,
    pub(super) proxy_protocol: bool,
}

/// How a listener serves a connection once its client is known: [`Plain`] or [`Tls`]. A type
/// per kind, not a branch, so that each kind's connection task is as large as its own path
/// needs. A task is as large as its largest state: with one task type for both, every plain
/// connection's task would be sized for a TLS handshake and TLS state, or (with the TLS path
/// boxed, as before) every TLS connection would hold a plain-sized task beside its box, about
/// 6 KB that an idle HTTPS or HTTP/2 connection kept for its life.
pub(super) trait Serve {
    /// Serves `stream` from `client` (the TCP peer, or the client a PROXY header named).
    fn serve<S>(
        stream: S,
        peer: (SocketAddr, SocketAddr, Slot),
        ctx: &ConnCtx,
        watcher: Watcher,
    ) -> impl Future<Output = ()> + Send
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static;
}

/// A cleartext listener: straight to [`serve_conn`].
pub(super) struct Plain;

/// A TLS listener: [`serve_tls`], then [`serve_conn`].
pub(super) struct Tls;

impl Serve for Plain {
    async fn serve<S>(
        stream: S,
        peer: (SocketAddr, SocketAddr, Slot),
        ctx: &ConnCtx,
        watcher: Watcher,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static,
    {
        let info = conn_info(peer, ctx);
        serve_conn(stream, info, ctx, watcher, ctx.fast_path).await;
    }
}

impl Serve for Tls {
    async fn serve<S>(
        stream: S,
        peer: (SocketAddr, SocketAddr, Slot),
        ctx: &ConnCtx,
        watcher: Watcher,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static,
    {
        let info = conn_info(peer, ctx);
        match &ctx.tls {
            Some(base) => serve_tls(stream, info, ctx, watcher, base).await,
            // Only spawned for listeners with TLS; served as cleartext if that ever changes.
            None => serve_conn(stream, info, ctx, watcher, ctx.fast_path).await,
        }
    }
}

/// One connection's task: its slot and gauges, the PROXY header where the listener expects
/// one, then `M`'s way of serving it. A plain function returning an `async move` block rather
/// than an `async fn`: an `async fn` keeps its arguments twice (as captured, and as the locals
/// its body moves them into), 360 bytes more in every connection's task.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would keep its arguments twice in every connection's task"
)]
pub(super) fn connection<M: Serve>(
    a: Accepted,
    ctx: ConnCtx,
    watcher: Watcher,
) -> impl Future<Output = ()> + Send {
    async move {
        let slot = Slot::new(a.permit, ctx.deadline.clone(), Arc::clone(&ctx.tunnels));
        let m = &ctx.dp.metrics;
        m.connections.inc();
        m.connections_active.inc();
        if a.proxy_protocol {
            let mut stream = a.stream;
            match proxy_protocol::read(&mut stream, ctx.header_read_timeout).await {
                Ok((header, rest)) => {
                    let client = match header {
                        proxy_protocol::Header::Proxied { source, .. } => source,
                        proxy_protocol::Header::Local => a.remote,
                    };
                    let io = Prefixed::new(rest, stream);
                    // Boxed: a second stream type must not double every task's size.
                    Box::pin(M::serve(io, (client, a.local, slot), &ctx, watcher)).await;
                }
                Err(e) => tracing::debug!(peer = %a.remote, error = %e, "connection closed"),
            }
        } else {
            M::serve(a.stream, (a.remote, a.local, slot), &ctx, watcher).await;
        }
        m.connections_active.dec();
    }
}

/// What the handler knows of a connection from `client` to `local`.
fn conn_info(
    (client, local, slot): (SocketAddr, SocketAddr, Slot),
    ctx: &ConnCtx,
) -> Arc<ConnInfo> {
    Arc::new(
        ConnInfo::new(
            client,
            local,
            ctx.tls.is_some(),
            ctx.dp.settings.trusts(client.ip()),
        )
        .on_gateway(ctx.gateway)
        .with_slot(slot),
    )
}

/// A connection on a Gateway's TLS passthrough socket: the ClientHello's server name selects
/// the TLSRoute (by the listeners' and routes' hostnames), whose backend gets the connection
/// untouched; no route for the name (or no name), and the connection is closed — sluice holds
/// no certificate to answer with.
async fn gateway_passthrough<S>(mut stream: S, info: Arc<ConnInfo>, ctx: &ConnCtx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some((hello, name)) = passthrough::read_hello(&mut stream, ctx.handshake_timeout).await
    else {
        ctx.dp.handshakes.timeout();
        return;
    };
    let cluster = {
        let table = ctx.dp.routes();
        let Some(name) = name.as_deref() else {
            tracing::debug!(local = %info.local, "TLS passthrough: no server name; closed");
            return;
        };
        table
            .gateway()
            .passthrough(table.snapshot(), info.local, name)
    };
    let Some(cluster) = cluster else {
        tracing::debug!(local = %info.local, "TLS passthrough: no TLSRoute for the server name; closed");
        return;
    };
    let guard = info.slot.as_ref().map(crate::handler::Slot::tunnel);
    let s = &ctx.dp.settings;
    let timeouts = (s.upstream.connect_timeout, s.tunnel_idle_timeout);
    passthrough::tunnel(stream, hello, cluster, timeouts, guard).await;
}

/// A connection on a TLS listener: the ClientHello read first where needed, SSL
/// passthrough, then sluice's own TLS.
async fn serve_tls<S>(
    stream: S,
    info: Arc<ConnInfo>,
    ctx: &ConnCtx,
    watcher: Watcher,
    base: &TlsAcceptor,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static,
{
    if ctx.passthrough {
        gateway_passthrough(stream, info, ctx).await;
        return;
    }
    let accepted = std::time::Instant::now();
    // The ConfigMap's ssl-protocols/ssl-ciphers, when set: the listener's config for them.
    let policy = &ctx.fresh.server_tls;
    let policed = (*policy != ServerTls::default())
        .then(|| ctx.policed.get(policy, base))
        .flatten();
    let base = policed.as_ref().unwrap_or(base);
    if ctx.gateway && {
        let table = ctx.dp.routes();
        table
            .gateway()
            .validates_clients(table.snapshot(), info.local)
    } {
        gateway_validated(stream, info, ctx, watcher, (base, accepted)).await;
        return;
    }
    if !ctx.fresh.peek {
        let tls = (base, None);
        terminate(stream, info, ctx, watcher, accepted, tls).await;
        return;
    }
    // Some host is passed through or asks for client certificates: read the ClientHello's
    // server name first.
    let mut stream = stream;
    let Some((hello, name)) = passthrough::read_hello(&mut stream, ctx.handshake_timeout).await
    else {
        ctx.dp.handshakes.timeout();
        return;
    };
    let table = ctx.dp.routes();
    if ctx.ssl_passthrough
        && let Some(cluster) = name.as_deref().and_then(|n| table.passthrough(n))
    {
        drop(table);
        let guard = info.slot.as_ref().map(crate::handler::Slot::tunnel);
        let s = &ctx.dp.settings;
        let timeouts = (s.upstream.connect_timeout, s.tunnel_idle_timeout);
        passthrough::tunnel(stream, hello, cluster, timeouts, guard).await;
        return;
    }
    let host_auth = name.as_deref().and_then(|n| table.client_auth(n)).cloned();
    let acceptor = host_auth.as_ref().and_then(|a| {
        ctx.client_auth
            .get(a, (base, policy), |k| table.has_client_auth_rules(k))
    });
    drop(table);
    let tls = match &acceptor {
        Some(a) => (a, host_auth),
        None => (base, None),
    };
    let stream = Prefixed::new(hello, stream);
    terminate(stream, info, ctx, watcher, accepted, tls).await;
}

/// A connection on a Gateway socket where some listener validates client certificates: the
/// ClientHello's server name picks the listener, whose validation the handshake applies
/// (`AllowValidOnly`: no valid certificate, no connection). A validation that cannot be
/// applied closes the connection; it never lets it through unchecked.
async fn gateway_validated<S>(
    mut stream: S,
    info: Arc<ConnInfo>,
    ctx: &ConnCtx,
    watcher: Watcher,
    (base, accepted): (&TlsAcceptor, std::time::Instant),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static,
{
    let Some((hello, name)) = passthrough::read_hello(&mut stream, ctx.handshake_timeout).await
    else {
        ctx.dp.handshakes.timeout();
        return;
    };
    let mut buf = sluice_config::host::HostBuf::default();
    let name = name
        .as_deref()
        .and_then(|n| sluice_config::host::normalize_request_host(n, &mut buf));
    let (acceptor, info) = {
        let table = ctx.dp.routes();
        let gateway = table.gateway();
        match gateway.frontend(table.snapshot(), info.local, name) {
            None => (base.clone(), info),
            Some(Err(why)) => {
                tracing::debug!(local = %info.local, %why, "client-certificate validation unusable; closed");
                return;
            }
            Some(Ok(f)) => {
                let policy = &ctx.fresh.server_tls;
                let Some(a) = ctx
                    .frontend
                    .get(&f, (base, policy), |k| gateway.holds_frontend(k))
                else {
                    return;
                };
                (a, Arc::new(ConnInfo::clone(&info).with_frontend(Some(f))))
            }
        }
    };
    let stream = Prefixed::new(hello, stream);
    terminate(stream, info, ctx, watcher, accepted, (&acceptor, None)).await;
}

/// sluice's own TLS on an accepted stream (within what is left of the handshake timeout since
/// `accepted`), then [`serve_conn`].
async fn terminate<S>(
    stream: S,
    info: Arc<ConnInfo>,
    ctx: &ConnCtx,
    watcher: Watcher,
    accepted: std::time::Instant,
    (acceptor, host_auth): (&TlsAcceptor, Option<Arc<ClientAuth>>),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + Finish + 'static,
{
    let client = info.remote;
    let remaining = ctx.handshake_timeout.saturating_sub(accepted.elapsed());
    match handshake(acceptor, stream, remaining).await {
        Ok(tls) => {
            let hs = &ctx.dp.handshakes;
            hs.ok(tls.get_ref().1.protocol_version(), accepted.elapsed());
            let info = match host_auth {
                Some(auth) => {
                    let conn = tls.get_ref().1;
                    // The handshake checked the key only: the chain is verified here, once per
                    // connection, and each route judges the result.
                    let cert = conn.peer_certificates().map(|chain| {
                        let chain: Vec<_> = chain.iter().map(|c| c.clone().into_owned()).collect();
                        let verified = auth.verifies(&chain);
                        ClientCert::read(chain, verified.then_some(auth))
                    });
                    Arc::new(ConnInfo::clone(&info).with_handshake(conn.server_name(), cert))
                }
                None => info,
            };
            // HTTP/2 (ALPN h2) goes to hyper; HTTP/1.1 starts on the fast path.
            let fast = ctx.fast_path && tls.get_ref().1.alpn_protocol() != Some(b"h2");
            serve_conn(tls, info, ctx, watcher, fast).await;
        }
        Err(Some(e)) => {
            ctx.dp.handshakes.error();
            tracing::debug!(client = %client, error = %e, "TLS handshake failed");
        }
        Err(None) => ctx.dp.handshakes.timeout(),
    }
}

/// The TLS handshake within `timeout`; the stream comes back boxed. `Err(None)`: timed out.
///
/// Boxed because every async function the stream then passes through keeps its own copy of it
/// for the connection's life (the argument, and the local it is moved into): five copies of a
/// 1.2 KB `TlsStream` on the way into the fast path. In a box each copy is a pointer, and an idle
/// TLS connection's task is about 6 KB smaller for one 1.2 KB allocation.
async fn handshake<S>(
    acceptor: &TlsAcceptor,
    stream: S,
    timeout: Duration,
) -> Result<Box<tokio_rustls::server::TlsStream<S>>, Option<std::io::Error>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Ok(Box::new(tls)),
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}
