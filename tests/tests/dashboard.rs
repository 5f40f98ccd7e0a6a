//! `manifests/grafana/sluice-dashboard.json` queries only metrics sluice exports: every
//! `sluice_*` name in every panel's expression is a sample name of the exposition (families
//! populated here so that each renders), so a renamed or removed metric breaks this test, not
//! an operator's dashboard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use sluice_proxy::telemetry::metrics::{
    CertInfoLabels, CertLabels, EndpointLabels, Metrics, ResultLabels, RetryLabels, RouteLabels,
    ServiceLabels,
};

/// Every sample name a running sluice can export.
fn exported() -> BTreeSet<String> {
    let m = Metrics::new();
    let svc = ServiceLabels {
        service: "ns/svc:80".into(),
    };
    m.requests
        .get_or_create(&RouteLabels {
            ingress: "ns/ing".into(),
            service: "ns/svc:80".into(),
            code: "2xx",
        })
        .inc();
    m.request_duration
        .get_or_create(&svc)
        .observe(Duration::from_millis(1));
    m.upstream_response_duration
        .get_or_create(&svc)
        .observe(Duration::from_millis(1));
    m.connect_errors.get_or_create(&svc).inc();
    m.ejections.get_or_create(&svc).inc();
    m.retries
        .get_or_create(&RetryLabels {
            service: "ns/svc:80".into(),
            reason: "connect_failed",
        })
        .inc();
    m.endpoints
        .get_or_create(&EndpointLabels {
            service: "ns/svc:80".into(),
            state: "up",
        })
        .set(1);
    m.config_applies
        .get_or_create(&ResultLabels { result: "applied" })
        .inc();
    m.config_apply_duration.observe(Duration::from_millis(1));
    m.propagation_delay.observe(Duration::from_millis(1));
    m.handshake_stats().ok(
        Some(rustls::ProtocolVersion::TLSv1_3),
        Duration::from_millis(1),
    );
    m.cert_expiry
        .get_or_create(&CertLabels {
            host: "a.test".into(),
        })
        .set(1);
    m.cert_info
        .get_or_create(&CertInfoLabels {
            host: "a.test".into(),
            serial: "01".into(),
        })
        .set(1);
    m.render()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let exported = exported();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/grafana/sluice-dashboard.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    let mut used = BTreeSet::new();
    for p in panels {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("sluice_"))
                .collect();
            assert!(!names.is_empty(), "{}: {expr}", p["title"]);
            for n in names {
                assert!(
                    exported.contains(n),
                    "{}: {n} is not exported; exported: {exported:?}",
                    p["title"]
                );
                used.insert(n.to_string());
            }
        }
    }
    // The families the issue names are on the dashboard.
    for must in [
        "sluice_tls_handshakes_total",
        "sluice_tls_handshake_duration_seconds_bucket",
        "sluice_tls_certificate_expiry_seconds",
        "sluice_upstream_response_duration_seconds_bucket",
        "sluice_upstream_retries_total",
    ] {
        assert!(used.contains(must), "{must} not on the dashboard");
    }
}
