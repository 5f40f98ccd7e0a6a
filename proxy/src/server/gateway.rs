//! The listener set's Gateway part (shared ARCHITECTURE.md §3, item 4): the sockets Gateways
//! listen on open and close while sluice runs, as applied snapshots ask. A socket whose
//! (address, port, TLS) stays is never rebound, so its connections never notice a change; a
//! socket no longer asked for stops accepting and its connections drain. Each HTTPS socket
//! has its own rustls config whose resolver serves its listeners' certificates from the
//! current route table.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sluice_config::host::{HostBuf, normalize_request_host};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::GatewayServe;
use super::sockets::Role;
use super::tls::{TlsOptions, config_with};
use crate::state::dataplane::{DataPlane, GatewayBind};

/// Serves the certificates of one Gateway socket's listeners.
#[derive(Debug)]
struct GatewayResolver {
    dp: Arc<DataPlane>,
    local: SocketAddr,
}

impl ResolvesServerCert for GatewayResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let table = self.dp.routes();
        let mut buf = HostBuf::default();
        let name = hello
            .server_name()
            .and_then(|n| normalize_request_host(n, &mut buf));
        table
            .gateway()
            .certificate(table.snapshot(), self.local, name)
    }
}

/// Where a socket binds.
fn bind_addr(b: &GatewayBind) -> SocketAddr {
    SocketAddr::new(
        b.key.0.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        b.key.1,
    )
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    // As the Ingress listeners: a successor that could not be handed this socket binds beside.
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    TcpListener::from_std(s.into())
}

/// Opens and closes Gateway sockets as the data plane's applied snapshots ask, until the
/// server stops. A socket that cannot be bound (address in use, not local) is
/// logged and tried again every few seconds.
pub async fn run(handle: GatewayServe, tls: TlsOptions) {
    let dp = Arc::clone(handle.dataplane());
    let mut wanted = dp.gateway_sockets();
    let mut open: HashMap<GatewayBind, watch::Sender<bool>> = HashMap::new();
    loop {
        if handle.stopped() {
            return;
        }
        let want: Vec<GatewayBind> = wanted.borrow_and_update().clone();
        open.retain(|b, close| {
            let keep = want.contains(b);
            if !keep {
                tracing::info!(address = %bind_addr(b), tls = b.tls, "Gateway socket closed");
                handle
                    .sockets()
                    .closed(Role::Gateway { tls: b.tls }, bind_addr(b));
                let _ = close.send(true);
            }
            keep
        });
        let mut failed = false;
        let new: Vec<GatewayBind> = want
            .iter()
            .filter(|b| !open.contains_key(*b))
            .copied()
            .collect();
        for b in &new {
            let addr = bind_addr(b);
            let acceptor = if b.tls {
                let resolver = Arc::new(GatewayResolver {
                    dp: Arc::clone(&dp),
                    local: addr,
                });
                match config_with(resolver, &tls) {
                    Ok(cfg) => Some(TlsAcceptor::from(cfg)),
                    Err(e) => {
                        tracing::error!(address = %addr, error = %e, "Gateway socket's TLS config");
                        failed = true;
                        continue;
                    }
                }
            } else {
                None
            };
            match handle
                .sockets()
                .listen(Role::Gateway { tls: b.tls }, addr, bind)
            {
                Ok(listener) => {
                    let (close, closed) = watch::channel(false);
                    handle.serve(listener, (acceptor, b.passthrough), closed);
                    open.insert(*b, close);
                    tracing::info!(address = %addr, tls = b.tls, passthrough = b.passthrough, "Gateway socket open");
                }
                Err(e) => {
                    tracing::warn!(address = %addr, error = %e, "Gateway socket cannot be bound; retrying");
                    failed = true;
                }
            }
        }
        let gateway = |r: Role| matches!(r, Role::Gateway { .. });
        if dp.generation() > 0 {
            // The first snapshot is in: a handed-over Gateway socket it did not ask for closes.
            handle.sockets().drop_unclaimed(gateway);
        }
        // Handed-over sockets wait for the first snapshot, which may not change what is wanted.
        let unclaimed = handle.sockets().unclaimed(gateway) > 0;
        tokio::select! {
            r = wanted.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(100)), if unclaimed => {}
            _ = tokio::time::sleep(Duration::from_secs(5)), if failed => {}
            // The server's drain waits for this task to let go of it.
            () = handle.until_stopped() => return,
        }
    }
}
