//! An idle connection sheds its buffers and still keeps its keep-alive time whole: the fast
//! path driven on paused time through an in-memory stream that records each read.
#![allow(clippy::unwrap_used)]
use std::io;
use std::sync::Mutex;
use std::task::Context;

use tokio::io::{AsyncWriteExt, DuplexStream, ReadBuf, ReadHalf};

use super::*;
use crate::server::close_idle::CloseIdle;
use crate::state::settings::ProxySettings;

/// When each read was asked for, and how much room it offered.
type Reads = Arc<Mutex<Vec<(Instant, usize)>>>;

/// The read side of the server's end of the connection, noting every read.
struct Probe {
    inner: ReadHalf<DuplexStream>,
    rooms: Reads,
}

impl AsyncRead for Probe {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let at = Instant::now();
        this.rooms.lock().unwrap().push((at, buf.remaining()));
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

/// Starts the fast path (no routes: every request is answered 404 locally) with the given
/// keep-alive time; returns the client's end and the reads' record.
fn start(idle: Duration) -> (DuplexStream, Reads) {
    start_with(idle, &Arc::default())
}

/// [`start`], with the shutdown signal for idle connections given.
fn start_with(idle: Duration, signal: &Arc<CloseIdle>) -> (DuplexStream, Reads) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (read, write) = tokio::io::split(server);
    let rooms = Arc::new(Mutex::new(Vec::new()));
    let probe = Probe {
        inner: read,
        rooms: Arc::clone(&rooms),
    };
    let addr = "127.0.0.1:9".parse().unwrap();
    let mut fp = FastPath {
        dp: DataPlane::new(ProxySettings::default(), None).unwrap(),
        info: Arc::new(ConnInfo::new(addr, addr, false, false)),
        header_read_timeout: Duration::from_secs(30),
        max_header_size: 8192,
        close_idle: signal.watch(),
        idle_timeout: idle,
        requests: (0, None),
    };
    tokio::spawn(async move { serve(tokio::io::join(probe, write), &mut fp).await });
    (client, rooms)
}

/// Sends `head` in two writes (`split` bytes, then the rest) and reads one answer's status.
async fn ask(c: &mut DuplexStream, head: &[u8], split: usize) -> u16 {
    c.write_all(&head[..split]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    c.write_all(&head[split..]).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = c.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before an answer");
        got.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&got).to_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                return text[9..12].parse().unwrap();
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_sheds_its_buffers_and_still_serves() {
    let (mut c, rooms) = start(Duration::from_secs(10));
    let head = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "p".repeat(1500)
    );
    assert_eq!(ask(&mut c, head.as_bytes(), 3).await, 404);
    let idle_from = Instant::now();
    // Idle past SHED_AFTER: at that moment the connection gives its buffers back and asks
    // for the next head's first bytes with only the small stack buffer (a connection that
    // kept its buffers reads nothing while nothing arrives).
    tokio::time::sleep(SHED_AFTER * 2).await;
    let woke = Instant::now();
    let shed: Vec<usize> = rooms
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= idle_from + SHED_AFTER && *at < woke)
        .map(|&(_, room)| room)
        .collect();
    assert!(
        !shed.is_empty() && shed.iter().all(|&room| room == FIRST_READ),
        "reads while idle: {shed:?}"
    );
    // The next head (three times that buffer, in two writes) is still read whole and
    // answered, and the connection goes on as before.
    assert_eq!(ask(&mut c, head.as_bytes(), 3).await, 404);
    assert_eq!(ask(&mut c, head.as_bytes(), head.len() / 2).await, 404);
}

#[tokio::test(start_paused = true)]
async fn shedding_keeps_the_keep_alive_time_whole() {
    for idle in [Duration::from_millis(500), Duration::from_secs(3)] {
        let (mut c, _) = start(idle);
        assert_eq!(
            ask(&mut c, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5).await,
            404
        );
        let quiet = Instant::now();
        let mut rest = [0u8; 16];
        assert_eq!(c.read(&mut rest).await.unwrap(), 0, "closed when idle");
        let waited = quiet.elapsed();
        assert!(
            waited >= idle && waited < idle + Duration::from_millis(50),
            "keep-alive {idle:?}, closed after {waited:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_head_begun_after_shedding_runs_under_the_head_deadline() {
    // A hostile client: idle past SHED_AFTER, then the first bytes of a head, then nothing.
    // The head deadline (30 s) starts with those bytes; the keep-alive time (10 s) no longer
    // applies, and the connection is closed when the head deadline ends, not before.
    let (mut c, _) = start(Duration::from_secs(10));
    tokio::time::sleep(SHED_AFTER * 2).await;
    c.write_all(b"GET / HT").await.unwrap();
    let begun = Instant::now();
    let mut rest = [0u8; 16];
    assert_eq!(c.read(&mut rest).await.unwrap(), 0, "closed");
    let waited = begun.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "closed {waited:?} after the head began"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_an_idle_connection_at_once_before_and_after_it_sheds() {
    // Before shedding (the wait with the buffers held) and after (the wait with none): the
    // close reaches the connection through its registered waker, within a millisecond, long
    // before the keep-alive time (60 s).
    for quiet in [SHED_AFTER / 2, SHED_AFTER * 3] {
        let signal = Arc::new(CloseIdle::default());
        let (mut c, _) = start_with(Duration::from_secs(60), &signal);
        assert_eq!(
            ask(&mut c, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5).await,
            404
        );
        tokio::time::sleep(quiet).await;
        let asked = Instant::now();
        signal.close();
        let mut rest = [0u8; 16];
        assert_eq!(c.read(&mut rest).await.unwrap(), 0, "closed");
        assert!(
            asked.elapsed() < Duration::from_millis(1),
            "idle {quiet:?}: closed {:?} after the close",
            asked.elapsed()
        );
    }
}
