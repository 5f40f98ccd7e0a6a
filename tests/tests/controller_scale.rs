//! Scale of `sluice controller` against the in-repo fake API server: 10,000 Ingresses, each with
//! its own Service and an EndpointSlice of 5 endpoints (50,000 endpoints), served to the real kube
//! client over HTTP. It measures, and prints:
//!
//! - time from start to ready (every reflector listed, first snapshot applied),
//! - per EndpointSlice change, the time from the fake API server publishing the change to the
//!   pool in the data plane holding the new endpoint (watch delivery over HTTP, kube decoding,
//!   the rebuild loop's fast path and the swap: what a user waits for), p50/p99/max,
//! - the rebuild loop's own processing time for those changes, from the
//!   `sluice_endpoint_propagation_delay_seconds` histogram (change received → pool swapped),
//! - resident memory before the controller starts (fake populated) and once it is ready.
//!
//! Slow, so ignored by default. Run it optimised:
//!
//! ```sh
//! cargo test --release -p sluice-tests --test controller_scale -- --ignored --nocapture
//! SLUICE_SCALE_INGRESSES=1000 cargo test ...   # smaller
//! ```
//!
//! The fake shares the process, so the memory figure is the controller's growth, not a
//! separate process's RSS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;
use sluice_tests::fake_api::FakeApi;
use sluice_tests::*;

const PER_SLICE: u32 = 5;

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Endpoint address `j` of service `i`: 10.x.y.z, unique per (i, j).
fn addr(i: u32, j: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a00_0000 + i * 16 + j)
}

fn slice(i: u32, first: u32) -> Value {
    let addrs: Vec<Ipv4Addr> = (first..first + PER_SLICE).map(|j| addr(i, j)).collect();
    numbered_slice(i, &addrs)
}

/// `q`-quantile of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A Prometheus histogram from a text exposition: cumulative buckets, sum, count.
struct Hist {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Hist {
    /// The observations made between `before` and `self`.
    fn since(&self, before: &Hist) -> Hist {
        Hist {
            buckets: self
                .buckets
                .iter()
                .zip(&before.buckets)
                .map(|((le, a), (_, b))| (*le, a - b))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// Upper bound of the bucket holding the `q`-quantile.
    fn bound(&self, q: f64) -> f64 {
        let want = self.count * q;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want)
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

fn histogram(metrics: &str, name: &str) -> Hist {
    let mut buckets = Vec::new();
    let (mut sum, mut count) = (0.0, 0.0);
    for l in metrics.lines() {
        if let Some(rest) = l.strip_prefix(&format!("{name}_bucket{{le=\"")) {
            let (le, v) = rest.split_once("\"} ").unwrap();
            buckets.push((
                le.parse::<f64>().unwrap_or(f64::INFINITY),
                v.parse::<f64>().unwrap(),
            ));
        } else if let Some(v) = l.strip_prefix(&format!("{name}_sum ")) {
            sum = v.parse().unwrap();
        } else if let Some(v) = l.strip_prefix(&format!("{name}_count ")) {
            count = v.parse().unwrap();
        }
    }
    Hist {
        buckets,
        sum,
        count,
    }
}

async fn propagation(
    http: &Client<HttpConnector, Empty<Bytes>>,
    admin: std::net::SocketAddr,
) -> Hist {
    let metrics = get(http, admin, "x", "/metrics").await.unwrap();
    histogram(
        &String::from_utf8_lossy(&metrics.body),
        "sluice_endpoint_propagation_delay_seconds",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scale measurement: run with --release -- --ignored --nocapture"]
async fn ten_thousand_ingresses_fifty_thousand_endpoints() {
    let n: u32 = std::env::var("SLUICE_SCALE_INGRESSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let changes: usize = 50;
    let fake = FakeApi::start().await;
    let t = Instant::now();
    many_services(&fake, n, "scale.test", |i| slice(i, 0));
    println!(
        "fake populated: {n} Ingresses, {n} Services, {n} EndpointSlices ({} endpoints) in {:.2?}",
        n * PER_SLICE,
        t.elapsed()
    );
    let rss_before = rss_bytes();

    let started = Instant::now();
    let c = controller(&fake, "scale", &[]).await;
    let admin = c.running.admin_addr;
    let http = client();
    let became_ready = eventually(Duration::from_secs(300), || {
        let http = http.clone();
        async move {
            get(&http, admin, "x", "/readyz")
                .await
                .map(|r| r.status == 200)
                .unwrap_or(false)
        }
    })
    .await;
    assert!(became_ready, "not ready within 300 s");
    let ready = started.elapsed();
    let rss_ready = rss_bytes();
    let dp = std::sync::Arc::clone(&c.running.dp);
    let clusters = dp.clusters();
    assert_eq!(clusters.len(), n as usize, "one pool per Service");
    let endpoints: usize = clusters
        .iter()
        .map(|c| c.endpoints.load().ready.len())
        .sum();
    assert_eq!(
        endpoints,
        (n * PER_SLICE) as usize,
        "every endpoint is in a pool"
    );
    println!(
        "ready after {ready:.2?}; RSS {:.0} MiB before start, {:.0} MiB ready (+{:.0} MiB)",
        rss_before as f64 / 1048576.0,
        rss_ready as f64 / 1048576.0,
        (rss_ready.saturating_sub(rss_before)) as f64 / 1048576.0
    );

    let before = propagation(&http, admin).await;
    // One EndpointSlice change at a time, spread over the services: replace the slice's
    // endpoints with fresh addresses and time until the pool holds them.
    let mut delays = Vec::with_capacity(changes);
    for k in 0..changes {
        let i = (k as u32 * 7919) % n;
        let cluster = clusters
            .iter()
            .find(|c| c.key.service == format!("svc-{i}"))
            .map(std::sync::Arc::clone)
            .unwrap();
        let first = PER_SLICE * (1 + k as u32 % 2);
        let want: std::net::SocketAddr = (addr(i, first), 8080).into();
        let t = Instant::now();
        fake.apply(slice(i, first));
        loop {
            if cluster
                .endpoints
                .load()
                .ready
                .iter()
                .any(|e| e.addr == want)
            {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "change {k} not applied"
            );
            tokio::time::sleep(Duration::from_micros(50)).await;
        }
        delays.push(t.elapsed());
        // Space the changes so each is measured on its own, not coalesced with the next.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    delays.sort();
    let h = propagation(&http, admin).await.since(&before);
    println!(
        "{changes} EndpointSlice changes, fake publishes → pool swapped: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        quantile(&delays, 0.5),
        quantile(&delays, 0.99),
        delays[delays.len() - 1]
    );
    println!(
        "rebuild loop, change received → pool swapped (sluice_endpoint_propagation_delay_seconds, {} observations): mean {:.1} µs, p50 ≤ {} s, p99 ≤ {} s (bucket bounds)",
        h.count,
        h.sum / h.count.max(1.0) * 1e6,
        h.bound(0.5),
        h.bound(0.99)
    );
    assert!(h.count >= changes as f64, "every change was recorded");
    c.shutdown(Duration::from_secs(5)).await;
}
