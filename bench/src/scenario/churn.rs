//! The headline scenario: backends churn 5→7→5 under constant-rate load, on the published
//! timing (7 replicas for 12 s, 5 for 10 s; shortened in quick mode), with the removed pods
//! going away in one of the [`Removal`] orders.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::peers::Peer;
use crate::pods::{Pods, Removal, StopMode, Terminating};
use crate::report::{Event, PeerResult, Propagation};

/// When and how the backends churn.
#[derive(Debug, Clone)]
pub struct ChurnPlan {
    /// First change, from the start of the load.
    pub start: Duration,
    /// Time at the high replica count.
    pub up_hold: Duration,
    /// Time at the low replica count.
    pub down_hold: Duration,
    /// Length of the load (no change is started in its last half second).
    pub duration: Duration,
    /// Replicas at rest.
    pub low: usize,
    /// Replicas after a scale-up.
    pub high: usize,
    /// Order of endpoint removal and SIGTERM.
    pub removal: Removal,
    /// Time between the two steps of a removal (before/after/kill).
    pub gap: Duration,
    /// How a removed pod stops (for before/with/after; kill and vanish say it themselves).
    pub stop: StopMode,
}

/// What the churn driver produced.
#[derive(Debug)]
pub enum Driven {
    /// A change.
    Event(Event),
    /// A problem worth reporting (a change the peer refused).
    Note(String),
}

fn secs(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

/// Applies `eps` and records the event (with the time the peer reported it applied, where it
/// can tell).
async fn change(
    peer: &mut Peer,
    t0: Instant,
    eps: &[std::net::SocketAddr],
    what: String,
    out: &mut Vec<Driven>,
) {
    let at = Instant::now();
    if let Err(e) = peer.set_endpoints(eps).await {
        out.push(Driven::Note(format!("{:.2} s: {what}: {e}", secs(t0, at))));
        return;
    }
    let acked = Instant::now();
    let applied = match peer.applied(eps, Duration::from_secs(5)).await {
        Some(true) => Some(secs(t0, Instant::now())),
        Some(false) => {
            out.push(Driven::Note(format!(
                "{:.2} s: {what}: not applied within 5 s",
                secs(t0, at)
            )));
            None
        }
        None => None,
    };
    out.push(Driven::Event(Event {
        t_s: secs(t0, at),
        what,
        endpoint_change: true,
        applied_s: applied,
        acked_s: Some(secs(t0, acked)),
    }));
}

fn mark(t0: Instant, what: String, out: &mut Vec<Driven>) {
    out.push(Driven::Event(Event {
        t_s: secs(t0, Instant::now()),
        what,
        endpoint_change: false,
        applied_s: None,
        acked_s: None,
    }));
}

/// Runs the churn against `peer` from `t0` until the plan's end.
pub async fn drive(
    peer: &mut Peer,
    pods: &mut Pods,
    term: &mut Terminating,
    t0: Instant,
    plan: &ChurnPlan,
) -> Vec<Driven> {
    let mut out = Vec::new();
    let last = t0 + plan.duration.saturating_sub(Duration::from_millis(500));
    let mut t = t0 + plan.start;
    let mut downs = 0;
    while t < last {
        sleep_until(t).await;
        let before = pods.live.len();
        if let Err(e) = pods.add(plan.high.saturating_sub(before)).await {
            out.push(Driven::Note(format!(
                "scale-up: backends did not start: {e}"
            )));
            break;
        }
        let names: Vec<String> = pods.live[before..].iter().map(|p| p.name.clone()).collect();
        let eps = pods.endpoints();
        let what = format!("{before}→{} +{}", pods.live.len(), names.join(","));
        change(peer, t0, &eps, what, &mut out).await;
        t += plan.up_hold;
        if t >= last {
            break;
        }
        sleep_until(t).await;
        scale_down(peer, pods, term, t0, (plan, plan.stop.nth(downs)), &mut out).await;
        downs += 1;
        t += plan.down_hold;
    }
    out
}

async fn scale_down(
    peer: &mut Peer,
    pods: &mut Pods,
    term: &mut Terminating,
    t0: Instant,
    (plan, stop): (&ChurnPlan, StopMode),
    out: &mut Vec<Driven>,
) {
    let n = pods.live.len();
    let victims = pods.take_newest(n.saturating_sub(plan.low));
    let names = victims
        .iter()
        .map(|p| p.name.clone())
        .collect::<Vec<_>>()
        .join(",");
    let eps = pods.endpoints();
    let what = format!("{n}→{} −{names}", pods.live.len());
    match plan.removal {
        Removal::Before => {
            change(peer, t0, &eps, what, out).await;
            tokio::time::sleep(plan.gap).await;
            mark(t0, format!("{} {names}", stop.verb()), out);
            victims.into_iter().for_each(|p| term.stop(p, stop));
        }
        Removal::With => {
            mark(t0, format!("{} {names}", stop.verb()), out);
            victims.into_iter().for_each(|p| term.stop(p, stop));
            change(peer, t0, &eps, what, out).await;
        }
        Removal::After | Removal::Kill => {
            let stop = if plan.removal == Removal::Kill {
                StopMode::Kill
            } else {
                stop
            };
            mark(t0, format!("{} {names}", stop.verb()), out);
            victims.into_iter().for_each(|p| term.stop(p, stop));
            tokio::time::sleep(plan.gap).await;
            change(peer, t0, &eps, what, out).await;
        }
        Removal::Vanish => {
            // The pods vanish and the endpoint change is handed to the peer at the same moment.
            mark(t0, format!("vanish {names}"), out);
            let mut changed = Vec::new();
            let (vanished, ()) = tokio::join!(
                term.vanish(victims),
                change(peer, t0, &eps, what, &mut changed)
            );
            if let Err(e) = vanished {
                out.push(Driven::Note(format!("vanish: {e}")));
            }
            out.extend(changed);
        }
    }
}

/// Scale-up propagation measured from traffic: each added pod's first response after its
/// endpoint was handed over (for `--source api`: after the API server acknowledged the
/// EndpointSlice write), and how long removed pods kept answering after their removal.
pub fn propagation(r: &PeerResult) -> Option<Propagation> {
    let mut adds = Vec::new();
    let mut from_sent = Vec::new();
    let mut after_removal: f64 = 0.0;
    for e in r.events.iter().filter(|e| e.endpoint_change) {
        let Some((_, names)) = e.what.split_once(['+', '−']) else {
            continue;
        };
        for name in names.split(',') {
            let Some(seen) = r.backends_seen.get(name) else {
                continue;
            };
            if e.what.contains('+') {
                adds.push((seen.first_s - e.acked_s.unwrap_or(e.t_s)) * 1000.0);
                from_sent.push((seen.first_s - e.t_s) * 1000.0);
            } else {
                after_removal = after_removal.max((seen.last_s - e.t_s) * 1000.0);
            }
        }
    }
    if adds.is_empty() {
        return None;
    }
    adds.sort_by(f64::total_cmp);
    from_sent.sort_by(f64::total_cmp);
    let p99 = ((adds.len() * 99).div_ceil(100)).saturating_sub(1);
    Some(Propagation {
        median_ms: adds[adds.len() / 2],
        p99_ms: adds[p99.min(adds.len() - 1)],
        from_sent_median_ms: from_sent[from_sent.len() / 2],
        max_ms: adds[adds.len() - 1],
        removed_pod_last_response_after_ms: after_removal.max(0.0),
    })
}

/// Runs `churn` (or `static` when `with_churn` is false) over every peer.
pub async fn run(c: &super::Common, with_churn: bool) -> crate::report::Report {
    use super::secs;
    use crate::load::{LoadSpec, Mode, TlsVersion};
    use crate::peers::Proto;
    let q = c.quick;
    let proto = c.proto.unwrap_or(Proto::Https);
    let rate = c.rate.unwrap_or(if q { 3000.0 } else { 10_000.0 });
    let connections = c.connections.unwrap_or(if q { 200 } else { 1000 });
    let duration = c.duration.unwrap_or(secs(if q { 7.0 } else { 180.0 }));
    let (up, down) = c.interval.map_or(
        if q {
            (secs(1.5), secs(1.5))
        } else {
            (secs(12.0), secs(10.0))
        },
        |i| (i, i),
    );
    let gap = c.gap.unwrap_or(secs(if q { 0.5 } else { 1.0 }));
    let plan = ChurnPlan {
        start: secs(if q { 1.0 } else { 5.0 }),
        up_hold: up,
        down_hold: down,
        duration,
        low: c.replicas.map_or(5, |r| r.0),
        high: c.replicas.map_or(7, |r| r.1),
        removal: c.removal,
        gap,
        stop: c.stop,
    };
    let variant = format!("{proto:?}").to_lowercase();
    let mut env = c.env.clone();
    env.proto = proto;
    let setup = super::RunSetup {
        variant: variant.clone(),
        pods: plan.low,
        body_size: 1024,
        load: LoadSpec {
            addrs: Vec::new(),
            host: String::new(),
            path: "/".into(),
            tls: None,
            mode: Mode::Open { rate },
            connections,
            duration,
            timeout: c.timeout,
            keep_alive: true,
        },
        tls: (c.tls_version.unwrap_or(TlsVersion::Any), true),
        churn: with_churn.then_some(plan.clone()),
        wrk_threads: None,
        h2load: None,
        attack: None,
        upgrade: Vec::new(),
        proxy_cores: c.proxy_cores,
    };
    let vanish_problem = (with_churn && c.removal == Removal::Vanish)
        .then(crate::pods::vanish_unavailable)
        .flatten();
    let mut peers = Vec::new();
    for &kind in &c.peers {
        if let Some(why) = &vanish_problem {
            peers.push(PeerResult::skipped(kind.name(), &variant, why.clone()));
            continue;
        }
        peers.push(super::run_one(kind, &env, &setup).await);
    }
    let mut settings = std::collections::BTreeMap::new();
    settings.insert("load".into(), format!(
        "open loop (wrk2 semantics, latency from the scheduled send), {rate:.0} req/s over {connections} keep-alive {} connections, {}s per peer, 1 KB responses, timeout {}s",
        variant.to_uppercase(), duration.as_secs_f64(), c.timeout.as_secs_f64()
    ));
    if with_churn {
        settings.insert("churn".into(), format!(
            "{low}→{high} replicas at {:.1}s, hold {:.1}s at {high}, back to {low}, hold {:.1}s at {low}, repeat (published: 5→7, 12 s / 10 s)",
            plan_start(q), up.as_secs_f64(), down.as_secs_f64(), low = plan.low, high = plan.high
        ));
        settings.insert("removal".into(), format!(
            "{:?}: {} (gap {:.1}s)",
            c.removal,
            match c.removal {
                Removal::Before => "endpoint removed (the change applied where the peer can tell), then the pod stops after the gap",
                Removal::With => "the pod stops and its endpoint is removed at the same moment",
                Removal::After => "the pod stops, its endpoint is removed after the gap (the race without a preStop hook)",
                Removal::Kill => "abrupt kill (connections cut), endpoint removed after the gap",
                Removal::Vanish => "pod vanishes (loopback iptables DROP, no RST) and its endpoint is removed at once",
            },
            gap.as_secs_f64()
        ));
        if matches!(c.removal, Removal::Before | Removal::With | Removal::After) {
            settings.insert("stop".into(), format!(
                "{:?}: {}",
                c.stop,
                match c.stop {
                    StopMode::Graceful => "SIGTERM handled well: listener closed, in-flight requests finish, idle keep-alive connections closed",
                    StopMode::Fast => "every connection reset (RST) at once, in flight or idle",
                    StopMode::Kill => "killed: the kernel closes every socket at once",
                    StopMode::Mixed => "graceful, fast (reset) and kill in turn, one per scale-down",
                }
            ));
        }
    }
    let what = if q {
        format!(
            "Quick {} run: {}s per peer of {rate:.0} req/s over {connections} {} connections{}, on loopback on one machine (proxy and load generator pinned to separate cores). It shows whether each peer loses requests when backends change and what a change does to tail latency. It is not a capacity test, and a few seconds are too short for stable percentiles beyond p99.9; run without --quick for the published durations.",
            if with_churn { "churn" } else { "static" },
            duration.as_secs_f64(),
            variant.to_uppercase(),
            if with_churn {
                ", backends changing 5→7→5 twice"
            } else {
                ", no changes (the baseline)"
            }
        )
    } else {
        format!(
            "{} run: {}s per peer of {rate:.0} req/s over {connections} {} connections{} on loopback on one machine.",
            if with_churn { "Churn" } else { "Static" },
            duration.as_secs_f64(),
            variant.to_uppercase(),
            if with_churn {
                ", backends changing 5→7→5 on the published timing,"
            } else {
                ", no changes,"
            }
        )
    };
    let scenario = if with_churn { "churn" } else { "static" };
    c.report(scenario, what, settings, peers)
}

fn plan_start(quick: bool) -> f64 {
    if quick { 1.0 } else { 5.0 }
}
