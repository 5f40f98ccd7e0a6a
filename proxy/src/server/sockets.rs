//! The listening sockets a process holds, by role and address, so that a successor can be
//! handed the very same sockets (`--handover`, shared ARCHITECTURE.md §9): a connection waiting
//! in a socket's accept queue is then accepted by the successor instead of being reset, as it
//! would be when one `SO_REUSEPORT` socket closes and another opens.
//!
//! Two lists: what this process listens on now (a duplicate of each descriptor, sent on
//! request), and what it inherited from its predecessor and has not claimed yet. Binding a
//! listener goes through [`ListenerSet::listen`], which claims an inherited socket of the same
//! role and address before it binds a new one. Not on the request path: a mutex is fine.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::net::TcpListener;

/// What a listening socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `--http-listen`.
    Http,
    /// `--https-listen`.
    Https,
    /// `--admin-listen`.
    Admin,
    /// A Gateway socket (plain, or HTTPS when `tls`).
    Gateway {
        /// Whether the socket terminates TLS.
        tls: bool,
    },
}

impl Role {
    /// The role's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Http => "http",
            Role::Https => "https",
            Role::Admin => "admin",
            Role::Gateway { tls: false } => "gateway",
            Role::Gateway { tls: true } => "gateway-tls",
        }
    }

    /// The role a wire name stands for (`None` for a name this version does not know).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "http" => Role::Http,
            "https" => Role::Https,
            "admin" => Role::Admin,
            "gateway" => Role::Gateway { tls: false },
            "gateway-tls" => Role::Gateway { tls: true },
            _ => return None,
        })
    }
}

/// One listening socket: its role, its bound address, and a descriptor of it.
#[derive(Debug)]
pub struct Held {
    /// What it is for.
    pub role: Role,
    /// Where it is bound.
    pub addr: SocketAddr,
    /// A descriptor of the socket.
    pub fd: OwnedFd,
}

#[derive(Debug, Default)]
struct Inner {
    open: Vec<Held>,
    inherited: Vec<(Role, SocketAddr, std::net::TcpListener)>,
}

/// The listening sockets of this process (see the module docs).
#[derive(Debug, Default)]
pub struct ListenerSet {
    inner: Mutex<Inner>,
}

/// Whether a socket bound at `have` serves a request for `want` (port 0 asks for any port).
fn same_place(want: SocketAddr, have: SocketAddr) -> bool {
    want == have || (want.port() == 0 && want.ip() == have.ip())
}

impl ListenerSet {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing here can be left half-changed by a panic: take the data as it is.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a socket received from the predecessor until [`listen`](Self::listen) claims it.
    pub fn inherit(&self, role: Role, listener: std::net::TcpListener) -> io::Result<()> {
        let addr = listener.local_addr()?;
        // The predecessor's descriptors share its socket's flags; tokio needs non-blocking.
        listener.set_nonblocking(true)?;
        self.lock().inherited.push((role, addr, listener));
        Ok(())
    }

    /// A listener for `role` at `addr`: the inherited socket of that role and place when there
    /// is one (its queued connections come with it), else a new one from `bind`. Either way it
    /// is recorded as open, so a successor can be handed it.
    pub fn listen(
        &self,
        role: Role,
        addr: SocketAddr,
        bind: impl FnOnce(SocketAddr) -> io::Result<TcpListener>,
    ) -> io::Result<TcpListener> {
        let claimed = {
            let mut inner = self.lock();
            let at = inner
                .inherited
                .iter()
                .position(|(r, a, _)| *r == role && same_place(addr, *a));
            at.map(|i| inner.inherited.swap_remove(i).2)
        };
        let listener = match claimed {
            Some(l) => {
                tracing::info!(role = role.as_str(), address = %addr, "listening on the socket handed over");
                TcpListener::from_std(l)?
            }
            None => bind(addr)?,
        };
        let fd = listener.as_fd().try_clone_to_owned()?;
        let addr = listener.local_addr()?;
        self.lock().open.push(Held { role, addr, fd });
        Ok(listener)
    }

    /// Forgets a socket this process stopped listening on (a Gateway socket no snapshot asks
    /// for any more), closing the descriptor kept of it so that the socket really closes.
    pub fn closed(&self, role: Role, addr: SocketAddr) {
        self.lock()
            .open
            .retain(|h| !(h.role == role && same_place(addr, h.addr)));
    }

    /// Closes the inherited sockets nothing claimed (the new configuration does not listen
    /// there); returns how many.
    pub fn drop_unclaimed(&self, which: impl Fn(Role) -> bool) -> usize {
        let mut inner = self.lock();
        let before = inner.inherited.len();
        inner.inherited.retain(|(role, addr, _)| {
            let drop = which(*role);
            if drop {
                tracing::info!(role = role.as_str(), address = %addr, "closing a handed-over socket the configuration no longer uses");
            }
            !drop
        });
        before - inner.inherited.len()
    }

    /// How many inherited sockets of the roles `which` picks are not claimed yet.
    pub fn unclaimed(&self, which: impl Fn(Role) -> bool) -> usize {
        self.lock()
            .inherited
            .iter()
            .filter(|(r, _, _)| which(*r))
            .count()
    }

    /// Copies of every socket listened on now, for a successor.
    pub fn handover(&self) -> io::Result<Vec<Held>> {
        self.lock()
            .open
            .iter()
            .map(|h| {
                Ok(Held {
                    role: h.role,
                    addr: h.addr,
                    fd: h.fd.try_clone()?,
                })
            })
            .collect()
    }

    /// Forgets every socket (the server stopped): the descriptors kept here no longer hold
    /// any socket open.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.open.clear();
        inner.inherited.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[tokio::test]
    async fn an_inherited_socket_is_claimed_by_role_and_place_and_keeps_its_queue() {
        let old = std::net::TcpListener::bind(loopback()).unwrap();
        let at = old.local_addr().unwrap();
        // A client connects before the handover: it waits in the socket's queue.
        let client = std::net::TcpStream::connect(at).unwrap();
        let set = ListenerSet::default();
        set.inherit(Role::Https, old.try_clone().unwrap()).unwrap();
        drop(old);
        let never = |_| -> io::Result<TcpListener> { Err(io::Error::other("must not bind")) };
        assert!(set.listen(Role::Http, at, never).is_err(), "another role's");
        let l = set.listen(Role::Https, at, never).unwrap();
        let (_, from) = l.accept().await.unwrap();
        assert_eq!(
            from,
            client.local_addr().unwrap(),
            "the queued connection came along"
        );
        let sent = set.handover().unwrap();
        assert_eq!(sent.len(), 1);
        assert_eq!((sent[0].role, sent[0].addr), (Role::Https, at));
    }

    #[tokio::test]
    async fn what_is_not_inherited_is_bound_and_what_closes_is_forgotten() {
        let set = ListenerSet::default();
        let l = set
            .listen(Role::Gateway { tls: true }, loopback(), |a| {
                crate::server::listener::bind(a)
            })
            .unwrap();
        let at = l.local_addr().unwrap();
        assert_eq!(set.handover().unwrap().len(), 1);
        set.closed(Role::Gateway { tls: true }, at);
        assert!(set.handover().unwrap().is_empty());
        drop(l);
        assert!(
            std::net::TcpStream::connect(at).is_err(),
            "no copy kept the socket listening"
        );
    }

    #[test]
    fn unclaimed_sockets_close_and_roles_read_back() {
        let set = ListenerSet::default();
        let l = std::net::TcpListener::bind(loopback()).unwrap();
        let at = l.local_addr().unwrap();
        set.inherit(Role::Gateway { tls: false }, l).unwrap();
        assert_eq!(set.drop_unclaimed(|r| matches!(r, Role::Http)), 0);
        assert_eq!(set.drop_unclaimed(|r| matches!(r, Role::Gateway { .. })), 1);
        assert!(std::net::TcpStream::connect(at).is_err());
        for r in [
            Role::Http,
            Role::Https,
            Role::Admin,
            Role::Gateway { tls: false },
            Role::Gateway { tls: true },
        ] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("quic"), None);
    }
}
