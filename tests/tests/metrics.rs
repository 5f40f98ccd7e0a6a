//! `/metrics` as Prometheus reads it: the text a running `sluice serve` exports after real
//! traffic, checked by the reference parser (the Prometheus Python client's OpenMetrics parser,
//! which rejects a histogram whose buckets are not cumulative, lack `+Inf`, or disagree with
//! `_count`) and by the same rules written out here, so the rules are checked even where that
//! parser is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::*;

/// A serve instance that has answered `ok` 200s, one 404 and one 503, and applied an endpoint
/// change; returns its `/metrics` text.
async fn scrape_after_traffic(ok: usize) -> String {
    let (a, b) = (backend("a").await, backend("b").await);
    let m = Manifests::new();
    m.write("class.yaml", &ingress_class());
    m.write("svc.yaml", &service("svc-a"));
    m.write("eps.yaml", &endpoint_slices("svc-a", &[a.addr]));
    m.write(
        "ing.yaml",
        &[
            ingress("one", "app.test", &[("/", "Prefix", "svc-a")]),
            ingress("ghost", "ghost.test", &[("/", "Prefix", "nope")]),
        ]
        .join("---\n"),
    );
    let s = serve(m.dir.path(), &[]).await;
    let http = s.running.http_addr.unwrap();
    let c = client();
    for _ in 0..ok {
        assert_eq!(get(&c, http, "app.test", "/").await.unwrap().status, 200);
    }
    assert_eq!(get(&c, http, "nobody.test", "/").await.unwrap().status, 404);
    // Two TLS handshakes (TLS 1.3, the client's default) and one that fails (not TLS at all).
    let https = s.running.https_addr.unwrap();
    for _ in 0..2 {
        assert!(tls_serial(https, "app.test").await.is_some());
    }
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut raw = tokio::net::TcpStream::connect(https).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut sink = Vec::new();
        let _ = raw.read_to_end(&mut sink).await;
    }
    assert_eq!(get(&c, http, "ghost.test", "/").await.unwrap().status, 503);
    m.write("eps.yaml", &endpoint_slices("svc-a", &[a.addr, b.addr]));
    assert!(
        eventually(Duration::from_secs(5), || async {
            let r = get(&c, s.running.admin_addr, "localhost", "/api/v1/status").await;
            r.is_ok_and(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["endpoints"] == 2
            })
        })
        .await,
        "the endpoint change took effect"
    );
    let r = get(&c, s.running.admin_addr, "localhost", "/metrics")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    s.shutdown(Duration::from_secs(3)).await;
    r.text()
}

/// One sample line: name, labels (sorted), value.
type Sample = (String, BTreeMap<String, String>, f64);

fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap();
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (head, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            (name.to_string(), labels, value)
        })
        .collect()
}

/// Checks every histogram's series; returns each series' `_count`, keyed by
/// `name{labels without le}`.
fn check_histograms(text: &str) -> BTreeMap<String, f64> {
    let histograms: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .collect();
    assert!(histograms.len() >= 3, "histogram families: {histograms:?}");
    let all = samples(text);
    let mut counts = BTreeMap::new();
    for h in histograms {
        let mut series: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
        for (name, labels, value) in &all {
            let key = |l: &BTreeMap<String, String>| {
                let rest: Vec<String> = l
                    .iter()
                    .filter(|(k, _)| *k != "le")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!("{h}{{{}}}", rest.join(","))
            };
            if name == &format!("{h}_bucket") {
                series
                    .entry(key(labels))
                    .or_default()
                    .push((labels["le"].clone(), *value));
            } else if name == &format!("{h}_count") {
                counts.insert(key(labels), *value);
            }
        }
        assert!(!series.is_empty(), "{h}: no series");
        for (key, buckets) in &series {
            let (last_le, last) = buckets.last().unwrap();
            assert_eq!(last_le, "+Inf", "{key}: the last bucket must be +Inf");
            assert_eq!(Some(last), counts.get(key), "{key}: +Inf bucket == _count");
            let mut prev: Option<(f64, f64)> = None;
            for (le, n) in buckets {
                let bound: f64 = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                if let Some((pb, pn)) = prev {
                    assert!(bound > pb, "{key}: bounds ascend ({pb} then {bound})");
                    assert!(*n >= pn, "{key}: buckets are cumulative ({pn} then {n})");
                }
                prev = Some((bound, *n));
            }
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_are_cumulative_once_and_end_in_inf() {
    let text = scrape_after_traffic(3).await;
    let counts = check_histograms(&text);
    let pool = counts
        .iter()
        .find(|(k, _)| k.starts_with("sluice_request_duration_seconds{service=default/svc-a"))
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no request duration series for svc-a: {counts:?}"));
    assert_eq!(pool, 3.0, "one observation per proxied request");
    // Each request lands in exactly one bucket: the buckets of a series with n observations
    // never add up past n (double cumulation turned 1 observation into 0,0,1,2,3,…).
    for (name, labels, value) in samples(&text) {
        if name.ends_with("_bucket") {
            let mut l = labels.clone();
            l.remove("le");
            let h = name.trim_end_matches("_bucket");
            let rest: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let key = format!("{h}{{{}}}", rest.join(","));
            assert!(value <= counts[&key], "{name}{labels:?} = {value} > count");
        }
    }
    assert!(
        counts
            .get("sluice_endpoint_propagation_delay_seconds{}")
            .is_some_and(|c| *c >= 1.0),
        "{counts:?}"
    );
    // The families operators alert on: handshakes by version and result, their duration,
    // upstream response time by pool, retries by reason (certificate expiry per host is checked
    // in tests/tls.rs).
    let value = |name: &str, want: &[(&str, &str)]| {
        samples(&text)
            .into_iter()
            .find(|(n, l, _)| {
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| v)
    };
    assert_eq!(
        value(
            "sluice_tls_handshakes_total",
            &[("version", "TLSv1.3"), ("result", "ok")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        value("sluice_tls_handshakes_total", &[("result", "error")]),
        Some(1.0)
    );
    assert_eq!(
        counts.get("sluice_tls_handshake_duration_seconds{}"),
        Some(&2.0)
    );
    assert_eq!(
        counts.get("sluice_upstream_response_duration_seconds{service=default/svc-a:80}"),
        Some(&3.0),
        "{counts:?}"
    );
    for reason in [
        "connect_failed",
        "closed_before_send",
        "idle_connection_closed",
        "broke_after_send",
    ] {
        assert_eq!(
            value(
                "sluice_upstream_retries_total",
                &[("service", "default/svc-a:80"), ("reason", reason)]
            ),
            Some(0.0),
            "{reason}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_prometheus_parser,
    ignore = "the Prometheus Python client is not installed (Debian: python3-prometheus-client)"
)]
async fn the_reference_parser_accepts_the_exposition() {
    let text = scrape_after_traffic(2).await;
    let python = option_env!("SLUICE_TEST_PYTHON").unwrap_or("python3");
    let script = "import sys\n\
from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
fams = list(text_string_to_metric_families(sys.stdin.read()))\n\
hist = [f for f in fams if f.type == 'histogram']\n\
print(len(fams), len(hist), sum(1 for f in hist for s in f.samples if s.name.endswith('_bucket')))\n";
    let mut child = std::process::Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser rejected /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(counts[0] >= 10, "families: {counts:?}");
    assert!(counts[1] >= 3, "histogram families: {counts:?}");
    assert!(counts[2] > 0, "bucket samples: {counts:?}");
}
