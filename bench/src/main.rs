//! `sluice-bench`: reproduces the published ingress benchmarks on one machine over loopback
//! (scenarios), plus the load generator on its own (`load`, used by the in-cluster harness) and
//! demo backends (`backends`).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use sluice_bench::backend::{Backend, BackendConfig};
use sluice_bench::load::attack::Attack;
use sluice_bench::load::{self, Hooks, LoadReport, LoadSpec, Mode, TlsSpec, TlsVersion, Verify};
use sluice_bench::peers::{PeerEnv, PeerKind, Proto, sluice_api};
use sluice_bench::pods::{Removal, StopMode};
use sluice_bench::scenario::seed::{self, Seed};
use sluice_bench::scenario::{self, Common, Scenario};
use sluice_bench::{certs, report, sys};

/// sluice's benchmark: sluice head-to-head with reload-based nginx and HAProxy (and Caddy,
/// nginx + Lua, HAProxy's runtime API), reproducing the published ingress tests on loopback.
///
/// Start with: sluice-bench churn --quick
#[derive(Debug, Parser)]
#[command(name = "sluice-bench", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Constant-rate load while backends churn 5→7→5 (the headline test).
    Churn(ScenarioArgs),
    /// The same load with no changes: the baseline.
    Static(ScenarioArgs),
    /// Closed-loop requests per second, 1 KB, keep-alive, HTTP and HTTPS.
    Rps(ScenarioArgs),
    /// TLS handshakes per second: a new connection per request, 0 KB, RSA-2048, TLS 1.2 and 1.3.
    Tps(ScenarioArgs),
    /// 1 MB responses, closed loop.
    Throughput(ScenarioArgs),
    /// 100 / 1,000 / 10,000 Ingresses: start time, change propagation, memory.
    Scale(ScenarioArgs),
    /// Compare this load generator with wrk on the same target.
    Validate(ScenarioArgs),
    /// Constant-rate legitimate load while each attack runs in turn (h2 preface hold, h2
    /// idle, slowloris, slow reader, max-size heads, upgrade flood, rapid reset).
    Abuse(ScenarioArgs),
    /// Memory per idle keep-alive connection (HTTP, HTTPS, HTTP/2), every peer in one run:
    /// --connections each (default 5000, quick 1000), read --duration seconds (default 15)
    /// after the last answer.
    Idle(ScenarioArgs),
    /// A published test as one named run, its report beside the published figures
    /// (`seed --list` for the names).
    Seed(SeedArgs),
    /// Run the load generator alone against a URL.
    Load(LoadArgs),
    /// Start demo backends on 127.0.0.1:P, P+1, ... until Ctrl-C.
    Backends(BackendsArgs),
    /// Run one attack of the abuse scenario against a target (what `abuse` starts, as a
    /// process of its own, beside its load).
    Attack(AttackArgs),
    /// The `floor` peer's server (what the scenarios start, pinned, as a process of its own).
    #[command(hide = true)]
    FloorServe(FloorArgs),
}

#[derive(Debug, Clone, Args)]
struct FloorArgs {
    /// Listen address.
    #[arg(long)]
    listen: SocketAddr,
    /// Certificate chain (PEM); with --key, serve TLS.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Response body size in bytes.
    #[arg(long, default_value_t = 0)]
    body: usize,
    /// Runtime threads (1: a current-thread runtime, as sluice runs one worker).
    #[arg(long, default_value_t = 1)]
    workers: usize,
}

#[derive(Debug, Clone, Args)]
struct ScenarioArgs {
    /// Short run (about a minute for churn with every peer installed).
    #[arg(long)]
    quick: bool,
    /// Peers, comma-separated: sluice,nginx-reload,nginx-lua,haproxy-reload,haproxy-runtime,caddy,traefik,direct
    /// (and floor: no proxy, a bare TLS server answering itself; named only).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Client protocol (churn/static default https; rps/throughput default both).
    #[arg(long, value_enum)]
    proto: Option<ProtoArg>,
    /// Requests per second (open loop; churn/static).
    #[arg(long)]
    rate: Option<f64>,
    /// Connections.
    #[arg(long)]
    connections: Option<usize>,
    /// Seconds of load per peer.
    #[arg(long)]
    duration: Option<f64>,
    /// Churn: seconds at each replica count (default 12 at 7 and 10 at 5; quick 1.5).
    #[arg(long)]
    interval: Option<f64>,
    /// Churn: when the endpoint is removed relative to the pod's SIGTERM.
    #[arg(long, value_enum, default_value_t = Removal::After)]
    removal: Removal,
    /// Churn: seconds between the two steps of a removal (default 1; quick 0.5).
    #[arg(long)]
    gap: Option<f64>,
    /// Churn: how a removed pod stops: graceful (SIGTERM handled), fast (every connection
    /// reset), kill, or mixed (the three in turn).
    #[arg(long, value_enum, default_value_t = StopMode::Mixed)]
    stop: StopMode,
    /// Churn: stop each removed pod this many seconds after its endpoint is removed (0: as it
    /// goes). Shorthand for --removal before --gap S.
    #[arg(long, conflicts_with_all = ["removal", "gap"])]
    stop_delay: Option<f64>,
    /// Load generator connect and response timeout (seconds; wrk's default is 2).
    #[arg(long, default_value_t = 2.0)]
    timeout: f64,
    /// Capacity scenarios (rps, tps, throughput): run every peer this many times, the order
    /// alternating each round, and add per-peer medians and the median same-round ratio to
    /// the first peer listed (what to quote on a noisy machine).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    rounds: u32,
    /// Cores given to the proxy (its workers and pinning).
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// Proxy worker processes/threads (default: --cores).
    #[arg(long)]
    workers: Option<usize>,
    /// CPUs the proxy is pinned to (default: the first --cores).
    #[arg(long)]
    proxy_cpus: Option<String>,
    /// CPUs the load generator and backends are pinned to (default: the rest).
    #[arg(long)]
    load_cpus: Option<String>,
    /// Do not pin anything.
    #[arg(long)]
    no_pin: bool,
    /// Load generator threads (default: the number of load CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Capacity scenarios with HTTP/1.1 keep-alive (rps, throughput): the load generator,
    /// ours or wrk (installed by bench/install-peers.sh). wrk reports fewer facts (no
    /// per-request truth, timeline or p99.9).
    #[arg(long, value_enum, default_value_t = GeneratorArg::Own)]
    generator: GeneratorArg,
    /// The sluice binary (default: next to sluice-bench).
    #[arg(long)]
    sluice_bin: Option<PathBuf>,
    /// sluice's --log-level during the run (its log is kept in OUT/logs/).
    #[arg(long, default_value = "warn")]
    sluice_log_level: String,
    /// Scale: Ingress counts, comma-separated. With `--source api`: how many Ingresses (each
    /// with its Service and EndpointSlice) the API server holds (the first count; default 1).
    #[arg(long, value_delimiter = ',')]
    ingresses: Vec<usize>,
    /// Where sluice's configuration comes from: `files` (`sluice serve` on manifest files) or
    /// `api` (`sluice controller` against a real kube-apiserver, changes written as
    /// EndpointSlices through the API; root only: the run moves into a network namespace of its
    /// own, see bench/README.md).
    #[arg(long, value_enum, default_value_t = Source::Files)]
    source: Source,
    /// The kube-apiserver for `--source api` (default: target/kube-apiserver/kube-apiserver,
    /// built by tests/kube-apiserver/build.sh).
    #[arg(long)]
    kube_apiserver: Option<PathBuf>,
    /// Abuse: attacks to run, comma-separated (default all): none, h2-preface-hold, h2-idle,
    /// h1-slowloris, slow-reader, max-heads, upgrade-flood, rapid-reset.
    #[arg(long, value_delimiter = ',')]
    attacks: Vec<String>,
    /// Abuse: attacker connections per attack (default 2000; quick 500; rapid reset at most
    /// 20, slow reader at most 100).
    #[arg(long)]
    attack_connections: Option<usize>,
    /// The certificate's key type every peer serves (tps: what each full handshake signs with).
    #[arg(long, value_enum, default_value_t = certs::KeyKind::Rsa2048)]
    key: certs::KeyKind,
    /// Output directory (default bench-out/<scenario>-<time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Terminal table with every column (wider than 100 columns); report.md always has them.
    #[arg(long)]
    wide: bool,
}

#[derive(Debug, Clone, Args)]
struct SeedArgs {
    /// The published test (see --list).
    name: Option<String>,
    /// List the published tests and what each runs.
    #[arg(long)]
    list: bool,
    #[command(flatten)]
    run: ScenarioArgs,
}

/// What a command runs: a scenario, or a seed's scenarios.
#[derive(Debug, Clone, Copy)]
enum Job {
    Scenario(Scenario),
    Seed(&'static Seed),
}

impl Job {
    fn name(self) -> String {
        match self {
            Job::Scenario(s) => s.name().into(),
            Job::Seed(s) => format!("seed-{}", s.name),
        }
    }

    fn default_peers(self) -> Vec<PeerKind> {
        match self {
            Job::Scenario(s) => s.default_peers(),
            Job::Seed(s) => s.peers.to_vec(),
        }
    }
}

/// The client protocol of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProtoArg {
    /// HTTP/1.1 over TCP.
    Http,
    /// HTTP/1.1 over TLS.
    Https,
    /// HTTP/2 over TLS (ALPN h2), many streams per connection, with h2load (rps only).
    H2,
}

impl ProtoArg {
    fn peer(self) -> Proto {
        match self {
            ProtoArg::Http => Proto::Http,
            ProtoArg::Https | ProtoArg::H2 => Proto::Https,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GeneratorArg {
    /// sluice-bench's own generator.
    Own,
    /// wrk, one thread per load CPU (or --threads).
    Wrk,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TlsArg {
    /// TLS 1.3, or 1.2 with ECDHE-RSA-AES256-GCM-SHA384.
    Any,
    /// TLS 1.2, ECDHE-RSA-AES256-GCM-SHA384 only.
    #[value(name = "1.2")]
    V12,
    /// TLS 1.3 only.
    #[value(name = "1.3")]
    V13,
}

#[derive(Debug, Clone, Args)]
struct LoadArgs {
    /// http:// or https:// URL; the host name resolves through the system resolver.
    #[arg(long)]
    url: String,
    /// Requests per second over all connections (open loop); omitted: closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Connections.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Runtime threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Connect and response timeout (seconds).
    #[arg(long, default_value_t = 2.0)]
    timeout: f64,
    /// Accept any server certificate (self-signed).
    #[arg(long)]
    insecure: bool,
    /// Trust this PEM certificate/CA instead of the system store.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// TLS versions offered.
    #[arg(long, value_enum, default_value_t = TlsArg::Any)]
    tls: TlsArg,
    /// No TLS session resumption (every connection a full handshake).
    #[arg(long)]
    no_resumption: bool,
    /// One request per connection (`Connection: close`).
    #[arg(long)]
    connection_close: bool,
    /// Connect here instead of resolving the URL's host (Host and SNI stay the URL's).
    #[arg(long)]
    connect_to: Option<SocketAddr>,
    /// Write the full report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
struct AttackArgs {
    /// The attack (none, h2-preface-hold, h2-idle, h1-slowloris, slow-reader, max-heads,
    /// upgrade-flood, rapid-reset).
    #[arg(long)]
    attack: String,
    /// Where (loopback or an address of a network namespace you made: do not attack others).
    #[arg(long)]
    target: SocketAddr,
    /// `Host` / `:authority` and TLS server name.
    #[arg(long, default_value = "bench.local")]
    host: String,
    /// Attack over TLS (certificate not checked).
    #[arg(long)]
    tls: bool,
    /// Attacker connections.
    #[arg(long, default_value_t = 500)]
    connections: usize,
    /// Seconds to wait before attacking.
    #[arg(long, default_value_t = 0.0)]
    after: f64,
    /// Seconds from the start until every attacker connection is dropped.
    #[arg(long, default_value_t = 10.0)]
    until: f64,
    /// Write what happened to the attackers as JSON here (else it is printed).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
struct BackendsArgs {
    /// How many.
    #[arg(long, default_value_t = 5)]
    count: u16,
    /// First port.
    #[arg(long, default_value_t = 9001)]
    base_port: u16,
    /// Response body size in bytes (`?size=N` overrides per request).
    #[arg(long, default_value_t = 1024)]
    body_size: usize,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let nofile = sys::raise_nofile();
    match cli.cmd {
        Cmd::Load(a) => runtime(a.threads.unwrap_or_else(sys::cpu_count))?.block_on(load_cmd(a)),
        Cmd::Backends(a) => runtime(1)?.block_on(backends_cmd(a)),
        Cmd::Attack(a) => runtime(1)?.block_on(attack_cmd(a)),
        Cmd::FloorServe(a) => floor_cmd(a),
        Cmd::Churn(a) => scenario_main(Job::Scenario(Scenario::Churn), a, nofile),
        Cmd::Static(a) => scenario_main(Job::Scenario(Scenario::Static), a, nofile),
        Cmd::Rps(a) => scenario_main(Job::Scenario(Scenario::Rps), a, nofile),
        Cmd::Tps(a) => scenario_main(Job::Scenario(Scenario::Tps), a, nofile),
        Cmd::Throughput(a) => scenario_main(Job::Scenario(Scenario::Throughput), a, nofile),
        Cmd::Scale(a) => scenario_main(Job::Scenario(Scenario::Scale), a, nofile),
        Cmd::Validate(a) => scenario_main(Job::Scenario(Scenario::Validate), a, nofile),
        Cmd::Abuse(a) => scenario_main(Job::Scenario(Scenario::Abuse), a, nofile),
        Cmd::Idle(a) => scenario_main(Job::Scenario(Scenario::Idle), a, nofile),
        Cmd::Seed(s) => match s.name.as_deref().filter(|_| !s.list) {
            None => {
                print!("{}", seed::list());
                Ok(())
            }
            Some(name) => {
                let found = seed::find(name)
                    .with_context(|| format!("unknown seed {name:?}; sluice-bench seed --list"))?;
                scenario_main(Job::Seed(found), s.run, nofile)
            }
        },
    }
}

async fn attack_cmd(a: AttackArgs) -> Result<()> {
    let attack =
        Attack::parse(&a.attack).with_context(|| format!("unknown attack {:?}", a.attack))?;
    let tls = a.tls.then(|| TlsSpec {
        version: TlsVersion::Any,
        verify: Verify::Insecure,
        resumption: false,
        server_name: a.host.clone(),
    });
    let connector = sluice_bench::load::attack::connector(attack, a.target, tls.as_ref())?;
    let now = tokio::time::Instant::now();
    let report = sluice_bench::load::attack::run(sluice_bench::load::attack::AttackSpec {
        attack,
        connections: a.connections,
        connector,
        host: a.host,
        tls: a.tls,
        start: now + Duration::from_secs_f64(a.after),
        end: now + Duration::from_secs_f64(a.until),
    })
    .await;
    let json = serde_json::to_string_pretty(&report)?;
    match a.json {
        Some(p) => std::fs::write(&p, json).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{json}"),
    }
    Ok(())
}

fn floor_cmd(a: FloorArgs) -> Result<()> {
    use sluice_bench::peers::floor;
    let tls = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => Some(floor::tls_config(c, k)?),
        _ => None,
    };
    let rt = if a.workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the tokio runtime")?
    } else {
        runtime(a.workers)?
    };
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("binding {}", a.listen))?;
        floor::serve(l, tls, a.body).await;
        Ok(())
    })
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("building the tokio runtime")
}

fn parse_url(url: &str) -> Result<(Proto, String, u16, String)> {
    let (proto, rest) = if let Some(r) = url.strip_prefix("https://") {
        (Proto::Https, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (Proto::Http, r)
    } else {
        bail!("--url must start with http:// or https://");
    };
    let (authority, path) = rest
        .find('/')
        .map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    let default_port = if proto == Proto::Https { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse().context("bad port in --url")?,
        ),
        _ => (authority.to_string(), default_port),
    };
    if host.is_empty() {
        bail!("--url has no host");
    }
    Ok((proto, host, port, path.to_string()))
}

async fn load_cmd(a: LoadArgs) -> Result<()> {
    let (proto, host, port, path) = parse_url(&a.url)?;
    let addrs: Vec<SocketAddr> = match a.connect_to {
        Some(x) => vec![x],
        None => tokio::net::lookup_host((host.as_str(), port))
            .await
            .with_context(|| format!("resolving {host}"))?
            .collect(),
    };
    let tls = (proto == Proto::Https).then(|| -> Result<TlsSpec> {
        let verify = if a.insecure {
            Verify::Insecure
        } else if let Some(f) = &a.ca_file {
            let pem = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let certs = rustls_pki_types::pem::PemObject::pem_slice_iter(&pem)
                .collect::<Result<Vec<rustls_pki_types::CertificateDer<'static>>, _>>()
                .map_err(|e| anyhow::anyhow!("{}: {e:?}", f.display()))?;
            Verify::Roots(certs)
        } else {
            Verify::System
        };
        Ok(TlsSpec {
            version: match a.tls {
                TlsArg::Any => TlsVersion::Any,
                TlsArg::V12 => TlsVersion::V12,
                TlsArg::V13 => TlsVersion::V13,
            },
            verify,
            resumption: !a.no_resumption,
            server_name: host.clone(),
        })
    });
    let host_header = if port == if proto == Proto::Https { 443 } else { 80 } {
        host.clone()
    } else {
        format!("{host}:{port}")
    };
    let spec = LoadSpec {
        addrs,
        host: host_header,
        path,
        tls: tls.transpose()?,
        mode: a.rate.map_or(Mode::Closed, |rate| Mode::Open { rate }),
        connections: a.connections,
        duration: Duration::from_secs_f64(a.duration),
        timeout: Duration::from_secs_f64(a.timeout),
        keep_alive: !a.connection_close,
    };
    let live = Arc::new(load::Live::default());
    let (pb, task) = scenario::progress("load", a.duration as u64, Arc::clone(&live));
    let r = load::run(
        &spec,
        Hooks {
            started: None,
            live,
        },
    )
    .await?;
    task.abort();
    pb.finish_and_clear();
    print!("{}", load_summary(&a.url, &r));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn load_summary(url: &str, r: &LoadReport) -> String {
    let l = &r.latency_ms;
    let e = &r.errors;
    let c = r.truth.causes();
    format!(
        "{url}: {} over {} connections for {:.0}s\n  requests {}  achieved {:.0} req/s{}\n  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}  p99.999 {:.3}  max {:.3}\n  wrk classes: connect {}  read {}  write {}  timeout {}  non-2xx {}\n  requests failed {} (refused {}, connect timeout {}, handshake {}, failed after send {} of which retryable {}, response timeout {}, 5xx {}, other {})\n  idle connections closed by the server (not failures): {}\n{}",
        r.mode,
        r.connections,
        r.duration_s,
        r.requests,
        r.achieved_rps,
        r.requested_rps
            .map_or(String::new(), |q| format!(" of {q:.0} requested")),
        l.p50,
        l.p90,
        l.p99,
        l.p99_9,
        l.p99_99,
        l.p99_999,
        l.max,
        e.connect,
        e.read,
        e.write,
        e.timeout,
        e.status_non2xx,
        r.requests_failed,
        c.refused,
        c.connect_timeout,
        c.handshake,
        c.failed_after_send,
        c.retryable,
        c.response_timeout,
        c.status_5xx,
        c.other_non2xx,
        r.idle_closed_by_server,
        r.rate_note
            .as_ref()
            .map_or(String::new(), |n| format!("  FLAGGED: {n}\n"))
    )
}

async fn backends_cmd(a: BackendsArgs) -> Result<()> {
    let mut running = Vec::new();
    for i in 0..a.count {
        let port = a.base_port.checked_add(i).context("port out of range")?;
        let name = format!("pod-{}", i + 1);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let b = Backend::start(
            addr,
            BackendConfig {
                name: name.clone(),
                body_size: a.body_size,
                http2: true,
                delay: std::time::Duration::ZERO,
            },
        )
        .await
        .with_context(|| format!("binding {addr}"))?;
        println!(
            "{name} listening on http://{addr}/ ({} B responses; ?size=N ?delay_ms=N ?status=N)",
            a.body_size
        );
        running.push(b);
    }
    println!("Ctrl-C to stop");
    tokio::signal::ctrl_c().await?;
    for b in running {
        b.stop_graceful().await;
    }
    Ok(())
}

/// Where sluice's configuration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Source {
    /// `sluice serve` on manifest files.
    Files,
    /// `sluice controller` against a real kube-apiserver.
    Api,
}

fn scenario_main(job: Job, a: ScenarioArgs, nofile: u64) -> Result<()> {
    if a.source == Source::Api && !sluice_api::in_private_network() {
        let status = sluice_api::enter_private_network().map_err(anyhow::Error::msg)?;
        if !status.success() {
            bail!("the run in its network namespace failed ({status})");
        }
        return Ok(());
    }
    let ncpu = sys::cpu_count();
    let pin = !a.no_pin && ncpu >= 2 && sys::which("taskset").is_some();
    let cores = a.cores.max(1);
    let all: Vec<usize> = (0..ncpu).collect();
    let proxy_cpus = a
        .proxy_cpus
        .clone()
        .unwrap_or_else(|| list(&all[..cores.min(ncpu)]));
    let load_cpus = match &a.load_cpus {
        Some(l) => sys::parse_cpus(l).context("bad --load-cpus")?,
        None if cores < ncpu => all[cores..].to_vec(),
        None => all.clone(),
    };
    let mut machine = std::collections::BTreeMap::new();
    machine.insert("cpus".into(), ncpu.to_string());
    machine.insert(
        "kernel".into(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
    );
    machine.insert("open files limit".into(), nofile.to_string());
    if pin {
        sys::pin_self(&load_cpus).map_err(|e| anyhow::anyhow!("pinning to {load_cpus:?}: {e}"))?;
        machine.insert(
            "pinning".into(),
            format!(
                "proxy on CPU {proxy_cpus} (taskset), load generator + backends on CPU {}",
                list(&load_cpus)
            ),
        );
        if cores >= ncpu {
            machine.insert(
                "pinning note".into(),
                "the proxy was given every core: the load generator shares them".into(),
            );
        }
    } else {
        machine.insert(
            "pinning".into(),
            "none (--no-pin, one CPU, or no taskset): proxy and load share the cores".into(),
        );
    }
    let threads = a
        .threads
        .unwrap_or(if pin { load_cpus.len() } else { ncpu });
    machine.insert("load generator threads".into(), threads.to_string());
    machine.insert("peer versions".into(), peer_versions());
    runtime(threads)?.block_on(run_scenario(
        job,
        a,
        machine,
        pin.then_some(proxy_cpus),
        (cores, threads),
    ))
}

fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn peer_versions() -> String {
    let v = |bin: &str, args: &[&str]| -> Option<String> {
        let out = std::process::Command::new(sys::which(bin)?)
            .args(args)
            .output()
            .ok()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(text.lines().next()?.trim().to_string())
    };
    [
        ("nginx", &["-v"][..]),
        ("haproxy", &["-v"][..]),
        ("caddy", &["version"][..]),
    ]
    .iter()
    .filter_map(|(b, a)| {
        let line = v(b, a)?;
        Some(if line.to_lowercase().contains(b) {
            line
        } else {
            format!("{b} {line}")
        })
    })
    .collect::<Vec<_>>()
    .join("; ")
}

async fn run_scenario(
    job: Job,
    a: ScenarioArgs,
    machine: std::collections::BTreeMap<String, String>,
    cpus: Option<String>,
    (cores, load_threads): (usize, usize),
) -> Result<()> {
    let peers: Vec<PeerKind> = if a.peers.is_empty() {
        job.default_peers()
    } else {
        a.peers
            .iter()
            .map(|p| PeerKind::parse(p.trim()).with_context(|| format!("unknown peer {p:?}")))
            .collect::<Result<_>>()?
    };
    let peers: Vec<PeerKind> = match a.source {
        Source::Files => peers,
        Source::Api => peers
            .into_iter()
            .map(|p| match p {
                PeerKind::Sluice => PeerKind::SluiceApi,
                PeerKind::Traefik => PeerKind::TraefikApi,
                other => other,
            })
            .collect(),
    };
    let sluice_bin = match &a.sluice_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("sluice"))
            .unwrap_or_default(),
    };
    let kube_apiserver = a
        .kube_apiserver
        .clone()
        .unwrap_or_else(|| sluice_api::default_apiserver(&sluice_bin));
    let cert = certs::generate(
        a.key,
        &["bench.local", "*.bench.local", "localhost", "127.0.0.1"],
    )?;
    let (started, stamp) = scenario::utc_now();
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/{}-{stamp}", job.name())));
    let common = Common {
        key: a.key,
        quick: a.quick,
        peers,
        proto: a.proto.map(ProtoArg::peer),
        h2: a.proto == Some(ProtoArg::H2),
        rate: a.rate,
        connections: a.connections,
        duration: a.duration.map(Duration::from_secs_f64),
        interval: a.interval.map(Duration::from_secs_f64),
        timeout: Duration::from_secs_f64(a.timeout),
        env: PeerEnv {
            proto: Proto::Https,
            cert: Arc::new(cert),
            cpus,
            workers: a.workers.unwrap_or(cores),
            sluice_bin,
            sluice_log_level: a.sluice_log_level.clone(),
            log_dir: Some(out.join("logs")),
            kube_apiserver,
            api_ingresses: a.ingresses.first().copied().unwrap_or(1),
            http2: matches!(job, Job::Scenario(Scenario::Abuse)),
            body_size: 0,
        },
        removal: if a.stop_delay.is_some() {
            Removal::Before
        } else {
            a.removal
        },
        gap: a.stop_delay.or(a.gap).map(Duration::from_secs_f64),
        stop: a.stop,
        proxy_cores: cores,
        ingresses: (!a.ingresses.is_empty()).then(|| a.ingresses.clone()),
        rounds: a.rounds as usize,
        wrk_threads: (a.generator == GeneratorArg::Wrk).then_some(load_threads),
        attacks: if a.attacks.is_empty() {
            None
        } else {
            Some(
                a.attacks
                    .iter()
                    .map(|s| {
                        Attack::parse(s.trim()).with_context(|| format!("unknown attack {s:?}"))
                    })
                    .collect::<Result<_>>()?,
            )
        },
        attack_connections: a.attack_connections,
        load_threads,
        replicas: None,
        tls_version: None,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine,
    };
    eprintln!(
        "sluice-bench {}{}: results in {}",
        job.name(),
        if a.quick { " --quick" } else { "" },
        out.display()
    );
    let scenario = match job {
        Job::Scenario(s) => s,
        Job::Seed(s) => {
            let run = seed::run_and_write(s, &common, &out, &started);
            let text = tokio::select! {
                r = run => r.with_context(|| format!("writing {}", out.display()))?,
                _ = tokio::signal::ctrl_c() => bail!("interrupted"),
            };
            print!("\n{text}");
            println!(
                "report: {}/index.html  (seed.md: published vs ours; summary.md; one directory per run)",
                out.display()
            );
            return Ok(());
        }
    };
    let run = scenario.run(&common);
    let mut rep = tokio::select! {
        r = run => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
    };
    rep.started_utc = started;
    report::write_all(&out, &rep).with_context(|| format!("writing {}", out.display()))?;
    println!("\n{}\n", rep.what_it_shows);
    print!("{}", report::terminal_table(&rep, a.wide));
    print!("{}", report::rounds::text(&rep.rounds));
    for p in rep.peers.iter().filter(|p| p.rate_note.is_some()) {
        println!(
            "! {} {}: {}",
            p.name,
            p.variant,
            p.rate_note.as_deref().unwrap_or_default()
        );
    }
    let footer = report::terminal_footer(&rep, a.wide);
    if !footer.is_empty() {
        print!("\n{footer}");
    }
    println!(
        "report: {}/report.md  (json: report.json, plots: latency.svg, timeline.svg)",
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls() {
        let (p, h, port, path) = super::parse_url("https://bench.local/x?y=1").unwrap();
        assert_eq!(
            (p, h.as_str(), port, path.as_str()),
            (super::Proto::Https, "bench.local", 443, "/x?y=1")
        );
        let (_, h, port, path) = super::parse_url("http://127.0.0.1:8080").unwrap();
        assert_eq!((h.as_str(), port, path.as_str()), ("127.0.0.1", 8080, "/"));
        assert!(super::parse_url("ftp://x").is_err());
    }
}
