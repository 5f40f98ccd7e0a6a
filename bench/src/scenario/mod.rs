//! Scenarios: each starts the peers one after another with fresh backends, runs the load (and
//! the churn, if any) against each, and collects a [`PeerResult`] per peer and variant.

pub mod abuse;
pub mod capacity;
pub mod churn;
pub mod idle;
pub mod scale;
pub mod seed;
pub mod soak;
pub mod upgrade;
pub mod validate;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::load::attack::Attack;
use crate::load::{self, Hooks, Live, LoadSpec};
use crate::peers::{HOST, Peer, PeerEnv, PeerKind};
use crate::pods::{Pods, Terminating};
use crate::report::{Event, PeerResult};
use crate::sys;

/// The scenarios `sluice-bench` runs, one per subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Backends scaled 5→7→5 under constant-rate load.
    Churn,
    /// The same load with no backend changes (the baseline for churn).
    Static,
    /// Requests per second, 1 KB responses.
    Rps,
    /// Full TLS handshakes per second.
    Tps,
    /// 1 MB responses.
    Throughput,
    /// Many Ingresses, and what one change costs.
    Scale,
    /// Each peer's configuration checked against the same requests.
    Validate,
    /// Constant-rate legitimate load while each attack runs in turn.
    Abuse,
    /// Memory per idle keep-alive connection.
    Idle,
    /// Each peer's process replaced twice under load.
    Upgrade,
    /// An hour of mixed traffic, churn, changes and attacks through sluice.
    Soak,
}

impl Scenario {
    /// The subcommand's name, used in output paths and messages.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Churn => "churn",
            Scenario::Static => "static",
            Scenario::Rps => "rps",
            Scenario::Tps => "tps",
            Scenario::Throughput => "throughput",
            Scenario::Scale => "scale",
            Scenario::Validate => "validate",
            Scenario::Abuse => "abuse",
            Scenario::Idle => "idle",
            Scenario::Upgrade => "upgrade",
            Scenario::Soak => "soak",
        }
    }

    /// The peers that take part when `--peers` is not given.
    pub fn default_peers(self) -> Vec<PeerKind> {
        match self {
            Scenario::Scale => vec![
                PeerKind::Sluice,
                PeerKind::NginxReload,
                PeerKind::HaproxyReload,
                PeerKind::Traefik,
            ],
            Scenario::Validate => vec![PeerKind::Direct, PeerKind::Sluice],
            Scenario::Soak => vec![PeerKind::Sluice],
            // One of each server, as in abuse.
            Scenario::Idle => vec![
                PeerKind::Sluice,
                PeerKind::NginxReload,
                PeerKind::HaproxyReload,
                PeerKind::Caddy,
                PeerKind::Traefik,
            ],
            // One of each server (the reload and runtime variants differ only in how they
            // change endpoints, which this scenario does not do); no attack on `direct`.
            Scenario::Abuse | Scenario::Upgrade => vec![
                PeerKind::Sluice,
                PeerKind::NginxReload,
                PeerKind::HaproxyReload,
                PeerKind::Caddy,
                PeerKind::Traefik,
            ],
            _ => PeerKind::ALL.to_vec(),
        }
    }

    /// Runs the scenario for every peer in `common`.
    pub async fn run(self, common: &Common) -> crate::report::Report {
        match self {
            Scenario::Churn => churn::run(common, true).await,
            Scenario::Static => churn::run(common, false).await,
            Scenario::Rps => capacity::run(common, capacity::Capacity::Rps).await,
            Scenario::Tps => capacity::run(common, capacity::Capacity::Tps).await,
            Scenario::Throughput => capacity::run(common, capacity::Capacity::Throughput).await,
            Scenario::Scale => scale::run(common).await,
            Scenario::Validate => validate::run(common).await,
            Scenario::Abuse => abuse::run(common).await,
            Scenario::Idle => idle::run(common).await,
            Scenario::Upgrade => upgrade::run(common).await,
            Scenario::Soak => soak::run(common).await,
        }
    }
}

/// Samples a process tree's memory while a run goes on; CPU is read at both ends.
#[derive(Debug)]
pub struct Usage {
    pid: Option<u32>,
    cpu0: f64,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Usage {
    /// Starts sampling `pid`'s tree every 200 ms.
    pub fn start(pid: Option<u32>) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(pid) = pid {
            let (peak, stop) = (Arc::clone(&peak), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(sys::tree_rss_bytes(pid), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
        Self {
            pid,
            cpu0: pid.map_or(0.0, sys::tree_cpu_seconds),
            peak,
            stop,
        }
    }

    /// CPU seconds since the start and peak memory (sampled tree RSS, or the main process's
    /// VmHWM if larger).
    pub fn finish(self) -> (f64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(pid) = self.pid else { return (0.0, 0) };
        let cpu = (sys::tree_cpu_seconds(pid) - self.cpu0).max(0.0);
        let rss = self
            .peak
            .load(Ordering::Relaxed)
            .max(sys::tree_rss_bytes(pid))
            .max(sys::peak_rss_bytes(pid));
        (cpu, rss)
    }
}

/// A progress bar over a run's seconds showing live rate and failures.
pub fn progress(
    label: &str,
    secs: u64,
    live: Arc<Live>,
) -> (ProgressBar, tokio::task::JoinHandle<()>) {
    let pb = ProgressBar::new(secs.max(1));
    pb.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos:>3}/{len}s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    let pb2 = pb.clone();
    let t0 = Instant::now();
    let task = tokio::spawn(async move {
        let mut last = (0u64, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let n = live.responses.load(Ordering::Relaxed);
            let dt = last.1.elapsed().as_secs_f64().max(1e-3);
            let rate = (n.saturating_sub(last.0)) as f64 / dt;
            last = (n, Instant::now());
            pb2.set_position(t0.elapsed().as_secs().min(pb2.length().unwrap_or(0)));
            pb2.set_message(format!(
                "{rate:>7.0} resp/s  failed {}  idle-closed {}",
                live.failed.load(Ordering::Relaxed),
                live.idle_closed.load(Ordering::Relaxed)
            ));
        }
    });
    (pb, task)
}

/// How one peer run is set up.
#[derive(Debug, Clone)]
pub struct RunSetup {
    /// Variant label.
    pub variant: String,
    /// Backend pods at start.
    pub pods: usize,
    /// Response body size.
    pub body_size: usize,
    /// Load (addrs and TLS are filled in from the peer).
    pub load: LoadSpec,
    /// TLS version and session resumption for the client.
    pub tls: (load::TlsVersion, bool),
    /// Churn plan, if any.
    pub churn: Option<churn::ChurnPlan>,
    /// Cores the proxy was given (for utilisation).
    pub proxy_cores: usize,
    /// wrk with this many threads as the load generator instead of ours.
    pub wrk_threads: Option<usize>,
    /// h2load with `(threads, streams per connection)` as the load generator (HTTP/2).
    pub h2load: Option<(usize, usize)>,
    /// An attack run beside the load (abuse scenario): which, how many connections, and
    /// how long after the load starts.
    pub attack: Option<(Attack, usize, Duration)>,
    /// When the peer's process is replaced (upgrade scenario), from the load's start.
    pub upgrade: Vec<Duration>,
}

/// Runs one peer through one setup: fresh pods, start, load (+ churn), stop.
pub async fn run_one(kind: PeerKind, env: &PeerEnv, setup: &RunSetup) -> PeerResult {
    let name = kind.name();
    if let Some(why) = kind.unavailable(env) {
        eprintln!("{name:>16}: skipped: {why}");
        return PeerResult::skipped(name, &setup.variant, why);
    }
    let mut pods = Pods::new(setup.body_size);
    if let Err(e) = pods.add(setup.pods).await {
        return PeerResult::skipped(name, &setup.variant, format!("backends did not start: {e}"));
    }
    let env = &PeerEnv {
        body_size: setup.body_size,
        ..env.clone()
    };
    let mut peer = match Peer::start(kind, env, &pods.endpoints()).await {
        Ok(p) => p,
        Err(e) => {
            pods.stop_all().await;
            eprintln!("{name:>16}: skipped: {e}");
            return PeerResult::skipped(name, &setup.variant, format!("failed to start: {e}"));
        }
    };
    let mut spec = setup.load.clone();
    spec.addrs = vec![peer.target];
    spec.host = HOST.into();
    spec.tls = peer.tls(setup.tls.0, setup.tls.1);
    if !setup.tls.1
        && let Some(t) = spec.tls.as_mut()
    {
        // Every request a full handshake (tps): the generator's own checks would be its limit.
        t.verify = crate::load::conn::Verify::Unchecked;
    }
    let live = Arc::new(Live::default());
    let (tx, rx) = oneshot::channel();
    let hooks = Hooks {
        started: Some(tx),
        live: Arc::clone(&live),
        bucket: None,
    };
    // The variant as the table will show it (direct has no TLS, so it runs http whatever the
    // scenario's protocol), so the progress line and the table agree.
    let variant = if peer.proto == env.proto {
        setup.variant.clone()
    } else {
        format!("{:?}", peer.proto).to_lowercase()
    };
    let (pb, pb_task) = progress(&format!("{name} {variant}"), spec.duration.as_secs(), live);
    let pid = peer.pid();
    let mut term = Terminating::default();
    // No proxy (direct, floor): no endpoints to change.
    let unrouted = matches!(kind, PeerKind::Direct | PeerKind::Floor);
    let churn = if unrouted { None } else { setup.churn.as_ref() };
    let attack = setup.attack.filter(|_| kind != PeerKind::Direct);
    let tls = peer.proto == crate::peers::Proto::Https;
    let (target, duration) = (peer.target, spec.duration);
    let driver = async {
        let Ok(t0) = rx.await else {
            return (Usage::start(pid), Vec::new(), None);
        };
        // CPU is counted from the measured start, after the connections were opened.
        let usage = Usage::start(pid);
        let attacking = async {
            let (a, n, after) = attack?;
            let until = (t0 + duration).saturating_duration_since(tokio::time::Instant::now());
            let after = (t0 + after).saturating_duration_since(tokio::time::Instant::now());
            Some((a, attack_process(a, n, (target, tls), (after, until)).await))
        };
        let churning = async {
            match churn {
                Some(plan) => churn::drive(&mut peer, &mut pods, &mut term, t0, plan).await,
                None if !unrouted => upgrade::drive(&mut peer, t0, &setup.upgrade).await,
                None => Vec::new(),
            }
        };
        let (driven, attacked) = tokio::join!(churning, attacking);
        (usage, driven, attacked)
    };
    let generate = async {
        match (setup.h2load, setup.wrk_threads) {
            (Some((threads, streams)), _) => {
                load::h2load::run(&spec, threads, streams, hooks).await
            }
            (None, Some(threads)) => load::wrk::run(&spec, threads, hooks).await,
            (None, None) => load::run(&spec, hooks).await,
        }
    };
    let (res, (usage, driven, attacked)) = tokio::join!(generate, driver);
    let (cpu, rss) = usage.finish();
    pb_task.abort();
    let mut notes: Vec<String> = Vec::new();
    let events: Vec<Event> = driven
        .into_iter()
        .filter_map(|d| match d {
            churn::Driven::Event(e) => Some(e),
            churn::Driven::Note(n) => {
                notes.push(n);
                None
            }
        })
        .collect();
    match attacked.as_ref().filter(|(a, _)| *a != Attack::None) {
        Some((a, Ok(report))) => notes.push(report.summary(*a)),
        Some((a, Err(e))) => notes.push(format!("attack {}: {e}", a.name())),
        None => {}
    }
    term.finish().await;
    let changes = peer.changes;
    let settings = peer.settings.clone();
    let proto = peer.proto;
    peer.stop().await;
    pods.stop_all().await;
    let load = match res {
        Ok(l) => l,
        Err(e) => {
            pb.finish_and_clear();
            return PeerResult::skipped(name, &setup.variant, format!("load failed: {e}"));
        }
    };
    pb.finish_with_message(format!(
        "{:.0} req/s, {} failed, {} idle-closed, p99 {:.2} ms",
        load.achieved_rps, load.requests_failed, load.idle_closed_by_server, load.latency_ms.p99
    ));
    if unrouted && setup.churn.is_some() {
        notes.push(format!(
            "{name}: no proxy, so no churn; the load runs as a baseline without changes"
        ));
    }
    if proto != env.proto {
        notes.push(format!("client protocol {proto:?} (direct has no TLS)"));
    }
    let mut r = PeerResult {
        name: name.into(),
        variant,
        changes,
        cpu_seconds: cpu,
        peak_rss_bytes: rss,
        settings,
        events,
        notes,
        ..PeerResult::default()
    }
    .with_load(&load);
    r.cpu_ms_per_1k_requests = if load.requests > 0 {
        cpu * 1e6 / load.requests as f64
    } else {
        0.0
    };
    if matches!(setup.load.mode, load::Mode::Closed) && kind != PeerKind::Direct {
        r.proxy_cpu_utilization = Some(cpu / (load.duration_s * setup.proxy_cores.max(1) as f64));
    }
    r.propagation = churn::propagation(&r);
    r
}

/// Runs an attack as a process of its own (`sluice-bench attack`, inheriting this process's
/// CPU pinning), so that the attackers are scheduled by the kernel beside the load generator,
/// as a separate attacker would be, instead of queueing in the generator's own runtime.
async fn attack_process(
    a: Attack,
    n: usize,
    (target, tls): (std::net::SocketAddr, bool),
    (after, until): (Duration, Duration),
) -> Result<crate::load::attack::AttackReport, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let out = tempfile::Builder::new()
        .prefix("sluice-bench-attack-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| format!("temp file: {e}"))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["attack", "--attack", a.name(), "--host", HOST])
        .arg("--target")
        .arg(target.to_string())
        .arg("--connections")
        .arg(n.to_string())
        .arg("--after")
        .arg(after.as_secs_f64().to_string())
        .arg("--until")
        .arg(until.as_secs_f64().to_string())
        .arg("--json")
        .arg(out.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if tls {
        cmd.arg("--tls");
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("starting the attacker: {e}"))?;
    let done = tokio::time::timeout(until + Duration::from_secs(15), child.wait_with_output())
        .await
        .map_err(|_| "the attacker did not exit".to_string())?
        .map_err(|e| format!("the attacker: {e}"))?;
    if !done.status.success() {
        return Err(format!(
            "the attacker failed ({}): {}",
            done.status,
            String::from_utf8_lossy(&done.stderr).trim()
        ));
    }
    let json = std::fs::read_to_string(out.path()).map_err(|e| format!("attacker report: {e}"))?;
    serde_json::from_str(&json).map_err(|e| format!("attacker report: {e}"))
}

/// Options shared by the scenarios (from the command line).
#[derive(Debug, Clone)]
pub struct Common {
    /// The certificate's key type (`--key`).
    pub key: crate::certs::KeyKind,
    /// Quick mode.
    pub quick: bool,
    /// Peers to run, in order.
    pub peers: Vec<PeerKind>,
    /// Client protocol (scenario default if `None`).
    pub proto: Option<crate::peers::Proto>,
    /// HTTP/2 from the client (`--proto h2`: TLS with ALPN h2, h2load; rps only).
    pub h2: bool,
    /// Requests per second (open loop).
    pub rate: Option<f64>,
    /// Connections.
    pub connections: Option<usize>,
    /// Load duration per peer.
    pub duration: Option<Duration>,
    /// Churn: time at each replica count.
    pub interval: Option<Duration>,
    /// Connect and response timeout of the load generator.
    pub timeout: Duration,
    /// How peers are started (the protocol is set per variant).
    pub env: PeerEnv,
    /// Churn removal order.
    pub removal: crate::pods::Removal,
    /// Churn: time between the two steps of a removal.
    pub gap: Option<Duration>,
    /// Churn: how a removed pod stops.
    pub stop: crate::pods::StopMode,
    /// Cores given to the proxy.
    pub proxy_cores: usize,
    /// Ingress counts for the scale scenario.
    pub ingresses: Option<Vec<usize>>,
    /// Scale: what sluice's routes are made of (empty: Ingresses).
    pub objects: Vec<scale::Objects>,
    /// Capacity scenarios: how many times every peer runs (order alternating per round).
    pub rounds: usize,
    /// Capacity scenarios: wrk with this many threads as the load generator instead of ours.
    pub wrk_threads: Option<usize>,
    /// Threads of the load generator (wrk's `-t` where a seed asks for wrk).
    pub load_threads: usize,
    /// Churn: replicas at rest and after a scale-up (default 5 and 7).
    pub replicas: Option<(usize, usize)>,
    /// Churn: the TLS versions the load offers (default any).
    pub tls_version: Option<crate::load::TlsVersion>,
    /// Abuse: the attacks to run (default all).
    pub attacks: Option<Vec<crate::load::attack::Attack>>,
    /// Abuse: attacker connections per attack.
    pub attack_connections: Option<usize>,
    /// The command line, for the report.
    pub command: String,
    /// Machine facts for the report.
    pub machine: std::collections::BTreeMap<String, String>,
}

impl Common {
    /// A report of per-peer runs of `scenario` with this run's command, machine and mode (the
    /// scale, extra, idle and rounds tables empty: the scenarios that fill them set them).
    pub fn report(
        &self,
        scenario: &str,
        what_it_shows: String,
        settings: std::collections::BTreeMap<String, String>,
        peers: Vec<PeerResult>,
    ) -> crate::report::Report {
        crate::report::Report {
            scenario: scenario.into(),
            quick: self.quick,
            started_utc: String::new(),
            command: self.command.clone(),
            what_it_shows,
            machine: self.machine.clone(),
            settings,
            peers,
            scale: Vec::new(),
            extra: Vec::new(),
            rounds: Vec::new(),
            soak: None,
            idle: Vec::new(),
        }
    }
}

/// Seconds as a Duration.
pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (and a file-name-safe variant).
pub fn utc_now() -> (String, String) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (t / 86_400, t % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z"),
        format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}"),
    )
}
