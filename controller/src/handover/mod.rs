//! `--handover PATH`: replacing a running sluice without refusing or resetting a connection
//! (shared ARCHITECTURE.md §9).
//!
//! The new process connects to the unix socket at PATH before it binds anything. The old one
//! answers with its listening sockets ([`wire::Message::Sockets`], the descriptors attached);
//! the new one listens on those very sockets (a connection queued in one is accepted by the new
//! process, not reset), becomes ready, then sends [`wire::Message::Ready`]. The old one stops
//! accepting, answers [`wire::Message::Stopped`], and drains as on SIGTERM; a SIGTERM after
//! that changes nothing. The new one then takes PATH over for its own successor.
//!
//! What can go wrong leaves one process serving, with one log line: no file at PATH or a stale
//! one (nobody listening) — the new process binds alone; an old process that does not answer,
//! or speaks another protocol version — the new one binds alone beside it (the listeners set
//! `SO_REUSEPORT`); a new process that dies or hangs before it is ready — the old one notices
//! the closed connection and keeps serving; two new processes at once — the second is told
//! "busy" and asks again, and ends up taking over from the first.

pub mod wire;

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sluice_proxy::DataPlane;
use sluice_proxy::server::sockets::{ListenerSet, Role};
use tokio::sync::mpsc;

use wire::{Listed, Message, VERSION};

/// How long the new process waits for the old one's answer to each message.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new process keeps asking an old one that is busy with another successor.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(120);
/// How long the old process waits for its successor to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// What the new process got from its predecessor.
#[derive(Debug)]
pub struct Taken {
    path: PathBuf,
    /// The connection to the predecessor, held until this process is ready.
    predecessor: Option<(UnixStream, u32)>,
    /// The sockets handed over, by role.
    pub sockets: Vec<(Role, std::net::TcpListener)>,
}

impl Taken {
    /// Whether a predecessor handed its sockets over.
    pub fn from_predecessor(&self) -> bool {
        self.predecessor.is_some()
    }

    fn alone(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            predecessor: None,
            sockets: Vec::new(),
        }
    }
}

/// Asks the process serving at `path` for its listening sockets. Never fails: whatever goes
/// wrong means binding alone, said in one log line. Blocking (call it before binding).
pub fn take(path: &Path) -> Taken {
    let started = Instant::now();
    loop {
        let stream = match UnixStream::connect(path) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), "handover: no process serves here; binding alone");
                return Taken::alone(path);
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(path = %path.display(), "handover: stale socket (nobody listens); binding alone");
                let _ = std::fs::remove_file(path);
                return Taken::alone(path);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "handover: cannot reach the serving process; binding alone");
                return Taken::alone(path);
            }
        };
        match ask(&stream) {
            Ok(Asked::Sockets(pid, sockets)) => {
                tracing::info!(
                    predecessor = pid,
                    sockets = sockets.len(),
                    "handover: took the listening sockets over"
                );
                return Taken {
                    path: path.to_path_buf(),
                    predecessor: Some((stream, pid)),
                    sockets,
                };
            }
            Ok(Asked::Later) if started.elapsed() < BUSY_RETRY_FOR => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(Asked::Later) => {
                tracing::warn!(
                    "handover: the serving process stayed busy with another successor; binding alone"
                );
                return Taken::alone(path);
            }
            Ok(Asked::Refused(reason)) => {
                tracing::warn!(%reason, "handover: refused; binding alone beside the serving process");
                return Taken::alone(path);
            }
            Err(e) => {
                tracing::warn!(error = %e, "handover: the serving process did not answer; binding alone beside it");
                return Taken::alone(path);
            }
        }
    }
}

enum Asked {
    Sockets(u32, Vec<(Role, std::net::TcpListener)>),
    Later,
    Refused(String),
}

fn ask(stream: &UnixStream) -> io::Result<Asked> {
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    stream.set_write_timeout(Some(ANSWER_TIMEOUT))?;
    let hello = Message::Hello {
        version: VERSION,
        pid: std::process::id(),
        sluice: env!("CARGO_PKG_VERSION").to_string(),
    };
    wire::send(stream, &hello, &[])?;
    let (answer, fds) = wire::recv(stream)?;
    Ok(match answer {
        Message::Sockets {
            version: VERSION,
            pid,
            sockets,
        } if sockets.len() == fds.len() => {
            let mut out = Vec::new();
            for (listed, fd) in sockets.into_iter().zip(fds) {
                match Role::parse(&listed.role) {
                    Some(role) => out.push((role, std::net::TcpListener::from(fd))),
                    None => {
                        tracing::warn!(role = %listed.role, address = %listed.addr, "handover: a socket of a role this version does not know is closed")
                    }
                }
            }
            Asked::Sockets(pid, out)
        }
        Message::Sockets { .. } => {
            Asked::Refused("the socket list does not match what came along".into())
        }
        Message::Busy | Message::Draining => Asked::Later,
        Message::Refused { reason } => Asked::Refused(reason),
        other => Asked::Refused(format!("unexpected answer {other:?}")),
    })
}

/// The old process's side: a successor asked it to stop accepting.
#[derive(Debug)]
pub struct Offer {
    requested: mpsc::UnboundedReceiver<std::sync::mpsc::Sender<()>>,
}

/// Call once this process has stopped accepting: the successor is told.
#[derive(Debug)]
pub struct StoppedAccepting(std::sync::mpsc::Sender<()>);

impl StoppedAccepting {
    /// Tells the successor.
    pub fn done(self) {
        let _ = self.0.send(());
    }
}

impl Offer {
    /// Resolves when a successor is serving on this process's sockets: stop accepting, drain,
    /// and call [`StoppedAccepting::done`] when the accept loops have ended.
    pub async fn requested(&mut self) -> StoppedAccepting {
        match self.requested.recv().await {
            Some(ack) => StoppedAccepting(ack),
            None => std::future::pending().await,
        }
    }
}

/// This process is serving: tells the predecessor (if any) to stop accepting, takes PATH over,
/// and offers this process's sockets to the next successor.
pub async fn settle(
    taken: Taken,
    sockets: Arc<ListenerSet>,
    dp: Arc<DataPlane>,
) -> io::Result<Offer> {
    let path = taken.path.clone();
    if let Some((stream, pid)) = taken.predecessor {
        let told = tokio::task::spawn_blocking(move || -> io::Result<()> {
            stream.set_read_timeout(Some(Duration::from_secs(30)))?;
            wire::send(&stream, &Message::Ready, &[])?;
            match wire::recv(&stream)?.0 {
                Message::Stopped => Ok(()),
                other => Err(io::Error::other(format!("answered {other:?}"))),
            }
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
        match told {
            Ok(()) => tracing::info!(
                predecessor = pid,
                "handover: the predecessor stopped accepting and drains"
            ),
            Err(e) => {
                tracing::warn!(predecessor = pid, error = %e, "handover: the predecessor did not confirm it stopped accepting; serving anyway")
            }
        }
    }
    let listener = tokio::task::spawn_blocking(move || bind_path(&path))
        .await
        .map_err(io::Error::other)??;
    let (tx, requested) = mpsc::unbounded_channel();
    let state = Arc::new(Mutex::new(OfferState::default()));
    std::thread::Builder::new()
        .name("sluice-handover".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (sockets, state, tx) = (Arc::clone(&sockets), Arc::clone(&state), tx.clone());
                let dp = Arc::clone(&dp);
                let _ = std::thread::Builder::new()
                    .name("sluice-handover-conn".into())
                    .spawn(move || serve_successor(&conn, (&sockets, &dp), &state, &tx));
            }
        })?;
    Ok(Offer { requested })
}

/// Listens at `path` (owner only), replacing whatever file is there in one step, so that a
/// process connecting meanwhile reaches either the old listener or this one.
fn bind_path(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    Ok(listener)
}

#[derive(Debug, Default)]
struct OfferState {
    /// A successor is taking over now.
    busy: bool,
    /// Handed over: this process no longer offers anything.
    done: bool,
}

/// One successor's conversation with this process.
fn serve_successor(
    conn: &UnixStream,
    (sockets, dp): (&ListenerSet, &DataPlane),
    state: &Mutex<OfferState>,
    requested: &mpsc::UnboundedSender<std::sync::mpsc::Sender<()>>,
) {
    if let Err(why) = same_user(conn) {
        tracing::warn!(%why, "handover: refused a connection");
        return;
    }
    let _ = conn.set_read_timeout(Some(ANSWER_TIMEOUT));
    let _ = conn.set_write_timeout(Some(ANSWER_TIMEOUT));
    let (version, pid) = match wire::recv(conn) {
        Ok((Message::Hello { version, pid, .. }, _)) => (version, pid),
        Ok((other, _)) => {
            tracing::warn!(message = ?other, "handover: a connection did not say hello");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "handover: a connection said nothing readable");
            return;
        }
    };
    let lock = || state.lock().unwrap_or_else(PoisonError::into_inner);
    let refuse = |msg: Message| {
        let _ = wire::send(conn, &msg, &[]);
    };
    {
        let mut s = lock();
        if s.done {
            return refuse(Message::Draining);
        }
        if version != VERSION {
            tracing::warn!(
                successor = pid,
                version,
                "handover: refused a successor speaking another protocol version; it binds alone"
            );
            return refuse(Message::Refused {
                reason: format!("this process speaks handover version {VERSION}, not {version}"),
            });
        }
        if s.busy {
            return refuse(Message::Busy);
        }
        s.busy = true;
    }
    let outcome = hand_over(conn, (sockets, dp), pid, requested);
    let mut s = lock();
    s.busy = false;
    match outcome {
        Ok(()) => s.done = true,
        Err(e) => {
            dp.set_yielding(false);
            tracing::warn!(successor = pid, error = %e, "handover: the successor went away before it was ready; still serving")
        }
    }
}

/// Sends the sockets, waits for the successor to be ready, stops accepting, says so.
fn hand_over(
    conn: &UnixStream,
    (sockets, dp): (&ListenerSet, &DataPlane),
    pid: u32,
    requested: &mpsc::UnboundedSender<std::sync::mpsc::Sender<()>>,
) -> io::Result<()> {
    let held = sockets.handover()?;
    let held: Vec<_> = held.into_iter().take(wire::MAX_SOCKETS).collect();
    let listed = held
        .iter()
        .map(|h| Listed {
            role: h.role.as_str().to_string(),
            addr: h.addr,
        })
        .collect();
    let fds: Vec<_> = held.iter().map(|h| h.fd.as_fd()).collect();
    let msg = Message::Sockets {
        version: VERSION,
        pid: std::process::id(),
        sockets: listed,
    };
    wire::send(conn, &msg, &fds)?;
    dp.set_yielding(true);
    let sent = fds.len();
    drop(fds);
    drop(held);
    tracing::info!(
        successor = pid,
        sockets = sent,
        "handover: sockets sent; waiting for the successor to be ready"
    );
    conn.set_read_timeout(Some(READY_TIMEOUT))?;
    match wire::recv(conn)?.0 {
        Message::Ready => {}
        other => return Err(io::Error::other(format!("said {other:?} instead of ready"))),
    }
    let (ack, stopped) = std::sync::mpsc::channel();
    // Nobody to ask when this process is stopping already (a SIGTERM came first): it has
    // stopped accepting, or is about to, which is what the successor waits to hear.
    if requested.send(ack).is_ok() {
        let _ = stopped.recv_timeout(Duration::from_secs(30));
    }
    let _ = wire::send(conn, &Message::Stopped, &[]);
    tracing::info!(successor = pid, "handover: stopped accepting; draining");
    Ok(())
}

/// Only a process of this user may take the sockets (the socket file is owner-only too).
fn same_user(conn: &UnixStream) -> Result<(), String> {
    let peer = rustix::net::sockopt::socket_peercred(conn).map_err(|e| e.to_string())?;
    let me = rustix::process::getuid();
    if peer.uid == me {
        Ok(())
    } else {
        Err(format!(
            "process {} of uid {} is not of this user",
            peer.pid.as_raw_nonzero(),
            peer.uid.as_raw()
        ))
    }
}

#[cfg(test)]
mod tests;

/// `sluice prepare-handover DIR --owner UID:GID`: creates the directory the handover socket
/// lives in and gives it to the user sluice runs as, owner-only.
pub fn prepare_dir(dir: &Path, owner: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let (uid, gid) = owner
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))
        .with_context(|| format!("--owner {owner:?}: expected UID:GID (numbers)"))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // The mode first: once the directory is another user's, changing it needs CAP_FOWNER.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} owner-only", dir.display()))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .with_context(|| format!("giving {} to {uid}:{gid}", dir.display()))?;
    println!("{} is {uid}:{gid}, mode 0700", dir.display());
    Ok(())
}

/// [`take`] when `--handover` is set, off the async runtime.
pub async fn take_from(path: Option<&Path>) -> Option<Taken> {
    let path = path?.to_path_buf();
    match tokio::task::spawn_blocking(move || take(&path)).await {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "handover: asking the serving process failed; binding alone");
            None
        }
    }
}

/// Once `dp` serves (its first snapshot applied), [`settle`]s; `None` without `--handover`,
/// or when PATH cannot be taken over (said in the log; this process serves on regardless).
pub async fn settle_when_ready(
    taken: Option<Taken>,
    dp: Arc<DataPlane>,
    sockets: Arc<ListenerSet>,
) -> Option<Offer> {
    let taken = taken?;
    while !dp.is_ready() {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let path = taken.path.clone();
    match settle(taken, sockets, dp).await {
        Ok(offer) => Some(offer),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "handover: cannot listen for a successor; a new process will bind beside this one");
            None
        }
    }
}

/// Resolves when a successor asks this process to stop accepting (never without an offer).
pub async fn requested(offer: Option<&mut Offer>) -> StoppedAccepting {
    match offer {
        Some(o) => o.requested().await,
        None => std::future::pending().await,
    }
}
