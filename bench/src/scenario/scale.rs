//! `scale`: many Ingresses (each with its own Service and EndpointSlice; for the reload peers a
//! server block / backend and an upstream each). Cold start to ready, one endpoint change →
//! first request served by the new backend, peak memory; the same configuration size through
//! nginx and HAProxy reloads for comparison.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::{Common, Usage};
use crate::backend::{Backend, BackendConfig};
use crate::load::probe;
use crate::peers::proc::Proc;
use crate::peers::{BACKLOG, PeerEnv, PeerKind, free_port};
use crate::report::{Report, ScaleRow};
use crate::sys;

/// Endpoint changes measured per size.
const CHANGES: usize = 5;

fn host(i: usize) -> String {
    format!("h{i}.bench.local")
}

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

async fn measure(
    kind: PeerKind,
    env: &PeerEnv,
    n: usize,
    bk: &[Backend],
    write: &Writer<'_>,
    spawn: &dyn Fn(&Path, u16) -> Result<Proc, String>,
    apply: &dyn Fn(&Path, u32) -> Result<(), String>,
) -> ScaleRow {
    let mut row = ScaleRow::new(kind.name(), n, None);
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
    let mut times = Vec::new();
    for k in 0..CHANGES {
        let (target, name) = if k % 2 == 0 { (c, "C") } else { (d, "D") };
        let t = Instant::now();
        if let Err(e) = write(dir.path(), n, &[target], port)
            .map_err(|e| e.to_string())
            .and_then(|_| apply(dir.path(), proc.pid))
        {
            row.notes.push(format!("change {k}: {e}"));
            break;
        }
        match until_served(
            addr,
            &host(0),
            Some(name),
            Duration::from_secs(120),
            &mut proc,
        )
        .await
        {
            Some(_) => times.push(t.elapsed().as_secs_f64() * 1000.0),
            None => {
                row.notes.push(format!(
                    "change {k}: backend {name} never answered within 120 s"
                ));
                break;
            }
        }
        // Let old workers of reload peers drain before the next change.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (_, rss) = usage.finish();
    row.peak_rss_bytes = rss;
    proc.stop(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(5))
        .await;
    times.sort_by(f64::total_cmp);
    row.changes = times.len();
    if let (Some(mid), Some(max)) = (times.get(times.len() / 2), times.last()) {
        (row.change_median_ms, row.change_max_ms) = (*mid, *max);
    }
    let _ = env;
    row
}

fn write_file(path: &Path, s: &str) -> std::io::Result<u64> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, s)?;
    std::fs::rename(&tmp, path)?;
    Ok(s.len() as u64)
}

/// sluice's manifests: the big files once, the probe service's slice on every change.
fn sluice_files(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
) -> std::io::Result<u64> {
    use crate::peers::sluice::endpoint_slices;
    let m = dir.join("manifests");
    std::fs::create_dir_all(&m)?;
    let mut total = write_file(&m.join("probe.yaml"), &endpoint_slices("svc-0", first))?;
    if m.join("ingresses.yaml").exists() {
        return Ok(total);
    }
    let (mut ing, mut svc, mut sl) = (String::new(), String::new(), String::new());
    ing.push_str("apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: sluice\nspec:\n  controller: sluice.dev/ingress-controller\n");
    for i in 0..n {
        let _ = write!(
            ing,
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: ing-{i}\n  namespace: default\nspec:\n  ingressClassName: sluice\n  rules:\n  - host: \"{}\"\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: svc-{i}\n            port:\n              number: 80\n",
            host(i)
        );
        let _ = write!(
            svc,
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n"
        );
        if i > 0 {
            let _ = write!(sl, "---\n{}", endpoint_slices(&format!("svc-{i}"), ab));
        }
    }
    total += write_file(&m.join("ingresses.yaml"), &ing)?;
    total += write_file(&m.join("services.yaml"), &svc)?;
    total += write_file(&m.join("slices.yaml"), &sl)?;
    Ok(total)
}

fn nginx_conf(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
    port: u16,
    workers: usize,
) -> String {
    let d = dir.display();
    let mut s = format!(
        "worker_processes {workers};\nworker_rlimit_nofile 16384;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 8192; }}\nhttp {{\n  access_log off;\n  server_names_hash_max_size 131072;\n  server_names_hash_bucket_size 128;\n  variables_hash_max_size 2048;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n  fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n  proxy_http_version 1.1;\n  proxy_set_header Connection \"\";\n"
    );
    for i in 0..n {
        let eps = if i == 0 { first } else { ab };
        let servers: String = eps.iter().map(|a| format!("server {a}; ")).collect();
        // Listen options may be given once per address.
        let backlog = if i == 0 {
            format!(" backlog={BACKLOG}")
        } else {
            String::new()
        };
        let _ = write!(
            s,
            "  upstream u{i} {{ {servers}keepalive 16; }}\n  server {{ listen 127.0.0.1:{port}{backlog}; server_name {}; location / {{ proxy_pass http://u{i}; }} }}\n",
            host(i)
        );
    }
    s.push_str("}\n");
    s
}

fn haproxy_conf(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
    port: u16,
    workers: usize,
) -> (String, String) {
    let d = dir.display();
    let mut s = format!(
        "global\n  nbthread {workers}\n  maxconn 8000\n  hard-stop-after 60s\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 75s\n  timeout server 60s\n  retries 2\n  option redispatch 1\nfrontend fe\n  bind 127.0.0.1:{port}\n  backlog {BACKLOG}\n  use_backend %[req.hdr(host),lower,map({d}/hosts.map,be0)]\n"
    );
    let mut map = String::new();
    for i in 0..n {
        let eps = if i == 0 { first } else { ab };
        let _ = writeln!(map, "{} be{i}", host(i));
        let _ = writeln!(s, "backend be{i}");
        for (k, a) in eps.iter().enumerate() {
            let _ = writeln!(s, "  server s{k} {a}");
        }
    }
    (s, map)
}

/// Traefik's dynamic files: `rest.yml` with every Ingress but the first (written once) and
/// `first.yml` with the first (rewritten on every change); Traefik re-reads the directory.
fn traefik_files(
    dir: &Path,
    n: usize,
    first: &[SocketAddr],
    ab: &[SocketAddr],
) -> std::io::Result<u64> {
    use crate::peers::traefik::scale_route;
    let d = dir.join("dynamic");
    std::fs::create_dir_all(&d)?;
    let mut bytes = 0;
    let rest = d.join("rest.yml");
    if n > 1 && !rest.exists() {
        let (mut routers, mut services) = (String::new(), String::new());
        for i in 1..n {
            let (r, s) = scale_route(&format!("r{i}"), &host(i), ab);
            routers.push_str(&r);
            services.push_str(&s);
        }
        bytes += write_file(
            &rest,
            &format!("http:\n  routers:\n{routers}  services:\n{services}"),
        )?;
    }
    let (r, s) = scale_route("r0", &host(0), first);
    bytes += write_file(
        &d.join("first.yml"),
        &format!("http:\n  routers:\n{r}  services:\n{s}"),
    )?;
    Ok(bytes)
}

/// Runs the scale scenario.
pub async fn run(c: &Common) -> Report {
    let sizes = c.ingresses.clone().unwrap_or(if c.quick {
        vec![100, 1000]
    } else {
        vec![100, 1000, 10_000]
    });
    let mut rows = Vec::new();
    let bk = match backends().await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("scale: backends did not start: {e}");
            Vec::new()
        }
    };
    let ab = bk.iter().take(2).map(|b| b.addr).collect::<Vec<_>>();
    let env = &c.env;
    let workers = env.workers;
    let cpus = env.cpus.clone();
    for &kind in &c.peers {
        for &n in &sizes {
            if bk.len() < 4 || n == 0 {
                continue;
            }
            let supported = matches!(
                kind,
                PeerKind::Sluice
                    | PeerKind::NginxReload
                    | PeerKind::HaproxyReload
                    | PeerKind::Traefik
            );
            let why = if supported {
                kind.unavailable(env)
            } else {
                Some(
                    "scale compares sluice with the reload peers (nginx-reload, haproxy-reload) and traefik"
                        .into(),
                )
            };
            if let Some(why) = why {
                if supported || n == sizes[0] {
                    rows.push(ScaleRow::new(kind.name(), n, Some(why)));
                }
                continue;
            }
            eprintln!("scale: {} with {n} Ingresses ...", kind.name());
            let cpus = cpus.clone();
            let row = match kind {
                PeerKind::Sluice => {
                    let bin = env.sluice_bin.clone();
                    let admin = SocketAddr::from(([127, 0, 0, 1], free_port().unwrap_or(0)));
                    measure(
                        kind,
                        env,
                        n,
                        &bk,
                        &|d, n, first, _| sluice_files(d, n, first, &ab),
                        &|d, port| {
                            let args = crate::peers::sluice::serve_args(
                                &d.join("manifests"),
                                &format!("127.0.0.1:{port}"),
                                "off",
                                admin,
                                (workers, false),
                                "warn",
                            );
                            Proc::spawn(&bin, &args, d, &[], cpus.as_deref())
                                .map_err(|e| e.to_string())
                        },
                        &|_, _| Ok(()),
                    )
                    .await
                }
                PeerKind::Traefik => {
                    measure(
                        kind,
                        env,
                        n,
                        &bk,
                        &|d, n, first, _| traefik_files(d, n, first, &ab),
                        &|d, port| crate::peers::traefik::spawn_for_scale(env, d, port),
                        &|_, _| Ok(()),
                    )
                    .await
                }
                PeerKind::NginxReload => {
                    let bin = sys::which("nginx").unwrap_or_default();
                    measure(
                        kind,
                        env,
                        n,
                        &bk,
                        &|d, n, first, p| {
                            crate::peers::nginx_open_dir(d)?;
                            write_file(
                                &d.join("nginx.conf"),
                                &nginx_conf(d, n, first, &ab, p, workers),
                            )
                        },
                        &|d, _| {
                            Proc::spawn(&bin, &crate::peers::nginx_args(d), d, &[], cpus.as_deref())
                                .map_err(|e| e.to_string())
                        },
                        &|d, _| {
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
                        },
                    )
                    .await
                }
                _ => {
                    let bin = sys::which("haproxy").unwrap_or_default();
                    measure(
                        kind,
                        env,
                        n,
                        &bk,
                        &|d, n, first, p| {
                            let (cfg, map) = haproxy_conf(d, n, first, &ab, p, workers);
                            Ok(write_file(&d.join("hosts.map"), &map)?
                                + write_file(&d.join("haproxy.cfg"), &cfg)?)
                        },
                        &|d, _| {
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
                        },
                        &|_, pid| {
                            sys::signal(pid, nix::sys::signal::Signal::SIGUSR2);
                            Ok(())
                        },
                    )
                    .await
                }
            };
            rows.push(row);
        }
    }
    for b in bk {
        b.kill();
    }
    let mut settings = BTreeMap::new();
    settings.insert("sizes".into(), format!("{sizes:?} Ingresses, each with its own host, Service and 2-endpoint EndpointSlice (nginx: a server block and an upstream each; HAProxy: a backend each, host → backend map)"));
    settings.insert("change".into(), format!("{CHANGES} times: service 0's endpoints switched to another backend (sluice: its EndpointSlice file rewritten; nginx: config rewritten + nginx -s reload; HAProxy: config rewritten + USR2; Traefik: the small file of the first Ingress rewritten in its watched directory); timed until a new connection to host 0 is answered by the new backend"));
    settings.insert("protocol".into(), "plain HTTP".into());
    Report {
        scenario: "scale".into(),
        quick: c.quick,
        started_utc: String::new(),
        command: c.command.clone(),
        what_it_shows: "Configuration size: how long each proxy takes to start with N Ingresses, how long one endpoint change takes to reach traffic, and peak memory (process tree; nginx workers share pages with their master, so its sum overstates). Loopback, one machine.".into(),
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
