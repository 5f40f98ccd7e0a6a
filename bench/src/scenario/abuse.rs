//! `abuse`: constant-rate legitimate load (HTTPS keep-alive, 1 KB) while one attack at a time
//! runs against the same listener ([`crate::load::attack`]), for every peer in the same run.
//! Each (attack, peer) pair is its own run on a fresh peer, so peak memory and CPU belong to
//! that attack alone; the peer order alternates from one attack to the next. What counts:
//! legitimate requests failed, their p99, and the peer's peak RSS and CPU, beside the
//! baseline with no attack; what the peer did to the attackers is in the notes.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Common, RunSetup, run_one, secs};
use crate::load::attack::Attack;
use crate::load::{LoadSpec, Mode, TlsVersion};
use crate::peers::{PeerKind, Proto};
use crate::report::Report;

/// When the attack starts, after the legitimate load's measured start (the first second is
/// the peer's undisturbed baseline in the timeline).
const ATTACK_AFTER: Duration = Duration::from_secs(1);

/// Runs every attack (or those asked for) against every peer.
pub async fn run(c: &Common) -> Report {
    let q = c.quick;
    let duration = c.duration.unwrap_or(secs(if q { 8.0 } else { 30.0 }));
    let rate = c.rate.unwrap_or(if q { 1000.0 } else { 3000.0 });
    let connections = c.connections.unwrap_or(if q { 50 } else { 200 });
    let attackers = c.attack_connections.unwrap_or(if q { 500 } else { 2000 });
    let proto = c.proto.unwrap_or(Proto::Https);
    let attacks: Vec<Attack> = c.attacks.clone().unwrap_or_else(|| Attack::ALL.to_vec());
    let mut env = c.env.clone();
    env.proto = proto;
    let mut peers = Vec::new();
    for (i, attack) in attacks.iter().enumerate() {
        let setup = RunSetup {
            variant: attack.name().into(),
            pods: 5,
            body_size: 1024,
            load: LoadSpec {
                mode: Mode::Open { rate },
                ..LoadSpec::closed(connections, duration, c.timeout, true)
            },
            tls: (TlsVersion::Any, true),
            churn: None,
            proxy_cores: c.proxy_cores,
            wrk_threads: None,
            h2load: None,
            attack: Some((
                *attack,
                attack.connections(attackers),
                ATTACK_AFTER.min(duration),
            )),
            upgrade: Vec::new(),
        };
        let order: Vec<PeerKind> = if i % 2 == 1 {
            c.peers.iter().rev().copied().collect()
        } else {
            c.peers.clone()
        };
        let mut env = env.clone();
        env.client_cert_host = *attack == Attack::CertSubject;
        for kind in order {
            if *attack == Attack::CertSubject && kind != PeerKind::Sluice {
                peers.push(crate::report::PeerResult::skipped(
                    kind.name(),
                    attack.name(),
                    "only sluice's peer is set up with a host that asks for client certificates"
                        .into(),
                ));
                continue;
            }
            if kind == PeerKind::Direct {
                if i == 0 {
                    peers.push(crate::report::PeerResult::skipped(
                        kind.name(),
                        attack.name(),
                        "direct: no proxy to attack".into(),
                    ));
                }
                continue;
            }
            peers.push(run_one(kind, &env, &setup).await);
        }
    }
    // Report order: by peer, then attack, whatever order they ran in.
    let rank = |name: &str| c.peers.iter().position(|p| p.name() == name);
    let attack_rank = |v: &str| attacks.iter().position(|a| a.name() == v);
    peers.sort_by_key(|p| (rank(&p.name), attack_rank(&p.variant)));
    let mut settings = BTreeMap::new();
    settings.insert(
        "legitimate load".into(),
        format!(
            "open loop, {rate:.0} req/s over {connections} keep-alive {} connections, 1 KB responses, {}s per peer and attack",
            if proto == Proto::Https { "HTTPS (ALPN http/1.1)" } else { "HTTP" },
            duration.as_secs()
        ),
    );
    settings.insert(
        "attackers".into(),
        format!(
            "{attackers} connections per attack (rapid reset {}, slow reader {}), from {} s into the load to its end; the first connections spread evenly over 1 s, a closed attacker reconnecting after 100 ms; the attackers run as a process of their own",
            Attack::RapidReset.connections(attackers),
            Attack::SlowReader.connections(attackers),
            ATTACK_AFTER.as_secs()
        ),
    );
    for a in &attacks {
        settings.insert(format!("attack {}", a.name()), a.what().into());
    }
    settings.insert("proxy cores".into(), c.proxy_cores.to_string());
    settings.insert(
        "http2".into(),
        "offered by every peer on its TLS listener (ALPN h2, http/1.1) for the HTTP/2 attacks"
            .into(),
    );
    let what = format!(
        "abuse: what each attack costs the legitimate clients of an edge proxy — failed requests and p99 against the `none` baseline — and what it costs the proxy (peak RSS, CPU), each peer on {} core(s) with the same attackers on loopback. The notes say what each peer did to the attackers (closed, after how long).{}",
        c.proxy_cores,
        if q {
            " Quick mode: a few seconds per attack, so timeouts longer than the run (30 s header, 60 s send) do not get to act."
        } else {
            ""
        }
    );
    c.report("abuse", what, settings, peers)
}
