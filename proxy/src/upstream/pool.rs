//! The upstream connection pool, keyed by connection identity (address + protocol). It is never
//! rebuilt by a configuration swap: endpoints hold an `Arc<HostPool>` obtained from the
//! [`PoolRegistry`], and a re-created endpoint for the same address gets the same pool back.
//!
//! HTTP/1.1 connections wait in a lock-free queue while idle; HTTP/2 (h2c) shares one
//! multiplexed connection per address.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use crossbeam_queue::SegQueue;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_config::UpstreamProtocol;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpSocket, TcpStream};

use crate::error::{Error, Kind};
use crate::upstream::body::ReqBody;
use crate::upstream::h1::{H1Conn, UpIo};
use crate::upstream::tls::{TlsProfile, UpstreamTls};

/// Identity of a connection: who we talk to and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Upstream address.
    pub addr: SocketAddr,
    /// Protocol (HTTP/1.1, h2c, HTTPS, h2 over TLS).
    pub protocol: UpstreamProtocol,
    /// The pool's own TLS (`proxy-ssl-*`); `None`: the global upstream TLS.
    pub tls: Option<Arc<TlsProfile>>,
}

/// Timeouts and limits for upstream connections.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// Time allowed for TCP connect (and TLS handshake).
    pub connect_timeout: Duration,
    /// Idle connections older than this are not reused (`--upstream-idle-timeout`).
    pub idle_timeout: Duration,
    /// The controller ConfigMap's `upstream-keepalive-timeout` in milliseconds, over
    /// `idle_timeout` while non-zero; set on every snapshot apply.
    pub idle_timeout_override: Arc<std::sync::atomic::AtomicU64>,
    /// `TCP_USER_TIMEOUT`: unacknowledged data for this long kills the connection, so a pod that
    /// vanished without a RST is noticed in about this time.
    pub user_timeout: Duration,
    /// Idle connections kept per address.
    pub max_idle_per_host: usize,
    /// Longest silence from an upstream while its response body is read (nginx's
    /// `proxy_read_timeout`); the body then fails and the client connection is closed.
    pub read_timeout: Duration,
    /// TLS client for HTTPS upstreams.
    pub tls: UpstreamTls,
}

impl UpstreamSettings {
    /// How long an idle connection may be reused: the ConfigMap's value, else the flag's.
    pub fn idle_timeout(&self) -> Duration {
        match self.idle_timeout_override.load(Ordering::Relaxed) {
            0 => self.idle_timeout,
            ms => Duration::from_millis(ms),
        }
    }
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
            idle_timeout_override: Arc::default(),
            user_timeout: Duration::from_secs(2),
            max_idle_per_host: 512,
            read_timeout: Duration::from_secs(60),
            tls: UpstreamTls::default(),
        }
    }
}

#[derive(Debug)]
struct IdleH1 {
    conn: H1Conn,
    since: Instant,
}

/// Connections to one address with one protocol.
#[derive(Debug)]
pub struct HostPool {
    /// The identity.
    pub key: PoolKey,
    settings: Arc<UpstreamSettings>,
    /// Idle HTTP/1 connections, oldest first. A `SegQueue` grows in small blocks as
    /// connections are returned, where a bounded `ArrayQueue` would preallocate
    /// `max_idle_per_host` slots per endpoint (≈ 28 KB each: 1.4 GB at 50,000 endpoints).
    idle: SegQueue<IdleH1>,
    /// Length of `idle`, kept separately to enforce `max_idle_per_host` without a lock.
    idle_len: AtomicUsize,
    /// The fewest idle connections seen since `trim_mark` (checkouts lower it).
    low_water: AtomicUsize,
    /// When the current trim window began ([`crate::clock::now_nanos`]).
    trim_mark: AtomicU64,
    h2: ArcSwapOption<http2::SendRequest<ReqBody>>,
}

/// A checked-out HTTP/1 connection; [`PooledH1::release`] puts it back.
#[derive(Debug)]
pub struct PooledH1 {
    /// The connection.
    pub conn: H1Conn,
    pool: Arc<HostPool>,
}

impl PooledH1 {
    /// The pool's read timeout for response bodies.
    pub fn read_timeout(&self) -> Duration {
        self.pool.settings.read_timeout
    }
    /// Returns the connection to the idle queue (dropped when the queue is full). Call only
    /// when the last response ended cleanly and allowed keep-alive.
    pub fn release(self) {
        if !self.conn.is_clean() {
            // Bytes past the end of the response: the next request would read them as its
            // answer.
            return;
        }
        let pool = &self.pool;
        if pool.idle_len.fetch_add(1, Ordering::AcqRel) >= pool.settings.max_idle_per_host.max(1) {
            pool.idle_len.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        pool.idle.push(IdleH1 {
            conn: self.conn,
            since: Instant::now(),
        });
    }
}

/// An HTTP/1 connection plus whether it came from the idle pool (a reused connection may have
/// been closed by the peer in the meantime, which makes a replay safe for idempotent requests).
#[derive(Debug)]
pub struct Checkout {
    /// The connection.
    pub conn: PooledH1,
    /// Taken from the pool rather than freshly connected.
    pub reused: bool,
}

impl HostPool {
    /// The oldest idle connection, for a checkout.
    fn pop_idle(&self) -> Option<IdleH1> {
        let idle = self.pop_oldest()?;
        let left = self.idle_len.load(Ordering::Acquire);
        self.low_water.fetch_min(left, Ordering::Relaxed);
        Some(idle)
    }

    /// The oldest idle connection, for the sweep (which does not count as a use).
    fn pop_oldest(&self) -> Option<IdleH1> {
        let idle = self.idle.pop()?;
        self.idle_len.fetch_sub(1, Ordering::AcqRel);
        Some(idle)
    }

    fn new(key: PoolKey, settings: Arc<UpstreamSettings>) -> Self {
        Self {
            key,
            idle: SegQueue::new(),
            idle_len: AtomicUsize::new(0),
            low_water: AtomicUsize::new(0),
            trim_mark: AtomicU64::new(crate::clock::now_nanos()),
            h2: ArcSwapOption::empty(),
            settings,
        }
    }

    /// Idle HTTP/1 connections right now.
    pub fn idle_count(&self) -> usize {
        self.idle_len.load(Ordering::Acquire)
    }

    /// Closes idle connections that are past the idle timeout or that the upstream closed (or
    /// sent unasked bytes on), so they do not sit in `CLOSE_WAIT` holding a descriptor and a
    /// buffer until the endpoint's next request. Returns how many were closed. Takes every
    /// idle connection out once; a checkout racing with the sweep may open a new connection
    /// instead of reusing one, which is harmless.
    ///
    /// A connection that stays gives its read buffer back ([`H1Conn::shed`]): a burst of
    /// requests can leave hundreds of idle connections to one endpoint, each holding a buffer
    /// the next burst may never need. Under steady load this costs at most one buffer
    /// allocation per pooled connection per sweep.
    pub fn sweep_idle(&self) -> usize {
        let mut closed = 0;
        for _ in 0..self.idle_count() {
            let Some(mut idle) = self.pop_oldest() else {
                break;
            };
            if idle.since.elapsed() > self.settings.idle_timeout() || !idle.conn.is_usable() {
                closed += 1;
                continue;
            }
            idle.conn.shed();
            self.idle_len.fetch_add(1, Ordering::AcqRel);
            self.idle.push(idle);
        }
        closed + self.trim_surplus()
    }

    /// Closes the idle connections that were surplus for a whole idle timeout: as many as the
    /// idle count never went below since the window began.
    ///
    /// Checkouts take the oldest idle connection, so under steady traffic every pooled
    /// connection is used in turn and none ever reaches the idle timeout: after a burst (or an
    /// attack that held many requests open) the pool would keep its high-water mark for as
    /// long as traffic flows — the soak saw 36 upstream connections grow to 125 in an hour at
    /// an even 1,100 req/s. Counting instead of ageing gives what handing out the newest
    /// connection first would (the surplus ages out) without a lock on checkout: if the idle
    /// count never fell below `n` for a whole idle timeout, `n` connections were never needed.
    fn trim_surplus(&self) -> usize {
        let now = crate::clock::now_nanos();
        let window = u64::try_from(self.settings.idle_timeout().as_nanos()).unwrap_or(u64::MAX);
        if now.saturating_sub(self.trim_mark.load(Ordering::Relaxed)) < window {
            return 0;
        }
        let surplus = self
            .low_water
            .load(Ordering::Relaxed)
            .min(self.idle_count());
        let mut closed = 0;
        for _ in 0..surplus {
            if self.pop_oldest().is_none() {
                break;
            }
            closed += 1;
        }
        self.trim_mark.store(now, Ordering::Relaxed);
        self.low_water.store(self.idle_count(), Ordering::Relaxed);
        closed
    }

    /// Gets an HTTP/1 connection (cleartext or TLS): a live idle one when there is one, else
    /// a new one; with `fresh` always a new one (after a pooled connection turned out dead,
    /// see `upstream`).
    /// `now` is the time the caller read last (idle connections past the idle timeout then are
    /// not reused).
    pub async fn checkout_h1(
        self: &Arc<Self>,
        fresh: bool,
        now: Instant,
    ) -> Result<Checkout, Error> {
        while !fresh && let Some(mut idle) = self.pop_idle() {
            if now.saturating_duration_since(idle.since) > self.settings.idle_timeout()
                || !idle.conn.is_usable()
            {
                continue;
            }
            return Ok(Checkout {
                conn: PooledH1 {
                    conn: idle.conn,
                    pool: Arc::clone(self),
                },
                reused: true,
            });
        }
        // Boxed: the connect and TLS handshake futures are large, and every request's future
        // would otherwise carry (and move) them although most requests reuse a connection.
        Box::pin(self.connect_h1()).await
    }

    async fn connect_h1(self: &Arc<Self>) -> Result<Checkout, Error> {
        let stream = self.connect_tcp().await?;
        let io = if self.key.protocol.is_tls() {
            UpIo::Tls(Box::new(
                self.tls()
                    .connect(self.key.addr, stream, self.settings.connect_timeout, false)
                    .await?,
            ))
        } else {
            UpIo::Plain(stream)
        };
        Ok(Checkout {
            conn: PooledH1 {
                conn: H1Conn::new(io),
                pool: Arc::clone(self),
            },
            reused: false,
        })
    }

    /// Gets the shared HTTP/2 (h2c) connection, opening it when there is none or it closed.
    /// Returns the sender and whether it was reused.
    pub async fn checkout_h2(
        self: &Arc<Self>,
    ) -> Result<(http2::SendRequest<ReqBody>, bool), Error> {
        if let Some(s) = self.h2.load_full()
            && !s.is_closed()
            && s.is_ready()
        {
            return Ok(((*s).clone(), true));
        }
        let stream = self.connect_tcp().await?;
        let sender = if self.key.protocol.is_tls() {
            let tls = self
                .tls()
                .connect(self.key.addr, stream, self.settings.connect_timeout, true)
                .await?;
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(Error::caused(
                    Kind::UpstreamHandshake,
                    io::Error::other("the pod did not agree to h2 (ALPN)"),
                ));
            }
            h2_handshake(tls).await?
        } else {
            h2_handshake(stream).await?
        };
        self.h2.store(Some(Arc::new(sender.clone())));
        Ok((sender, false))
    }

    /// The TLS client for this identity: the pool's own, else the global one.
    fn tls(&self) -> &UpstreamTls {
        self.key.tls.as_ref().map_or(&self.settings.tls, |p| &p.tls)
    }

    async fn connect_tcp(&self) -> Result<TcpStream, Error> {
        let socket = self.socket().map_err(|e| Error::caused(Kind::Connect, e))?;
        let addr = self.key.addr;
        match tokio::time::timeout(self.settings.connect_timeout, socket.connect(addr)).await {
            Err(_) => Err(Error::new(Kind::ConnectTimeout(
                self.settings.connect_timeout,
            ))),
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                Err(Error::new(Kind::ConnectRefused))
            }
            Ok(Err(e)) => Err(Error::caused(Kind::Connect, e)),
            Ok(Ok(s)) => Ok(s),
        }
    }

    /// A socket set up for an upstream connection: no Nagle, a TCP user timeout, keep-alive.
    fn socket(&self) -> io::Result<TcpSocket> {
        let addr = self.key.addr;
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_nodelay(true)?;
        {
            let s = SockRef::from(&socket);
            #[cfg(any(target_os = "linux", target_os = "android"))]
            s.set_tcp_user_timeout(Some(self.settings.user_timeout))?;
            s.set_tcp_keepalive(
                &TcpKeepalive::new()
                    .with_time(Duration::from_secs(30))
                    .with_interval(Duration::from_secs(5)),
            )?;
        }
        Ok(socket)
    }
}

/// An HTTP/2 client connection over `io`, driven by its own task.
async fn h2_handshake<I>(io: I) -> Result<http2::SendRequest<ReqBody>, Error>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(20))
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| Error::caused(Kind::UpstreamHandshake, e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream h2 connection ended");
        }
    });
    Ok(sender)
}

/// Hands out one [`HostPool`] per identity for as long as anybody holds it.
#[derive(Debug)]
pub struct PoolRegistry {
    settings: Arc<UpstreamSettings>,
    pools: Mutex<Identities>,
}

/// The registry's map, and the size at which it next forgets unused identities.
#[derive(Debug)]
struct Identities {
    map: HashMap<PoolKey, Weak<HostPool>>,
    sweep_at: usize,
}

/// Smallest map size at which unused identities are swept.
const MIN_SWEEP: usize = 64;

impl PoolRegistry {
    /// The settings every pool of the registry reads.
    pub fn settings(&self) -> &UpstreamSettings {
        &self.settings
    }

    /// A registry with these settings.
    pub fn new(settings: UpstreamSettings) -> Self {
        Self {
            settings: Arc::new(settings),
            pools: Mutex::new(Identities {
                map: HashMap::new(),
                sweep_at: MIN_SWEEP,
            }),
        }
    }

    /// Sweeps the idle connections of every live pool (see [`HostPool::sweep_idle`]); returns
    /// how many were closed. The registry lock is held only to collect the pools.
    pub fn sweep_idle(&self) -> usize {
        let live: Vec<Arc<HostPool>> = {
            let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            pools.map.values().filter_map(Weak::upgrade).collect()
        };
        live.iter().map(|p| p.sweep_idle()).sum()
    }

    /// The pool for `key` (control path only: called when an endpoint is created).
    pub fn get(&self, key: PoolKey) -> Arc<HostPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.map.get(&key).and_then(Weak::upgrade) {
            return p;
        }
        // Forget identities nobody uses any more. The sweep is O(map size), so it runs only
        // when the map has doubled since the last one: amortised O(1) per new identity, and
        // an endpoint change in a cluster with 50,000 endpoints does not scan all of them.
        if pools.map.len() >= pools.sweep_at {
            pools.map.retain(|_, w| w.strong_count() > 0);
            pools.sweep_at = (pools.map.len() * 2).max(MIN_SWEEP);
        }
        let p = Arc::new(HostPool::new(key.clone(), Arc::clone(&self.settings)));
        pools.map.insert(key, Arc::downgrade(&p));
        p
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(port: u16) -> PoolKey {
        PoolKey {
            addr: SocketAddr::from(([10, 0, 0, 1], port)),
            protocol: UpstreamProtocol::Http1,
            tls: None,
        }
    }

    fn map_len(r: &PoolRegistry) -> usize {
        r.pools.lock().unwrap().map.len()
    }

    #[test]
    fn one_pool_per_identity_while_in_use() {
        let r = PoolRegistry::new(UpstreamSettings::default());
        let a = r.get(key(1));
        assert!(Arc::ptr_eq(&a, &r.get(key(1))), "same identity, same pool");
        assert!(
            !Arc::ptr_eq(&a, &r.get(key(2))),
            "other address, other pool"
        );
        let h2 = PoolKey {
            protocol: UpstreamProtocol::H2c,
            ..key(1)
        };
        assert!(!Arc::ptr_eq(&a, &r.get(h2)), "other protocol, other pool");
    }

    #[test]
    fn unused_identities_are_forgotten_and_the_map_stays_bounded() {
        let r = PoolRegistry::new(UpstreamSettings::default());
        let kept: Vec<_> = (0..10).map(|p| r.get(key(p))).collect();
        // Endpoints come and go: each new pool is dropped at once.
        for p in 1000..11_000 {
            drop(r.get(key(p)));
            assert!(map_len(&r) <= 2 * MIN_SWEEP.max(kept.len()) + 1);
        }
        // Pools still in use survive every sweep.
        for (p, pool) in kept.iter().enumerate() {
            assert!(Arc::ptr_eq(pool, &r.get(key(p as u16))));
        }
    }

    #[test]
    fn sweeps_are_amortised_when_many_identities_are_live() {
        let r = PoolRegistry::new(UpstreamSettings::default());
        let live: Vec<_> = (0..5000).map(|p| r.get(key(p))).collect();
        let sweep_at = r.pools.lock().unwrap().sweep_at;
        // With 5,000 live pools the next sweep waits until the map has doubled, instead of
        // scanning all of them for every new endpoint.
        assert!(sweep_at > live.len(), "sweep_at {sweep_at}");
        assert_eq!(map_len(&r), live.len());
    }
}
