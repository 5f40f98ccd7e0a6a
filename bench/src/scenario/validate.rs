//! `validate`: the same target, connections and duration, closed loop, measured by wrk and by
//! our generator, so the two throughput figures can be compared on this machine.

use std::collections::BTreeMap;

use super::{Common, secs};
use crate::load::{self, Hooks, LoadSpec};
use crate::peers::{HOST, Peer, PeerKind, Proto};
use crate::pods::Pods;
use crate::report::Report;

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
        let spec = LoadSpec {
            addrs: vec![peer.target],
            host: HOST.into(),
            ..LoadSpec::closed(connections, duration, c.timeout, true)
        };
        match load::wrk::run(&spec, 1, Hooks::default()).await {
            Ok(l) => row(
                "wrk -t1",
                l.achieved_rps,
                l.latency_ms.p50,
                l.latency_ms.p99,
                l.requests_failed,
            ),
            Err(e) => eprintln!("validate: {e}"),
        }
        eprintln!(
            "validate: sluice-bench closed loop -c{connections} against {} ...",
            kind.name()
        );
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
        soak: None,
        idle: Vec::new(),
    }
}
