//! The access log as an operator reads it: `sluice serve --access-log --log-format json` on
//! stdout, one JSON object per request, for requests the fast path forwards, ones the general
//! handler takes (a body), local answers (404, 503) — and a failed request's 5xx also named in
//! the warn log on stderr, with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::Duration;

mod common;
use common::{args, lines_of, manifests, pod, serve};

fn request(addr: SocketAddr, raw: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn json_access_log_has_a_line_per_request_and_5xx_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), pod());
    let flags = [
        "--http-listen",
        "127.0.0.1:0",
        "--https-listen",
        "off",
        "--admin-listen",
        "127.0.0.1:0",
        "--access-log",
        "--log-format",
        "json",
    ];
    let mut child = serve(dir.path(), &args(&flags), Stdio::piped());
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    let mut http = None;
    while http.is_none() {
        let line = err
            .recv_timeout(Duration::from_secs(20))
            .expect("sluice started");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["message"] == "listening" {
            http = v["http"].as_str().map(|a| a.parse::<SocketAddr>().unwrap());
        }
    }
    let http = http.unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let fast = request(
        http,
        "GET /a?b=1 HTTP/1.1\r\nHost: app.test\r\nX-Request-ID: rid-1\r\nConnection: close\r\n\r\n",
    );
    assert!(fast.starts_with("HTTP/1.1 200"), "{fast}");
    let general = request(
        http,
        "POST /p HTTP/1.1\r\nHost: app.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert!(general.starts_with("HTTP/1.1 200"), "{general}");
    let missing = request(
        http,
        "GET / HTTP/1.1\r\nHost: nobody.test\r\nConnection: close\r\n\r\n",
    );
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    let ghost = request(
        http,
        "GET / HTTP/1.1\r\nHost: ghost.test\r\nConnection: close\r\n\r\n",
    );
    assert!(ghost.starts_with("HTTP/1.1 503"), "{ghost}");

    let mut got = Vec::new();
    while got.len() < 4 {
        let line = out
            .recv_timeout(Duration::from_secs(10))
            .expect("an access line per request");
        got.push(
            serde_json::from_str::<serde_json::Value>(&line)
                .unwrap_or_else(|e| panic!("{e}: {line}")),
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let by_host = |h: &str| got.iter().find(|v| v["host"] == h).unwrap().clone();
    let fast = got
        .iter()
        .find(|v| v["method"] == "GET" && v["host"] == "app.test")
        .unwrap();
    assert_eq!(fast["path"], "/a?b=1");
    assert_eq!(fast["status"], 200);
    assert_eq!(fast["bytes"], 2);
    assert_eq!(fast["client"], "127.0.0.1");
    assert_eq!(fast["request_id"], "rid-1");
    assert_eq!(fast["ingress"], "default/web");
    assert_eq!(fast["service"], "default/svc:80");
    assert_eq!(fast["upstream_status"], 200);
    assert!(fast["upstream"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(fast["retries"], 0);
    let post = got.iter().find(|v| v["method"] == "POST").unwrap();
    assert_eq!(post["status"], 200);
    assert_eq!(post["request_id"].as_str().unwrap().len(), 32, "generated");
    assert_eq!(post["upstream_status"], 200);
    let nobody = by_host("nobody.test");
    assert_eq!(nobody["status"], 404);
    assert!(nobody["upstream"].is_null());
    let ghost = by_host("ghost.test");
    assert_eq!(ghost["status"], 503);
    assert_eq!(ghost["ingress"], "default/web");

    // The 503 is also explained on stderr: which Ingress, and why.
    let mut explained = false;
    while let Ok(line) = err.recv_timeout(Duration::from_millis(500)) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["level"] == "WARN" && v["status"] == 503 {
            let msg = v["message"].as_str().unwrap_or_default();
            assert!(
                msg.contains("default/web") && msg.contains("nope"),
                "{line}"
            );
            explained = true;
        }
    }
    assert!(explained, "no warn line for the 503");
}
