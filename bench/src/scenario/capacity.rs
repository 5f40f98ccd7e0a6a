//! Capacity scenarios, closed loop, no churn: `rps` (1 KB, keep-alive, HTTP and HTTPS),
//! `tps` (a new TLS connection per request, 0 KB, RSA-2048, TLS 1.2 and 1.3) and `throughput`
//! (1 MB responses). The proxy is pinned to its own cores; `direct` is the ceiling.

use std::collections::BTreeMap;

use super::{Common, RunSetup, run_one, secs};
use crate::load::{LoadSpec, TlsVersion};
use crate::peers::{PeerKind, Proto};
use crate::report::Report;
use crate::report::rounds::{self, RoundRun};

/// Concurrent streams per HTTP/2 connection (`--proto h2`): what h2load keeps open on each.
const H2_STREAMS: usize = 10;

/// Which capacity scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// Requests per second, 1 KB.
    Rps,
    /// TLS handshakes per second.
    Tps,
    /// 1 MB responses.
    Throughput,
}

impl Capacity {
    fn name(self) -> &'static str {
        match self {
            Capacity::Rps => "rps",
            Capacity::Tps => "tps",
            Capacity::Throughput => "throughput",
        }
    }
}

/// Runs a capacity scenario over every peer and variant.
pub async fn run(c: &Common, which: Capacity) -> Report {
    let q = c.quick;
    let duration = c.duration.unwrap_or(secs(if q { 5.0 } else { 180.0 }));
    let (body, conns_default, keep_alive) = match which {
        Capacity::Rps => (1024, if q { 200 } else { 1000 }, true),
        Capacity::Tps => (0, if q { 50 } else { 200 }, false),
        Capacity::Throughput => (1 << 20, if q { 20 } else { 100 }, true),
    };
    // HTTP/2 from the client: h2load, fewer connections each with many streams.
    let h2 = c.h2 && which != Capacity::Tps;
    let conns_default = if h2 {
        if q { 50 } else { 100 }
    } else {
        conns_default
    };
    let connections = c.connections.unwrap_or(conns_default);
    // (variant label, client protocol, TLS version)
    let variants: Vec<(String, Proto, TlsVersion)> = match (which, c.proto) {
        (Capacity::Tps, _) => vec![
            ("tls1.2".into(), Proto::Https, TlsVersion::V12),
            ("tls1.3".into(), Proto::Https, TlsVersion::V13),
        ],
        (_, Some(p)) if h2 => vec![("h2".into(), p, TlsVersion::Any)],
        (_, Some(p)) => vec![(format!("{p:?}").to_lowercase(), p, TlsVersion::Any)],
        (_, None) => vec![
            ("http".into(), Proto::Http, TlsVersion::Any),
            ("https".into(), Proto::Https, TlsVersion::Any),
        ],
    };
    // The ceiling a full handshake's one signature sets, on the proxy's core: before and after
    // the peers, the higher of the two kept (the machine is shared).
    let proxy_cpu = c
        .env
        .cpus
        .as_deref()
        .and_then(crate::sys::parse_cpus)
        .and_then(|v| v.first().copied());
    let sign_for = secs(if q { 1.0 } else { 3.0 });
    let sign =
        |rates: &mut Vec<f64>| match crate::certs::sign_rate(&c.env.cert, proxy_cpu, sign_for) {
            Ok(r) => rates.push(r),
            Err(e) => tracing::warn!(error = %e, "signature rate not measured"),
        };
    let mut sign_rates = Vec::new();
    if which == Capacity::Tps {
        sign(&mut sign_rates);
    }
    let mut peers = Vec::new();
    let mut runs = Vec::new();
    let rounds_n = c.rounds.max(1);
    for round in 0..rounds_n {
        for (label, proto, tls) in &variants {
            let mut env = c.env.clone();
            env.proto = *proto;
            env.http2 |= h2;
            let shown = if rounds_n > 1 {
                format!("{label} #{}", round + 1)
            } else {
                label.clone()
            };
            let setup = RunSetup {
                variant: shown,
                pods: 5,
                body_size: body,
                load: LoadSpec::closed(connections, duration, c.timeout, keep_alive),
                tls: (*tls, keep_alive),
                churn: None,
                proxy_cores: c.proxy_cores,
                // wrk keeps its connections open: not for the handshake scenario.
                wrk_threads: c.wrk_threads.filter(|_| keep_alive),
                h2load: h2.then_some((c.load_threads, H2_STREAMS)),
                attack: None,
                upgrade: Vec::new(),
            };
            // Odd rounds run the peers in reverse, so neither goes first every time.
            let order: Vec<PeerKind> = if round % 2 == 1 {
                c.peers.iter().rev().copied().collect()
            } else {
                c.peers.clone()
            };
            for kind in order {
                if kind == PeerKind::Direct && which == Capacity::Tps {
                    if round > 0 {
                        continue;
                    }
                    peers.push(crate::report::PeerResult::skipped(
                        kind.name(),
                        label,
                        "direct: the backends serve no TLS".into(),
                    ));
                    continue;
                }
                let mut r = run_one(kind, &env, &setup).await;
                if r.skipped.is_none() {
                    runs.push(RoundRun {
                        round,
                        peer: r.name.clone(),
                        variant: label.clone(),
                        rps: r.achieved_rps,
                        cpu_ms_per_1k: r.cpu_ms_per_1k_requests,
                    });
                } else if round > 0 {
                    // Said once is enough.
                    continue;
                }
                if let Some(u) = r.proxy_cpu_utilization
                    && u < 0.9
                {
                    r.notes.push(format!(
                    "the proxy used {:.0}% of its {} core(s): it was not the bottleneck, so this rate measures the load generator or the backends",
                    u * 100.0,
                    c.proxy_cores
                ));
                }
                peers.push(r);
            }
        }
    }
    if which == Capacity::Tps {
        sign(&mut sign_rates);
    }
    let summary = if rounds_n > 1 {
        c.peers
            .first()
            .map(|f| rounds::summarize(&runs, f.name()))
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut settings = BTreeMap::new();
    settings.insert("load".into(), format!(
        "closed loop, {connections} connections, {}s per peer and variant, {} B responses, {}",
        duration.as_secs(), body,
        if keep_alive { "keep-alive" } else { "one request per new connection (Connection: close), no session resumption: every request is a full handshake" }
    ));
    settings.insert("proxy cores".into(), c.proxy_cores.to_string());
    settings.insert(
        "load generator".into(),
        match (h2, c.wrk_threads.filter(|_| keep_alive)) {
            (true, _) => format!(
                "h2load -t{} -m{H2_STREAMS} (--proto h2: TLS with ALPN h2, {H2_STREAMS} concurrent streams per connection; no latency percentiles)",
                c.load_threads
            ),
            (false, Some(t)) => format!("wrk -t{t} (--generator wrk)"),
            (false, None) => "sluice-bench's own".into(),
        },
    );
    if rounds_n > 1 {
        settings.insert(
            "rounds".into(),
            format!("{rounds_n}, peer order reversed every other round; medians and same-round ratios below the table"),
        );
    }
    settings.insert(
        "certificate".into(),
        format!(
            "{} self-signed; TLS 1.2 suite {}",
            c.key.label(),
            match c.key {
                crate::certs::KeyKind::Rsa2048 => "ECDHE-RSA-AES256-GCM-SHA384",
                crate::certs::KeyKind::EcdsaP256 => "ECDHE-ECDSA-AES256-GCM-SHA384",
            }
        ),
    );
    if which == Capacity::Tps {
        settings.insert(
            "client checks".into(),
            "none: the generator checks neither the certificate nor the handshake signatures, so that its one core can keep a proxy core busy; the proxy's work (key exchange, its signature) is unchanged".into(),
        );
    }
    if let Some(ceiling) = sign_rates.iter().copied().reduce(f64::max) {
        settings.insert(
            "signature ceiling".into(),
            format!(
                "{ceiling:.0} {} signatures/s on one thread of the proxy's core (aws-lc-rs, as sluice; the higher of a measurement before and after the peers): a full handshake costs the server one",
                c.key.label()
            ),
        );
        // sluice's, and the floor's when it ran: a TLS server that does nothing else, so the
        // two together say how much of the distance to the ceiling is the proxy's own.
        for peer in [PeerKind::Sluice, PeerKind::Floor] {
            let mut by_variant: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            for r in runs.iter().filter(|r| r.peer == peer.name()) {
                by_variant.entry(&r.variant).or_default().push(r.rps);
            }
            let ratios: Vec<String> = by_variant
                .into_iter()
                .map(|(v, mut rates)| {
                    rates.sort_by(f64::total_cmp);
                    format!("{v} {:.2}", rates[rates.len() / 2] / ceiling)
                })
                .collect();
            if !ratios.is_empty() {
                settings.insert(
                    format!("{} ÷ signature ceiling", peer.name()),
                    format!(
                        "{} (median handshakes/s over the ceiling)",
                        ratios.join(", ")
                    ),
                );
            }
        }
    }
    let what = format!(
        "{}: closed-loop maximum {} on loopback on one machine, the proxy pinned to {} core(s) and the load generator with the backends on the others. A number is the proxy's capacity only where its CPU column is near 100%; otherwise the load generator or backends were the limit.{}",
        which.name(),
        match which {
            Capacity::Rps => "requests per second (1 KB)",
            Capacity::Tps => match c.key {
                crate::certs::KeyKind::Rsa2048 => "full TLS handshakes per second (RSA-2048, 0 KB)",
                crate::certs::KeyKind::EcdsaP256 =>
                    "full TLS handshakes per second (ECDSA P-256, 0 KB)",
            },
            Capacity::Throughput => "throughput (1 MB responses)",
        },
        c.proxy_cores,
        if q {
            " Quick mode: a few seconds per peer, so expect a few percent of noise."
        } else {
            ""
        }
    );
    Report {
        rounds: summary,
        ..c.report(which.name(), what, settings, peers)
    }
}
