//! `soak`: sluice through the life of a production edge, for an hour by default (a couple of
//! minutes with `--quick`). All at once, from start to end:
//!
//! - legitimate load: HTTPS keep-alive at a constant rate (the generator's own, as in churn),
//!   HTTP/2 requests on a few connections, and WebSocket sessions (upgrade, echoes, close, a
//!   new session in its place) on pods of their own that the churn leaves alone;
//! - the backends churning 5→7→5 with pods stopped every way the churn knows (graceful, every
//!   connection reset, killed) in turn;
//! - a configuration change every few seconds: the Ingress under load, its TLS Secret (a new
//!   certificate) and the controller ConfigMap, in turn, each watched until it shows;
//! - an attack burst from the abuse scenario every few intervals (a different one each time).
//!
//! At the end of every interval (a minute; 10 s in quick mode) the proxy's RSS, descriptors,
//! runtime tasks and upstream connections are read; per interval, the legitimate requests of
//! each kind, their failures and p99. It holds when no legitimate request failed, sluice ran to
//! the end, and RSS and descriptors grew less than 5% over the second half. Attack bursts sit
//! in the middle half of their interval, so the readings at its end are not taken while
//! attackers hold connections.

pub mod changes;
pub mod clients;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use super::churn::{self, ChurnPlan, Driven};
use super::{Common, Usage, attack_process, progress, secs};
use crate::load::attack::Attack;
use crate::load::{self, Hooks, Live, LoadSpec, Mode, TlsVersion};
use crate::peers::{HOST, Peer, PeerEnv, PeerKind, Proto, admin_request};
use crate::pods::{Pods, Terminating};
use crate::report::soak::{Leftover, SoakSample, SoakSummary};
use crate::report::{Event, PeerResult, Report};
use crate::sys;
use clients::{Buckets, Target};

/// Time given to the proxy to close what the clients left, before the reading after the run.
const SETTLE: Duration = Duration::from_secs(3);

impl Leftover {
    fn from_reading(r: &Reading, clients: usize) -> Self {
        Self {
            rss_bytes: r.rss,
            fds: r.fds,
            tasks: r.tasks,
            upstream_connections: r.upstream,
            client_connections: clients as u64,
        }
    }
}

/// The soak's shape, from the command line and the mode.
#[derive(Debug, Clone)]
struct Plan {
    duration: Duration,
    interval: Duration,
    rate: f64,
    connections: usize,
    h2_connections: usize,
    h2_rate: f64,
    ws_sessions: usize,
    ws_messages: usize,
    ws_gap: Duration,
    change_every: Duration,
    attack_every: usize,
    attackers: usize,
    churn_hold: Duration,
}

impl Plan {
    fn new(c: &Common) -> Self {
        let q = c.quick;
        let duration = c.duration.unwrap_or(secs(if q { 120.0 } else { 3600.0 }));
        let interval = secs(if q { 10.0 } else { 60.0 }).min(duration);
        Self {
            duration,
            interval,
            rate: c.rate.unwrap_or(if q { 300.0 } else { 1000.0 }),
            connections: c.connections.unwrap_or(if q { 20 } else { 100 }),
            h2_connections: 4,
            h2_rate: if q { 40.0 } else { 100.0 },
            ws_sessions: if q { 6 } else { 20 },
            ws_messages: if q { 10 } else { 60 },
            ws_gap: Duration::from_millis(500),
            change_every: secs(if q { 3.0 } else { 5.0 }),
            attack_every: if q { 4 } else { 5 },
            attackers: c.attack_connections.unwrap_or(if q { 200 } else { 500 }),
            churn_hold: c.interval.unwrap_or(secs(if q { 2.5 } else { 10.0 })),
        }
    }

    /// Whole intervals in the run.
    fn intervals(&self) -> usize {
        (self.duration.as_secs_f64() / self.interval.as_secs_f64()).floor() as usize
    }

    /// The intervals an attack runs in, with the attack.
    fn attacks(&self) -> Vec<(usize, Attack)> {
        let cycle: Vec<Attack> = Attack::ALL
            .iter()
            .copied()
            .filter(|a| !matches!(a, Attack::None | Attack::CertSubject))
            .collect();
        (0..self.intervals())
            .filter(|i| i % self.attack_every == self.attack_every - 1)
            .enumerate()
            .map(|(n, i)| (i, cycle[n % cycle.len()]))
            .collect()
    }
}

/// Readings at the end of one interval.
#[derive(Debug, Clone, Default)]
struct Reading {
    rss: u64,
    fds: u64,
    tasks: u64,
    upstream: u64,
    problems: Vec<String>,
}

/// Reads the proxy: memory, descriptors and upstream connections from `/proc` first (before
/// this reading's own admin connections exist), then tasks and problems from its admin API.
async fn read(pid: u32, admin: std::net::SocketAddr) -> Reading {
    let (rss, fds, upstream) = (
        sys::tree_rss_bytes(pid),
        sys::tree_fds(pid),
        sys::connections(pid).1 as u64,
    );
    let tasks = match admin_request(admin, "GET", "/metrics", "").await {
        Ok((200, body)) => body
            .lines()
            .find_map(|l| l.strip_prefix("sluice_runtime_tasks "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    let problems = match admin_request(admin, "GET", "/api/v1/status", "").await {
        Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v["problems"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|p| p.as_str().map(str::to_string))
                        .collect()
                })
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    Reading {
        rss,
        fds,
        tasks,
        upstream,
        problems,
    }
}

/// How long before an interval's end it is read: the last interval's reading must see the
/// clients still running, not leaving.
fn read_ahead(plan: &Plan) -> Duration {
    (plan.interval / 10).min(Duration::from_secs(1))
}

/// Reads the proxy near the end of every interval.
async fn sample(pid: u32, admin: std::net::SocketAddr, t0: Instant, plan: &Plan) -> Vec<Reading> {
    let mut out = Vec::new();
    for i in 1..=plan.intervals() {
        let at = t0 + plan.interval * u32::try_from(i).unwrap_or(u32::MAX) - read_ahead(plan);
        sleep_until(at).await;
        out.push(read(pid, admin).await);
    }
    out
}

/// Runs the attack bursts: each in the middle half of its interval.
async fn attack(
    target: std::net::SocketAddr,
    t0: Instant,
    plan: &Plan,
) -> Vec<(usize, Attack, String)> {
    let mut out = Vec::new();
    for (i, a) in plan.attacks() {
        let from = t0 + plan.interval * u32::try_from(i).unwrap_or(u32::MAX) + plan.interval / 4;
        let to = from + plan.interval / 2;
        let now = Instant::now();
        let report = attack_process(
            a,
            a.connections(plan.attackers),
            (target, true),
            (
                from.saturating_duration_since(now),
                to.saturating_duration_since(now),
            ),
        )
        .await;
        let said = match report {
            Ok(r) => r.summary(a),
            Err(e) => format!("attack {}: {e}", a.name()),
        };
        out.push((i, a, said));
    }
    out
}

/// Runs the soak against sluice.
pub async fn run(c: &Common) -> Report {
    let plan = Plan::new(c);
    let mut peers: Vec<PeerResult> = c
        .peers
        .iter()
        .filter(|k| **k != PeerKind::Sluice)
        .map(|k| {
            PeerResult::skipped(
                k.name(),
                "soak",
                "the soak runs sluice only (it changes sluice's own files and reads its admin API)"
                    .into(),
            )
        })
        .collect();
    let mut summary = None;
    if c.peers.contains(&PeerKind::Sluice) {
        let (r, s) = run_sluice(c, &plan).await;
        peers.insert(0, r);
        summary = s;
    }
    let mut settings = BTreeMap::new();
    settings.insert(
        "legitimate load".into(),
        format!(
            "HTTPS keep-alive: open loop, {:.0} req/s over {} connections, 1 KB responses; HTTP/2: {:.0} req/s over {} connections; WebSocket: {} sessions at once, each an upgrade, {} echoes {} ms apart and a close, on 2 pods of their own",
            plan.rate,
            plan.connections,
            plan.h2_rate,
            plan.h2_connections,
            plan.ws_sessions,
            plan.ws_messages,
            plan.ws_gap.as_millis()
        ),
    );
    settings.insert(
        "churn".into(),
        format!(
            "backends 5→7→5, {} s at each count, removal {:?}, stop {:?} (graceful, every connection reset, killed in turn for mixed)",
            plan.churn_hold.as_secs_f64(),
            c.removal,
            c.stop
        ),
    );
    settings.insert(
        "configuration changes".into(),
        format!(
            "every {} s, in turn: the Ingress under load (proxy-read-timeout), its TLS Secret (a new {:?} certificate), the ConfigMap {} (proxy-read-timeout, keep-alive-requests); files rewritten atomically",
            plan.change_every.as_secs_f64(),
            c.key,
            changes::CONFIGMAP
        ),
    );
    settings.insert(
        "attacks".into(),
        format!(
            "every {} intervals, one attack of the abuse scenario in turn with {} connections (rapid reset {}, slow reader {}), in the middle half of its interval",
            plan.attack_every,
            plan.attackers,
            Attack::RapidReset.connections(plan.attackers),
            Attack::SlowReader.connections(plan.attackers)
        ),
    );
    settings.insert(
        "sampling".into(),
        format!(
            "every {} s: the proxy's RSS and descriptors (/proc), runtime tasks (sluice_runtime_tasks), upstream connections (its established sockets off its listeners' ports), problems (/api/v1/status)",
            plan.interval.as_secs_f64()
        ),
    );
    let what = format!(
        "soak: {} of mixed legitimate traffic (HTTPS, HTTP/2, WebSocket) through sluice while backends churn with pods killed, the Ingress, its certificate and the ConfigMap change every few seconds, and attack bursts arrive. It holds when no legitimate request failed, sluice ran to the end, and its RSS and descriptors grew less than 5% over the second half.",
        if plan.duration >= Duration::from_secs(120) {
            format!("{:.0} minutes", plan.duration.as_secs_f64() / 60.0)
        } else {
            format!("{:.0} s", plan.duration.as_secs_f64())
        }
    );
    let mut r = c.report("soak", what, settings, peers);
    r.soak = summary;
    r
}

/// The run itself: pods, sluice, every load and driver at once, the samples.
async fn run_sluice(c: &Common, plan: &Plan) -> (PeerResult, Option<SoakSummary>) {
    let name = PeerKind::Sluice.name();
    let env = PeerEnv {
        proto: Proto::Https,
        http2: true,
        body_size: 1024,
        sluice_extra_args: vec!["--configmap".into(), changes::CONFIGMAP.into()],
        ..c.env.clone()
    };
    if let Some(why) = PeerKind::Sluice.unavailable(&env) {
        return (PeerResult::skipped(name, "soak", why), None);
    }
    let skipped = |why: String| (PeerResult::skipped(name, "soak", why), None);
    let mut pods = Pods::new(1024);
    let mut ws_pods = Pods::new(0);
    if let Err(e) = pods.add(5).await {
        return skipped(format!("backends did not start: {e}"));
    }
    if let Err(e) = ws_pods.add(2).await {
        pods.stop_all().await;
        return skipped(format!("WebSocket backends did not start: {e}"));
    }
    let mut peer = match Peer::start(PeerKind::Sluice, &env, &pods.endpoints()).await {
        Ok(p) => p,
        Err(e) => {
            pods.stop_all().await;
            ws_pods.stop_all().await;
            return skipped(format!("failed to start: {e}"));
        }
    };
    let files = peer.sluice_files().map(|(d, a)| (d.to_path_buf(), a));
    let (Some(pid), Some((dir, admin)), Some(tls)) =
        (peer.pid(), files, peer.tls(TlsVersion::Any, true))
    else {
        peer.stop().await;
        pods.stop_all().await;
        ws_pods.stop_all().await;
        return skipped("sluice started without a process, manifest directory or TLS".into());
    };
    let target = Target {
        addr: peer.target,
        tls: tls.clone(),
        host: HOST.into(),
    };
    let setup = std::fs::write(
        dir.join("ws.yaml"),
        changes::websocket_route(&ws_pods.endpoints()),
    )
    .and_then(|()| std::fs::write(dir.join("configmap.yaml"), changes::configmap(0)));
    let ready = match setup {
        Ok(()) => ws_ready(&target).await,
        Err(e) => Err(format!("writing the WebSocket route: {e}")),
    };
    if let Err(e) = ready {
        peer.stop().await;
        pods.stop_all().await;
        ws_pods.stop_all().await;
        return skipped(e);
    }
    let before = read(pid, admin).await;
    let spec = LoadSpec {
        addrs: vec![peer.target],
        host: HOST.into(),
        tls: Some(tls),
        mode: Mode::Open { rate: plan.rate },
        ..LoadSpec::closed(plan.connections, plan.duration, c.timeout, true)
    };
    let live = Arc::new(Live::default());
    let (tx, rx) = oneshot::channel();
    let hooks = Hooks {
        started: Some(tx),
        live: Arc::clone(&live),
        bucket: Some(plan.interval),
    };
    let (pb, pb_task) = progress("sluice soak", plan.duration.as_secs(), live);
    let churn_plan = ChurnPlan {
        start: plan.churn_hold / 2,
        up_hold: plan.churn_hold,
        down_hold: plan.churn_hold,
        duration: plan.duration,
        low: 5,
        high: 7,
        removal: c.removal,
        gap: c.gap.unwrap_or(Duration::from_secs(1)),
        stop: c.stop,
    };
    let changer = changes::Changer {
        dir,
        admin,
        key: c.key,
        every: plan.change_every,
    };
    let mut term = Terminating::default();
    let attack_target = peer.target;
    let driver = async {
        let Ok(t0) = rx.await else {
            return None;
        };
        let usage = Usage::start(Some(pid));
        let end = t0 + plan.duration;
        let h2 = Arc::new(Buckets::new(t0, plan.interval));
        let ws = Arc::new(Buckets::new(t0, plan.interval));
        let (_, _, driven, changed, attacked, readings) = tokio::join!(
            clients::h2(
                target.clone(),
                plan.h2_connections,
                plan.h2_rate,
                end,
                Arc::clone(&h2)
            ),
            clients::websockets(
                target.clone(),
                plan.ws_sessions,
                (plan.ws_messages, plan.ws_gap),
                end,
                Arc::clone(&ws)
            ),
            churn::drive(&mut peer, &mut pods, &mut term, t0, &churn_plan),
            changer.run(t0, end),
            attack(attack_target, t0, plan),
            sample(pid, admin, t0, plan),
        );
        Some((usage, h2, ws, driven, changed, attacked, readings))
    };
    let (load, driven) = tokio::join!(load::run(&spec, hooks), driver);
    pb_task.abort();
    let survived = sys::alive(pid);
    let driven = driven.map(|(usage, h2, ws, driven, changed, attacked, readings)| {
        (usage.finish(), h2, ws, driven, changed, attacked, readings)
    });
    // Every client has gone: what is left once their connections are closed.
    tokio::time::sleep(SETTLE).await;
    let after = read(pid, admin).await;
    let clients_left = sys::connections(pid).0;
    term.finish().await;
    let settings = peer.settings.clone();
    peer.stop().await;
    pods.stop_all().await;
    ws_pods.stop_all().await;
    let (load, Some(((cpu, rss), h2, ws, driven, (counts, change_notes), attacked, readings))) =
        (load, driven)
    else {
        pb.finish_and_clear();
        return skipped("the load did not start".into());
    };
    let load = match load {
        Ok(l) => l,
        Err(e) => {
            pb.finish_and_clear();
            return skipped(format!("load failed: {e}"));
        }
    };
    let mut notes = change_notes;
    let mut events: Vec<Event> = Vec::new();
    for d in driven {
        match d {
            Driven::Event(e) => events.push(e),
            Driven::Note(n) => notes.push(n),
        }
    }
    let mut summary = SoakSummary {
        interval_s: plan.interval.as_secs_f64(),
        changes: counts,
        ..SoakSummary::default()
    };
    summary.changes.endpoint_changes = events.iter().filter(|e| e.endpoint_change).count() as u64;
    summary.changes.attacks = attacked.len() as u64;
    summary.before = Some(Leftover::from_reading(&before, 0));
    summary.after = Some(Leftover::from_reading(&after, clients_left));
    let mut problems: Vec<String> = readings
        .iter()
        .chain([&before, &after])
        .flat_map(|r| r.problems.iter().cloned())
        .collect();
    problems.sort();
    problems.dedup();
    notes.extend(problems.into_iter().map(|p| format!("problem listed: {p}")));
    let n = readings.len();
    for (i, reading) in readings.iter().enumerate() {
        let mut s = SoakSample {
            t_s: (i + 1) as f64 * plan.interval.as_secs_f64(),
            h2: h2.traffic(i),
            ws: ws.traffic(i),
            rss_bytes: reading.rss,
            fds: reading.fds,
            tasks: reading.tasks,
            upstream_connections: reading.upstream,
            problems: reading.problems.len(),
            attack: attacked
                .iter()
                .find(|(j, _, _)| *j == i)
                .map(|(_, a, _)| a.name().to_string()),
            ..SoakSample::default()
        };
        if let Some(sec) = load.timeline.get(i) {
            s.https.requests = sec.requests;
            s.https.failed = sec.failed;
            s.https.p99_ms = sec.p99_ms;
        }
        if i + 1 == n {
            // What finished after the last full interval (answers to the last requests).
            for late in load.timeline.iter().skip(n) {
                s.https.requests += late.requests;
                s.https.failed += late.failed;
            }
            for j in n..n + 2 {
                let (h, w) = (h2.traffic(j), ws.traffic(j));
                s.h2.requests += h.requests;
                s.h2.failed += h.failed;
                s.ws.requests += w.requests;
                s.ws.failed += w.failed;
            }
        }
        summary.samples.push(s);
    }
    summary.judge(plan.duration.as_secs_f64(), survived);
    let (h2_total, h2_failed) = h2.totals();
    let (ws_total, ws_failed) = ws.totals();
    notes.push(format!(
        "HTTP/2: {h2_total} requests, {h2_failed} failed; WebSocket: {ws_total} upgrades and echoes, {ws_failed} failed"
    ));
    notes.extend(attacked.into_iter().map(|(_, _, said)| said));
    pb.finish_with_message(format!(
        "{}: HTTPS {} failed of {}, h2 {h2_failed} of {h2_total}, ws {ws_failed} of {ws_total}",
        if summary.held { "held" } else { "did not hold" },
        load.requests_failed,
        load.requests
    ));
    let mut r = PeerResult {
        name: name.into(),
        variant: "soak".into(),
        changes: summary.changes.endpoint_changes,
        cpu_seconds: cpu,
        peak_rss_bytes: rss,
        settings,
        events,
        notes,
        ..PeerResult::default()
    }
    .with_load(&load);
    r.cpu_ms_per_1k_requests = if load.requests > 0 {
        cpu * 1e6 / (load.requests + h2_total + ws_total) as f64
    } else {
        0.0
    };
    (r, Some(summary))
}

/// Waits (up to 10 s) until a WebSocket session through the new `/ws` route succeeds.
async fn ws_ready(target: &Target) -> Result<(), String> {
    let connector = crate::load::Connector::new(vec![target.addr], Some(&target.tls))
        .map_err(|e| format!("TLS: {e}"))?;
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let b = Buckets::new(Instant::now(), Duration::from_secs(3600));
        let end = Instant::now() + Duration::from_secs(5);
        clients::ws_session(&connector, &target.host, (1, Duration::ZERO), (0, end), &b).await;
        let (n, failed) = b.totals();
        if n > 0 && failed == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the WebSocket route never answered an upgrade with an echo".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attacks_take_turns_every_few_intervals() {
        let plan = Plan {
            duration: secs(600.0),
            interval: secs(60.0),
            rate: 1.0,
            connections: 1,
            h2_connections: 1,
            h2_rate: 1.0,
            ws_sessions: 1,
            ws_messages: 1,
            ws_gap: Duration::ZERO,
            change_every: secs(5.0),
            attack_every: 5,
            attackers: 10,
            churn_hold: secs(10.0),
        };
        assert_eq!(plan.intervals(), 10);
        let a = plan.attacks();
        assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 9]);
        assert_ne!(a[0].1, a[1].1);
        assert!(
            a.iter()
                .all(|x| !matches!(x.1, Attack::None | Attack::CertSubject))
        );
    }
}
