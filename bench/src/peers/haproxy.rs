//! HAProxy two ways. `haproxy-reload`: master-worker, config rewritten and the master told to
//! reload (USR2; how the OpenShift router applies changes). `haproxy-runtime`: a fixed set of
//! server slots whose address and state are changed through the runtime API socket (how
//! HAProxy's own ingress controller avoids reloads until its slots run out).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    BACKLOG, CLIENT_IDLE_S, CONNECT_TIMEOUT_S, PeerEnv, PeerError, Proc, Proto, READ_TIMEOUT_S,
    State, TRIES,
};

/// Server slots in the runtime variant.
const SLOTS: usize = 16;

/// A running HAProxy.
#[derive(Debug)]
pub struct Haproxy {
    dir: PathBuf,
    conf: Conf,
    pid: u32,
    /// Changes go through the runtime API.
    pub runtime: bool,
    slots: Vec<Option<SocketAddr>>,
}

#[derive(Debug, Clone)]
struct Conf {
    port: u16,
    tls: bool,
    http2: bool,
    workers: usize,
    /// `expose-fd listeners` on the stats socket: a reload passes the listening sockets to
    /// the new worker (`-x`, the seamless reload); without it the new worker binds its own.
    expose_fd: bool,
    /// `maxconn`, global and per frontend.
    maxconn: usize,
}

pub(super) fn unavailable() -> Option<String> {
    crate::sys::which("haproxy")
        .is_none()
        .then(|| "haproxy not installed (bench/install-peers.sh)".into())
}

fn config(dir: &Path, c: &Conf, servers: &[Option<SocketAddr>]) -> String {
    let d = dir.display();
    let mut s = format!(
        "global\n  nbthread {w}\n  maxconn {maxconn}\n  stats socket {d}/admin.sock mode 600 level admin{x}\n  hard-stop-after 60s\n  ssl-default-bind-ciphers ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256\n  ssl-default-bind-options ssl-min-ver TLSv1.2\n  tune.ssl.default-dh-param 2048\n\ndefaults\n  mode http\n  timeout connect {CONNECT_TIMEOUT_S}s\n  timeout client {CLIENT_IDLE_S}s\n  timeout server {READ_TIMEOUT_S}s\n  timeout http-keep-alive {CLIENT_IDLE_S}s\n  timeout http-request 30s\n  option http-keep-alive\n  http-reuse safe\n  retries {r}\n  option redispatch 1\n  balance roundrobin\n  maxconn {maxconn}\n\nfrontend fe\n  bind 127.0.0.1:{p}",
        w = c.workers,
        r = TRIES - 1,
        p = c.port,
        maxconn = c.maxconn,
        x = if c.expose_fd {
            " expose-fd listeners"
        } else {
            ""
        },
    );
    if c.tls {
        let alpn = if c.http2 { "h2,http/1.1" } else { "http/1.1" };
        let _ = write!(s, " ssl crt {d}/bundle.pem alpn {alpn}");
    }
    let _ = write!(
        s,
        "\n  backlog {BACKLOG}\n  option forwardfor\n  http-request set-header X-Forwarded-Proto https if {{ ssl_fc }}\n  http-request set-header X-Forwarded-Proto http if !{{ ssl_fc }}\n  http-request set-header X-Forwarded-Host %[req.hdr(host)]\n  http-request set-header X-Forwarded-Port %[dst_port]\n  http-request set-header X-Request-ID %[uuid] unless {{ req.hdr(x-request-id) -m found }}\n  default_backend be\n\nbackend be\n"
    );
    for (i, a) in servers.iter().enumerate() {
        match a {
            Some(a) => {
                let _ = writeln!(s, "  server s{} {a}", i + 1);
            }
            None => {
                let _ = writeln!(s, "  server s{} 127.0.0.1:1 disabled", i + 1);
            }
        }
    }
    s
}

/// The settings reported for HAProxy.
pub fn settings(workers: usize, runtime: bool) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    s.insert(
        "changes".into(),
        if runtime {
            format!("runtime API: `set server be/sN addr 127.0.0.1 port P` + `set server be/sN state ready|maint` over {SLOTS} slots")
        } else {
            "config rewritten + USR2 to the master (master-worker, seamless reload with expose-fd listeners; old workers finish, hard-stop-after 60s)".into()
        },
    );
    s.insert(
        "retries".into(),
        format!(
            "retries {} + option redispatch 1 (connect errors retried on another server)",
            TRIES - 1
        ),
    );
    s.insert("balance".into(), "roundrobin".into());
    s.insert("backlog".into(), format!("backlog {BACKLOG}"));
    s.insert("workers".into(), format!("nbthread {workers}"));
    s.insert(
        "proxy headers".into(),
        "option forwardfor, X-Forwarded-Proto/Host/Port set, X-Request-ID (the client's, else a uuid), as sluice sends them".into(),
    );
    s.insert("timeouts".into(), format!("connect {CONNECT_TIMEOUT_S}s, server {READ_TIMEOUT_S}s, client/http-keep-alive {CLIENT_IDLE_S}s, http-request 30s"));
    s.insert(
        "upstream keep-alive".into(),
        "option http-keep-alive, http-reuse safe (default)".into(),
    );
    s.insert(
        "maxconn".into(),
        "8000 (above ~9000 HAProxy refuses to start under a 20,000 fd hard limit)".into(),
    );
    s.insert("access log".into(), "none (no log directive)".into());
    s
}

pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    eps: &[SocketAddr],
    runtime: bool,
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let bin = crate::sys::which("haproxy")
        .ok_or_else(|| PeerError::NotReady("haproxy not installed".into()))?;
    super::write(
        &dir.join("bundle.pem"),
        &format!("{}{}", env.cert.cert_pem, env.cert.key_pem),
    )?;
    let conf = Conf {
        port,
        tls: env.proto == Proto::Https,
        http2: env.http2,
        workers: env.workers,
        expose_fd: env.haproxy_expose_fd,
        // HAProxy wants about two descriptors per connection and refuses to start beyond
        // its open-files limit.
        maxconn: env.max_connections.map_or(8000, |n| {
            let fds = usize::try_from(crate::sys::nofile()).unwrap_or(usize::MAX);
            (n + 1_000).max(8000).min(fds.saturating_sub(1_000) / 2)
        }),
    };
    let mut slots: Vec<Option<SocketAddr>> = eps.iter().copied().map(Some).collect();
    if runtime {
        if slots.len() > SLOTS {
            return Err(PeerError::Change(format!("more than {SLOTS} endpoints")));
        }
        slots.resize(SLOTS, None);
    }
    super::write(&dir.join("haproxy.cfg"), &config(dir, &conf, &slots))?;
    let args = vec![
        "-W".into(),
        "-f".into(),
        dir.join("haproxy.cfg").display().to_string(),
    ];
    let proc = Proc::spawn(&bin, &args, dir, &[], env.cpus.as_deref())?;
    let state = State::Haproxy(Haproxy {
        dir: dir.to_path_buf(),
        conf,
        pid: proc.pid,
        runtime,
        slots,
    });
    let mut s = settings(env.workers, runtime);
    if env.http2 {
        s.insert("http2".into(), "bind ... alpn h2,http/1.1".into());
    }
    if !env.haproxy_expose_fd {
        s.insert(
            "upgrade".into(),
            "reload without expose-fd listeners (no -x: the new worker binds its own sockets)"
                .into(),
        );
    }
    Ok((Some(proc), state, s))
}

/// Sends commands (`;`-separated) to the runtime API socket and returns the answer.
async fn runtime_api(sock: &Path, cmds: &str) -> Result<String, PeerError> {
    let io = async {
        let mut s = tokio::net::UnixStream::connect(sock).await?;
        s.write_all(format!("{cmds}\n").as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), io)
        .await
        .map_err(|_| PeerError::Change("runtime API timed out".into()))?
        .map_err(|e| PeerError::Change(format!("runtime API: {e}")))
}

impl Haproxy {
    pub(super) async fn set(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        if !self.runtime {
            self.slots = eps.iter().copied().map(Some).collect();
            super::write(
                &self.dir.join("haproxy.cfg"),
                &config(&self.dir, &self.conf, &self.slots),
            )?;
            crate::sys::signal(self.pid, Signal::SIGUSR2);
            return Ok(());
        }
        let mut cmds = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.is_some_and(|a| !eps.contains(&a)) {
                cmds.push(format!("set server be/s{} state maint", i + 1));
                *slot = None;
            }
        }
        for a in eps {
            if self.slots.contains(&Some(*a)) {
                continue;
            }
            let i = self
                .slots
                .iter()
                .position(Option::is_none)
                .ok_or_else(|| PeerError::Change(format!("all {SLOTS} server slots in use")))?;
            self.slots[i] = Some(*a);
            cmds.push(format!(
                "set server be/s{} addr {} port {}",
                i + 1,
                a.ip(),
                a.port()
            ));
            cmds.push(format!("set server be/s{} state ready", i + 1));
        }
        if cmds.is_empty() {
            return Ok(());
        }
        let out = runtime_api(&self.dir.join("admin.sock"), &cmds.join(";")).await?;
        let bad: Vec<&str> = out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.contains("changed") && !l.contains("no need to change"))
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(PeerError::Change(format!(
                "runtime API said: {}",
                bad.join(" | ")
            )))
        }
    }
}
