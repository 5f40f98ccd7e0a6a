//! The handover between processes, played in one process: two [`ListenerSet`]s stand for the
//! old and the new sluice, the unix socket and the descriptors passed are real.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::*;

fn dp() -> Arc<DataPlane> {
    DataPlane::new(sluice_proxy::ProxySettings::default(), None).unwrap()
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// An "old process": a set listening on one loopback socket, offering it at `path`.
async fn old_at(path: &Path) -> (Arc<DataPlane>, tokio::net::TcpListener, Offer) {
    let set = Arc::new(ListenerSet::default());
    let l = set
        .listen(Role::Https, SocketAddr::from(([127, 0, 0, 1], 0)), |a| {
            sluice_proxy::server::listener::bind(a)
        })
        .unwrap();
    let dp = dp();
    let offer = settle(Taken::alone(path), set, Arc::clone(&dp))
        .await
        .unwrap();
    (dp, l, offer)
}

/// Whether `f` turns true within two seconds.
fn eventually(f: impl Fn() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

async fn take_async(path: &Path) -> Taken {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || take(&path))
        .await
        .unwrap()
}

#[tokio::test]
async fn without_a_process_or_with_a_stale_file_the_new_one_binds_alone() {
    let d = dir();
    let path = d.path().join("handover.sock");
    assert!(take_async(&path).await.sockets.is_empty());
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a stale socket file");
    let t = take_async(&path).await;
    assert!(t.sockets.is_empty() && t.predecessor.is_none());
    assert!(!path.exists(), "the stale file is removed");
}

#[tokio::test]
async fn the_same_socket_moves_with_its_queued_connection_and_the_chain_goes_on() {
    let d = dir();
    let path = d.path().join("handover.sock");
    let (_old_dp, old_listener, mut old_offer) = old_at(&path).await;
    let at = old_listener.local_addr().unwrap();
    // A client waits in the accept queue while the sockets move.
    let mut queued = TcpStream::connect(at).unwrap();
    let mut taken = take_async(&path).await;
    assert_eq!(taken.sockets.len(), 1);
    let new_set = Arc::new(ListenerSet::default());
    for (role, l) in std::mem::take(&mut taken.sockets) {
        new_set.inherit(role, l).unwrap();
    }
    let never = |_| -> io::Result<tokio::net::TcpListener> { Err(io::Error::other("bound anew")) };
    let new_listener = new_set.listen(Role::Https, at, never).unwrap();
    // The old process stops accepting when asked; the new one hears that it did.
    let old = tokio::spawn(async move {
        let ack = old_offer.requested().await;
        drop(old_listener);
        ack.done();
    });
    let mut new_offer = settle(taken, Arc::clone(&new_set), dp()).await.unwrap();
    old.await.unwrap();
    let (mut conn, _) = new_listener.accept().await.unwrap();
    queued.write_all(b"hi").unwrap();
    let mut got = [0u8; 2];
    tokio::io::AsyncReadExt::read_exact(&mut conn, &mut got)
        .await
        .unwrap();
    assert_eq!(&got, b"hi", "the queued connection reached the new process");

    // A third generation takes over from the second, through the same path.
    let third = take_async(&path).await;
    assert_eq!(third.sockets.len(), 1);
    assert_eq!(third.sockets[0].1.local_addr().unwrap(), at);
    let second = tokio::spawn(async move { new_offer.requested().await.done() });
    let third_set = Arc::new(ListenerSet::default());
    settle(third, third_set, dp()).await.unwrap();
    second.await.unwrap();
}

#[tokio::test]
async fn a_successor_that_dies_before_it_is_ready_leaves_the_old_one_serving() {
    let d = dir();
    let path = d.path().join("handover.sock");
    let (dp, l, _offer) = old_at(&path).await;
    let taken = take_async(&path).await;
    assert_eq!(taken.sockets.len(), 1);
    assert!(
        eventually(|| dp.is_yielding()),
        "readiness says 503 while a successor gets ready"
    );
    drop(taken); // dies: its connection closes without "ready"
    assert!(eventually(|| !dp.is_yielding()), "ready again");
    let at = l.local_addr().unwrap();
    let _client = TcpStream::connect(at).unwrap();
    assert!(l.accept().await.is_ok(), "the old one still accepts");
    // The next successor is handed the sockets as if nothing happened.
    let again = take_async(&path).await;
    assert_eq!(again.sockets.len(), 1);
}

#[tokio::test]
async fn a_second_successor_at_once_is_told_to_wait_and_is_not_handed_anything() {
    let d = dir();
    let path = d.path().join("handover.sock");
    let (_dp, _l, _offer) = old_at(&path).await;
    let first = take_async(&path).await;
    assert_eq!(first.sockets.len(), 1);
    let conn = UnixStream::connect(&path).unwrap();
    match ask(&conn).unwrap() {
        Asked::Later => {}
        _ => panic!("a second successor must wait"),
    }
    drop(first);
}

#[tokio::test]
async fn another_version_and_garbage_are_refused_and_the_old_one_serves_on() {
    let d = dir();
    let path = d.path().join("handover.sock");
    let (_dp, l, _offer) = old_at(&path).await;
    let conn = UnixStream::connect(&path).unwrap();
    conn.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    let hello = Message::Hello {
        version: VERSION + 1,
        pid: 1,
        sluice: "9".into(),
    };
    wire::send(&conn, &hello, &[]).unwrap();
    let (answer, fds) = wire::recv(&conn).unwrap();
    assert!(matches!(answer, Message::Refused { .. }), "{answer:?}");
    assert!(fds.is_empty(), "nothing handed to another version");

    let mut junk = UnixStream::connect(&path).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    junk.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    let _ = junk.read_to_end(&mut rest);
    assert!(rest.is_empty(), "garbage gets nothing");

    let _client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    assert!(l.accept().await.is_ok(), "still serving");
    assert_eq!(take_async(&path).await.sockets.len(), 1);
}

#[tokio::test]
async fn an_old_process_that_does_not_answer_leaves_the_new_one_alone() {
    let d = dir();
    let path = d.path().join("handover.sock");
    let _mute = UnixListener::bind(&path).unwrap(); // accepts (the kernel does) and says nothing
    let started = Instant::now();
    let t = take_async(&path).await;
    assert!(t.sockets.is_empty() && t.predecessor.is_none());
    assert!(started.elapsed() >= ANSWER_TIMEOUT);
    assert!(path.exists(), "a live process's file is left alone");
}

#[test]
fn the_path_is_owner_only_and_replaced_in_one_step() {
    let d = dir();
    let path = d.path().join("sub").join("handover.sock");
    let first = bind_path(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let second = bind_path(&path).unwrap();
    let _c = UnixStream::connect(&path).unwrap();
    second.set_nonblocking(true).unwrap();
    first.set_nonblocking(true).unwrap();
    assert!(
        second.accept().is_ok(),
        "the path now reaches the newer listener"
    );
    assert!(first.accept().is_err());
}

#[test]
fn the_directory_is_prepared_for_its_owner_or_the_owner_is_refused() {
    let d = dir();
    let target = d.path().join("run").join("sluice");
    let me = rustix::process::getuid().as_raw();
    let group = rustix::process::getgid().as_raw();
    prepare_dir(&target, &format!("{me}:{group}")).unwrap();
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert!(prepare_dir(&target, "nobody").is_err());
    assert!(prepare_dir(&target, "1:x").is_err());
}
