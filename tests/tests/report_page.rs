//! The benchmark report a person opens: `index.html` written from real (short) load runs,
//! checked as text, and loaded in headless Chromium, whose layout of the plots is read back from
//! the page (ignored, with the reason, where Chromium is not installed: see `build.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_bench::backend::{Backend, BackendConfig};
use sluice_bench::load::{self, Hooks, LoadSpec, Mode};
use sluice_bench::report::{self, PeerResult, Report};

fn chromium() -> Option<std::path::PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|b| sluice_bench::sys::which(b))
}

async fn a_real_run(name: &str, rate: f64) -> PeerResult {
    let b = Backend::start(
        "127.0.0.1:0".parse().unwrap(),
        BackendConfig {
            name: "b1".into(),
            body_size: 1024,
            http2: false,
            delay: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    let spec = LoadSpec {
        addrs: vec![b.addr],
        host: "bench.local".into(),
        path: "/".into(),
        tls: None,
        mode: Mode::Open { rate },
        connections: 4,
        duration: Duration::from_secs(2),
        timeout: Duration::from_millis(500),
        keep_alive: true,
    };
    let l = tokio::time::timeout(Duration::from_secs(10), load::run(&spec, Hooks::default()))
        .await
        .unwrap()
        .unwrap();
    b.reset().await;
    PeerResult {
        name: name.into(),
        variant: "http".into(),
        ..PeerResult::default()
    }
    .with_load(&l)
}

/// A report of two real runs and a skipped peer, written into a fresh directory.
async fn written_report() -> tempfile::TempDir {
    let peers = vec![
        a_real_run("direct", 500.0).await,
        a_real_run("direct-again", 300.0).await,
        PeerResult::skipped("traefik", "http", "traefik not built".into()),
    ];
    let r = Report {
        scenario: "rps".into(),
        quick: true,
        what_it_shows: "a test report <with> markup to escape".into(),
        peers,
        ..Report::default()
    };
    let dir = tempfile::tempdir().unwrap();
    report::write_all(dir.path(), &r).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_the_summary_hold_every_run() {
    let dir = written_report().await;
    let page = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(page.contains("&lt;with&gt;"), "text is escaped");
    assert!(page.contains("traefik http: skipped: traefik not built"));
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert_eq!(
        summary.lines().filter(|l| l.starts_with("| rps |")).count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_chromium,
    ignore = "needs Chromium (apt-get install chromium); see tests/build.rs"
)]
async fn the_browser_draws_every_plot() {
    let dir = written_report().await;
    let browser = chromium().expect("build.rs found Chromium");
    let out = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=2000",
            "--dump-dom",
        ])
        .arg(format!(
            "file://{}",
            dir.path().join("index.html").display()
        ))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let attr = |name: &str| -> Option<usize> {
        let at = dom.find(&format!("{name}=\""))? + name.len() + 2;
        dom[at..].split('"').next()?.parse().ok()
    };
    let (plots, drawn) = (attr("data-plots"), attr("data-plots-drawn"));
    assert_eq!(
        plots,
        Some(2),
        "latency and timeline plots on the page; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(drawn, plots, "every plot laid out with something drawn");
    assert!(dom.contains("<table>") && dom.contains("direct-again"));
}
