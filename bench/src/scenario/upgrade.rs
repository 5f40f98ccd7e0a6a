//! `upgrade`: each peer's own process replaced twice under constant load, the way its users
//! replace it ([`crate::peers::Peer::replace`]), once per kind of load: HTTPS keep-alive, HTTP
//! with a new connection per request, and HTTP/2 (h2load). What counts: requests that got no
//! 2xx (FAILED), refused or failed connects, and the p99 of the seconds the replacements happen
//! in, beside the run's p99.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::churn::Driven;
use super::{Common, RunSetup, run_one, secs};
use crate::load::{LoadSpec, Mode, TlsVersion};
use crate::peers::{Peer, PeerKind, Proto};
use crate::report::{Event, PeerResult, Report};

/// The variant suffix of HAProxy's reload without `expose-fd listeners`.
const NO_X: &str = " (haproxy without -x)";

/// The kinds of load, each its own run per peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    HttpsKeepAlive,
    HttpNewConnection,
    H2,
}

impl Load {
    const ALL: [Load; 3] = [Load::HttpsKeepAlive, Load::HttpNewConnection, Load::H2];

    fn name(self) -> &'static str {
        match self {
            Load::HttpsKeepAlive => "https-keepalive",
            Load::HttpNewConnection => "http-new-conn",
            Load::H2 => "h2",
        }
    }
}

/// Replaces the peer's process at each of `at` (from `t0`), recording when and how.
pub async fn drive(peer: &mut Peer, t0: Instant, at: &[Duration]) -> Vec<Driven> {
    let mut out = Vec::new();
    for (n, when) in at.iter().enumerate() {
        tokio::time::sleep_until(t0 + *when).await;
        let started = Instant::now();
        match peer.replace(n + 2).await {
            Ok(how) => out.push(Driven::Event(Event {
                t_s: started.saturating_duration_since(t0).as_secs_f64(),
                what: format!("replaced: {how}"),
                endpoint_change: false,
                applied_s: Some(Instant::now().saturating_duration_since(t0).as_secs_f64()),
                acked_s: None,
            })),
            Err(e) => out.push(Driven::Note(format!("replacement {}: {e}", n + 1))),
        }
    }
    out
}

/// The p99 of the seconds the replacements started in (ms), worst first.
fn replacement_seconds(r: &PeerResult) -> Vec<(u32, f64, u64)> {
    let mut out: Vec<(u32, f64, u64)> = r
        .events
        .iter()
        .filter_map(|e| {
            let t = e.t_s.floor() as u32;
            r.timeline
                .iter()
                .find(|s| s.t == t)
                .map(|s| (t, s.p99_ms, s.failed))
        })
        .collect();
    out.dedup_by_key(|s| s.0);
    out
}

/// Runs every load against every peer.
pub async fn run(c: &Common) -> Report {
    let q = c.quick;
    let duration = c.duration.unwrap_or(secs(if q { 8.0 } else { 20.0 }));
    let rate = c.rate.unwrap_or(1000.0);
    let connections = c.connections.unwrap_or(if q { 50 } else { 100 });
    let at = vec![duration / 4, duration * 5 / 8];
    let mut peers = Vec::new();
    for (i, load) in Load::ALL.into_iter().enumerate() {
        let mut env = c.env.clone();
        env.proto = if load == Load::HttpNewConnection {
            Proto::Http
        } else {
            Proto::Https
        };
        let setup = RunSetup {
            variant: load.name().into(),
            pods: 5,
            body_size: 1024,
            load: LoadSpec {
                mode: if load == Load::H2 {
                    Mode::Closed
                } else {
                    Mode::Open { rate }
                },
                ..LoadSpec::closed(
                    if load == Load::H2 { 20 } else { connections },
                    duration,
                    c.timeout,
                    load != Load::HttpNewConnection,
                )
            },
            tls: (TlsVersion::Any, true),
            churn: None,
            proxy_cores: c.proxy_cores,
            wrk_threads: None,
            h2load: (load == Load::H2).then_some((1, 10)),
            attack: None,
            upgrade: at.clone(),
        };
        let order: Vec<PeerKind> = if i % 2 == 1 {
            c.peers.iter().rev().copied().collect()
        } else {
            c.peers.clone()
        };
        for kind in order {
            if kind == PeerKind::Direct {
                continue;
            }
            let mut runs = vec![run_one(kind, &env, &setup).await];
            if kind == PeerKind::HaproxyReload {
                // HAProxy's reload without `expose-fd listeners` (no `-x`) as well.
                let env = crate::peers::PeerEnv {
                    haproxy_expose_fd: false,
                    ..env.clone()
                };
                let setup = RunSetup {
                    variant: format!("{}{NO_X}", load.name()),
                    ..setup.clone()
                };
                runs.push(run_one(kind, &env, &setup).await);
            }
            for mut r in runs {
                for (t, p99, failed) in replacement_seconds(&r) {
                    r.notes.push(format!(
                        "second {t} (a replacement): p99 {p99:.2} ms, {failed} failed"
                    ));
                }
                peers.push(r);
            }
        }
    }
    let rank = |name: &str| c.peers.iter().position(|p| p.name() == name);
    let load_rank = |v: &str| {
        let plain = v.strip_suffix(NO_X);
        let at = Load::ALL
            .iter()
            .position(|l| l.name() == plain.unwrap_or(v));
        (at, plain.is_some())
    };
    peers.sort_by_key(|p| (rank(&p.name), load_rank(&p.variant)));
    let mut settings = BTreeMap::new();
    settings.insert(
        "load".into(),
        format!(
            "https-keepalive: open loop {rate:.0} req/s over {connections} HTTPS keep-alive connections; http-new-conn: open loop {rate:.0} req/s, a new HTTP connection per request; h2: h2load, 20 HTTPS connections (ALPN h2), 10 streams each, closed loop; 1 KB responses, {}s per peer and load",
            duration.as_secs()
        ),
    );
    settings.insert(
        "replacements".into(),
        format!(
            "two, at {:.1} s and {:.1} s into the load",
            at[0].as_secs_f64(),
            at[1].as_secs_f64()
        ),
    );
    settings.insert("proxy cores".into(), c.proxy_cores.to_string());
    let what = "upgrade: what replacing the proxy's own process does to its clients — each peer replaced twice under constant load the way its users replace it (sluice by --handover, nginx by binary upgrade, HAProxy by seamless reload and by a reload without -x, Caddy and Traefik by restart). FAILED counts requests without a 2xx, connect errors are refused (or reset) connections, and each replacement's second has its p99 in the notes. CPU and memory follow the first process only (its successors are not counted): read them as nothing here.".to_string();
    c.report("upgrade", what, settings, peers)
}
