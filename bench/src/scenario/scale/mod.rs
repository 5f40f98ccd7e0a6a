//! `scale`: many Ingresses or HTTPRoutes (each with its own Service and EndpointSlice; for the
//! reload peers a server block / backend and an upstream each). Cold start to ready, one
//! endpoint change → first request served by the new backend, one route change (sluice: object
//! 0 pointed at another Service) → the same, peak memory; the same configuration size through
//! nginx and HAProxy reloads for comparison.

mod files;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

pub use self::files::Objects;
use self::files::{
    SWITCH_SERVICES, haproxy_conf, host, nginx_conf, sluice_files, sluice_route_change,
    traefik_files, write_file,
};
use super::{Common, Usage};
use crate::backend::{Backend, BackendConfig};
use crate::load::probe;
use crate::peers::proc::Proc;
use crate::peers::{PeerKind, free_port};
use crate::report::{Report, ScaleRow};
use crate::sys;

/// Changes of each kind measured per size for the reload peers (each is a reload of the
/// whole configuration: at 10,000 Ingresses, seconds apiece).
const CHANGES: usize = 5;
/// Changes of each kind measured per size for sluice (enough for a p95; the p99 of fewer than
/// 100 is their maximum).
const SLUICE_CHANGES: usize = 20;

/// Four backends on one port at 127.0.0.2-5 (so that one EndpointSlice holds two of them):
/// A and B serve every host at start; service 0 is then switched between C and D.
async fn backends() -> std::io::Result<Vec<Backend>> {
    let mut last = std::io::Error::other("no port");
    for _ in 0..20 {
        let port = free_port().map_err(std::io::Error::other)?;
        let mut out = Vec::new();
        for (i, ip) in [2u8, 3, 4, 5].into_iter().enumerate() {
            let cfg = BackendConfig {
                name: ["A", "B", "C", "D"][i].into(),
                body_size: 1024,
                http2: false,
                delay: std::time::Duration::ZERO,
            };
            match Backend::start(SocketAddr::from(([127, 0, 0, ip], port)), cfg).await {
                Ok(b) => out.push(b),
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        if out.len() == 4 {
            return Ok(out);
        }
        for b in out {
            b.kill();
        }
    }
    Err(last)
}

/// Polls `host` through `addr` until it answers 200 (from `want`, if given).
async fn until_served(
    addr: SocketAddr,
    host: &str,
    want: Option<&str>,
    within: Duration,
    proc: &mut Proc,
) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < within {
        if proc.exited().is_some() {
            return None;
        }
        if let Ok(r) = probe(addr, host, "/", None, Duration::from_secs(1)).await
            && r.status == 200
            && want.is_none_or(|w| r.backend.as_str() == Some(w))
        {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// Writes the whole config for `n` Ingresses (service 0 → `first`) and returns its size.
type Writer<'a> = dyn Fn(&Path, usize, &[SocketAddr], u16) -> std::io::Result<u64> + 'a;
/// A route change: host 0 now goes to this Service (of [`SWITCH_SERVICES`]).
type RouteWriter<'a> = dyn Fn(&Path, &str) -> std::io::Result<u64> + 'a;

/// How one peer is run at one size.
struct Plan<'a> {
    kind: PeerKind,
    objects: Objects,
    n: usize,
    changes: usize,
    write: &'a Writer<'a>,
    /// Route changes, where the peer has them apart from endpoint changes (sluice).
    route: Option<&'a RouteWriter<'a>>,
    spawn: &'a dyn Fn(&Path, u16) -> Result<Proc, String>,
    apply: &'a dyn Fn(&Path, u32) -> Result<(), String>,
}

/// Times `changes` changes made by `change(k)` (which returns the backend that must answer
/// next): from the change to the first new connection to host 0 answered by that backend.
async fn timed_changes(
    changes: usize,
    addr: SocketAddr,
    proc: &mut Proc,
    notes: &mut Vec<String>,
    what: &str,
    mut change: impl FnMut(usize) -> Result<&'static str, String>,
) -> Vec<f64> {
    let mut times = Vec::new();
    for k in 0..changes {
        let t = Instant::now();
        let name = match change(k) {
            Ok(name) => name,
            Err(e) => {
                notes.push(format!("{what} change {k}: {e}"));
                break;
            }
        };
        match until_served(addr, &host(0), Some(name), Duration::from_secs(120), proc).await {
            Some(_) => times.push(t.elapsed().as_secs_f64() * 1000.0),
            None => {
                notes.push(format!(
                    "{what} change {k}: backend {name} never answered within 120 s"
                ));
                break;
            }
        }
        // Let old workers of reload peers drain before the next change.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    times.sort_by(f64::total_cmp);
    times
}

/// Median and largest of sorted times (0 when there are none).
fn median_max(times: &[f64]) -> (f64, f64) {
    match (times.get(times.len() / 2), times.last()) {
        (Some(mid), Some(max)) => (*mid, *max),
        _ => (0.0, 0.0),
    }
}

async fn measure(plan: Plan<'_>, bk: &[Backend]) -> ScaleRow {
    let Plan {
        kind,
        objects,
        n,
        changes,
        write,
        route,
        spawn,
        apply,
    } = plan;
    let mut row = ScaleRow::new(kind.name(), n, None);
    row.objects = objects.kind().into();
    let fail = |mut row: ScaleRow, why: String| {
        row.skipped = Some(why);
        row
    };
    let Ok(dir) = tempfile::Builder::new()
        .prefix(&format!("sluice-bench-scale-{}-", kind.name()))
        .tempdir()
    else {
        return fail(row, "no temp dir".into());
    };
    let (a, b, c, d) = (bk[0].addr, bk[1].addr, bk[2].addr, bk[3].addr);
    let Ok(port) = free_port() else {
        return fail(row, "no free port".into());
    };
    match write(dir.path(), n, &[a, b], port) {
        Ok(bytes) => row.config_bytes = bytes,
        Err(e) => return fail(row, format!("writing the config: {e}")),
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    let mut proc = match spawn(dir.path(), port) {
        Ok(p) => p,
        Err(e) => return fail(row, e),
    };
    let usage = Usage::start(Some(proc.pid));
    let ready = until_served(
        addr,
        &host(n - 1),
        None,
        Duration::from_secs(300),
        &mut proc,
    )
    .await;
    row.cpu_seconds_to_ready = sys::tree_cpu_seconds(proc.pid);
    let Some(_) = ready else {
        let tail = proc.log_tail();
        proc.stop(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(3))
            .await;
        return fail(row, format!("never answered on {}: {tail}", host(n - 1)));
    };
    row.ready_s = started.elapsed().as_secs_f64();
    // HAProxy 2.6's master drops a USR2 that arrives right after start-up (measured here: the
    // first reload was lost when sent within ~50 ms of the first answer), so give every peer a
    // second to settle before the changes are timed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = proc.pid;
    let path = dir.path();
    let mut notes = Vec::new();
    let times = timed_changes(changes, addr, &mut proc, &mut notes, "endpoint", |k| {
        let (target, name) = if k % 2 == 0 { (c, "C") } else { (d, "D") };
        write(path, n, &[target], port)
            .map_err(|e| e.to_string())
            .and_then(|_| apply(path, pid))?;
        Ok(name)
    })
    .await;
    row.changes = times.len();
    (row.change_median_ms, row.change_max_ms) = median_max(&times);
    if let Some(route) = route {
        // Service 0 was last switched to C (D) by an odd (even) number of changes: each route
        // change moves host 0 to the Service of the other backend, so every one shows.
        let last_c = times.len() % 2 == 1;
        let times = timed_changes(changes, addr, &mut proc, &mut notes, "route", |k| {
            let to_d = (k % 2 == 0) == last_c;
            let (svc, name) = if to_d {
                (SWITCH_SERVICES[1], "D")
            } else {
                (SWITCH_SERVICES[0], "C")
            };
            route(path, svc).map_err(|e| e.to_string())?;
            Ok(name)
        })
        .await;
        row.route_changes = times.len();
        (row.route_change_median_ms, row.route_change_max_ms) = median_max(&times);
    }
    row.notes = notes;
    let (_, rss) = usage.finish();
    row.peak_rss_bytes = rss;
    proc.stop(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(5))
        .await;
    row
}

/// Why `kind` does not run with `objects`, if it does not.
fn unsupported(c: &Common, kind: PeerKind, objects: Objects) -> Option<String> {
    match (kind, objects) {
        (PeerKind::Sluice, _) => kind.unavailable(&c.env),
        (_, Objects::Httproute) => Some("reads no Gateway API here (HTTPRoutes are sluice's only)".into()),
        (PeerKind::NginxReload | PeerKind::HaproxyReload | PeerKind::Traefik, Objects::Ingress) => {
            kind.unavailable(&c.env)
        }
        _ => Some(
            "scale compares sluice with the reload peers (nginx-reload, haproxy-reload) and traefik"
                .into(),
        ),
    }
}

/// One peer at one size.
async fn run_peer(
    c: &Common,
    kind: PeerKind,
    objects: Objects,
    n: usize,
    bk: &[Backend],
    ab: &[SocketAddr],
) -> ScaleRow {
    let env = &c.env;
    let workers = env.workers;
    let cpus = env.cpus.clone();
    let nothing_to_apply = |_: &Path, _: u32| Ok(());
    match kind {
        PeerKind::Sluice => {
            let bin = env.sluice_bin.clone();
            let admin = SocketAddr::from(([127, 0, 0, 1], free_port().unwrap_or(0)));
            let cd = [bk[2].addr, bk[3].addr];
            let write = |d: &Path, n, first: &[SocketAddr], port| {
                sluice_files(d, objects, (n, port), first, ab, cd)
            };
            let route = |d: &Path, svc: &str| sluice_route_change(d, objects, svc);
            let spawn = |d: &Path, port: u16| {
                // HTTPRoutes: the Gateway's listener has the measured port, and the Ingress
                // listener (which may not share it) another.
                let http = match objects {
                    Objects::Ingress => port,
                    Objects::Httproute => free_port().map_err(|e| e.to_string())?,
                };
                let args = crate::peers::sluice::serve_args(
                    &d.join("manifests"),
                    &format!("127.0.0.1:{http}"),
                    "off",
                    admin,
                    (workers, false),
                    "warn",
                );
                Proc::spawn(&bin, &args, d, &[], cpus.as_deref()).map_err(|e| e.to_string())
            };
            let plan = Plan {
                kind,
                objects,
                n,
                changes: SLUICE_CHANGES,
                write: &write,
                route: Some(&route),
                spawn: &spawn,
                apply: &nothing_to_apply,
            };
            measure(plan, bk).await
        }
        PeerKind::Traefik => {
            let write = |d: &Path, n, first: &[SocketAddr], _| traefik_files(d, n, first, ab);
            let spawn = |d: &Path, port| crate::peers::traefik::spawn_for_scale(env, d, port);
            let plan = Plan {
                kind,
                objects,
                n,
                changes: CHANGES,
                write: &write,
                route: None,
                spawn: &spawn,
                apply: &nothing_to_apply,
            };
            measure(plan, bk).await
        }
        PeerKind::NginxReload => {
            let bin = sys::which("nginx").unwrap_or_default();
            let write = |d: &Path, n, first: &[SocketAddr], p| {
                crate::peers::nginx_open_dir(d)?;
                write_file(
                    &d.join("nginx.conf"),
                    &nginx_conf(d, n, first, ab, p, workers),
                )
            };
            let spawn = |d: &Path, _| {
                Proc::spawn(&bin, &crate::peers::nginx_args(d), d, &[], cpus.as_deref())
                    .map_err(|e| e.to_string())
            };
            let apply = |d: &Path, _| {
                std::process::Command::new(&bin)
                    .args(crate::peers::nginx_args(d))
                    .args(["-s", "reload"])
                    .status()
                    .map_err(|e| e.to_string())
                    .and_then(|s| {
                        if s.success() {
                            Ok(())
                        } else {
                            Err(format!("nginx -s reload: {s}"))
                        }
                    })
            };
            let plan = Plan {
                kind,
                objects,
                n,
                changes: CHANGES,
                write: &write,
                route: None,
                spawn: &spawn,
                apply: &apply,
            };
            measure(plan, bk).await
        }
        _ => {
            let bin = sys::which("haproxy").unwrap_or_default();
            let write = |d: &Path, n, first: &[SocketAddr], p| {
                let (cfg, map) = haproxy_conf(d, n, first, ab, p, workers);
                Ok(write_file(&d.join("hosts.map"), &map)?
                    + write_file(&d.join("haproxy.cfg"), &cfg)?)
            };
            let spawn = |d: &Path, _| {
                Proc::spawn(
                    &bin,
                    &[
                        "-W".into(),
                        "-f".into(),
                        d.join("haproxy.cfg").display().to_string(),
                    ],
                    d,
                    &[],
                    cpus.as_deref(),
                )
                .map_err(|e| e.to_string())
            };
            let apply = |_: &Path, pid| {
                sys::signal(pid, nix::sys::signal::Signal::SIGUSR2);
                Ok(())
            };
            let plan = Plan {
                kind,
                objects,
                n,
                changes: CHANGES,
                write: &write,
                route: None,
                spawn: &spawn,
                apply: &apply,
            };
            measure(plan, bk).await
        }
    }
}

/// Runs the scale scenario.
pub async fn run(c: &Common) -> Report {
    let sizes = c.ingresses.clone().unwrap_or(if c.quick {
        vec![100, 1000]
    } else {
        vec![100, 1000, 10_000]
    });
    let objects = if c.objects.is_empty() {
        vec![Objects::Ingress]
    } else {
        c.objects.clone()
    };
    let mut rows = Vec::new();
    let bk = match backends().await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("scale: backends did not start: {e}");
            Vec::new()
        }
    };
    let ab = bk.iter().take(2).map(|b| b.addr).collect::<Vec<_>>();
    for &kind in &c.peers {
        for &n in &sizes {
            for &o in &objects {
                if bk.len() < 4 || n == 0 {
                    continue;
                }
                if let Some(why) = unsupported(c, kind, o) {
                    if matches!(kind, PeerKind::Sluice) || n == sizes[0] {
                        let mut row = ScaleRow::new(kind.name(), n, Some(why));
                        row.objects = o.kind().into();
                        rows.push(row);
                    }
                    continue;
                }
                eprintln!("scale: {} with {n} {} objects ...", kind.name(), o.kind());
                rows.push(run_peer(c, kind, o, n, &bk, &ab).await);
            }
        }
    }
    for b in bk {
        b.kill();
    }
    let mut settings = BTreeMap::new();
    settings.insert("sizes".into(), format!("{sizes:?} Ingresses, each with its own host, Service and 2-endpoint EndpointSlice (nginx: a server block and an upstream each; HAProxy: a backend each, host → backend map)"));
    settings.insert("objects".into(), format!("{}: sluice's routes as Ingresses (IngressClass sluice) and/or as HTTPRoutes (one Gateway, one HTTP listener on the measured port, an HTTPRoute per host with its own Service)", objects.iter().map(|o| o.kind()).collect::<Vec<_>>().join(", ")));
    settings.insert("change".into(), format!("endpoint changes ({SLUICE_CHANGES} for sluice, {CHANGES} for the others): service 0's endpoints switched to another backend (sluice: its EndpointSlice file rewritten; nginx: config rewritten + nginx -s reload; HAProxy: config rewritten + USR2; Traefik: the small file of the first Ingress rewritten in its watched directory); timed until a new connection to host 0 is answered by the new backend. Route changes (sluice, {SLUICE_CHANGES}): the file holding object 0 (Ingress or HTTPRoute) rewritten to send host 0 to another Service, timed the same way (for the reload peers a route change is the same reload as an endpoint change). The p99 of fewer than 100 changes is their maximum"));
    settings.insert("protocol".into(), "plain HTTP".into());
    Report {
        scenario: "scale".into(),
        quick: c.quick,
        started_utc: String::new(),
        command: c.command.clone(),
        what_it_shows: "Configuration size: how long each proxy takes to start with N Ingresses (sluice also with N HTTPRoutes), how long one endpoint change and one route change take to reach traffic, and peak memory (process tree; nginx workers share pages with their master, so its sum overstates). Loopback, one machine.".into(),
        machine: c.machine.clone(),
        settings,
        peers: Vec::new(),
        scale: rows,
        extra: Vec::new(),
        rounds: Vec::new(),
        soak: None,
        idle: Vec::new(),
    }
}
