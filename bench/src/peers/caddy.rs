//! Caddy: the whole JSON config swapped in-process through the admin API (`POST /load`): a Go
//! proxy that rebuilds its handler in process, the same family as Traefik.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{
    CLIENT_IDLE_S, CONNECT_TIMEOUT_S, PeerEnv, PeerError, Proc, Proto, READ_TIMEOUT_S, State,
    UPSTREAM_KEEPALIVE,
};

/// A running Caddy.
#[derive(Debug)]
pub struct Caddy {
    admin: SocketAddr,
    dir: PathBuf,
    port: u16,
    /// TLS, and HTTP/2 on it.
    tls: (bool, bool),
}

pub(super) fn unavailable() -> Option<String> {
    crate::sys::which("caddy")
        .is_none()
        .then(|| "caddy not installed (bench/install-peers.sh)".into())
}

fn config(
    dir: &Path,
    admin: SocketAddr,
    port: u16,
    (tls, http2): (bool, bool),
    eps: &[SocketAddr],
) -> Value {
    let upstreams: Vec<Value> = eps.iter().map(|a| json!({"dial": a.to_string()})).collect();
    let mut server = json!({
        "listen": [format!("127.0.0.1:{port}")],
        "protocols": if http2 { json!(["h1", "h2"]) } else { json!(["h1"]) },
        "idle_timeout": format!("{CLIENT_IDLE_S}s"),
        "read_header_timeout": "30s",
        "automatic_https": {"disable": true},
        "routes": [{
            "handle": [{
                "handler": "reverse_proxy",
                "upstreams": upstreams,
                "load_balancing": {
                    "selection_policy": {"policy": "round_robin"},
                    "try_duration": format!("{CONNECT_TIMEOUT_S}s"),
                    "try_interval": "10ms"
                },
                "transport": {
                    "protocol": "http",
                    "dial_timeout": format!("{CONNECT_TIMEOUT_S}s"),
                    "response_header_timeout": format!("{READ_TIMEOUT_S}s"),
                    "keep_alive": {
                        "enabled": true,
                        "max_idle_conns_per_host": UPSTREAM_KEEPALIVE,
                        "idle_timeout": "60s"
                    }
                }
            }]
        }]
    });
    let mut apps = json!({"http": {"servers": {"bench": Value::Null}}});
    if tls {
        server["tls_connection_policies"] = json!([{
            "certificate_selection": {"any_tag": ["bench"]},
            "protocol_min": "tls1.2",
            "alpn": if http2 { json!(["h2", "http/1.1"]) } else { json!(["http/1.1"]) }
        }]);
        apps["tls"] = json!({"certificates": {"load_files": [{
            "certificate": dir.join("cert.pem").display().to_string(),
            "key": dir.join("key.pem").display().to_string(),
            "tags": ["bench"]
        }]}});
    }
    apps["http"]["servers"]["bench"] = server;
    apps["pki"] = json!({"certificate_authorities": {"local": {"install_trust": false}}});
    json!({
        "admin": {"listen": admin.to_string(), "config": {"persist": false}},
        "logging": {"logs": {"default": {"level": "ERROR"}}},
        "storage": {"module": "file_system", "root": dir.join("storage").display().to_string()},
        "apps": apps
    })
}

/// The settings reported for Caddy.
pub fn settings(workers: usize) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    s.insert("changes".into(), "full JSON config POSTed to the admin API /load (handler rebuilt in process; the old server shuts down gracefully)".into());
    s.insert("retries".into(), format!("load_balancing try_duration {CONNECT_TIMEOUT_S}s, try_interval 10ms (Caddy does not retry by default)"));
    s.insert("balance".into(), "round_robin".into());
    s.insert(
        "backlog".into(),
        "not configurable: Go uses net.core.somaxconn".into(),
    );
    s.insert("workers".into(), format!("GOMAXPROCS={workers}"));
    s.insert("timeouts".into(), format!("dial {CONNECT_TIMEOUT_S}s, response header {READ_TIMEOUT_S}s, idle {CLIENT_IDLE_S}s, read header 30s"));
    s.insert(
        "upstream keep-alive".into(),
        format!("on, max_idle_conns_per_host {UPSTREAM_KEEPALIVE}, idle 60s"),
    );
    s.insert("http2".into(), "protocols [h1]".into());
    s.insert(
        "tls".into(),
        "automatic HTTPS off, install_trust false, certificate loaded from file".into(),
    );
    s.insert("access log".into(), "none (not configured)".into());
    s
}

pub(super) async fn start(
    env: &PeerEnv,
    dir: &Path,
    port: u16,
    eps: &[SocketAddr],
) -> Result<(Option<Proc>, State, BTreeMap<String, String>), PeerError> {
    let bin = crate::sys::which("caddy")
        .ok_or_else(|| PeerError::NotReady("caddy not installed".into()))?;
    super::write(&dir.join("cert.pem"), &env.cert.cert_pem)?;
    super::write(&dir.join("key.pem"), &env.cert.key_pem)?;
    let admin = SocketAddr::from(([127, 0, 0, 1], super::free_port()?));
    let tls = (env.proto == Proto::Https, env.http2);
    let cfg = config(dir, admin, port, tls, eps);
    super::write(&dir.join("caddy.json"), &cfg.to_string())?;
    let d = dir.display().to_string();
    let envs = [
        ("GOMAXPROCS", env.workers.to_string()),
        ("HOME", d.clone()),
        ("XDG_DATA_HOME", format!("{d}/data")),
        ("XDG_CONFIG_HOME", format!("{d}/config")),
    ];
    let args = vec![
        "run".into(),
        "--config".into(),
        dir.join("caddy.json").display().to_string(),
    ];
    let proc = Proc::spawn(&bin, &args, dir, &envs, env.cpus.as_deref())?;
    let state = State::Caddy(Caddy {
        admin,
        dir: dir.to_path_buf(),
        port,
        tls,
    });
    let mut s = settings(env.workers);
    if env.http2 {
        s.insert("http2".into(), "protocols [h1, h2]".into());
    }
    Ok((Some(proc), state, s))
}

impl Caddy {
    pub(super) async fn set(&mut self, eps: &[SocketAddr]) -> Result<(), PeerError> {
        let cfg = config(&self.dir, self.admin, self.port, self.tls, eps);
        match super::admin_request(self.admin, "POST", "/load", &cfg.to_string()).await {
            Ok((200, _)) => Ok(()),
            Ok((st, b)) => Err(PeerError::Change(format!("caddy /load: {st} {b}"))),
            Err(e) => Err(PeerError::Change(e)),
        }
    }
}
