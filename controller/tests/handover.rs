//! Replacing `sluice serve` under load with `--handover`, three generations of real processes
//! (two back-to-back replacements) under about 1,100 requests a second, counting every request:
//! HTTP/1.1 keep-alive clients and clients that open a new connection per request run
//! throughout, on loopback. Every request
//! must be answered 200 and no connection refused or reset. The old process also gets the
//! SIGTERM a kubelet sends once the new pod is ready: it changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{lines_of, manifests, pod, serve};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Ports {
    http: SocketAddr,
    https: SocketAddr,
    admin: SocketAddr,
}

/// A `sluice serve` generation; its stderr is kept line by line.
struct Generation {
    child: Child,
    log: std::sync::mpsc::Receiver<String>,
}

fn start(dir: &std::path::Path, ports: &Ports) -> Generation {
    let flags = [
        "--http-listen".to_string(),
        ports.http.to_string(),
        "--https-listen".into(),
        ports.https.to_string(),
        "--admin-listen".into(),
        ports.admin.to_string(),
        "--shutdown-timeout".into(),
        "3".into(),
        "--log-format".into(),
        "json".into(),
        "--handover".into(),
        dir.join("run").join("handover.sock").display().to_string(),
    ];
    let mut child = serve(&dir.join("manifests"), &flags, Stdio::null());
    let log = lines_of(child.stderr.take().unwrap());
    Generation { child, log }
}

impl Generation {
    /// Waits for a log line whose message contains `what`; returns it.
    fn wait_for(&self, what: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self
                .log
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no log line with {what:?}"));
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"].as_str().is_some_and(|m| m.contains(what)) {
                return line;
            }
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Waits for the process to exit; returns whether it exited cleanly.
    fn exited(&mut self, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    /// Idempotent requests sent again on a new connection because a reused one closed before
    /// any byte of the answer (what HTTP clients do, RFC 9110 §9.2.2).
    retried: AtomicU64,
}

/// Reads one response (head and `content-length` body); returns the status line and whether
/// the server asked to close. `Err` with how many bytes came first.
fn read_response(s: &mut TcpStream) -> Result<(String, bool), usize> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => return Err(buf.len()),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let status = head.lines().next().unwrap_or_default().to_string();
            return Ok((status, head.contains("connection: close")));
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return Err(buf.len()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn connect(at: SocketAddr, counts: &Counts) -> Option<TcpStream> {
    match TcpStream::connect_timeout(&at, Duration::from_secs(2)) {
        Ok(s) => {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            Some(s)
        }
        Err(e) => {
            eprintln!("connect: {e}");
            counts.refused.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: app.test\r\n\r\n";
const GET_CLOSE: &[u8] = b"GET /x HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n";

/// A keep-alive client: one connection for as long as the server keeps it.
fn keep_alive(at: SocketAddr, counts: &Counts, stop: &AtomicBool, pause: Duration) {
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let reused = conn.is_some();
        let Some(mut s) = conn.take().or_else(|| connect(at, counts)) else {
            continue;
        };
        let answer = s
            .write_all(GET)
            .map_err(|_| 0)
            .and_then(|()| read_response(&mut s));
        let answer = match answer {
            Err(0) if reused => {
                counts.retried.fetch_add(1, Ordering::Relaxed);
                let Some(mut fresh) = connect(at, counts) else {
                    continue;
                };
                let again = fresh
                    .write_all(GET)
                    .map_err(|_| 0)
                    .and_then(|()| read_response(&mut fresh));
                s = fresh;
                again
            }
            other => other,
        };
        match answer {
            Ok((status, close)) if status.starts_with("http/1.1 200") => {
                counts.ok.fetch_add(1, Ordering::Relaxed);
                if !close {
                    conn = Some(s);
                }
            }
            other => {
                eprintln!("keep-alive: {other:?}");
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(pause);
    }
}

/// A client that opens a new connection for every request.
fn new_connections(at: SocketAddr, counts: &Counts, stop: &AtomicBool, pause: Duration) {
    while !stop.load(Ordering::Relaxed) {
        if let Some(mut s) = connect(at, counts) {
            let answer = s
                .write_all(GET_CLOSE)
                .map_err(|_| 0)
                .and_then(|()| read_response(&mut s));
            match answer {
                Ok((status, _)) if status.starts_with("http/1.1 200") => {
                    counts.ok.fetch_add(1, Ordering::Relaxed);
                }
                other => {
                    eprintln!("new connection: {other:?}");
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        std::thread::sleep(pause);
    }
}

fn https_answers(at: SocketAddr) -> bool {
    let out = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg("--resolve")
        .arg(format!("app.test:{}:127.0.0.1", at.port()))
        .arg(format!("https://app.test:{}/", at.port()))
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout) == "200",
        Err(_) => {
            eprintln!("skipped the HTTPS check: no curl on this machine");
            true
        }
    }
}

#[test]
fn three_generations_under_load_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
    manifests(&dir.path().join("manifests"), pod());
    let ports = Ports {
        http: SocketAddr::from(([127, 0, 0, 1], free_port())),
        https: SocketAddr::from(([127, 0, 0, 1], free_port())),
        admin: SocketAddr::from(([127, 0, 0, 1], free_port())),
    };
    let mut current = start(dir.path(), &ports);
    current.wait_for("handover: no process serves here", Duration::from_secs(30));
    current.wait_for("listening", Duration::from_secs(30));

    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for i in 0..10 {
        let (counts, stop) = (Arc::clone(&counts), Arc::clone(&stop));
        let at = ports.http;
        load.push(std::thread::spawn(move || {
            let pause = Duration::from_millis(8);
            if i % 2 == 0 {
                keep_alive(at, &counts, &stop, pause);
            } else {
                new_connections(at, &counts, &stop, pause);
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut replaced = Vec::new();
    for generation in 2..=3 {
        let before = counts.ok.load(Ordering::Relaxed);
        let started = Instant::now();
        let next = start(dir.path(), &ports);
        next.wait_for(
            "handover: took the listening sockets over",
            Duration::from_secs(30),
        );
        next.wait_for(
            "handover: the predecessor stopped accepting",
            Duration::from_secs(30),
        );
        // What a kubelet sends the old pod once the new one is ready: nothing changes.
        current.signal("-TERM");
        assert!(
            current.exited(Duration::from_secs(10)),
            "generation {} drained and exited cleanly",
            generation - 1
        );
        replaced.push(started.elapsed());
        current = next;
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            counts.ok.load(Ordering::Relaxed) > before,
            "generation {generation} serves"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    let (ok, failed, refused, retried) = (
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.retried.load(Ordering::Relaxed),
    );
    println!(
        "{ok} answered, {failed} failed, {refused} refused, {retried} retried on a new connection; replacements took {replaced:?}"
    );
    assert_eq!((failed, refused), (0, 0));
    assert!(ok > 500, "load ran: {ok}");
    assert!(https_answers(ports.https), "the HTTPS socket came along");
    let mut admin = TcpStream::connect(ports.admin).unwrap();
    admin
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut r = String::new();
    admin.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
}
