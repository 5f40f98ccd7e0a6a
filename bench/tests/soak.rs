//! The soak's short form, as CI runs it: `sluice-bench soak --quick` for a minute against the
//! sluice built beside it, with every part of the mix (HTTPS keep-alive, HTTP/2, WebSocket,
//! pods killed, Ingress/Secret/ConfigMap changes, an attack burst), read back from the report
//! it writes. The verdict is the tool's own (no legitimate request failed, RSS and
//! descriptors flat over the second half); this test checks that every part really ran and
//! was measured, and that the verdict is what the samples say.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sluice-bench");

fn sluice_bin() -> PathBuf {
    let dir = PathBuf::from(BIN).parent().unwrap().to_path_buf();
    dir.join("sluice")
}

#[test]
fn a_minute_of_the_soak_holds_and_measures_every_part() {
    let sluice = sluice_bin();
    assert!(
        sluice.exists(),
        "{} is missing: build it first (cargo build -p sluice; cargo test --workspace builds it)",
        sluice.display()
    );
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(BIN)
        .args([
            "soak",
            "--quick",
            "--no-pin",
            "--duration",
            "60",
            "--rate",
            "150",
            "--connections",
            "10",
            "--attack-connections",
            "60",
        ])
        .arg("--sluice-bin")
        .arg(&sluice)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    let report = std::fs::read_to_string(out.path().join("report.json"))
        .unwrap_or_else(|e| panic!("no report.json ({e}): {stderr}"));
    let r: serde_json::Value = serde_json::from_str(&report).unwrap();
    let soak = &r["soak"];
    let samples = soak["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 6, "{soak}");
    for s in samples {
        for kind in ["https", "h2", "ws"] {
            assert!(
                s[kind]["requests"].as_u64().unwrap() > 0,
                "no {kind} traffic in {s}"
            );
        }
        assert!(s["rss_bytes"].as_u64().unwrap() > 0, "{s}");
        assert!(s["fds"].as_u64().unwrap() > 0, "{s}");
        assert!(
            s["tasks"].as_u64().unwrap() > 0,
            "no runtime tasks read: {s}"
        );
        assert!(s["upstream_connections"].as_u64().unwrap() > 0, "{s}");
    }
    let c = &soak["changes"];
    for k in [
        "ingress",
        "secret",
        "configmap",
        "rotations_seen",
        "endpoint_changes",
        "attacks",
    ] {
        assert!(c[k].as_u64().unwrap() > 0, "no {k}: {c}");
    }
    // Every change made was seen in effect.
    assert_eq!(
        c["rotations_seen"], c["secret"],
        "a certificate rotation did not show: {c}"
    );
    assert_eq!(
        c["applied"].as_u64().unwrap(),
        c["ingress"].as_u64().unwrap() + c["configmap"].as_u64().unwrap(),
        "an Ingress or ConfigMap change did not show: {c}"
    );
    assert!(samples.iter().any(|s| s["attack"].is_string()), "{soak}");
    let failed: u64 = samples
        .iter()
        .map(|s| {
            ["https", "h2", "ws"]
                .iter()
                .map(|k| s[*k]["failed"].as_u64().unwrap())
                .sum::<u64>()
        })
        .sum();
    assert_eq!(failed, 0, "legitimate requests failed: {soak}");
    assert_eq!(soak["survived"], true);
    assert_eq!(soak["held"], true, "{}", soak["why_not"]);
    assert!(
        run.status.success(),
        "held, yet it exited with {}: {stderr}",
        run.status
    );
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("## Soak") && md.contains("**Held**"), "{md}");
    let svg = std::fs::read_to_string(out.path().join("soak.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 8, "{svg}");
}
