//! `validate`: the same target, connections and duration, closed loop, measured by wrk and by
//! our generator, so the two throughput figures can be compared on this machine.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::{Common, secs};
use crate::load::{self, Hooks, LoadSpec};
use crate::peers::{HOST, Peer, PeerKind, Proto};
use crate::pods::Pods;
use crate::report::Report;

/// wrk's figures parsed from its output.
#[derive(Debug, Default, PartialEq)]
pub struct WrkOut {
    /// Requests/sec.
    pub rps: f64,
    /// p50 (ms).
    pub p50_ms: f64,
    /// p99 (ms).
    pub p99_ms: f64,
    /// Socket errors + non-2xx.
    pub errors: u64,
}

fn wrk_ms(v: &str) -> f64 {
    let v = v.trim();
    let num = |s: &str| s.parse::<f64>().unwrap_or(0.0);
    if let Some(x) = v.strip_suffix("us") {
        num(x) / 1000.0
    } else if let Some(x) = v.strip_suffix("ms") {
        num(x)
    } else if let Some(x) = v.strip_suffix('s') {
        num(x) * 1000.0
    } else if let Some(x) = v.strip_suffix('m') {
        num(x) * 60_000.0
    } else {
        num(v)
    }
}

/// Parses wrk's `--latency` output.
pub fn parse_wrk(out: &str) -> WrkOut {
    let mut w = WrkOut::default();
    for line in out.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            w.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("50%") {
            w.p50_ms = wrk_ms(v);
        } else if let Some(v) = line.strip_prefix("99%") {
            w.p99_ms = wrk_ms(v);
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            w.errors += v
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            w.errors += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    w
}

async fn wrk(addr: SocketAddr, connections: usize, duration: Duration) -> Result<WrkOut, String> {
    let bin = crate::sys::which("wrk").ok_or("wrk not installed")?;
    let out = tokio::process::Command::new(bin)
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{}s", duration.as_secs()),
            "--latency",
            "-H",
            &format!("Host: {HOST}"),
        ])
        .arg(format!("http://{addr}/"))
        .output()
        .await
        .map_err(|e| format!("wrk: {e}"))?;
    Ok(parse_wrk(&String::from_utf8_lossy(&out.stdout)))
}

/// Runs wrk and our generator against direct and (if available) sluice.
pub async fn run(c: &Common) -> Report {
    let connections = c.connections.unwrap_or(100);
    let duration = c.duration.unwrap_or(secs(if c.quick { 5.0 } else { 15.0 }));
    let mut rows = Vec::new();
    let mut env = c.env.clone();
    env.proto = Proto::Http;
    for kind in [PeerKind::Direct, PeerKind::Sluice] {
        if !c.peers.contains(&kind) {
            continue;
        }
        let mut pods = Pods::new(1024);
        if pods.add(5).await.is_err() {
            continue;
        }
        let peer = match Peer::start(kind, &env, &pods.endpoints()).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("validate: {} did not start: {e}", kind.name());
                pods.stop_all().await;
                continue;
            }
        };
        let mut row = |tool: &str, rps: f64, p50: f64, p99: f64, errors: u64| {
            let mut m = BTreeMap::new();
            m.insert("target".into(), kind.name().to_string());
            m.insert("tool".into(), tool.to_string());
            m.insert("connections".into(), connections.to_string());
            m.insert("rps".into(), format!("{rps:.0}"));
            m.insert("p50_ms".into(), format!("{p50:.3}"));
            m.insert("p99_ms".into(), format!("{p99:.3}"));
            m.insert("errors".into(), errors.to_string());
            rows.push(m);
        };
        eprintln!(
            "validate: wrk -t1 -c{connections} against {} ...",
            kind.name()
        );
        match wrk(peer.target, connections, duration).await {
            Ok(w) => row("wrk -t1", w.rps, w.p50_ms, w.p99_ms, w.errors),
            Err(e) => eprintln!("validate: {e}"),
        }
        eprintln!(
            "validate: sluice-bench closed loop -c{connections} against {} ...",
            kind.name()
        );
        let spec = LoadSpec {
            addrs: vec![peer.target],
            host: HOST.into(),
            ..LoadSpec::closed(connections, duration, c.timeout, true)
        };
        match load::run(&spec, Hooks::default()).await {
            Ok(l) => row(
                "sluice-bench",
                l.achieved_rps,
                l.latency_ms.p50,
                l.latency_ms.p99,
                l.requests_failed,
            ),
            Err(e) => eprintln!("validate: {e}"),
        }
        peer.stop().await;
        pods.stop_all().await;
    }
    let mut settings = BTreeMap::new();
    settings.insert("load".into(), format!("closed loop, {connections} keep-alive HTTP connections, {}s, 1 KB responses; wrk with one thread, sluice-bench on its runtime (same CPU set)", duration.as_secs()));
    Report {
        scenario: "validate".into(),
        quick: c.quick,
        started_utc: String::new(),
        command: c.command.clone(),
        what_it_shows: "The load generator checked against wrk: same target, same connections, closed loop. Throughput should agree within a few percent when the target is the bottleneck (sluice pinned to its own core); straight at a backend sharing the generator's core the generators' own costs show.".into(),
        machine: c.machine.clone(),
        settings,
        peers: Vec::new(),
        scale: Vec::new(),
        extra: rows,
        rounds: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_wrk() {
        let out = "Running 5s test @ http://127.0.0.1:1/\n  Latency Distribution\n     50%  412.00us\n     99%    2.10ms\n  100000 requests in 5.00s, 110.00MB read\n  Socket errors: connect 0, read 3, write 0, timeout 1\n  Non-2xx or 3xx responses: 2\nRequests/sec:  20000.50\n";
        let w = super::parse_wrk(out);
        assert_eq!(w.rps, 20000.5);
        assert!((w.p50_ms - 0.412).abs() < 1e-9);
        assert!((w.p99_ms - 2.1).abs() < 1e-9);
        assert_eq!(w.errors, 6);
    }
}
