//! The `floor` peer's server as the scenarios start it: `sluice-bench floor-serve`, a process of
//! its own on 127.0.0.1, answering over a real TLS handshake; bad key material is a clear error
//! at start, not a server that fails every handshake.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use sluice_bench::load::{self, TlsSpec, TlsVersion, Verify};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-bench");

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn answer_within(
    addr: SocketAddr,
    tls: Option<&TlsSpec>,
    within: Duration,
) -> load::http1::Response {
    let end = tokio::time::Instant::now() + within;
    loop {
        match load::probe(addr, "bench.local", "/", tls, Duration::from_secs(2)).await {
            Ok(r) => return r,
            Err(e) if tokio::time::Instant::now() > end => panic!("no answer from {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test]
async fn floor_serve_answers_over_tls_with_the_body_size_asked() {
    let cert = sluice_bench::certs::rsa2048(&["bench.local"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&c, &cert.cert_pem).unwrap();
    std::fs::write(&k, &cert.key_pem).unwrap();
    let addr = free_addr();
    let _child = tokio::process::Command::new(BIN)
        .args([
            "floor-serve",
            "--listen",
            &addr.to_string(),
            "--body",
            "700",
        ])
        .arg("--cert")
        .arg(&c)
        .arg("--key")
        .arg(&k)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let tls = TlsSpec {
        version: TlsVersion::V12,
        verify: Verify::Insecure,
        resumption: false,
        server_name: "bench.local".into(),
    };
    let r = answer_within(addr, Some(&tls), Duration::from_secs(10)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.backend.as_str(), Some("floor"));
    // The 700-byte body behind a head of well under 100 bytes, and the close the probe asked
    // for.
    assert!((700..800).contains(&r.bytes), "{} bytes", r.bytes);
    assert!(r.close);
}

#[tokio::test]
async fn floor_serve_refuses_bad_pem_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.pem");
    std::fs::write(&bad, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(BIN)
            .args(["floor-serve", "--listen", &free_addr().to_string()])
            .arg("--cert")
            .arg(&bad)
            .arg("--key")
            .arg(&bad)
            .output(),
    )
    .await
    .expect("exits at once")
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.pem"), "{err}");
}
