//! The command line: subcommands and their arguments.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use sluice_bench::certs;
use sluice_bench::peers::{PeerKind, Proto};
use sluice_bench::pods::{Removal, StopMode};
use sluice_bench::scenario::Scenario;
use sluice_bench::scenario::seed::Seed;

/// sluice's benchmark: sluice head-to-head with reload-based nginx and HAProxy (and Caddy,
/// nginx + Lua, HAProxy's runtime API), reproducing the published ingress tests on loopback.
///
/// Start with: sluice-bench churn --quick
#[derive(Debug, Parser)]
#[command(name = "sluice-bench", version)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
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
    /// Each peer's own process replaced twice under constant load, the way its users replace
    /// it: sluice by --handover, nginx by binary upgrade (USR2, WINCH, QUIT), HAProxy by
    /// seamless reload, Caddy and Traefik by restart. Per load (HTTPS keep-alive, HTTP with a
    /// new connection per request, HTTP/2): failed requests, refused connections, and the p99
    /// of the seconds the replacements happen in.
    Upgrade(ScenarioArgs),
    /// sluice through the life of a production edge: an hour (--duration; 2 minutes with
    /// --quick) of HTTPS keep-alive, HTTP/2 and WebSocket traffic while backends churn with
    /// pods killed, the Ingress, its TLS Secret and the ConfigMap change every few seconds, and
    /// attack bursts arrive. Every minute: failed requests, p99, RSS, descriptors, tasks,
    /// upstream connections. Holds when nothing legitimate failed and RSS and descriptors stay
    /// flat (under 5%) over the second half.
    Soak(ScenarioArgs),
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
pub(crate) struct FloorArgs {
    /// Listen address.
    #[arg(long)]
    pub(crate) listen: SocketAddr,
    /// Certificate chain (PEM); with --key, serve TLS.
    #[arg(long, requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// Private key (PEM).
    #[arg(long, requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// Response body size in bytes.
    #[arg(long, default_value_t = 0)]
    pub(crate) body: usize,
    /// Runtime threads (1: a current-thread runtime, as sluice runs one worker).
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: usize,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ScenarioArgs {
    /// Short run (about a minute for churn with every peer installed).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Peers, comma-separated: sluice,nginx-reload,nginx-lua,haproxy-reload,haproxy-runtime,caddy,traefik,direct
    /// (and floor: no proxy, a bare TLS server answering itself; named only).
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<String>,
    /// Client protocol (churn/static default https; rps/throughput default both).
    #[arg(long, value_enum)]
    pub(crate) proto: Option<ProtoArg>,
    /// Requests per second (open loop; churn/static).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Connections.
    #[arg(long)]
    pub(crate) connections: Option<usize>,
    /// Seconds of load per peer.
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Churn: seconds at each replica count (default 12 at 7 and 10 at 5; quick 1.5).
    #[arg(long)]
    pub(crate) interval: Option<f64>,
    /// Churn: when the endpoint is removed relative to the pod's SIGTERM.
    #[arg(long, value_enum, default_value_t = Removal::After)]
    pub(crate) removal: Removal,
    /// Churn: seconds between the two steps of a removal (default 1; quick 0.5).
    #[arg(long)]
    pub(crate) gap: Option<f64>,
    /// Churn: how a removed pod stops: graceful (SIGTERM handled), fast (every connection
    /// reset), kill, or mixed (the three in turn).
    #[arg(long, value_enum, default_value_t = StopMode::Mixed)]
    pub(crate) stop: StopMode,
    /// Churn: stop each removed pod this many seconds after its endpoint is removed (0: as it
    /// goes). Shorthand for --removal before --gap S.
    #[arg(long, conflicts_with_all = ["removal", "gap"])]
    pub(crate) stop_delay: Option<f64>,
    /// Load generator connect and response timeout (seconds; wrk's default is 2).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) timeout: f64,
    /// Capacity scenarios (rps, tps, throughput): run every peer this many times, the order
    /// alternating each round, and add per-peer medians and the median same-round ratio to
    /// the first peer listed (what to quote on a noisy machine).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub(crate) rounds: u32,
    /// Cores given to the proxy (its workers and pinning).
    #[arg(long, default_value_t = 1)]
    pub(crate) cores: usize,
    /// Proxy worker processes/threads (default: --cores).
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    /// CPUs the proxy is pinned to (default: the first --cores).
    #[arg(long)]
    pub(crate) proxy_cpus: Option<String>,
    /// CPUs the load generator and backends are pinned to (default: the rest).
    #[arg(long)]
    pub(crate) load_cpus: Option<String>,
    /// Do not pin anything.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// Load generator threads (default: the number of load CPUs).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Capacity scenarios with HTTP/1.1 keep-alive (rps, throughput): the load generator,
    /// ours or wrk (installed by bench/install-peers.sh). wrk reports fewer facts (no
    /// per-request truth, timeline or p99.9).
    #[arg(long, value_enum, default_value_t = GeneratorArg::Own)]
    pub(crate) generator: GeneratorArg,
    /// The sluice binary (default: next to sluice-bench).
    #[arg(long)]
    pub(crate) sluice_bin: Option<PathBuf>,
    /// sluice's --log-level during the run (its log is kept in OUT/logs/).
    #[arg(long, default_value = "warn")]
    pub(crate) sluice_log_level: String,
    /// Scale: Ingress counts, comma-separated. With `--source api`: how many Ingresses (each
    /// with its Service and EndpointSlice) the API server holds (the first count; default 1).
    #[arg(long, value_delimiter = ',')]
    pub(crate) ingresses: Vec<usize>,
    /// Scale: what sluice's routes are made of, comma-separated: `ingress` (default),
    /// `httproute` (one Gateway with an HTTP listener and an HTTPRoute per host; sluice only),
    /// or both (`ingress,httproute`: each size measured both ways, side by side).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) objects: Vec<sluice_bench::scenario::scale::Objects>,
    /// Where sluice's configuration comes from: `files` (`sluice serve` on manifest files) or
    /// `api` (`sluice controller` against a real kube-apiserver, changes written as
    /// EndpointSlices through the API; root only: the run moves into a network namespace of its
    /// own, see bench/README.md).
    #[arg(long, value_enum, default_value_t = Source::Files)]
    pub(crate) source: Source,
    /// The kube-apiserver for `--source api` (default: target/kube-apiserver/kube-apiserver,
    /// built by tests/kube-apiserver/build.sh).
    #[arg(long)]
    pub(crate) kube_apiserver: Option<PathBuf>,
    /// Abuse: attacks to run, comma-separated (default all): none, h2-preface-hold, h2-idle,
    /// h1-slowloris, slow-reader, max-heads, upgrade-flood, rapid-reset.
    #[arg(long, value_delimiter = ',')]
    pub(crate) attacks: Vec<String>,
    /// Abuse: attacker connections per attack (default 2000; quick 500; rapid reset at most
    /// 20, slow reader at most 100).
    #[arg(long)]
    pub(crate) attack_connections: Option<usize>,
    /// The certificate's key type every peer serves (tps: what each full handshake signs with).
    #[arg(long, value_enum, default_value_t = certs::KeyKind::Rsa2048)]
    pub(crate) key: certs::KeyKind,
    /// Output directory (default bench-out/<scenario>-<time>).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Terminal table with every column (wider than 100 columns); report.md always has them.
    #[arg(long)]
    pub(crate) wide: bool,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct SeedArgs {
    /// The published test (see --list).
    pub(crate) name: Option<String>,
    /// List the published tests and what each runs.
    #[arg(long)]
    pub(crate) list: bool,
    #[command(flatten)]
    pub(crate) run: ScenarioArgs,
}

/// What a command runs: a scenario, or a seed's scenarios.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Job {
    Scenario(Scenario),
    Seed(&'static Seed),
}

impl Job {
    pub(crate) fn name(self) -> String {
        match self {
            Job::Scenario(s) => s.name().into(),
            Job::Seed(s) => format!("seed-{}", s.name),
        }
    }

    pub(crate) fn default_peers(self) -> Vec<PeerKind> {
        match self {
            Job::Scenario(s) => s.default_peers(),
            Job::Seed(s) => s.peers.to_vec(),
        }
    }
}

/// The client protocol of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProtoArg {
    /// HTTP/1.1 over TCP.
    Http,
    /// HTTP/1.1 over TLS.
    Https,
    /// HTTP/2 over TLS (ALPN h2), many streams per connection, with h2load (rps only).
    H2,
}

impl ProtoArg {
    pub(crate) fn peer(self) -> Proto {
        match self {
            ProtoArg::Http => Proto::Http,
            ProtoArg::Https | ProtoArg::H2 => Proto::Https,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GeneratorArg {
    /// sluice-bench's own generator.
    Own,
    /// wrk, one thread per load CPU (or --threads).
    Wrk,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum TlsArg {
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
pub(crate) struct LoadArgs {
    /// http:// or https:// URL; the host name resolves through the system resolver.
    #[arg(long)]
    pub(crate) url: String,
    /// Requests per second over all connections (open loop); omitted: closed loop.
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Connections.
    #[arg(long, default_value_t = 50)]
    pub(crate) connections: usize,
    /// Seconds.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) duration: f64,
    /// Runtime threads (default: available cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Connect and response timeout (seconds).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) timeout: f64,
    /// Accept any server certificate (self-signed).
    #[arg(long)]
    pub(crate) insecure: bool,
    /// Trust this PEM certificate/CA instead of the system store.
    #[arg(long)]
    pub(crate) ca_file: Option<PathBuf>,
    /// TLS versions offered.
    #[arg(long, value_enum, default_value_t = TlsArg::Any)]
    pub(crate) tls: TlsArg,
    /// No TLS session resumption (every connection a full handshake).
    #[arg(long)]
    pub(crate) no_resumption: bool,
    /// One request per connection (`Connection: close`).
    #[arg(long)]
    pub(crate) connection_close: bool,
    /// Connect here instead of resolving the URL's host (Host and SNI stay the URL's).
    #[arg(long)]
    pub(crate) connect_to: Option<SocketAddr>,
    /// Write the full report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct AttackArgs {
    /// The attack (none, h2-preface-hold, h2-idle, h1-slowloris, slow-reader, max-heads,
    /// upgrade-flood, rapid-reset).
    #[arg(long)]
    pub(crate) attack: String,
    /// Where (loopback or an address of a network namespace you made: do not attack others).
    #[arg(long)]
    pub(crate) target: SocketAddr,
    /// `Host` / `:authority` and TLS server name.
    #[arg(long, default_value = "bench.local")]
    pub(crate) host: String,
    /// Attack over TLS (certificate not checked).
    #[arg(long)]
    pub(crate) tls: bool,
    /// Attacker connections.
    #[arg(long, default_value_t = 500)]
    pub(crate) connections: usize,
    /// Seconds to wait before attacking.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) after: f64,
    /// Seconds from the start until every attacker connection is dropped.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) until: f64,
    /// Write what happened to the attackers as JSON here (else it is printed).
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct BackendsArgs {
    /// How many.
    #[arg(long, default_value_t = 5)]
    pub(crate) count: u16,
    /// First port.
    #[arg(long, default_value_t = 9001)]
    pub(crate) base_port: u16,
    /// Response body size in bytes (`?size=N` overrides per request).
    #[arg(long, default_value_t = 1024)]
    pub(crate) body_size: usize,
}

/// Where sluice's configuration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Source {
    /// `sluice serve` on manifest files.
    Files,
    /// `sluice controller` against a real kube-apiserver.
    Api,
}
