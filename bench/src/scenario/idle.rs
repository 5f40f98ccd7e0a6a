//! `idle`: what an idle keep-alive connection costs each peer in memory. N clients each open a
//! connection (HTTP/1.1, HTTP/1.1 over TLS, or HTTP/2 over TLS), send one request through the
//! peer's route to a backend, read the whole answer, and then stay open without a word, as a
//! browser's spare connections do. The peer's resident memory (its whole process tree) is read
//! before the first connection, just after the last answer, and after a settling time (a peer
//! may give buffers back once a connection has been quiet), and divided by the connections still
//! open at the end. Then every connection is closed, and after the same settling time the
//! peer's memory, its open descriptors and the connections it still has on its port are read
//! again — what holding them left behind — and a second round of as many connections is
//! opened, answered and closed: memory that grows from the first round's reading to the
//! second's is kept, not cached. Every peer runs in the same invocation, on the same machine
//! state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Common, secs};
use crate::load::TlsVersion;
use crate::load::attack::{ack, frame, h2_start, take_frames};
use crate::load::conn::{Connector, Stream};
use crate::load::http1;
use crate::peers::{HOST, Peer, PeerKind, Proto};
use crate::pods::Pods;
use crate::report::{IdleRow, Report};
use crate::sys;

/// Connections opening at once.
const OPENING: usize = 200;
/// How long one connection may take to connect, handshake and get its answer.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time between starting a peer and its first memory reading.
const WARM: Duration = Duration::from_secs(1);

/// The client protocol of one variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// HTTP/1.1 over TCP.
    Http,
    /// HTTP/1.1 over TLS.
    Https,
    /// HTTP/2 over TLS (ALPN h2), one stream answered.
    H2,
}

impl Variant {
    /// The variant's name in reports.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Http => "http",
            Variant::Https => "https",
            Variant::H2 => "h2",
        }
    }
}

/// Runs the idle-connection scenario over every peer and variant.
pub async fn run(c: &Common) -> Report {
    let n = c.connections.unwrap_or(if c.quick { 1000 } else { 5000 });
    // This process and the peer each hold one descriptor per connection (and some more).
    let limit = usize::try_from(sys::nofile()).unwrap_or(usize::MAX);
    if n + 500 > limit {
        eprintln!(
            "idle: {n} connections need about {} descriptors in this process and in each peer; the open-files limit here is {limit} (raise the hard limit: ulimit -Hn, or LimitNOFILE)",
            n + 500
        );
    }
    let settle = c.duration.unwrap_or(secs(15.0));
    let variants: Vec<Variant> = match (c.proto, c.h2) {
        (_, true) => vec![Variant::H2],
        (Some(Proto::Http), _) => vec![Variant::Http],
        (Some(Proto::Https), _) => vec![Variant::Https],
        (None, _) => vec![Variant::Http, Variant::Https, Variant::H2],
    };
    let mut rows = Vec::new();
    for &v in &variants {
        for &kind in &c.peers {
            let row = if kind == PeerKind::Direct {
                IdleRow::skipped(kind.name(), v.label(), "direct: no proxy to measure".into())
            } else {
                one(kind, c, v, n, settle).await
            };
            match &row.skipped {
                Some(why) => eprintln!("{:>16} {}: skipped: {why}", row.name, row.variant),
                None => eprintln!(
                    "{:>16} {}: {} open, {:.2} KB each after {}s",
                    row.name,
                    row.variant,
                    row.open,
                    row.kb_per_connection,
                    settle.as_secs()
                ),
            }
            rows.push(row);
        }
    }
    let mut settings = BTreeMap::new();
    settings.insert(
        "connections".into(),
        format!(
            "{n} per peer and variant, {OPENING} opening at once; each sends one GET through the route (1 KB answer from a backend), reads it whole, then stays silent"
        ),
    );
    settings.insert(
        "readings".into(),
        format!(
            "RSS of the peer's process tree {}s after its start, just after the last answer, and {}s later; per connection = (last reading - first) / connections still open",
            WARM.as_secs(),
            settle.as_secs()
        ),
    );
    settings.insert(
        "limits".into(),
        format!("raised to hold them: nginx worker_connections max(8192, {n}/workers + 1024), HAProxy maxconn max(8000, {n} + 1000), sluice --max-connections max(50000, {n} + 1000); the open-files limit ({}) bounds them, here and in each peer", sys::nofile()),
    );
    Report {
        scenario: "idle".into(),
        quick: c.quick,
        started_utc: String::new(),
        command: c.command.clone(),
        what_it_shows: format!(
            "idle: resident memory per idle keep-alive connection, each peer with the same {n} connections that have each had one request answered through the proxy, read {}s after the last answer. It shows what holding many quiet clients costs (browsers keep spare connections; HTTP/2 clients keep one for minutes). It does not show memory under load.",
            settle.as_secs()
        ),
        machine: c.machine.clone(),
        settings,
        idle: rows,
        ..Report::default()
    }
}

/// One peer, one variant: start it, open and answer `n` connections, read its memory.
async fn one(kind: PeerKind, c: &Common, v: Variant, n: usize, settle: Duration) -> IdleRow {
    let name = kind.name();
    let mut env = c.env.clone();
    env.max_connections = Some(n);
    env.proto = if v == Variant::Http {
        Proto::Http
    } else {
        Proto::Https
    };
    env.http2 = v == Variant::H2;
    // The backend's answer size, for a peer that answers itself (floor).
    env.body_size = 1024;
    if let Some(why) = kind.unavailable(&env) {
        return IdleRow::skipped(name, v.label(), why);
    }
    let mut pods = Pods::new(1024);
    if let Err(e) = pods.add(1).await {
        return IdleRow::skipped(name, v.label(), format!("backend did not start: {e}"));
    }
    let peer = match Peer::start(kind, &env, &pods.endpoints()).await {
        Ok(p) => p,
        Err(e) => {
            pods.stop_all().await;
            return IdleRow::skipped(name, v.label(), format!("failed to start: {e}"));
        }
    };
    let row = measure(&peer, v, n, settle).await;
    peer.stop().await;
    pods.stop_all().await;
    row.unwrap_or_else(|why| IdleRow::skipped(name, v.label(), why))
}

/// Opens the connections against a started peer and takes the readings.
async fn measure(peer: &Peer, v: Variant, n: usize, settle: Duration) -> Result<IdleRow, String> {
    let pid = peer.pid().ok_or("the peer has no process to measure")?;
    // The peer was started for this variant: TLS unless plain HTTP (certificate not checked).
    let tls = peer.tls(TlsVersion::Any, false);
    let alpn: &[&[u8]] = if v == Variant::H2 {
        &[b"h2"]
    } else {
        &[b"http/1.1"]
    };
    let connector = Arc::new(
        Connector::with_alpn(vec![peer.target], tls.as_ref(), alpn)
            .map_err(|e| format!("client TLS: {e}"))?,
    );
    tokio::time::sleep(WARM).await;
    let (base, fds_base) = (sys::tree_rss_bytes(pid), sys::tree_fds(pid));
    let mut held = hold(Arc::clone(&connector), v, n).await;
    let answered = sys::tree_rss_bytes(pid);
    tokio::time::sleep(settle).await;
    let (settled, fds_settled) = (sys::tree_rss_bytes(pid), sys::tree_fds(pid));
    let open = held.count_open().await;
    let per = |rss: u64| {
        if open == 0 {
            f64::NAN
        } else {
            (rss as f64 - base as f64) / open as f64 / 1024.0
        }
    };
    let mut notes = Vec::new();
    if held.non_2xx > 0 {
        notes.push(format!("{} answers were not 2xx", held.non_2xx));
    }
    for (e, k) in &held.errors {
        notes.push(format!("{k} connections failed: {e}"));
    }
    if open < held.streams.len() {
        notes.push(format!(
            "{} answered connections were closed by the peer while idle",
            held.streams.len() - open
        ));
    }
    let answered_n = held.streams.len();
    // Every connection closed by the client; what is left once the peer has noticed. Then the
    // same again: memory that grows from one round to the next is kept, not cached.
    drop(held);
    tokio::time::sleep(settle).await;
    let (closed, fds_closed) = (sys::tree_rss_bytes(pid), sys::tree_fds(pid));
    let clients_left = sys::tcp_sockets_on_port(peer.target.port());
    if clients_left > 0 {
        notes.push(format!(
            "{clients_left} client connections still held by the peer after the clients closed"
        ));
    }
    let again = hold(Arc::clone(&connector), v, n).await;
    drop(again);
    tokio::time::sleep(settle).await;
    let closed_again = sys::tree_rss_bytes(pid);
    Ok(IdleRow {
        name: peer.kind.name().into(),
        variant: v.label().into(),
        skipped: None,
        connections: n,
        answered: answered_n,
        open,
        rss_base_bytes: base,
        rss_answered_bytes: answered,
        rss_settled_bytes: settled,
        kb_per_connection_answered: per(answered),
        kb_per_connection: per(settled),
        rss_closed_bytes: closed,
        rss_closed_again_bytes: closed_again,
        clients_left,
        fds_base,
        fds_settled,
        fds_closed,
        notes,
    })
}

/// Connections that each had one request answered, held open and silent.
#[derive(Debug)]
pub struct Held {
    /// The client protocol they speak.
    pub variant: Variant,
    /// The answered connections.
    pub streams: Vec<Stream>,
    /// How many of the answers were not 2xx.
    pub non_2xx: usize,
    /// Connections that failed, by what went wrong.
    pub errors: BTreeMap<String, usize>,
}

impl Held {
    /// How many of the connections are still open: a read polled once finds nothing
    /// (HTTP/2: nothing but frames short of GOAWAY, such as a PING). Reads what is there.
    pub async fn count_open(&mut self) -> usize {
        let mut open = 0;
        for s in &mut self.streams {
            open += usize::from(still_open(s, self.variant).await);
        }
        open
    }
}

/// Opens `n` connections through `connector` (200 at once), sends one request on each
/// and reads its whole answer; returns the answered ones, open.
pub async fn hold(connector: Arc<Connector>, v: Variant, n: usize) -> Held {
    let opening = Arc::new(Semaphore::new(OPENING));
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let (connector, opening) = (Arc::clone(&connector), Arc::clone(&opening));
        tasks.spawn(async move {
            let _slot = opening.acquire_owned().await.map_err(|e| e.to_string())?;
            let deadline = Instant::now() + EXCHANGE_TIMEOUT;
            let mut s = connector
                .connect(deadline)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let ok = tokio::time::timeout_at(deadline, answer(&mut s, v))
                .await
                .map_err(|_| "no answer in time".to_string())??;
            Ok::<_, String>((s, ok))
        });
    }
    let mut held = Held {
        variant: v,
        streams: Vec::with_capacity(n),
        non_2xx: 0,
        errors: BTreeMap::new(),
    };
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok((s, ok))) => {
                held.non_2xx += usize::from(!ok);
                held.streams.push(s);
            }
            Ok(Err(e)) => *held.errors.entry(e).or_default() += 1,
            Err(e) => *held.errors.entry(format!("task: {e}")).or_default() += 1,
        }
    }
    held
}

/// Sends one request and reads its whole answer: whether it was 2xx.
async fn answer(s: &mut Stream, v: Variant) -> Result<bool, String> {
    if v == Variant::H2 {
        return h2_answer(s).await;
    }
    let req = http1::build_request(HOST, "/", false);
    let mut buf = BytesMut::with_capacity(4096);
    let r = http1::exchange(s, &mut buf, &req)
        .await
        .map_err(|e| e.to_string())?;
    if r.close {
        return Err("the peer closed the connection after its answer".into());
    }
    Ok((200..300).contains(&r.status))
}

/// HTTP/2: the preface and SETTINGS, one GET on stream 1, then frames until that stream ends
/// (SETTINGS and PINGs acknowledged on the way).
async fn h2_answer(s: &mut Stream) -> Result<bool, String> {
    h2_start(s).await.map_err(|e| format!("preface: {e}"))?;
    // :method GET, :scheme https, :path / (static table), :authority as a literal without
    // indexing under static name 1.
    let mut block = vec![0x82, 0x87, 0x84, 0x01];
    block.push(u8::try_from(HOST.len()).map_err(|_| "host too long")?);
    block.extend_from_slice(HOST.as_bytes());
    let mut out = Vec::new();
    frame(&mut out, 1, 0x5, 1, &block);
    s.write_all(&out)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 16384]);
    let mut ok = None;
    loop {
        let got = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
        if got == 0 {
            return Err("closed before the answer ended".into());
        }
        buf.extend_from_slice(&chunk[..got]);
        let (replies, seen) = h2_frames(&mut buf);
        if !replies.is_empty() {
            s.write_all(&replies)
                .await
                .map_err(|e| format!("ack: {e}"))?;
        }
        for f in seen {
            match f {
                H2Seen::Status200 => ok = Some(true),
                H2Seen::OtherStatus => ok = Some(false),
                H2Seen::End => return ok.ok_or_else(|| "stream ended without headers".into()),
                H2Seen::Reset => return Err("stream reset".into()),
                H2Seen::GoAway => return Err("GOAWAY".into()),
            }
        }
    }
}

/// What an HTTP/2 frame on the answered stream (or the connection) told us.
#[derive(Debug, PartialEq, Eq)]
enum H2Seen {
    /// The response HEADERS, `:status: 200` (static index 8).
    Status200,
    /// The response HEADERS, another status.
    OtherStatus,
    /// END_STREAM on stream 1.
    End,
    /// RST_STREAM on stream 1.
    Reset,
    /// GOAWAY.
    GoAway,
}

/// Takes the complete frames at the front of `buf`: the acknowledgements owed and what the
/// frames said about stream 1.
fn h2_frames(buf: &mut Vec<u8>) -> (Vec<u8>, Vec<H2Seen>) {
    let (mut out, mut seen) = (Vec::new(), Vec::new());
    take_frames(buf, |kind, flags, stream, payload| {
        ack(&mut out, kind, flags, payload);
        match kind {
            7 => seen.push(H2Seen::GoAway),
            3 if stream == 1 => seen.push(H2Seen::Reset),
            1 if stream == 1 => {
                // Skip the pad length and priority fields, if flagged, to the block's first byte.
                let skip = usize::from(flags & 0x8 != 0) + if flags & 0x20 != 0 { 5 } else { 0 };
                seen.push(if payload.get(skip) == Some(&0x88) {
                    H2Seen::Status200
                } else {
                    H2Seen::OtherStatus
                });
            }
            _ => {}
        }
        if (kind == 0 || kind == 1) && stream == 1 && flags & 1 != 0 {
            seen.push(H2Seen::End);
        }
    });
    (out, seen)
}

/// Whether an idle connection is still open (see [`Held::count_open`]).
async fn still_open(s: &mut Stream, v: Variant) -> bool {
    let mut chunk = [0u8; 4096];
    match tokio::time::timeout(Duration::ZERO, s.read(&mut chunk)).await {
        Err(_) => true,
        Ok(Ok(0) | Err(_)) => false,
        Ok(Ok(got)) => {
            if v != Variant::H2 {
                // An HTTP/1.1 server speaking unprompted is saying goodbye (a 408 or the like).
                return false;
            }
            let mut buf = chunk[..got].to_vec();
            !h2_frames(&mut buf).1.contains(&H2Seen::GoAway)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2_frames_ack_and_see_the_answer() {
        let mut buf = Vec::new();
        frame(&mut buf, 4, 0, 0, &[0, 3, 0, 0, 0, 100]); // SETTINGS
        frame(&mut buf, 4, 1, 0, &[]); // SETTINGS ACK: nothing owed
        frame(&mut buf, 1, 0x4, 1, &[0x88, 0x0f, 0x10]); // HEADERS :status 200
        frame(&mut buf, 0, 0x1, 1, b"hello"); // DATA, END_STREAM
        let tail_len = 4;
        buf.extend_from_slice(&[0, 0, 8, 6][..tail_len]); // a PING's first bytes
        let (out, seen) = h2_frames(&mut buf);
        assert_eq!(seen, vec![H2Seen::Status200, H2Seen::End]);
        // One SETTINGS ACK, and the partial frame is kept.
        assert_eq!(out, vec![0, 0, 0, 4, 1, 0, 0, 0, 0]);
        assert_eq!(buf, vec![0, 0, 8, 6]);
    }

    #[test]
    fn h2_frames_see_other_status_padding_reset_and_goaway() {
        let mut buf = Vec::new();
        // Padded (1 byte of pad length) and prioritised (5 bytes): :status 404 (index 13).
        frame(&mut buf, 1, 0x4 | 0x8 | 0x20, 1, &[0, 0, 0, 0, 0, 16, 0x8d]);
        frame(&mut buf, 1, 0x4 | 0x8 | 0x20, 1, &[0, 0, 0, 0, 0, 16, 0x88]);
        frame(&mut buf, 3, 0, 1, &[0, 0, 0, 8]);
        frame(&mut buf, 3, 0, 3, &[0, 0, 0, 8]); // another stream: not ours
        frame(&mut buf, 7, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
        let (out, seen) = h2_frames(&mut buf);
        assert!(out.is_empty());
        assert_eq!(
            seen,
            vec![
                H2Seen::OtherStatus,
                H2Seen::Status200,
                H2Seen::Reset,
                H2Seen::GoAway
            ]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn pings_are_answered_with_their_payload() {
        let mut buf = Vec::new();
        frame(&mut buf, 6, 0, 0, b"12345678");
        let (out, seen) = h2_frames(&mut buf);
        assert!(seen.is_empty());
        let mut want = Vec::new();
        frame(&mut want, 6, 1, 0, b"12345678");
        assert_eq!(out, want);
    }
}
