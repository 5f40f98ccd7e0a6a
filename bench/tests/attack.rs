//! The abuse scenario's attackers against servers on loopback whose behaviour is known: each
//! attack must send what it claims, and count what the server did to it. A few seconds each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_bench::backend::{Backend, BackendConfig};
use sluice_bench::load::Connector;
use sluice_bench::load::attack::{self, Attack, AttackReport, AttackSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::Instant;

async fn attack(a: Attack, target: SocketAddr, connections: usize, secs: f64) -> AttackReport {
    let now = Instant::now();
    let spec = AttackSpec {
        attack: a,
        connections,
        connector: Arc::new(Connector::new(vec![target], None).unwrap()),
        host: "bench.local".into(),
        tls: false,
        start: now,
        end: now + Duration::from_secs_f64(secs),
    };
    tokio::time::timeout(Duration::from_secs(10), attack::run(spec))
        .await
        .expect("the attack is bounded")
}

/// A server that keeps what each connection sent for `hold`, then closes it (after writing
/// `greeting`).
async fn recording_server(
    hold: Duration,
    greeting: &'static [u8],
) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let kept = Arc::clone(&kept);
            tokio::spawn(async move {
                let _ = s.write_all(greeting).await;
                let mut got = Vec::new();
                let _ = tokio::time::timeout(hold, async {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                })
                .await;
                kept.lock().unwrap().push(got);
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_sends_a_line_a_second_and_reconnects_when_cut() {
    let (addr, seen) = recording_server(Duration::from_millis(1500), b"").await;
    let r = attack(Attack::Slowloris, addr, 3, 3.5).await;
    assert_eq!(r.connections, 3);
    assert!(r.opened > 3, "reconnected after the server cut them: {r:?}");
    assert!(r.closed_by_server >= 3, "{r:?}");
    let p50 = r.closed_after_p50_s.unwrap();
    assert!((1.2..2.5).contains(&p50), "{r:?}");
    let seen = seen.lock().unwrap();
    let first = String::from_utf8_lossy(&seen[0]);
    assert!(
        first.starts_with("GET / HTTP/1.1\r\nHost: bench.local\r\nX-Slow-0: 1\r\n")
            && !first.contains("\r\n\r\n"),
        "{first:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_heads_are_large_and_never_finished() {
    let (addr, seen) = recording_server(Duration::from_millis(700), b"").await;
    let r = attack(Attack::MaxHeads, addr, 2, 1.0).await;
    assert!(r.opened >= 2, "{r:?}");
    let seen = seen.lock().unwrap();
    let head = &seen[0];
    assert!(head.len() > 12_000, "{}", head.len());
    assert!(!head.windows(4).any(|w| w == b"\r\n\r\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_client_acknowledges_settings_and_pings() {
    // SETTINGS (empty) and a PING, as a server would send them.
    static GREETING: &[u8] = &[
        0, 0, 0, 4, 0, 0, 0, 0, 0, // SETTINGS
        0, 0, 8, 6, 0, 0, 0, 0, 0, b'p', b'i', b'n', b'g', b'1', b'2', b'3', b'4', // PING
    ];
    let (addr, seen) = recording_server(Duration::from_millis(500), GREETING).await;
    let r = attack(Attack::H2Idle, addr, 1, 1.2).await;
    assert!(r.closed_by_server >= 1, "{r:?}");
    let seen = seen.lock().unwrap();
    let got = &seen[0];
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    assert!(got.starts_with(preface));
    let rest = &got[preface.len()..];
    let settings = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    let settings_ack = [0, 0, 0, 4, 1, 0, 0, 0, 0];
    let ping_ack = [
        0, 0, 8, 6, 1, 0, 0, 0, 0, b'p', b'i', b'n', b'g', b'1', b'2', b'3', b'4',
    ];
    assert_eq!(
        rest,
        [&settings[..], &settings_ack, &ping_ack].concat(),
        "its own SETTINGS, then the two acknowledgements, and no stream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_is_cut_off_by_an_http2_server_that_defends_itself() {
    let b = Backend::start(
        "127.0.0.1:0".parse().unwrap(),
        BackendConfig {
            name: "h2".into(),
            body_size: 16,
            http2: true,
            delay: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    let r = attack(Attack::RapidReset, b.addr, 2, 1.5).await;
    assert!(r.streams_reset >= 200, "{r:?}");
    // hyper's HTTP/2 server sends GOAWAY after too many streams reset before it accepted them.
    assert!(r.closed_by_server >= 1, "{r:?}");
    b.reset().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_target_is_counted_not_fatal() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r = attack(Attack::H2PrefaceHold, port, 2, 0.5).await;
    assert_eq!(r.opened, 0);
    assert!(r.connect_failed >= 2, "{r:?}");
}
