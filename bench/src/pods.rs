//! A replica set of pod-like backends on loopback, and the ways a pod goes away: SIGTERM-like
//! graceful stop, abrupt kill, and vanishing (packets dropped without a reset, as when a node
//! dies), the last one through a loopback-only iptables DROP rule.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::backend::{Backend, BackendConfig};

/// When the endpoint leaves the proxy's list, relative to the pod's SIGTERM. Kubernetes sends
/// both at once and does not order them, so each order is a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Removal {
    /// Endpoint removed, then (after the gap) SIGTERM: what a preStop sleep buys.
    Before,
    /// Endpoint removed and SIGTERM at the same moment.
    With,
    /// SIGTERM, then (after the gap) the endpoint removed: the common race without a preStop
    /// hook (the kubelet is faster than endpoint propagation). The default.
    After,
    /// Abrupt kill (connections cut), endpoint removed after the gap.
    Kill,
    /// The pod vanishes (packets dropped, no RST) and the endpoint is removed at once.
    Vanish,
}

/// How a removed pod stops (`--stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum StopMode {
    /// SIGTERM handled well: listener closed, in-flight requests finish, idle connections close.
    Graceful,
    /// A server that exits without draining: every connection reset (RST), in flight or idle.
    Fast,
    /// SIGKILL: the process is gone and the kernel closes its sockets.
    Kill,
    /// Graceful, fast and kill in turn, one per scale-down.
    Mixed,
}

impl StopMode {
    /// The concrete mode of the `n`th scale-down (0-based).
    pub fn nth(self, n: usize) -> StopMode {
        match self {
            StopMode::Mixed => [StopMode::Graceful, StopMode::Fast, StopMode::Kill][n % 3],
            m => m,
        }
    }

    /// The verb for the timeline.
    pub fn verb(self) -> &'static str {
        match self {
            StopMode::Graceful => "SIGTERM",
            StopMode::Fast => "reset",
            StopMode::Kill => "kill",
            StopMode::Mixed => "stop",
        }
    }
}

/// One backend pod.
#[derive(Debug)]
pub struct Pod {
    /// Name (in the `x-backend` header).
    pub name: String,
    /// The running backend.
    pub backend: Backend,
}

/// Pods that were told to stop and may still be draining.
#[derive(Debug, Default)]
pub struct Terminating {
    drains: Vec<JoinHandle<()>>,
    vanished: Vec<(u16, Backend)>,
}

impl Terminating {
    /// SIGTERM-like: close the listener, finish in-flight requests, close idle connections.
    pub fn sigterm(&mut self, pod: Pod) {
        pod.backend.begin_stop();
        self.drains.push(tokio::spawn(pod.backend.stop_graceful()));
    }

    /// SIGKILL-like: every connection cut at once.
    pub fn kill(&mut self, pod: Pod) {
        pod.backend.kill();
    }

    /// Stops a pod the way `mode` says (a concrete mode; `Mixed` counts as graceful).
    pub fn stop(&mut self, pod: Pod, mode: StopMode) {
        match mode {
            StopMode::Graceful | StopMode::Mixed => self.sigterm(pod),
            StopMode::Fast => self.drains.push(tokio::spawn(pod.backend.reset())),
            StopMode::Kill => self.kill(pod),
        }
    }

    /// Drops every packet to and from these pods' ports on loopback, all in one atomic
    /// `iptables-restore` (so several pods vanish at the same instant, and within a few ms);
    /// the pods stay "up" behind the rules until [`Terminating::finish`].
    pub async fn vanish(&mut self, pods: Vec<Pod>) -> Result<(), String> {
        let mut rules = String::from("*filter\n");
        for p in &pods {
            let port = p.backend.addr.port();
            for dir in ["--dport", "--sport"] {
                rules.push_str(&format!("-I INPUT -i lo -p tcp {dir} {port} -j DROP\n"));
            }
        }
        rules.push_str("COMMIT\n");
        let run = async {
            use tokio::io::AsyncWriteExt;
            let mut child = tokio::process::Command::new("iptables-restore")
                .args(["-w", "--noflush"])
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(rules.as_bytes()).await?;
            }
            child.wait_with_output().await
        };
        let out = run.await.map_err(|e| format!("iptables-restore: {e}"))?;
        // Whatever happened, remember the pods so that finish() lifts any rule that went in.
        self.vanished
            .extend(pods.into_iter().map(|p| (p.backend.addr.port(), p.backend)));
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "iptables-restore: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Waits (bounded) for graceful stops, lifts DROP rules and kills vanished pods.
    pub async fn finish(&mut self) {
        for d in self.drains.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), d).await;
        }
        for (port, b) in self.vanished.drain(..) {
            let _ = iptables("-D", port);
            b.kill();
        }
    }
}

impl Drop for Terminating {
    fn drop(&mut self) {
        for (port, _) in &self.vanished {
            let _ = iptables("-D", *port);
        }
    }
}

/// Adds (`-I`) or deletes (`-D`) the loopback DROP rules for one port, both directions.
fn iptables(op: &str, port: u16) -> Result<(), String> {
    for dir in ["--dport", "--sport"] {
        let out = Command::new("iptables")
            .args(["-w", op, "INPUT", "-i", "lo", "-p", "tcp", dir])
            .arg(port.to_string())
            .args(["-j", "DROP"])
            .output()
            .map_err(|e| format!("iptables: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "iptables {op}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// Why the vanish variant cannot run here, if it cannot.
pub fn vanish_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the vanish variant needs root (iptables DROP on loopback)".into());
    }
    if crate::sys::which("iptables").is_none() || crate::sys::which("iptables-restore").is_none() {
        return Some("the vanish variant needs iptables (apt-get install iptables)".into());
    }
    match Command::new("iptables")
        .args(["-w", "-L", "INPUT", "-n"])
        .output()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "iptables does not work here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("iptables: {e}")),
    }
}

/// A replica set: pods are added with new ports (like new pod IPs) and the newest removed first
/// (as a Deployment scales down).
#[derive(Debug)]
pub struct Pods {
    body_size: usize,
    next: u32,
    /// Running pods, oldest first.
    pub live: Vec<Pod>,
}

impl Pods {
    /// An empty set whose pods answer `body_size` bytes.
    pub fn new(body_size: usize) -> Self {
        Self {
            body_size,
            next: 1,
            live: Vec::new(),
        }
    }

    /// Starts `n` more pods on free loopback ports. Inside the `--source api` network namespace
    /// (EndpointSlices may not name loopback addresses) each pod gets an address of its own in
    /// the private block, as pods do: a controller that keys endpoints by address (Traefik
    /// does) would otherwise see one pod.
    pub async fn add(&mut self, n: usize) -> std::io::Result<()> {
        let private = crate::peers::sluice_api::in_private_network();
        for _ in 0..n {
            let ip = if private {
                let [a, b, c, _] = crate::peers::sluice_api::PRIVATE_IP;
                [a, b, c, 10 + u8::try_from(self.next % 240).unwrap_or(0)]
            } else {
                [127, 0, 0, 1]
            };
            let name = format!("pod-{}", self.next);
            self.next += 1;
            let backend = Backend::start(
                SocketAddr::from((ip, 0)),
                BackendConfig {
                    name: name.clone(),
                    body_size: self.body_size,
                    http2: false,
                    delay: std::time::Duration::ZERO,
                },
            )
            .await?;
            self.live.push(Pod { name, backend });
        }
        Ok(())
    }

    /// Addresses of the running pods.
    pub fn endpoints(&self) -> Vec<SocketAddr> {
        self.live.iter().map(|p| p.backend.addr).collect()
    }

    /// Takes the `n` newest pods out of the set (the caller stops them).
    pub fn take_newest(&mut self, n: usize) -> Vec<Pod> {
        let k = self.live.len().saturating_sub(n);
        self.live.split_off(k)
    }

    /// Stops every pod gracefully.
    pub async fn stop_all(&mut self) {
        for p in self.live.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), p.backend.stop_graceful()).await;
        }
    }
}
